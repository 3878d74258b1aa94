"""A job's calls of the submission's functions, traced there and replayed elsewhere.

In a job's process (which runs the submission's code) each case's probe runs
with the submission's function wrapped in a :class:`Recorder`, and with the
probes' derivatives *staged* (:func:`attn_course.specs._gen.staging`): where
the probe would differentiate, the function is only traced, its arguments
abstract as they would be under ``jax.vjp``.  Each call becomes an entry: which
of its arguments were abstract (and their shapes), the program the function
traced to (:mod:`attn_course.jaxpr_wire`), and the structure of its result; a
call on numbers only, in a case that runs op by op, keeps its result's values.

In a process that never ran any of the submission's code (forked from the
worker's template), the same probe runs again on a :class:`CaseReplay` of each
case: the n-th call gets the n-th entry's program, evaluated by this process's
own JAX -- which differentiates, compiles and runs it.  Whatever the
submission changed in JAX in its own process (a derivative rule, an entry of a
cache) changes nothing here; what it computes is its function's program.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import keyword
from typing import Any, Callable

import numpy as np

from . import jaxpr_wire
from .values import NotPlainValue

MAX_CALLS = 64  # of the submission's functions in one case


def _is_tracer(x: Any) -> bool:
    import jax

    return isinstance(x, jax.core.Tracer)


# -- results' structure -----------------------------------------------------------------------------


def flatten_tree(value: Any, where: str = "the result") -> tuple[Any, list]:
    """A result's structure (tuples, lists, dicts of string keys, None) and its leaves, in order."""
    leaves: list = []

    def walk(x: Any, where: str) -> Any:
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return {"nt": [type(x).__name__[:100], [[str(f)[:100], walk(v, f"{where}.{f}")]
                                                    for f, v in zip(x._fields, x)]]}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):  # (its fields, as a named tuple's)
            return {"nt": [type(x).__name__[:100], [[f.name[:100], walk(getattr(x, f.name), f"{where}.{f.name}")]
                                                    for f in dataclasses.fields(x)]]}
        if isinstance(x, tuple):
            return {"t": [walk(v, f"{where}[{i}]") for i, v in enumerate(x)]}
        if isinstance(x, list):
            return {"l": [walk(v, f"{where}[{i}]") for i, v in enumerate(x)]}
        if isinstance(x, dict):
            if not all(isinstance(k, str) and len(k) <= 200 for k in x):
                raise NotPlainValue(f"{where} is a dict whose keys are not all names")
            return {"d": [[k, walk(v, f"{where}[{k!r}]")] for k, v in x.items()]}
        if x is None:
            return {"n": 0}
        if isinstance(x, str):
            if len(x) > 1000:
                raise NotPlainValue(f"{where} is a string of {len(x)} characters")
            return {"s": str(x)}
        if not (_is_tracer(x) or isinstance(x, (bool, int, float, np.ndarray, np.number, np.bool_))
                or type(x).__module__.split(".")[0] in ("jax", "jaxlib")):
            raise NotPlainValue(f"{where} is a {type(x).__name__[:60]}, expected an array")
        leaves.append(x)
        return "*"

    return walk(value, where), leaves


_NAMED: dict[tuple, type] = {}


def _named_tuple(name: str, fields: tuple) -> type:
    """A named tuple class of these fields (the job's result's, by name: a probe reads its fields)."""
    if (len(fields) > 100 or not all(isinstance(f, str) and f.isidentifier() and not keyword.iskeyword(f)
                                     and not f.startswith("_") for f in fields) or len(set(fields)) != len(fields)):
        raise jaxpr_wire.WireError("a named tuple's fields are not names")
    key = (name if name.isidentifier() and not keyword.iskeyword(name) else "Result", fields)
    if key not in _NAMED:
        _NAMED[key] = collections.namedtuple(key[0], fields)
    return _NAMED[key]


