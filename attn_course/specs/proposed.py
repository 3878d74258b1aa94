"""Cases proposed for the specs: they make a catalogued mistake visible.

Not wired into any exercise yet (``EXERCISES`` in the chapter specs is
unchanged): ``PROPOSED`` maps an exercise id to a generator of extra cases,
``(rng, hidden) -> list[Case]`` like the specs' own.  The catalogue's tests
(tests/course/test_mistakes.py) use them to show that each entry below is
visible; once a chapter spec appends these cases, the entry is visible on
the public cases themselves.

* 3.4 ``one-pass-variance``: with scores near 1e4 and one weight near 1,
  the variance is exactly 0 either way; a large common offset with a
  spread of order 1 is where <S^2> - <S>^2 loses every digit.
"""

from __future__ import annotations

from ..registry import Case
from ._gen import normal, sizes


def _heat_capacity_offset(rng, hidden):
    n_q, n_k = sizes(rng, hidden, (3, 5))
    T = 1.0 if not hidden else float(rng.uniform(0.5, 2.0))
    return [
        Case("large common offset", {"S": 1e6 + normal(rng, n_q, n_k), "mask": None, "T": T},
             "scores 1e6 + N(0, 1): the weights are spread, and <S^2> - <S>^2 cancels "
             "catastrophically (centre the scores first)"),
    ]


PROPOSED = {
    "3.4": _heat_capacity_offset,
}
