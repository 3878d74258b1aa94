"""Part IX, Efficient Attention: online softmax and flash attention.

The softmax over keys can be computed in one pass over blocks of scores,
keeping only a running maximum ``m`` and a running sum ``l``:

    m' = max(m, max_j x^j)
    l' = l exp(m - m') + sum_j exp(x^j - m')          log Z = m + log l

Flash attention applies this to the scores of one (block_q x block_k) tile
at a time and rescales a running output accumulator by the same factor
``exp(m - m')``.  The n x n matrices S and A are never stored: the forward
keeps the output ``O^{ib}`` and the log-sum-exp ``log Z^i``; the backward
recomputes each tile from ``L`` (FlashAttention-2):

    D^i   = dO^{ib} O^{ib}
    P^{ij} = exp(S^{ij} - log Z^i)
    dV^{jb} += P^{ij} dO^{ib}          dP^{ij} = dO^{ib} V^{jb}
    dS^{ij} = P^{ij} (dP^{ij} - D^i)
    dQ^{ia} += dS^{ij} K^{ja} c         dK^{ja} += dS^{ij} Q^{ia} c

with ``c = 1/(sqrt(d_k) T)``.  Peak memory is linear in n: on JAX the loops
over blocks are ``lax.scan``/``fori_loop`` (XLA keeps one tile live); on MLX
they are Python loops through the backend adapter.

Conventions are the core's (:mod:`attn_tensors.softmax`): a fully masked
query row has output 0, ``L = -inf`` and zero gradients, without NaN.
``causal=True`` lets query ``i`` attend to keys ``j <= i + offset`` with
``offset = n_k - n_q`` by default: the convention of
:func:`attn_tensors.masking.causal_mask` (the last query lines up with the
last key; plain ``tril`` for square scores).

:func:`fast_attention` is the framework's own fused kernel
(``mx.fast.scaled_dot_product_attention`` or ``jax.nn.dot_product_attention``)
with the library's conventions restored.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ._checks import (
    AttentionInputError,
    batch_shape,
    check_finite,
    check_scores,
    check_temperature,
    require_bool_mask,
    require_match,
    require_ndim,
    require_padding_mask,
    require_qkv,
)
from .backend import Backend, namespace
from .masking import _offset as _causal_offset

__all__ = [
    "online_softmax_update",
    "online_logsumexp",
    "flash_attention",
    "fast_attention",
]

# Tiles of 256 queries x 512 keys keep XLA's CPU matmuls large while the live
# tile (128K floats) stays far below the n x n matrix.  See bench_flash.py.
BLOCK_Q = 256
BLOCK_K = 512


# -- online softmax --------------------------------------------------------


def online_softmax_update(m: Any, l: Any, x_new: Any) -> tuple[Any, Any]:
    """m' = max(m, max_j x^j),  l' = l exp(m - m') + sum_j exp(x^j - m').

    ``m`` and ``l`` have shape ``(...)``, the new block ``x_new`` has shape
    ``(..., b)``.  Start from ``m = -inf, l = 0``; entries ``-inf`` (masked)
    contribute nothing, and a block of only ``-inf`` leaves ``(m, l)`` as is.
    After the last block, ``log sum_j exp(x^j) = m + log l``.
    """
    xp = namespace(m, l, x_new)
    m, l, x_new = xp.floating(xp.asarray(m), xp.asarray(l), xp.asarray(x_new))
    require_ndim(x_new, "x_new", "j")
    if tuple(m.shape) != tuple(x_new.shape[:-1]) or tuple(l.shape) != tuple(m.shape):
        raise AttentionInputError(
            f"m and l must have the shape of x_new without its last axis j: "
            f"got m {tuple(m.shape)}, l {tuple(l.shape)}, x_new {tuple(x_new.shape)}"
        )
    raise NotImplementedError('Exercise 9.1: implement online_softmax_update (The online softmax update); run `attn-course check 9.1`')


def _online_block(xp: Backend, m: Any, l: Any, s: Any) -> tuple[Any, Any, Any, Any]:
    """(m', l') from online_softmax_update, plus the rescale alpha and the block's terms p.

    alpha = exp(m - m') rescales the sums carried so far and p^j = exp(s^j - m')
    are the new block's terms (flash attention weights the values with both);
    where m' = -inf (nothing seen yet) the shift is 0, as in the update.
    """
    m_new, l_new = online_softmax_update(m, l, s)
    m_safe = xp.where(m_new > xp.scalar(-float("inf"), s), m_new, xp.zeros_like(m_new))
    return m_new, l_new, xp.exp(m - m_safe), xp.exp(s - m_safe[..., None])


def online_logsumexp(x: Any, block: int = 128) -> Any:
    """log Z = m + log l after streaming x^j through online_softmax_update in blocks of ``block``.

    Equals ``log sum_j exp(x^j)`` over the last axis (``-inf`` when every
    entry is ``-inf``); only ``(m, l)`` is carried between blocks.
    """
    xp = namespace(x)
    (x,) = xp.floating(xp.asarray(x))
    require_ndim(x, "x", "j")
    check_scores(xp, x=x)
    block = int(block)
    if block < 1:
        raise AttentionInputError(f"block size must be >= 1; got block={block}")
    return _online_lse_core(xp, block)(x)


@functools.lru_cache(maxsize=None)
def _online_lse_core(xp: Backend, block: int):
    """online_logsumexp's loop, compiled once per (shape, block)."""

    # run(x) = log sum_j exp(x^j) over the last axis: pad x with -inf to whole
    # blocks of `block`, carry only (m, l) through _online_block, return m + log l.
    def run(x):
        raise NotImplementedError('Exercise 9.4: implement online_logsumexp (Streaming log-sum-exp); run `attn-course check 9.4`')

    return xp.compile(run)