def unflatten_tree(spec: Any, leaves: list) -> Any:
    """:func:`flatten_tree`'s inverse (the spec is data from a job: checked as it is read)."""
    it = iter(leaves)
    depth = [0]

    def build(s: Any) -> Any:
        depth[0] += 1
        if depth[0] > 10_000:
            raise jaxpr_wire.WireError("a result's structure too large")
        if s == "*":
            try:
                return next(it)
            except StopIteration:
                raise jaxpr_wire.WireError("a result of fewer values than its structure") from None
        if isinstance(s, dict) and len(s) == 1:
            (kind, body), = s.items()
            if kind == "n":
                return None
            if kind == "s" and isinstance(body, str):
                return body
            if (kind == "nt" and isinstance(body, list) and len(body) == 2 and isinstance(body[0], str)
                    and isinstance(body[1], list) and all(isinstance(kv, list) and len(kv) == 2 for kv in body[1])):
                cls = _named_tuple(body[0], tuple(kv[0] for kv in body[1]))
                return cls(*[build(kv[1]) for kv in body[1]])
            if kind in ("t", "l") and isinstance(body, list):
                items = [build(x) for x in body]
                return tuple(items) if kind == "t" else items
            if kind == "d" and isinstance(body, list) and all(
                    isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str) for kv in body):
                return {k: build(v) for k, v in body}
        raise jaxpr_wire.WireError(f"not a result's structure: {str(s)[:60]}")

    out = build(spec)
    if next(it, None) is not None:
        raise jaxpr_wire.WireError("a result of more values than its structure")
    return out


# -- in the job: recording ----------------------------------------------------------------------------


def _is_function(x: Any) -> bool:
    return callable(x) and not isinstance(x, type) and not _is_tracer(x) and not hasattr(x, "shape")


class Log:
    """One case's calls (entries) and, if the probe read it, the function's signature."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.sig: list | None = None

    def data(self) -> dict:
        return {"status": "staged", "calls": self.calls, **({"sig": self.sig} if self.sig is not None else {})}


def placeholder(aval: Any) -> Any:
    """A value of ``aval``'s shape and dtype (zeros), traced where the probe is traced."""
    import jax.numpy as jnp
    from jax._src.lax import lax as lax_internal

    z = jnp.zeros(aval.shape, aval.dtype)
    return lax_internal._convert_element_type(z, aval.dtype, weak_type=True) if aval.weak_type else z


