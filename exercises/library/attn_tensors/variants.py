"""Part VII, Attention Variants: other bilinear forms, positions, and pairs.

Every variant keeps the three steps of Part II (scores, softmax over what a
query may attend, weighted sum of values) and changes only the scores, or,
for third-order attention, what a query attends *to*:

=================================  =============================================
variant                            scores
=================================  =============================================
learned bilinear                   S^{ij} = Q^{ia} M_{ab} K^{jb}        (any M)
relative positions (Shaw et al.)   S^{ij} = Q^{ia} (K^{ja} + R^{r(i,j) a}) / sqrt(d_k)
rotary (RoPE, Su et al.)           S^{ij} = Q^{ia} G_{ab}(p_i - p_j) K^{jb} / sqrt(d_k)
ALiBi (Press et al.)               S^{hij} = Q^{hia} K^{hja} / sqrt(d_k) - m_h |i - j|
2-simplicial (Clift et al.;        S^{ijk} = Q^{ia} K1^{ja} K2^{ka} / sqrt(d_k),
Roy et al.)                        softmax over the pair (j, k)
=================================  =============================================

Positions.  Query ``i`` and key ``j`` sit at positions ``i`` and ``j``, both
counted from 0 (the square self-attention case of the book; a decoder that
feeds a block of queries against a longer cache passes explicit positions to
:func:`rotary_embedding` or shifts its own indices).

Shapes: ``Q (..., n_q, d_k)``, ``K (..., n_k, d_k)``, ``V (..., n_k, d_v)``;
leading batch/head axes broadcast; masks are boolean "may attend" arrays that
broadcast against the scores (see :mod:`attn_tensors.softmax` for the
fully-masked-row convention: weights 0, output 0, no NaN).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ._checks import (
    AttentionInputError,
    batch_shape,
    check_finite,
    require_match,
    require_ndim,
    require_qkv,
    require_size,
    require_square,
)
from .backend import Backend, namespace, namespace_for
from .bilinear import learned_metric
from .masking import _offset as _mask_offset
from .masking import causal_mask, combine_masks
from .softmax import softmax_and_log_partition

__all__ = [
    # learned bilinear forms
    "learned_bilinear_scores",
    "symmetric_pd_metric",
    "metric_parts",
    "bilinear_attention",
    # relative positions
    "relative_position_index",
    "relative_position_scores",
    "relative_position_attention",
    # rotary
    "rotary_frequencies",
    "rotary_embedding",
    "rotary_form",
    "rotary_scores",
    "rotary_attention",
    # ALiBi
    "alibi_slopes",
    "alibi_bias",
    "alibi_attention",
    # third order
    "trilinear_scores",
    "pair_softmax_and_log_partition",
    "pair_softmax",
    "two_simplicial_output",
    "TwoSimplicialParts",
    "two_simplicial_decomposition",
    "two_simplicial_attention",
]


# -- small shared pieces -----------------------------------------------------
def _qkv(xp: Backend, Q: Any, K: Any, V: Any | None = None) -> list[Any]:
    """Q, K (and V) as floating arrays of one dtype, shapes and values checked."""
    arrays = [xp.asarray(Q), xp.asarray(K)] + ([] if V is None else [xp.asarray(V)])
    arrays = xp.floating(*arrays)
    Q, K = arrays[0], arrays[1]
    require_qkv(Q, K, arrays[2] if V is not None else None, v_index="jc")
    check_finite(xp, **dict(zip("QKV", arrays)))
    return arrays


def _softmax_output(xp: Backend, S: Any, V: Any, mask: Any, T: Any) -> Any:
    """O^{ic} = A^{ij} V^{jc} with A^{ij} = softmax_j(S^{ij} / T) under the mask."""
    A, _ = softmax_and_log_partition(S, mask, T, xp)
    # O^{ic} = A^{ij} V^{jc}
    return xp.einsum("...ij,...jc->...ic", A, V)


def _default_scale(d_k: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(d_k) if scale is None else float(scale)


# -- learned bilinear forms --------------------------------------------------
def learned_bilinear_scores(Q: Any, K: Any, M: Any) -> Any:
    """S^{ij} = Q^{ia} M_{ab} K^{jb}: scores in the geometry of any matrix M.

    ``Q (..., n_q, d_q)``, ``K (..., n_k, d_k)``, ``M (..., d_q, d_k)``; ``M``
    may be rectangular and need not be symmetric.  No 1/sqrt(d_k) is added:
    ``M`` carries any scale.  For self-attention (``Q = K = x``) the scores
    are the close reading's kernel matrix x M x^T, which is symmetric in
    (i, j) exactly when M is (:func:`metric_parts`).
    """
    xp = namespace(Q, K, M)
    Q, K, M = xp.floating(xp.asarray(Q), xp.asarray(K), xp.asarray(M))
    require_ndim(Q, "Q", "ia")
    require_ndim(K, "K", "jb")
    require_ndim(M, "M", "ab")
    require_match("a", ("M", "rows", M.shape[-2]), ("Q", "d_q", Q.shape[-1]))
    require_match("b", ("M", "columns", M.shape[-1]), ("K", "d_k", K.shape[-1]))
    batch_shape((Q, 2), (K, 2), (M, 2))
    check_finite(xp, Q=Q, K=K, M=M)
    # K_lower_{ja} = M_{ab} K^{jb}, then S^{ij} = Q^{ia} K_lower_{ja}
    K_lower = xp.einsum("...ab,...jb->...ja", M, K)
    return xp.einsum("...ia,...ja->...ij", Q, K_lower)


def symmetric_pd_metric(W: Any, eps: float = 0.0) -> Any:
    """M_{ab} = W_{ca} W_{cb} + eps delta_{ab}: symmetric, positive semi-definite.

    ``W`` has shape ``(..., r, d)``.  ``W^T W`` alone is positive definite
    only when ``W`` has rank ``d`` (so ``r >= d``); ``eps > 0`` makes it
    positive definite for any ``W`` (a ridge).  See
    :func:`attn_tensors.bilinear.check_metric` to classify the result.
    """
    if not (isinstance(eps, (int, float)) and eps >= 0 and math.isfinite(eps)):
        raise AttentionInputError(f"eps must be a finite number >= 0; got eps={eps!r}")
    M = learned_metric(W)  # M_{ab} = W_{ca} W_{cb}
    if eps:
        xp = namespace(M)
        M = M + eps * xp.eye(M.shape[-1], dtype=M.dtype)
    return M


def metric_parts(M: Any) -> tuple[Any, Any]:
    """M_{ab} = M_{(ab)} + M_{[ab]}: symmetric part (M + M^T)/2, antisymmetric (M - M^T)/2.

    In self-attention only the antisymmetric part makes the kernel lopsided:
    S^{ij} - S^{ji} = 2 x^{ia} M_{[ab]} x^{jb}.
    """
    xp = namespace(M)
    (M,) = xp.floating(xp.asarray(M))
    require_square(M, "M")
    Mt = xp.swap_last(M)
    return (M + Mt) / 2, (M - Mt) / 2


def bilinear_attention(
    Q: Any, K: Any, V: Any, M: Any, mask: Any = None, T: Any = 1.0
) -> Any:
    """O^{ic} = softmax_j(Q^{ia} M_{ab} K^{jb} / T) V^{jc}: attention with a learned form M."""
    xp = namespace(Q, K, V, M, mask)
    S = learned_bilinear_scores(Q, K, M)  # checks Q, K and M
    V = xp.asarray(V)
    require_ndim(V, "V", "jc")
    require_match("j", ("K", "n_k", S.shape[-1]), ("V", "n_k", V.shape[-2]))
    batch_shape((S, 2), (V, 2))
    check_finite(xp, V=V)
    return _softmax_output(xp, S, V.astype(S.dtype), mask, T)


# -- relative positions (Shaw et al. 2018) -----------------------------------
def relative_position_index(
    n_q: int, n_k: int | None = None, *, max_distance: int | None = None
) -> np.ndarray:
    """r(i, j) = (i - j) + (n_k - 1), or clip(i - j, -D, D) + D with max_distance D.

    The row of the relative-position table ``R`` that query ``i`` and key
    ``j`` read.  Without ``max_distance`` the offsets ``i - j`` run over
    ``[-(n_k - 1), n_q - 1]`` and ``R`` needs ``n_q + n_k - 1`` rows: row 0
    is ``i - j = -(n_k - 1)`` (the key furthest ahead), row ``n_k - 1`` is
    ``i = j``, the last row is ``i - j = n_q - 1``.  With ``max_distance=D``
    (Shaw et al.) offsets beyond +-D share the end rows and ``R`` has
    ``2 D + 1`` rows, row ``D`` being ``i = j``.

    Returns a NumPy ``int32`` array of shape ``(n_q, n_k)``: an index table
    built from sizes alone, used to gather from backend arrays.
    """
    n_q = require_size(n_q, "n_q")
    n_k = n_q if n_k is None else require_size(n_k, "n_k")
    diff = np.arange(n_q)[:, None] - np.arange(n_k)[None, :]  # i - j
    if max_distance is None:
        return (diff + (n_k - 1)).astype(np.int32)
    D = require_size(max_distance, "max_distance", minimum=0)
    return (np.clip(diff, -D, D) + D).astype(np.int32)


def _n_relative(n_q: int, n_k: int, max_distance: int | None) -> tuple[int, str]:
    if max_distance is None:
        return n_q + n_k - 1, (
            f"offsets i - j in [-(n_k-1), n_q-1] need n_q + n_k - 1 = {n_q + n_k - 1}"
        )
    D = require_size(max_distance, "max_distance", minimum=0)
    return 2 * D + 1, f"max_distance={D} needs 2 * max_distance + 1 = {2 * D + 1}"


def _check_table(table: Any, name: str, n_q: int, n_k: int, max_distance: Any) -> None:
    require_ndim(table, name, "ra")
    n_rel, why = _n_relative(n_q, n_k, max_distance)
    if table.shape[-2] != n_rel:
        raise AttentionInputError(
            f"{name} has {table.shape[-2]} rows but {why} (index r = relative "
            "position row must match)"
        )


def relative_position_scores(
    Q: Any,
    K: Any,
    R: Any,
    *,
    max_distance: int | None = None,
    scale: float | None = None,
) -> Any:
    """S^{ij} = Q^{ia} (K^{ja} + R^{r(i,j) a}) / sqrt(d_k),  r(i,j) = (i - j) + offset.

    ``R (..., n_rel, d_k)`` holds one embedding per relative offset, indexed
    as in :func:`relative_position_index`: ``n_rel = n_q + n_k - 1`` and
    ``r = (i - j) + (n_k - 1)``, or with ``max_distance=D`` ``n_rel = 2D + 1``
    and ``r = clip(i - j, -D, D) + D``.

    The position term is computed without forming an ``(n_q, n_k, d_k)``
    array: P^{ir} = Q^{ia} R^{ra} first (one row per query and offset), then
    each (i, j) gathers P^{i r(i,j)}.
    """
    xp = namespace(Q, K, R)
    Q, K, R = xp.floating(xp.asarray(Q), xp.asarray(K), xp.asarray(R))
    _qkv(xp, Q, K)
    raise NotImplementedError('Exercise 7.3: implement relative_position_scores (Relative-position scores); run `attn-course check 7.3`')


def relative_position_attention(
    Q: Any,
    K: Any,
    V: Any,
    R: Any,
    mask: Any = None,
    T: Any = 1.0,
    *,
    max_distance: int | None = None,
    R_V: Any = None,
    scale: float | None = None,
) -> Any:
    """O^{ic} = A^{ij} (V^{jc} + R_V^{r(i,j) c}),  A^{ij} = softmax_j(S^{ij} / T).

    ``S`` are the scores of :func:`relative_position_scores`.  ``R_V``
    (optional, Shaw et al.'s value embeddings) has the same rows as ``R``
    and ``d_v`` columns; without it ``O^{ic} = A^{ij} V^{jc}``.
    """
    xp = namespace(Q, K, V, R, mask, R_V)
    Q, K, V = _qkv(xp, Q, K, V)
    S = relative_position_scores(Q, K, R, max_distance=max_distance, scale=scale)
    A, _ = softmax_and_log_partition(S, mask, T, xp)
    V = V.astype(S.dtype)
    # O^{ic} = A^{ij} V^{jc}
    O = xp.einsum("...ij,...jc->...ic", A, V)
    if R_V is None:
        return O
    R_V = xp.asarray(R_V).astype(S.dtype)
    n_q, n_k = Q.shape[-2], K.shape[-2]
    _check_table(R_V, "R_V", n_q, n_k, max_distance)
    require_match("c", ("V", "d_v", V.shape[-1]), ("R_V", "d_v", R_V.shape[-1]))
    check_finite(xp, R_V=R_V)
    idx = xp.asarray(relative_position_index(n_q, n_k, max_distance=max_distance))
    # E^{ijc} = R_V^{r(i,j) c}, then O^{ic} += A^{ij} E^{ijc}
    E = xp.take(R_V, idx, axis=-2)
    return O + xp.einsum("...ij,...ijc->...ic", A, E)


# -- rotary position embeddings (Su et al. 2021) -----------------------------
def rotary_frequencies(
    d: int, base: float = 10000.0, *, like: Any = None, dtype: Any = None
) -> Any:
    """theta_m = base^(-2m/d), m = 0 .. d/2 - 1: one angular frequency per pair."""
    d = require_size(d, "d")
    if d % 2:
        raise AttentionInputError(
            f"rotary embeddings rotate feature pairs (2m, 2m+1): d must be even; got d={d}"
        )
    if not (isinstance(base, (int, float)) and base > 0 and math.isfinite(base)):
        raise AttentionInputError(
            f"base must be a positive finite number; got base={base!r}"
        )
    xp = namespace_for(like)
    theta = np.asarray(base, dtype=np.float64) ** (-2.0 * np.arange(d // 2) / d)
    return xp.asarray(theta.astype(np.float64), dtype=xp.default_float(like, dtype))


def _rotation_angles(xp: Backend, X: Any, positions: Any, base: float) -> Any:
    """phi^{im} = p_i theta_m, shape (..., n, d/2)."""
    n, d = X.shape[-2], X.shape[-1]
    theta = rotary_frequencies(d, base, like=X)
    if positions is None:
        p = xp.arange(n).astype(X.dtype)
    else:
        p = xp.asarray(positions)
        if p.ndim == 0 or p.shape[-1] != n:
            raise AttentionInputError(
                f"positions must have n={n} entries on the last axis (index i, one "
                f"position per row of the input); got shape {tuple(p.shape)}"
            )
        p = p.astype(X.dtype)
        check_finite(xp, positions=p)
    # phi^{im} = p_i theta_m
    return xp.einsum("...i,m->...im", p, theta)


def rotary_embedding(X: Any, positions: Any = None, base: float = 10000.0) -> Any:
    """X'^{ia} = R_{ab}(p_i) X^{ib}: rotate feature pair (2m, 2m+1) by the angle p_i theta_m.

    In components, with phi = p_i theta_m::

        X'^{i,2m}   = X^{i,2m} cos(phi) - X^{i,2m+1} sin(phi)
        X'^{i,2m+1} = X^{i,2m} sin(phi) + X^{i,2m+1} cos(phi)

    Rotates each feature pair ``(2m, 2m+1)`` (the interleaved pairing of
    RoFormer) of row ``i`` by the angle ``p_i theta_m`` with
    ``theta_m = base^(-2m/d)``.  ``X (..., n, d)`` with ``d`` even;
    ``positions`` (default ``0 .. n-1``) broadcasts against ``(..., n)``
    and may be any real numbers.  A rotation: norms of rows are preserved.
    """
    xp = namespace(X, positions)
    (X,) = xp.floating(xp.asarray(X))
    require_ndim(X, "X", "ia")
    check_finite(xp, X=X)
    n, d = X.shape[-2], X.shape[-1]
    phi = _rotation_angles(xp, X, positions, base)
    cos, sin = xp.cos(phi), xp.sin(phi)
    pairs = xp.reshape(X, tuple(X.shape[:-1]) + (d // 2, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]  # X^{i,2m}, X^{i,2m+1}
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    Y = xp.stack([y0, y1], axis=-1)  # (..., n, d/2, 2)
    return xp.reshape(Y, tuple(Y.shape[:-2]) + (d,))


def rotary_form(delta: Any, d: int, base: float = 10000.0, *, like: Any = None) -> Any:
    """G_{ab}(delta) = R_{ab}(-delta): pair m turned by -delta theta_m, a block-diagonal form.

    Block ``m`` (rows and columns 2m, 2m+1) is, with c = cos(delta theta_m)
    and s = sin(delta theta_m), the matrix [[c, s], [-s, c]].  It is the
    bilinear form hidden in rotary attention: with ``delta = p_i - p_j``,
    RoPE(Q)^{ia} RoPE(K)^{ja} = Q^{ia} G_{ab}(p_i - p_j) K^{jb}.  ``G`` is a
    rotation by ``-delta theta_m`` in each pair: orthogonal, not symmetric
    unless ``delta theta_m`` is a multiple of pi, and a function of the
    offset alone.  ``delta`` may be an array (shape ``(...)``); the result
    has shape ``(..., d, d)``.  ``like`` picks the backend when ``delta`` is
    a Python number.
    """
    ref = delta if hasattr(delta, "shape") else like
    xp = namespace_for(ref)
    theta = rotary_frequencies(d, base, like=ref)
    delta = xp.asarray(delta).astype(theta.dtype)
    # phi^{m} = delta theta_m
    phi = xp.einsum("...,m->...m", delta, theta)
    c, s = xp.cos(phi), xp.sin(phi)
    # B^{m a b}: the 2 x 2 block of pair m
    B = xp.stack([xp.stack([c, s], axis=-1), xp.stack([-s, c], axis=-1)], axis=-2)
    eye = xp.eye(d // 2, dtype=theta.dtype)
    # G^{(m a)(n b)} = delta_{mn} B^{m a b}
    G = xp.einsum("...mab,mn->...manb", B, eye)
    return xp.reshape(G, tuple(G.shape[:-4]) + (d, d))


def rotary_scores(
    Q: Any,
    K: Any,
    *,
    q_positions: Any = None,
    k_positions: Any = None,
    base: float = 10000.0,
    scale: float | None = None,
) -> Any:
    """S^{ij} = Q^{ia} G_{ab}(p_i - p_j) K^{jb} / sqrt(d_k) = RoPE(Q)^{ia} RoPE(K)^{ja} / sqrt(d_k).

    ``G`` is :func:`rotary_form`; the scores are computed by rotating ``Q``
    and ``K`` (:func:`rotary_embedding`) and taking dot products.
    """
    xp = namespace(Q, K, q_positions, k_positions)
    Q, K = _qkv(xp, Q, K)
    d_k = Q.shape[-1]
    Qr = rotary_embedding(Q, q_positions, base)
    Kr = rotary_embedding(K, k_positions, base)
    # S^{ij} = Q'^{ia} K'^{ja} / sqrt(d_k)
    return xp.einsum("...ia,...ja->...ij", Qr, Kr) * _default_scale(d_k, scale)


def rotary_attention(
    Q: Any,
    K: Any,
    V: Any,
    mask: Any = None,
    T: Any = 1.0,
    *,
    q_positions: Any = None,
    k_positions: Any = None,
    base: float = 10000.0,
    scale: float | None = None,
) -> Any:
    """O^{ic} = softmax_j(RoPE(Q)^{ia} RoPE(K)^{ja} / (sqrt(d_k) T)) V^{jc}."""
    xp = namespace(Q, K, V, mask, q_positions, k_positions)
    Q, K, V = _qkv(xp, Q, K, V)
    S = rotary_scores(
        Q, K, q_positions=q_positions, k_positions=k_positions, base=base, scale=scale
    )
    return _softmax_output(xp, S, V.astype(S.dtype), mask, T)


# -- ALiBi (Press et al. 2022) -----------------------------------------------
def _alibi_slopes_list(n: int) -> list[float]:
    """The reference recursion of Press et al. (their ``get_slopes``)."""
    raise NotImplementedError('Exercise 7.4: implement alibi_slopes (ALiBi slopes); run `attn-course check 7.4`')


def alibi_slopes(n_heads: int, *, like: Any = None, dtype: Any = None) -> Any:
    """m_h = 2^(-8h/n) for h = 1..n (n a power of two), else Press et al.'s interpolation.

    For ``n`` heads that is not a power of two, with ``n0`` the largest
    power of two below ``n``: the ``n0`` slopes of ``n0`` heads, followed by
    every other slope of ``2 n0`` heads (``2^(-4h'/n0)`` for odd ``h'``)
    until there are ``n``.  Returns shape ``(n_heads,)``.
    """
    raise NotImplementedError('Exercise 7.4: implement alibi_slopes (ALiBi slopes); run `attn-course check 7.4`')


def alibi_bias(
    n_heads: int,
    n_q: int,
    n_k: int | None = None,
    *,
    offset: int | None = None,
    like: Any = None,
    dtype: Any = None,
) -> Any:
    """B^{hij} = -m_h |p_i - j|, p_i = i + offset  (= -m_h (p_i - j) on the causal part).

    Shape ``(n_heads, n_q, n_k)``.  Query ``i`` sits at key position
    ``p_i = i + offset``; ``offset`` defaults to ``n_k - n_q`` as in
    :func:`attn_tensors.masking.causal_mask` (the last query lines up with the
    last key; 0 for square scores).  A causal model sees only ``j <= p_i``,
    where this is Press et al.'s linear penalty; for ``j > p_i`` the bias is
    the symmetric extension used by bidirectional models, finite so that a
    causal mask (not the bias) removes those keys.
    """
    n_q = require_size(n_q, "n_q")
    n_k = n_q if n_k is None else require_size(n_k, "n_k")
    offset = _mask_offset(n_q, n_k, offset)
    xp = namespace_for(like)
    m = alibi_slopes(n_heads, like=like, dtype=dtype)
    p = np.arange(n_q)[:, None] + offset
    dist = np.abs(p - np.arange(n_k)[None, :])  # |p_i - j|
    dist = xp.asarray(dist.astype(np.float64), dtype=m.dtype)
    # B^{hij} = -m_h |p_i - j|
    return -xp.einsum("h,ij->hij", m, dist)


def alibi_attention(
    Q: Any,
    K: Any,
    V: Any,
    mask: Any = None,
    T: Any = 1.0,
    *,
    causal: bool = True,
    scale: float | None = None,
) -> Any:
    """O^{hic} = softmax_j((Q^{hia} K^{hja} / sqrt(d_k) - m_h |i - j|) / T) V^{hjc}.

    With ``causal=True`` the softmax runs over keys ``j <= i`` only.  Heads
    are the axis ``-3``: ``Q (..., h, n_q, d_k)``, ``K (..., h, n_k, d_k)``,
    ``V (..., h, n_k, d_v)``; head ``h`` gets slope ``m_h`` of
    :func:`alibi_slopes`.  ``causal=True`` (the setting of the paper) lets
    query ``i`` attend keys ``j <= i``; it is combined ("and") with ``mask``.
    """
    xp = namespace(Q, K, V, mask)
    require_ndim(Q, "Q", "hia")
    require_ndim(K, "K", "hja")
    require_ndim(V, "V", "hjc")
    require_match(
        "h",
        ("Q", "n_heads", Q.shape[-3]),
        ("K", "n_heads", K.shape[-3]),
        ("V", "n_heads", V.shape[-3]),
    )
    Q, K, V = _qkv(xp, Q, K, V)
    n_heads, n_q, n_k, d_k = Q.shape[-3], Q.shape[-2], K.shape[-2], Q.shape[-1]
    if n_q == 0 or n_k == 0:
        # no (i, j) pairs: no bias and no causal mask to build; the empty
        # scores give no rows, or fully masked rows (O = 0)
        S = xp.einsum("...ia,...ja->...ij", Q, K)
        return _softmax_output(xp, S, V.astype(S.dtype), mask, T)
    B = alibi_bias(n_heads, n_q, n_k, like=Q)
    # S^{hij} = Q^{hia} K^{hja} / sqrt(d_k) + B^{hij}
    S = xp.einsum("...ia,...ja->...ij", Q, K) * _default_scale(d_k, scale) + B
    if causal:
        # M^{ij} = [j <= i + n_k - n_q], the same positions as the bias
        mask = combine_masks(causal_mask(n_q, n_k, like=Q), mask)
    return _softmax_output(xp, S, V.astype(S.dtype), mask, T)


# -- third-order (2-simplicial) attention ------------------------------------
def _check_triple(xp: Backend, Q: Any, K1: Any, K2: Any) -> None:
    require_ndim(Q, "Q", "ia")
    require_ndim(K1, "K1", "ja")
    require_ndim(K2, "K2", "ka")
    require_match(
        "a",
        ("Q", "d_k", Q.shape[-1]),
        ("K1", "d_k", K1.shape[-1]),
        ("K2", "d_k", K2.shape[-1]),
    )
    batch_shape((Q, 2), (K1, 2), (K2, 2))
    check_finite(xp, Q=Q, K1=K1, K2=K2)


def trilinear_scores(Q: Any, K1: Any, K2: Any, *, scale: float | None = None) -> Any:
    """S^{ijk} = Q^{ia} K1^{ja} K2^{ka} / sqrt(d_k): one score per query i and key pair (j, k).

    The trilinear form of 2-simplicial attention.  For a fixed key ``k`` it
    is a bilinear form in (i, j) with the diagonal metric
    g^{(k)}_{ab} = delta_{ab} K2^{ka} / sqrt(d_k).  Shape
    ``(..., n_q, n_j, n_k)``: memory grows as n^3.
    """
    xp = namespace(Q, K1, K2)
    Q, K1, K2 = xp.floating(xp.asarray(Q), xp.asarray(K1), xp.asarray(K2))
    raise NotImplementedError('Exercise 7.5: implement trilinear_scores (Trilinear scores); run `attn-course check 7.5`')


def pair_softmax_and_log_partition(
    S: Any, mask: Any = None, T: Any = 1.0
) -> tuple[Any, Any]:
    """A^{ijk} = exp(S^{ijk}/T - log Z^i),  log Z^i = log sum_{j,k} exp(S^{ijk}/T).

    The softmax runs over the key *pair* (j, k) jointly: the last two axes
    are flattened and handed to :func:`attn_tensors.softmax.softmax_and_log_partition`,
    so the masking conventions are the library's: ``mask`` ("may attend the
    pair (j, k)") broadcasts against ``S (..., n_q, n_j, n_k)``; a query with
    no allowed pair gets weights 0 and log Z = -inf.
    """
    xp = namespace(S, mask)
    (S,) = xp.floating(xp.asarray(S))
    require_ndim(S, "S", "ijk")
    check_finite(xp, S=S)
    shape = tuple(S.shape)
    flat = shape[:-2] + (shape[-2] * shape[-1],)
    if mask is not None:
        mask = xp.asarray(mask)
        if mask.dtype != xp.module.bool_:
            raise AttentionInputError(
                f"mask must be boolean ('may attend' = True); got dtype {mask.dtype}"
            )
        try:
            shape = tuple(np.broadcast_shapes(tuple(mask.shape), shape))
        except ValueError:
            raise AttentionInputError(
                f"mask of shape {tuple(mask.shape)} does not broadcast against the "
                f"pair scores of shape {shape} (last two axes are the key pair (j, k), "
                f"n_j={shape[-2]}, n_k={shape[-1]})"
            ) from None
        # a mask with extra leading (batch) axes broadcasts the scores too
        S = xp.broadcast_to(S, shape)
        flat = shape[:-2] + (shape[-2] * shape[-1],)
        mask = xp.reshape(xp.broadcast_to(mask, shape), flat)
    A, log_Z = softmax_and_log_partition(xp.reshape(S, flat), mask, T, xp)
    return xp.reshape(A, shape), log_Z


def pair_softmax(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """A^{ijk} = exp(S^{ijk}/T) / sum_{j',k'} exp(S^{ij'k'}/T): a distribution over pairs."""
    return pair_softmax_and_log_partition(S, mask, T)[0]


def two_simplicial_output(A: Any, V1: Any, V2: Any) -> Any:
    """O^{ic} = A^{ijk} V1^{jc} V2^{kc}: the pair's value is the elementwise product V1^j * V2^k."""
    xp = namespace(A, V1, V2)
    A, V1, V2 = xp.floating(xp.asarray(A), xp.asarray(V1), xp.asarray(V2))
    require_ndim(A, "A", "ijk")
    require_ndim(V1, "V1", "jc")
    require_ndim(V2, "V2", "kc")
    require_match("j", ("A", "n_j", A.shape[-2]), ("V1", "n_j", V1.shape[-2]))
    require_match("k", ("A", "n_k", A.shape[-1]), ("V2", "n_k", V2.shape[-2]))
    require_match("c", ("V1", "d_v", V1.shape[-1]), ("V2", "d_v", V2.shape[-1]))
    batch_shape((A, 3), (V1, 2), (V2, 2))
    # O^{ic} = A^{ijk} V1^{jc} V2^{kc}
    return xp.einsum("...ijk,...jc,...kc->...ic", A, V1, V2)


class TwoSimplicialParts(NamedTuple):
    """Every intermediate of one 2-simplicial attention call."""

    S: Any  # pair scores S^{ijk}
    A: Any  # pair weights A^{ijk}
    log_Z: Any  # log Z^i over pairs (-inf when no pair may be attended)
    O: Any  # output O^{ic}


def two_simplicial_decomposition(
    Q: Any,
    K1: Any,
    K2: Any,
    V1: Any,
    V2: Any,
    mask: Any = None,
    T: Any = 1.0,
    *,
    scale: float | None = None,
) -> TwoSimplicialParts:
    """S^{ijk} = Q^{ia} K1^{ja} K2^{ka}/sqrt(d_k), A = softmax_{jk}(S/T), O^{ic} = A^{ijk} V1^{jc} V2^{kc}.

    Returns :class:`TwoSimplicialParts` ``(S, A, log_Z, O)``.  ``mask``
    ("may attend the pair (j, k)") broadcasts against ``S (..., n_q, n_j,
    n_k)``.  Sizes: ``Q (..., n_q, d_k)``, ``K1 (..., n_j, d_k)``,
    ``K2 (..., n_k, d_k)``, ``V1 (..., n_j, d_v)``, ``V2 (..., n_k, d_v)``.
    """
    xp = namespace(Q, K1, K2, V1, V2, mask)
    Q, K1, K2, V1, V2 = xp.floating(*(xp.asarray(x) for x in (Q, K1, K2, V1, V2)))
    _check_triple(xp, Q, K1, K2)
    require_ndim(V1, "V1", "jc")
    require_ndim(V2, "V2", "kc")
    require_match("j", ("K1", "n_j", K1.shape[-2]), ("V1", "n_j", V1.shape[-2]))
    require_match("k", ("K2", "n_k", K2.shape[-2]), ("V2", "n_k", V2.shape[-2]))
    check_finite(xp, V1=V1, V2=V2)
    S = trilinear_scores(Q, K1, K2, scale=scale)
    A, log_Z = pair_softmax_and_log_partition(S, mask, T)
    O = two_simplicial_output(A, V1, V2)
    return TwoSimplicialParts(S, A, log_Z, O)


def two_simplicial_attention(
    Q: Any,
    K1: Any,
    K2: Any,
    V1: Any,
    V2: Any,
    mask: Any = None,
    T: Any = 1.0,
    *,
    scale: float | None = None,
) -> Any:
    """O^{ic} = softmax_{(j,k)}(Q^{ia} K1^{ja} K2^{ka} / (sqrt(d_k) T)) V1^{jc} V2^{kc}."""
    return two_simplicial_decomposition(Q, K1, K2, V1, V2, mask, T, scale=scale).O