# -- flash attention ----------------------------------------------------------


def _to_blocks(xp: Backend, x: Any, b: int) -> Any:
    """(..., T b, c) -> (T, ..., b, c): tile t of the second-to-last axis first."""
    shape = x.shape[:-2] + (x.shape[-2] // b, b, x.shape[-1])
    return xp.moveaxis(xp.reshape(x, shape), -3, 0)


def _from_blocks(xp: Backend, x: Any) -> Any:
    """(T, ..., b, c) -> (..., T b, c)."""
    x = xp.moveaxis(x, 0, -3)
    return xp.reshape(x, x.shape[:-3] + (x.shape[-3] * x.shape[-2], x.shape[-1]))


def _causal_tile(xp: Backend, i: Any, j: Any, bq: int, bk: int, offset: int) -> Any:
    """mask^{ij} = [key j <= query i + offset] on tile (i, j): rows i bq + r, columns j bk + s."""
    rows = xp.arange(bq) + i * bq + offset
    cols = xp.arange(bk) + j * bk
    return cols[None, :] <= rows[:, None]


@functools.lru_cache(maxsize=None)
def _flash_core(xp: Backend, causal: bool, bq: int, bk: int, offset: int = 0):
    """The custom-gradient kernel on padded inputs.

    Arguments: ``Qs (..., Tq bq, d_k)`` already multiplied by
    ``1/(sqrt(d_k) T)``, ``K (..., Tk bk, d_k)``, ``V (..., Tk bk, d_v)``,
    ``valid (..., 1, Tk bk)`` boolean (keys that exist and may be attended).
    Returns ``(O, L)``.
    """

    def forward(Qs, K, V, valid):
        batch = tuple(Qs.shape[:-2])
        n_tq, n_tk = Qs.shape[-2] // bq, K.shape[-2] // bk
        d_v = V.shape[-1]
        Qb, Kb, Vb = _to_blocks(xp, Qs, bq), _to_blocks(xp, K, bk), _to_blocks(xp, V, bk)
        Mb = _to_blocks(xp, xp.swap_last(valid), bk)  # (Tk, ..., bk, 1)
        neg_inf = xp.scalar(-float("inf"), Qs)

        def query_tile(carry, i):
            q = Qb[i]

            def key_tile(j, c):
                m, l, acc = c
                # S^{ij} = Qs^{ia} K^{ja} on this tile
                s = xp.einsum("...ia,...ja->...ij", q, Kb[j])
                allowed = xp.swap_last(Mb[j])
                if causal:
                    allowed = allowed & _causal_tile(xp, i, j, bq, bk, offset)
                s = xp.where(allowed, s, neg_inf)
                m, l, alpha, p = _online_block(xp, m, l, s)
                # acc^{ib} <- acc^{ib} exp(m - m') + exp(S^{ij} - m') V^{jb}
                acc = acc * alpha[..., None] + xp.einsum("...ij,...jb->...ib", p, Vb[j])
                return m, l, acc

            init = (
                xp.full(batch + (bq,), -float("inf"), dtype=Qs.dtype),
                xp.zeros(batch + (bq,), dtype=Qs.dtype),
                xp.zeros(batch + (bq, d_v), dtype=Qs.dtype),
            )
            # Causal: key tiles beyond the last query of this tile are all masked.
            hi = (
                xp.maximum(0, xp.minimum(n_tk, ((i + 1) * bq - 1 + offset) // bk + 1))
                if causal
                else n_tk
            )
            m, l, acc = xp.fori_loop(0, hi, key_tile, init)
            alive = l > 0
            l_safe = xp.where(alive, l, xp.ones_like(l))
            O = xp.where(alive[..., None], acc / l_safe[..., None], xp.zeros_like(acc))
            L = xp.where(alive, m + xp.log(l_safe), xp.full(l.shape, neg_inf, dtype=l.dtype))
            return carry, (O, L[..., None])

        _, (Ob, Lb) = xp.scan(query_tile, None, n_tq)
        return _from_blocks(xp, Ob), _from_blocks(xp, Lb)[..., 0]

    def backward(primals, outputs, cotangents):
        Qs, K, V, valid = primals
        O, L = outputs
        dO, dL = cotangents
        n_tq, n_tk = Qs.shape[-2] // bq, K.shape[-2] // bk
        neg_inf = xp.scalar(-float("inf"), Qs)
        # D^i = dO^{ib} O^{ib}; a cotangent dL^i on L adds P^{ij} dL^i to dS.
        D = xp.sum(dO * O, axis=-1) - dL
        L_safe = xp.where(L > neg_inf, L, xp.zeros_like(L))
        Qb, dOb = _to_blocks(xp, Qs, bq), _to_blocks(xp, dO, bq)
        Lb, Db = _to_blocks(xp, L_safe[..., None], bq), _to_blocks(xp, D[..., None], bq)
        Kb, Vb = _to_blocks(xp, K, bk), _to_blocks(xp, V, bk)
        Mb = _to_blocks(xp, xp.swap_last(valid), bk)

        def key_tile(dQb, j):
            k, v = Kb[j], Vb[j]

            def query_tile(i, c):
                dK, dV, dQb = c
                q, do = Qb[i], dOb[i]
                s = xp.einsum("...ia,...ja->...ij", q, k)
                allowed = xp.swap_last(Mb[j])
                if causal:
                    allowed = allowed & _causal_tile(xp, i, j, bq, bk, offset)
                # P^{ij} = exp(S^{ij} - log Z^i), recomputed from the saved log Z
                P = xp.exp(xp.where(allowed, s, neg_inf) - Lb[i])
                # dV^{jb} += P^{ij} dO^{ib}
                dV = dV + xp.einsum("...ij,...ib->...jb", P, do)
                # dP^{ij} = dO^{ib} V^{jb};  dS^{ij} = P^{ij} (dP^{ij} - D^i)
                dP = xp.einsum("...ib,...jb->...ij", do, v)
                dS = P * (dP - Db[i])
                # dQs^{ia} += dS^{ij} K^{ja};  dK^{ja} += dS^{ij} Qs^{ia}
                dQb = dQb.at[i].add(xp.einsum("...ij,...ja->...ia", dS, k))
                dK = dK + xp.einsum("...ij,...ia->...ja", dS, q)
                return dK, dV, dQb

            # Causal: query tiles that end before this key tile starts see none of it.
            lo = xp.maximum(0, (j * bk - offset) // bq) if causal else 0
            init = (xp.zeros_like(k), xp.zeros_like(v), dQb)
            dK, dV, dQb = xp.fori_loop(lo, n_tq, query_tile, init)
            return dQb, (dK, dV)

        dQb, (dKb, dVb) = xp.scan(key_tile, xp.zeros_like(Qb), n_tk)
        return _from_blocks(xp, dQb), _from_blocks(xp, dKb), _from_blocks(xp, dVb), None

    # Compiled once per shape: eager calls reuse it, and under an outer jit it inlines.
    return xp.compile(xp.custom_vjp(forward, backward))


def _pad_axis(xp: Backend, x: Any, pad: int, axis: int, value: Any = 0) -> Any:
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return xp.pad(x, widths, constant_values=value)


def _prepare(xp: Backend, Q: Any, K: Any, V: Any, T: Any, scale: Any):
    """Cast, check and broadcast the inputs; returns Q K V, the key mask and the batch shape."""
    Q, K, V = xp.floating(xp.asarray(Q), xp.asarray(K), xp.asarray(V))
    require_qkv(Q, K, V)
    check_finite(xp, Q=Q, K=K, V=V)
    check_temperature(T, xp, Q)
    scale = 1.0 / float(np.sqrt(Q.shape[-1])) if scale is None else float(scale)
    return Q, K, V, scale


def flash_attention(
    Q: Any,
    K: Any,
    V: Any,
    mask: Any = None,
    *,
    causal: bool = False,
    offset: int | None = None,
    T: Any = 1.0,
    scale: float | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    return_lse: bool = False,
) -> Any:
    """O^{ib} = softmax_j(Q^{ia} K^{ja} / (sqrt(d_k) T)) V^{jb}, one (block_q x block_k) tile at a time.

    ``Q (..., n_q, d_k)``, ``K (..., n_k, d_k)``, ``V (..., n_k, d_v)``
    with broadcasting leading batch/head axes.  ``mask`` is a boolean
    padding mask of shape ``(..., n_k)``: True for keys that may be attended,
    its leading axes batch axes of Q, K, V.  A full ``(n_q, n_k)`` mask is
    O(n^2) memory by itself and raises :class:`AttentionInputError`; use
    ``causal=True`` or :func:`attn_tensors.scaled_dot_product_attention`.
    ``n_k = 0`` gives fully masked rows (``O = 0``, ``L = -inf``).
    ``causal=True`` keeps keys ``j <= i + offset``, ``offset = n_k - n_q`` by
    default as in :func:`attn_tensors.masking.causal_mask`.  ``scale``
    replaces ``1/sqrt(d_k)``.

    Returns ``O``, or ``(O, L)`` with ``L`` holding ``log Z^i = log sum_j exp(S^{ij}/T)`` when
    ``return_lse``.  Memory is O(n (d_k + d_v)) plus one tile; gradients come
    from the custom VJP that recomputes the tiles (module docstring).
    Sizes that are not multiples of the blocks are padded internally.
    """
    xp = namespace(Q, K, V, mask)
    Q, K, V, scale = _prepare(xp, Q, K, V, T, scale)
    n_q, n_k = Q.shape[-2], K.shape[-2]
    batch = batch_shape((Q, 2), (K, 2), (V, 2))
    if mask is not None:
        mask = require_padding_mask(xp, mask, n_k, batch, "flash_attention")
    batch = batch_shape((Q, 2), (K, 2), (V, 2), *([(mask, 1)] if mask is not None else []))
    if n_q == 0 or n_k == 0:
        # Nothing to tile: no queries, or no keys (every row fully masked).
        return _empty_attention(xp, Q, K, V, scale, T, batch, return_lse)
    bq, bk = max(1, min(int(block_q), n_q)), max(1, min(int(block_k), n_k))
    pad_q, pad_k = -n_q % bq, -n_k % bk

    # Qs^{ia} = Q^{ia} / (sqrt(d_k) T): the scale and T stay outside the
    # custom VJP, so autodiff carries their gradients.
    Qs = Q * scale if isinstance(T, (int, float)) and T == 1 else Q * scale / T
    Qs = xp.broadcast_to(Qs, batch + tuple(Q.shape[-2:]))
    K = xp.broadcast_to(K, batch + tuple(K.shape[-2:]))
    V = xp.broadcast_to(V, batch + tuple(V.shape[-2:]))
    Qs = _pad_axis(xp, Qs, pad_q, -2)
    K, V = _pad_axis(xp, K, pad_k, -2), _pad_axis(xp, V, pad_k, -2)
    valid = xp.arange(n_k + pad_k) < n_k  # padded keys may not be attended
    if mask is not None:
        valid = valid & _pad_axis(xp, mask, pad_k, -1, False)
    valid = xp.broadcast_to(valid[..., None, :], batch + (1, n_k + pad_k))

    offset = _causal_offset(n_q, n_k, offset) if causal else 0
    O, L = _flash_core(xp, bool(causal), bq, bk, offset)(Qs, K, V, valid)
    O, L = O[..., :n_q, :], L[..., :n_q]
    return (O, L) if return_lse else O


def _empty_attention(xp: Backend, Q, K, V, scale, T, batch, return_lse):
    """O^{ib} and log Z^i when n_q = 0 or n_k = 0: empty, or 0 and -inf (fully masked rows)."""
    n_q, d_v = Q.shape[-2], V.shape[-1]
    # O^{ib} = sum over no keys = 0, written through Q and V so both stay in the graph:
    # a product over one empty axis (MLX 0.32's einsum over empty axes can spin for
    # minutes in its gradient; a matmul does not)
    O = (Q[..., :, :0] @ V[..., :0, :]) * scale
    O = xp.broadcast_to(O, batch + (n_q, d_v))
    if not return_lse:
        return O
    L = xp.full(batch + (n_q,), -float("inf"), dtype=O.dtype)
    return O, L


# -- the framework's fused kernel ---------------------------------------------


@functools.lru_cache(maxsize=None)
def _fused(xp: Backend, scale: float, has_mask: bool):
    """The compiled fused kernel with the fully-masked-row fix-up."""

    def run(Q, K, V, mask):
        O = xp.fused_sdpa(Q, K, V, mask if has_mask else None, scale)
        if not has_mask:
            return O
        # Both kernels give a fully masked row the mean of V; the library's
        # convention is 0 (and hence zero gradients for that row).
        alive = xp.any(mask, axis=-1)
        return xp.where(alive[..., None], O, xp.zeros_like(O))

    if has_mask:
        return xp.compile(run)
    return xp.compile(lambda Q, K, V: run(Q, K, V, None))


def fast_attention(
    Q: Any, K: Any, V: Any, mask: Any = None, T: Any = 1.0, *, scale: float | None = None
) -> Any:
    """O^{ib} = softmax_j(Q^{ia} K^{ja} / (sqrt(d_k) T)) V^{jb} by the framework's fused kernel.

    MLX: ``mx.fast.scaled_dot_product_attention`` under ``mx.compile``; JAX:
    ``jax.nn.dot_product_attention`` under ``jax.jit``.  Same arguments and
    conventions as :func:`attn_tensors.scaled_dot_product_attention`
    (boolean "may attend" mask broadcasting to ``(..., n_q, n_k)``, a fully
    masked row gives 0).  Both kernels compute the softmax in float32 (JAX
    even for float64 inputs), so agreement with the reference is float32-level.
    """
    xp = namespace(Q, K, V, mask)
    Q, K, V, scale = _prepare(xp, Q, K, V, T, scale)
    n_q, n_k, d_k, d_v = Q.shape[-2], K.shape[-2], Q.shape[-1], V.shape[-1]
    shapes = [(Q, 2), (K, 2), (V, 2)]
    if mask is not None:
        mask = require_bool_mask(xp, mask)
        try:
            np.broadcast_shapes(tuple(mask.shape[-2:]), (n_q, n_k))
        except ValueError as err:
            raise AttentionInputError(
                f"mask of shape {tuple(mask.shape)} does not broadcast against the "
                f"scores (..., n_q={n_q}, n_k={n_k})"
            ) from err
        shapes.append((mask, 2) if mask.ndim >= 2 else (mask, mask.ndim))
    batch = batch_shape(*shapes)
    B = int(np.prod(batch)) if batch else 1
    if not (isinstance(T, (int, float)) and T == 1):
        Q = Q / T  # keeps an array T differentiable
    # The fused kernels take one flat batch axis: (B, n, d).
    Qf = xp.reshape(xp.broadcast_to(Q, batch + (n_q, d_k)), (B, n_q, d_k))
    Kf = xp.reshape(xp.broadcast_to(K, batch + (n_k, d_k)), (B, n_k, d_k))
    Vf = xp.reshape(xp.broadcast_to(V, batch + (n_k, d_v)), (B, n_k, d_v))
    if mask is None:
        O = _fused(xp, scale, False)(Qf, Kf, Vf)
    else:
        mf = xp.reshape(xp.broadcast_to(mask, batch + (n_q, n_k)), (B, n_q, n_k))
        O = _fused(xp, scale, True)(Qf, Kf, Vf, mf)
    return xp.reshape(O, batch + (n_q, d_v))
