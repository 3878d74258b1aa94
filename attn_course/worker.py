"""Run a package's functions on given inputs; report plain values only.

A worker server (:func:`serve`, started by :mod:`attn_course.server` inside a
:mod:`attn_course.sandbox`) receives jobs: a package's source files and the
exercises' case inputs.  For each job a fresh child loads the package as
``attn_tensors``, calls each exercise's probe on each case's inputs, and
writes one JSON line per exercise to its results pipe:
``{"start": "3.1"}`` when it begins, then ``{"id": "3.1", "results": [...]}``.
A result is ``{"status": "ok", "value": {...arrays...}}``, ``{"status":
"raised", "type": ..., "message": ...}`` or ``{"status": "not_implemented",
"exercise": "2.2", "message": ...}``.

The worker never sees expected values: it gets inputs and returns outputs,
and the trusted parent compares them (:mod:`attn_course.runner`).  The same
:func:`evaluate` computes the reference outputs in the parent.

A job names its backend (``"backend": "jax"``, the default, or ``"mlx"``):
the cases' NumPy inputs become arrays of that framework, the probes take
gradients with its autodiff (:mod:`attn_course.specs._gen`), and the outputs
come back as NumPy arrays.  The JAX cases of a whole job (every exercise)
are compiled as one program (:func:`evaluate_job`); MLX cases run eagerly (MLX is lazy, and compiling saves nothing on
inputs this small), on MLX's CPU device, where float64 exists.  Code that
mixes the two frameworks is reported as :class:`BackendMismatch`, with the fix.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.machinery
import importlib.util
import json
import os
import re
import resource
import signal
import stat
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from . import jaxpr_wire, seccomp, tamper, values, warm, watch
from .inline_where import inline_where
from .xla_cache import compile_for_workers
from .regions import exercise_of_stub
from .replay import for_case, fresh

MAX_MESSAGE = 400


BACKENDS = ("jax", "mlx")
_FRAMEWORK = {"jax": ("jax", "jaxlib"), "mlx": ("mlx",)}  # the root modules of each backend's arrays


def to_backend(value: Any, backend: str = "jax") -> Any:
    """NumPy arrays in a case become JAX (or MLX) arrays of the same dtype; everything else is unchanged."""
    if isinstance(value, np.ndarray):
        if backend == "mlx":
            import mlx.core as mx

            dtype = getattr(mx, "bool_" if value.dtype == np.bool_ else value.dtype.name)
            return mx.array(np.ascontiguousarray(value), dtype=dtype)  # MLX refuses negative strides
        import jax

        # a transfer, not a program: jnp.asarray compiles a copy per new shape (~10 ms each, in every child)
        return jax.device_put(value)
    if isinstance(value, list):
        return [to_backend(v, backend) for v in value]
    if isinstance(value, dict):
        return {k: to_backend(v, backend) for k, v in value.items()}
    return value


NotPlainValue = values.NotPlainValue  # (its home is values: an exercise's probe raises it too)


class BackendMismatch(TypeError):
    """The submission used the other framework's functions (or arrays) in this backend's run."""


def mismatch_message(backend: str, exercise: str = "") -> str:
    """What went wrong when code for one framework met the other's arrays, and the two fixes."""
    ex = exercise or "EXERCISE"
    fix = "write it with xp = namespace(...) from attn_tensors.backend, which follows the arrays"
    if backend == "mlx":
        return (f"your code called jax.numpy on MLX arrays (this check runs on MLX): {fix}, "
                f"or check it on JAX: `attn-course check {ex}` (JAX is the default)")
    return (f"your code called mlx.core on JAX arrays (this check runs on JAX): {fix}, "
            f"or check it on MLX: `attn-course check {ex} --backend mlx`")


# Words of the errors that JAX and MLX raise when handed the other's arrays
# (``mx.einsum`` on JAX arrays: "std::bad_cast"; ``mx.sum``: nanobind's
# "incompatible function arguments ... Invoked with types: jaxlib...";
# ``jnp.exp`` on an MLX array: "... as an abstract array ... mlx.core.array"; ``mx.grad`` of a
# function that returns ``jnp.asarray(...)``: "[grad] The return value ... jaxlib...ArrayImpl was
# returned").
_MLX_WORDS = ("mlx.core", "incompatible function arguments", "array initialization", "'array'",
              "[grad]", "[vjp]", "[jvp]", "[value_and_grad]")
_JAX_WORDS = ("jax", "Tracer", "abstract array", "requires ndarray or scalar arguments")


def _is_mismatch(err: BaseException, backend: str = "jax") -> bool:
    """True when ``err`` (or an exception it chains) is a framework refusing the other's arrays.

    On JAX, only once something imported MLX (the worker itself never does on JAX).
    """
    if backend == "jax" and "mlx.core" not in sys.modules:
        return False
    seen = 0
    while err is not None and seen < 8:
        msg = _text(err)
        if ("bad_cast" in msg or "got both MLX and JAX" in msg
                or (any(w in msg for w in _MLX_WORDS) and any(w in msg for w in _JAX_WORDS))):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def _has_array(value: Any) -> bool:
    """True when a case's inputs hold an array (whose backend the outputs must then follow)."""
    if isinstance(value, np.ndarray):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_array(v) for v in value)
    if isinstance(value, dict):
        return any(_has_array(v) for v in value.values())
    return False


def _array(x: Any, where: str, backend: str | None = None) -> np.ndarray:
    if isinstance(x, (bool, int, float, np.number, np.bool_)):
        return np.asarray(x)
    root = type(x).__module__.split(".")[0]
    if backend is not None and root in sum((v for k, v in _FRAMEWORK.items() if k != backend), ()):
        raise BackendMismatch(f"{where} is a {root} array")
    if root not in ("jax", "jaxlib", "numpy", "mlx"):
        raise NotPlainValue(f"{where} is a {type(x).__name__}, expected an array")
    try:
        a = np.asarray(x)
    except Exception as err:  # noqa: BLE001 - anything odd is the submission's fault
        raise NotPlainValue(f"{where} ({type(x).__name__}) is not an array: {err}") from None
    if a.dtype.kind not in "biuf":
        raise NotPlainValue(f"{where} has dtype {a.dtype}, expected numbers")
    if a.dtype.kind == "u" or str(a.dtype) not in values.ALLOWED_DTYPES:
        a = a.astype(np.float64 if a.dtype.kind == "f" else np.int64)
    return a


def flatten(result: Any, where: str = "the result", backend: str | None = None) -> dict[str, np.ndarray]:
    """Named arrays from an array, a (named) tuple or a dict of arrays.

    With ``backend``, an array of the other framework is a :class:`BackendMismatch`.
    """
    if isinstance(result, dict):
        return {str(k): _array(v, f"{where}[{k!r}]", backend) for k, v in result.items()}
    if isinstance(result, tuple) and hasattr(result, "_fields"):
        return {f: _array(getattr(result, f), f"{where}.{f}", backend) for f in result._fields}
    if isinstance(result, (tuple, list)):
        return {str(i): _array(v, f"{where}[{i}]", backend) for i, v in enumerate(result)}
    return {"value": _array(result, where, backend)}


def _where(tb) -> str:
    # (where only: no source line is read, of the job's files or of the JAX internals it passed through)
    frames = traceback.StackSummary.extract(traceback.walk_tb(tb), lookup_lines=False)
    for fr in reversed(frames):
        if "attn_tensors" in fr.filename.replace("\\", "/"):
            parts = Path(fr.filename).parts
            rel = "/".join(parts[parts.index("attn_tensors"):]) if "attn_tensors" in parts else fr.filename
            return f"{rel}:{fr.lineno} in {fr.name}"
    return ""


def _run_probe(fn: Any, probe: Any, inputs: dict[str, Any]) -> Any:
    """The probe compiled as one XLA program; eagerly if that is not possible.

    Eager JAX lowers every primitive separately (hundreds per case, a few
    milliseconds each, even with the persistent compilation cache); one
    ``jit`` of the whole probe, with the inputs as constants (so that value
    checks such as "T must be positive" still see numbers), costs one
    lowering.  Code that cannot be traced (it reads values with NumPy, returns
    Python objects, ...) runs eagerly instead, with the same result.
    """
    import jax

    args = to_backend(inputs)
    try:
        return compile_for_workers(jax.jit(lambda: probe(fn, **args)).trace().lower())()
    except NotImplementedError:
        raise  # a stub says so at once, traced or not: no need to run it op by op
    except Exception:  # noqa: BLE001 - not traceable, or a real error: the eager run says which
        pass
    return probe(fresh(fn), **to_backend(inputs))


def _text(err: BaseException) -> str:
    """An exception's message, whatever its ``__str__`` does (it is the submission's)."""
    try:
        return str(err)[:MAX_MESSAGE]
    except BaseException:  # noqa: BLE001
        return "(its message cannot be printed)"


