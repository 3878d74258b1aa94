"""Arrays <-> JSON, the only format between the trusted side and a worker.

No pickle anywhere: a value is a number, a bool, a string, None, a list or
dict of values, or an array ``{"__array__": dtype, "shape": [...], "data":
[...]}`` whose data are numbers (``"inf"``, ``"-inf"``, ``"nan"`` as strings,
because JSON has no literals for them).  Float64 round-trips exactly through
``repr``.  Anything else is refused with a message naming what was found.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

# the worker's words where a submission's code cannot be imported (the scoring recognises them)
PACKAGE_DOES_NOT_IMPORT = "the package does not import"
CANNOT_IMPORT = "cannot import attn_tensors."  # followed by the exercise's module.function
TAMPERED = ("not graded: the package changed code it does not own (the course's probes, or JAX's, "
            "NumPy's or MLX's own functions), which can make a wrong answer look right")
"""A ``tampered`` case's words (:mod:`attn_course.tamper`); a check follows them with what changed."""


class NotPlainValue(TypeError):
    """What a submission's function returned is not a plain array of numbers (a list, a string, an
    object): the case's outcome is ``bad_value``, whoever finds it (the worker reading a result,
    an exercise's probe reading one)."""

ALLOWED_DTYPES = {"bool", "int32", "int64", "float16", "float32", "float64"}
_SPECIAL = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class ValueFormatError(ValueError):
    """A value that is not plain data (or an array of an unsupported kind)."""


def _num(x: float) -> Any:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def encode(value: Any) -> Any:
    """A JSON-ready form of plain data with NumPy arrays."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.bool_):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return {"__float__": _num(float(value))}
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        dtype = str(value.dtype)
        if dtype not in ALLOWED_DTYPES:
            raise ValueFormatError(f"arrays of dtype {dtype} are not plain data")
        flat = value.ravel().tolist()
        if value.dtype.kind == "f":
            flat = [_num(x) for x in flat]
        return {"__array__": dtype, "shape": list(value.shape), "data": flat}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    raise ValueFormatError(f"a {type(value).__name__} is not plain data")


def decode(obj: Any) -> Any:
    """The inverse of :func:`encode`; refuses anything it did not produce."""
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        return obj
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        if "__float__" in obj:
            v = obj["__float__"]
            return float(_SPECIAL.get(v, v)) if isinstance(v, (str, int, float)) else _bad(obj)
        if "__array__" in obj:
            dtype = obj["__array__"]
            if dtype not in ALLOWED_DTYPES:
                raise ValueFormatError(f"arrays of dtype {dtype!r} are not plain data")
            shape = obj.get("shape")
            data = obj.get("data")
            if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
                raise ValueFormatError(f"bad array shape {shape!r}")
            if not isinstance(data, list) or len(data) != int(np.prod(shape, dtype=np.int64)):
                raise ValueFormatError("array data do not match the shape")
            if any(not isinstance(x, (int, float, bool, str)) for x in data):
                raise ValueFormatError("array data must be numbers")
            try:
                vals = [_SPECIAL[x] if isinstance(x, str) else x for x in data]
            except KeyError as err:
                raise ValueFormatError(f"array data must be numbers, got {err.args[0]!r}") from None
            return np.asarray(vals, dtype=dtype).reshape(shape)
        return {k: decode(v) for k, v in obj.items()}
    return _bad(obj)


def _bad(obj: Any) -> Any:
    raise ValueFormatError(f"not plain data: {str(obj)[:80]}")


def dumps(value: Any) -> str:
    return json.dumps(encode(value), separators=(",", ":"), allow_nan=False)


def loads(text: str) -> Any:
    return decode(json.loads(text))
