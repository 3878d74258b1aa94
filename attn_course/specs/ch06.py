"""Chapter 6, Multi-Head Attention: exercises 6.1-6.4 (module ``multihead``).

Shapes follow the module: ``X (..., n, d_model)``, ``W_Q (H, d_model, d_k)``,
``W_K (H_kv, d_model', d_k)``, ``W_V (H_kv, d_model', d_v)``,
``W_O (H, d_v, d_model)``.  The grouped-query cases use ``H_kv < H`` with
query head ``h`` reading key/value head ``h // G``; a head order of
``h % H_kv`` gives different numbers, so the cases tell them apart.  The
hidden cases keep the public kinds with other fixed sizes (one more of each,
and other head counts and group sizes) and values drawn from the secret.
"""

from __future__ import annotations

import numpy as np

from ..registry import Case, Exercise
from ._gen import mask, normal, sizes, with_grad


# -- generators ------------------------------------------------------------------
def _weights(rng, H, H_kv, d, d_k, d_v, d_kv=None):
    """(W_Q, W_K, W_V, W_O) with H query heads and H_kv key/value heads."""
    d_kv = d if d_kv is None else d_kv
    return {
        "W_Q": normal(rng, H, d, d_k),
        "W_K": normal(rng, H_kv, d_kv, d_k),
        "W_V": normal(rng, H_kv, d_kv, d_v),
        "W_O": normal(rng, H, d_v, d),
    }


def _head_mask(rng, H, n_q, n_k):
    """One mask per head: query 0 is fully masked in every head, query 1 in head 1 only."""
    m = mask(rng, H, n_q, n_k, dead_row=False)
    m[:, 0, :] = False  # this query attends to nothing in any head: Y = 0
    m[1, 1, :] = False  # a dead row in one head only
    return m


def _padding(rng, B, n_k):
    """Key padding of shape (B, 1, 1, n_k): every sequence keeps at least one key."""
    valid = rng.random((B, n_k)) < 0.7
    valid[:, -1] = True
    return valid[:, None, None, :]