def _failure(err: Exception, backend: str = "jax", exercise: str = "") -> dict[str, Any]:
    """The outcome of a case that raised ``err``."""
    if isinstance(err, BackendMismatch) or (not isinstance(err, NotImplementedError) and _is_mismatch(err, backend)):
        return {"status": "raised", "type": "BackendMismatch", "message": mismatch_message(backend, exercise),
                "where": _where(err.__traceback__)}
    if isinstance(err, NotImplementedError):
        return {"status": "not_implemented", "exercise": exercise_of_stub(_text(err)) or "",
                "message": _text(err), "where": _where(err.__traceback__)}
    if isinstance(err, NotPlainValue):
        return {"status": "bad_value", "message": _text(err)}
    if isinstance(err, RecursionError):
        return {"status": "raised", "type": "RecursionError", "message": _text(err)}
    if isinstance(err, OSError) and err.errno == 27:
        err = OSError(27, "File too large: the file size limit stopped it (is something printing or writing too much?)")
    return {"status": "raised", "type": type(err).__name__[:100], "message": _text(err),
            "where": _where(err.__traceback__)}


def _run_probe_mlx(fn: Any, probe: Any, inputs: dict[str, Any]) -> Any:
    """The probe on MLX arrays, eagerly, on MLX's CPU device (the only one with float64)."""
    import mlx.core as mx

    with mx.stream(mx.cpu):
        out = probe(fn, **to_backend(inputs, "mlx"))
        leaves = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else [out]
        mx.eval([x for x in leaves if isinstance(x, mx.array)])  # MLX is lazy: errors surface here
    return out


def evaluate(fn: Any, probe: Any, inputs: dict[str, Any], backend: str = "jax",
             exercise: str = "") -> dict[str, Any]:
    """One case: the probe's outputs as plain arrays, or what went wrong.

    ``exercise`` (its id) only makes a backend mismatch's message name the command to run.
    """
    follow = backend if _has_array(inputs) else None  # a constructor without `like` gives JAX arrays
    try:
        out = _run_probe_mlx(fn, probe, inputs) if backend == "mlx" else _run_probe(fn, probe, inputs)
        return {"status": "ok", "value": flatten(out, backend=follow)}
    except Exception as err:  # noqa: BLE001 - the submission's exception is data
        return _failure(err, backend, exercise)


def _eager(fn: Any, probe: Any, inputs: dict[str, Any], exercise: str = "") -> dict[str, Any]:
    """One JAX case op by op, never compiled (a case marked ``eager``).

    Under ``jit`` only the inputs are concrete; a check on a value computed
    from them (a vector of zero length) sees a tracer and is skipped, so the
    program returns nan where the code raises when it runs op by op.  Eager
    JAX costs seconds per case, so only the cases that test such a check
    (:attr:`attn_course.registry.Case.eager`) run this way.
    """
    follow = "jax" if _has_array(inputs) else None
    try:
        return {"status": "ok", "value": flatten(probe(fn, **to_backend(inputs)), backend=follow)}
    except Exception as err:  # noqa: BLE001 - the submission's exception is data
        return _failure(err, "jax", exercise)


class _PackageOnly:
    """A finder, first on ``sys.meta_path``: a module of ``attn_tensors`` is found in the loaded
    package's folder or not at all.  An editable install of the course (``pip install -e``, a
    clone) maps ``attn_tensors.*`` to the reference library's files, so a module the student
    deleted was imported from the reference, and ``check`` passed exercises never written."""

    def __init__(self, folder: Path):
        self.folder = folder

    def find_spec(self, fullname: str, path=None, target=None):
        if not fullname.startswith("attn_tensors."):
            return None
        parent = sys.modules.get(fullname.rpartition(".")[0])
        where = list(getattr(parent, "__path__", None) or [])
        if not all(Path(p).resolve().is_relative_to(self.folder) for p in where):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        spec = importlib.machinery.PathFinder.find_spec(fullname, where)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return spec


