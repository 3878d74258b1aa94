"""Chapter 2, The Attention Mechanism: exercises 2.1-2.5.

Modules ``attention`` (scores, output, the full decomposition, the low-rank
metric) and ``softmax`` (the stable masked softmax every other module calls).
Exercise 10.1 grades :func:`attention.attention_decomposition` again, on the
worked examples, through the solution region of 2.4.
"""

from __future__ import annotations

import numpy as np

from ..registry import Case, Exercise
from ._gen import finite_sum, mask, normal, sizes, value_and_grads


def _probabilities(rng, *shape, dead_row=False):
    """Rows of attention weights (each a probability vector); optionally a zero first row."""
    A = rng.random(shape) ** 2
    A /= A.sum(axis=-1, keepdims=True)
    if dead_row:
        A[(0,) * (len(shape) - 1)] = 0.0  # a fully masked query: weights all zero
    return A


# -- 2.1 attention_scores ---------------------------------------------------------


def _scores_cases(rng, hidden):
    n_q, n_k, d = sizes(rng, hidden, (3, 4, 2))
    b = 2 if not hidden else 3
    raw = 1.0 if not hidden else float(rng.uniform(0.2, 0.9))
    cases = [
        Case("default scale", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d), "g": None, "scale": None},
             f"Q ({n_q}, {d}), K ({n_k}, {d}), no metric: S = Q K^T / sqrt(d_k)"),
        Case("explicit scale, broadcast batch",
             {"Q": normal(rng, b, n_q, d), "K": normal(rng, n_k, d), "g": None, "scale": raw},
             f"Q ({b}, {n_q}, {d}) against K ({n_k}, {d}) (the batch axis broadcasts), scale={raw:g}"),
        Case("metric", {"Q": normal(rng, b, n_q, d), "K": normal(rng, b, n_k, d), "g": normal(rng, d, d),
                        "scale": None},
             "a batch with a non-symmetric metric g: S^{ij} = Q^{ia} g_{ab} K^{jb} (g carries the scale)"),
        Case("d_k mismatch", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d + 1), "g": None, "scale": None},
             f"Q has d_k={d}, K has d_k={d + 1}: must raise AttentionInputError (index a)"),
    ]
    if hidden:
        cases.append(Case("both a metric and a scale",
                          {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d), "g": normal(rng, d, d),
                           "scale": 1.0},
                          "g and scale together must raise AttentionInputError"))
    return cases


def _square_keys(rng, hidden):
    """Q K and Q K^T have the same shape only when n_k = d_k: there a K left untransposed shows."""
    n_q, d = sizes(rng, hidden, (3, 4))
    return [
        Case("square keys (n_k = d_k)", {"Q": normal(rng, n_q, d), "K": normal(rng, d, d), "g": None,
                                         "scale": None},
             f"K of shape ({d}, {d}): Q K and Q K^T have the same shape, so only the values tell them apart"),
    ]


# -- 2.2 softmax_and_log_partition ------------------------------------------------


def _softmax_probe(fn, **inputs):
    """A, log Z, and the gradients wrt S of a weighted sum of each (finite entries only)."""
    def f(S):
        A, log_Z = fn(**{**inputs, "S": S})
        return A, log_Z

    (A, log_Z), (dA, dlogZ) = value_and_grads(f, inputs["S"], [lambda out: finite_sum(out[0]),
                                                                 lambda out: finite_sum(out[1])])
    return {"A": A, "log_Z": log_Z, "d/dS (w . A)": dA, "d/dS (w . log_Z)": dlogZ}


def _softmax_cases(rng, hidden):
    n_q, n_k = sizes(rng, hidden, (3, 5))
    b = 2 if not hidden else 3
    T1 = 1.5 if not hidden else float(rng.uniform(0.5, 2.0))
    T2 = 0.7 if not hidden else float(rng.uniform(0.2, 0.9))
    cases = [
        Case("plain", {"S": normal(rng, n_q, n_k, scale=2.0), "mask": None, "T": T1},
             f"S of shape ({n_q}, {n_k}), no mask, T={T1:g}; values and gradients"),
        Case("masked with a dead row", {"S": normal(rng, b, n_q, n_k), "mask": mask(rng, b, n_q, n_k), "T": T2},
             f"batch of {b}; the first row is fully masked: A = 0, log_Z = -inf, no nan in the gradients"),
        Case("huge scores", {"S": normal(rng, n_q, n_k, scale=1e4), "mask": None, "T": 1.0},
             "scores of size 1e4: exp(S) overflows, exp(S - max) does not"),
        Case("T = 0", {"S": normal(rng, n_q, n_k), "mask": None, "T": 0.0},
             "T <= 0 must raise AttentionInputError"),
    ]
    if hidden:
        cases += [
            Case("negative T", {"S": normal(rng, n_q, n_k), "mask": None, "T": -float(rng.uniform(0.5, 2.0))}),
            Case("0/1 mask", {"S": normal(rng, n_q, n_k), "mask": mask(rng, n_q, n_k).astype(np.float64),
                              "T": 1.0}, "a non-boolean mask must raise AttentionInputError"),
        ]
    return cases


# -- 2.3 attention_output ---------------------------------------------------------


