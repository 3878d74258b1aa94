"""Chapter 1, Foundations: exercises 1.1-1.5 (modules ``bilinear`` and ``einsum``).

1.1-1.3 are contractions (lowering an index, W^T W, the batched bilinear
scores), checked on plain, batched and mismatched inputs; for a mismatch the
probe also checks that the error message names the index and both sizes, as
the statements ask.  1.4 reads einsum strings as loops: several strings
(three operands, an implied output, a trace, broadcasting batch axes) with
small fixed shapes.  1.5 classifies candidate metrics; its probe turns the
``MetricReport`` into plain arrays, one boolean per possible ``kind``.
"""

from __future__ import annotations

import re

import numpy as np

from ..registry import Case, Exercise
from ._gen import normal, sizes, spd


class ErrorMessageIncomplete(Exception):
    """Raised by a probe when an AttentionInputError does not say what the statement asks."""


def _require_message(err: Exception, index: str, n1: int, n2: int) -> None:
    """Re-raise ``err``, as ErrorMessageIncomplete when its message misses the index or a size."""
    msg = str(err)
    if type(err).__name__ == "AttentionInputError":
        named = re.search(rf"\bindex {index}\b", msg)
        both = all(re.search(rf"\b{n}\b", msg) for n in (n1, n2))
        if not (named and both):
            raise ErrorMessageIncomplete(
                f"AttentionInputError raised, but its message {msg!r} should name "
                f"index {index} and both sizes ({n1} and {n2})"
            ) from None
    raise err


# -- 1.1 lower_index ----------------------------------------------------------


def _lower_probe(fn, v, g):
    """The value; on an error, the message must name index b and both sizes."""
    try:
        return fn(v=v, g=g)
    except Exception as err:  # noqa: BLE001 - inspected and re-raised
        _require_message(err, "b", v.shape[-1], g.shape[-1])


def _lower_cases(rng, hidden):
    (d,) = sizes(rng, hidden, (4,))
    return [
        Case("plain", {"v": normal(rng, d), "g": spd(rng, d)},
             f"one vector of d={d} and a {d} x {d} metric"),
        Case("batch axes broadcast",
             {"v": normal(rng, 2, 1, d), "g": np.stack([spd(rng, d) for _ in range(3)])},
             f"v of shape (2, 1, {d}) and g of shape (3, {d}, {d}): the result has shape (2, 3, {d})"),
        Case("index b mismatch", {"v": normal(rng, d - 1), "g": spd(rng, d)},
             f"v has d={d - 1} but g is {d} x {d}: AttentionInputError naming index b and both sizes"),
    ]


# -- 1.2 learned_metric ---------------------------------------------------------


def _learned_cases(rng, hidden):
    r, d = sizes(rng, hidden, (2, 4))
    return [
        Case("r < d", {"W": normal(rng, r, d)},
             f"W of shape ({r}, {d}): g is {d} x {d} with rank {r}"),
        Case("r > d", {"W": normal(rng, d + 1, r + 1)},
             f"W of shape ({d + 1}, {r + 1}): g is {r + 1} x {r + 1} and positive definite"),
        Case("batch", {"W": normal(rng, 2, r + 1, d)},
             f"a batch of two W of shape ({r + 1}, {d}): W.T would reverse the batch axis too"),
    ]


# -- 1.3 bilinear_form_batch ----------------------------------------------------------


def _batch_probe(fn, Q, K, g):
    """The scores; on an error, the message must name the mismatched index and both sizes."""
    try:
        return fn(Q=Q, K=K, g=g)
    except Exception as err:  # noqa: BLE001 - inspected and re-raised
        if Q.shape[-1] != g.shape[-2]:
            _require_message(err, "a", Q.shape[-1], g.shape[-2])
        if K.shape[-1] != g.shape[-1]:
            _require_message(err, "b", K.shape[-1], g.shape[-1])
        raise