def load_package(folder: str | Path) -> Any:
    """Import ``folder/attn_tensors`` as ``attn_tensors``, whatever else is installed
    (its modules from that folder only, :class:`_PackageOnly`)."""
    folder = Path(folder).resolve()
    init = folder / "attn_tensors" / "__init__.py"
    for name in [m for m in sys.modules if m == "attn_tensors" or m.startswith("attn_tensors.")]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PackageOnly)]
    sys.meta_path.insert(0, _PackageOnly(folder))
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(
        "attn_tensors", init, submodule_search_locations=[str(init.parent)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["attn_tensors"] = module
    spec.loader.exec_module(module)
    return module


def resolve(function: str) -> Any:
    module, name = function.rsplit(".", 1)
    return getattr(importlib.import_module(f"attn_tensors.{module}"), name)


class _ConcreteCheck(Exception):
    """Stands for the library's AttentionInputError before the package is loaded."""


def _concrete_check_type() -> type:
    mod = sys.modules.get("attn_tensors._checks")
    return getattr(mod, "AttentionInputError", _ConcreteCheck) if mod else _ConcreteCheck


def evaluate_all(fn: Any, probe: Any, inputs: list[dict[str, Any]], backend: str = "jax",
                 exercise: str = "", eager: list[bool] | None = None) -> list[dict[str, Any]]:
    """Every case of an exercise: on JAX, those that trace go into ONE XLA program.

    Compiling dominates a worker's time, so the cases are traced together in
    one ``jit`` (inputs as constants, as in :func:`_run_probe`): the job of
    one exercise of :func:`evaluate_job`, which says what happens to the
    cases that cannot be part of it.  On MLX each case is evaluated on its
    own (MLX is eager anyway).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}")
    if backend == "mlx":
        return [evaluate(fn, probe, x, backend, exercise) for x in inputs]
    item = JobItem(exercise, probe, list(inputs), list(eager or [False] * len(inputs)))
    return evaluate_job([item], lambda ex_id: (fn, None))[exercise]


def _import_error(error: str, n: int) -> list[dict[str, Any]]:
    return [{"status": "raised", "type": "ImportError", "message": error[:MAX_MESSAGE]}] * n


def _exercise_results(ex: Any, fn: Any, cases: list[dict], error: str | None, backend: str = "jax") -> list[dict]:
    if error:
        return _import_error(error, len(cases))
    return evaluate_all(fn, ex.probe, [values.decode(case["inputs"]) for case in cases], backend, ex.id,
                        [case.get("eager") is True for case in cases])


def _plain_leaves(out: Any) -> bool:
    """True when a probe's output is a tree of arrays and numbers (what a compiled program can return)."""
    import jax

    leaves = jax.tree_util.tree_leaves(out)
    return all(isinstance(x, (jax.Array, jax.core.Tracer, bool, int, float, np.number, np.bool_))
               or (isinstance(x, np.ndarray) and x.dtype.kind in "biuf") for x in leaves)


_RAN = [0]  # calls of the submission's functions (and its package's and cells' runs) so far
_HOOKED = [False]  # whether a profile or trace hook was set as a submission's function ran
_HOOKS = [(None, None)]  # the hooks before the job's package loaded (a coverage tool's: not the job's)


class JobItem(NamedTuple):
    """One exercise of a job: its id, probe, cases' inputs (NumPy) and which cases run op by op."""

    id: str
    probe: Any
    inputs: list[dict[str, Any]]
    eager: list[bool]
    traced: bool = True  # recorded by record_job (False: evaluated in the job, by evaluate_job)


def evaluate_job(items: list[JobItem], function: Callable[[str], tuple[Any, str | None]],
                 start: Callable[[str], None] = lambda ex_id: None,
                 phase: Callable[[str], None] = lambda name: None,
                 report: Callable[[str, list[dict]], None] = lambda ex_id, results: None,
                 _ran: list = _RAN) -> dict[str, list[dict]]:
    """Every case of every exercise of a JAX job, in ONE XLA program; each exercise's results.

    What :func:`evaluate_all` does for the cases of one exercise, done for
    the whole job: one trace, one lowering, one compilation (or one read of
    the compilation cache) instead of one per exercise -- a job's lowering
    and compiling cost about a third less (chapter 3: 0.40 -> 0.33 CPU-s a
    child when the cache has the program, 0.53 -> 0.40 when it has not).

    ``function(id)`` gives the exercise's function (or why there is none),
    and is called for each exercise in turn, outside the trace, before any
    ``start``: one that runs the submission's code (a notebook's answer
    cells) says itself that the exercise starts, so that only code that
    runs is ever its exercise's.  ``start(id)`` is called as each exercise
    is traced, and again before a case of it that runs alone after the
    program; ``phase("compile")``
    once the whole job is traced, and ``report(id, results)`` with each
    exercise's results.  A case that refuses its input while tracing
    (:class:`NotImplementedError`, the library's input checks) is reported
    as that error; cases marked ``eager`` (:func:`_eager`) and cases that
    cannot be traced run on their own (:func:`evaluate`).  If the program as
    a whole cannot be built, each exercise becomes its own program, and an
    exercise that cannot be one runs case by case, with the same results.
    """
    import jax

    inline_where()  # as the program that fills the workers' cache is staged (:mod:`attn_course.inline_where`)
    concrete = _concrete_check_type()
    args = [[to_backend(x) if not e else None for x, e in zip(it.inputs, it.eager)] for it in items]
    plans: dict[str, dict[str, Any]] = {}
    results: dict[str, list[dict]] = {}

    def done(ex_id: str, res: list[dict]) -> None:
        results[ex_id] = res
        report(ex_id, res)

    # the functions first, outside the trace: a notebook's answer cells run as they would in the
    # notebook (a cell's own jax.numpy code computes values, not parts of the program)
    for it in items:
        fn, error = function(it.id)
        if error:
            done(it.id, _import_error(error, len(it.inputs)))
        else:
            plans[it.id] = {"fn": fn, "slots": {}, "refused": {}}

    def together():
        outs = []
        for it, a in zip(items, args):
            if it.id not in plans:
                continue
            start(it.id)  # again: its cases are traced now
            plan = plans[it.id]
            fn = plan["fn"]
            for i, x in enumerate(a):
                if it.eager[i]:
                    continue
                try:
                    o = it.probe(for_case(fn, i), **x)
                except (NotImplementedError, concrete) as err:
                    plan["refused"][i] = err  # raised on the concrete input: what an eager run raises too
                    continue
                except Exception:  # noqa: BLE001 - maybe a tracing artefact: this case runs on its own
                    continue
                if _plain_leaves(o):
                    plan["slots"][i] = len(outs)
                    outs.append(o)
        return outs

    try:
        program = jax.jit(together).trace()
        phase("compile")
        n = sum(len(p["slots"]) for p in plans.values())
        outs = compile_for_workers(program.lower())() if n else []
        _ran[0] += 1  # the program ran: so did whatever host callbacks the submission put in it
    except Exception:  # noqa: BLE001 - the job as a whole cannot be compiled: each exercise as its own
        for it in items:  # program, and an exercise that cannot be one case by case
            if it.id in results:
                continue
            start(it.id)
            fn = plans[it.id]["fn"]
            done(it.id, evaluate_job([it], lambda ex_id: (fn, None))[it.id] if len(items) > 1
                 else [(_eager if e else evaluate)(for_case(fn, i), it.probe, x, exercise=it.id)
                       for i, (x, e) in enumerate(zip(it.inputs, it.eager))])
        return results
    for it in items:
        if it.id in results:
            continue
        plan = plans[it.id]
        res: list[dict | None] = [None] * len(it.inputs)
        for i, slot in plan["slots"].items():
            try:
                res[i] = {"status": "ok", "value": flatten(outs[slot], backend="jax" if _has_array(it.inputs[i]) else None)}
            except Exception:  # noqa: BLE001 - e.g. not a plain value: this case runs on its own
                pass
        for i, err in plan["refused"].items():
            res[i] = _failure(err, "jax", it.id)
        if any(r is None for r in res):
            start(it.id)  # what runs now is this exercise's
            for i, r in enumerate(res):
                if r is None:
                    res[i] = (_eager if it.eager[i] else evaluate)(for_case(plan["fn"], i), it.probe, it.inputs[i],
                                                                   exercise=it.id)
        done(it.id, res)
    return results


def record_job(items: list[JobItem], function: Callable[[str], tuple[Any, str | None]],
               start: Callable[[str], None] = lambda ex_id: None,
               report: Callable[[str, dict], None] = lambda ex_id, staged: None) -> dict[str, dict]:
    """Every case of every exercise of a JAX job traced, never differentiated (:mod:`attn_course.replay`).

    For each exercise, ``report(id, {"programs": ..., "cases": [...]})``: the
    programs its function traced to (:mod:`attn_course.jaxpr_wire`), and per
    case its recorded calls (``{"status": "staged", ...}``) or its failure --
    the error the function raised as the case was traced, or, for a case that
    cannot be traced, as it ran op by op (what :func:`evaluate_job` would
    report); an exercise whose function cannot be had reports the import's
    failure for every case.  ``function`` and ``start`` are called as
    :func:`evaluate_job` calls them: each exercise's function first, then each
    exercise's start as its cases are traced.
    """
    from .replay import record_case

    inline_where()  # (as the evaluating process traces the probes: the same programs)
    concrete = _concrete_check_type()
    functions: dict[str, Any] = {}
    staged: dict[str, dict] = {}
    for it in items:
        fn, error = function(it.id)
        if error:
            staged[it.id] = {"programs": None, "cases": _import_error(error, len(it.inputs))}
            report(it.id, staged[it.id])
        else:
            functions[it.id] = fn
    for it in items:
        if it.id not in functions:
            continue
        if not it.traced:  # (Exercise.traced)
            fn = functions[it.id]
            staged[it.id] = {"results": evaluate_job([it], lambda ex_id: (fn, None), start=start)[it.id]}
            report(it.id, staged[it.id])
            continue
        start(it.id)
        encoder, cases = jaxpr_wire.Encoder(), []
        for x, eager in zip(it.inputs, it.eager):
            try:
                cases.append(record_case(functions[it.id], it.probe, to_backend(x), eager, encoder))
                continue
            except (NotImplementedError, concrete) as err:  # refused on the concrete input: as evaluate_job
                cases.append(_failure(err, "jax", it.id))
                continue
            except Exception as err:  # noqa: BLE001 - not traceable: op by op, as evaluate_job runs it
                if eager:
                    cases.append(_failure(err, "jax", it.id))
                    continue
            try:
                cases.append(record_case(functions[it.id], it.probe, to_backend(x), True, encoder))
            except Exception as err:  # noqa: BLE001 - the submission's exception is data
                cases.append(_traced_failure(err, it.id))
        staged[it.id] = {"programs": encoder.data(), "cases": cases}
        report(it.id, staged[it.id])
    return staged


# JAX's errors for a Python decision on a traced value (if x > 0, float(x), np.asarray(x))
TRACER_ERRORS = ("ConcretizationTypeError", "TracerBoolConversionError", "TracerIntegerConversionError",
                 "TracerArrayConversionError")
TRACED_DERIVATIVE = ("its derivative is taken from the program JAX traces of it, on arrays whose values "
                     "are not known as it is traced: decide with jnp.where or lax.cond, not Python's if, "
                     "float() or NumPy, on values computed from a differentiated input. ")


def _traced_failure(err: Exception, exercise: str) -> dict[str, Any]:
    """A case's failure as it ran op by op (:func:`record_job`); a Python decision on a traced value
    said as what the course asks of a function whose derivative is graded."""
    out = _failure(err, "jax", exercise)
    if out.get("type") in TRACER_ERRORS:
        out["message"] = (TRACED_DERIVATIVE + out["message"])[:MAX_MESSAGE]
    return out


def evaluate_staged(items: list[JobItem], staged: dict[str, dict],
                    start: Callable[[str], None] = lambda ex_id: None,
                    phase: Callable[[str], None] = lambda name: None,
                    report: Callable[[str, list[dict]], None] = lambda ex_id, results: None) -> dict[str, list[dict]]:
    """The recorded cases of :func:`record_job`, evaluated here (differentiated, compiled, run) as
    :func:`evaluate_job` evaluates a function's: ``items`` hold the recorded cases' inputs only, and
    ``staged[id]`` is ``{"programs": ..., "cases": [recorded calls, one per input]}``.  An exercise
    whose programs cannot be read fails each case with the reason."""
    from .replay import Replayed

    functions: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for it in items:
        data = staged.get(it.id) or {}
        try:
            cases = data.get("cases")
            if not isinstance(cases, list) or len(cases) != len(it.inputs):
                raise jaxpr_wire.WireError("not one record per case")
            functions[it.id] = Replayed(jaxpr_wire.Program(data.get("programs")), cases)
        except jaxpr_wire.WireError as err:
            errors[it.id] = f"the traced program cannot be read: {err}"

    results = {}
    for it in items:  # (said as what it is: not an import's failure)
        if it.id in errors:
            results[it.id] = [{"status": "raised", "type": "WireError", "message": errors[it.id][:MAX_MESSAGE]}
                              ] * len(it.inputs)
            report(it.id, results[it.id])
    rest = [it for it in items if it.id not in errors]
    if rest:
        results.update(evaluate_job(rest, lambda ex_id: (functions[ex_id], None), start=start, phase=phase,
                                    report=report))
    return results


class _Notebook:
    """A notebook's cells, run in order in one namespace, as far as each exercise needs.

    ``notebook`` is ``{"setup": source, "exercises": [{"id", "cells": [{"name",
    "source"}]}]}``: the release's locked cells and the student's answer
    cells.  Cells of exercises that are not in the job (one that hung on an
    earlier try) are skipped; an exercise's cells run only once it has
    started, so a cell that hangs costs its own exercise.  Each answer also
    replaces the library function of the same name, so library code that
    calls it (another exercise) uses the student's.
    """

    def __init__(self, notebook: dict, exercises: dict, wanted: set[str]):
        self.exercises = exercises
        self.ns: dict[str, Any] = {"__name__": "__notebook__"}
        self.todo = [item for item in notebook["exercises"] if item["id"] in wanted]
        self.found: dict[str, tuple[Any, str | None]] = {}
        self.setup_error = None
        try:
            exec(compile(notebook.get("setup", ""), "<notebook setup cell>", "exec"), self.ns)
        except BaseException as err:  # noqa: BLE001
            self.setup_error = f"the notebook's setup cell failed: {type(err).__name__}: {err}"

    def function(self, ex_id: str) -> tuple[Any, str | None]:
        while ex_id not in self.found and self.todo:
            self._run(self.todo.pop(0))
        return self.found.get(ex_id, (None, f"the notebook has no answer for {ex_id}"))

    def _run(self, item: dict, _ran: list = _RAN) -> None:
        ex = self.exercises[item["id"]]
        error = self.setup_error
        if error is None:
            for cell in item["cells"]:
                _ran[0] += 1
                try:
                    exec(compile(cell["source"], f"<notebook cell {cell['name']}>", "exec"), self.ns)
                except BaseException as err:  # noqa: BLE001 - the submission's failure is data
                    error = f"cell {cell['name']} failed: {type(err).__name__}: {err}"
                    break
        fn = self.ns.get(ex.name) if error is None else None
        if error is None and not callable(fn):
            error = f"the answer cell does not define {ex.name}"
        if error is None:
            try:
                setattr(importlib.import_module(f"attn_tensors.{ex.module}"), ex.name, fn)
            except Exception:  # noqa: BLE001
                pass
        self.found[ex.id] = (fn, error)


PACKAGE_DOES_NOT_IMPORT = values.PACKAGE_DOES_NOT_IMPORT


def _package_path(filename: str) -> str:
    """``attn_tensors/...`` of a file in the job's package (the rest of its path is the worker's)."""
    parts = Path(filename.replace("\\", "/")).parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("attn_tensors"):]) if "attn_tensors" in parts else ""


