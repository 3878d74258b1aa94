"""Part VII, Attention Variants: masks that say which keys a query may attend.

One convention everywhere in the library: a mask is **boolean**, True means
*may attend*, and it broadcasts against the scores ``S (..., n_q, n_k)``:

    M^{ij} = 1  query i may look at key j,        M^{ij} = 0  it may not.

The tutorial writes the masked scores as S^{ij} + (1 - M^{ij})(-inf).  Read
literally that multiplies 0 by inf (NaN) for every allowed pair, so this
module never does it: :func:`mask_to_bias` selects 0 or -inf with ``where``,
and the softmax of :mod:`attn_tensors.softmax` takes the boolean mask itself.

Positions.  Queries and keys are numbered from 0.  When a block of ``n_q``
queries attends to ``n_k`` keys (decoding with a cache: the keys are the
whole prefix, the queries its last ``n_q`` tokens), query ``i`` sits at key
position ``i + offset``.  The default ``offset = n_k - n_q`` lines the last
query up with the last key; with ``n_q = n_k`` it is 0, the square case of
the book.  With ``n_k < n_q`` the default offset is negative and the first
``n_q - n_k`` queries come before every key: causal masks leave them fully
masked (weights 0, output 0, see :func:`fully_masked_rows`).

=========================  ===============================================
function                   mask
=========================  ===============================================
``causal_mask``            M^{ij} = [j <= i + offset]
``padding_mask``           M^{bij} = [j < length^b]  (shape (..., 1, n_k))
``sliding_window_mask``    causal: i + offset - w < j <= i + offset;
                           symmetric: |i + offset - j| <= w
``combine_masks``          M^{ij} = M_1^{ij} and M_2^{ij} and ...
``mask_to_bias``           B^{ij} = 0 if M^{ij} else -inf
``fully_masked_rows``      [n^i = 0],  n^i = sum_j M^{ij}
=========================  ===============================================

Masks built from sizes alone are JAX arrays unless ``like=`` is an MLX
array; masks built from arrays follow those arrays' backend.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ._checks import AttentionInputError, require_bool_mask, require_size
from .backend import Backend, is_concrete, namespace, namespace_for

__all__ = [
    "causal_mask",
    "padding_mask",
    "sliding_window_mask",
    "combine_masks",
    "mask_to_bias",
    "fully_masked_rows",
]


# -- small validators -------------------------------------------------------
def _positions(xp: Backend, n_q: int, n_k: int, offset: int) -> tuple[Any, Any]:
    """Key positions of the queries, shape (n_q, 1), and of the keys, (1, n_k)."""
    i = xp.arange(n_q)[:, None] + offset  # query i sits at key position i + offset
    j = xp.arange(n_k)[None, :]
    return i, j


def _offset(n_q: int, n_k: int, offset: Any) -> int:
    if offset is None:
        return n_k - n_q
    try:
        return operator.index(offset)
    except TypeError:
        raise AttentionInputError(
            f"offset must be an integer (the key position of query 0); got {offset!r}"
        ) from None


# -- masks from sizes -------------------------------------------------------
def causal_mask(
    n_q: int, n_k: int | None = None, *, offset: int | None = None, like: Any = None
) -> Any:
    """M^{ij} = [j <= i + offset]: query i sees keys up to its own position.

    ``n_k`` defaults to ``n_q`` and ``offset`` to ``n_k - n_q`` (the last
    query lines up with the last key; 0 for a square mask, which is then
    lower triangular).  Returns a boolean ``(n_q, n_k)`` array, MLX when
    ``like`` is an MLX array, JAX otherwise.
    """
    ### BEGIN SOLUTION 7.1
    n_q = require_size(n_q, "n_q")
    n_k = n_q if n_k is None else require_size(n_k, "n_k")
    offset = _offset(n_q, n_k, offset)
    xp = namespace_for(like)
    i, j = _positions(xp, n_q, n_k, offset)
    # M^{ij} = [j <= i + offset]
    return j <= i
    ### END SOLUTION


def sliding_window_mask(
    n_q: int,
    n_k: int | None = None,
    *,
    window: int,
    causal: bool = True,
    offset: int | None = None,
    like: Any = None,
) -> Any:
    """M^{ij} = [p - w < j <= p] (causal) or [|p - j| <= w] (symmetric), p = i + offset.

    * ``causal=True``: query ``i`` sees the ``w = window`` most recent keys,
      itself included (keys ``p - w + 1, ..., p``); ``window >= 1``.  With
      ``window >= n_k + max(offset, 0)`` it equals :func:`causal_mask`.
    * ``causal=False``: query ``i`` sees every key within distance ``w`` on
      both sides, ``2w + 1`` keys away from the edges; ``window >= 0``
      (``window=0``: each query sees only its own position).

    ``window`` is keyword-only (a required argument after the optional
    ``n_k``).  ``n_k`` and ``offset`` default as in :func:`causal_mask`.
    """
    n_q = require_size(n_q, "n_q")
    n_k = n_q if n_k is None else require_size(n_k, "n_k")
    offset = _offset(n_q, n_k, offset)
    ### BEGIN SOLUTION 7.2
    window = require_size(window, "window", minimum=1 if causal else 0)
    xp = namespace_for(like)
    p, j = _positions(xp, n_q, n_k, offset)
    if causal:
        # M^{ij} = [p - w < j <= p]
        return xp.logical_and(j <= p, j > p - window)
    # M^{ij} = [|p - j| <= w]
    return xp.abs(p - j) <= window
    ### END SOLUTION


def padding_mask(
    lengths: Any, n_k: int | None = None, n_q: int | None = None, *, like: Any = None
) -> Any:
    """M^{bij} = [j < length^b]: keys past each sequence's length are padding.

    ``lengths`` is either

    * integer lengths of shape ``(...,)`` (a Python int for one sequence);
      ``n_k`` is then required and every length must lie in ``0..n_k``, or
    * a boolean key-valid array of shape ``(..., n_k)`` (True = a real key,
      anywhere in the sequence, not only a prefix); ``n_k`` may be left out.

    Returns a boolean mask of shape ``(..., 1, n_k)`` that broadcasts over the
    queries, or ``(..., n_q, n_k)`` when ``n_q`` is given.  For multi-head
    scores ``(..., H, n_q, n_k)`` insert the head axis yourself:
    ``padding_mask(lengths, n_k)[..., None, :, :]``.
    """
    xp = namespace(lengths, like)
    arr = xp.asarray(lengths)
    if arr.dtype == xp.module.bool_:
        if arr.ndim == 0:
            raise AttentionInputError(
                "a boolean key-valid array needs a key axis j; got a 0-d boolean"
            )
        n_valid = arr.shape[-1]
        if n_k is not None and require_size(n_k, "n_k") != n_valid:
            raise AttentionInputError(
                f"valid has n_k={n_valid} but n_k={n_k} was given "
                "(index j must match)"
            )
        n_k = n_valid
        # M^{bij} = valid^{bj}, broadcast over i
        mask = arr[..., None, :]
    else:
        if not xp.issubdtype(arr.dtype, xp.module.integer):
            raise AttentionInputError(
                f"lengths must be integers (or a boolean key-valid array); got dtype "
                f"{arr.dtype}"
            )
        if n_k is None:
            raise AttentionInputError(
                "padding_mask from lengths needs n_k, the number of keys"
            )
        n_k = require_size(n_k, "n_k")
        if is_concrete(arr):
            lo, hi = int(xp.min(arr).item()), int(xp.max(arr).item())
            if lo < 0 or hi > n_k:
                bad = lo if lo < 0 else hi
                raise AttentionInputError(
                    f"lengths must lie in 0..n_k={n_k} (index j runs over n_k={n_k} "
                    f"keys); got a length of {bad}"
                )
        j = xp.arange(n_k)
        # M^{bij} = [j < length^b], broadcast over i
        mask = j < arr[..., None, None]
    if n_q is not None:
        n_q = require_size(n_q, "n_q")
        mask = xp.broadcast_to(mask, tuple(mask.shape[:-2]) + (n_q, n_k))
    return mask


# -- operations on masks ----------------------------------------------------
def combine_masks(*masks: Any) -> Any:
    """M^{ij} = M_1^{ij} and M_2^{ij} and ...: a key is allowed when every mask allows it.

    The masks broadcast against each other (a causal ``(n_q, n_k)`` mask and
    a padding ``(batch, 1, n_k)`` mask give ``(batch, n_q, n_k)``).  ``None``
    entries mean "no mask" and are skipped; with no masks left the result is
    ``None`` (attend everywhere), which every function of the library accepts.
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    xp = namespace(*present)
    arrays = [require_bool_mask(xp, m, f"mask {k}") for k, m in enumerate(present)]
    try:
        np.broadcast_shapes(*(tuple(m.shape) for m in arrays))
    except ValueError:
        shapes = ", ".join(str(tuple(m.shape)) for m in arrays)
        raise AttentionInputError(
            f"masks do not broadcast against each other: shapes {shapes} "
            "(last axis is the key index j, the one before the query index i)"
        ) from None
    out = arrays[0]
    for m in arrays[1:]:
        out = xp.logical_and(out, m)
    return out


