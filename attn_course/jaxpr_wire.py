"""A submission's traced JAX functions as plain data, and their evaluation elsewhere.

A job's process runs the submission's code; whatever it changes in JAX there
(a derivative rule swapped and put back within one call, an entry of JAX's
caches made with it: red team, round 18) acts on every derivative taken in
that process, and no check of that process can see a change that was undone
before it looked.  So a job only *traces* the submission's functions (their
primal programs, :func:`jax.make_jaxpr`), and a process that never ran any
of the submission's code differentiates, compiles and runs them
(:mod:`attn_course.replay`).  This module is the format between the two:

- :func:`encode` (in the job): a closed jaxpr as JSON-ready data -- its
  equations by primitive name, their parameters as plain values (numbers,
  tuples, dtypes, the enums and named tuples of ``jax.lax``), constants as
  raw bytes, and the sub-programs of control flow and of custom derivative
  rules (traced there too: a rule the submission wrote is part of its
  function, as it would be anywhere);
- :func:`program` (in the evaluating process): that data back as a function
  that binds each equation's primitive, looked up by name among
  ``jax.lax``'s own (:func:`primitives`), with the parameters decoded from
  plain values only.  Nothing in the data is ever called, imported or
  unpickled; a host callback (``jax.pure_callback``) cannot be carried and
  is refused when the job traces it.

The format is read by the evaluating process only, and is checked as it is
read: an unknown primitive, a parameter of an unknown kind, a reference to
a variable not yet defined, or an equation whose outputs are not of the
shapes and dtypes the data says raises :class:`WireError`.
"""

from __future__ import annotations

import base64
import enum
import functools
import json
from typing import Any, Callable

import numpy as np

VERSION = 1
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "float0")
ARGUMENT = "_attn_course_argument_"  # the name of a call of a function the probe passed (attn_course.replay)
MAX_EQUATIONS = 200_000  # in one job's programs together
MAX_CONST_BYTES = 64 << 20
# primitives that carry no data and act on none: dropped where traced
DROPPED = frozenset({"debug_callback", "debug_print"})
# equations whose sub-programs are run by a handler of this module's (the rest take plain parameters)
NESTED = frozenset({"jit", "pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint", "scan", "while", "cond",
                    "custom_jvp_call", "custom_vjp_call", "custom_linear_solve"})
SCATTERS = frozenset({"scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter-min",
                      "scatter_min", "scatter-max", "scatter_max", "scatter-sub", "scatter_sub"})
# parameters that say where an array lives (one device here): carried as None
PLACEMENT = frozenset({"sharding", "out_sharding", "in_shardings", "out_shardings", "ctx_mesh",
                       "in_layouts", "out_layouts", "donated_invars", "compiler_options_kvs"})


class WireError(ValueError):
    """Data that is not a program of this format (or one this process cannot run)."""


class Unstageable(TypeError):
    """What the job traced cannot be carried (a host callback, an object as a parameter)."""


# -- the classes a parameter may be (the same on both sides) ---------------------------------------


def _classes() -> dict[str, type]:
    from jax import lax
    from jax._src.lax import convolution, slicing
    from jax._src.lax import lax as lax_internal

    found = {"GatherDimensionNumbers": slicing.GatherDimensionNumbers,
             "ScatterDimensionNumbers": slicing.ScatterDimensionNumbers,
             "GatherScatterMode": slicing.GatherScatterMode,
             "ConvDimensionNumbers": convolution.ConvDimensionNumbers,
             "Precision": lax.Precision,
             "RoundingMethod": lax_internal.RoundingMethod}
    for name in ("DotAlgorithmPreset", "AccuracyMode"):
        if hasattr(lax_internal, name):
            found[name] = getattr(lax_internal, name)
    return found


classes = functools.cache(_classes)


# -- encoding (in the job) -------------------------------------------------------------------------


def _aval(a: Any) -> list:
    return [list(map(int, a.shape)), str(a.dtype), bool(getattr(a, "weak_type", False))]