def _located(err: BaseException) -> str:
    """An exception while importing, with the package file and line where it happened."""
    if isinstance(err, SyntaxError):
        where = _package_path(err.filename or "") or (err.filename or "") or _module_with_a_nul()
        line = (err.text or "").strip()
        return (f"{where}{f':{err.lineno}' if err.lineno else ''}: {type(err).__name__}: {err.msg}"
                + (f"\n    {line[:200]}" if line else ""))
    where = _where(err.__traceback__)
    return (f"{where}: " if where else "") + f"{type(err).__name__}: {_text(err)}"


def _module_with_a_nul() -> str:
    """``attn_tensors/...`` of the package's first module holding a NUL byte, or "".

    Python's SyntaxError for one ("source code string cannot contain null
    bytes") names neither file nor line: the student would not know where to look.
    """
    package = sys.modules.get("attn_tensors")
    for root in getattr(package, "__path__", None) or []:
        for path in sorted(Path(root).rglob("*.py")):
            try:
                if b"\0" in path.read_bytes():
                    return _package_path(str(path))
            except OSError:
                continue
    return ""


def import_failure(err: BaseException) -> str:
    """Why the package does not import, with the file and line where it failed."""
    return f"{PACKAGE_DOES_NOT_IMPORT}: {_located(err)}"[:MAX_MESSAGE]


_getprofile, _gettrace = sys.getprofile, sys.gettrace
_BASELINE: Any = None  # what the watched code was before any job (attn_course.tamper), in a template


def as_graded(fn: Callable, _ran=_RAN, _hooked=_HOOKED, _hooks=_HOOKS) -> Callable:
    """``fn``, whose result is refused where it is a Python list (numbers not made an array): the
    probes read the result as an array, and a list was their AttributeError ('list' object has no
    attribute 'size'), a symptom; this says what it is, wherever the probe calls it.  The reference
    is called so too where its program fills the workers' compilation cache
    (:func:`attn_course.runner.fill_worker_cache`): the same program as an honest job's.
    (The counters are held as defaults, bound as this module was imported: a submission may
    rebind the module's globals before its functions are wrapped.)"""
    getprofile, gettrace = _getprofile, _gettrace

    @functools.wraps(fn)
    def call(*args, **kwargs):
        _ran[0] += 1  # the submission's code runs (run_job looks for what it changed before reporting)
        if getprofile() is not _hooks[0][0] or gettrace() is not _hooks[0][1]:  # (a hook could put
            _hooked[0] = True                                                   # back what it changed)
        out = fn(*args, **kwargs)
        if getprofile() is not _hooks[0][0] or gettrace() is not _hooks[0][1]:
            _hooked[0] = True
        if isinstance(out, list):
            raise NotPlainValue("the result is a Python list, expected an array: make it one with xp.asarray")
        return out

    return call


def _not_json(obj: Any) -> Any:
    raise TypeError(f"not a JSON value: {type(obj).__name__}")


def _dumps(obj: Any, _encoder=json.encoder.c_make_encoder, _default=_not_json,
           _ascii=json.encoder.encode_basestring_ascii, _join="".join) -> str:
    """``json.dumps(obj, allow_nan=False)``, with what it calls bound as this module is imported (in
    the server, before any job): a job's code may rebind ``json``'s functions or classes, which
    the worker's lines would otherwise be written with (:mod:`attn_course.tamper` says so only
    after the fact)."""
    return _join(_encoder({}, _default, _ascii, None, ": ", ", ", False, False, False)(obj, 0))


def run_job(job: dict, package: Path, out, seal: Callable[[str], str] | None = None) -> None:
    """Each exercise of the job on the package; one JSON line per exercise to ``out``.

    ``seal`` (:func:`attn_course.watch.watch_runs`'): each line is sealed with the job's watch's
    key, so that the runner takes no line of the job's own making for the worker's.

    ``job["backend"]`` ("jax" when absent, or "mlx") is the framework of the case inputs;
    on JAX, ``job["programs"]`` is "job" (when absent: the whole job as one program) or
    "exercise" (one program per exercise, :class:`attn_course.runner.Programs`).
    """
    from .registry import all_exercises

    exercises = all_exercises()
    if job.get("evaluate") is True:  # (no package: what a job traced, evaluated here)
        evaluate_job_records(job, exercises, out, seal)
        return
    backend = job.get("backend", "jax")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}")
    # MLX is loaded by the jobs that run on it only (never by the server or its template, whose
    # baseline then has none of it): here, before the package, so that what the probes call of it
    # is taken with the rest (red team, round 14: mlx.core.value_and_grad replaced, 3.2's nan gradient 3/3)
    fresh = backend == "mlx" and "mlx.core" not in sys.modules
    if fresh:
        import mlx.core  # noqa: F401
    base = _BASELINE if _BASELINE is not None and not fresh else tamper.take()  # before any of the submission runs
    _HOOKS[0] = (sys.getprofile(), sys.gettrace())
    # what the job's reports are checked and written with, held before any of the submission runs:
    # it may rebind this module's globals (red team: worker.tamper, whose changed() said nothing)
    changed, swapped, hooked, encode, ran = tamper.changed, watch.SWAPPED, _HOOKED, values.encode, _RAN
    foreign = watch.foreign_code()  # (native code the job had loaded: watch.foreign_code)
    if backend == "jax":  # (the probes too: the package may change the course's data as it loads)
        items = [JobItem(item["id"], exercises[item["id"]].probe,
                         [values.decode(case["inputs"]) for case in item["cases"]],
                         [case.get("eager") is True for case in item["cases"]], exercises[item["id"]].traced)
                 for item in job["exercises"]]
    channel, write = out.fileno(), os.write  # (held before any of the job runs)

    def say(name: str, _dumps=_dumps, _seal=seal, _write=write, _channel=channel) -> None:
        """A code swap, as the watch's hook sees it made: said at once, sealed (what it calls bound
        now: the job may rebind this module's globals)."""
        text = _dumps({"swapped": name})
        _write(_channel, ((_seal(text) if _seal is not None else text) + "\n").encode())

    watch.watch_code_swaps(package, say)
    try:
        load_package(package)
        load_error = None
    except BaseException as err:  # noqa: BLE001 - the submission's failure is data
        load_error = import_failure(err)
    ran[0] += 1
    from_notebook = None
    if load_error is None and job.get("notebook") is not None:
        from_notebook = _Notebook(job["notebook"], exercises, {item["id"] for item in job["exercises"]})

    me = os.getpid()

    def line(obj: dict) -> None:
        if os.getpid() != me:  # a copy that the submission forked, back in this code: it ends here,
            os._exit(0)        # instead of running (and reporting) the rest of the job a second time
        text = _dumps(obj)
        out.write((seal(text) if seal is not None else text) + "\n")
        out.flush()

    def function(ex_id: str) -> tuple[Any, str | None]:
        if load_error is not None:
            return None, load_error
        if from_notebook is not None:
            line({"start": ex_id})  # its answer cells run now
            fn, error = from_notebook.function(ex_id)
            return (as_graded(fn) if callable(fn) else fn), error
        try:
            return as_graded(resolve(exercises[ex_id].function)), None
        except BaseException as err:  # noqa: BLE001
            return None, f"{values.CANNOT_IMPORT}{exercises[ex_id].function}: {_located(err)}"

    looked = [-1, ""]  # _RAN when the job last looked for code it changed, and what it found

    def look() -> None:
        """Whether the submission changed what checks it (:mod:`attn_course.tamper`): as its cases
        are traced, before any result is reported, and again wherever its code ran since."""
        if not looked[1] and (looked[0] == -1 or looked[0] != ran[0]):
            looked[0] = ran[0] if ran[0] != -1 else 0
            looked[1] = ("a profile or trace hook (sys.setprofile, sys.settrace)" if hooked[0]
                         else f"the code of {swapped[0]} (replaced)" if swapped[0]
                         else changed(base) or foreign() or "")

    def report(ex_id: str, results: list[dict]) -> None:
        # results computed with code the submission changed (a probe, jax.value_and_grad, a
        # derivative rule) are not its own function's: the exercise is "tampered", and every later one
        look()
        if looked[1]:  # (plain strings: written without values.encode, which the job may have rebound)
            line({"id": ex_id, "results": [{"status": "tampered",
                                            "message": f"{values.TAMPERED}: {looked[1]}"[:MAX_MESSAGE]}] * len(results)})
            return
        line({"id": ex_id, "results": encode(results)})

    if backend == "jax":  # traced here; differentiated, compiled and run by an evaluation job
        def staged(ex_id: str, payload: dict) -> None:
            cases = payload.get("cases")
            if "results" in payload or payload.get("programs") is None or not any(
                    c.get("status") == "staged" for c in cases):
                report(ex_id, payload.get("results", cases))  # (nothing to evaluate: these are its results)
                return
            look()
            if looked[1]:
                report(ex_id, cases)  # (tampered)
                return
            line({"id": ex_id, "staged": payload})

        start = lambda ex_id: line({"start": ex_id})  # noqa: E731
        record_job(items, function, start=start, report=staged)
        return
    for item in job["exercises"]:
        ex = exercises[item["id"]]
        line({"start": ex.id})
        fn, error = function(ex.id)
        report(ex.id, _exercise_results(ex, fn, item["cases"], error, backend))