def _softmax(S, m=None):
    """NumPy softmax over the last axis for building patterns; fully masked rows are 0."""
    s = S if m is None else np.where(m, S, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    z = e.sum(axis=-1, keepdims=True)
    return e / np.where(z > 0, z, 1.0)


# -- 6.1 project_heads -------------------------------------------------------------
def _project_cases(rng, hidden):
    n, d, H, e = sizes(rng, hidden, (3, 4, 2, 3))
    cases = [
        Case("plain", {"X": normal(rng, n, d), "W": normal(rng, H, d, e)},
             f"X ({n}, {d}), W ({H}, {d}, {e}): the result is ({H}, {n}, {e})"),
        Case("batch axes", {"X": normal(rng, 2, 3, n, d), "W": normal(rng, H, d, e)},
             "X with batch axes (2, 3): the head axis goes just before the position axis, "
             f"(2, 3, {H}, {n}, {e})"),
        Case("d_model mismatch", {"X": normal(rng, n, d + 1), "W": normal(rng, H, d, e)},
             "X has d_model one larger than W: AttentionInputError (index d)"),
        Case("W with a batch axis", {"X": normal(rng, n, d), "W": normal(rng, 1, H, d, e)},
             "W must have exactly three axes (h, d, a): AttentionInputError"),
    ]
    if hidden:
        cases.append(Case("X without a position axis", {"X": normal(rng, d), "W": normal(rng, H, d, e)}))
    return cases


# -- 6.2 multihead_attention -------------------------------------------------------
def _forward_cases(rng, hidden):
    n, d, d_k, d_v = sizes(rng, hidden, (4, 5, 3, 2))
    n_k, d_kv = n + 2, d - 1
    # (H, H_kv) for plain heads, grouped-query (G = H / H_kv > 1), multi-query
    H_mha, (H, H_kv), H_mqa = (2, (4, 2), 2) if not hidden else (3, (6, 2), 3)
    T1 = 0.7 if not hidden else float(rng.uniform(0.4, 1.5))
    bad = _weights(rng, 2, 2, d, d_k, d_v)
    bad["W_O"] = normal(rng, 2, d_v + 1, d)
    cases = [
        Case("self-attention", {"X_q": normal(rng, n, d), **_weights(rng, H_mha, H_mha, d, d_k, d_v),
                                "X_kv": None, "mask": None, "T": 1.0, "n_kv_heads": None},
             f"X ({n}, {d}), H = H_kv = {H_mha}, no mask"),
        Case("grouped-query, per-head mask",
             {"X_q": normal(rng, 2, n, d), **_weights(rng, H, H_kv, d, d_k, d_v),
              "X_kv": None, "mask": _head_mask(rng, H, n, n), "T": T1, "n_kv_heads": H_kv},
             f"batch of 2, H={H} query heads sharing H_kv={H_kv} key/value heads (head h "
             f"uses h // {H // H_kv}), a mask per head; query 0 is masked in every head "
             f"(Y = 0), query 1 in head 1 only; T={T1:g}"),
        Case("cross-attention, multi-query, padding",
             {"X_q": normal(rng, 2, n, d), **_weights(rng, H_mqa, 1, d, d_k, d_v, d_kv=d_kv),
              "X_kv": normal(rng, n_k, d_kv), "mask": _padding(rng, 2, n_k), "T": 1.0, "n_kv_heads": None},
             f"X_q (2, {n}, {d}) against X_kv ({n_k}, {d_kv}) of another width (its batch "
             f"axes broadcast), one key/value head for {H_mqa} query heads, a padding mask (2, 1, 1, {n_k})"),
        Case("W_O and W_V disagree on d_v",
             {"X_q": normal(rng, n, d), **bad, "X_kv": None, "mask": None, "T": 1.0, "n_kv_heads": None},
             f"W_O has d_v={d_v + 1} but W_V has d_v={d_v}: AttentionInputError (index c)"),
    ]
    if hidden:
        cases.append(Case("H_kv does not divide H",
                          {"X_q": normal(rng, n, d), **_weights(rng, 3, 2, d, d_k, d_v),
                           "X_kv": None, "mask": None, "T": 1.0, "n_kv_heads": None}))
    return cases


# -- 6.3 head_diversity ---------------------------------------------------------------
def _structured_heads(rng, n_q, n_k, extra_random):
    """Heads P, P (a copy), P' (never agrees with P), uniform U, and an all-zero head."""
    keys = rng.integers(n_k, size=n_q)
    P = np.eye(n_k)[keys]
    P2 = np.eye(n_k)[(keys + 1 + rng.integers(n_k - 1, size=n_q)) % n_k]
    U = np.full((n_q, n_k), 1.0 / n_k)
    heads = [P, P, P2, U, np.zeros((n_q, n_k))]
    if extra_random:
        heads.append(_softmax(normal(rng, n_q, n_k)))
    return np.stack(heads)


def _diversity_cases(rng, hidden):
    B, H, n_q, n_k = sizes(rng, hidden, (2, 3, 3, 4))
    S = normal(rng, B, H, n_q, n_k, scale=2.0)
    A = _softmax(S, mask(rng, B, H, n_q, n_k))
    cases = [
        Case("random heads", {"A": A},
             f"A ({B}, {H}, {n_q}, {n_k}): one diversity per batch element, shape ({B},); "
             "head 0 of batch 0 has a fully masked (zero) row"),
        Case("one head", {"A": _softmax(normal(rng, B, 1, n_q, n_k))},
             f"H = 1: no pairs, D = 0 for each of the {B} batch elements (and a zero gradient)"),
        Case("copied, disjoint, uniform and empty heads", {"A": _structured_heads(rng, n_q, n_k, hidden)},
             "two identical one-hot heads, a one-hot head that never agrees with them, the "
             "uniform head and an all-zero head (every row masked): a single number"),
        Case("two axes", {"A": _softmax(normal(rng, n_q, n_k))},
             "A of shape (n_q, n_k) has no head axis: AttentionInputError"),
    ]
    return cases


# -- 6.4 multihead_backward ------------------------------------------------------------
GRAD_FIELDS = ("dL_dW_Q", "dL_dW_K", "dL_dW_V", "dL_dW_O", "dL_dX", "dL_dX_kv")


def grads_probe(fn, **inputs):
    """The six gradients by position, each None marked by a flag and an empty array.

    ``MultiHeadGrads`` holds ``dL_dX_kv = None`` for self-attention; the
    flags come first so that a None in the wrong place is what a failure
    reports.
    """
    grads = tuple(fn(**inputs))
    if len(grads) != len(GRAD_FIELDS):
        raise TypeError(f"expected the {len(GRAD_FIELDS)} fields of MultiHeadGrads, got {len(grads)} values")
    out = {f"{name} is None": np.asarray(g is None) for name, g in zip(GRAD_FIELDS, grads)}
    out.update({name: np.zeros(0) if g is None else g for name, g in zip(GRAD_FIELDS, grads)})
    return out


def _backward_cases(rng, hidden):
    n, d, d_k, d_v = sizes(rng, hidden, (4, 5, 3, 2))
    n_k, d_kv = n + 1, d + 1
    H_mha, (H, H_kv), H_mqa = (2, (4, 2), 2) if not hidden else (3, (6, 2), 3)
    T1 = 0.8 if not hidden else float(rng.uniform(0.4, 1.5))
    causal = np.tril(np.ones((n, n), dtype=bool))
    causal[0, 0] = False  # query 0 (whose only key was 0) is fully masked
    return [
        Case("self-attention, causal",
             {"X": normal(rng, n, d), **_weights(rng, H_mha, H_mha, d, d_k, d_v),
              "dL_dY": normal(rng, n, d), "mask": causal, "T": 1.0, "X_kv": None, "n_kv_heads": None},
             f"X ({n}, {d}), H = H_kv = {H_mha}, causal mask with query 0 fully masked; "
             "dL_dX collects the query, key and value paths and dL_dX_kv is None"),
        Case("grouped-query, batch, per-head mask",
             {"X": normal(rng, 2, n, d), **_weights(rng, H, H_kv, d, d_k, d_v),
              "dL_dY": normal(rng, 2, n, d), "mask": _head_mask(rng, H, n, n), "T": T1,
              "X_kv": None, "n_kv_heads": H_kv},
             f"batch of 2, H={H} query heads sharing H_kv={H_kv} key/value heads: dL_dW_K and "
             f"dL_dW_V sum over the {H // H_kv} query heads of a group, weight gradients sum "
             f"over the batch; T={T1:g}"),
        Case("cross-attention, broadcast dL_dY",
             {"X": normal(rng, 2, n, d), **_weights(rng, H_mqa, 1, d, d_k, d_v, d_kv=d_kv),
              "dL_dY": normal(rng, n, d), "mask": _padding(rng, 2, n_k), "T": 1.0,
              "X_kv": normal(rng, n_k, d_kv), "n_kv_heads": None},
             f"X (2, {n}, {d}) against X_kv ({n_k}, {d_kv}) without a batch axis, one key/value "
             f"head, dL_dY ({n}, {d}) broadcast over the batch: dL_dX is the query path, "
             f"dL_dX_kv the key and value paths summed to X_kv's shape"),
        Case("dL_dY of the wrong shape",
             {"X": normal(rng, n, d), **_weights(rng, H_mha, H_mha, d, d_k, d_v),
              "dL_dY": normal(rng, n + 1, d), "mask": None, "T": 1.0, "X_kv": None, "n_kv_heads": None},
             f"dL_dY ({n + 1}, {d}) does not broadcast to Y ({n}, {d}): AttentionInputError"),
    ]


EXERCISES = [
    Exercise(
        "6.1", "Projecting to heads", "multihead.project_heads",
        _project_cases, points=2,
        hint="One einsum contracts d and keeps h, i and a free, with '...' for the batch axes of X "
        "only; check the axes and the shared index d first.",
    ),
    Exercise(
        "6.2", "Multi-head attention", "multihead.multihead_attention",
        _forward_cases, points=2,
        hint="Split the query head axis into (H_kv, G) by a reshape and give K and V a group axis "
        "of length one, so the single-head attention_decomposition broadcasts over both; "
        "the mask needs the same split (_group_mask).",
    ),
    Exercise(
        "6.3", "Head diversity", "multihead.head_diversity",
        _diversity_cases, points=2, probe=with_grad("A", name="D"),
        hint="The sum over h != h' is the sum of all of C minus its trace; decide H = 1 from the "
        "shape, before any division by H(H-1).",
    ),
    Exercise(
        "6.4", "The backward pass of multi-head attention", "multihead.multihead_backward",
        _backward_cases, points=3, probe=grads_probe,
        hint="Run the forward pass once, turn dL/dY into dL/dO with W_O, let attention_backward "
        "do the per-head step on the grouped heads, then each weight gradient is one einsum "
        "with the batch axes summed out.",
    ),
]