def _output_cases(rng, hidden):
    n_q, n_k, d_v = sizes(rng, hidden, (3, 4, 2))
    b = 2 if not hidden else 3
    return [
        Case("plain", {"A": _probabilities(rng, n_q, n_k), "V": normal(rng, n_k, d_v)},
             f"A ({n_q}, {n_k}) with rows that sum to one, V ({n_k}, {d_v})"),
        Case("broadcast batch and a zero row",
             {"A": _probabilities(rng, b, n_q, n_k, dead_row=True), "V": normal(rng, n_k, d_v, scale=3.0)},
             f"A ({b}, {n_q}, {n_k}) against V ({n_k}, {d_v}); A's first row is all zero, so O's is too"),
        Case("batch of values", {"A": _probabilities(rng, n_q, n_k), "V": normal(rng, b, n_k, d_v)},
             f"A ({n_q}, {n_k}) against V ({b}, {n_k}, {d_v}): the batch axis comes from V"),
        Case("n_k mismatch", {"A": _probabilities(rng, n_q, n_k), "V": normal(rng, n_k + 1, d_v)},
             f"A has n_k={n_k}, V has n_k={n_k + 1}: must raise AttentionInputError (index j)"),
    ]


# -- 2.4 attention_decomposition --------------------------------------------------


def _decomposition_cases(rng, hidden):
    n_q, n_k, d, d_v = sizes(rng, hidden, (3, 4, 2, 3))
    h = 2 if not hidden else 3
    T = 0.8 if not hidden else float(rng.uniform(0.3, 2.0))
    raw = 1.0 if not hidden else float(rng.uniform(0.2, 0.9))
    return [
        Case("plain", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d), "V": normal(rng, n_k, d_v),
                       "mask": None, "T": 1.0, "g": None, "scale": None},
             "no mask, T = 1, default scale 1/sqrt(d_k): S, A, log_Z and O"),
        Case("heads, mask with a dead row",
             {"Q": normal(rng, h, n_q, d), "K": normal(rng, h, n_k, d), "V": normal(rng, h, n_k, d_v),
              "mask": mask(rng, h, n_q, n_k), "T": T, "g": None, "scale": raw},
             f"{h} heads, T={T:g}, scale={raw:g}; head 0's first query is fully masked: "
             "A = 0, log_Z = -inf, O = 0"),
        Case("metric", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d), "V": normal(rng, n_k, d_v),
                        "mask": None, "T": T, "g": normal(rng, d, d), "scale": None},
             "a non-symmetric metric g: S^{ij} = Q^{ia} g_{ab} K^{jb}"),
        Case("n_k mismatch", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d), "V": normal(rng, n_k + 1, d_v),
                              "mask": None, "T": 1.0, "g": None, "scale": None},
             f"K has n_k={n_k}, V has n_k={n_k + 1}: must raise AttentionInputError (index j)"),
    ]


# -- 2.5 low_rank_metric ----------------------------------------------------------


def _low_rank_cases(rng, hidden):
    d, d_k = sizes(rng, hidden, (4, 2))
    h = 2 if not hidden else 3
    W = normal(rng, d, d_k)
    return [
        Case("plain", {"W_Q": normal(rng, d, d_k), "W_K": normal(rng, d, d_k)},
             f"W_Q and W_K of shape ({d}, {d_k}): M is {d} x {d} of rank {d_k}, not symmetric"),
        Case("heads", {"W_Q": normal(rng, h, d, d_k), "W_K": normal(rng, h, d, d_k)},
             f"{h} heads: W of shape ({h}, {d}, {d_k}), one metric per head"),
        Case("W_Q = W_K", {"W_Q": W, "W_K": W.copy()}, "equal projections give a symmetric M"),
        Case("d_k mismatch", {"W_Q": normal(rng, d, d_k), "W_K": normal(rng, d, d_k + 1)},
             f"W_Q has d_k={d_k}, W_K has d_k={d_k + 1}: must raise AttentionInputError (index a)"),
    ]


EXERCISES = [
    Exercise(
        "2.1", "Attention scores", "attention.attention_scores",
        lambda rng, hidden: _scores_cases(rng, hidden) + _square_keys(rng, hidden), points=2,
        hint="Contract the feature index a of Q and K (the last axis of both) and keep the "
        "leading axes with '...'; with a metric, S = Q g K^T carries its own scale.",
    ),
    Exercise(
        "2.2", "Stable masked softmax and log-partition", "softmax.softmax_and_log_partition",
        _softmax_cases, points=3, probe=_softmax_probe,
        hint="Shift by the (stop-gradient) row maximum, replaced by 0 where it is -inf, and put the "
        "'where' guards before the division and the log, or a dead row's gradient is nan.",
    ),
    Exercise(
        "2.3", "Value aggregation", "attention.attention_output", _output_cases, points=2,
        hint="Only j is summed, and it is the last axis of A but the second to last of V.",
    ),
    Exercise(
        "2.4", "The full decomposition", "attention.attention_decomposition", _decomposition_cases,
        points=2,
        hint="Compose your functions of exercises 2.1-2.3 and return AttentionParts(S, A, log_Z, O); "
        "masks and batch axes are already handled by each step.",
    ),
    Exercise(
        "2.5", "The low-rank metric of self-attention", "attention.low_rank_metric", _low_rank_cases,
        points=2,
        hint="The summed index is the head feature a, the last axis of both W_Q and W_K; "
        "no transpose is needed in index notation.",
    ),
]
