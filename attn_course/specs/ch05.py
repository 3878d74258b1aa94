"""Chapter 5, Gradient Derivations: exercises 5.1-5.5 (module ``gradients``).

Exercises 5.3 and 5.4 grade one function, ``attention_backward``, through
two solution regions: the 5.3 probe keeps the fields dL_dQ, dL_dK, dL_dV,
dL_dA and dL_dS, the 5.4 probe only dL_dg.  Exercise 5.5 grades a function
that takes a function: the probe builds the scalar function ``f`` from the
case's plain inputs and records how it is called.
"""

from __future__ import annotations

import numpy as np

from ..registry import Case, Exercise
from ._gen import mask, normal, sizes, spd
from ._gen import np_softmax as _softmax


# -- 5.1 and 5.2: the softmax ------------------------------------------------------


def _softmax_backward_cases(rng, hidden):
    """Plain, masked batch with a dead row, mismatched shapes, T <= 0."""
    n_q, n_k = sizes(rng, hidden, (3, 5))
    b = 3 if hidden else 2
    T1 = float(rng.uniform(0.5, 2.5)) if hidden else 2.0
    T2 = float(rng.uniform(0.2, 0.9)) if hidden else 0.5
    A1 = _softmax(normal(rng, n_q, n_k, scale=2.0), T=T1)
    m = mask(rng, b, n_q, n_k)
    A2 = _softmax(normal(rng, b, n_q, n_k), m, T=T2)
    # the mismatch is in n_k publicly and in n_q for the hidden cases
    bad = (n_q, n_k - 1) if not hidden else (n_q - 1, n_k)
    T_bad = -float(rng.uniform(0.1, 1.0)) if hidden else 0.0
    return [
        Case("plain", {"A": A1, "dL_dA": normal(rng, n_q, n_k), "T": T1},
             f"A of shape ({n_q}, {n_k}) from a softmax, random dL/dA, T={T1:g}"),
        Case("masked batch", {"A": A2, "dL_dA": normal(rng, b, n_q, n_k), "T": T2},
             f"a batch of {b}; masked keys (A = 0) must get exactly 0 although dL/dA is not 0 "
             f"there, and the first row is fully masked; T={T2:g}"),
        Case("mismatched shapes", {"A": A1, "dL_dA": normal(rng, *bad), "T": 1.0},
             f"A is ({n_q}, {n_k}) but dL_dA is {bad}: must raise AttentionInputError"),
        Case("T <= 0", {"A": A1, "dL_dA": normal(rng, n_q, n_k), "T": T_bad},
             "T <= 0 must raise AttentionInputError (use check_temperature)"),
    ]


def _softmax_jacobian_cases(rng, hidden):
    """Plain, masked batch with a dead row at T != 1, T <= 0."""
    n_q, n_k = sizes(rng, hidden, (3, 4))
    b = 3 if hidden else 2
    T1 = float(rng.uniform(0.5, 2.5)) if hidden else 1.0
    T2 = float(rng.uniform(0.2, 0.9)) if hidden else 0.5
    m = mask(rng, b, n_q, n_k)
    return [
        Case("plain", {"A": _softmax(normal(rng, n_q, n_k, scale=2.0), T=T1), "T": T1},
             f"A of shape ({n_q}, {n_k}), T={T1:g}: J has shape ({n_q}, {n_k}, {n_k})"),
        Case("masked batch", {"A": _softmax(normal(rng, b, n_q, n_k), m, T=T2), "T": T2},
             f"a batch of {b} with masked keys and a fully masked first row (its block is 0), "
             f"T={T2:g}: mind the factor 1/T"),
        Case("T <= 0", {"A": _softmax(normal(rng, n_q, n_k)), "T": 0.0 if not hidden else -1.0},
             "T <= 0 must raise AttentionInputError (use check_temperature)"),
    ]


# -- 5.3 and 5.4: attention_backward -------------------------------------------------


def _fields(*names):
    """A probe keeping only some fields of the AttentionGrads that the call returns."""

    def probe(fn, **inputs):
        grads = fn(**inputs)
        return {n: getattr(grads, n) for n in names}

    return probe


def _asymmetric(rng, *shape):
    """A metric that is not symmetric (a transposed gradient would be wrong)."""
    d = shape[-1]
    return np.eye(d) + 0.5 * normal(rng, *shape)


def _call(Q, K, V, dL_dO, mask=None, T=1.0, g=None, scale=None):
    return {"Q": Q, "K": K, "V": V, "dL_dO": dL_dO, "mask": mask, "T": T, "g": g, "scale": scale}


