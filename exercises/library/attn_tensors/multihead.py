"""Part VI, Multi-Head Attention: a head index h on every tensor.

    Q^{hia} = X^{id} W_Q^{hda}        K^{hja} = X^{jd} W_K^{hda}
    V^{hjc} = X^{jd} W_V^{hdc}
    S^{hij} = Q^{hia} K^{hja} / sqrt(d_k)
    A^{hij} = exp(S^{hij}/T) / sum_k exp(S^{hik}/T)
    O^{hic} = A^{hij} V^{hjc}
    Y^{id}  = O^{hic} W_O^{hcd}        (a sum over heads h AND features c)

Shapes: ``X (..., n, d_model)``; ``W_Q (H, d_model, d_k)``,
``W_K (H_kv, d_model, d_k)``, ``W_V (H_kv, d_model, d_v)``,
``W_O (H, d_v, d_model)``.  The weights have no batch axes; ``X`` may have
any leading batch axes, and the head axis sits just before the position
axis: ``Q (..., H, n_q, d_k)``, ``S, A (..., H, n_q, n_k)``,
``Y (..., n_q, d_model)``.  Heads are just one more leading axis, so the
per-head step is :func:`attn_tensors.attention.attention_decomposition`
unchanged.

Grouped-query attention (GQA).  ``W_K`` and ``W_V`` may have ``H_kv``
heads with ``H = G H_kv``: query head ``h`` uses key/value head
``h // G`` (heads ``0..G-1`` share key/value head 0, and so on; the order of
``repeat``/``repeat_interleave`` in the reference implementations).
``H_kv = H`` is ordinary multi-head attention, ``H_kv = 1`` multi-query
attention.  The implementation is the same for all three: the query head
axis is split into ``(H_kv, G)`` and the key/value tensors get a length-1
group axis that broadcasts, so K and V are never copied.

Masks are boolean "may attend" arrays that broadcast against
``S (..., H, n_q, n_k)`` (see :mod:`attn_tensors.masking`): ``(n_q, n_k)``
for all heads and batches, ``(B, 1, 1, n_k)`` for per-sequence padding,
``(H, n_q, n_k)`` for one mask per head.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ._checks import (
    AttentionInputError,
    check_weights,
    require_bool_mask,
    require_match,
    require_ndim,
)
from .attention import AttentionParts, attention_decomposition
from .backend import Backend, namespace
from .gradients import _sum_to_shape, attention_backward
from .masking import fully_masked_rows
from .statmech import entropy

__all__ = [
    "project_heads",
    "MultiHeadParts",
    "multihead_decomposition",
    "multihead_attention",
    "MultiHeadGrads",
    "multihead_backward",
    "head_entropy",
    "head_similarity_matrix",
    "head_diversity",
]


# -- shapes and checks ----------------------------------------------------------
def project_heads(X: Any, W: Any) -> Any:
    """Q^{hia} = X^{id} W^{hda}: one projection per head, einsum '...id,hda->...hia'.

    ``X (..., n, d_model)`` and ``W (H, d_model, e)`` give ``(..., H, n, e)``;
    the same function makes queries, keys and values (``e`` = d_k or d_v).
    """
    xp = namespace(X, W)
    raise NotImplementedError('Exercise 6.1: implement project_heads (Projecting to heads); run `attn-course check 6.1`')


def _check_weights(X_q, X_kv, W_Q, W_K, W_V, W_O, n_kv_heads) -> tuple[int, int]:
    """(H, H_kv) after checking every shared index; errors name index and sizes."""
    for name, W, idx in (
        ("W_Q", W_Q, "hda"),
        ("W_K", W_K, "hda"),
        ("W_V", W_V, "hdc"),
        ("W_O", W_O, "hcd"),
    ):
        require_ndim(W, name, idx, extra_ok=False)
    require_ndim(X_q, "X_q", "id")
    require_ndim(X_kv, "X_kv", "jd")
    H, H_kv = W_Q.shape[0], W_K.shape[0]
    require_match("h", ("W_Q", "H", H), ("W_O", "H", W_O.shape[0]))
    require_match("h", ("W_K", "H_kv", H_kv), ("W_V", "H_kv", W_V.shape[0]))
    require_match("a", ("W_Q", "d_k", W_Q.shape[2]), ("W_K", "d_k", W_K.shape[2]))
    require_match("c", ("W_V", "d_v", W_V.shape[2]), ("W_O", "d_v", W_O.shape[1]))
    require_match(
        "d",
        ("X_q", "d_model", X_q.shape[-1]),
        ("W_Q", "d_model", W_Q.shape[1]),
        ("W_O", "d_model", W_O.shape[2]),
    )
    require_match(
        "d",
        ("X_kv", "d_model", X_kv.shape[-1]),
        ("W_K", "d_model", W_K.shape[1]),
        ("W_V", "d_model", W_V.shape[1]),
    )
    if n_kv_heads is not None and int(n_kv_heads) != H_kv:
        raise AttentionInputError(
            f"n_kv_heads={n_kv_heads} but W_K has H_kv={H_kv} key/value heads "
            "(index h of W_K and W_V)"
        )
    if H % H_kv != 0:
        raise AttentionInputError(
            f"W_K has H_kv={H_kv} key/value heads but W_Q has H={H} query heads; "
            f"grouped-query attention needs H_kv to divide H (H = G * H_kv, "
            f"index h)"
        )
    return H, H_kv


def _group(xp: Backend, x: Any, H_kv: int, core: int) -> Any:
    """(..., H, *core) -> (..., H_kv, G, *core): query head h = (h // G, h % G)."""
    s = tuple(x.shape)
    H = s[-core - 1]
    return xp.reshape(x, s[: -core - 1] + (H_kv, H // H_kv) + s[-core:])


def _merge(xp: Backend, x: Any, core: int) -> Any:
    """(..., H_kv, G, *core) -> (..., H, *core): the inverse of :func:`_group`."""
    s = tuple(x.shape)
    return xp.reshape(x, s[: -core - 2] + (s[-core - 2] * s[-core - 1],) + s[-core:])


def _group_mask(xp: Backend, mask: Any, H: int, H_kv: int, S_shape: tuple) -> Any:
    """The mask for S (..., H, n_q, n_k), reshaped for S as (..., H_kv, G, n_q, n_k)."""
    if mask is None:
        return None
    mask = require_bool_mask(xp, mask)
    try:
        np.broadcast_shapes(tuple(mask.shape), S_shape)
    except ValueError:
        raise AttentionInputError(
            f"mask of shape {tuple(mask.shape)} does not broadcast against the "
            f"multi-head scores S^{{hij}} of shape {S_shape} (axes ..., h, i, j "
            f"with H={H}, n_q={S_shape[-2]}, n_k={S_shape[-1]})"
        ) from None
    if mask.ndim < 3:  # no head axis: broadcasts over (H_kv, G) as it is
        return mask
    if mask.shape[-3] == 1:  # one mask for every head: a length-1 group axis too
        return xp.expand_dims(mask, -3)
    return _group(xp, mask, H_kv, core=2)


class _Forward(NamedTuple):
    """The forward pass in grouped shapes (what the backward pass reuses)."""

    X_q: Any
    X_kv: Any
    W: tuple  # (W_Q, W_K, W_V, W_O) cast to the common float dtype
    H_kv: int
    Q: Any  # Q^{hia}  (..., H, n_q, d_k)
    K: Any  # K^{hja}  (..., H_kv, n_k, d_k)
    V: Any  # V^{hjc}  (..., H_kv, n_k, d_v)
    grouped: tuple  # (Q, K, V) as (..., H_kv, G, n, e) and (..., H_kv, 1, n, e)
    mask: Any  # the mask for the grouped scores
    parts: AttentionParts  # S, A, log_Z, O in grouped shapes
    O: Any  # O^{hic}  (..., H, n_q, d_v)
    Y: Any  # Y^{id}   (..., n_q, d_model)


def _forward(X_q, W_Q, W_K, W_V, W_O, X_kv, mask, T, n_kv_heads) -> _Forward:
    xp = namespace(X_q, W_Q, W_K, W_V, W_O, X_kv, mask)
    self_attention = X_kv is None
    arrays = [xp.asarray(a) for a in (X_q, W_Q, W_K, W_V, W_O)]
    if not self_attention:
        arrays.append(xp.asarray(X_kv))
    arrays = xp.floating(*arrays)
    X_q, W_Q, W_K, W_V, W_O = arrays[:5]
    X_kv = X_q if self_attention else arrays[5]
    H, H_kv = _check_weights(X_q, X_kv, W_Q, W_K, W_V, W_O, n_kv_heads)
    batch = np.broadcast_shapes(tuple(X_q.shape[:-2]), tuple(X_kv.shape[:-2]))
    S_shape = tuple(batch) + (H, X_q.shape[-2], X_kv.shape[-2])
    raise NotImplementedError('Exercise 6.2: implement multihead_attention (Multi-head attention); run `attn-course check 6.2`')
    return _Forward(
        X_q, X_kv, (W_Q, W_K, W_V, W_O), H_kv, Q, K, V, (Qg, Kg, Vg), mask, parts, O, Y
    )


# -- forward --------------------------------------------------------------------
class MultiHeadParts(NamedTuple):
    """Every intermediate of one multi-head attention call (head axis before i)."""

    Q: Any  # Q^{hia}   (..., H, n_q, d_k)
    K: Any  # K^{hja}   (..., H_kv, n_k, d_k)   one per key/value head
    V: Any  # V^{hjc}   (..., H_kv, n_k, d_v)
    S: Any  # S^{hij}   (..., H, n_q, n_k)
    A: Any  # A^{hij}   (..., H, n_q, n_k)
    log_Z: Any  # log Z^{hi}  (..., H, n_q), -inf for a fully masked row
    O: Any  # O^{hic}   (..., H, n_q, d_v)
    Y: Any  # Y^{id}    (..., n_q, d_model)


def multihead_decomposition(
    X_q: Any,
    W_Q: Any,
    W_K: Any,
    W_V: Any,
    W_O: Any,
    X_kv: Any = None,
    mask: Any = None,
    T: Any = 1.0,
    *,
    n_kv_heads: int | None = None,
) -> MultiHeadParts:
    """Q^{hia} = X^{id} W_Q^{hda}, S^{hij} = Q^{hia} K^{hja}/sqrt(d_k), O^{hic} = A^{hij} V^{hjc}, Y^{id} = O^{hic} W_O^{hcd}.

    The arguments are those of :func:`multihead_attention`; returns a
    :class:`MultiHeadParts`.  ``K`` and ``V`` keep their ``H_kv`` heads
    (grouped-query attention shares them; see the module docstring).
    """
    f = _forward(X_q, W_Q, W_K, W_V, W_O, X_kv, mask, T, n_kv_heads)
    xp = namespace(f.Q)
    p = f.parts
    return MultiHeadParts(
        Q=f.Q,
        K=f.K,
        V=f.V,
        S=_merge(xp, p.S, core=2),
        A=_merge(xp, p.A, core=2),
        log_Z=_merge(xp, p.log_Z, core=1),
        O=f.O,
        Y=f.Y,
    )


def multihead_attention(
    X_q: Any,
    W_Q: Any,
    W_K: Any,
    W_V: Any,
    W_O: Any,
    X_kv: Any = None,
    mask: Any = None,
    T: Any = 1.0,
    *,
    n_kv_heads: int | None = None,
) -> Any:
    """Y^{id} = O^{hic} W_O^{hcd},  O^{hic} = softmax_j(Q^{hia} K^{hja} / (sqrt(d_k) T)) V^{hjc}.

    Self-attention when ``X_kv`` is None (keys and values from ``X_q``),
    cross-attention otherwise (``X_kv (..., n_k, d_model')`` may have its
    own width, matched by ``W_K`` and ``W_V``).  ``W_K``/``W_V`` with
    ``H_kv < H`` heads give grouped-query attention (``H_kv`` must divide
    ``H``), ``H_kv = 1`` multi-query attention; ``n_kv_heads``, if given, is
    checked against ``W_K``.  ``mask`` broadcasts against the scores
    ``(..., H, n_q, n_k)``; fully masked queries give ``Y = 0``.
    """
    return _forward(X_q, W_Q, W_K, W_V, W_O, X_kv, mask, T, n_kv_heads).Y


# -- backward -------------------------------------------------------------------
class MultiHeadGrads(NamedTuple):
    """Gradients of a scalar loss L given dL/dY^{id}; each has its input's shape."""

    dL_dW_Q: Any  # dL/dW_Q^{hda}  (H, d_model, d_k)
    dL_dW_K: Any  # dL/dW_K^{hda}  (H_kv, d_model, d_k)
    dL_dW_V: Any  # dL/dW_V^{hdc}  (H_kv, d_model, d_v)
    dL_dW_O: Any  # dL/dW_O^{hcd}  (H, d_v, d_model)
    dL_dX: Any  # dL/dX^{id}: all paths for self-attention, the query path otherwise
    dL_dX_kv: Any  # dL/dX_kv^{jd} for cross-attention; None for self-attention


def multihead_backward(
    X: Any,
    W_Q: Any,
    W_K: Any,
    W_V: Any,
    W_O: Any,
    dL_dY: Any,
    mask: Any = None,
    T: Any = 1.0,
    *,
    X_kv: Any = None,
    n_kv_heads: int | None = None,
) -> MultiHeadGrads:
    """dL/dW_O^{hcd} = O^{hic} dL/dY^{id}, dL/dO^{hic} = dL/dY^{id} W_O^{hcd},
    dL/dW_Q^{hda} = X^{id} dL/dQ^{hia}, dL/dX^{id} = dL/dQ^{hia} W_Q^{hda} + dL/dK^{hia} W_K^{hda} + dL/dV^{hic} W_V^{hdc}.

    The manual backward pass of :func:`multihead_attention` for an upstream
    gradient ``dL_dY`` that broadcasts to ``Y (..., n_q, d_model)``.  The
    per-head step (dL/dO -> dL/dQ, dL/dK, dL/dV) is
    :func:`attn_tensors.gradients.attention_backward` on the grouped heads;
    with grouped-query attention a key/value head's gradient sums over the
    ``G`` query heads that share it.  Weight gradients sum over the batch
    axes (the weights have none).  For self-attention (``X_kv=None``)
    ``dL_dX`` collects the query, key and value paths and ``dL_dX_kv`` is
    None; for cross-attention ``dL_dX`` is the query path and ``dL_dX_kv``
    the key and value paths.
    """
    f = _forward(X, W_Q, W_K, W_V, W_O, X_kv, mask, T, n_kv_heads)
    xp = namespace(f.Q)
    W_Q, W_K, W_V, W_O = f.W
    (dY,) = xp.floating(xp.asarray(dL_dY))
    dY = dY.astype(f.Y.dtype)
    require_ndim(dY, "dL_dY", "id")
    require_match("i", ("Y", "n_q", f.Y.shape[-2]), ("dL_dY", "n_q", dY.shape[-2]))
    require_match(
        "d", ("Y", "d_model", f.Y.shape[-1]), ("dL_dY", "d_model", dY.shape[-1])
    )
    try:
        shape = np.broadcast_shapes(tuple(dY.shape), tuple(f.Y.shape))
    except ValueError:
        shape = None
    if shape != tuple(f.Y.shape):
        raise AttentionInputError(
            f"dL_dY has shape {tuple(dY.shape)} but Y has shape {tuple(f.Y.shape)} "
            "(dL_dY must broadcast to Y's shape)"
        )
    dY = xp.broadcast_to(dY, tuple(f.Y.shape))

    raise NotImplementedError('Exercise 6.4: implement multihead_backward (The backward pass of multi-head attention); run `attn-course check 6.4`')


# -- what the heads do ------------------------------------------------------------
def head_entropy(A: Any, mask: Any = None) -> Any:
    """H^h = (1/n_q) sum_i -sum_j A^{hij} log A^{hij}: each head's mean attention entropy.

    ``A (..., H, n_q, n_k)`` gives ``(..., H)``.  The row entropy is
    :func:`attn_tensors.statmech.entropy` (0 log 0 = 0 exactly, finite
    gradients at zero weights).  With a mask, only allowed keys count, and
    the mean runs over the queries that may attend to something: fully
    masked rows (padding queries) are left out of the average instead of
    pulling it towards 0.  A head whose every row is masked has entropy 0.
    """
    xp = namespace(A, mask)
    (A,) = xp.floating(xp.asarray(A))
    require_ndim(A, "A", "hij")
    check_weights(xp, A=A)
    # H^{hi} = -sum_j A^{hij} log A^{hij}
    H_rows = entropy(A, mask)
    if mask is None:
        # H^h = (1/n_q) sum_i H^{hi}  (0 for a head with no queries)
        return xp.sum(H_rows, axis=-1) / max(H_rows.shape[-1], 1)
    live = xp.logical_not(fully_masked_rows(mask))
    live = xp.broadcast_to(live, tuple(H_rows.shape)).astype(A.dtype)
    n_live = xp.sum(live, axis=-1)
    total = xp.sum(H_rows * live, axis=-1)
    # H^h = sum_i live^i H^{hi} / sum_i live^i   (0 when no query is live)
    safe = xp.where(n_live > 0, n_live, xp.ones_like(n_live))
    return xp.where(n_live > 0, total / safe, xp.zeros_like(total))


def head_similarity_matrix(A: Any) -> Any:
    """C^{hg} = A^{hij} A^{gij} / (|A^h| |A^g|): cosine similarity of heads h and g = h'.

    Each head's pattern ``A^{h..}`` is flattened over (i, j) and compared
    with every other's; ``(..., H, n_q, n_k)`` gives ``(..., H, H)``.
    Attention weights are non-negative, so ``0 <= C <= 1``; ``C = 1`` on
    the diagonal, and ``C^{hg} = 0`` exactly when the heads never attend to
    the same (query, key) pair.  A head with an all-zero pattern (every row
    fully masked) has no direction: its similarity with every head, itself
    included, is defined as 0.
    """
    xp = namespace(A)
    (A,) = xp.floating(xp.asarray(A))
    require_ndim(A, "A", "hij")
    check_weights(xp, A=A)
    # G^{hg} = A^{hij} A^{gij}   (the Gram matrix of the flattened patterns)
    G = xp.einsum("...hij,...gij->...hg", A, A)
    # |A^h|^2 = A^{hij} A^{hij}
    sq = xp.einsum("...hij,...hij->...h", A, A)
    alive = sq > 0
    # double where: sqrt never sees 0, so gradients stay finite
    norm = xp.sqrt(xp.where(alive, sq, xp.ones_like(sq)))
    both = xp.logical_and(alive[..., :, None], alive[..., None, :])
    C = G / (norm[..., :, None] * norm[..., None, :])
    return xp.where(both, C, xp.zeros_like(C))


def head_diversity(A: Any) -> Any:
    """D = 1 - (1/(H(H-1))) sum_{h != g} C^{hg}: one minus the mean pairwise head similarity.

    ``A (..., H, n_q, n_k)`` gives ``(...)``; ``C`` is
    :func:`head_similarity_matrix`.  ``D = 0`` when all heads attend
    identically, ``D = 1`` when no two heads ever attend to the same
    (query, key) pair; in between for anything else (weights are
    non-negative, so ``0 <= D <= 1``).

    One head (H = 1) has no pairs, and the average is defined as similarity
    1, i.e. ``D = 0``: a single head offers no second view, exactly like
    ``H`` identical heads, so the measure does not reward using fewer heads
    (with 0/0 read as similarity 0, one head would score the maximal
    diversity 1), and adding a copy of the head leaves ``D = 0`` unchanged.
    """
    xp = namespace(A)
    (A,) = xp.floating(xp.asarray(A))
    require_ndim(A, "A", "hij")
    check_weights(xp, A=A)
    raise NotImplementedError('Exercise 6.3: implement head_diversity (Head diversity); run `attn-course check 6.3`')