class Encoder:
    """Closed jaxprs and their constants into one table each, each jaxpr once (by identity:
    ``jax.numpy``'s functions reuse the jaxpr of a shape)."""

    def __init__(self) -> None:
        self.jaxprs: list[dict] = []
        self.consts: list[dict] = []
        self._jaxpr_ids: dict[tuple, int] = {}
        self._contents: dict[str, int] = {}
        self._in_rule = 0  # within a custom rule's programs: a custom call there is its primal only
        self._const_ids: dict[int, int] = {}
        self._keep: list[Any] = []  # what the identities above name stays alive
        self.arguments: dict[str, dict] = {}  # jit's names of the calls of the probe's functions
        self.equations = 0
        self.const_bytes = 0

    def data(self) -> dict:
        return {"version": VERSION, "jaxprs": self.jaxprs, "consts": self.consts}

    def const(self, value: Any) -> int:
        key = id(value)
        if key in self._const_ids:
            return self._const_ids[key]
        arr = np.asarray(value)
        dtype = str(arr.dtype)
        if dtype not in DTYPES or arr.dtype.kind not in "biufc" and dtype != "float0":
            raise Unstageable(f"a constant of dtype {dtype} (not an array of numbers)")
        if dtype == "float0":
            raw = b""
        else:
            raw = np.ascontiguousarray(arr).tobytes()
        self.const_bytes += len(raw)
        if self.const_bytes > MAX_CONST_BYTES:
            raise Unstageable(f"constants of more than {MAX_CONST_BYTES >> 20} MB")
        self._keep.append(value)
        self._const_ids[key] = len(self.consts)
        self.consts.append({"dtype": dtype, "shape": list(map(int, arr.shape)),
                            "data": base64.b64encode(raw).decode("ascii")})
        return self._const_ids[key]

    def closed(self, closed: Any) -> int:
        """A ``ClosedJaxpr``'s index in the table."""
        key = (id(closed), self._in_rule > 0)
        if key in self._jaxpr_ids:
            return self._jaxpr_ids[key]
        index = self._jaxpr(closed.jaxpr, closed.consts)
        self._keep.append(closed)
        self._jaxpr_ids[key] = index
        return index

    def open(self, jaxpr: Any, consts: list) -> int:
        """A ``Jaxpr`` with constants of its own (a custom rule's, as JAX traces it)."""
        return self._jaxpr(jaxpr, consts)

    def _jaxpr(self, jaxpr: Any, consts: list) -> int:
        from jax._src import core

        names: dict[Any, int] = {}

        def define(v: Any) -> int:
            if isinstance(v, core.DropVar):
                return -1
            names[v] = len(names)
            return names[v]

        def ref(v: Any) -> Any:
            if isinstance(v, core.Literal):
                return {"lit": self.const(v.val), "aval": _aval(v.aval)}
            return names[v]

        constvars = [define(v) for v in jaxpr.constvars]
        invars = [define(v) for v in jaxpr.invars]
        eqns = []
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name in DROPPED:
                continue
            self.equations += 1
            if self.equations > MAX_EQUATIONS:
                raise Unstageable(f"programs of more than {MAX_EQUATIONS} operations")
            name, params = self._params(name, eqn)
            ins = [ref(v) for v in eqn.invars]
            outs = [define(v) for v in eqn.outvars]
            eqns.append([name, ins, outs, params, [_aval(v.aval) for v in eqn.outvars]])
        out = {"const_vars": constvars, "consts": [self.const(c) for c in consts], "in": invars,
               "in_avals": [_aval(v.aval) for v in jaxpr.invars], "eqns": eqns,
               "out": [ref(v) for v in jaxpr.outvars]}
        key = json.dumps(out, sort_keys=True, default=str)  # (two traces of one content: one program)
        if key not in self._contents:
            self._contents[key] = len(self.jaxprs)
            self.jaxprs.append(out)
        return self._contents[key]

    def _params(self, name: str, eqn: Any) -> tuple[str, dict]:
        """The equation's name and parameters as data."""
        p = eqn.params
        if name in ("custom_jvp_call", "custom_vjp_call") and self._in_rule:
            # a custom function called by a custom rule: the rule is run, not differentiated (a
            # first derivative), so the primal is all it needs -- and a rule may call its own
            # function (jnp.sinc's: a tower of rules without end)
            return "closed_call", {"jaxpr": self.closed(p["call_jaxpr"])}
        return name, self._plain_params(name, eqn)

    def _plain_params(self, name: str, eqn: Any) -> dict:
        p = eqn.params
        marked = self.arguments.get(p.get("name")) if name in ("jit", "pjit") else None
        if marked is not None and marked["n"] == [len(eqn.invars), len(eqn.outvars)]:
            return {k: v for k, v in marked.items() if k != "n"}  # (not a transform of the call: the call)
        if name in ("jit", "pjit", "closed_call", "core_call"):
            return {"jaxpr": self.closed(_as_closed(p.get("jaxpr", p.get("call_jaxpr"))))}
        if name in ("remat", "remat2", "checkpoint"):  # (the same values and derivative, computed again or not)
            return {"jaxpr": self.closed(_as_closed(p["jaxpr"]))}
        if name == "scan":
            return {"jaxpr": self.closed(p["jaxpr"]), "length": int(p["length"]), "reverse": bool(p["reverse"]),
                    "num_consts": int(p["num_consts"]), "num_carry": int(p["num_carry"]),
                    "unroll": int(p["unroll"]) if not isinstance(p["unroll"], bool) else bool(p["unroll"])}
        if name == "while":
            return {"cond": self.closed(p["cond_jaxpr"]), "body": self.closed(p["body_jaxpr"]),
                    "cond_nconsts": int(p["cond_nconsts"]), "body_nconsts": int(p["body_nconsts"])}
        if name == "cond":
            return {"branches": [self.closed(b) for b in p["branches"]]}
        if name == "custom_jvp_call":
            return self._custom_jvp(eqn)
        if name == "custom_vjp_call":
            return self._custom_vjp(eqn)
        if name == "custom_linear_solve":
            jaxprs = p["jaxprs"]
            return {"const_lengths": [int(x) for x in p["const_lengths"]],
                    "jaxprs": [None if j is None else self.closed(j) for j in jaxprs]}
        if name in ("pure_callback", "io_callback", "callback") or "callback" in name:
            raise Unstageable("a host callback (jax.pure_callback, io_callback): code outside the program")
        if name.startswith("random_") or name in ("threefry2x32",):
            raise Unstageable("jax.random inside a graded function: its program cannot carry random keys "
                              "(draw the numbers outside it and pass them in)")
        out = {}
        for k, v in p.items():
            if name in SCATTERS and k in ("update_jaxpr", "update_consts"):
                continue  # (lax builds them again from the scatter's kind)
            out[k] = None if k in PLACEMENT else self._value(name, k, v)
        return out

    def _value(self, name: str, key: str, v: Any) -> Any:
        if isinstance(v, float) and not np.isfinite(v):
            return {"F": repr(v)}
        if v is None or isinstance(v, (bool, int, float, str)) and not isinstance(v, enum.Enum):
            if isinstance(v, str) and len(v) > 200:
                raise Unstageable(f"{name}: parameter {key} is a string of {len(v)} characters")
            return v
        if isinstance(v, np.dtype) or type(v).__module__.startswith("numpy.dtypes"):
            dtype = str(np.dtype(v))
            if dtype not in DTYPES:
                raise Unstageable(f"{name}: parameter {key} has dtype {dtype}")
            return {"D": dtype}
        if isinstance(v, (np.integer, np.floating, np.bool_)):
            return self._value(name, key, v.item())
        for cname, cls in classes().items():
            if type(v) is cls:
                if isinstance(v, enum.Enum):
                    return {"E": cname, "v": v.name}
                return {"N": cname, "f": [self._value(name, key, x) for x in v]}
        if type(v) in (tuple, list):
            return {"T": [self._value(name, key, x) for x in v]}
        raise Unstageable(f"{name}: parameter {key} is a {type(v).__module__}.{type(v).__qualname__}"[:300])

    def _custom_jvp(self, eqn: Any) -> dict:
        p = eqn.params
        nc = int(p["num_consts"])
        n = len(eqn.invars) - nc
        call = self.closed(p["call_jaxpr"])
        self._in_rule += 1
        try:
            jvp_jaxpr, jvp_consts, out_zeros = p["jvp_jaxpr_fun"].call_wrapped(*([False] * n))
            jvp = self.open(jvp_jaxpr, list(jvp_consts))
        except Unstageable:
            raise
        except Exception as err:  # noqa: BLE001 - the rule's own trace failed
            raise Unstageable(_RULE_FAILED.format("custom_jvp", type(err).__name__)) from None
        finally:
            self._in_rule -= 1
        return {"call": call, "num_consts": nc, "jvp": jvp, "out_zeros": [bool(z) for z in out_zeros]}

    def _custom_vjp(self, eqn: Any) -> dict:
        """The primal, the forward rule (residuals first, then the outputs, as JAX runs it) with
        which residuals are inputs passed on (``fwds``), and the backward rule traced here."""
        import jax
        from jax._src import ad_util

        p = eqn.params
        nc = int(p["num_consts"])
        if nc:
            raise Unstageable("a custom_vjp function that closes over traced values (pass them as arguments)")
        n = len(eqn.invars)
        call = self.closed(p["call_jaxpr"])
        self._in_rule += 1
        try:
            fwd_jaxpr, fwd_consts = p["fwd_jaxpr_thunk"].call_wrapped(*([True] * n))
            fwds = p["out_trees"]()[2]  # (which residuals are inputs passed on)
            fwds = [None if f is None else int(f) for f in fwds]
            n_res_out = sum(f is None for f in fwds)
            outs = [v.aval for v in fwd_jaxpr.outvars]
            res_out = iter(outs[:n_res_out])
            in_avals = p["call_jaxpr"].in_avals
            res_avals = [next(res_out) if f is None else in_avals[f] for f in fwds]
            ct_avals = [a.to_tangent_aval() for a in p["call_jaxpr"].out_avals]
            tangent_avals = [a.to_tangent_aval() for a in in_avals]
            bwd = p["bwd"]

            def backward(*args):
                cts = list(bwd.call_wrapped(*args))
                if len(cts) != len(tangent_avals):
                    raise Unstageable(f"a custom_vjp's backward rule gave {len(cts)} cotangents for "
                                      f"{len(tangent_avals)} inputs")
                return [jax.numpy.zeros(a.shape, a.dtype) if c is None or isinstance(c, ad_util.Zero) else c
                        for c, a in zip(cts, tangent_avals)]

            closed = jax.make_jaxpr(backward)(*[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in res_avals + ct_avals])
            fwd = self.open(fwd_jaxpr, list(fwd_consts))
            bwd_index = self.closed(closed)
        except Unstageable:
            raise
        except Exception as err:  # noqa: BLE001 - the rules' own trace failed
            raise Unstageable(_RULE_FAILED.format("custom_vjp", type(err).__name__)) from None
        finally:
            self._in_rule -= 1
        return {"call": call, "num_consts": 0, "n_out": len(ct_avals), "fwd": fwd, "fwds": fwds, "bwd": bwd_index}


