"""Part V, Gradient Derivations: the backward pass of attention by hand.

The forward pass (:mod:`attn_tensors.attention`)::

    S^{ij} = Q^{ia} g_{ab} K^{jb}        (g_{ab} = delta_{ab}/sqrt(d_k) by default)
    A^{ij} = exp(S^{ij}/T) / sum_k exp(S^{ik}/T)
    O^{ib} = A^{ij} V^{jb}

Given the upstream gradient dL/dO^{ib}, the chain rule read index by index::

    dL/dV^{jb}  = A^{ij} dL/dO^{ib}
    dL/dA^{ij}  = dL/dO^{ib} V^{jb}
    dL/dS^{ij}  = (1/T) A^{ij} (dL/dA^{ij} - sum_k A^{ik} dL/dA^{ik})
    dL/dQ^{ia}  = dL/dS^{ij} g_{ab} K^{jb}
    dL/dK^{jb}  = dL/dS^{ij} Q^{ia} g_{ab}
    dL/dg_{ab}  = dL/dS^{ij} Q^{ia} K^{jb}

Every function takes JAX or MLX arrays with any leading batch/head axes.
:func:`attention_backward` is the derivation as code;
:func:`autodiff_gradients` gets the same numbers from the framework's
autodiff, :func:`finite_difference_gradients` from central differences, and
:func:`verify_gradients` / :func:`gradient_errors` compare them (these two are
"report" functions: they return Python bools and floats).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import (
    AttentionInputError,
    check_temperature,
    check_weights,
    require_match,
    require_ndim,
)
from .attention import (
    AttentionParts,
    attention_decomposition,
    attention_output,
    scaled_dot_product_attention,
)
from .backend import Backend, namespace, to_numpy
from .softmax import softmax

__all__ = [
    "AttentionGrads",
    "softmax_jacobian",
    "softmax_backward",
    "attention_backward",
    "attention_forward_backward",
    "autodiff_gradients",
    "finite_difference_gradients",
    "verify_gradients",
    "gradient_errors",
]


class AttentionGrads(NamedTuple):
    """The gradients of a scalar loss L with respect to every tensor of attention.

    ``dL_dQ``, ``dL_dK``, ``dL_dV`` and ``dL_dg`` have the shapes of the
    inputs ``Q``, ``K``, ``V`` and ``g`` (summed over batch axes that the
    input broadcast along).  ``dL_dA`` and ``dL_dS`` have the shape of the
    scores ``(..., n_q, n_k)``.  Without a metric, ``dL_dg`` is the gradient
    with respect to the implicit metric g_{ab} = delta_{ab}/sqrt(d_k), shape
    ``(d_k, d_k)``.
    """

    dL_dQ: Any  # dL/dQ^{ia}
    dL_dK: Any  # dL/dK^{jb}
    dL_dV: Any  # dL/dV^{jb}
    dL_dA: Any  # dL/dA^{ij}
    dL_dS: Any  # dL/dS^{ij}
    dL_dg: Any  # dL/dg_{ab}


# -- helpers -------------------------------------------------------------------


def _sum_to_shape(xp: Backend, x: Any, shape: tuple[int, ...]) -> Any:
    """Undo broadcasting: sum x over the axes that were broadcast to reach x.shape."""
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    if lead > 0:
        x = xp.sum(x, axis=tuple(range(lead)))
    ones = tuple(
        k for k, (n, m) in enumerate(zip(shape, x.shape)) if n == 1 and m != 1
    )
    if ones:
        x = xp.sum(x, axis=ones, keepdims=True)
    return x


def _default_scale(d_k: int, scale: float | None) -> float:
    return 1.0 / float(np.sqrt(d_k)) if scale is None else float(scale)


# -- softmax -------------------------------------------------------------------


def softmax_jacobian(A: Any, T: Any = 1.0) -> Any:
    """dA^{ij}/dS^{ik} = (1/T) A^{ij} (delta_{jk} - A^{ik}), shape (..., n_q, n_k, n_k).

    The full Jacobian dA^{ij}/dS^{i'k} carries a factor delta_{ii'}: rows
    (queries) are independent, so only the block for each row is returned,
    ``J[..., i, j, k]``.  Masked keys (A^{ij} = 0) and fully masked rows give
    exact zeros.
    """
    xp = namespace(A)
    (A,) = xp.floating(xp.asarray(A))
    require_ndim(A, "A", "ij")
    check_weights(xp, A=A)
    check_temperature(T, xp)
    raise NotImplementedError('Exercise 5.2: implement softmax_jacobian (The softmax Jacobian); run `attn-course check 5.2`')


def softmax_backward(A: Any, dL_dA: Any, T: Any = 1.0) -> Any:
    """dL/dS^{ij} = (1/T) A^{ij} (dL/dA^{ij} - sum_k A^{ik} dL/dA^{ik}).

    The vector-Jacobian product of the softmax over the key index j, without
    forming the Jacobian.  Rows of the result sum to zero (the weights are
    constrained to sum to one); masked keys and fully masked rows get exact
    zeros because A^{ij} = 0 there.
    """
    xp = namespace(A, dL_dA)
    A, dL_dA = xp.floating(xp.asarray(A), xp.asarray(dL_dA))
    require_ndim(A, "A", "ij")
    require_ndim(dL_dA, "dL_dA", "ij")
    require_match("i", ("A", "n_q", A.shape[-2]), ("dL_dA", "n_q", dL_dA.shape[-2]))
    require_match("j", ("A", "n_k", A.shape[-1]), ("dL_dA", "n_k", dL_dA.shape[-1]))
    check_weights(xp, A=A)
    check_temperature(T, xp)
    raise NotImplementedError('Exercise 5.1: implement softmax_backward (The softmax backward pass); run `attn-course check 5.1`')


# -- the backward pass ---------------------------------------------------------


def _score_gradient(A: Any, dL_dA: Any, D: Any, T: Any) -> Any:
    """dL/dS^{ij} = (1/T) A^{ij} (dL/dA^{ij} - D^i), D^i = sum_k A^{ik} dL/dA^{ik}.

    The score step of the backward pass (exercise 5.3), given the row sums D^i.
    """
    raise NotImplementedError('Exercise 5.3: implement attention_backward (The attention backward pass); run `attn-course check 5.3`')


def attention_backward(
    Q: Any,
    K: Any,
    V: Any,
    dL_dO: Any,
    mask: Any = None,
    T: Any = 1.0,
    g: Any = None,
    *,
    scale: float | None = None,
    parts: AttentionParts | None = None,
) -> AttentionGrads:
    """dL/dV^{jb} = A^{ij} dL/dO^{ib},  dL/dS^{ij} = (1/T) A^{ij}(dL/dA^{ij} - A^{ik} dL/dA^{ik}),
    dL/dQ^{ia} = dL/dS^{ij} g_{ab} K^{jb},  dL/dK^{jb} = dL/dS^{ij} Q^{ia} g_{ab}.

    The manual backward pass of :func:`~attn_tensors.attention.
    scaled_dot_product_attention` for an upstream gradient ``dL_dO`` of the
    output's shape ``(..., n_q, d_v)``.  Pass ``parts`` (from
    :func:`~attn_tensors.attention.attention_decomposition` with the same
    arguments) to reuse the forward pass instead of recomputing it.

    Without ``g`` the scores are S = Q K^T * scale (scale = 1/sqrt(d_k) by
    default), i.e. the metric g_{ab} = scale * delta_{ab}; the returned
    ``dL_dg`` is the gradient with respect to that metric (shape
    ``(d_k, d_k)``), which says how the loss would change if the metric were
    learned.  With ``g`` it has the shape of ``g``.  Gradients of inputs that
    broadcast along batch axes are summed over those axes.
    """
    xp = namespace(Q, K, V, dL_dO, mask, g)
    Q, K, V, dL_dO = xp.floating(
        xp.asarray(Q), xp.asarray(K), xp.asarray(V), xp.asarray(dL_dO)
    )
    if g is not None:
        if scale is not None:
            raise AttentionInputError("pass either a metric g or a scale, not both")
        g = xp.asarray(g, dtype=Q.dtype)
    if parts is None:
        parts = attention_decomposition(Q, K, V, mask, T, g, scale=scale)
    else:
        check_temperature(T, xp)
    A = parts.A
    require_ndim(dL_dO, "dL_dO", "ib")
    require_match("i", ("O", "n_q", parts.O.shape[-2]), ("dL_dO", "n_q", dL_dO.shape[-2]))
    require_match("b", ("O", "d_v", parts.O.shape[-1]), ("dL_dO", "d_v", dL_dO.shape[-1]))
    if tuple(dL_dO.shape) != tuple(parts.O.shape):
        raise AttentionInputError(
            f"dL_dO has shape {tuple(dL_dO.shape)} but O has shape "
            f"{tuple(parts.O.shape)} (batch axes must match)"
        )
    dL_dO = dL_dO.astype(A.dtype)

    raise NotImplementedError('Exercise 5.3: implement attention_backward (The attention backward pass); run `attn-course check 5.3`')

    # The metric gradient (exercise 5.4) reuses P^{ja} = dL/dS^{ij} Q^{ia}.
    # Exercise 5.4: implement attention_backward (The metric gradient); run `attn-course check 5.4`
    dL_dg = None  # not implemented yet: Exercise 5.4

    return AttentionGrads(
        dL_dQ=dL_dQ, dL_dK=dL_dK, dL_dV=dL_dV, dL_dA=dL_dA, dL_dS=dL_dS, dL_dg=dL_dg
    )


def attention_forward_backward(
    Q: Any,
    K: Any,
    V: Any,
    dL_dO: Any,
    mask: Any = None,
    T: Any = 1.0,
    g: Any = None,
    *,
    scale: float | None = None,
) -> tuple[Any, AttentionGrads]:
    """O^{ib} = A^{ij} V^{jb} and the gradients of L given dL/dO^{ib}, sharing A^{ij}.

    One forward pass (:func:`~attn_tensors.attention.attention_decomposition`)
    whose weights are reused by :func:`attention_backward`: the pair a
    training step needs.  Returns ``(O, grads)``.
    """
    parts = attention_decomposition(Q, K, V, mask, T, g, scale=scale)
    grads = attention_backward(Q, K, V, dL_dO, mask, T, g, scale=scale, parts=parts)
    return parts.O, grads


# -- references: autodiff and finite differences --------------------------------


def autodiff_gradients(
    Q: Any,
    K: Any,
    V: Any,
    dL_dO: Any,
    mask: Any = None,
    T: Any = 1.0,
    g: Any = None,
    *,
    scale: float | None = None,
) -> AttentionGrads:
    """dL/dx = (dO^{ib}/dx)^T dL/dO^{ib} for x in Q, K, V, A, S, g, by the framework's vjp.

    The reference for :func:`attention_backward`: no formula of Part V is
    used, only ``xp.vjp`` (``jax.vjp`` or ``mx.vjp``) of the forward pass.
    ``dL_dA`` is the vjp of O = A V in A, ``dL_dS`` the vjp of
    O = softmax(S/T) V in S.  Without ``g``, ``dL_dg`` is the vjp in the
    metric of the forward pass run with g_{ab} = scale * delta_{ab}.
    """
    xp = namespace(Q, K, V, dL_dO, mask, g)
    Q, K, V, dL_dO = xp.floating(
        xp.asarray(Q), xp.asarray(K), xp.asarray(V), xp.asarray(dL_dO)
    )
    if g is not None:
        if scale is not None:
            raise AttentionInputError("pass either a metric g or a scale, not both")
        g = xp.asarray(g, dtype=Q.dtype)

    def forward(Q, K, V):
        return [scaled_dot_product_attention(Q, K, V, mask, T, g, scale=scale)]

    def forward_g(Q, K, V, g):
        return [scaled_dot_product_attention(Q, K, V, mask, T, g)]

    parts = attention_decomposition(Q, K, V, mask, T, g, scale=scale)
    cot = [dL_dO.astype(parts.O.dtype)]
    if g is None:
        _, (dQ, dK, dV) = xp.vjp(forward, [Q, K, V], cot)
        g_eff = xp.eye(Q.shape[-1], dtype=Q.dtype) * _default_scale(Q.shape[-1], scale)
        _, (_, _, _, dg) = xp.vjp(forward_g, [Q, K, V, g_eff], cot)
    else:
        _, (dQ, dK, dV, dg) = xp.vjp(forward_g, [Q, K, V, g], cot)
    # O^{ib} = A^{ij} V^{jb} as a function of A alone
    _, (dA,) = xp.vjp(lambda A: [attention_output(A, V)], [parts.A], cot)
    # O^{ib} = softmax_j(S^{ij}/T) V^{jb} as a function of S alone
    _, (dS,) = xp.vjp(
        lambda S: [attention_output(softmax(S, mask, T), V)], [parts.S], cot
    )
    return AttentionGrads(dQ, dK, dV, dA, dS, dg)


def finite_difference_gradients(
    f: Callable[[np.ndarray], Any], x: Any, eps: float = 1e-6
) -> np.ndarray:
    """dL/dx^a ~ (L(x + eps e_a) - L(x - eps e_a)) / (2 eps), one entry at a time.

    ``f`` maps a NumPy float64 array shaped like ``x`` to a scalar; the
    result is a NumPy float64 array shaped like ``x``.  Central differences
    have error O(eps^2) plus rounding O(machine eps / eps): use float64 and
    small arrays (2 * x.size calls of ``f``).  This is a test helper, not a
    traced function, so it returns NumPy.
    """
    raise NotImplementedError('Exercise 5.5: implement finite_difference_gradients (Central finite differences); run `attn-course check 5.5`')


# -- checks that report Python bools and floats -------------------------------

_KEYS = ("dL_dQ", "dL_dK", "dL_dV")


def _np64(x: Any) -> np.ndarray | None:
    return None if x is None else np.asarray(to_numpy(x), dtype=np.float64)


def _finite_difference_pair(Q, K, V, dL_dO, mask, T, g, scale, eps):
    """Manual gradients and central differences, both in float64 on JAX.

    The arrays (JAX or MLX) are copied to NumPy float64; the loss
    L(x) = dL/dO^{ib} O^{ib}(x), linear in O with the upstream gradient held
    fixed, has dL/dx equal to the vector-Jacobian product being checked.
    """
    Q, K, V, dL_dO, g = (_np64(x) for x in (Q, K, V, dL_dO, g))
    mask = None if mask is None else np.asarray(to_numpy(mask), dtype=bool)
    T = T if isinstance(T, (int, float)) else float(np.asarray(to_numpy(T)))
    with jax.enable_x64(True):
        J = {n: jnp.asarray(x) for n, x in dict(Q=Q, K=K, V=V, g=g).items() if x is not None}
        J_mask = None if mask is None else jnp.asarray(mask)
        dO = jnp.asarray(dL_dO)
        manual = attention_backward(
            J["Q"], J["K"], J["V"], dO, J_mask, T, J.get("g"), scale=scale
        )

        @jax.jit
        def loss(Q, K, V, g):
            O = scaled_dot_product_attention(Q, K, V, J_mask, T, g, scale=scale)
            # L = dL/dO^{ib} O^{ib}
            return jnp.sum(dO * O)

        args = dict(Q=Q, K=K, V=V, g=g)
        names = list(_KEYS) + (["dL_dg"] if g is not None else [])
        ref = {}
        for name in names:
            key = name[-1]

            def f(x, key=key):
                kw = dict(args)
                kw[key] = x
                return loss(kw["Q"], kw["K"], kw["V"], kw["g"])

            ref[name] = finite_difference_gradients(f, args[key], eps)
        got = {name: _np64(getattr(manual, name)) for name in names}
    return got, ref


def _autodiff_pair(Q, K, V, dL_dO, mask, T, g, scale):
    manual = attention_backward(Q, K, V, dL_dO, mask, T, g, scale=scale)
    auto = autodiff_gradients(Q, K, V, dL_dO, mask, T, g, scale=scale)
    names = list(_KEYS) + (["dL_dg"] if g is not None else [])
    got = {n: _np64(getattr(manual, n)) for n in names}
    ref = {n: _np64(getattr(auto, n)) for n in names}
    return got, ref


def _default_upstream(Q, K, V, dL_dO, mask, T, g, scale):
    if dL_dO is not None:
        return dL_dO
    # L = 1/2 ||O||^2  =>  dL/dO^{ib} = O^{ib}
    return scaled_dot_product_attention(Q, K, V, mask, T, g, scale=scale)


_METHODS = ("autodiff", "finite_difference", "both")


def verify_gradients(
    Q: Any,
    K: Any,
    V: Any,
    dL_dO: Any = None,
    mask: Any = None,
    T: Any = 1.0,
    g: Any = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    method: str = "autodiff",
    *,
    scale: float | None = None,
    eps: float = 1e-6,
) -> dict[str, bool]:
    """dL/dx(manual) = dL/dx(reference) for x in Q, K, V (and g): a dict of Python bools.

    The default loss is L = 1/2 ||O||^2 (dL/dO^{ib} = O^{ib}).  Keys, in
    order: ``dL_dQ``, ``dL_dK``, ``dL_dV``, then ``dL_dg`` only when a
    metric ``g`` is passed, then ``all_correct``.  An entry is True when
    ``np.allclose(manual, reference, rtol, atol)``.  The default tolerances
    suit float64 and small float32 inputs; float32 gradients of size ~100
    need a larger ``atol``.

    ``method="autodiff"`` compares :func:`attention_backward` with
    :func:`autodiff_gradients` on the arrays' own framework and dtype (JAX or
    MLX).  ``method="finite_difference"`` compares with central differences;
    both sides are then computed in float64 on JAX (float32 differences would
    swamp any error in a formula), so keep the arrays small.
    ``method="both"`` needs both comparisons to pass.
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}; got {method!r}")
    dL_dO = _default_upstream(Q, K, V, dL_dO, mask, T, g, scale)
    pairs = []
    if method in ("autodiff", "both"):
        pairs.append(_autodiff_pair(Q, K, V, dL_dO, mask, T, g, scale))
    if method in ("finite_difference", "both"):
        pairs.append(_finite_difference_pair(Q, K, V, dL_dO, mask, T, g, scale, eps))
    results: dict[str, bool] = {}
    for name in pairs[0][0]:
        results[name] = bool(
            all(
                got[name].shape == ref[name].shape
                and np.allclose(got[name], ref[name], rtol=rtol, atol=atol)
                for got, ref in pairs
            )
        )
    results["all_correct"] = bool(all(results.values()))
    return results


