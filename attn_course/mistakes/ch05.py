"""Mistakes of chapter 5, Gradient Derivations: exercises 5.1-5.5 (and 10.5)."""

from __future__ import annotations

from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np

from attn_tensors import attention, gradients

from . import mistake

MISTAKES: list = []

# -- 5.1 softmax_backward (and 10.5) -----------------------------------------------------------


def _softmax_backward(A, dL_dA, T=1.0, *, rowsum=True, axis=-1, temperature=True, sign=1.0):
    if rowsum:
        c = jnp.sum(A * dL_dA, axis=axis, keepdims=True)  # the right axis is -1 (keys k)
        g = A * (dL_dA - c)
    else:
        g = A * dL_dA
    return sign * (g / T if temperature else g)


SOFTMAX_BACKWARD = [
    ("row-sum-missing", "thm-gradients-score",
     "You left out the row-sum term: dL/dS^{ij} = (1/T) A^{ij} (dL/dA^{ij} − Σ_k A^{ik} dL/dA^{ik}). "
     "Without it the rows of dL/dS do not sum to zero.", {"rowsum": False}),
    ("row-sum-wrong-axis", "thm-gradients-score",
     "You summed A dL/dA over the wrong axis (the queries i): the term subtracted is "
     "c^i = Σ_k A^{ik} dL/dA^{ik}, one number per query row.", {"axis": -2}),
    ("temperature-missing", "thm-gradients-score",
     "You left out the factor 1/T: the softmax of S/T brings 1/T into its derivative, "
     "dL/dS = (1/T) A (dL/dA − c).", {"temperature": False}),
    ("sign-flipped", "thm-gradients-score",
     "Your gradient has the wrong sign: dL/dS^{ij} = (1/T) A^{ij} (dL/dA^{ij} − c^i), "
     "dL/dA minus its weighted mean.", {"sign": -1.0}),
]


def softmax_backward_mistake(ex, key, label, message, switch):
    @mistake(ex, key, label, message)
    def wrong(A, dL_dA, T=1.0):
        return _softmax_backward(A, dL_dA, T, **switch)

    wrong.__name__ = f"softmax_backward_{key.replace('-', '_')}"
    return wrong


for _key, _label, _message, _switch in SOFTMAX_BACKWARD:
    softmax_backward_mistake("5.1", _key, _label, _message, _switch)


# -- 5.2 softmax_jacobian ------------------------------------------------------------------------


@mistake("5.2", "temperature-missing", "lem-gradients-softmax-jacobian",
         "You left out the factor 1/T: J^{ijk} = (1/T) A^{ij} (δ_{jk} − A^{ik}).")
def _jacobian_no_T(A, T=1.0):
    return gradients.softmax_jacobian(A, 1.0)


@mistake("5.2", "outer-product-missing", "lem-gradients-softmax-jacobian",
         "You kept only the diagonal A^{ij} δ_{jk}: the Jacobian also has −A^{ij} A^{ik}, "
         "because raising one score lowers every other weight of the row.")
def _jacobian_diag(A, T=1.0):
    eye = jnp.eye(A.shape[-1], dtype=A.dtype)
    return jnp.einsum("...ij,jk->...ijk", A, eye) / T


@mistake("5.2", "sign-flipped", "lem-gradients-softmax-jacobian",
         "Your Jacobian has the wrong sign: J^{ijk} = (1/T) A^{ij} (δ_{jk} − A^{ik}) has a "
         "positive diagonal.")
def _jacobian_sign(A, T=1.0):
    return -gradients.softmax_jacobian(A, T)


# -- 5.3 and 5.4 attention_backward ---------------------------------------------------------------


def _sum_to(x, shape):
    lead = x.ndim - len(shape)
    if lead > 0:
        x = jnp.sum(x, axis=tuple(range(lead)))
    ones = tuple(k for k, (n, m) in enumerate(zip(shape, x.shape)) if n == 1 and m != 1)
    return jnp.sum(x, axis=ones, keepdims=True) if ones else x


def _backward(Q, K, V, dL_dO, mask=None, T=1.0, g=None, *, scale=None, rowsum=True,
              temperature=True, scaled=True, g_transposed=False, sum_broadcast=True,
              dg_transposed=False, dg_scaled=False, dg_summed=True):
    parts = attention.attention_decomposition(Q, K, V, mask, T, g, scale=scale)
    A = parts.A
    dL_dV = jnp.einsum("...ij,...ib->...jb", A, dL_dO)
    dL_dA = jnp.einsum("...ib,...jb->...ij", dL_dO, V)
    dL_dS = A * (dL_dA - jnp.sum(A * dL_dA, axis=-1, keepdims=True)) if rowsum else A * dL_dA
    if temperature:
        dL_dS = dL_dS / T
    P = jnp.einsum("...ij,...ia->...ja", dL_dS, Q)
    if g is None:
        c = (1.0 / np.sqrt(Q.shape[-1]) if scale is None else scale) if scaled else 1.0
        dL_dQ = jnp.einsum("...ij,...ja->...ia", dL_dS, K) * c
        dL_dK = P * c
        g_shape = (Q.shape[-1], K.shape[-1])
    else:
        gq = jnp.swapaxes(g, -1, -2) if g_transposed else g
        dL_dQ = jnp.einsum("...ij,...ab,...jb->...ia", dL_dS, gq, K)
        dL_dK = jnp.einsum("...ja,...ab->...jb", P, g)
        g_shape = tuple(g.shape)
    dL_dg = jnp.einsum("...ja,...jb->...ab", P, K)
    if dg_transposed:
        dL_dg = jnp.swapaxes(dL_dg, -1, -2)
    if dg_scaled and g is None:
        dL_dg = dL_dg * (1.0 / np.sqrt(Q.shape[-1]) if scale is None else scale)
    if sum_broadcast:
        dL_dQ, dL_dK, dL_dV = _sum_to(dL_dQ, Q.shape), _sum_to(dL_dK, K.shape), _sum_to(dL_dV, V.shape)
    if dg_summed:
        dL_dg = _sum_to(dL_dg, g_shape)
    return SimpleNamespace(dL_dQ=dL_dQ, dL_dK=dL_dK, dL_dV=dL_dV, dL_dA=dL_dA, dL_dS=dL_dS,
                           dL_dg=dL_dg)