def _batch_cases(rng, hidden):
    n_q, n_k, d = sizes(rng, hidden, (2, 4, 3))
    return [
        Case("plain", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d), "g": normal(rng, d, d)},
             f"Q ({n_q}, {d}), K ({n_k}, {d}) and a general (not symmetric) g: "
             "the order of the indices of g matters"),
        Case("batch axes broadcast",
             {"Q": normal(rng, 2, 1, n_q, d), "K": normal(rng, 3, n_k, d), "g": normal(rng, d, d)},
             f"Q (2, 1, {n_q}, {d}), K (3, {n_k}, {d}), g ({d}, {d}): S has shape (2, 3, {n_q}, {n_k})"),
        Case("index a mismatch",
             {"Q": normal(rng, n_q, d + 1), "K": normal(rng, n_k, d), "g": normal(rng, d, d)},
             f"Q has d={d + 1} but g has {d} rows: AttentionInputError naming index a and both sizes"),
        Case("index b mismatch",
             {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d + 1), "g": normal(rng, d, d)},
             f"K has d={d + 1} but g has {d} columns: AttentionInputError naming index b and both sizes"),
    ]


# -- 1.4 loop_einsum ---------------------------------------------------------------


def _loop_probe(fn, subscripts, arrays):
    """The result, and whether it is a float64 NumPy array as the statement asks."""
    out = fn(subscripts, *arrays)
    # a 0-d result may come back as a NumPy scalar; JAX arrays are not NumPy arrays
    is_np = isinstance(out, (np.ndarray, np.generic)) and np.asarray(out).dtype == np.float64
    return {"result": out, "is a float64 NumPy array": is_np}


def _loop_cases(rng, hidden):
    n, m, d = sizes(rng, hidden, (2, 4, 3))

    def case(name, subscripts, shapes, note):
        return Case(name, {"subscripts": subscripts, "arrays": [normal(rng, *s) for s in shapes]}, note)

    return [
        case("three operands", "ia,ab,jb->ij", [(n, d), (d, d), (m, d)],
             "S^{ij} = Q^{ia} g_{ab} K^{jb}: i, j free, a and b summed"),
        case("implied output", "kj,ji", [(n, d), (d, m)],
             "no '->': the output is the indices used once, sorted (here 'ik', not 'ki')"),
        case("trace", "ii->", [(d, d)],
             "a repeated index inside one operand, summed: the trace (a 0-d array)"),
        case("batch axes broadcast", "...ij,...jk->...ik", [(2, 1, n, d), (3, d, m)],
             "batch shapes (2, 1) and (3,) broadcast to (2, 3); a length-1 axis is read at 0"),
        case("two summed indices", "hic,hcd->id", [(2, n, d), (2, d, m)],
             "the head combination: h and c are both summed"),
    ]


# -- 1.5 check_metric --------------------------------------------------------------


def _orthogonal(rng, d):
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def _with_eigenvalues(rng, lam):
    """U diag(lam) U^T, exactly symmetric."""
    U = _orthogonal(rng, len(lam))
    g = U @ np.diag(lam) @ U.T
    return (g + g.T) / 2


def _rank_deficient(rng, r, d):
    """W^T W with W of shape (r, d), r < d, drawn until its zero eigenvalues are
    far below the default cutoff d eps max|lambda| (a quarter of it), so that
    any float64 eigensolver classifies it the same way."""
    cutoff = d * np.finfo(np.float64).eps
    while True:
        W = rng.standard_normal((r, d))
        g = W.T @ W
        g = (g + g.T) / 2
        lam = np.linalg.eigvalsh(g)
        if np.max(np.abs(lam[: d - r])) <= cutoff / 4 * np.max(np.abs(lam)):
            return g