def _backward_cases(rng, hidden):
    """Plain; masked batch with a dead row and a scale; a metric with shared keys; bad dL_dO."""
    n_q, n_k, d_k, d_v = sizes(rng, hidden, (3, 5, 4, 2))
    b = 3 if hidden else 2
    T2 = float(rng.uniform(0.3, 0.9)) if hidden else 0.7
    s2 = float(rng.uniform(0.2, 0.8)) if hidden else 0.4
    T3 = float(rng.uniform(1.1, 2.0)) if hidden else 1.3
    return [
        Case("plain", _call(normal(rng, n_q, d_k), normal(rng, n_k, d_k), normal(rng, n_k, d_v),
                            normal(rng, n_q, d_v)),
             f"n_q={n_q}, n_k={n_k}, d_k={d_k}, d_v={d_v}; no mask, no metric: scale 1/sqrt(d_k)"),
        Case("masked batch", _call(normal(rng, b, n_q, d_k), normal(rng, b, n_k, d_k),
                                   normal(rng, b, n_k, d_v), normal(rng, b, n_q, d_v),
                                   mask=mask(rng, b, n_q, n_k), T=T2, scale=s2),
             f"a batch of {b}, a mask whose first row is fully masked (zero gradients there, "
             f"no nan), T={T2:g}, scale={s2:g}"),
        Case("metric, shared keys", _call(normal(rng, b, n_q, d_k), normal(rng, n_k, d_k),
                                          normal(rng, n_k, d_v), normal(rng, b, n_q, d_v),
                                          T=T3, g=_asymmetric(rng, d_k, d_k)),
             f"an asymmetric metric g; K and V have no batch axis but Q has {b}: "
             f"dL_dK and dL_dV are summed over the batch; T={T3:g}"),
        Case("dL_dO of the wrong shape", _call(normal(rng, n_q, d_k), normal(rng, n_k, d_k),
                                               normal(rng, n_k, d_v), normal(rng, n_q, d_v + 1)),
             f"O is ({n_q}, {d_v}) but dL_dO is ({n_q}, {d_v + 1}): must raise AttentionInputError"),
    ]


def _metric_gradient_cases(rng, hidden):
    """Implicit metric; symmetric metric with a mask; per-head and shared asymmetric metrics."""
    n_q, n_k, d_k, d_v = sizes(rng, hidden, (3, 5, 4, 2))
    h = 3 if hidden else 2
    scale = float(rng.uniform(0.2, 0.8)) if hidden else None
    T2 = float(rng.uniform(0.5, 0.9)) if hidden else 0.8

    def qkv(*lead):
        return (normal(rng, *lead, n_q, d_k), normal(rng, *lead, n_k, d_k),
                normal(rng, *lead, n_k, d_v), normal(rng, *lead, n_q, d_v))

    return [
        Case("implicit metric", _call(*qkv(), scale=scale),
             f"no g: dL_dg is the gradient for the metric scale * delta_ab, shape ({d_k}, {d_k})"),
        Case("symmetric metric, masked", _call(*qkv(), mask=mask(rng, n_q, n_k), T=T2, g=spd(rng, d_k)),
             f"a symmetric positive-definite g, a fully masked first row, T={T2:g}"),
        Case("per-head metric", _call(*qkv(h), g=_asymmetric(rng, h, d_k, d_k)),
             f"{h} heads, each with its own asymmetric g of shape ({d_k}, {d_k}): "
             "a belongs to the query, b to the key"),
        Case("shared metric", _call(*qkv(h), g=_asymmetric(rng, d_k, d_k)),
             f"{h} heads sharing one asymmetric g: dL_dg is the sum over the heads"),
    ]


# -- 5.5: finite differences ---------------------------------------------------------


def _loss(name, K=None, V=None, dO=None):
    """The scalar function f handed to the student's code (NumPy float64)."""
    if name == "x11_sin":
        # f(x) = x^{11} sum_alpha sin x^alpha  (x^{11}: the first entry)
        return lambda x: x.flat[0] * np.sum(np.sin(x))
    if name == "attention":
        K, V, dO = (np.asarray(a, dtype=np.float64) for a in (K, V, dO))

        def f(Q):
            # L = dL/dO^{ib} O^{ib},  O = softmax(Q K^T / sqrt(d_k)) V
            A = _softmax(Q @ K.T / np.sqrt(K.shape[-1]))
            return np.sum(dO * (A @ V))

        return f
    raise ValueError(f"unknown loss {name!r}")


def _finite_difference_probe(fn, x, eps, loss, K=None, V=None, dO=None, as_numpy=False):
    """The gradient, and how f was called: 2 x.size times, on fresh float64 copies."""
    x_in = np.array(x) if as_numpy else x  # the caller's array (NumPy or JAX)
    x_orig = np.array(x_in)
    inner = _loss(loss, K, V, dO)
    seen = []  # (array passed to f, a copy taken on arrival)
    ok = [True]

    def f(a):
        fresh = (isinstance(a, np.ndarray) and a.dtype == np.float64
                 and a.shape == x_orig.shape and a is not x_in)
        if as_numpy and not np.array_equal(x_in, x_orig):
            fresh = False  # the caller's array was changed in place
        ok[0] = ok[0] and fresh
        seen.append((a, np.array(a, copy=True)))
        return inner(np.asarray(a, dtype=np.float64))

    grad = fn(f, x_in) if eps is None else fn(f, x_in, eps)
    distinct = len({id(a) for a, _ in seen}) == len(seen)
    unchanged = all(np.array_equal(np.asarray(a), c) for a, c in seen)
    return {
        "grad": grad,
        "returns numpy float64": isinstance(grad, np.ndarray) and grad.dtype == np.float64,
        "f got fresh float64 copies": ok[0] and distinct and unchanged,
        "caller's x untouched": np.array_equal(np.asarray(x_in), x_orig),
        "calls of f": len(seen),
    }