class Recorder:
    """The submission's function as a probe calls it in the job: traced, never differentiated."""

    def __init__(self, fn: Callable, encoder: jaxpr_wire.Encoder, log: Log, staged: bool, path: str = ""):
        self.fn, self.encoder, self.log, self.staged, self.path = fn, encoder, log, staged, path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import jax

        if len(self.log.calls) >= MAX_CALLS:
            raise RuntimeError(f"the probe called the function more than {MAX_CALLS} times")
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        abstract = [i for i, x in enumerate(leaves) if _is_tracer(x)]
        entry: dict[str, Any] = {"fn": self.path, "n": len(leaves), "abstract": abstract}
        if not abstract and not self.staged:  # a case run op by op, on numbers: its values
            out = self.fn(*args, **kwargs)
            spec, outs = flatten_tree(out)
            entry.update({"in": [], "values": [self.encoder.const(np.asarray(x)) for x in outs], "out": spec})
            self.log.calls.append(entry)
            return out
        spec_box: list = []
        leaves = [self._argument(i, x) if _is_function(x) else x for i, x in enumerate(leaves)]

        def traced(*xs: Any) -> list:
            full = list(leaves)
            for i, x in zip(abstract, xs):
                full[i] = x
            a, k = jax.tree_util.tree_unflatten(tree, full)
            spec, outs = flatten_tree(self.fn(*a, **k))
            spec_box.append(spec)
            return outs

        avals = [jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype, weak_type=leaves[i].aval.weak_type)
                 for i in abstract]
        closed = jax.make_jaxpr(traced)(*avals)
        entry.update({"in": [jaxpr_wire._aval(a) for a in avals], "program": self.encoder.closed(closed),
                      "out": spec_box[0]})
        self.log.calls.append(entry)
        return unflatten_tree(spec_box[0], [placeholder(a) for a in closed.out_avals])

    def _argument(self, i: int, function: Callable) -> Callable:
        """A function the probe passes (4.2's metric field, 9.5's feature map) as the submission's code calls
        it: each call one equation of the program, named for the argument, that the replay runs as
        a call of the probe's own function there (its body is the probe's, and so is what it counts)."""
        import jax

        encoder = self.encoder

        def call(*args: Any, **kwargs: Any) -> Any:
            spec, xs = flatten_tree((args, kwargs), "an argument's call")
            box: list = []

            def flat(*ys: Any) -> list:
                a, k = unflatten_tree(spec, list(ys))
                out_spec, outs = flatten_tree(function(*a, **k), "what the probe's function returned")
                box.append(out_spec)
                return outs

            flat.__name__ = name = f"{jaxpr_wire.ARGUMENT}{len(encoder.arguments)}"
            outs = jax.jit(flat)(*xs)
            encoder.arguments[name] = {"argument": i, "in": spec, "out": box[0], "n": [len(xs), len(outs)]}
            return unflatten_tree(box[0], list(outs))

        return call

    @property
    def __signature__(self) -> inspect.Signature:
        """The function's signature, a default that is a function a recorder too (a probe may call
        it: 9.5's feature map)."""
        sig = inspect.signature(self.fn)
        spec, params = [], []
        for p in list(sig.parameters.values())[:64]:
            d, kept = p.default, p.empty
            if d is p.empty:
                spec.append([p.name[:100], int(p.kind), None])
            elif callable(d) and not isinstance(d, type):
                kept = Recorder(d, self.encoder, self.log, self.staged, path=p.name[:100])
                spec.append([p.name[:100], int(p.kind), {"fn": True}])
            elif d is None or isinstance(d, (bool, int, str)) or isinstance(d, float) and np.isfinite(d):
                kept = d
                spec.append([p.name[:100], int(p.kind), {"v": d if not isinstance(d, str) else d[:200]}])
            else:
                spec.append([p.name[:100], int(p.kind), None])
            params.append(p.replace(default=kept))
        if self.path == "":
            self.log.sig = spec
        return sig.replace(parameters=params)


def record_case(fn: Callable, probe: Callable, args: dict, eager: bool, encoder: jaxpr_wire.Encoder) -> dict:
    """One case's calls (:class:`Log` data); raises what the probe raised (the case's failure)."""
    import jax

    from .specs import _gen

    log = Log()
    rec = Recorder(fn, encoder, log, staged=not eager)
    with _gen.staging():
        if eager:
            probe(rec, **args)
        else:
            jax.make_jaxpr(lambda: (probe(rec, **args), 0)[1])()
    return log.data()


# -- elsewhere: replaying -------------------------------------------------------------------------------


