"""Part II, The Attention Mechanism: scores, weights, output.

    S^{ij} = Q^{ia} g_{ab} K^{jb}          (g_{ab} = delta_{ab} / sqrt(d_k) by default)
    A^{ij} = exp(S^{ij}/T) / Z^i,   Z^i = sum_j exp(S^{ij}/T)
    O^{ib} = A^{ij} V^{jb}

Shapes: ``Q (..., n_q, d_k)``, ``K (..., n_k, d_k)``, ``V (..., n_k, d_v)``;
leading batch/head axes broadcast.  Masks are boolean "may attend" arrays
broadcasting against ``S (..., n_q, n_k)``; see :mod:`attn_tensors.softmax`
for the fully-masked-row convention.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ._checks import (
    AttentionInputError,
    batch_shape,
    check_finite,
    check_scores,
    check_weights,
    require_match,
    require_ndim,
)
from .backend import Backend, namespace
from .bilinear import bilinear_form_batch
from .softmax import softmax_and_log_partition

__all__ = [
    "attention_scores",
    "low_rank_metric",
    "kernel_scores",
    "attention_weights",
    "attention_output",
    "scaled_dot_product_attention",
    "AttentionParts",
    "attention_decomposition",
]


def _check_qk(xp: Backend, Q: Any, K: Any) -> None:
    require_ndim(Q, "Q", "ia")
    require_ndim(K, "K", "ja")
    require_match("a", ("Q", "d_k", Q.shape[-1]), ("K", "d_k", K.shape[-1]))
    batch_shape((Q, 2), (K, 2))


def attention_scores(Q: Any, K: Any, g: Any = None, *, scale: float | None = None) -> Any:
    """S^{ij} = Q^{ia} K^{ja} / sqrt(d_k), or S^{ij} = Q^{ia} g_{ab} K^{jb} with a metric.

    Without ``g`` the scale defaults to ``1/sqrt(d_k)`` (pass ``scale=1.0``
    for raw dot products).  With ``g`` the metric carries any scale and
    ``scale`` must be left out.
    """
    xp = namespace(Q, K, g)
    Q, K = xp.floating(xp.asarray(Q), xp.asarray(K))
    ### BEGIN SOLUTION 2.1
    _check_qk(xp, Q, K)
    check_finite(xp, Q=Q, K=K)
    if g is not None:
        if scale is not None:
            raise AttentionInputError("pass either a metric g or a scale, not both")
        return bilinear_form_batch(Q, K, xp.asarray(g, dtype=Q.dtype))
    d_k = Q.shape[-1]
    scale = 1.0 / float(np.sqrt(d_k)) if scale is None else float(scale)
    # S^{ij} = Q^{ia} K^{ja} / sqrt(d_k)
    return xp.einsum("...ia,...ja->...ij", Q, K) * scale
    ### END SOLUTION


def low_rank_metric(W_Q: Any, W_K: Any) -> Any:
    """M_{de} = W_Q^{da} W_K^{ea} / sqrt(d_k): the bilinear form behind Q K^T / sqrt(d_k).

    ``W_Q`` and ``W_K`` have shape ``(..., d, d_k)``.  ``M`` has rank at most
    ``d_k`` and is not symmetric unless ``W_Q = W_K``; x^{id} M_{de} x^{je}
    equals the scores of ``Q = x W_Q`` and ``K = x W_K`` (the close reading's view).
    """
    xp = namespace(W_Q, W_K)
    W_Q, W_K = xp.floating(xp.asarray(W_Q), xp.asarray(W_K))
    require_ndim(W_Q, "W_Q", "da")
    require_ndim(W_K, "W_K", "ea")
    require_match("a", ("W_Q", "d_k", W_Q.shape[-1]), ("W_K", "d_k", W_K.shape[-1]))
    ### BEGIN SOLUTION 2.5
    d_k = W_Q.shape[-1]
    # M_{de} = W_Q^{da} W_K^{ea} / sqrt(d_k)
    return xp.einsum("...da,...ea->...de", W_Q, W_K) / float(np.sqrt(d_k))
    ### END SOLUTION


def kernel_scores(X: Any, M: Any, Y: Any = None) -> Any:
    """S^{ij} = X^{id} M_{de} Y^{je}: self-attention scores x M x^T when Y is X."""
    Y = X if Y is None else Y
    return bilinear_form_batch(X, Y, M)


def attention_weights(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """A^{ij} = exp(S^{ij}/T) / sum_k exp(S^{ik}/T); rows sum to 1, masked keys get 0."""
    xp = namespace(S, mask)
    S = xp.asarray(S)
    require_ndim(S, "S", "ij")
    check_scores(xp, S=S)
    return softmax_and_log_partition(S, mask, T, xp)[0]


def attention_output(A: Any, V: Any) -> Any:
    """O^{ib} = A^{ij} V^{jb}: each output is a convex combination of value rows."""
    xp = namespace(A, V)
    A, V = xp.floating(xp.asarray(A), xp.asarray(V))
    require_ndim(A, "A", "ij")
    require_ndim(V, "V", "jb")
    check_weights(xp, A=A)
    ### BEGIN SOLUTION 2.3
    require_match("j", ("A", "n_k", A.shape[-1]), ("V", "n_k", V.shape[-2]))
    batch_shape((A, 2), (V, 2))
    # O^{ib} = A^{ij} V^{jb}
    return xp.einsum("...ij,...jb->...ib", A, V)
    ### END SOLUTION


class AttentionParts(NamedTuple):
    """Every intermediate of one attention call."""

    S: Any  # scores S^{ij}
    A: Any  # weights A^{ij}
    log_Z: Any  # log-partition log Z^i (-inf for a fully masked row)
    O: Any  # output O^{ib}


def attention_decomposition(
    Q: Any,
    K: Any,
    V: Any,
    mask: Any = None,
    T: Any = 1.0,
    g: Any = None,
    *,
    scale: float | None = None,
) -> AttentionParts:
    """S^{ij} = Q^{ia} g_{ab} K^{jb},  A^{ij} = exp(S^{ij}/T - log Z^i),  O^{ib} = A^{ij} V^{jb}."""
    xp = namespace(Q, K, V, mask, g)
    K, V = xp.asarray(K), xp.asarray(V)
    require_ndim(K, "K", "ja")
    require_ndim(V, "V", "jb")
    ### BEGIN SOLUTION 2.4
    require_match("j", ("K", "n_k", K.shape[-2]), ("V", "n_k", V.shape[-2]))
    check_finite(xp, V=V)
    S = attention_scores(Q, K, g, scale=scale)
    A, log_Z = softmax_and_log_partition(S, mask, T, xp)
    O = attention_output(A, V)
    return AttentionParts(S, A, log_Z, O)
    ### END SOLUTION


def scaled_dot_product_attention(
    Q: Any,
    K: Any,
    V: Any,
    mask: Any = None,
    T: Any = 1.0,
    g: Any = None,
    *,
    scale: float | None = None,
) -> Any:
    """O^{ib} = softmax_j(Q^{ia} g_{ab} K^{jb} / T) V^{jb}, with g_{ab} = delta_{ab}/sqrt(d_k) by default."""
    return attention_decomposition(Q, K, V, mask, T, g, scale=scale).O
