"""Chapter 7, Attention Variants: exercises 7.1-7.5 (modules ``masking``, ``variants``).

Masks (7.1, 7.2) are built from sizes alone, so their cases are sizes,
offsets and windows; the boolean result is compared exactly, dtype kind
included (a 0/1 float mask is wrong).  Hidden cases use other fixed sizes and
draw offsets, windows and array values from the secret.
"""

from __future__ import annotations

import numpy as np

from ..registry import Case, Exercise
from ._gen import itemsize, normal, sizes


# -- 7.1 causal mask -----------------------------------------------------------
def _causal_cases(rng, hidden):
    """Square default, a cache (n_q < n_k), more queries than keys, an explicit offset."""
    n, a, b = sizes(rng, hidden, (4, 3, 5))  # a < b
    o = -1 if not hidden else int(rng.choice([-2, -1, 1, 3]))
    cases = [
        Case("square", {"n_q": n, "n_k": None, "offset": None, "like": None},
             f"n_q={n}, n_k and offset left out: n_k = n_q, offset 0, lower triangular"),
        Case("cache", {"n_q": a, "n_k": b, "offset": None, "like": None},
             f"n_q={a} < n_k={b}: the default offset n_k - n_q = {b - a} lines up the last query "
             "with the last key"),
        Case("more queries than keys", {"n_q": b, "n_k": a, "offset": None, "like": None},
             f"n_q={b} > n_k={a}: the default offset is {a - b}, so the first {b - a} rows are all False"),
        Case("explicit offset", {"n_q": a, "n_k": b, "offset": o, "like": np.zeros(1)},
             f"offset={o} given explicitly (and like= a JAX array): M^{{ij}} = [j <= i + ({o})]"),
        Case("offset not an integer", {"n_q": a, "n_k": b, "offset": 1.5, "like": None},
             "offset=1.5 must raise AttentionInputError"),
    ]
    if hidden:
        cases.append(Case("size 0", {"n_q": n, "n_k": 0, "offset": None, "like": None}))
    return cases


# -- 7.2 sliding-window mask -----------------------------------------------------
def _window_cases(rng, hidden):
    """Causal window (default), symmetric window, a window wider than the sequence, bad window."""
    n, a, b = sizes(rng, hidden, (5, 3, 6))  # a < b
    w = 2 if not hidden else int(rng.integers(2, n - 1))
    ws = 1 if not hidden else int(rng.integers(0, 3))
    cases = [
        Case("causal window", {"n_q": n, "window": w},
             f"n_q = n_k = {n}, window={w}, causal left out (default True): the {w} most recent keys"),
        Case("symmetric window", {"n_q": a, "n_k": b, "window": ws, "causal": False},
             f"n_q={a}, n_k={b}, window={ws}, causal=False: |p_i - j| <= {ws} with p_i = i + {b - a}"),
        Case("wide causal window", {"n_q": b, "n_k": a, "window": a + 1, "causal": True, "offset": None},
             f"n_q={b} > n_k={a} (first rows see no key), window={a + 1} >= n_k: equals causal_mask"),
        Case("window 0", {"n_q": n, "window": 0, "causal": True},
             "a causal window needs window >= 1: window=0 must raise AttentionInputError"),
    ]
    if hidden:
        o = int(rng.integers(-2, 3))
        cases += [
            Case("explicit offset", {"n_q": a, "n_k": b, "window": w, "causal": True, "offset": o}),
            Case("negative symmetric window", {"n_q": a, "n_k": b, "window": -1, "causal": False}),
        ]
    return cases


# -- 7.3 relative-position scores ------------------------------------------------
def _relative_cases(rng, hidden):
    """Full table, clipped table (max_distance), heads with a shared table and a scale, bad table."""
    n_q, n_k, d = sizes(rng, hidden, (3, 4, 2))
    h = 2 if not hidden else 3
    D = 1 if not hidden else 2  # clips: offsets i - j run over [-(n_k-1), n_q-1]
    scale = 0.5 if not hidden else float(rng.uniform(0.2, 2.0))
    return [
        Case("full table", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d),
                            "R": normal(rng, n_q + n_k - 1, d), "max_distance": None, "scale": None},
             f"n_q={n_q}, n_k={n_k}: R has n_q + n_k - 1 = {n_q + n_k - 1} rows, r = (i - j) + (n_k - 1)"),
        Case("max_distance", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d),
                              "R": normal(rng, 2 * D + 1, d), "max_distance": D, "scale": None},
             f"max_distance={D}: R has {2 * D + 1} rows, offsets beyond +-{D} share the end rows"),
        Case("heads and scale", {"Q": normal(rng, h, n_q, d), "K": normal(rng, h, n_k, d),
                                 "R": normal(rng, n_q + n_k - 1, d), "max_distance": None, "scale": scale},
             f"{h} heads on a leading axis, one table R shared by every head, scale={scale:g}"),
        Case("wrong table", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d),
                             "R": normal(rng, n_q + n_k, d), "max_distance": None, "scale": None},
             f"R has {n_q + n_k} rows but needs {n_q + n_k - 1}: must raise AttentionInputError"),
    ]


