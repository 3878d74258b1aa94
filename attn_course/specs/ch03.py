"""Chapter 3, Statistical Mechanics: exercises 3.1-3.5 (module ``statmech``)."""

from __future__ import annotations

import numpy as np

from ..registry import Case, Exercise
from ._gen import mask, normal, sizes, with_grad


def _score_cases(rng, hidden, grad_ok=True):
    """Plain, masked with a dead row, huge scores, and a batch of heads."""
    n_q, n_k = sizes(rng, hidden, (3, 5))
    b = 2 if not hidden else int(rng.integers(2, 4))
    T1 = 1.0 if not hidden else float(rng.uniform(0.5, 2.0))
    T2 = 0.7 if not hidden else float(rng.uniform(0.2, 0.9))
    return [
        Case("plain", {"S": normal(rng, n_q, n_k, scale=2.0), "mask": None, "T": T1},
             f"S of shape ({n_q}, {n_k}), no mask, T={T1:g}"),
        Case("masked", {"S": normal(rng, b, n_q, n_k), "mask": mask(rng, b, n_q, n_k), "T": T2},
             f"batch of {b}, a mask whose first row is fully masked, T={T2:g}"),
        Case("huge scores", {"S": normal(rng, n_q, n_k, scale=1e4), "mask": None, "T": 1.0},
             "scores of size 1e4: exp(S) overflows, exp(S - max) does not"),
    ]


def _bad_temperature(rng, hidden):
    return Case("T = 0", {"S": normal(rng, 2, 3), "mask": None, "T": 0.0},
                "T <= 0 must raise AttentionInputError")


def _log_partition_cases(rng, hidden):
    return _score_cases(rng, hidden) + [_bad_temperature(rng, hidden)]


def _weights(rng, hidden):
    """Rows of weights with exact zeros, a one-hot row, a uniform row and a dead row."""
    n_q, n_k = sizes(rng, hidden, (4, 5), low=3)
    A = rng.random((n_q, n_k))
    A[0] = 0.0
    A[0, rng.integers(n_k)] = 1.0  # one-hot
    A[1] = 1.0  # uniform
    A[2, : n_k // 2] = 0.0  # exact zeros
    A /= A.sum(axis=-1, keepdims=True)
    m = np.ones((n_q, n_k), dtype=bool)
    m[-1] = False  # a dead row, with zero weights
    A_masked = np.where(m, A, 0.0)
    return [
        Case("zeros, one-hot and uniform rows", {"A": A, "mask": None},
             "row 0 one-hot (H = 0), row 1 uniform (H = log n), row 2 with exact zeros"),
        Case("fully masked row", {"A": A_masked, "mask": m}, "the last row is fully masked: H = 0, gradient 0"),
    ]


def _ground_state_cases(rng, hidden):
    n_q, n_k = sizes(rng, hidden, (4, 6), low=4)
    S = np.round(normal(rng, n_q, n_k, scale=3.0))  # integers: ties are likely
    S[1, :] = 0.0
    S[1, 1] = S[1, 3] = 2.0  # a two-way tie
    m = np.ones((n_q, n_k), dtype=bool)
    m[2, int(np.argmax(S[2]))] = False  # the largest score is masked
    m[3] = False  # dead row
    return [
        Case("ties", {"S": S, "mask": None}, "row 1 has a two-way tie for the maximum"),
        Case("masked maximum and dead row", {"S": S, "mask": m},
             "row 2's largest score is masked; row 3 is fully masked"),
    ]


def _heat_capacity_offset(rng, hidden):
    """A large common offset with a spread of order 1: where <S^2> - <S>^2 loses every digit."""
    n_q, n_k = sizes(rng, hidden, (3, 5))
    T = 1.0 if not hidden else float(rng.uniform(0.5, 2.0))
    return [
        Case("large common offset", {"S": 1e6 + normal(rng, n_q, n_k), "mask": None, "T": T},
             "scores 1e6 + N(0, 1): the weights are spread, and <S^2> - <S>^2 cancels "
             "catastrophically (centre the scores first)"),
    ]


EXERCISES = [
    Exercise(
        "3.1", "Stable, masked log-partition function", "statmech.log_partition_function",
        _log_partition_cases, points=3, probe=with_grad("S", name="log_Z"),
        hint="Subtract the row maximum of the masked, scaled scores before exp, and keep "
        "log of 0 (a fully masked row) out of both the value and the gradient (a 'double where').",
    ),
    Exercise(
        "3.2", "Entropy that is exact at zero weights", "statmech.entropy",
        _weights, points=3, probe=with_grad("A", name="H"),
        hint="0 log 0 = 0: mask the input of the logarithm as well as its result, or the "
        "gradient at a zero weight is nan.",
    ),
    Exercise(
        "3.3", "Free energy", "statmech.free_energy",
        lambda rng, hidden: _log_partition_cases(rng, hidden), points=2,
        probe=with_grad("S", name="F"),
        hint="F = -T log Z' - M with M the row maximum; a fully masked row is +inf with a zero gradient.",
    ),
    Exercise(
        "3.4", "Heat capacity", "statmech.heat_capacity",
        lambda rng, hidden: _score_cases(rng, hidden) + _heat_capacity_offset(rng, hidden), points=2,
        probe=with_grad("S", name="C"),
        hint="Centre the scores (two passes): <S^2> - <S>^2 cancels catastrophically for large scores.",
    ),
    Exercise(
        "3.5", "Zero-temperature limit with ties", "statmech.zero_temperature_limit",
        _ground_state_cases, points=2,
        hint="Compare with the maximum over the allowed keys and share the weight among ties; argmax is wrong.",
    ),
]