_RULE_FAILED = ("a {} rule could not be traced apart from the function ({}): a rule that uses values "
                "computed in the function around it must be given them as arguments of the custom function")


def _as_closed(j: Any) -> Any:
    from jax._src import core

    return j if isinstance(j, core.ClosedJaxpr) else core.ClosedJaxpr(j, ())


# -- decoding and evaluation (in a process that never ran the submission's code) ------------------

# jax.lax's primitives that act on the world, not on arrays: never bound from data
REFUSED = frozenset({"infeed", "outfeed", "create_token", "after_all", "rng_uniform",
                     # collectives (no mesh here), and JAX's internal markers that lax's modules import
                     "all_gather", "all_to_all", "psum", "pmax", "pmin", "ppermute", "axis_index",
                     "ragged_all_to_all", "eval_jaxpr", "composite", "dce_sink", "empty", "empty2",
                     "stage", "tie", "from_edtype", "to_edtype"})


@functools.cache
def primitives() -> dict[str, Any]:
    """``jax.lax``'s primitives by name (those of its modules, ``add_any`` and ``stop_gradient``),
    less :data:`REFUSED`."""
    import importlib
    import pkgutil

    from jax._src import ad_util, core
    from jax._src import lax as lax_pkg

    found: dict[str, Any] = {}
    names = [m.name for m in pkgutil.walk_packages(lax_pkg.__path__, lax_pkg.__name__ + ".")]
    for modname in [lax_pkg.__name__] + names:
        if ".parallel" in modname:
            continue  # (collectives: no mesh here)
        try:
            mod = importlib.import_module(modname)
        except Exception:  # noqa: BLE001 - a module this JAX cannot import on this machine
            continue
        for value in vars(mod).values():
            if isinstance(value, core.Primitive) and value.name not in REFUSED:
                found.setdefault(value.name, value)
    found["add_any"] = ad_util.add_jaxvals_p
    found["stop_gradient"] = ad_util.stop_gradient_p
    return found


