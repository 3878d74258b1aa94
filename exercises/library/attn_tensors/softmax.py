"""The stable, masked softmax every other module uses.

Conventions (the same in every function of the library):

* The softmax runs over the last axis, the key index ``j``; any leading axes
  (batch, head, query ``i``) are carried along.
* A mask is boolean and means **may attend**: ``mask[..., i, j]`` is True when
  query ``i`` may look at key ``j``.  It broadcasts against the scores, so a
  padding mask of shape ``(n_k,)`` or ``(batch, 1, n_k)`` works as is.
* A **fully masked row** (a query that may attend to nothing) has weights all
  zero, output zero, log-partition ``-inf`` and entropy zero.  No NaN appears,
  in the forward pass or in gradients.
* A score of ``-inf`` means "may not attend", exactly like a False in the
  mask (``softmax(S + mask_to_bias(M)) == softmax(S, M)``); NaN or ``+inf``
  scores raise :class:`AttentionInputError` (when the values are concrete).
* A row with no keys at all (``n_k = 0``) is a fully masked row.
* The maximum is subtracted before ``exp``: scores of +-1e4 in float32 give
  finite weights.  The partition function ``Z`` itself is never formed; its
  logarithm is computed by log-sum-exp.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._checks import AttentionInputError, check_scores, check_temperature, require_bool_mask
from .backend import Backend, namespace

__all__ = ["softmax", "log_partition", "softmax_and_log_partition", "apply_mask"]


def _mask_array(xp: Backend, mask: Any, S: Any) -> Any:
    if mask is None:
        return None
    mask = require_bool_mask(xp, mask)
    try:
        np.broadcast_shapes(tuple(mask.shape), tuple(S.shape))
    except (ValueError, TypeError) as err:
        raise AttentionInputError(
            f"mask of shape {tuple(mask.shape)} does not broadcast against the "
            f"scores of shape {tuple(S.shape)} (last axis is the key index j, "
            f"n_k={S.shape[-1]})"
        ) from err
    return mask


def apply_mask(S: Any, mask: Any = None) -> Any:
    """S^{ij} <- S^{ij} where mask^{ij}, else -inf (keys that may not be attended)."""
    xp = namespace(S, mask)
    mask = _mask_array(xp, mask, S)
    if mask is None:
        return S
    return xp.where(mask, S, xp.scalar(-float("inf"), S))


def softmax_and_log_partition(
    S: Any, mask: Any = None, T: Any = 1.0, xp: Backend | None = None
) -> tuple[Any, Any]:
    """A^{ij} = exp(S^{ij}/T - log Z^i),  log Z^i = log sum_j exp(S^{ij}/T).

    Returns ``(A, log_Z)`` with ``A`` shaped like ``S`` and ``log_Z`` without
    the key axis.  Masked keys get weight exactly 0; fully masked rows get
    ``A = 0`` and ``log_Z = -inf``.
    """
    xp = xp or namespace(S, mask)
    (S,) = xp.floating(xp.asarray(S))
    check_scores(xp, S=S)
    check_temperature(T, xp, S)
    mask = _mask_array(xp, mask, S)
    raise NotImplementedError('Exercise 2.2: implement softmax_and_log_partition (Stable masked softmax and log-partition); run `attn-course check 2.2`')


def softmax(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """A^{ij} = exp(S^{ij}/T) / sum_k exp(S^{ik}/T), over the keys that may be attended."""
    return softmax_and_log_partition(S, mask, T)[0]


def log_partition(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """log Z^i = log sum_j exp(S^{ij}/T) by log-sum-exp (-inf for a fully masked row)."""
    return softmax_and_log_partition(S, mask, T)[1]