def evaluate_job_records(job: dict, exercises: dict, out, seal: Callable[[str], str] | None = None) -> None:
    """An evaluation job (``"evaluate": true``): each exercise's recorded cases (``"staged"``, from
    a job's :func:`record_job`) evaluated by :func:`evaluate_staged`, one JSON line per exercise as
    :func:`run_job` writes them.  Its process is forked from the template and runs none of a
    submission's code: what it differentiates is the programs' data (:mod:`attn_course.jaxpr_wire`)."""

    def line(obj: dict) -> None:
        text = _dumps(obj)
        out.write((seal(text) if seal is not None else text) + "\n")
        out.flush()

    items = [JobItem(item["id"], exercises[item["id"]].probe, [values.decode(c["inputs"]) for c in item["cases"]],
                     [False] * len(item["cases"])) for item in job["exercises"]]
    staged = {item["id"]: item["staged"] for item in job["exercises"]}
    start = lambda ex_id: line({"start": ex_id})  # noqa: E731
    report = lambda ex_id, results: line({"id": ex_id, "results": values.encode(results)})  # noqa: E731
    if job.get("programs") == "exercise":
        for it in items:
            evaluate_staged([it], staged, start=start, report=report)
    else:
        evaluate_staged(items, staged, start=start, phase=lambda name: line({"phase": name}), report=report)


def _import_jax() -> None:
    """Import JAX, without its searches of every installed package's metadata for plugins.

    JAX (0.10) reads the metadata of each distribution in the environment as
    it is imported, to find a ``jax-rocm*-plugin`` (about 0.1 CPU-s with the
    course's 190 packages, in every worker server), and again as its backend
    starts, for the entry points of PJRT plugins (about 0.03 CPU-s, in every
    job's child: the backend starts there, after the fork).  A worker runs JAX
    on the CPU only (``JAX_PLATFORMS=cpu``, :func:`attn_course.sandbox.worker_env`),
    where no plugin is used: both searches are shown no distributions, and the
    second is done here, once, so that the children inherit its answer.
    Elsewhere JAX imports as usual.
    """
    if "jax" in sys.modules or os.environ.get("JAX_PLATFORMS") != "cpu":
        import jax  # noqa: F401
        return
    import importlib.metadata as metadata

    distributions = metadata.distributions
    metadata.distributions = lambda *args, **kwargs: iter(())
    try:
        import jax  # noqa: F401
        from jax._src import xla_bridge

        discover = getattr(xla_bridge, "_discover_and_register_pjrt_plugins", None)
        if discover is not None:  # (JAX's own: it only imports and registers, it starts no backend)
            try:
                discover()
            except Exception:  # noqa: BLE001 - an optimisation only: each child searches again, as before
                pass
    finally:
        metadata.distributions = distributions


def _setup_jax() -> None:
    _import_jax()
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")
    # an error raised through JAX's API (an input check, a stub's NotImplementedError as it is traced)
    # is not rewritten on its way out: its filtering reads every frame's file name, 4 ms an error,
    # and the job reports only where in attn_tensors it was raised (_where), which it keeps
    jax.config.update("jax_traceback_filtering", "off")
    inline_where()  # before warm.prime traces anything
    if os.environ.get("ATTN_COURSE_CACHE"):
        from .xla_cache import enable_compile_cache

        enable_compile_cache(os.environ["ATTN_COURSE_CACHE"])


_SAFE_FILE = re.compile(r"\Aattn_tensors/(?:[A-Za-z_][A-Za-z0-9_]*/)*[A-Za-z_][A-Za-z0-9_]*\.py\Z")


def _write_package(files: dict[str, str], dest: Path) -> None:
    for name, source in files.items():
        if not _SAFE_FILE.match(name):
            raise ValueError(f"refusing to write {name!r}")
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source, encoding="utf-8")  # (Python source is UTF-8, PEP 3120)


def place_release_bytecode(files: dict[str, str], dest: Path, staged: Path = watch.RELEASE_BYTECODE) -> list[str]:
    """Where a module of ``files`` (written under ``dest``) is the stub release's byte for byte, the
    release's compiled module (``staged``) is put where the import system looks for it; the names.

    The job then loads it instead of compiling that source (a chapter-3 job compiled seven
    modules, three of them the release's: about 5 ms of its child's CPU time).  The bytecode is checked by
    the hash of its source (PEP 552), here and again by Python as it imports: a module that differs
    in one byte is compiled from its own source, as before.  The code's file names are the job's
    (the import system sets them to the source's path as it loads), so the job's own code is as
    much its own (:mod:`attn_course.watch`) either way.
    """
    placed = []
    for name, source in files.items():
        try:
            code = Path(importlib.util.cache_from_source(str(staged / name))).read_bytes()
            digest = importlib.util.source_hash(source.encode("utf-8"))
        except (OSError, ValueError):  # (none staged for it; a source that is not UTF-8 is not the release's)
            continue
        # (the header: magic, flags -- 3 for a hash checked against the source --, the source's hash)
        if len(code) < 16 or code[4:8] != b"\x03\0\0\0" or code[8:16] != digest:
            continue
        target = Path(importlib.util.cache_from_source(str(dest / name)))
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(code)
        placed.append(name)
    return placed


def remove_tree(path: str) -> None:
    """Remove a file or a whole folder, even one whose permissions the job took away."""
    if os.path.isdir(path) and not os.path.islink(path):
        try:
            os.chmod(path, 0o700)
            entries = os.listdir(path)
        except OSError:
            entries = []
        for entry in entries:
            remove_tree(os.path.join(path, entry))
        try:
            os.rmdir(path)
        except OSError:
            pass
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def _snapshot(folder: str) -> dict[str, int]:
    """Every path under ``folder`` with its mode, not descending into mount points.

    The sandbox's ``/tmp`` may hold the folders that lead to a read-only bind
    (a Python environment or a clone that lives under ``/tmp``): those are
    the server's, recorded before any job, and restored after each.
    """
    found: dict[str, int] = {}

    def walk(path: str) -> None:
        for entry in os.listdir(path):
            p = os.path.join(path, entry)
            found[p] = os.lstat(p).st_mode
            if os.path.isdir(p) and not os.path.islink(p) and not os.path.ismount(p):
                walk(p)

    walk(folder)
    return found


def _empty(folder: str, keep: dict[str, int] | None = None) -> bool:
    """Remove everything in ``folder`` but the paths in ``keep`` (with their modes restored);
    True when exactly those are left."""
    keep = keep or {}
    try:
        def clean(path: str) -> None:
            for entry in os.listdir(path):
                p = os.path.join(path, entry)
                if p not in keep:
                    remove_tree(p)
                    continue
                if os.path.ismount(p):
                    continue  # a read-only bind (a Python environment under /tmp): nothing of the job's
                if os.path.isdir(p) and not os.path.islink(p):
                    os.chmod(p, 0o700 | keep[p])
                    clean(p)
                    os.chmod(p, keep[p] & 0o7777)

        clean(folder)
        return _snapshot(folder) == keep
    except (OSError, RecursionError):
        return False