def _backward_mistake(ex, key, label, message, **switch):
    @mistake(ex, key, label, message)
    def wrong(Q, K, V, dL_dO, mask=None, T=1.0, g=None, *, scale=None, parts=None):
        return _backward(Q, K, V, dL_dO, mask, T, g, scale=scale, **switch)

    wrong.__name__ = f"backward_{key.replace('-', '_')}"
    return wrong


_backward_mistake("5.3", "row-sum-missing", "thm-gradients-score",
                  "Your dL/dS leaves out the row-sum term of the softmax backward: "
                  "dL/dS^{ij} = (1/T) A^{ij} (dL/dA^{ij} − Σ_k A^{ik} dL/dA^{ik}); dL/dQ and "
                  "dL/dK inherit the error.", rowsum=False)
_backward_mistake("5.3", "temperature-missing", "thm-gradients-score",
                  "Your dL/dS leaves out the factor 1/T of the softmax of S/T; dL/dQ and dL/dK "
                  "inherit it.", temperature=False)
_backward_mistake("5.3", "scale-missing", "cor-gradients-default",
                  "Your dL/dQ and dL/dK leave out the scale: with S = Q K^T / √d_k (or a given "
                  "scale), both carry the same factor as the scores.", scaled=False)
_backward_mistake("5.3", "metric-transposed", "thm-gradients-qk",
                  "Your dL/dQ uses g with its indices swapped: dL/dQ^{ia} = dL/dS^{ij} g_{ab} K^{jb} "
                  "(a is the query's index), which differs when g is not symmetric.",
                  g_transposed=True)
_backward_mistake("5.3", "broadcast-not-summed", "prop-gradients-broadcast",
                  "You did not sum the gradients of broadcast inputs: K and V shared by a batch "
                  "of queries get one gradient summed over that batch, with their own shape.",
                  sum_broadcast=False)

_backward_mistake("5.4", "transposed", "sec-gradients-metric",
                  "Your dL/dg is transposed: in S^{ij} = Q^{ia} g_{ab} K^{jb}, a is the query's "
                  "index and b the key's, so dL/dg_{ab} = dL/dS^{ij} Q^{ia} K^{jb}.",
                  dg_transposed=True)
_backward_mistake("5.4", "not-summed-over-heads", "prop-gradients-broadcast",
                  "You did not sum dL/dg over the heads that share it: a metric broadcast along "
                  "batch or head axes gets the sum of their gradients, with g's own shape.",
                  dg_summed=False)
_backward_mistake("5.4", "scaled", "sec-gradients-metric",
                  "You multiplied dL/dg by the scale: without g, the gradient is taken with "
                  "respect to the whole implicit metric scale·δ_{ab}, dL/dg_{ab} = dL/dS^{ij} "
                  "Q^{ia} K^{jb}, with no further factor.", dg_scaled=True)


# -- 5.5 finite_difference_gradients --------------------------------------------------------------


def _fd(f, x, eps, *, central=True, half=True, float64=True, copies=True):
    x = np.array(np.asarray(x), dtype=np.float64) if float64 else np.array(np.asarray(x))
    grad = np.zeros_like(x)
    base = None if central else float(np.asarray(f(x.copy() if copies else x)))
    for idx in np.ndindex(*x.shape):
        orig = x[idx]
        x[idx] = orig + eps
        f_plus = float(np.asarray(f(x.copy() if copies else x)))
        if central:
            x[idx] = orig - eps
            f_minus = float(np.asarray(f(x.copy() if copies else x)))
            grad[idx] = (f_plus - f_minus) / ((2.0 if half else 1.0) * eps)
        else:
            grad[idx] = (f_plus - base) / eps
        x[idx] = orig
    return grad


@mistake("5.5", "forward-difference", "ex-5-5",
         "You took forward differences, (f(x + ε) − f(x)) / ε: their error is of order ε; "
         "central differences, (f(x + ε) − f(x − ε)) / (2ε), are exact to order ε² and call f "
         "twice per entry.")
def _fd_forward(f, x, eps=1e-6):
    return _fd(f, x, eps, central=False)


@mistake("5.5", "missing-half", "ex-5-5",
         "Your gradient is twice too large: the central difference divides by the whole step "
         "between the two points, 2ε.")
def _fd_no_half(f, x, eps=1e-6):
    return _fd(f, x, eps, half=False)


@mistake("5.5", "not-float64", "ex-5-5",
         "You perturbed x in its own dtype: in float32 a step of 1e-6 is a few ulps and the "
         "differences are rounding noise. Copy x to float64 first.")
def _fd_float32(f, x, eps=1e-6):
    return _fd(f, x, eps, float64=False)


@mistake("5.5", "no-copies", "ex-5-5",
         "Your gradient is right, but you passed f the array you keep changing: f must get a "
         "fresh copy at each call (it may keep or change its argument).")
def _fd_same_array(f, x, eps=1e-6):
    return _fd(f, x, eps, copies=False)