def _metric_cases(rng, hidden):
    (d,) = sizes(rng, hidden, (3,))
    r = d - 1  # the learned metrics are W^T W with W of shape (r, d + 1)

    def pos(k):
        return rng.uniform(0.5, 2.0, k)

    tiny = np.concatenate([[1e-9], pos(d - 1)])
    mixed = np.concatenate([-pos(1), pos(d - 1)])
    nearly = np.concatenate([[1e-7], pos(d - 1)])
    W32 = rng.standard_normal((r, d + 1))
    g32 = (W32.T @ W32).astype(np.float32)
    g32 = (g32 + g32.T) / 2
    A = rng.standard_normal((d, d))
    cases = [
        Case("positive definite", {"g": _with_eigenvalues(rng, tiny), "rtol": None},
             "eigenvalues from 1e-9 to about 1: small, but above d eps max|lambda|, so positive definite"),
        Case("learned metric, r < d", {"g": _rank_deficient(rng, r, d + 1), "rtol": None},
             f"W^T W with W of shape ({r}, {d + 1}), float64: positive semi-definite, rank {r}"),
        Case("float32 learned metric", {"g": g32, "rtol": None},
             f"the same in float32: its zero eigenvalues are float32 rounding noise, so the "
             f"default tolerance is d eps of float32 (rank {r}, positive semi-definite)"),
        Case("indefinite", {"g": _with_eigenvalues(rng, mixed), "rtol": None},
             "a symmetric matrix with one negative eigenvalue"),
        Case("not symmetric", {"g": A + 2.0 * (A - A.T) + d * np.eye(d), "rtol": None},
             "g_{ab} != g_{ba}"),
        Case("explicit rtol", {"g": _with_eigenvalues(rng, nearly), "rtol": 1e-4},
             f"smallest eigenvalue 1e-7 with rtol=1e-4 counts as zero: semi-definite, rank {d - 1}"),
        Case("not square", {"g": normal(rng, d, d + 1), "rtol": None},
             "a non-square g must raise AttentionInputError"),
    ]
    if hidden:
        cases.append(Case("batched", {"g": np.stack([spd(rng, d)] * 2), "rtol": None},
                          "a batch of metrics must raise AttentionInputError"))
    return cases


KINDS = ("positive definite", "positive semi-definite (rank {r} < d={d}), not positive definite",
         "indefinite", "not symmetric")


def _metric_probe(fn, g, rtol):
    """The report as plain arrays: one boolean per kind, symmetric, rank, d, extreme eigenvalues.

    The eigenvalues are compared for float64 symmetric inputs only (a float32
    eigensolver may differ in the last digits; for a non-symmetric g the
    statement does not say which eigenvalues).  The rank is left out for a
    non-symmetric g, where the statement leaves it open too.
    """
    report = fn(g=g, rtol=rtol)
    G = np.asarray(g, dtype=np.float64)
    d = G.shape[-1]
    kind = str(report.kind)
    out = {}
    for k in KINDS:
        out[f"kind == {k.replace('{r}', 'r').replace('{d}', 'D')!r}"] = kind == k.format(r=int(report.rank), d=d)
    out["symmetric"] = report.symmetric
    symmetric = np.max(np.abs(G - G.T)) <= 1e-8 * np.max(np.abs(G))
    if symmetric:
        out["rank"] = report.rank
    out["d"] = report.d
    if symmetric and np.asarray(g).dtype == np.float64:
        out["min_eigenvalue"] = report.min_eigenvalue
        out["max_eigenvalue"] = report.max_eigenvalue
    return out


EXERCISES = [
    Exercise(
        "1.1", "Lowering an index", "bilinear.lower_index", _lower_cases, points=2, probe=_lower_probe,
        hint="One index, b, is summed and a is free; write '...' in front of both operands' indices "
        "so the batch axes broadcast, and check the sizes of b before contracting.",
    ),
    Exercise(
        "1.2", "The learned metric", "bilinear.learned_metric", _learned_cases, points=2,
        hint="The row index c of W is summed and both column indices survive; W.T reverses every axis, "
        "batch axes included.",
    ),
    Exercise(
        "1.3", "Batched bilinear scores", "bilinear.bilinear_form_batch", _batch_cases, points=2,
        probe=_batch_probe,
        hint="Lower the keys first (K_lower_{ja} = g_{ab} K^{jb}), then pair them with the queries; "
        "index a joins Q with the rows of g, index b the columns of g with K.",
    ),
    Exercise(
        "1.4", "Einsum as literal loops", "einsum.loop_einsum", _loop_cases, points=2, probe=_loop_probe,
        hint="parse_einsum gives the explicit output, the summed indices, their sizes and the batch shape; "
        "name the batch axes with spare letters and loop over output indices, then summed ones.",
    ),
    Exercise(
        "1.5", "Classifying a candidate metric", "bilinear.check_metric", _metric_cases, points=2,
        probe=_metric_probe,
        hint="Compute in float64 NumPy with eigvalsh of the symmetric part, but take the default "
        "tolerance d * eps from the input's dtype (float32 inputs have float32 rounding).",
    ),
]
