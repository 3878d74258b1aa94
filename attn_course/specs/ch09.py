"""Chapter 9, Efficient Attention: exercises 9.1-9.5 (modules ``flash`` and ``kernel``).

9.1 and 9.4 are the online softmax of flash attention (one update, then a
whole row streamed in blocks); 9.2, 9.3 and 9.5 are attention read as kernel
regression: Nadaraya-Watson, the positive random features of the Performer,
and linear attention with elu + 1 features.  Random features take their
projection ``omega`` as an input array, so every output is deterministic.
Kernels and feature maps passed to the graded functions are written here
with the arrays' own module (``jax.numpy`` or ``mlx.core``, by :func:`xp`; the
same callables run on the submission and on the reference), so the cases
grade the regression, not the kernel.
"""

from __future__ import annotations

import numpy as np

from ..registry import Case, Exercise
from ._gen import finite_sum, grad, mask, normal, sizes, spd, value_and_grad_aux, with_grad, xp

INF = np.inf


# -- 9.1 online_softmax_update -----------------------------------------------------


def _state(rng, shape, b=3, offset=0.0, scale=1.0):
    """(m, l): the online state of a previous block of b entries (m finite, l in [1, b])."""
    prev = offset + normal(rng, *shape, b, scale=scale)
    m = prev.max(axis=-1)
    return m, np.exp(prev - m[..., None]).sum(axis=-1)


def _online_probe(fn, **inputs):
    """m', l' and the gradients of a weighted sum of l' wrt x_new and m (m' is a constant)."""
    def loss(x, m):
        m_new, l_new = fn(**{**inputs, "m": m, "x_new": x})
        return finite_sum(l_new), (m_new, l_new)

    (m_new, l_val), (dx, dm) = value_and_grad_aux(loss, argnums=(0, 1))(inputs["x_new"], inputs["m"])
    return {"m_new": m_new, "l_new": l_val, "d/dx_new (w . l_new)": dx, "d/dm (w . l_new)": dm}


def _online_cases(rng, hidden):
    r, b = sizes(rng, hidden, (4, 3))
    h = 2 if not hidden else 3
    # plain: a batch of heads, a finite state and a finite block
    m1, l1 = _state(rng, (h, r))
    x1 = normal(rng, h, r, b, scale=2.0)
    # masked: row 0 starts empty and gets a partly masked block; row 1 stays
    # empty under an all-masked block; row 2 keeps its state under one;
    # row 3 keeps its maximum and gains a masked entry; further rows plain.
    m2, l2 = _state(rng, (r,))
    x2 = normal(rng, r, b)
    m2[:2], l2[:2] = -INF, 0.0
    x2[0, 0] = -INF
    x2[1:3] = -INF
    m2[3] = x2[3].max() + 1.0 + rng.random()
    x2[3, -1] = -INF
    # large: scores near 1e4, where exp(x) overflows and exp(x - m') does not
    m3, l3 = _state(rng, (r,), offset=1e4, scale=3.0)
    x3 = 1e4 + normal(rng, r, b, scale=3.0)
    bad_x = normal(rng, r - 1, b)
    return [
        Case("plain, batch of heads", {"m": m1, "l": l1, "x_new": x1},
             f"m, l of shape ({h}, {r}) from a previous block, a new block x_new of shape ({h}, {r}, {b})"),
        Case("masked entries and empty states", {"m": m2, "l": l2, "x_new": x2},
             "row 0 starts from (-inf, 0) with a partly masked block; rows 1 and 2 get a block of "
             "only -inf (the state must not change, no nan); row 3 keeps its maximum"),
        Case("large scores", {"m": m3, "l": l3, "x_new": x3},
             "m and x_new near 1e4: exp(x) overflows, exp(x - m') does not"),
        Case("shape mismatch", {"m": m3, "l": l3, "x_new": bad_x},
             f"m has shape ({r},) but x_new has {r - 1} rows: must raise AttentionInputError"),
    ]