def gradient_errors(
    Q: Any,
    K: Any,
    V: Any,
    dL_dO: Any = None,
    mask: Any = None,
    T: Any = 1.0,
    g: Any = None,
    method: str = "autodiff",
    *,
    scale: float | None = None,
    eps: float = 1e-6,
) -> dict[str, dict[str, float]]:
    """max_a |dL/dx^a(manual) - dL/dx^a(reference)|, absolute and relative, as Python floats.

    Returns ``{"dL_dQ": {"max_abs": ..., "max_rel": ...}, ...}`` with the
    same keys as :func:`verify_gradients` (without ``all_correct``).
    ``max_rel`` is ``max_abs / max_a |reference^a|`` (0 when both vanish),
    so entries near zero do not blow it up.  ``method`` is ``"autodiff"``
    or ``"finite_difference"`` (float64, see :func:`verify_gradients`).
    """
    if method not in _METHODS[:2]:
        raise ValueError(f"method must be one of {_METHODS[:2]}; got {method!r}")
    dL_dO = _default_upstream(Q, K, V, dL_dO, mask, T, g, scale)
    if method == "autodiff":
        got, ref = _autodiff_pair(Q, K, V, dL_dO, mask, T, g, scale)
    else:
        got, ref = _finite_difference_pair(Q, K, V, dL_dO, mask, T, g, scale, eps)
    out: dict[str, dict[str, float]] = {}
    for name in got:
        max_abs = float(np.max(np.abs(got[name] - ref[name]), initial=0.0))
        size = float(np.max(np.abs(ref[name]), initial=0.0))
        max_rel = max_abs / size if size > 0 else (0.0 if max_abs == 0 else float("inf"))
        out[name] = {"max_abs": max_abs, "max_rel": max_rel}
    return out
