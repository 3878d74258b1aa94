"""Part IV, Differential Geometry: lengths, connections and the Fisher metric.

A metric g_{ab} turns the feature space into a Riemannian manifold:

    ||v||_g = sqrt(v^a g_{ab} v^b),   cos(theta) = u^a g_{ab} v^b / (||u||_g ||v||_g)

When the metric varies with position, ``metric_fn(x) -> g_{ab}(x)`` (a Python
callable of one point ``x`` of shape ``(d,)``), derivatives of vectors need the
Christoffel symbols

    Gamma^c_{ab} = 1/2 g^{cd} (d_a g_{bd} + d_b g_{ad} - d_d g_{ab}),

computed here by automatic differentiation (``xp.jacobian``), on JAX and MLX.
The attention metric g_{ab} = delta_{ab}/sqrt(d_k) is constant, so its
Christoffel symbols vanish and covariant derivatives are ordinary derivatives.

On the space of parameters the Fisher information is the natural metric,

    F_{ij} = E[d_i log p  d_j log p],

and natural gradient descent raises the index of the gradient with it.  For an
attention row it is the covariance of the (lowered) keys under the weights.

Arrays decide the backend.  Functions of vectors (``norm``, ``angle``, ...)
take leading batch axes; functions of a metric field take one point ``x`` of
shape ``(d,)`` (map them over points with ``jax.vmap``/``mx.vmap``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ._checks import (
    AttentionInputError,
    batch_shape,
    check_finite,
    check_weights,
    require_match,
    require_ndim,
    require_square,
)
from .backend import Backend, is_concrete, namespace
from .bilinear import raise_index, scaled_euclidean_metric
from .softmax import softmax_and_log_partition

__all__ = [
    "norm",
    "distance",
    "cosine_similarity",
    "angle",
    "volume_element",
    "metric_derivatives",
    "christoffel_first_kind",
    "christoffel_symbols",
    "covariant_derivative_vector",
    "covariant_derivative_covector",
    "geodesic_acceleration",
    "fisher_information_logits",
    "fisher_information_query",
    "natural_gradient",
    "natural_gradient_step",
]

MetricField = Callable[[Any], Any]


# ---------------------------------------------------------------------------
# Lengths and angles under a constant metric
# ---------------------------------------------------------------------------


def _vector_and_metric(xp: Backend, v: Any, g: Any, vname: str) -> tuple[Any, Any]:
    v, g = xp.floating(xp.asarray(v), xp.asarray(g))
    require_ndim(v, vname, "a")
    require_square(g, "g")
    require_match("a", ("g", "d", g.shape[-1]), (vname, "d", v.shape[-1]))
    batch_shape((v, 1), (g, 2))
    return v, g


def _squared_length(xp: Backend, v: Any, g: Any, vname: str) -> Any:
    """v^a g_{ab} v^b, with rounding below zero clipped for semi-definite g."""
    # q = v^a g_{ab} v^b
    q = xp.einsum("...a,...ab,...b->...", v, g, v)
    # Size of the terms that cancel in q: the rounding scale of q.
    size = xp.einsum("...a,...ab,...b->...", xp.abs(v), xp.abs(g), xp.abs(v))
    eps = float(np.finfo(np.float32 if not xp.is_float64(q) else np.float64).eps)
    slack = 8 * v.shape[-1] * eps * size
    if is_concrete(q) and xp.any_true(q < -slack):
        worst = float(xp.min(q).item())
        raise AttentionInputError(
            f"g is not positive (semi-)definite: {vname}^a g_ab {vname}^b = "
            f"{worst:.3g} < 0, so ||{vname}||_g is not a length "
            "(see attn_tensors.bilinear.check_metric)"
        )
    return xp.maximum(q, xp.zeros_like(q))


def _require_nonzero(v: Any, g: Any, vname: str) -> None:
    """||v||_g > 0 for every vector: checked on the inputs when they are concrete.

    The inputs, not a length computed from them: under ``jit`` with the
    inputs as constants (how the course runs a case) they are still
    concrete while anything computed from them is a tracer, and the zero
    vector would give a NaN instead of this error.
    """
    if not (is_concrete(v) and is_concrete(g)):
        return
    vv = np.asarray(v, dtype=np.float64)
    gg = np.asarray(g, dtype=np.float64)
    # q = v^a g_{ab} v^b, zero up to rounding (a q below that is _squared_length's error)
    q = np.einsum("...a,...ab,...b->...", vv, gg, vv)
    size = np.einsum("...a,...ab,...b->...", np.abs(vv), np.abs(gg), np.abs(vv))
    slack = 8 * vv.shape[-1] * np.finfo(np.float64).eps * size
    if np.any((q <= 0) & (q >= -slack)):
        raise AttentionInputError(
            f"{vname} has zero length under g (||{vname}||_g = 0: the zero "
            "vector, or a null direction of a degenerate metric); its angle "
            "with another vector is undefined"
        )


def norm(v: Any, g: Any) -> Any:
    """||v||_g = sqrt(v^a g_{ab} v^b): the length of v^a under the metric g_{ab}.

    ``v (..., d)`` and ``g (..., d, d)`` broadcast over leading axes.  An
    indefinite metric that makes v^a g_{ab} v^b negative is an error (when the
    values are concrete).
    """
    xp = namespace(v, g)
    v, g = _vector_and_metric(xp, v, g, "v")
    return xp.sqrt(_squared_length(xp, v, g, "v"))


def distance(u: Any, v: Any, g: Any) -> Any:
    """d(u, v) = ||u - v||_g = sqrt((u - v)^a g_{ab} (u - v)^b)."""
    xp = namespace(u, v, g)
    u, v, g = xp.floating(xp.asarray(u), xp.asarray(v), xp.asarray(g))
    require_ndim(u, "u", "a")
    require_ndim(v, "v", "a")
    require_match("a", ("u", "d", u.shape[-1]), ("v", "d", v.shape[-1]))
    w, g = _vector_and_metric(xp, u - v, g, "u - v")
    return xp.sqrt(_squared_length(xp, w, g, "u - v"))


def cosine_similarity(u: Any, v: Any, g: Any) -> Any:
    """cos(theta) = u^a g_{ab} v^b / (||u||_g ||v||_g).

    A vector of zero length has no direction: that is an error when the
    inputs are concrete (as they are when ``jit`` closes over them; with
    traced inputs the result would be NaN).
    """
    xp = namespace(u, v, g)
    u, v, g = xp.floating(xp.asarray(u), xp.asarray(v), xp.asarray(g))
    u, g = _vector_and_metric(xp, u, g, "u")
    v, g = _vector_and_metric(xp, v, g, "v")
    batch_shape((u, 1), (v, 1), (g, 2))
    _require_nonzero(u, g, "u")
    _require_nonzero(v, g, "v")
    ### BEGIN SOLUTION 4.1
    nu = xp.sqrt(_squared_length(xp, u, g, "u"))
    nv = xp.sqrt(_squared_length(xp, v, g, "v"))
    # B(u, v) = u^a g_{ab} v^b
    b = xp.einsum("...a,...ab,...b->...", u, g, v)
    return b / (nu * nv)
    ### END SOLUTION


def angle(u: Any, v: Any, g: Any) -> Any:
    """theta = arccos(u^a g_{ab} v^b / (||u||_g ||v||_g)), in [0, pi].

    The cosine is clipped into [-1, 1] first: rounding can push it just past
    1 for parallel vectors, where arccos would give NaN.
    """
    xp = namespace(u, v, g)
    ### BEGIN SOLUTION 4.1
    c = cosine_similarity(u, v, g)
    one = xp.scalar(1.0, c)
    return xp.arccos(xp.clip(c, -one, one))
    ### END SOLUTION


def volume_element(g: Any) -> Any:
    """sqrt(det g_{ab}) = prod_a L_{aa} with g = L L^T: the g-volume of the unit basis cell.

    With the Cholesky factor g = L L^T, det g = (prod_a L_{aa})^2, so the
    square root never sees a negative rounding error.  The metric must be
    positive definite (checked when the values are concrete).
    """
    xp = namespace(g)
    (g,) = xp.floating(xp.asarray(g))
    require_square(g, "g")
    if is_concrete(g):
        lam_min = xp.min(xp.eigvalsh((g + xp.swap_last(g)) / 2))
        if float(lam_min.item()) <= 0:
            raise AttentionInputError(
                "volume_element needs a positive-definite metric g_ab; its "
                f"smallest eigenvalue is {float(lam_min.item()):.3g}"
            )
    L = xp.cholesky(g)
    # sqrt(det g) = prod_a L_{aa}
    return xp.prod(xp.einsum("...aa->...a", L), axis=-1)


# ---------------------------------------------------------------------------
# Position-dependent metrics: Christoffel symbols and covariant derivatives
# ---------------------------------------------------------------------------


def _point(xp: Backend, x: Any) -> Any:
    (x,) = xp.floating(xp.asarray(x))
    if x.ndim != 1:
        raise AttentionInputError(
            f"x must be one point of shape (d,) (index a); got shape "
            f"{tuple(x.shape)}. Map over many points with jax.vmap / mx.vmap."
        )
    return x


def _metric_at(xp: Backend, metric_fn: MetricField, x: Any) -> Any:
    g = xp.asarray(metric_fn(x), dtype=x.dtype)
    d = x.shape[-1]
    if tuple(g.shape) != (d, d):
        raise AttentionInputError(
            f"metric_fn(x) has shape {tuple(g.shape)} but x has d={d}; a metric "
            f"field must return g_ab of shape ({d}, {d}) (indices a, b must "
            "match the coordinates of x)"
        )
    return g


def _field_at(xp: Backend, fn: Callable, x: Any, name: str, index: str) -> Any:
    f = xp.asarray(fn(x), dtype=x.dtype)
    d = x.shape[-1]
    if tuple(f.shape) != (d,):
        raise AttentionInputError(
            f"{name}(x) has shape {tuple(f.shape)} but x has d={d}; it must "
            f"return one component per coordinate, shape ({d},) (index {index})"
        )
    return f


def metric_derivatives(metric_fn: MetricField, x: Any) -> Any:
    """dg_{cab} = d_c g_{ab}(x): the first derivatives of the metric field, by autodiff.

    Returns an array of shape ``(d, d, d)`` indexed ``[c, a, b]``.
    """
    xp = namespace(x)
    x = _point(xp, x)
    _metric_at(xp, metric_fn, x)  # shape check with a clear message
    J = xp.jacobian(lambda y: xp.asarray(metric_fn(y), dtype=x.dtype), x)
    # xp.jacobian gives J[a, b, c] = d g_{ab} / d x^c; d_c g_{ab} = J[a, b, c]
    return xp.einsum("abc->cab", J)


def christoffel_first_kind(metric_fn: MetricField, x: Any) -> Any:
    """Gamma_{dab} = 1/2 (d_a g_{bd} + d_b g_{ad} - d_d g_{ab}): all indices down.

    Returns an array indexed ``[d, a, b]``, symmetric in ``a, b``.
    """
    dg = metric_derivatives(metric_fn, x)  # dg[c, a, b] = d_c g_{ab}
    xp = namespace(dg)
    ### BEGIN SOLUTION 4.2
    # d_a g_{bd} -> [d, a, b]
    t1 = xp.einsum("abd->dab", dg)
    # d_b g_{ad} -> [d, a, b]
    t2 = xp.einsum("bad->dab", dg)
    # d_d g_{ab} is dg[d, a, b] already
    return (t1 + t2 - dg) / 2
    ### END SOLUTION


def christoffel_symbols(metric_fn: MetricField, x: Any) -> Any:
    """Gamma^c_{ab} = 1/2 g^{cd} (d_a g_{bd} + d_b g_{ad} - d_d g_{ab}).

    Returns an array indexed ``[c, a, b]`` (upper index first), symmetric in
    ``a, b``.  The upper index is raised by solving g_{cd} Gamma^d_{ab} =
    Gamma_{cab} (the inverse metric is never formed), so a constant metric
    gives exactly zero.
    """
    xp = namespace(x)
    x = _point(xp, x)
    g = _metric_at(xp, metric_fn, x)
    ### BEGIN SOLUTION 4.2
    first = christoffel_first_kind(metric_fn, x)  # [d, a, b]
    # Gamma^c_{ab} = g^{cd} Gamma_{dab}: raise the last index of [a, b, d]
    up = raise_index(xp.einsum("dab->abd", first), g)  # [a, b, c]
    return xp.einsum("abc->cab", up)
    ### END SOLUTION


def covariant_derivative_vector(
    metric_fn: MetricField, v_fn: Callable[[Any], Any], x: Any
) -> Any:
    """nabla_a v^b = d_a v^b + Gamma^b_{ac} v^c, for a vector field v_fn(x) -> v^b(x).

    Returns an array indexed ``[a, b]`` (derivative index first).
    """
    xp = namespace(x)
    x = _point(xp, x)
    v = _field_at(xp, v_fn, x, "v_fn", "b")
    Gamma = christoffel_symbols(metric_fn, x)  # [b, a, c]
    J = xp.jacobian(lambda y: xp.asarray(v_fn(y), dtype=x.dtype), x)  # [b, a]
    # d_a v^b = J[b, a];  Gamma^b_{ac} v^c
    return xp.einsum("ba->ab", J) + xp.einsum("bac,c->ab", Gamma, v)


def covariant_derivative_covector(
    metric_fn: MetricField, u_fn: Callable[[Any], Any], x: Any
) -> Any:
    """nabla_a u_b = d_a u_b - Gamma^c_{ab} u_c, for a covector field u_fn(x) -> u_b(x).

    Returns an array indexed ``[a, b]`` (derivative index first).
    """
    xp = namespace(x)
    x = _point(xp, x)
    u = _field_at(xp, u_fn, x, "u_fn", "b")
    Gamma = christoffel_symbols(metric_fn, x)  # [c, a, b]
    J = xp.jacobian(lambda y: xp.asarray(u_fn(y), dtype=x.dtype), x)  # [b, a]
    # d_a u_b = J[b, a];  Gamma^c_{ab} u_c
    return xp.einsum("ba->ab", J) - xp.einsum("cab,c->ab", Gamma, u)


def geodesic_acceleration(metric_fn: MetricField, x: Any, v: Any) -> Any:
    """d^2 x^c / dt^2 = -Gamma^c_{ab} v^a v^b: the geodesic equation at x with velocity v.

    ``v`` may carry leading batch axes ``(..., d)`` (many velocities at one point).
    """
    xp = namespace(x, v)
    x = _point(xp, x)
    v = xp.asarray(v, dtype=x.dtype)
    require_ndim(v, "v", "a")
    require_match("a", ("x", "d", x.shape[-1]), ("v", "d", v.shape[-1]))
    Gamma = christoffel_symbols(metric_fn, x)
    # a^c = -Gamma^c_{ab} v^a v^b
    return -xp.einsum("cab,...a,...b->...c", Gamma, v, v)


# ---------------------------------------------------------------------------
# Fisher information of attention and the natural gradient
# ---------------------------------------------------------------------------


def fisher_information_logits(A: Any) -> Any:
    """F_{jk} = A_j delta_{jk} - A_j A_k = E_A[d_j log A  d_k log A] w.r.t. the logits s_k.

    ``A (..., n_k)`` holds probability rows (e.g. attention weights, one row
    per query); the result has shape ``(..., n_k, n_k)``.  It is also the
    Hessian of log Z(s) = log sum_j exp(s_j).  F is singular: F_{jk} 1^k = 0,
    because adding a constant to every logit leaves the softmax unchanged.
    For logits divided by a temperature, s -> s/T, divide F by T^2.
    """
    xp = namespace(A)
    (A,) = xp.floating(xp.asarray(A))
    require_ndim(A, "A", "j")
    check_weights(xp, A=A)
    ### BEGIN SOLUTION 4.3
    n = A.shape[-1]
    eye = xp.eye(n, dtype=A.dtype)
    # F_{jk} = A_j delta_{jk} - A_j A_k
    return xp.einsum("...j,jk->...jk", A, eye) - xp.einsum("...j,...k->...jk", A, A)
    ### END SOLUTION


def fisher_information_query(
    q: Any, K: Any, mask: Any = None, T: Any = 1.0, g: Any = None
) -> Any:
    """F_{ab} = A_j (k_{ja} - kbar_a)(k_{jb} - kbar_b) / T^2 with k_{ja} = g_{ab} K^{jb}.

    The Fisher information of the attention distribution
    A_j = softmax_j(q^a g_{ab} K^{jb} / T) with respect to the query q^a.
    Since d log A_j / d q^a = (k_{ja} - kbar_a) / T with the lowered keys
    k_{ja} = g_{ab} K^{jb} and their mean kbar_a = A_j k_{ja},

        F_{ab} = E_A[d_a log A_j  d_b log A_j] = Cov_A[k_a, k_b] / T^2.

    ``q (..., d_k)``, ``K (..., n_k, d_k)``, ``mask (..., n_k)`` (boolean, may
    attend) and ``g (..., d_k, d_k)`` broadcast over leading axes; the default
    metric is g_{ab} = delta_{ab} / sqrt(d_k).  A query that may attend to no
    key has F = 0.
    """
    xp = namespace(q, K, mask, g)
    q, K = xp.floating(xp.asarray(q), xp.asarray(K))
    require_ndim(q, "q", "a")
    require_ndim(K, "K", "jb")
    require_match("a", ("K", "d_k", K.shape[-1]), ("q", "d_k", q.shape[-1]))
    d = q.shape[-1]
    if g is None:
        g = scaled_euclidean_metric(d, like=q)
    g = xp.asarray(g, dtype=q.dtype)
    require_square(g, "g")
    require_match("a", ("K", "d_k", K.shape[-1]), ("g", "d", g.shape[-1]))
    batch_shape((q, 1), (K, 2), (g, 2))
    check_finite(xp, q=q, K=K, g=g)
    # k_{ja} = g_{ab} K^{jb}  (lowered keys)
    k = xp.einsum("...ab,...jb->...ja", g, K)
    # s_j = q^a k_{ja}
    s = xp.einsum("...a,...ja->...j", q, k)
    A, _ = softmax_and_log_partition(s, mask, T, xp)
    # kbar_a = A_j k_{ja}
    kbar = xp.einsum("...j,...ja->...a", A, k)
    dev = k - kbar[..., None, :]
    # F_{ab} = A_j dev_{ja} dev_{jb} / T^2
    return xp.einsum("...j,...ja,...jb->...ab", A, dev, dev) / (T * T)


def _damped(xp: Backend, grad: Any, fisher: Any, damping: Any) -> tuple[Any, Any]:
    grad, fisher = xp.floating(xp.asarray(grad), xp.asarray(fisher))
    require_ndim(grad, "grad", "j")
    require_square(fisher, "fisher", "ij")
    require_match(
        "j", ("fisher", "p", fisher.shape[-1]), ("grad", "p", grad.shape[-1])
    )
    batch_shape((grad, 1), (fisher, 2))
    ### BEGIN SOLUTION 4.4
    if isinstance(damping, (int, float)) and not (0 <= damping < float("inf")):
        raise AttentionInputError(
            f"damping must be a finite number >= 0; got damping={damping}"
        )
    p = fisher.shape[-1]
    # (F + lambda I)_{ij}
    return grad, fisher + damping * xp.eye(p, dtype=fisher.dtype)
    ### END SOLUTION


def natural_gradient(grad: Any, fisher: Any, damping: Any = 1e-3) -> Any:
    """nat^i = [(F + lambda delta)^{-1}]^{ij} dL/dtheta^j: the gradient, index raised by F.

    ``grad (..., p)`` is the covector dL/dtheta^j; ``fisher (..., p, p)`` the
    Fisher metric F_{ij}.  The damping lambda >= 0 is needed whenever F is
    singular, e.g. the Fisher of softmax logits, whose null vector is the
    all-ones direction (shifting every logit changes nothing).  With
    lambda = 0 and F = delta this is the plain gradient.  Solved with
    ``xp.solve``; the inverse is never formed.
    """
    xp = namespace(grad, fisher)
    ### BEGIN SOLUTION 4.4
    grad, F = _damped(xp, grad, fisher, damping)
    # nat^i = (F + lambda I)^{-1 ij} dL/dtheta^j
    return raise_index(grad, F)
    ### END SOLUTION


def natural_gradient_step(
    theta: Any, grad: Any, fisher: Any, lr: Any, damping: Any = 1e-3
) -> Any:
    """theta_new^i = theta^i - lr [(F + lambda delta)^{-1}]^{ij} dL/dtheta^j.

    Without damping the step is invariant under a linear reparameterisation
    theta = L phi: the step in phi, mapped through L, equals the step in
    theta (the plain gradient step is not).  See :func:`natural_gradient`.
    """
    xp = namespace(theta, grad, fisher)
    (theta,) = xp.floating(xp.asarray(theta))
    require_ndim(theta, "theta", "i")
    require_match(
        "i", ("grad", "p", xp.asarray(grad).shape[-1]), ("theta", "p", theta.shape[-1])
    )
    ### BEGIN SOLUTION 4.4
    step = natural_gradient(grad, fisher, damping)
    return theta - lr * step
    ### END SOLUTION
