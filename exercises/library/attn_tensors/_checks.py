"""Input checks whose messages name the index and the sizes.

Shapes are checked always (they are static, even under ``jax.jit``); values
(temperature sign, NaN or infinity in an input) are checked when the arrays
are concrete, i.e. outside ``jit``/``vmap``/``mx.compile``.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from .backend import Backend, is_concrete, namespace

__all__ = [
    "AttentionInputError",
    "require_size",
    "require_bool_mask",
    "require_ndim",
    "require_qkv",
    "require_match",
    "require_square",
    "require_padding_mask",
    "check_temperature",
    "check_finite",
    "check_scores",
    "check_weights",
    "batch_shape",
]


class AttentionInputError(ValueError):
    """Bad input to an ``attn_tensors`` function; the message says what is wrong."""


def require_size(value: Any, name: str, minimum: int = 1) -> int:
    """A Python int >= minimum (sizes, windows and offsets are static, never traced)."""
    try:
        n = operator.index(value)
    except TypeError:
        raise AttentionInputError(
            f"{name} must be an integer; got {value!r} of type {type(value).__name__}"
        ) from None
    if n < minimum:
        raise AttentionInputError(f"{name} must be >= {minimum}; got {name}={n}")
    return n


def require_bool_mask(xp: Backend, mask: Any, name: str = "mask") -> Any:
    """The mask as a boolean backend array ("may attend" = True), or an error naming its dtype."""
    mask = xp.asarray(mask)
    if mask.dtype != xp.module.bool_:
        raise AttentionInputError(
            f"{name} must be boolean ('may attend' = True); got dtype {mask.dtype}. "
            "Build it with a comparison (e.g. lengths[..., None] > j), not 0/1 numbers."
        )
    return mask


# Position axes may be empty (no queries, no keys, no stored patterns); every
# other named axis (features a b c d e, heads h, ...) needs at least one entry.
_MAY_BE_EMPTY = frozenset(["i", "j", "k", "mu"])


def require_ndim(x: Any, name: str, indices: str, extra_ok: bool = True) -> None:
    """``x`` has at least ``len(indices)`` axes (more are leading batch axes).

    Axes of positions (``i``, ``j``, ``k``, ...) may have size 0 (an empty
    key axis is a fully masked row); a feature or head axis may not.
    """
    n = len(indices)
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) < n or (not extra_ok and len(shape) != n):
        axes = ", ".join(indices)
        want = f"at least {n}" if extra_ok else f"exactly {n}"
        raise AttentionInputError(
            f"{name} must have {want} axes ({axes}"
            + (", after any leading batch axes" if extra_ok else "")
            + f"); got shape {shape}"
        )
    for letter, size in zip(indices, shape[len(shape) - n:]):
        if size == 0 and letter not in _MAY_BE_EMPTY:
            raise AttentionInputError(
                f"{name} has an empty axis {letter} (size 0) in shape {shape}; "
                f"index {letter} needs at least one entry"
            )


def require_match(index: str, *named: tuple[str, str, int]) -> None:
    """Sizes that share an index must agree.

    ``named`` holds ``(array name, size name, size)`` triples, e.g.
    ``("K", "d_k", 4), ("Q", "d_k", 3)`` gives
    ``K has d_k=4 but Q has d_k=3 (index a must match)``.
    """
    first = named[0]
    for other in named[1:]:
        if int(other[2]) != int(first[2]):
            raise AttentionInputError(
                f"{other[0]} has {other[1]}={other[2]} but {first[0]} has "
                f"{first[1]}={first[2]} (index {index} must match)"
            )


def require_qkv(Q: Any, K: Any, V: Any = None, v_index: str = "jb") -> tuple[int, ...]:
    """Q (..., n_q, d_k), K (..., n_k, d_k), V (..., n_k, d_v): axes, index a, index j, batch axes.

    Returns the broadcast batch shape.
    """
    require_ndim(Q, "Q", "ia")
    require_ndim(K, "K", "ja")
    require_match("a", ("Q", "d_k", Q.shape[-1]), ("K", "d_k", K.shape[-1]))
    cores = [(Q, 2), (K, 2)]
    if V is not None:
        require_ndim(V, "V", v_index)
        require_match("j", ("K", "n_k", K.shape[-2]), ("V", "n_k", V.shape[-2]))
        cores.append((V, 2))
    return batch_shape(*cores)


def require_padding_mask(
    xp: Backend, mask: Any, n_k: int, batch: tuple[int, ...], fname: str
) -> Any:
    """A boolean padding mask ``(..., n_k)`` whose leading axes are batch axes of ``batch``.

    Functions that never form the scores (flash, linear attention) take one
    "may attend" flag per key.  A per-query mask ``(n_q, n_k)`` would be read
    as a batch of padding masks and change the output's shape; it is
    refused by name instead.
    """
    mask = require_bool_mask(xp, mask)
    require_ndim(mask, "mask", "j")
    require_match("j", ("K", "n_k", n_k), ("mask", "n_k", mask.shape[-1]))
    lead = tuple(mask.shape[:-1])
    fits = len(lead) <= len(batch) and all(
        m in (1, b) for m, b in zip(lead[::-1], batch[::-1])
    )
    if not fits:
        raise AttentionInputError(
            f"{fname} takes a padding mask (..., n_k) with one flag per key, whose "
            f"leading axes are the batch axes {batch} of Q, K, V; got a mask of "
            f"shape {tuple(mask.shape)}. A per-query (n_q, n_k) mask is not "
            "supported here: use causal=True, or scaled_dot_product_attention "
            "for a general mask."
        )
    return mask


def require_square(g: Any, name: str, indices: str = "ab") -> None:
    require_ndim(g, name, indices)
    n1, n2 = g.shape[-2], g.shape[-1]
    if n1 != n2:
        raise AttentionInputError(
            f"{name} must be square in its last two axes ({indices[0]}, "
            f"{indices[1]}); got {n1} x {n2}"
        )


def batch_shape(*arrays_and_core: tuple[Any, int]) -> tuple[int, ...]:
    """Broadcast the leading batch axes of several arrays, or say which clash."""
    shapes = []
    for x, core in arrays_and_core:
        shapes.append(tuple(x.shape[: x.ndim - core]))
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(ndim):
        sizes = {s[len(s) - ndim + k] for s in shapes if len(s) - ndim + k >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise AttentionInputError(
                f"leading batch axes do not broadcast: shapes {shapes}"
            )
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _values(x: Any) -> np.ndarray:
    """The values of a concrete array as NumPy.

    Going through NumPy (not the backend) keeps the check out of any JAX
    trace: a concrete array captured by a jitted function stays concrete.
    MLX's bfloat16 has no NumPy buffer format: it is read as float32.
    """
    try:
        return np.asarray(x)
    except (ValueError, TypeError):
        return np.asarray(x.astype(namespace(x).float32))


def check_temperature(T: Any, xp: Backend | None = None, like: Any = None) -> None:
    """T must be a positive finite number (when its value is known).

    With ``like`` (the scores), T must also be a normal number of their
    dtype: a float32 T of 1e-40 is subnormal, and flushed to 0 by the CPU.
    """
    if isinstance(T, (int, float)):
        bad = not (T > 0) or math.isinf(T) or math.isnan(T)
        value = T
    elif is_concrete(T):
        arr = _values(T)
        bad = bool(np.any(~(arr > 0)) or np.any(~np.isfinite(arr)))
        value = arr
    else:
        return
    if bad:
        raise AttentionInputError(
            f"temperature T must be positive and finite; got T={value}. "
            "For the limits use zero_temperature_limit (T -> 0, argmax) or "
            "infinite_temperature_limit (T -> inf, uniform)."
        )
    dtype = getattr(like, "dtype", None)
    if dtype is None:
        return
    try:
        info = np.finfo(np.dtype(str(dtype).replace("mlx.core.", "")))
    except (TypeError, ValueError):  # pragma: no cover - a dtype NumPy does not know
        return
    arr = np.asarray(value, dtype=np.float64)
    if np.any(arr < float(info.tiny)) or np.any(arr > float(info.max)):
        raise AttentionInputError(
            f"temperature T={value} is outside the normal range of {dtype} "
            f"({info.tiny:.3g} to {info.max:.3g}); use float64 scores, or "
            "zero_temperature_limit / infinite_temperature_limit"
        )
    if not is_concrete(like) or like.size == 0:
        return
    S = np.abs(_values(like).astype(np.float64))
    S_max = float(np.max(S, where=np.isfinite(S), initial=0.0))
    if S_max / float(np.min(arr)) > float(info.max):
        raise AttentionInputError(
            f"scores divided by the temperature overflow {dtype}: max |S| = "
            f"{S_max:.3g} and T = {float(np.min(arr)):.3g} give |S/T| > "
            f"{info.max:.3g}; use float64, or zero_temperature_limit for T -> 0"
        )


def _concrete(arrays: dict[str, Any]):
    """(name, NumPy values) of the concrete arrays among ``arrays``."""
    for name, x in arrays.items():
        if x is None or not hasattr(x, "shape") or not is_concrete(x):
            continue
        values = _values(x)
        if values.dtype.kind in "biu":
            continue
        yield name, values.astype(np.float64) if values.dtype.kind == "V" else values


def check_finite(xp: Backend, **arrays: Any) -> None:
    """No NaN or infinity in concrete inputs (named in the message)."""
    for name, values in _concrete(arrays):
        if not np.all(np.isfinite(values)):
            n_bad = int(np.sum(~np.isfinite(values)))
            raise AttentionInputError(
                f"{name} contains {n_bad} NaN or infinite value(s); "
                "attention needs finite inputs (use a mask to exclude keys)"
            )


def check_scores(xp: Backend, **arrays: Any) -> None:
    """Scores: no NaN and no +inf; -inf is allowed and means "may not attend" (a masked key)."""
    for name, values in _concrete(arrays):
        bad = np.isnan(values) | (values == np.inf)
        if np.any(bad):
            raise AttentionInputError(
                f"{name} contains {int(np.sum(bad))} NaN or +inf value(s); scores "
                "must be finite or -inf (-inf means 'may not attend', like a "
                "False in the mask)"
            )


def check_weights(xp: Backend, **arrays: Any) -> None:
    """Weights and distributions: finite and non-negative."""
    check_finite(xp, **arrays)
    for name, values in _concrete(arrays):
        if np.any(values < 0):
            raise AttentionInputError(
                f"{name} contains {int(np.sum(values < 0))} negative value(s); "
                "weights must be non-negative (a distribution over the keys j)"
            )