class _Control:
    """The server's stdin, read by lines from one buffer of its own (not Python's, which could
    read a stop line ahead with the job and hide it from ``select``)."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.eof = fd, bytearray(), False

    def fill(self) -> None:
        """One read of what has arrived (blocks if nothing has: call it when ``select`` says so)."""
        data = os.read(self.fd, 1 << 20)
        self.eof = self.eof or not data
        self.buf += data

    def line(self) -> bytes | None:
        """The next whole line, if one has arrived."""
        end = self.buf.find(b"\n")
        if end < 0:
            return None
        line = bytes(self.buf[:end])
        del self.buf[:end + 1]
        return line

    def readline(self) -> bytes | None:
        """The next line, waiting for it; None at the end of the input (the grader is gone)."""
        while (line := self.line()) is None:
            if self.eof:
                return None
            self.fill()
        return line


PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36  # prctl's options (linux/prctl.h)


def _prctl(libc, option: int, arg: int) -> bool:
    """Linux's ``prctl``; nothing where the C library has none (macOS: a student's ``check``,
    whose Plain sandbox runs the student's own code on their own machine).  False there."""
    prctl = getattr(libc, "prctl", None)
    if prctl is None:
        return False
    prctl(option, arg, 0, 0, 0)
    return True


def _end_with_parent(parent: int) -> None:
    """Where no parent-death signal exists (macOS): a thread that ends this process once its
    parent is gone, as the signal would (a job whose server was killed, by a Ctrl-C of check,
    would otherwise spin on, orphaned, until its CPU limit)."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="attn-parent-watch", daemon=True).start()


STOP = {"stop": True}  # while a job runs: end it now (a limit was reached); ignored between jobs


def proc_status(*fields: str) -> Iterator[tuple[int, dict[str, list[str]]]]:
    """Each process of this pid namespace (its pid) with the named fields of its
    ``/proc/PID/status`` (those it has, each as its words), read up to the last of them."""
    wanted = set(fields)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        found: dict[str, list[str]] = {}
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in wanted:
                        found[key] = value.split()
                        if len(found) == len(wanted):
                            break
        except OSError:
            continue
        yield int(name), found


def processes_of(uid: int) -> list[int]:
    """The living processes of this pid namespace that run as ``uid`` (real, effective, saved or
    filesystem uid); a zombie is dead (a container's init may never reap it)."""
    return [pid for pid, status in proc_status("State", "Uid")
            if status.get("State", ["?"])[0] != "Z" and str(uid) in status.get("Uid", [])]


def _kill_others(in_pid_namespace: bool, child: int, template: int, own_user: bool = False) -> bool:
    """End every process but this server and its template; True when none is left.  Without a pid
    namespace of its own: the job's process group, and where the server runs as a user of its own
    (``own_user``), every other process of that user (one that left the job's group included)."""
    me = os.getpid()
    if not in_pid_namespace:
        try:
            os.killpg(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if not own_user:
            return True
    for _ in range(50):
        if in_pid_namespace:
            others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me, template)]
        else:
            others = [p for p in processes_of(os.getuid()) if p not in (me, template)]
        if not others:
            return True
        for other in others:
            try:
                os.kill(other, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for other in others:
            try:
                os.waitpid(other, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.002)
    return False


def _sysv_ipc() -> bool:
    """Whether a System V shared memory segment, semaphore set or message queue exists (in the
    sandbox's own IPC namespace: one left by a job would outlive it, for the next to read)."""
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                if len(f.read().strip().splitlines()) > 1:  # a header line, then one per object
                    return True
        except OSError:
            continue
    return False


def _last_line(path: Path) -> str:
    """The last line of the job's log, if it is a plain file (the job may have put a FIFO, a
    device or a link there: opening a FIFO would block the server until someone writes)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        os.lseek(fd, max(0, st.st_size - 4096), os.SEEK_SET)
        lines = os.read(fd, 4096).decode("utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    finally:
        os.close(fd)
    return lines[-1][:400] if lines else ""


class _Folder(NamedTuple):
    """What a scratch folder (``/tmp``, ``/dev/shm``) was like before any job: its own mode and
    times (a job can change those of the folder itself, not only its contents) and its free space."""

    path: str
    mode: int
    times: tuple[int, int]
    free: tuple[int, int]


def _folder(path: str) -> _Folder:
    st, fs = os.stat(path), os.statvfs(path)
    return _Folder(path, st.st_mode & 0o7777, (st.st_atime_ns, st.st_mtime_ns), (fs.f_bfree, fs.f_ffree))


def _as_before(folder: _Folder) -> bool:
    """Put the folder itself back as it was (mode, times, no extended attribute); False when that
    fails, or when space is still taken (a file unlinked but still open: in flight in a socket
    that nothing can reach, it fills the next job's scratch until the kernel collects it)."""
    try:
        for name in os.listxattr(folder.path, follow_symlinks=False):
            os.removexattr(folder.path, name, follow_symlinks=False)
        os.chmod(folder.path, folder.mode)
        os.utime(folder.path, ns=folder.times)
        fs = os.statvfs(folder.path)
        return (fs.f_bfree, fs.f_ffree) == folder.free and not os.listxattr(folder.path, follow_symlinks=False)
    except OSError:
        return False


# keyctl's system call, by machine (no library for it in Python's); KEYCTL_CLEAR is 7
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "ppc64le": 271, "s390x": 280, "riscv64": 219}


def _keys() -> set[str] | None:
    """The keys in sight that are not keyrings (their ids), from ``/proc/keys``; None without it."""
    try:
        with open("/proc/keys") as f:
            rows = [ln.split() for ln in f.read().splitlines()]
    except OSError:
        return None  # keys are not compiled in
    return {row[0] for row in rows if len(row) < 8 or row[7] != "keyring"}


def _clear_keyrings(libc) -> bool:
    """Empty the keyrings that outlive a job: the session's, the user's two (they live as long as
    the sandbox's user namespace) and the user's persistent keyring (days, held by no process).
    A key there need not be in sight (a job can take away its view permission): emptying unlinks
    it all the same.  False if one of them could not be emptied (a job changed its permissions)."""
    import ctypes
    import platform

    number = _SYS_KEYCTL.get(platform.machine())
    if number is None:
        return True
    ok = True
    for ring in (-3, -4, -5):  # KEY_SPEC_SESSION_KEYRING, _USER_KEYRING, _USER_SESSION_KEYRING
        ok = libc.syscall(number, 7, ctypes.c_long(ring)) == 0 and ok  # KEYCTL_CLEAR
    # KEYCTL_GET_PERSISTENT (own uid, linked into this process's keyring); none where not built in
    persistent = libc.syscall(number, 22, ctypes.c_long(-1), ctypes.c_long(-2))
    if persistent > 0:
        ok = libc.syscall(number, 7, ctypes.c_long(persistent)) == 0 and ok
    return ok


def _no_keys(libc, before: set[str] | None) -> bool:
    """Empty the keyrings that outlive a job (:func:`_clear_keyrings`), then True when that worked
    and no key is in sight that was not before any job (``before``: the host's own, such as the
    kernel's built-in ones)."""
    cleared = _clear_keyrings(libc)
    now = _keys()
    return cleared and (now is None or now <= (before or set()))


# ioprio_get's (IOPRIO_WHO_PROCESS is 1) and sched_getattr's system calls, by machine
_SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31, "ppc64le": 274, "s390x": 283, "riscv64": 31}
_SYS_SCHED_GETATTR = {"x86_64": 315, "aarch64": 275, "ppc64le": 356, "s390x": 346, "riscv64": 275}
# every resource limit of Linux (RLIM_NLIMITS is 16), those Python has no name for included: a
# limit the kernel ignores (RLIMIT_LOCKS, 10) is still 64 bits a job could pass to the next
_RLIMITS = tuple(range(16))


def _marks(pid: int, libc) -> tuple | None:
    """What a job can change of another process of its user (the server, its template) and every
    later job would inherit or suffer: its resource limits (``prlimit``), nice value, scheduling
    policy and priority, CPU affinity, I/O priority, its whole scheduling attributes (a slice,
    utilisation clamps: ``sched_getattr``), its OOM score adjustment, its autogroup's nice
    value and its core dump filter (files of ``/proc`` a process of the same user may write).  None if they cannot be read."""
    import ctypes
    import platform

    try:
        limits = tuple(resource.prlimit(pid, r) for r in _RLIMITS)
        sched = (os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid),
                 os.sched_getparam(pid).sched_priority, tuple(sorted(os.sched_getaffinity(pid))))
    except (OSError, ValueError, AttributeError):  # (the last: not Linux, where none of these exists)
        return None
    machine = platform.machine()
    number = _SYS_IOPRIO_GET.get(machine)
    io = libc.syscall(number, 1, pid) if number is not None else None
    attr = None
    number = _SYS_SCHED_GETATTR.get(machine)
    if number is not None:
        buf = ctypes.create_string_buffer(128)
        attr = buf.raw if libc.syscall(number, pid, buf, 128, 0) == 0 else None
    files = []
    for name in ("oom_score_adj", "autogroup", "coredump_filter"):  # (the last: bits a child inherits)
        try:
            with open(f"/proc/{pid}/{name}") as f:
                text = f.read().strip()
        except OSError:
            text = None
        files.append(text.rsplit("nice", 1)[-1].strip() if name == "autogroup" and text else text)
    return limits + sched + (io, attr, *files)


