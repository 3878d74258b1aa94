"""Cases proposed for the specs: they make a catalogued mistake visible.

Not wired into any exercise yet (``EXERCISES`` in the chapter specs is
unchanged): ``PROPOSED`` maps an exercise id to a generator of extra cases,
``(rng, hidden) -> list[Case]`` like the specs' own.  The catalogue's tests
(tests/course/test_mistakes.py) use them to show that each entry below is
visible; once a chapter spec appends these cases, the entry is visible on
the public cases themselves.

* 2.1 ``K-not-transposed``: Q K instead of Q K^T only runs (and so only
  shows as wrong values rather than an error) when n_k = d_k.
* 3.4 ``one-pass-variance``: with scores near 1e4 and one weight near 1,
  the variance is exactly 0 either way; a large common offset with a
  spread of order 1 is where <S^2> - <S>^2 loses every digit.
* 10.2 ``max-not-subtracted``: Example 2's scores (2, 1, 0) overflow
  exp(S/T) only below T = 2/709; the public temperatures stop at 0.25 (the
  hidden cases go to T = 0.01 with larger scores, so there it shows).
"""

from __future__ import annotations

from ..registry import Case
from ._gen import normal, sizes


def _square_keys(rng, hidden):
    n_q, d = sizes(rng, hidden, (3, 4))
    return [
        Case("square keys (n_k = d_k)", {"Q": normal(rng, n_q, d), "K": normal(rng, d, d), "g": None,
                                         "scale": None},
             f"K of shape ({d}, {d}): Q K and Q K^T have the same shape, so only the values tell them apart"),
    ]


def _heat_capacity_offset(rng, hidden):
    n_q, n_k = sizes(rng, hidden, (3, 5))
    T = 1.0 if not hidden else float(rng.uniform(0.5, 2.0))
    return [
        Case("large common offset", {"S": 1e6 + normal(rng, n_q, n_k), "mask": None, "T": T},
             "scores 1e6 + N(0, 1): the weights are spread, and <S^2> - <S>^2 cancels "
             "catastrophically (centre the scores first)"),
    ]


def _cold_example2(rng, hidden):
    import numpy as np

    T = 1e-3 if not hidden else float(rng.uniform(5e-4, 2e-3))
    return [
        Case("Example 2, T=0.001", {"S": np.array([2.0, 1.0, 0.0]), "mask": None, "T": T},
             "scores (2, 1, 0) at T = 0.001: exp(S/T) overflows unless the maximum is subtracted"),
    ]


PROPOSED = {
    "2.1": _square_keys,
    "3.4": _heat_capacity_offset,
    "10.2": _cold_example2,
}
