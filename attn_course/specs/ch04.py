"""Chapter 4, Differential Geometry: exercises 4.1-4.4 (module ``geometry``).

Exercise 4.2 grades ``christoffel_symbols(metric_fn, x)``, whose first input
is a Python callable: a case cannot carry it as data.  Its cases therefore
carry the *parameters* of a metric field, and :func:`christoffel_probe`
builds the field from them inside the worker (and, the same way, on the
trusted side):

    g_ab(x) = G0_ab + x^c G1_cab + x^c x^e G2_ceab + W_ac(x) W_bc(x),
    W_ac(x) = W0_ac + W1_ace sin(x^e),

(a parameter left out is zero), which covers polar coordinates x = (r, th)
(G0 = diag(1, 0), G2_00 = diag(0, 1)), the unit sphere in coordinates
x = (ph, th) (G0 = diag(0, 1), W1_001 = 1: g = diag(sin^2 th, 1)), constant
metrics and random smooth fields.  Hidden cases rescale the closed-form
fields (g = diag(alpha, beta r^2), ...), so that no hidden parameter array
coincides with a released public one.
"""

from __future__ import annotations

import numpy as np

from ..registry import Case, Exercise
from ._gen import normal, sizes, spd, xp

# -- 4.1 angles ------------------------------------------------------------------


def _parallel(rng, n, d):
    """n rows of (u, v) with v = s u, s of both signs: exact angles 0 and pi."""
    u = normal(rng, n, d)
    s = rng.uniform(0.2, 3.0, size=(n, 1)) * np.where(np.arange(n) % 2 == 0, 1.0, -1.0)[:, None]
    return u, s * u


def _angle_cases(rng, hidden):
    (d,) = sizes(rng, hidden, (3,))
    n_par = 8 if not hidden else 12  # enough rows that rounding pushes some |cos| past 1
    b, n = sizes(rng, hidden, (2, 3))
    u_par, v_par = _parallel(rng, n_par, d + 1)
    u_zero = normal(rng, n, d)
    v_zero = normal(rng, n, d)
    if hidden:
        v_zero[int(rng.integers(1, n))] = 0.0
    else:
        u_zero[1] = 0.0
    return [
        Case("plain", {"u": normal(rng, d), "v": normal(rng, d), "g": spd(rng, d)},
             f"one pair of vectors of size {d} under a non-diagonal metric"),
        Case("parallel and antiparallel", {"u": u_par, "v": v_par, "g": spd(rng, d + 1)},
             f"{n_par} rows with v = s u (s > 0 and s < 0): angles 0 and pi, where the "
             "rounded cosine can lie just outside [-1, 1]"),
        Case("broadcast", {"u": normal(rng, b, n, d), "v": normal(rng, n, d),
                           "g": np.stack([spd(rng, d) for _ in range(b)])[:, None]},
             f"u ({b}, {n}, {d}), v ({n}, {d}), g ({b}, 1, {d}, {d}): leading axes broadcast"),
        Case("zero vector", {"u": u_zero, "v": v_zero, "g": spd(rng, d)},
             "one vector is zero: its angle is undefined, raise AttentionInputError", eager=True),
    ]


# -- 4.2 Christoffel symbols ---------------------------------------------------------


def metric_field(G0, G1=None, G2=None, W0=None, W1=None):
    """The metric field g(x) described in the module docstring, in x's backend (JAX or MLX)."""

    def g(x):
        ops = xp(x)
        out = G0 + 0 * x[0]  # a constant metric still depends (trivially) on x
        if G1 is not None:
            out = out + ops.einsum("c,cab->ab", x, G1)
        if G2 is not None:
            out = out + ops.einsum("c,e,ceab->ab", x, x, G2)
        if W0 is not None or W1 is not None:
            W = 0 * G0 if W0 is None else W0
            if W1 is not None:
                W = W + ops.einsum("ace,e->ac", W1, ops.sin(x))
            out = out + ops.einsum("ac,bc->ab", W, W)
        return out

    return g


def christoffel_probe(fn, x, G0, G1=None, G2=None, W0=None, W1=None):
    """Gamma^c_{ab} of the field built from the parameters, at the point x."""
    return {"Gamma": fn(metric_fn=metric_field(G0, G1, G2, W0, W1), x=x)}


def _sym(rng, *shape, scale):
    """Random arrays symmetric in their last two axes."""
    M = normal(rng, *shape, scale=scale)
    return (M + np.swapaxes(M, -1, -2)) / 2


