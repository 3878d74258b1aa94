"""Mistakes of chapter 7, Attention Variants: exercises 7.1-7.5."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from attn_tensors import masking, variants

from . import mistake

MISTAKES: list = []


def _sizes(n_q, n_k, offset):
    n_k = n_q if n_k is None else n_k
    if offset is not None and not isinstance(offset, (int, np.integer)):
        raise TypeError("offset must be an integer")
    return int(n_q), int(n_k), (n_k - n_q if offset is None else int(offset))


# -- 7.1 causal_mask -------------------------------------------------------------------------------


def _causal(n_q, n_k, offset, rule):
    n_q, n_k, offset = _sizes(n_q, n_k, offset)
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    return jnp.asarray(rule(i, j, offset))


@mistake("7.1", "offset-ignored", "def-variants-causal",
         "You built a lower-triangular mask (tril), which lines up query i with key i: with "
         "n_q ≠ n_k or an offset, query i sits at key position i + offset, "
         "M^{ij} = [j ≤ i + offset] (by default offset = n_k − n_q).")
def _causal_tril(n_q, n_k=None, *, offset=None, like=None):
    return _causal(n_q, n_k, offset, lambda i, j, o: j <= i)


@mistake("7.1", "strict", "def-variants-causal",
         "Your mask is off by one: a query may attend to its own position, M^{ij} = "
         "[j ≤ i + offset], not j < i + offset.")
def _causal_strict(n_q, n_k=None, *, offset=None, like=None):
    return _causal(n_q, n_k, offset, lambda i, j, o: j < i + o)


@mistake("7.1", "offset-sign", "def-variants-causal",
         "You subtracted the offset: query i sits at key position i + offset, so "
         "M^{ij} = [j ≤ i + offset].")
def _causal_minus(n_q, n_k=None, *, offset=None, like=None):
    return _causal(n_q, n_k, offset, lambda i, j, o: j <= i - o)


@mistake("7.1", "float-mask", "def-attention-mask",
         "Your mask holds numbers (0/1) instead of booleans: a mask is True where a query may "
         "attend and must have a boolean dtype.")
def _causal_float(n_q, n_k=None, *, offset=None, like=None):
    return masking.causal_mask(n_q, n_k, offset=offset).astype(jnp.float32)


# -- 7.2 sliding_window_mask ------------------------------------------------------------------------


def _window(n_q, n_k, window, causal, offset, rule):
    n_q, n_k, offset = _sizes(n_q, n_k, offset)
    p = np.arange(n_q)[:, None] + offset
    j = np.arange(n_k)[None, :]
    return jnp.asarray(rule(p, j, int(window), causal))


def _window_mistake(key, label, message, rule):
    @mistake("7.2", key, label, message)
    def wrong(n_q, n_k=None, *, window, causal=True, offset=None, like=None):
        return _window(n_q, n_k, window, causal, offset, rule)

    wrong.__name__ = f"window_{key.replace('-', '_')}"
    return wrong


def _right(p, j, w, causal):
    return (j <= p) & (j > p - w) if causal else np.abs(p - j) <= w


_window_mistake("one-too-many", "def-variants-masks",
                "Your causal window keeps w + 1 keys: it is the w most recent, "
                "p − w < j ≤ p (strictly greater on the left).",
                lambda p, j, w, c: ((j <= p) & (j >= p - w)) if c else _right(p, j, w, c))
_window_mistake("symmetric-strict", "def-variants-masks",
                "Your symmetric window is one too narrow: it keeps the keys with |p − j| ≤ w, "
                "the bound included.",
                lambda p, j, w, c: _right(p, j, w, c) if c else np.abs(p - j) < w)
_window_mistake("offset-ignored", "def-variants-masks",
                "You centred the window on key i instead of on the query's position p = i + "
                "offset (by default offset = n_k − n_q).",
                lambda p, j, w, c: _right(p - (p[0, 0]), j, w, c))


# -- 7.3 relative_position_scores --------------------------------------------------------------------


def _relative(Q, K, R, max_distance, scale, *, reverse=False, scale_content_only=False,
              unscaled=False):
    n_q, n_k, d_k = Q.shape[-2], K.shape[-2], Q.shape[-1]
    diff = np.arange(n_q)[:, None] - np.arange(n_k)[None, :]
    if reverse:
        diff = -diff
    if max_distance is None:
        idx = diff + (n_k - 1 if not reverse else n_q - 1)
    else:
        idx = np.clip(diff, -max_distance, max_distance) + max_distance
    content = jnp.einsum("...ia,...ja->...ij", Q, K)
    P = jnp.einsum("...ia,...ra->...ir", Q, R)
    index = jnp.broadcast_to(jnp.asarray(idx), P.shape[:-1] + (n_k,))
    position = jnp.take_along_axis(P, index, axis=-1)
    c = 1.0 if unscaled else (1.0 / math.sqrt(d_k) if scale is None else scale)
    return content * c + position if scale_content_only else (content + position) * c


@mistake("7.3", "offset-reversed", "def-variants-relative",
         "You indexed the table by j − i: row r(i, j) = (i − j) + (n_k − 1) belongs to the "
         "offset i − j of the query from the key (clipped to ±max_distance).")
def _relative_reversed(Q, K, R, *, max_distance=None, scale=None):
    return _relative(Q, K, R, max_distance, scale, reverse=True)


@mistake("7.3", "missing-scale", "def-variants-relative",
         "Your scores are √d_k times too large: both terms, content and position, are scaled "
         "by 1/√d_k (or the given scale).")
def _relative_unscaled(Q, K, R, *, max_distance=None, scale=None):
    return _relative(Q, K, R, max_distance, scale, unscaled=True)


@mistake("7.3", "position-unscaled", "def-variants-relative",
         "You scaled only the content term: the scale multiplies the sum, "
         "(Q^{ia} K^{ja} + Q^{ia} R^{r(i,j) a}) × scale.")
def _relative_half_scaled(Q, K, R, *, max_distance=None, scale=None):
    return _relative(Q, K, R, max_distance, scale, scale_content_only=True)


# -- 7.4 alibi_slopes -------------------------------------------------------------------------------


def _dtype(like, dtype):
    if dtype is not None:
        return np.dtype(dtype)
    return np.dtype(like.dtype) if like is not None else np.dtype(np.float64)


@mistake("7.4", "geometric-for-all", "def-variants-alibi",
         "You used m_h = 2^(−8h/n) for every n: that holds when n is a power of two; otherwise "
         "take the slopes of the power of two n₀ below n, then every other slope of 2n₀.")
def _alibi_geometric(n_heads, *, like=None, dtype=None):
    n = int(n_heads)
    return jnp.asarray([2.0 ** (-8.0 * h / n) for h in range(1, n + 1)], dtype=_dtype(like, dtype))


@mistake("7.4", "next-power-truncated", "def-variants-alibi",
         "You took the first n slopes of the next power of two: for n not a power of two the "
         "rule is the n₀ slopes of the power of two below n, then the odd-numbered slopes of 2n₀.")
def _alibi_truncated(n_heads, *, like=None, dtype=None):
    n = int(n_heads)
    p = 1 << max(0, (n - 1).bit_length())
    return jnp.asarray([2.0 ** (-8.0 * h / p) for h in range(1, n + 1)], dtype=_dtype(like, dtype))


@mistake("7.4", "dtype-ignored", "def-variants-alibi",
         "Your slopes are right but always float64: return them in the requested dtype (or "
         "that of like).")
def _alibi_float64(n_heads, *, like=None, dtype=None):
    return variants.alibi_slopes(n_heads, dtype="float64")


# -- 7.5 trilinear_scores -----------------------------------------------------------------------------


@mistake("7.5", "missing-scale", "def-variants-simplicial",
         "Your scores are √d_k times too large: S^{ijk} = Q^{ia} K1^{ja} K2^{ka} / √d_k.")
def _trilinear_unscaled(Q, K1, K2, *, scale=None):
    return variants.trilinear_scores(Q, K1, K2, scale=1.0 if scale is None else scale)


@mistake("7.5", "divided-by-d", "def-variants-simplicial",
         "You divided by d_k instead of √d_k: your scores are √d_k times too small.")
def _trilinear_by_d(Q, K1, K2, *, scale=None):
    return variants.trilinear_scores(Q, K1, K2, scale=1.0 / Q.shape[-1] if scale is None else scale)


@mistake("7.5", "key-axes-swapped", "def-variants-simplicial",
         "Your key axes are swapped: S^{ijk} has the first key's index j before the second's k, "
         "shape (..., n_q, n_j, n_k).")
def _trilinear_swapped(Q, K1, K2, *, scale=None):
    return jnp.swapaxes(variants.trilinear_scores(Q, K1, K2, scale=scale), -1, -2)