def mask_to_bias(mask: Any, dtype: Any = None) -> Any:
    """B^{ij} = 0 where M^{ij}, -inf where not: S^{ij} + B^{ij} is the masked score.

    This is the tutorial's ``S + (1 - M)(-inf)`` without ever forming
    ``0 * inf``: each entry is chosen, not multiplied.  ``dtype`` defaults to
    the backend's default float (float64 under ``jax_enable_x64``, float32 on
    MLX).  The softmax of :mod:`attn_tensors.softmax` gives the same weights
    for ``softmax(S + B)`` and ``softmax(S, mask)``, fully masked rows included.
    """
    xp = namespace(mask)
    mask = require_bool_mask(xp, mask)
    dtype = xp.result_float(mask) if dtype is None else dtype
    zero = xp.asarray(0.0, dtype=dtype)
    neg_inf = xp.asarray(-float("inf"), dtype=dtype)
    # B^{ij} = 0 if M^{ij} else -inf
    return xp.where(mask, zero, neg_inf)


def fully_masked_rows(mask: Any) -> Any:
    """[n^i = 0] with n^i = sum_j M^{ij}: the queries that may attend to no key at all.

    Reduces the last (key) axis: a mask ``(..., n_q, n_k)`` gives a boolean
    ``(..., n_q)``.  Those rows get weights 0, output 0 and log Z = -inf in
    the library's softmax (never NaN).
    """
    xp = namespace(mask)
    mask = require_bool_mask(xp, mask)
    if mask.ndim < 1:
        raise AttentionInputError(
            f"mask must have a key axis j; got shape {tuple(mask.shape)}"
        )
    # [n^i = 0]: no key j with M^{ij}
    return xp.logical_not(xp.any(mask, axis=-1))