def _christoffel_cases(rng, hidden):
    # Rescaled in hidden cases: g = diag(alpha, beta r^2), diag(beta sin^2 th, alpha).
    alpha, beta = (1.0, 1.0) if not hidden else tuple(rng.uniform(0.5, 2.0, size=2))
    G2 = np.zeros((2, 2, 2, 2))
    G2[0, 0] = np.diag([0.0, beta])
    polar = {"G0": np.diag([alpha, 0.0]), "G2": G2}  # g = diag(1, r^2)
    W1 = np.zeros((2, 2, 2))
    W1[0, 0, 1] = np.sqrt(beta)  # W = diag(sin th, 0)
    sphere = {"G0": np.diag([0.0, alpha]), "W1": W1}  # g = diag(sin^2 th, 1)
    r, th = (1.7, 0.4) if not hidden else (float(rng.uniform(0.5, 3.0)), float(rng.uniform(-3.0, 3.0)))
    ph, th2 = (0.3, 0.9) if not hidden else (float(rng.uniform(-3.0, 3.0)), float(rng.uniform(0.3, 2.8)))
    (d,) = sizes(rng, hidden, (3,))
    # A smooth field, positive definite near x: G0 >= 1 dominates the small x terms.
    smooth = {"G0": spd(rng, d), "G1": _sym(rng, d, d, d, scale=0.2),
              "G2": _sym(rng, d, d, d, d, scale=0.1), "W0": normal(rng, d, d, scale=0.5),
              "W1": normal(rng, d, d, d, scale=0.5)}
    return [
        Case("polar coordinates", {"x": np.array([r, th]), **polar},
             f"g = diag(1, r^2) at (r, th) = ({r:g}, {th:g}): Gamma^r_thth = -r, Gamma^th_rth = 1/r"),
        Case("sphere", {"x": np.array([ph, th2]), **sphere},
             f"g = diag(sin^2 th, 1) at (ph, th) = ({ph:g}, {th2:g}): Gamma^th_phph = -sin th cos th, "
             "Gamma^ph_phth = cot th"),
        Case("smooth field", {"x": normal(rng, d, scale=0.4), **smooth},
             f"a random smooth field in d={d} (linear, quadratic and sin terms); upper index first"),
        Case("constant metric", {"x": normal(rng, d), "G0": spd(rng, d)},
             "a constant metric: every Christoffel symbol is zero"),
    ]


# -- 4.3 Fisher information of the softmax ------------------------------------------------


def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _fisher_cases(rng, hidden):
    n_k, b, n_q = sizes(rng, hidden, (5, 2, 3))
    A = _softmax(normal(rng, b, n_q, n_k, scale=2.0))
    A[-1, -1] = 0.0
    A[-1, -1, int(rng.integers(n_k))] = 1.0  # one-hot row
    A[-1, 1, : n_k // 2] = 0.0  # a row with exact zeros (masked keys)
    A[-1, 1] /= A[-1, 1].sum()
    return [
        Case("one row", {"A": _softmax(normal(rng, n_k))}, f"one probability row of {n_k} weights"),
        Case("batch with zeros", {"A": A},
             f"A ({b}, {n_q}, {n_k}): a one-hot row (F = 0) and a row with exact zeros"),
    ]


# -- 4.4 natural-gradient step -----------------------------------------------------------


def _natural_step_cases(rng, hidden):
    p, b = sizes(rng, hidden, (4, 2))
    lr = 0.1 if not hidden else float(rng.uniform(0.05, 1.0))
    A = _softmax(normal(rng, b, p))
    F_logits = np.einsum("...j,jk->...jk", A, np.eye(p)) - np.einsum("...j,...k->...jk", A, A)
    lam = 1e-2 if not hidden else float(rng.uniform(1e-3, 1e-1))
    bad = -1.0 if not hidden else float("inf")
    c = 1.0 if not hidden else float(rng.uniform(0.5, 2.0))  # F = c delta: the step lr/c grad
    return [
        Case("default damping", {"theta": normal(rng, p), "grad": normal(rng, p), "fisher": spd(rng, p),
                                 "lr": lr},
             f"an SPD Fisher, p={p}, lr={lr:g}, damping left at its default 1e-3"),
        Case("identity, no damping", {"theta": normal(rng, p), "grad": normal(rng, p), "fisher": c * np.eye(p),
                                      "lr": lr, "damping": 0.0},
             "F = delta and damping 0: the plain gradient step"),
        Case("singular logit Fisher", {"theta": normal(rng, b, p), "grad": normal(rng, b, p),
                                       "fisher": F_logits, "lr": lr, "damping": lam},
             f"a batch of {b} logit Fishers diag(A) - A A^T (singular: F 1 = 0), damping {lam:g}"),
        Case("bad damping", {"theta": normal(rng, p), "grad": normal(rng, p), "fisher": spd(rng, p),
                             "lr": lr, "damping": bad},
             f"damping = {bad:g} must raise AttentionInputError"),
    ]


EXERCISES = [
    Exercise(
        "4.1", "Angles under a metric", "geometry.angle",
        _angle_cases, points=2,
        # arccos is ill-conditioned at +-1: a one-ulp difference in the cosine of
        # parallel vectors (another, equally right order of summation) moves the
        # angle by up to ~4e-8, so angles are compared to 2e-7.
        atol=2e-7,
        hint="Clip the cosine into [-1, 1] before arccos (rounding can push it one ulp past 1), "
        "and check both g-lengths for zero before dividing.",
    ),
    Exercise(
        "4.2", "Christoffel symbols by autodiff", "geometry.christoffel_symbols",
        _christoffel_cases, points=3, probe=christoffel_probe,
        hint="With dg[c, a, b] = d_c g_ab, the first kind is three re-orderings of dg; raise the "
        "index by solving with g (bilinear.raise_index) and return the upper index first.",
    ),
    Exercise(
        "4.3", "Fisher information of the softmax", "geometry.fisher_information_logits",
        _fisher_cases, points=2,
        hint="One einsum puts A on the diagonal (with an identity), another forms the outer "
        "product A_j A_k; keep the leading axes with '...'.",
    ),
    Exercise(
        "4.4", "A natural-gradient step", "geometry.natural_gradient_step",
        _natural_step_cases, points=2,
        hint="Add damping times the identity to F and solve (F + lambda I) x = grad over the "
        "leading axes; check that the damping is a finite number >= 0 first.",
    ),
]