# -- 9.2 nadaraya_watson ----------------------------------------------------------


def _rbf_log_kernel(Q, K, log=True, sigma=1.0):
    """log kappa^{ij} = -|q^i - k^j|^2 / (2 sigma^2), literally (a kernel for the cases)."""
    ops = xp(Q, K)
    diff = Q[..., :, None, :] - K[..., None, :, :]
    log_kappa = -ops.sum(diff * diff, axis=-1) / (2.0 * sigma**2)
    return log_kappa if log else ops.exp(log_kappa)


def _nw_probe(fn, kernel="exponential", **inputs):
    """The default kernel (``kernel`` left out) or the Gaussian one above with its ``sigma``."""
    if kernel == "gaussian":
        return fn(kernel=_rbf_log_kernel, **inputs)
    return fn(**inputs)


def _nw_cases(rng, hidden):
    n_q, n_k, d, d_v = sizes(rng, hidden, (3, 4, 2, 3))
    b = 2 if not hidden else 3
    sigma = 1.0 if not hidden else float(rng.uniform(0.8, 1.2))
    # Gaussian kernel with every kappa below exp(-745): queries far from all keys
    # (|q - k| ~ 45 sigma), the keys close together so the weights are not one-hot.
    far = 45.0 * sigma / np.sqrt(d) * np.ones(d)
    Q_far = far + normal(rng, n_q, d, scale=0.05)
    K_near = normal(rng, n_k, d, scale=0.05 * sigma)
    cases = [
        Case("default kernel", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d), "V": normal(rng, n_k, d_v),
                                "mask": None},
             f"Q ({n_q}, {d}), K ({n_k}, {d}), V ({n_k}, {d_v}), exponential kernel: softmax attention"),
        Case("masked, batch, metric",
             {"Q": normal(rng, b, n_q, d), "K": normal(rng, b, n_k, d), "V": normal(rng, b, n_k, d_v),
              "mask": mask(rng, b, n_q, n_k), "g": spd(rng, d)},
             f"a batch of {b}, a mask whose first row is fully masked (output 0), and a metric g "
             "passed through **kernel_kwargs to the default kernel"),
        Case("Gaussian kernel, all kappa underflow",
             {"Q": Q_far, "K": K_near, "V": normal(rng, n_k, d_v), "mask": None, "kernel": "gaussian",
              "sigma": sigma},
             f"a Gaussian kernel (sigma={sigma:g} through **kernel_kwargs) with every kappa^{{ij}} < 1e-300: "
             "the weighted average must still come out (log space)"),
        Case("n_k mismatch", {"Q": normal(rng, n_q, d), "K": normal(rng, n_k, d), "V": normal(rng, n_k + 1, d_v),
                              "mask": None},
             f"K has n_k={n_k} but V has n_k={n_k + 1}: must raise AttentionInputError (index j)"),
    ]
    if hidden:
        cases.append(Case("one axis", {"Q": normal(rng, d), "K": normal(rng, n_k, d), "V": normal(rng, n_k, d_v),
                                       "mask": None}, "a 1-D Q must raise AttentionInputError"))
    return cases


# -- 9.3 positive_random_features ---------------------------------------------------