# -- 7.4 ALiBi slopes ----------------------------------------------------------------
def _alibi_cases(rng, hidden):
    """A power of two, another number of heads, one head, float32, n_heads < 1."""
    if not hidden:
        return [
            Case("8 heads", {"n_heads": 8, "like": None, "dtype": None},
                 "a power of two: m_h = 2^(-8h/8) = 1/2, 1/4, ..., 1/256 (float64 by default)"),
            Case("6 heads", {"n_heads": 6, "like": None, "dtype": None},
                 "not a power of two: the 4 slopes of 4 heads, then odd h of 8 heads"),
            Case("1 head", {"n_heads": 1, "like": None, "dtype": None}, "one head is a power of two: m_1 = 2^-8"),
            Case("float32", {"n_heads": 12, "like": None, "dtype": "float32"},
                 "12 heads with dtype='float32': the result is float32"),
            Case("0 heads", {"n_heads": 0, "like": None, "dtype": None},
                 "n_heads=0 must raise AttentionInputError"),
        ]
    return [
        Case("1", {"n_heads": 32, "like": None, "dtype": None}),
        Case("2", {"n_heads": 20, "like": None, "dtype": None}),
        Case("3", {"n_heads": 3, "like": None, "dtype": None}),
        Case("4", {"n_heads": 24, "like": np.zeros(2, dtype=np.float32), "dtype": None}),
        Case("5", {"n_heads": -1, "like": None, "dtype": None}),
    ]


def _alibi_probe(fn, **inputs):
    """The slopes (as float64) and the bit width of their float dtype."""
    m = fn(**inputs)
    return {"slopes": np.asarray(m, dtype=np.float64),
            "dtype_bits": np.asarray(8 * itemsize(m), dtype=np.int64)}


# -- 7.5 trilinear scores -------------------------------------------------------------
def _trilinear_cases(rng, hidden):
    """Plain, broadcasting leading axes with a scale, a feature-size mismatch."""
    n_q, n_j, n_k, d = sizes(rng, hidden, (2, 3, 4, 3))
    h = 2 if not hidden else 3
    scale = 0.3 if not hidden else float(rng.uniform(0.2, 2.0))
    return [
        Case("plain", {"Q": normal(rng, n_q, d), "K1": normal(rng, n_j, d), "K2": normal(rng, n_k, d),
                       "scale": None},
             f"Q ({n_q}, {d}), K1 ({n_j}, {d}), K2 ({n_k}, {d}): S of shape ({n_q}, {n_j}, {n_k}), "
             "scaled by 1/sqrt(d_k)"),
        Case("broadcast and scale", {"Q": normal(rng, h, n_q, d), "K1": normal(rng, n_j, d),
                                     "K2": normal(rng, h, 1, n_k, d), "scale": scale},
             f"leading axes (h={h},), (), ({h}, 1) broadcast to ({h}, {h}); scale={scale:g}"),
        Case("d_k mismatch", {"Q": normal(rng, n_q, d + 1), "K1": normal(rng, n_j, d + 1),
                              "K2": normal(rng, n_k, d), "scale": None},
             f"K2 has d_k={d} but Q has d_k={d + 1}: must raise AttentionInputError"),
    ]


EXERCISES = [
    Exercise(
        "7.1", "Causal mask with an offset", "masking.causal_mask", _causal_cases, points=2,
        hint="Compare a column of query positions i + offset with a row of key positions j; "
        "a tril fixes the offset at 0 and is wrong for rectangular masks.",
    ),
    Exercise(
        "7.2", "Sliding-window mask", "masking.sliding_window_mask", _window_cases, points=2,
        hint="With p = i + offset, the causal window is p - w < j <= p and the symmetric one "
        "|p - j| <= w; check the window's lower bound before building anything.",
    ),
    Exercise(
        "7.3", "Relative-position scores", "variants.relative_position_scores", _relative_cases,
        points=2,
        hint="Contract Q with the whole table first (P^{ir} = Q^{ia} R^{ra}), then gather "
        "column r(i, j) of row i with relative_position_index.",
    ),
    Exercise(
        "7.4", "ALiBi slopes", "variants.alibi_slopes", _alibi_cases, points=2, probe=_alibi_probe,
        # A float32 result computed in float32 arithmetic may be one float32 ulp (6e-8)
        # from the correctly rounded slope; a wrong rule is off by a factor 2^(1/2) or
        # more, and the dtype itself is checked exactly through dtype_bits.
        rtol=1e-6,
        hint="Write the recursion on Python floats (n0 slopes of n0 heads, then every other "
        "slope of 2 n0 heads) and convert once, to the requested dtype.",
    ),
    Exercise(
        "7.5", "Trilinear scores", "variants.trilinear_scores", _trilinear_cases, points=2,
        hint="One einsum over the shared feature index a with '...' for the leading axes; "
        "check that Q, K1 and K2 agree on d_k first.",
    ),
]
