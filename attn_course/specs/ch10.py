"""Chapter 10, Worked Examples: exercises 10.1-10.5.

The public cases are the chapter's examples themselves, built here from their
definitions (Example 1: Q = I, K and V of three keys; Example 2: the scores
(2, 1, 0) at several temperatures; Example 3: causal attention with a padded
key).  The hidden cases relabel and rescale the examples and add random ones,
so a function that only knows the printed numbers fails them.  Exercises
10.1, 10.3 and 10.5 grade functions first met in chapters 2, 3 and 5 (the
solution regions of 2.4, 3.2 and 5.1) on these examples.
"""

from __future__ import annotations

import numpy as np

from ..registry import Case, Exercise
from ._gen import mask, normal, with_grad
from ._gen import np_softmax as _softmax

C = 1.0 / np.sqrt(2.0)


def example1():
    Q = np.array([[1.0, 0.0], [0.0, 1.0]])
    K = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    V = np.array([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    return Q, K, V


def example3():
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    valid = np.array([False, True, True])
    causal = np.tril(np.ones((3, 3), dtype=bool))
    return X, causal & valid[None, :]


def _permuted(rng, Q, K, V):
    """Relabel queries, keys and features, and rescale: the same example in disguise."""
    pq, pk, pa, pb = (rng.permutation(n) for n in (Q.shape[0], K.shape[0], Q.shape[1], V.shape[1]))
    s = float(rng.uniform(0.5, 2.0))
    return s * Q[pq][:, pa], K[pk][:, pa], V[pk][:, pb]


def _decomposition_cases(rng, hidden):
    Q, K, V = example1()
    X, m3 = example3()
    if not hidden:
        return [
            Case("Example 1", {"Q": Q, "K": K, "V": V, "mask": None, "T": 1.0, "g": None},
                 "Example 1: Q = I, three keys, g = I/sqrt(2)"),
            Case("Example 3", {"Q": X, "K": X, "V": X, "mask": m3, "T": 1.0, "g": None},
                 "Example 3: causal mask and a padded key; row 1 is fully masked"),
        ]
    Qp, Kp, Vp = _permuted(rng, Q, K, V)
    n, d = int(rng.integers(3, 6)), int(rng.integers(2, 4))
    Xr = normal(rng, n, d)
    mr = np.tril(np.ones((n, n), dtype=bool)) & (rng.random(n) > 0.3)[None, :]
    mr[0] = False
    g = normal(rng, d, d)
    g = g @ g.T / d + np.eye(d)
    return [
        Case("1", {"Q": Qp, "K": Kp, "V": Vp, "mask": None, "T": float(rng.uniform(0.5, 2)), "g": None}),
        Case("2", {"Q": Xr, "K": Xr, "V": Xr, "mask": mr, "T": 1.0, "g": None}),
        Case("3", {"Q": normal(rng, 2, n, d), "K": normal(rng, 2, n + 1, d), "V": normal(rng, 2, n + 1, 3),
                   "mask": None, "T": 0.8, "g": g}),
    ]


TEMPERATURES = (0.25, 0.5, 1.0, 2.0)


def _gibbs_cases(rng, hidden):
    X, m3 = example3()
    S3 = C * X @ X.T
    if not hidden:
        S2 = np.array([2.0, 1.0, 0.0])
        return [Case(f"Example 2, T={T:g}", {"S": S2, "mask": None, "T": T}, f"scores (2, 1, 0) at T = {T:g}")
                for T in TEMPERATURES] + [
            Case("Example 3", {"S": S3, "mask": m3, "T": 1.0}, "row 1 fully masked: all zero weights")]
    S = normal(rng, 4, 5, scale=3.0)
    return [
        Case("1", {"S": S[0], "mask": None, "T": 0.01}),
        Case("2", {"S": S, "mask": None, "T": float(rng.uniform(0.3, 3.0))}),
        Case("3", {"S": S, "mask": mask(rng, 4, 5), "T": 0.5}),
        Case("4", {"S": S3[::-1], "mask": m3[::-1], "T": 1.3}),
    ]


def _cold_example2(rng, hidden):
    """Example 2 far below T = 2/709, where exp(S/T) overflows unless the maximum is subtracted."""
    T = 1e-3 if not hidden else float(rng.uniform(5e-4, 2e-3))
    return [
        Case("Example 2, T=0.001" if not hidden else "5", {"S": np.array([2.0, 1.0, 0.0]), "mask": None, "T": T},
             "scores (2, 1, 0) at T = 0.001: exp(S/T) overflows unless the maximum is subtracted"),
    ]


def _weight_rows(rng, hidden):
    """Example 2's weights (and both limits), Example 1's, Example 3's with its mask."""
    Q, K, V = example1()
    X, m3 = example3()
    S2 = np.array([2.0, 1.0, 0.0])
    rows = np.stack([_softmax(S2, T=T) for T in TEMPERATURES]
                    + [np.array([1.0, 0.0, 0.0]), np.full(3, 1 / 3)])
    A1 = _softmax(C * Q @ K.T)
    A3 = _softmax(C * X @ X.T, m3)
    if hidden:
        rows = rows[rng.permutation(len(rows))][:, rng.permutation(3)]
        A1 = _softmax(normal(rng, 3, 4, scale=2.0))
        A3, m3 = A3[:, ::-1], m3[:, ::-1]
    return rows, A1, A3, m3


def _entropy_cases(rng, hidden):
    rows, A1, A3, m3 = _weight_rows(rng, hidden)
    return [
        Case("Example 2" if not hidden else "1", {"A": rows, "mask": None},
             "the rows of the Example 2 table, then the limits T -> 0 (one-hot) and T -> inf (uniform)"),
        Case("Example 1" if not hidden else "2", {"A": A1, "mask": None}, "the weights of Example 1"),
        Case("Example 3" if not hidden else "3", {"A": A3, "mask": m3},
             "Example 3: a fully masked row, a one-key row, a two-key row"),
    ]


def _normalized_entropy_cases(rng, hidden):
    rows, A1, A3, m3 = _weight_rows(rng, hidden)
    return [
        Case("Example 1" if not hidden else "1", {"A": A1, "mask": None}, "no mask: n = 3 keys per row"),
        Case("Example 3" if not hidden else "2", {"A": A3, "mask": m3}, "rows with n = 0, 1 and 2 allowed keys"),
        Case("limits" if not hidden else "3", {"A": rows, "mask": None}, "one-hot gives 0, uniform gives 1"),
    ]


def _softmax_backward_cases(rng, hidden):
    Q, K, V = example1()
    T = 1.0
    if hidden:
        Q, K, V = _permuted(rng, Q, K, V)
        T = float(rng.uniform(0.5, 2.0))
    A = _softmax(C * Q @ K.T, T=T)
    O = A @ V
    dL_dA = O @ V.T  # L = |O|^2 / 2
    cases = [Case("Example 1" if not hidden else "1", {"A": A, "dL_dA": dL_dA, "T": T},
                  "Example 1 with L = |O|^2/2, so dL/dA^{ij} = O^{ib} V^{jb}")]
    if hidden:
        A2 = _softmax(normal(rng, 2, 3, 4))
        cases.append(Case("2", {"A": A2, "dL_dA": normal(rng, 2, 3, 4), "T": 0.7}))
    return cases


EXERCISES = [
    Exercise(
        "10.1", "Example 1 end to end", "attention.attention_decomposition", _decomposition_cases,
        points=2, region="2.4",
        hint="S = Q g K^T with g = I/sqrt(d_k) by default; a fully masked row has A = 0, O = 0, log Z = -inf.",
    ),
    Exercise(
        "10.2", "The Gibbs distribution at temperature T", "statmech.gibbs_distribution",
        lambda rng, hidden: _gibbs_cases(rng, hidden) + _cold_example2(rng, hidden),
        points=2, hint="Divide by T first, then subtract the row maximum: nothing overflows even at T = 0.01.",
    ),
    Exercise(
        "10.3", "Entropy with zero weights", "statmech.entropy", _entropy_cases, points=2, region="3.2",
        probe=with_grad("A", name="H"),
        hint="A log A is nan at A = 0, and where(A > 0, A log A, 0) still has a nan gradient: mask the input too.",
    ),
    Exercise(
        "10.4", "Normalized entropy under a mask", "statmech.normalized_entropy", _normalized_entropy_cases,
        points=2, probe=with_grad("A", name="h"),
        hint="Count the allowed keys per row; rows with n <= 1 give 0 (guard log 1 = 0 with a double where).",
    ),
    Exercise(
        "10.5", "The softmax backward pass on Example 1", "gradients.softmax_backward",
        _softmax_backward_cases, points=2, region="5.1",
        hint="dL/dS^{ij} = A^{ij} (dL/dA^{ij} - sum_k A^{ik} dL/dA^{ik}) / T; each row sums to zero.",
    ),
]