def _prf_cases(rng, hidden):
    n, d, m = sizes(rng, hidden, (3, 4, 6))
    b = 2 if not hidden else 3
    omega = normal(rng, m, d)
    big = normal(rng, b, n, d)
    big *= 50.0 / np.linalg.norm(big, axis=-1, keepdims=True)  # |x| = 50
    cases = [
        Case("unbiased (stabilize=False)", {"X": normal(rng, n, d), "omega": omega, "stabilize": False},
             f"X ({n}, {d}), omega ({m}, {d}), no stabiliser: phi = exp(u) / sqrt(m); and its gradient"),
        Case("stabilised, batch", {"X": normal(rng, b, n, d, scale=1.5), "omega": omega, "stabilize": True},
             f"X ({b}, {n}, {d}): subtract the maximum of u over rows and features of each batch element, "
             "as a constant (stop_gradient: it shows in the gradient)"),
        Case("single vector, |x| = 50", {"X": big[0, 0], "omega": omega, "stabilize": True},
             f"X of shape ({d},): the maximum runs over the features only; features must be finite"),
        Case("omega d_k mismatch", {"X": normal(rng, n, d), "omega": normal(rng, m, d + 1), "stabilize": True},
             f"X has d_k={d} but omega has d_k={d + 1}: must raise AttentionInputError (index a)"),
    ]
    if hidden:
        cases += [
            Case("large batch", {"X": big, "omega": omega, "stabilize": True}, "|x| = 50, stabilised"),
            Case("1-D omega", {"X": normal(rng, n, d), "omega": normal(rng, d), "stabilize": True},
                 "omega must be 2-D"),
        ]
    return cases


# -- 9.4 online_logsumexp ------------------------------------------------------------


def _lse_cases(rng, hidden):
    n1, n2, n3 = sizes(rng, hidden, (7, 6, 5))
    b1, b2, b3 = (3, 2, 8) if not hidden else (4, 3, 9)
    h = 2 if not hidden else 3
    x2 = normal(rng, 3, n2, scale=2.0)
    x2[0] = -INF  # a dead row
    x2[1, :b2] = -INF  # the first block of row 1 is all masked
    x2[2, rng.integers(n2)] = -INF
    return [
        Case("ragged last block, batch", {"x": normal(rng, h, 3, n1, scale=2.0), "block": b1},
             f"x of shape ({h}, 3, {n1}) in blocks of {b1}: the last block is padded with -inf"),
        Case("masked entries and a dead row", {"x": x2, "block": b2},
             "row 0 is all -inf (result -inf, gradient 0, no nan); row 1 starts with a block of only -inf; "
             "the gradient is the softmax weight, 0 at -inf entries"),
        Case("large values, one block longer than the row",
             {"x": 1e4 + normal(rng, 3, n3, scale=3.0), "block": b3},
             f"entries near 1e4 (exp overflows) and block={b3} > n={n3}"),
        Case("block = 0", {"x": normal(rng, 2, n3), "block": 0},
             "a block size below 1 must raise AttentionInputError"),
    ]


# -- 9.5 elu_plus_one and linear_attention (non-causal) -------------------------------


def _features(omega):
    """phi(x)^c = exp(omega^{ca} x^a - |x|^2/2) / sqrt(m): positive features with d_phi = m."""

    def phi(X):
        ops = xp(X)
        u = ops.einsum("...a,ca->...c", X, omega) - 0.5 * ops.sum(X * X, axis=-1, keepdims=True)
        return ops.exp(u) / np.sqrt(omega.shape[0])

    return phi


def _linear_probe(fn, x, omega=None, **inputs):
    """elu + 1 on ``x`` with its gradient, and non-causal linear attention.

    elu_plus_one is linear_attention's default feature map (its signature
    default); with ``omega`` the feature map is :func:`_features` instead.
    """
    import inspect

    elu = inspect.signature(fn).parameters["feature_map"].default
    phi = elu(x)
    dphi = grad(lambda x: finite_sum(elu(x)))(x)
    if omega is not None:
        inputs = {**inputs, "feature_map": _features(omega)}
    O = fn(**inputs)
    return {"elu_plus_one(x)": phi, "d/dx (w . elu_plus_one(x))": dphi, "O": O}


def _elu_points(rng, hidden):
    """Both branches, the kink at 0, and |x| up to 1000 (exp(1000) overflows)."""
    if not hidden:
        return np.array([-1000.0, -20.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 3.0, 1000.0])
    huge = rng.uniform(900.0, 1000.0, size=2) * np.array([-1.0, 1.0])
    return np.concatenate([huge, [0.0], normal(rng, 7, scale=3.0)])