def _finite_difference_cases(rng, hidden):
    """The book's x^{11} sum sin x (default eps, then eps = 1e-3), an attention loss, float32 input."""
    shape = sizes(rng, hidden, (2, 3))
    n_q, n_k, d_k, d_v = sizes(rng, hidden, (3, 4, 3, 2))
    x32 = normal(rng, *shape).astype(np.float32)

    def inp(x, eps, loss="x11_sin", as_numpy=True, **params):
        return {"x": x, "eps": eps, "loss": loss, "K": params.get("K"), "V": params.get("V"),
                "dO": params.get("dO"), "as_numpy": as_numpy}

    return [
        Case("x^11 sum sin x, default eps", inp(normal(rng, *shape), None),
             f"f(x) = x^11 sum_a sin x^a for x of shape {shape} (NumPy), eps left at its default "
             "1e-6; f must be called 2 x.size times on fresh float64 copies, x left untouched"),
        Case("eps = 1e-3, JAX input", inp(normal(rng, *shape), 1e-3, as_numpy=False),
             "x is a JAX array and eps = 1e-3: central, not forward, differences with step eps"),
        Case("attention loss", inp(normal(rng, n_q, d_k), 1e-3, "attention",
                                   K=normal(rng, n_k, d_k), V=normal(rng, n_k, d_v),
                                   dO=normal(rng, n_q, d_v)),
             f"f(Q) = dL/dO^ib O^ib for attention with Q of shape ({n_q}, {d_k}), eps = 1e-3"),
        Case("float32 input", inp(x32, None),
             "x is float32: convert to float64 before perturbing (in float32 a step of 1e-6 is a few ulps)"),
    ]


EXERCISES = [
    Exercise(
        "5.1", "The softmax backward pass", "gradients.softmax_backward",
        _softmax_backward_cases, points=3,
        hint="Contract A with dL/dA over the key index (one number per row), subtract it from "
        "dL/dA and multiply by A/T: masked keys then need no special case.",
    ),
    Exercise(
        "5.2", "The softmax Jacobian", "gradients.softmax_jacobian",
        _softmax_jacobian_cases, points=3,
        hint="Two einsums, A^{ij} delta_{jk} with xp.eye(n_k) and the outer product A^{ij} A^{ik} "
        "of each row with itself; subtract and divide by T.",
    ),
    Exercise(
        "5.3", "The attention backward pass", "gradients.attention_backward",
        _backward_cases, points=3,
        probe=_fields("dL_dQ", "dL_dK", "dL_dV", "dL_dA", "dL_dS"),
        hint="Undo the forward pass one step at a time (O = A V, the softmax, S = Q g K^T), keep "
        "P^{ja} = dL/dS^{ij} Q^{ia} for the next exercise, and sum each gradient back to its "
        "input's shape with _sum_to_shape.",
    ),
    Exercise(
        "5.4", "The metric gradient", "gradients.attention_backward",
        _metric_gradient_cases, points=3, probe=_fields("dL_dg"),
        hint="In S^{ij} = Q^{ia} g_{ab} K^{jb}, a is the query's index and b the key's: contract "
        "P^{ja} with K^{jb}, then sum over the axes along which g was broadcast.",
    ),
    Exercise(
        "5.5", "Central finite differences", "gradients.finite_difference_gradients",
        _finite_difference_cases, points=3, probe=_finite_difference_probe,
        # NumPy code that JAX never differentiates, whose probe watches each call of f as it is
        # made (fresh copies, their number): run where the submission runs, not traced
        traced=False,
        # Both sides take the same central differences, so a correct submission
        # differs from the reference only by rounding in how the step and the
        # quotient are formed (e.g. dividing by the representable step
        # (x + eps) - x instead of eps): at most about u |f| / eps ~ 1e-9 for
        # |f| <= 10 and eps = 1e-6 (u = 1.1e-16).  Wrong methods are far
        # outside rtol = 1e-6, atol = 1e-8: forward differences are off by
        # eps |f''| / 2 ~ 1e-4 at eps = 1e-3, a step of 2 eps or a missing 2
        # by a factor of 2, float32 arithmetic by ~1e-1 at eps = 1e-6.
        rtol=1e-6, atol=1e-8,
        tol_mlx=(1e-6, 1e-8),  # f and the differences are NumPy float64 on MLX too: no MLX rounding
        hint="Work on a float64 copy of x: change one entry by +eps and by -eps, call f on a copy "
        "each time, and put the entry back before moving to the next one.",
    ),
]
