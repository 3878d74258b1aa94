"""Mistakes of chapter 6, Multi-Head Attention: exercises 6.1-6.4."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attn_tensors import multihead
from attn_tensors.multihead import MultiHeadGrads

from . import mistake
from ._softmax import softmax

MISTAKES: list = []

# -- 6.1 project_heads ----------------------------------------------------------------------------


@mistake("6.1", "head-axis-first", "prop-multihead-leading-axis",
         "You put the head axis in front of X's batch axes: the heads are one more leading axis "
         "just before the positions, P of shape (..., H, n, d_k).")
def _project_head_first(X, W):
    return jnp.einsum("...id,hda->h...ia", X, W)


@mistake("6.1", "head-axis-after-positions", "def-multihead",
         "Your head axis comes after the positions: P^{hia} = X^{id} W^{hda} has shape "
         "(..., H, n, d_k), head before position.")
def _project_head_last(X, W):
    return jnp.einsum("...id,hda->...iha", X, W)


# -- 6.2 multihead_attention (and the forward of 6.4) ------------------------------------------------


def forward(X_q, W_Q, W_K, W_V, W_O, X_kv=None, mask=None, T=1.0, n_kv_heads=None, *,
            head_order="block", scaled=True, temperature=True, use_mask=True, score_hook=None,
            softmax_fn=None):
    """Multi-head attention written out, with one switch per mistake (defaults: right)."""
    X_k = X_q if X_kv is None else X_kv
    H, H_kv = W_Q.shape[0], W_K.shape[0]
    Q = jnp.einsum("...id,hda->...hia", X_q, W_Q)
    K = jnp.einsum("...jd,hda->...hja", X_k, W_K)
    V = jnp.einsum("...jd,hdc->...hjc", X_k, W_V)
    # query head h reads key/value head h // G (or, wrongly, h % H_kv)
    kv = np.arange(H) // (H // H_kv) if head_order == "block" else np.arange(H) % H_kv
    K, V = jnp.take(K, kv, axis=-3), jnp.take(V, kv, axis=-3)
    c = 1.0 / np.sqrt(Q.shape[-1]) if scaled else 1.0
    S = jnp.einsum("...hia,...hja->...hij", Q, K) * c
    if score_hook is not None:
        S = score_hook(S, T)
    T_used = T if temperature else 1.0
    if softmax_fn is None:
        A, _ = softmax(S, mask if use_mask else None, T_used)
    else:
        A = softmax_fn(S, mask, T_used)
    O = jnp.einsum("...hij,...hjc->...hic", A, V)
    return jnp.einsum("...hic,hcd->...id", O, W_O)


def _forward_mistake(key, label, message, **switch):
    @mistake("6.2", key, label, message)
    def wrong(X_q, W_Q, W_K, W_V, W_O, X_kv=None, mask=None, T=1.0, *, n_kv_heads=None):
        return forward(X_q, W_Q, W_K, W_V, W_O, X_kv, mask, T, n_kv_heads, **switch)

    wrong.__name__ = f"multihead_{key.replace('-', '_')}"
    return wrong


_forward_mistake("kv-head-order", "def-multihead-gqa",
                 "Your query heads read the wrong key/value heads: with grouped-query attention "
                 "query head h uses key/value head h // G (G = H / H_kv consecutive query heads "
                 "share one), not h mod H_kv.", head_order="interleaved")
_forward_mistake("missing-scale", "def-multihead",
                 "Your scores are √d_k times too large in every head: the factor 1/√d_k is "
                 "missing, S^{hij} = Q^{hia} K^{hja} / √d_k.", scaled=False)
_forward_mistake("temperature-ignored", "def-multihead",
                 "You left out the temperature: each head's weights are softmax_j(S^{hij} / T).",
                 temperature=False)
_forward_mistake("mask-ignored", "def-multihead",
                 "You ignored the mask: masked keys must get zero weight in every head, and a "
                 "fully masked query gives Y = 0.", use_mask=False)


# -- 6.3 head_diversity -------------------------------------------------------------------------------


@mistake("6.3", "diagonal-included", "def-multihead-diversity",
         "You averaged the similarity over all H² pairs, h = h' included: D averages C^{hh'} over "
         "the H(H − 1) pairs of different heads (each head is similar to itself).")
def _diversity_with_diagonal(A):
    H = A.shape[-3]
    C = multihead.head_similarity_matrix(A)
    return 1.0 - jnp.sum(C, axis=(-2, -1)) / float(H * H)


@mistake("6.3", "divided-by-H-squared", "def-multihead-diversity",
         "You divided the sum over pairs h ≠ h' by H²: there are H(H − 1) such pairs.")
def _diversity_by_h2(A):
    H = A.shape[-3]
    if H == 1:
        return jnp.zeros_like(A[..., 0, 0, 0])
    C = multihead.head_similarity_matrix(A)
    off = jnp.sum(C, axis=(-2, -1)) - jnp.trace(C, axis1=-2, axis2=-1)
    return 1.0 - off / float(H * H)


@mistake("6.3", "one-head-nan", "rem-multihead-one-head",
         "One head gives nan (or inf): it has no pairs and you divided 0 by H(H − 1) = 0. "
         "Decide H = 1 from the shape first: D = 0.")
def _diversity_one_head(A):
    H = A.shape[-3]
    C = multihead.head_similarity_matrix(A)
    off = jnp.sum(C, axis=(-2, -1)) - jnp.trace(C, axis1=-2, axis2=-1)
    return 1.0 - off / jnp.asarray(H * (H - 1), dtype=A.dtype)


@mistake("6.3", "not-normalised", "def-multihead-diversity",
         "You compared the heads with the plain inner product A^{hij} A^{gij}: the similarity is "
         "the cosine, divided by both heads' norms, so that C^{hh} = 1.")
def _diversity_gram(A):
    H = A.shape[-3]
    if H == 1:
        return jnp.zeros_like(A[..., 0, 0, 0])
    G = jnp.einsum("...hij,...gij->...hg", A, A)
    off = jnp.sum(G, axis=(-2, -1)) - jnp.trace(G, axis1=-2, axis2=-1)
    return 1.0 - off / float(H * (H - 1))


# -- 6.4 multihead_backward ------------------------------------------------------------------------------


@jax.custom_vjp
def _softmax_no_rowsum(s):
    return jax.nn.softmax(s, axis=-1)


def _fwd(s):
    A = jax.nn.softmax(s, axis=-1)
    return A, A


def _bwd(A, ct):
    return (A * ct,)  # the row-sum term - A sum_k A ct is missing


_softmax_no_rowsum.defvjp(_fwd, _bwd)


def _masked_softmax_no_rowsum(S, mask, T):
    s = S / T
    if mask is not None:
        s = jnp.where(mask, s, -1e300)  # finite, so the custom rule sees no inf
    A = _softmax_no_rowsum(s)
    if mask is not None:
        A = jnp.where(jnp.any(mask, axis=-1, keepdims=True), A, 0.0)
        A = jnp.where(mask, A, 0.0)
    return A


def _backward(X, W_Q, W_K, W_V, W_O, dL_dY, mask=None, T=1.0, *, X_kv=None, n_kv_heads=None,
              split_self=False, query_only=False, **switch):
    W = (W_Q, W_K, W_V, W_O)
    split_self = split_self and X_kv is None  # the mistakes are about self-attention
    cross = X_kv is not None or split_self

    def f(W, X, X_kv_):
        return forward(X, *W, X_kv_ if cross else None, mask, T, n_kv_heads, **switch)

    Y, vjp = jax.vjp(f, W, X, X if X_kv is None else X_kv)
    dW, dX, dX_kv = vjp(jnp.broadcast_to(dL_dY, Y.shape).astype(Y.dtype))
    if X_kv is None and not split_self:
        # self-attention: X reached f through one argument
        dX_kv = None
    if query_only and split_self:
        dX_kv = None
    return MultiHeadGrads(*dW, dX, dX_kv)


def _backward_mistake(key, label, message, **switch):
    @mistake("6.4", key, label, message)
    def wrong(X, W_Q, W_K, W_V, W_O, dL_dY, mask=None, T=1.0, *, X_kv=None, n_kv_heads=None):
        return _backward(X, W_Q, W_K, W_V, W_O, dL_dY, mask, T, X_kv=X_kv, n_kv_heads=n_kv_heads,
                         **switch)

    wrong.__name__ = f"multihead_backward_{key.replace('-', '_')}"
    return wrong


_backward_mistake("query-path-only", "thm-multihead-grads",
                  "In self-attention your dL/dX has only the query path: X also makes the keys "
                  "and values, so dL/dX adds dL/dK^{hja} W_K^{hda} and dL/dV^{hjc} W_V^{hdc}.",
                  split_self=True, query_only=True)
_backward_mistake("self-attention-split", "thm-multihead-grads",
                  "In self-attention you returned the key and value paths as dL_dX_kv: there is "
                  "no separate X_kv, so dL_dX collects all three paths and dL_dX_kv is None.",
                  split_self=True)
_backward_mistake("row-sum-missing", "thm-gradients-score",
                  "Your per-head softmax backward leaves out the row-sum term: dL/dS = (1/T) A "
                  "(dL/dA − Σ_k A dL/dA); every gradient but dL/dW_O inherits the error.",
                  softmax_fn=_masked_softmax_no_rowsum)
_backward_mistake("temperature-missing", "thm-gradients-score",
                  "Your backward pass leaves out the factor 1/T of the softmax of S/T: every "
                  "gradient that flows through the scores is T times too large.",
                  score_hook=lambda S, T: _times_in_backward(S, T))


def _times_in_backward(S, c):
    """S in the forward pass; c times the gradient in the backward pass."""
    frozen = jax.lax.stop_gradient(S)
    return frozen + c * (S - frozen)