def _linear_cases(rng, hidden):
    n_q, n_k, d, d_v = sizes(rng, hidden, (3, 4, 2, 3))
    m = 5 if not hidden else 6
    b = 2 if not hidden else 3
    pad = rng.random((b, n_k)) < 0.7
    pad[:, 0] = True
    pad[-1] = False  # a fully padded batch element: every denominator is 0
    eps = 1e-3 if not hidden else float(rng.uniform(1e-3, 1e-2))
    return [
        Case("elu + 1 features", {"x": _elu_points(rng, hidden), "Q": normal(rng, n_q, d),
                                  "K": normal(rng, n_k, d), "V": normal(rng, n_k, d_v), "mask": None,
                                  "causal": False, "eps": 0.0},
             "elu_plus_one on both branches with |x| up to 1000 (value and gradient finite); "
             f"linear attention with Q ({n_q}, {d}), K ({n_k}, {d}), V ({n_k}, {d_v})"),
        Case("padding mask, batch", {"x": normal(rng, 2, 3, scale=3.0), "Q": normal(rng, b, n_q, d),
                                     "K": normal(rng, b, n_k, d), "V": normal(rng, b, n_k, d_v), "mask": pad,
                                     "causal": False, "eps": 0.0},
             f"a batch of {b} with a padding mask (..., n_k); the last element has every key padded: "
             "denominator 0, output 0"),
        Case("other feature map, eps", {"x": normal(rng, 4, scale=3.0), "Q": normal(rng, b, n_q, d, scale=0.7),
                                        "K": normal(rng, n_k, d, scale=0.7), "V": normal(rng, n_k, d_v),
                                        "mask": None, "causal": False, "eps": eps, "omega": normal(rng, m, d)},
             f"positive features with d_phi={m} != d_k={d}, K and V shared by a batch of Q, eps={eps:g}"),
        Case("mask n_k mismatch", {"x": normal(rng, 3), "Q": normal(rng, n_q, d), "K": normal(rng, n_k, d),
                                   "V": normal(rng, n_k, d_v), "mask": np.ones(n_k + 1, dtype=bool),
                                   "causal": False, "eps": 0.0},
             f"K has n_k={n_k} but the mask has {n_k + 1} entries: must raise AttentionInputError (index j)"),
    ]


EXERCISES = [
    Exercise(
        "9.1", "The online softmax update", "flash.online_softmax_update", _online_cases,
        points=2, probe=_online_probe,
        hint="Shift by m' only where it is finite (0 otherwise), so that exp(-inf - m') is 0 and "
        "never exp(-inf + inf); and stop the gradient of m'.",
    ),
    Exercise(
        "9.2", "Nadaraya-Watson regression", "kernel.nadaraya_watson", _nw_cases,
        points=2, probe=_nw_probe,
        hint="Never form kappa: the normalised weights are a softmax of log kappa, which the "
        "library's masked softmax already computes stably.",
    ),
    Exercise(
        "9.3", "Positive random features", "kernel.positive_random_features", _prf_cases,
        points=2, probe=with_grad("X", name="phi"),
        hint="Scale x by d_k^(-1/4) before both terms of u, and treat the stabilising maximum as "
        "a constant (its axes depend on whether X has a row axis).",
    ),
    Exercise(
        "9.4", "Streaming log-sum-exp", "flash.online_logsumexp", _lse_cases,
        points=3, probe=with_grad("x", name="lse"),
        hint="Carry only (m, l) from block to block, and take the log of l only where l > 0 "
        "(a double where), so a dead row gives -inf with a zero gradient.",
    ),
    Exercise(
        "9.5", "Linear attention with elu + 1 features", "kernel.linear_attention", _linear_cases,
        points=3, probe=_linear_probe,
        hint="Clamp the argument of exp to x <= 0 before the where; then contract phi(K) with V "
        "and sum phi(K) over keys before meeting phi(Q), so no n_q x n_k array appears.",
    ),
]