def _decode_value(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        if set(v) == {"F"} and v["F"] in ("nan", "inf", "-inf"):
            return float(v["F"])
        if set(v) == {"T"} and isinstance(v["T"], list):
            return tuple(_decode_value(x) for x in v["T"])
        if set(v) == {"D"} and v["D"] in DTYPES:
            return _dtype(v["D"])
        if set(v) == {"E", "v"} and v["E"] in classes() and issubclass(classes()[v["E"]], enum.Enum):
            try:
                return classes()[v["E"]][v["v"]]
            except KeyError:
                raise WireError(f"no {v['E']} named {v['v']!r}") from None
        if set(v) == {"N", "f"} and v["N"] in classes() and isinstance(v["f"], list):
            cls = classes()[v["N"]]
            try:
                return cls(*[_decode_value(x) for x in v["f"]])
            except TypeError as err:
                raise WireError(f"a {v['N']} of the wrong fields: {err}") from None
    raise WireError(f"a parameter that is not plain data: {str(v)[:100]}")


def _dtype(name: str) -> Any:
    if name == "float0":
        from jax import dtypes

        return dtypes.float0
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _check_aval(a: Any) -> tuple:
    if (not isinstance(a, list) or len(a) != 3 or not isinstance(a[0], list)
            or not all(type(d) is int and 0 <= d < 1 << 40 for d in a[0]) or a[1] not in DTYPES
            or type(a[2]) is not bool):
        raise WireError(f"not a shape and dtype: {str(a)[:100]}")
    return tuple(a[0]), a[1], a[2]


class Program:
    """The decoded table of one job's programs; :meth:`function` gives one as a Python function."""

    def __init__(self, data: Any):
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise WireError("not a program of this version of the format")
        jaxprs, consts = data.get("jaxprs"), data.get("consts")
        if not isinstance(jaxprs, list) or not isinstance(consts, list):
            raise WireError("no table of programs")
        if sum(len(j.get("eqns", ())) for j in jaxprs if isinstance(j, dict)) > MAX_EQUATIONS:
            raise WireError("too many operations")
        self.jaxprs = jaxprs
        self._raw_consts = consts
        self._consts: dict[int, Any] = {}
        self._functions: dict[int, Callable] = {}
        self._jitted: dict[int, Callable] = {}
        self._calls_arguments: dict[int, bool] = {}
        self._compiled: dict[int, tuple] = {}
        self.arguments: dict[int, Callable] = {}  # the functions the probe passed to the call being run
        self._depth = 0

    def const(self, index: Any) -> Any:
        if type(index) is not int or not 0 <= index < len(self._raw_consts):
            raise WireError(f"no constant {str(index)[:20]}")
        if index not in self._consts:
            c = self._raw_consts[index]
            if not isinstance(c, dict) or set(c) != {"dtype", "shape", "data"}:
                raise WireError("a constant that is not an array")
            shape, dtype, _ = _check_aval([c["shape"], c["dtype"], False])
            if not isinstance(c["data"], str):
                raise WireError("a constant without its bytes")
            if dtype == "float0":
                self._consts[index] = np.zeros(shape, dtype=_dtype("float0"))
            else:
                raw = base64.b64decode(c["data"], validate=True)
                dt = _dtype(dtype)
                if len(raw) != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
                    raise WireError("a constant whose bytes are not its shape's")
                self._consts[index] = np.frombuffer(raw, dtype=dt).reshape(shape)
        return self._consts[index]

    def jaxpr(self, index: Any) -> dict:
        if type(index) is not int or not 0 <= index < len(self.jaxprs) or not isinstance(self.jaxprs[index], dict):
            raise WireError(f"no program {str(index)[:20]}")
        return self.jaxprs[index]

    def in_avals(self, index: int) -> list[tuple]:
        return [_check_aval(a) for a in self.jaxpr(index).get("in_avals", [])]

    def function(self, index: int) -> Callable:
        """Program ``index`` as ``f(*args) -> list of outputs``."""
        if index not in self._functions:
            self.jaxpr(index)
            self._functions[index] = lambda *args, _i=index: self.run(_i, list(args))
        return self._functions[index]

    def jitted(self, index: int) -> Callable:
        """Program ``index`` under ``jax.jit`` (one trace per shape, as the submission's own ``jit``)."""
        if index not in self._jitted:
            import jax

            self._jitted[index] = jax.jit(self.function(index))
        return self._jitted[index]

    def calls_arguments(self, index: int, _seen: frozenset = frozenset()) -> bool:
        """Whether program ``index`` (or one it runs) calls a function the probe passed: then it is
        never one ``jax.jit`` (whose trace, kept, would call the first case's function for all)."""
        if index not in self._calls_arguments:
            if index in _seen or len(_seen) > 100:
                raise WireError("programs that run each other in a circle")
            found = False
            for eqn in self.jaxpr(index).get("eqns", []):
                params = eqn[3] if isinstance(eqn, list) and len(eqn) == 5 and isinstance(eqn[3], dict) else {}
                if "argument" in params:
                    found = True
                    break
                subs = [params.get(k) for k in ("jaxpr", "cond", "body", "call", "jvp", "fwd", "bwd")]
                subs += list(params.get("branches") or []) + list(params.get("jaxprs") or [])
                if any(type(j) is int and self.calls_arguments(j, _seen | {index}) for j in subs):
                    found = True
                    break
            self._calls_arguments[index] = found
        return self._calls_arguments[index]

    def run(self, index: int, args: list) -> list:
        self._depth += 1
        try:
            if self._depth > 200:
                raise WireError("programs nested too deep")
            return self._run(index, args)
        finally:
            self._depth -= 1

    def _steps(self, index: int) -> tuple:
        """Program ``index`` read and checked once: its constants, inputs, equations (each with its
        primitive or handler and decoded parameters) and outputs."""
        if index in self._compiled:
            return self._compiled[index]
        import jax.numpy as jnp

        j = self.jaxpr(index)
        defined: set[int] = set()

        def ref(r: Any) -> Any:
            if type(r) is int:
                if r not in defined:
                    raise WireError(f"variable {r} used before it is defined")
                return r
            if isinstance(r, dict) and set(r) == {"lit", "aval"}:
                c = self.const(r["lit"])
                return (_LITERAL, jnp.asarray(c) if np.ndim(c) else c[()])
            raise WireError(f"not a variable: {str(r)[:40]}")

        def define(v: Any) -> int:
            if type(v) is not int or v < -1:
                raise WireError(f"not a variable: {str(v)[:40]}")
            if v >= 0:
                defined.add(v)
            return v

        consts, const_vars, in_vars = j.get("consts", []), j.get("const_vars", []), j.get("in", [])
        if not isinstance(consts, list) or not isinstance(const_vars, list) or len(consts) != len(const_vars):
            raise WireError("a program's constants do not match its constant variables")
        if not isinstance(in_vars, list):
            raise WireError("a program without its inputs")
        const_pairs = [(define(v), self.const(c)) for v, c in zip(const_vars, consts)]
        inputs = [define(v) for v in in_vars]
        steps = []
        eqns = j.get("eqns", [])
        if not isinstance(eqns, list):
            raise WireError("a program without its equations")
        for eqn in eqns:
            if not isinstance(eqn, list) or len(eqn) != 5 or not isinstance(eqn[0], str):
                raise WireError("an equation of the wrong form")
            name, ins, outs, params, avals = eqn
            if (not isinstance(ins, list) or not isinstance(outs, list) or not isinstance(params, dict)
                    or not isinstance(avals, list) or len(avals) != len(outs)):
                raise WireError(f"an equation of {name[:40]} of the wrong form")
            refs = [ref(r) for r in ins]
            if name in NESTED:
                run = functools.partial(_NESTED[name], self, params=params)
                multiple = True
            elif name in SCATTERS:
                run = functools.partial(_scatter, name, params={k: _decode_value(v) for k, v in params.items()})
                multiple = False
            else:
                prim = primitives().get(name)
                if prim is None:
                    raise WireError(f"the operation {name[:60]!r} is not one of jax.lax's")
                run = functools.partial(_bind, prim, name, {k: _decode_value(v) for k, v in params.items()})
                multiple = prim.multiple_results
            expected = []
            for a in avals:
                shape, dtype, _ = _check_aval(a)
                expected.append((shape, None if dtype == "float0" else _dtype(dtype)))
            steps.append((name, run, multiple, refs, [define(v) for v in outs], expected))
        out = [ref(r) for r in j.get("out", [])]
        self._compiled[index] = (const_pairs, inputs, steps, out)
        return self._compiled[index]

    def _run(self, index: int, args: list) -> list:
        const_pairs, inputs, steps, out = self._steps(index)
        if len(inputs) != len(args):
            raise WireError(f"a program of {len(inputs)} inputs called with {len(args)}")
        env: dict[int, Any] = dict(const_pairs)
        env.update(zip(inputs, args))
        for name, run, multiple, refs, outs, expected in steps:
            values = [r[1] if type(r) is tuple else env[r] for r in refs]
            results = run(values)
            if not multiple:
                results = [results]
            elif not isinstance(results, list):
                results = list(results)
            if len(results) != len(outs):
                raise WireError(f"{name[:40]} gave {len(results)} outputs where the program has {len(outs)}")
            for v, x, (shape, dtype) in zip(outs, results, expected):
                if not hasattr(x, "shape"):  # (a number a probe's function returned)
                    import jax.numpy as jnp

                    x = jnp.asarray(x)
                if tuple(x.shape) != shape or dtype is not None and x.dtype != dtype:
                    raise WireError(f"{name[:40]} gave {x.dtype}{list(x.shape)} where the program says "
                                    f"{dtype}{list(shape)}")
                if v >= 0:
                    env[v] = x
        return [r[1] if type(r) is tuple else env[r] for r in out]


_LITERAL = "literal"


def _bind(prim: Any, name: str, params: dict, values: list) -> Any:
    try:
        return prim.bind(*values, **params)
    except TypeError as err:
        raise WireError(f"{name[:60]}: {str(err)[:300]}") from None


def _scatter(name: str, values: list, params: dict) -> Any:  # (values second: bound as a step)
    from jax import lax

    fn = {"scatter": lax.scatter, "scatter-add": lax.scatter_add, "scatter_add": lax.scatter_add,
          "scatter-mul": lax.scatter_mul, "scatter_mul": lax.scatter_mul, "scatter-min": lax.scatter_min,
          "scatter_min": lax.scatter_min, "scatter-max": lax.scatter_max, "scatter_max": lax.scatter_max,
          "scatter-sub": getattr(lax, "scatter_sub", None), "scatter_sub": getattr(lax, "scatter_sub", None)}[name]
    if fn is None or len(values) != 3:
        raise WireError(f"{name}: not a scatter this JAX has, or not of three inputs")
    operand, indices, updates = values
    try:
        return fn(operand, indices, updates, params["dimension_numbers"],
                  indices_are_sorted=params.get("indices_are_sorted", False),
                  unique_indices=params.get("unique_indices", False), mode=params.get("mode"))
    except (KeyError, TypeError, ValueError) as err:
        raise WireError(f"{name}: {str(err)[:300]}") from None


def _int(params: dict, key: str, low: int = 0) -> int:
    v = params.get(key)
    if type(v) is not int or v < low:
        raise WireError(f"parameter {key} is not a count: {str(v)[:40]}")
    return v


def _call(prog: Program, values: list, params: dict) -> list:
    if "argument" in params:
        return _argument(prog, values, params)
    index = params.get("jaxpr")
    return (prog.function(index) if prog.calls_arguments(index) else prog.jitted(index))(*values)


def _argument(prog: Program, values: list, params: dict) -> list:
    """A call of a function the probe passed (:data:`ARGUMENT`): the probe's own, called here."""
    from .replay import flatten_tree, unflatten_tree

    function = prog.arguments.get(params.get("argument"))
    if function is None:
        raise WireError("a call of a function the probe did not pass")
    a, k = unflatten_tree(params.get("in"), list(values))
    spec, outs = flatten_tree(function(*a, **k), "what the probe's function returned")
    if spec != params.get("out"):
        raise WireError("the probe's function returned another structure than in the job")
    return outs


def _inline(prog: Program, values: list, params: dict) -> list:
    return prog.function(params.get("jaxpr"))(*values)


def _scan(prog: Program, values: list, params: dict) -> list:
    from jax import lax

    body = prog.function(params.get("jaxpr"))
    nc, ncarry, length = _int(params, "num_consts"), _int(params, "num_carry"), _int(params, "length")
    reverse, unroll = bool(params.get("reverse")), params.get("unroll", 1)
    if type(unroll) not in (int, bool) or len(values) < nc + ncarry:
        raise WireError("a scan of the wrong form")
    consts, carry, xs = values[:nc], values[nc:nc + ncarry], values[nc + ncarry:]

    def step(c, x):
        out = body(*consts, *c, *x)
        return list(out[:ncarry]), list(out[ncarry:])

    carry_out, ys = lax.scan(step, list(carry), list(xs), length=length, reverse=reverse, unroll=unroll)
    return [*carry_out, *ys]


def _while(prog: Program, values: list, params: dict) -> list:
    from jax import lax

    cond, body = prog.function(params.get("cond")), prog.function(params.get("body"))
    cn, bn = _int(params, "cond_nconsts"), _int(params, "body_nconsts")
    if len(values) < cn + bn:
        raise WireError("a while loop of the wrong form")
    cc, bc, init = values[:cn], values[cn:cn + bn], values[cn + bn:]
    return list(lax.while_loop(lambda c: cond(*cc, *c)[0], lambda c: list(body(*bc, *c)), list(init)))


def _cond(prog: Program, values: list, params: dict) -> list:
    from jax import lax

    branches = params.get("branches")
    if not isinstance(branches, list) or not branches or not values:
        raise WireError("a cond of the wrong form")
    fns = [prog.function(b) for b in branches]
    index, ops = values[0], values[1:]
    return list(lax.switch(index, [lambda *o, _f=f: list(_f(*o)) for f in fns], *ops))


def _custom_jvp(prog: Program, values: list, params: dict) -> list:
    import jax
    import jax.numpy as jnp

    call, jvp = prog.function(params.get("call")), prog.function(params.get("jvp"))
    nc = _int(params, "num_consts")
    out_zeros = params.get("out_zeros")
    if not isinstance(out_zeros, list) or not all(type(z) is bool for z in out_zeros) or len(values) < nc:
        raise WireError("a custom_jvp of the wrong form")

    @jax.custom_jvp
    def f(*args):
        return tuple(call(*args))

    def rule(primals, tangents):
        out = jvp(*primals[nc:], *tangents[nc:])
        n = len(out_zeros)
        p_out, t_nz = list(out[:n]), iter(out[n:])
        t_out = [jnp.zeros(jnp.shape(p), jax.dtypes.result_type(p)) if z else next(t_nz)
                 for p, z in zip(p_out, out_zeros)]
        return tuple(p_out), tuple(t_out)

    f.defjvp(rule)
    return list(f(*values))


def _custom_vjp(prog: Program, values: list, params: dict) -> list:
    import jax

    call, fwd, bwd = (prog.function(params.get(k)) for k in ("call", "fwd", "bwd"))
    n_out, fwds = _int(params, "n_out"), params.get("fwds")
    if (_int(params, "num_consts") or not isinstance(fwds, list)
            or not all(f is None or type(f) is int and 0 <= f < len(values) for f in fwds)):
        raise WireError("a custom_vjp of the wrong form")
    n_res_out = sum(f is None for f in fwds)

    @jax.custom_vjp
    def f(*args):
        return tuple(call(*args))

    def forward(*args):
        out = list(fwd(*args))
        if len(out) != n_res_out + n_out:
            raise WireError("a custom_vjp's forward rule of the wrong outputs")
        res_out = iter(out[:n_res_out])
        return tuple(out[n_res_out:]), tuple(next(res_out) if i is None else args[i] for i in fwds)

    def backward(res, cts):
        return tuple(bwd(*res, *cts))

    f.defvjp(forward, backward)
    return list(f(*values))


def _linear_solve(prog: Program, values: list, params: dict) -> list:
    """``lax.custom_linear_solve`` again, from its matvec, solve and transpose_solve (the vecmat
    is this process's own transpose of matvec, or matvec itself where the job's was: symmetric)."""
    from jax import lax

    lengths, jaxprs = params.get("const_lengths"), params.get("jaxprs")
    if (not isinstance(lengths, list) or len(lengths) != 4 or not all(type(n) is int and n >= 0 for n in lengths)
            or not isinstance(jaxprs, list) or len(jaxprs) != 4 or jaxprs[0] is None or jaxprs[2] is None):
        raise WireError("a custom_linear_solve of the wrong form")
    splits, at = [], 0
    for n in lengths:
        splits.append(values[at:at + n])
        at += n
    b = list(values[at:])
    (mv_c, vm_c, s_c, ts_c), (mv, vm, sv, ts) = splits, jaxprs
    matvec = lambda x: list(prog.function(mv)(*mv_c, *x))  # noqa: E731
    solve = lambda _, x: list(prog.function(sv)(*s_c, *x))[:len(b)]  # noqa: E731
    tsolve = None if ts is None else (lambda _, x: list(prog.function(ts)(*ts_c, *x))[:len(b)])
    return list(lax.custom_linear_solve(matvec, b, solve, tsolve, symmetric=ts is not None and vm == mv))


_NESTED: dict[str, Callable[[Program, list, dict], list]] = {
    "jit": _call, "pjit": _call, "closed_call": _inline, "core_call": _inline, "remat": _inline, "remat2": _inline,
    "checkpoint": _inline, "scan": _scan, "while": _while, "cond": _cond, "custom_jvp_call": _custom_jvp,
    "custom_vjp_call": _custom_vjp, "custom_linear_solve": _linear_solve,
}