def _inet_sockets() -> tuple[int, ...]:
    """How many rows each of the sandbox's ``/proc/net/{tcp,tcp6,udp,udp6,raw,raw6}`` has: none
    is left by a job that ended cleanly (its own network namespace), but a closed connection
    stays in TIME_WAIT for a minute, with addresses and ports the next job can read."""
    rows = []
    for name in ("tcp", "tcp6", "udp", "udp6", "raw", "raw6"):
        try:
            with open(f"/proc/net/{name}") as f:
                rows.append(len(f.read().strip().splitlines()) - 1)
        except OSError:
            rows.append(-1)
    return tuple(rows)


def _unix_sockets() -> frozenset[str]:
    """The inodes of the unix sockets of the sandbox's network namespace (``/proc/net/unix``).

    Between jobs only the server's socket pair with its template is left.
    Any other is held by nothing but a message in flight (a job passed its
    descriptors around a cycle of sockets, then died): what it carries --
    an open file that fills the scratch, a descriptor armed to signal the
    template (``F_SETOWN``, ``F_SETSIG``) when the next job touches a
    folder -- would act on the next job."""
    try:
        with open("/proc/net/unix") as f:
            return frozenset(ln.split()[6] for ln in f.read().splitlines()[1:] if len(ln.split()) > 6)
    except OSError:
        return frozenset()


TEMPLATE_LOOK_S = 0.25  # how often the server looks at the template while a job runs or warms


