"""Run a package's functions on given inputs; report plain values only.

``python -m attn_course.worker JOB.json OUT.jsonl`` loads the package named in
the job (a folder holding an ``attn_tensors`` package: a student's
workspace, or the reference), calls each exercise's probe on each case's
inputs, and appends one JSON line per exercise to ``OUT.jsonl``:
``{"start": "3.1"}`` when it begins, then ``{"id": "3.1", "results": [...]}``.
A result is ``{"status": "ok", "value": {...arrays...}}``, ``{"status":
"raised", "type": ..., "message": ...}`` or ``{"status": "not_implemented",
"exercise": "2.2", "message": ...}``.

The worker never sees expected values: it gets inputs and returns outputs,
and the trusted parent compares them (:mod:`attn_course.runner`).  The same
:func:`evaluate` computes the reference outputs in the parent.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from . import values
from .regions import exercise_of_stub

MAX_MESSAGE = 400


def to_backend(value: Any) -> Any:
    """NumPy arrays in a case become JAX arrays; everything else is unchanged."""
    if isinstance(value, np.ndarray):
        import jax.numpy as jnp

        return jnp.asarray(value)
    if isinstance(value, list):
        return [to_backend(v) for v in value]
    if isinstance(value, dict):
        return {k: to_backend(v) for k, v in value.items()}
    return value


class NotPlainValue(TypeError):
    pass


def _array(x: Any, where: str) -> np.ndarray:
    if isinstance(x, (bool, int, float, np.number, np.bool_)):
        return np.asarray(x)
    if type(x).__module__.split(".")[0] not in ("jax", "jaxlib", "numpy", "mlx"):
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


def flatten(result: Any, where: str = "the result") -> dict[str, np.ndarray]:
    """Named arrays from an array, a (named) tuple or a dict of arrays."""
    if isinstance(result, dict):
        return {str(k): _array(v, f"{where}[{k!r}]") for k, v in result.items()}
    if isinstance(result, tuple) and hasattr(result, "_fields"):
        return {f: _array(getattr(result, f), f"{where}.{f}") for f in result._fields}
    if isinstance(result, (tuple, list)):
        return {str(i): _array(v, f"{where}[{i}]") for i, v in enumerate(result)}
    return {"value": _array(result, where)}


def _where(tb) -> str:
    frames = traceback.extract_tb(tb)
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
        return jax.jit(lambda: probe(fn, **args))()
    except Exception:  # noqa: BLE001 - not traceable, or a real error: the eager run says which
        pass
    return probe(fn, **to_backend(inputs))


def evaluate(fn: Any, probe: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """One case: the probe's outputs as plain arrays, or what went wrong."""
    try:
        out = _run_probe(fn, probe, inputs)
        return {"status": "ok", "value": flatten(out)}
    except NotImplementedError as err:
        ex = exercise_of_stub(err)
        return {
            "status": "not_implemented",
            "exercise": ex or "",
            "message": str(err)[:MAX_MESSAGE],
            "where": _where(err.__traceback__),
        }
    except NotPlainValue as err:
        return {"status": "bad_value", "message": str(err)[:MAX_MESSAGE]}
    except RecursionError as err:
        return {"status": "raised", "type": "RecursionError", "message": str(err)[:MAX_MESSAGE]}
    except Exception as err:  # noqa: BLE001 - the submission's exception is data
        if isinstance(err, OSError) and err.errno == 27:
            err = OSError(27, "File too large: the file size limit stopped it (is something printing or writing too much?)")
        return {
            "status": "raised",
            "type": type(err).__name__,
            "message": str(err)[:MAX_MESSAGE],
            "where": _where(err.__traceback__),
        }


def load_package(folder: str | Path) -> Any:
    """Import ``folder/attn_tensors`` as ``attn_tensors``, whatever else is installed."""
    folder = Path(folder).resolve()
    init = folder / "attn_tensors" / "__init__.py"
    for name in [m for m in sys.modules if m == "attn_tensors" or m.startswith("attn_tensors.")]:
        del sys.modules[name]
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


def run_job(job: dict, out) -> None:
    from .registry import all_exercises

    exercises = all_exercises()
    try:
        load_package(job["package"])
        load_error = None
    except BaseException as err:  # noqa: BLE001
        load_error = f"the package does not import: {type(err).__name__}: {err}"[:MAX_MESSAGE]
    for item in job["exercises"]:
        ex = exercises[item["id"]]
        out.write(json.dumps({"start": ex.id}) + "\n")
        out.flush()
        results = []
        if load_error:
            results = [{"status": "raised", "type": "ImportError", "message": load_error}] * len(item["cases"])
        else:
            try:
                fn = resolve(ex.function)
            except BaseException as err:  # noqa: BLE001
                msg = f"cannot import attn_tensors.{ex.function}: {type(err).__name__}: {err}"
                fn, results = None, [{"status": "raised", "type": "ImportError", "message": msg[:MAX_MESSAGE]}] * len(item["cases"])
            if fn is not None:
                for case in item["cases"]:
                    results.append(evaluate(fn, ex.probe, values.decode(case["inputs"])))
        line = json.dumps({"id": ex.id, "results": values.encode(results)}, allow_nan=False)
        out.write(line + "\n")
        out.flush()


def _setup_jax() -> None:
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")
    if os.environ.get("ATTN_COURSE_CACHE"):
        from .runner import enable_compile_cache

        enable_compile_cache(os.environ["ATTN_COURSE_CACHE"])


def serve() -> int:
    """A fork server: import once, then one fresh child per job (``--serve``).

    Reads one JSON line per job from stdin (``{"job", "out", "log", "cwd",
    "cpu_s"}``), forks, and answers ``{"done": status}`` on stdout when the
    child is gone.  JAX is imported here but its backend is started only in
    the children (XLA's threads do not survive a fork).  Each child gets
    /dev/null as stdin, its own log as stdout and stderr, a fresh CPU-time
    budget and a new session; afterwards every other process of the sandbox is
    killed and /tmp emptied, so nothing of one submission reaches the next.
    This server itself is not dumpable: a child cannot ptrace it or open its
    descriptors.
    """
    import ctypes
    import resource
    import shutil
    import signal

    _setup_jax()
    import jax.numpy  # noqa: F401 - imported once, here
    from .registry import all_exercises

    all_exercises()
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_DUMPABLE = 4
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    control_in, control_out = sys.stdin.buffer, os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    in_pid_namespace = os.getpid() <= 3
    control_out.write(json.dumps({"ready": True}) + "\n")
    for line in control_in:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        pid = os.fork()
        if pid == 0:  # the child: one submission
            try:
                libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
                os.setsid()
                log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(devnull, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.closerange(3, 4096)
                os.chdir(req["cwd"])
                cpu = int(req.get("cpu_s", 120))
                resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
                sys.stdin = open(os.devnull)
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                job = json.loads(Path(req["job"]).read_text())
                with open(req["out"], "a", buffering=1) as out:
                    run_job(job, out)
                code = 0
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if in_pid_namespace:  # kill whatever the job left behind, then clean /tmp
            me = os.getpid()
            for _ in range(20):
                others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
                if not others:
                    break
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
            for entry in os.listdir("/tmp"):
                path = os.path.join("/tmp", entry)
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else _unlink(path)
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        code = os.waitstatus_to_exitcode(status)
        control_out.write(json.dumps({"done": code}) + "\n")
    return 0


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--serve"]:
        return serve()
    job_path, out_path = argv
    job = json.loads(Path(job_path).read_text())
    _setup_jax()
    with open(out_path, "a", buffering=1) as out:
        run_job(job, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
