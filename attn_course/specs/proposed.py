"""Cases proposed for the specs: they make a catalogued mistake visible.

``PROPOSED`` maps an exercise id to a generator of extra cases, ``(rng,
hidden) -> list[Case]`` like the specs' own.  The catalogue's tests
(tests/course/test_mistakes.py) add them to the exercise's public cases, to
show that an entry is visible on them; once a chapter spec appends them, the
entry is visible on the public cases themselves, and they leave this file.

Wired into their exercises so far (no longer here): 2.1 "square keys (n_k =
d_k)" (``K-not-transposed``), 3.4 "large common offset" (``one-pass-variance``),
10.2 "Example 2, T=0.001" (``max-not-subtracted``).
"""

from __future__ import annotations

PROPOSED: dict = {}