def _state(pid: int) -> str:
    """A process's state letter (R, S, T for stopped, t for traced, Z...); '' when it is gone.

    Without ``/proc`` (macOS) a process that exists counts as sleeping ("S"): a stopped one
    cannot be told apart there, which only matters where the job is not the student's own."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        pass
    if os.path.isdir("/proc/self"):
        return ""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return ""
    except OSError:
        pass  # (it exists, another user's)
    return "S"


def _child(work: Path, results: int, devnull: int, cpu: int, template: int, libc, dispositions: dict,
           confined: bool = False) -> None:
    """A job's own process (forked by the template): its limits and descriptors, its seccomp
    filter where ``confined``, then the job, read from ``work/job.json`` (written by the server):
    nothing else of any job is in its memory."""
    import resource

    code = 1
    try:
        # it dies with its template (which dies with the server): when the grader kills a server,
        # a pid namespace ends its children with it, but outside one (check's Plain sandbox) the
        # job would run on, orphaned, until its CPU limit
        signalled = _prctl(libc, PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != template:  # the template died before the line above
            os._exit(1)
        if not signalled:
            _end_with_parent(template)
        for sig, handler in dispositions.items():  # as Python starts: the template ignores them all
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        _prctl(libc, PR_SET_DUMPABLE, 1)
        os.setsid()
        log = os.open(work / "output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(results, 3)
        os.closerange(4, 4096)
        os.chdir("/")  # read-only (and never on sys.path: -I)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        # the first the kernel kills when memory runs out (the sandbox's memory group, or the
        # machine's): the job and what it starts, not its server or the grader.  (It can lower the
        # value again, to its server's but not below: then the kernel may kill the server instead,
        # which costs the job its own exercise and the next job a new server, and no one else)
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        # no POSIX message queue (one would outlive the job in the sandbox's IPC namespace,
        # and cannot be listed without a mount to look for it)
        if hasattr(resource, "RLIMIT_MSGQUEUE"):  # (Linux's)
            resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
        if confined:  # before anything of the job is read (best effort: where the kernel has filters)
            seccomp.refuse_kernel_calls(libc)
        sys.stdin = open(os.devnull)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        job = json.loads((work / "job.json").read_text())
        gc.freeze()  # what the template made since (its warm-ups) too: see serve()
        seal = watch.watch_runs(work / "pkg", 3)  # (this process ends with its job: the watch with it)
        with open(3, "w", buffering=1) as out:
            run_job(job, work / "pkg", out, seal)
        code = 0
    except BaseException:  # noqa: BLE001
        code = 1
    os._exit(code)


def _template(sock, server: int, work: Path, devnull: int, libc, confined: bool = False) -> None:
    """The process every job is forked from (forked by the server before it reads any job).

    The server's memory holds what jobs sent and wrote (a package's sources,
    the results it relayed); a child forked from it could read them in its
    own copy (``/proc/self/mem``).  The template never reads a job: it gets
    a results pipe and a CPU limit, forks the job's child, which reads its
    job from a file, and reports the child's pid, then its end; between jobs
    it warms on shapes the server sends (:mod:`attn_course.warm`).  It
    ignores every signal it can, and the server looks at it after each job
    (stopped or gone: a new sandbox).
    """
    import select
    import socket

    _prctl(libc, PR_SET_PDEATHSIG, signal.SIGKILL)  # it dies with the server (Linux)
    if os.getppid() != server:
        os._exit(1)
    me = os.getpid()
    dispositions = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue
        try:
            dispositions[sig] = signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError):
            pass
    dispositions[signal.SIGINT] = signal.default_int_handler
    warmed: set = set()
    global _BASELINE
    _BASELINE = tamper.take()  # what every job's child starts from (taken again after a warm-up)
    while True:
        try:
            # (where no death signal exists, or the socket is a datagram one, which has no end
            # of file: the template looks for its server each second, and ends without it)
            while not select.select([sock], [], [], 1.0)[0]:
                if os.getppid() != server:
                    os._exit(0)
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)  # the server is gone
        order = json.loads(msg)
        if "warm" in order:
            if warm.warm({(tuple(shape), dtype) for shape, dtype in order["warm"]}, warmed):
                _BASELINE = tamper.take()  # (only where it traced something new)
                watch.note_functions()
            sock.send(json.dumps({"backend": warm.backend_started()}).encode())
            continue
        (results,) = fds
        watch.namespaces()  # (what the job's watch starts from: looked for here, once per module)
        pid = os.fork()
        if pid == 0:
            sock.close()
            _child(work, results, devnull, int(order["cpu_s"]), me, libc, dispositions, confined)
        os.close(results)
        sock.send(json.dumps({"pid": pid}).encode())
        while True:  # until it ends (a stop by ptrace, its parent being its tracer, ends it too)
            _, status = os.waitpid(pid, os.WUNTRACED)
            if os.WIFSTOPPED(status):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                continue
            break
        sock.send(json.dumps({"status": status}).encode())


def _socketpair():
    """A pair of connected sockets that keep each message whole and carry descriptors:
    sequenced packets, or datagrams where Unix sockets have no such kind (macOS)."""
    import socket

    try:
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except (OSError, AttributeError):
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)


# the folders every user may write to: where a job of a user of its own (the limits-only
# sandbox's, as root) may leave files for the next job of that user, another student's
SHARED_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/dev/mqueue")


def owned(uid: int) -> frozenset[str]:
    """What ``uid`` owns in :data:`SHARED_FOLDERS` and in the folders there that every user may
    write to too (``/tmp/.X11-unix``)."""
    found: set[str] = set()
    folders, seen = [f for f in SHARED_FOLDERS if not os.path.islink(f)], set()  # (/var/lock: /run/lock)
    while folders:
        folder = folders.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_uid == uid:
                        found.add(entry.path)
                    elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        folders.append(entry.path)
        except OSError:
            pass
    return frozenset(found)


def serve(scratch: str, confined: bool = False, own_user: bool = False) -> int:
    """A fork server: import once, then one fresh child per job (``--serve``).

    ``confined`` (``--confined``, the grading sandboxes): each job's process
    refuses the kernel calls that no job needs (:mod:`attn_course.seccomp`).
    ``own_user`` (``--own-user``, the limits-only sandbox as a user of its own):
    a job that leaves a file of that user in a folder every user may write to
    ends the server (the grader removes the file before the next starts).

    Reads one JSON job per line from stdin, writes the job's package and the
    job itself into an empty ``scratch`` folder (the sandbox's private
    ``/tmp``), has its template fork the job's child (:func:`_template`: a
    child of the server itself would inherit what earlier jobs left in its
    memory), and relays each line the child writes to its results pipe as
    ``{"out": line}``.  A line from the grader while the job runs (``{"stop": true}``:
    the job reached a limit) ends the job at once.  When the child is gone
    it ends every other process of the sandbox, empties ``scratch`` and
    ``/dev/shm`` (and puts those folders themselves back), empties the
    keyrings, and answers ``{"done": status, "tail": last output line,
    "clean": bool}``.  If it cannot leave the sandbox clean (a System V
    object, space still taken, a key, a template stopped, a socket left in
    flight, the limits or scheduling of the server or the template changed)
    it exits, and the grader starts a pristine one.  Then, unless the job says ``"warm":
    false``, the template traces JAX's operations on the job's shapes for
    the children to come (:mod:`attn_course.warm`).  JAX is
    imported here but its backend starts only in the children (XLA's
    threads do not survive a fork).  The server is not dumpable: a child cannot ptrace it
    or open its descriptors; in bubblewrap it is its pid namespace's init, which a child
    cannot stop or kill either.
    """
    import ctypes
    import select
    import socket

    _setup_jax()
    watch.refuse_native_loaders()  # (before anything takes what a job may not change)
    import warnings

    warnings.filterwarnings("ignore", message="Error writing persistent compilation cache")
    import jax.numpy  # noqa: F401 - imported once, here
    from .registry import all_exercises

    all_exercises()
    warm.prime()
    watch.note_functions()  # (what a job may not change the code of: the collector sees them now only)
    watch.release_code()  # (read here, once: each job's watch knows the release's compiled modules)
    # what is imported lives as long as the server: out of the collector's sight (its own and its
    # children's: a job's collections no longer walk JAX's modules)
    gc.freeze()
    gc.enable()  # (off while importing: _server_argv)
    libc = ctypes.CDLL(None, use_errno=True)
    _prctl(libc, PR_SET_DUMPABLE, 0)  # no job can ptrace the server or its template
    server = os.getpid()
    control, control_out = _Control(0), os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    in_pid_namespace = os.getpid() <= 3
    if not in_pid_namespace:  # a job's orphans come to this server, not to the machine's init, or a
        _prctl(libc, PR_SET_CHILD_SUBREAPER, 1)  # container's, which may never reap them: their zombies
        # would stay counted in the slot's pids group and its user's processes, until the next job
        # (another student's) could not start a thread.  The kernel reaps them here (below)
    if os.getpid() == 1:  # its namespace's init (bubblewrap's --as-pid-1): a signal from a job is
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # dropped unless handled: Python's SIGINT no more
    shm = "/dev/shm" if in_pid_namespace and os.path.isdir("/dev/shm") else None
    keep = _snapshot(scratch)  # the mount points' parents, if a bind lives under it
    folders = [_folder(path) for path in (scratch, shm) if path] if in_pid_namespace else []
    keys = _keys()  # (the host's, in sight before any job)
    shared = owned(os.getuid()) if own_user else frozenset()
    work = Path(scratch) / "job"
    # the template every job is forked from, forked before any job is read (see _template)
    ours, theirs = _socketpair()
    template = os.fork()
    if template == 0:
        control_out.close()
        ours.close()
        os.dup2(devnull, 0)
        _template(theirs, server, work, devnull, libc, confined)
        os._exit(0)
    theirs.close()
    # the children of this server that end (its jobs' orphans; the template, forked above with
    # Python's disposition, reaps its jobs itself) are reaped by the kernel at once: no zombie
    # (the template's end is still seen: template_well finds it gone)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    marks = {p: _marks(p, libc) for p in (server, template)}  # before any job
    # the sockets of the sandbox's own network namespace (bubblewrap's; not without one)
    sockets = (_unix_sockets(), _inet_sockets()) if in_pid_namespace else (frozenset(), ())
    if in_pid_namespace:
        _clear_keyrings(libc)  # (the persistent keyring made now, before any key is counted)

    def send(msg: dict) -> None:
        control_out.write(json.dumps(msg) + "\n")

    def ask(order: dict, fds: tuple[int, ...] = (), wait_s: float = 60.0) -> dict | None:
        """An order to the template and its answer; None if it does not answer (stopped, gone)."""
        try:
            socket.send_fds(ours, [json.dumps(order).encode()], list(fds))
            deadline = time.monotonic() + wait_s
            while not select.select([ours], [], [], TEMPLATE_LOOK_S)[0]:
                if time.monotonic() > deadline or not template_well():
                    return None  # (a template stopped or gone cannot answer)
            answer = ours.recv(1 << 16)
            return json.loads(answer) if answer else None
        except (OSError, ValueError):
            return None

    def template_well() -> bool:
        """The template runs on, neither stopped nor traced (a job can signal it: it is not init)."""
        try:
            if os.waitpid(template, os.WNOHANG | os.WUNTRACED)[0]:
                return False
        except ChildProcessError:
            return False
        return _state(template) in ("S", "R", "D")

    send({"ready": True})
    while (line := control.readline()) is not None:
        try:
            job = json.loads(line)
            if job == STOP:  # a stop that came after its job had ended
                continue
            work.mkdir()
            _write_package(job["files"], work / "pkg")
            place_release_bytecode(job["files"], work / "pkg")
            (work / "job.json").write_text(json.dumps({k: v for k, v in job.items() if k != "files"}))
            os.chmod(work, 0o755)
        except Exception:  # noqa: BLE001 - the trusted side sent something this server cannot do
            return 2
        r, w = os.pipe()
        started = ask({"cpu_s": int(job.get("cpu_s", 120))}, (w,))
        os.close(w)
        if started is None:
            return 3  # the template is stopped or gone: a new sandbox
        pid = int(started["pid"])
        buf, status, eof, lost = b"", None, False, False
        halted = False  # the job stopped its template (its parent): it is ended at once
        look = time.monotonic() + TEMPLATE_LOOK_S
        while True:
            ready, _, _ = select.select([control.fd, ours] if eof else [r, control.fd, ours], [], [], 0.05)
            if control.fd in ready:  # first: a job that writes without end must not keep it waiting
                control.fill()
                if control.line() is not None or control.eof:  # a stop (or the grader is gone): end the job
                    if status is None:  # its session (and itself, if it has not made one yet)
                        for kill in (os.killpg, os.kill):  # what left them is ended below
                            try:
                                kill(pid, signal.SIGKILL)
                            except (ProcessLookupError, PermissionError):
                                pass
                    break
            if r in ready:
                chunk = os.read(r, 1 << 20)
                buf += chunk
                while b"\n" in buf:
                    text, buf = buf.split(b"\n", 1)
                    send({"out": text.decode("utf-8", errors="replace")})
                if len(buf) > (32 << 20):
                    send({"out": buf[:1000].decode("utf-8", errors="replace")})
                    buf = b""
                if chunk:
                    continue
                eof = True  # every writer closed its end: no more to read
            if status is not None:
                break  # the child is gone; what it wrote before is read (a leftover is killed below)
            if ours in ready:  # the template says the child is gone (or the template is)
                answer = ours.recv(1 << 16)
                if not answer:
                    lost = True
                    break
                status = int(json.loads(answer)["status"])
            elif time.monotonic() >= look:  # a stopped template cannot report: the job waits for nothing
                look = time.monotonic() + TEMPLATE_LOOK_S
                if not template_well():
                    for kill in (os.killpg, os.kill):
                        try:
                            kill(pid, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass
                    halted = lost = True
                    break
        deadline = time.monotonic() + 10.0
        while status is None and not lost:  # stopped: the template reports the end of the child it killed
            if select.select([ours], [], [], 0.05)[0]:
                answer = ours.recv(1 << 16)
                if not answer:
                    lost = True
                    break
                status = int(json.loads(answer)["status"])
            elif time.monotonic() > deadline or not template_well():
                lost = True  # a template the job stopped cannot report: a new sandbox
        clean = _kill_others(in_pid_namespace, pid, template, own_user) and not lost
        os.close(r)
        tail = _last_line(work / "output.log")
        clean = _empty(scratch, keep) and (shm is None or _empty(shm)) and clean
        clean = clean and (not in_pid_namespace or not _sysv_ipc()) and template_well()
        clean = clean and all([_as_before(f) for f in folders]) and (not in_pid_namespace or _no_keys(libc, keys))
        # nothing of the server's or the template's limits or scheduling changed (a job of the same
        # user can), and no socket left in flight with what it carries
        clean = clean and all(_marks(p, libc) == before for p, before in marks.items())
        clean = clean and (not in_pid_namespace or (_unix_sockets(), _inet_sockets()) == sockets)
        clean = clean and (not own_user or owned(os.getuid()) == shared)
        try:
            code = os.waitstatus_to_exitcode(status) if status is not None else -9
        except ValueError:
            code = -9
        if halted:
            code = -int(signal.SIGSTOP)  # (no process ends by SIGSTOP: the grader reads it as this)
        send({"done": code, "tail": tail, "clean": clean})
        if not clean:
            return 3  # something of the job would outlive it: a new sandbox for the next one
        if job.get("backend", "jax") == "jax" and job.get("warm") is not False:  # the next child starts warm
            warmed = ask({"warm": [[list(shape), dtype] for shape, dtype in warm.case_avals(job)]}, wait_s=600.0)
            if warmed is None or warmed.get("backend"):
                return 3  # XLA's threads would not survive the next fork (or no template): a new sandbox
        # ready for the next job (the grader waits for this before it sends one and starts its
        # clock: a warm-up is the grader's time, never the next archive's)
        send({"ready": True})
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    flags = set(argv[3:])
    if (len(argv) >= 3 and argv[0] == "--serve" and argv[1] == "--scratch" and len(flags) == len(argv) - 3
            and flags <= {"--confined", "--own-user"}):
        return serve(argv[2], confined="--confined" in flags, own_user="--own-user" in flags)
    print("usage: python -m attn_course.worker --serve --scratch DIR [--confined] [--own-user]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