class CaseReplay:
    """One case's recorded calls, as the function a probe calls (a fresh one per run of the probe)."""

    def __init__(self, program: jaxpr_wire.Program, data: dict):
        calls = data.get("calls")
        if not isinstance(calls, list) or len(calls) > MAX_CALLS:
            raise jaxpr_wire.WireError("a case without its calls")
        self.program, self.calls, self.sig = program, calls, data.get("sig")
        self.next = 0

    def function(self, path: str = "") -> "ReplayFunction":
        return ReplayFunction(self, path)

    def _signature(self) -> inspect.Signature:
        if not isinstance(self.sig, list):
            raise jaxpr_wire.WireError("a signature of the wrong form")
        params = []
        for p in self.sig:
            if (not isinstance(p, list) or len(p) != 3 or not isinstance(p[0], str) or not p[0].isidentifier()
                    or type(p[1]) is not int or p[1] not in range(5)):
                raise jaxpr_wire.WireError("a parameter of the wrong form")
            name, kind, d = p
            default = inspect.Parameter.empty
            if isinstance(d, dict) and d.get("fn") is True:
                default = self.function(name)
            elif isinstance(d, dict) and set(d) == {"v"} and (d["v"] is None or isinstance(d["v"], (bool, int, float, str))):
                default = d["v"]
            params.append(inspect.Parameter(name, inspect._ParameterKind(kind), default=default))
        try:
            return inspect.Signature(params)
        except ValueError as err:
            raise jaxpr_wire.WireError(f"not a signature: {err}") from None

    def call(self, path: str, args: tuple, kwargs: dict) -> Any:
        import jax
        import jax.numpy as jnp

        if self.next >= len(self.calls):
            raise jaxpr_wire.WireError("the probe calls the function more often than it did in the job")
        entry = self.calls[self.next]
        self.next += 1
        if not isinstance(entry, dict) or entry.get("fn") != path:
            raise jaxpr_wire.WireError("the probe's calls are not the job's")
        leaves, _ = jax.tree_util.tree_flatten((args, kwargs))
        abstract, avals = entry.get("abstract"), entry.get("in")
        if (entry.get("n") != len(leaves) or not isinstance(abstract, list) or not isinstance(avals, list)
                or len(abstract) != len(avals)
                or not all(type(i) is int and 0 <= i < len(leaves) for i in abstract)):
            raise jaxpr_wire.WireError("the probe's call is not the job's")
        xs = [leaves[i] for i in abstract]
        for x, a in zip(xs, avals):
            shape, dtype, _ = jaxpr_wire._check_aval(a)
            if tuple(np.shape(x)) != shape or str(jnp.result_type(x)) != dtype:
                raise jaxpr_wire.WireError("the probe's call is not the job's (shapes)")
        if "program" in entry:
            program = entry["program"]
            if self.program.in_avals(program) != [jaxpr_wire._check_aval(a) for a in avals]:
                raise jaxpr_wire.WireError("a program whose inputs are not the call's")
            before = self.program.arguments
            self.program.arguments = {i: x for i, x in enumerate(leaves) if _is_function(x)}
            try:
                outs = self.program.function(program)(*xs)
            finally:
                self.program.arguments = before
        else:
            vals = entry.get("values")
            if not isinstance(vals, list):
                raise jaxpr_wire.WireError("a call without its values")
            outs = [self.program.const(v) for v in vals]
        return unflatten_tree(entry.get("out"), list(outs))


class ReplayFunction:
    """A recorded function (the case's, or a default of its signature) as the probe calls it."""

    def __init__(self, case: CaseReplay, path: str):
        self.case, self.path = case, path
        if path == "" and case.sig is not None:
            self.__signature__ = case._signature()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.case.call(self.path, args, kwargs)

    def fresh(self) -> "ReplayFunction":
        """The same case from its first call again (a probe run once more, op by op)."""
        return CaseReplay(self.case.program, {"calls": self.case.calls, "sig": self.case.sig}).function(self.path)


def fresh(fn: Any) -> Any:
    """``fn`` to run a probe again: a replayed case's from its first call, anything else itself."""
    return fn.fresh() if type(fn) is ReplayFunction else fn


class Replayed:
    """An exercise's staged cases: :meth:`for_case` gives case i's function."""

    def __init__(self, program: jaxpr_wire.Program, cases: list[dict]):
        self.program, self.cases = program, cases

    def for_case(self, i: int) -> Callable:
        return CaseReplay(self.program, self.cases[i]).function()


def for_case(fn: Any, i: int) -> Any:
    """Case i's function: a :class:`Replayed`'s own, or ``fn`` itself."""
    return fn.for_case(i) if type(fn) is Replayed else fn
