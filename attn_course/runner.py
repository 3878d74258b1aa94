"""The trusted side of checking and grading: start workers, compare, score.

Submitted code runs only in a worker process (:mod:`attn_course.worker`); this
side sends it inputs, reads back plain values (JSON, size-capped), and
compares them with the expected ones, which the worker never sees.  A worker
that hangs past the per-exercise limit, crashes or exits is stopped and
restarted on the remaining exercises, so one bad exercise never costs the
others.  :mod:`attn_course.sandbox` decides how a worker is confined.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from . import values
from .registry import Case, Exercise

MAX_RESULT_BYTES = 32 * 2**20


@dataclass
class Limits:
    per_exercise_s: float = 60.0  # wall-clock seconds for one exercise's cases
    cpu_s: int = 120  # CPU seconds for a whole worker
    memory_mb: int = 3072  # address space of a worker
    processes: int = 64  # threads and processes (JAX starts a few)
    file_mb: int = 64  # largest file a worker may write
    output_mb: int = 16  # most a worker may print (stdout and stderr)


@dataclass
class CaseResult:
    case: str
    passed: bool
    status: str  # pass, wrong, not_implemented, blocked, raised, bad_value, timeout, crashed
    message: str = ""
    hidden: bool = False


@dataclass
class ExerciseResult:
    exercise: Exercise
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def status(self) -> str:
        if self.passed:
            return "pass"
        for s in ("not_implemented", "blocked", "timeout", "crashed"):
            if any(c.status == s for c in self.cases) and not any(c.passed for c in self.cases):
                return s
        return "fail"

    @property
    def score(self) -> float:
        """Points times the fraction of hidden cases passed (all cases if none are hidden)."""
        graded = [c for c in self.cases if c.hidden] or self.cases
        if not graded:
            return 0.0
        return self.exercise.points * sum(c.passed for c in graded) / len(graded)


# -- running a worker ------------------------------------------------------------


def _job(package: Path, items: list[tuple[Exercise, list[Case]]]) -> dict:
    return {
        "package": str(package),
        "exercises": [
            {"id": ex.id, "cases": [{"name": c.name, "inputs": values.encode(c.inputs)} for c in cases]}
            for ex, cases in items
        ],
    }


def _read_lines(fd: int) -> list[dict]:
    """The worker's JSON lines, read through the grader's own descriptor.

    The grader opens the results file before the worker starts and reads it
    through that descriptor: a worker that deletes, renames or replaces the
    path by a link or a FIFO changes nothing here.
    """
    size = os.fstat(fd).st_size
    if size > MAX_RESULT_BYTES:
        raise ValueError(f"the worker wrote {size} bytes of results (limit {MAX_RESULT_BYTES})")
    data = os.pread(fd, MAX_RESULT_BYTES + 1, 0)
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue  # a half-written line: a worker died (or two processes) while writing
        if isinstance(obj, dict):
            out.append(obj)
    return out


def default_command(job: Path, out: Path, workdir: Path, limits: Limits) -> tuple[list[str], dict]:
    """Run the worker with this interpreter (no confinement: the student's own check)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "SYSTEMROOT")}
    env.update(ATTN_COURSE_CACHE=str(cache_dir()), JAX_PLATFORMS="cpu", PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    return [sys.executable, "-m", "attn_course.worker", str(job), str(out)], env


def run_worker(
    package: Path,
    items: list[tuple[Exercise, list[Case]]],
    limits: Limits | None = None,
    sandbox=None,
) -> dict[str, list[dict]]:
    """Each exercise's raw results (decoded), running the package in workers.

    ``sandbox`` (:mod:`attn_course.sandbox`) confines the worker; the default
    runs it plainly (a student's own check).
    """
    from .sandbox import Local

    limits = limits or Limits()
    sandbox = sandbox or Local()
    if hasattr(sandbox, "bind_package"):
        sandbox.bind_package(package)
    raw: dict[str, list[dict]] = {}
    remaining = list(items)
    server = getattr(sandbox, "server", None)
    with tempfile.TemporaryDirectory(prefix="attn-grade-", dir=getattr(sandbox, "slot_dir", None)) as tmp:
        tmp = Path(tmp)
        os.chmod(tmp, 0o711)  # a worker under its own uid may enter its folder, not list others
        attempt = 0
        while remaining:
            attempt += 1
            work = tmp / f"work{attempt}"
            work.mkdir()
            job, out = work / "job.json", work / "out.jsonl"
            log = tmp / f"log{attempt}.txt"
            job_data = _job(Path(package), remaining)
            # first try: the slot's fork server (imports done once); after any
            # trouble, a fresh worker process for what is left
            use_server = attempt == 1 and server is not None and server.alive()
            if use_server:
                import shutil

                shutil.copytree(Path(package) / "attn_tensors", work / "pkg" / "attn_tensors")
                job_data["package"] = server.inside(work / "pkg")
            else:
                job_data["package"] = sandbox.package_path(Path(package))
            job.write_text(json.dumps(job_data))
            out_fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            with open(log, "wb") as log_f:
                if use_server:
                    proc = server.submit(job, out, log, work, limits)
                else:
                    argv, env, preexec = sandbox.command(job, out, work, limits)
                    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=log_f, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=preexec is None,
                                            preexec_fn=preexec)
                current, started, verdict = None, time.monotonic(), None
                while True:
                    rc = proc.poll()
                    if log.stat().st_size > limits.output_mb * 2**20:
                        _kill(proc)
                        verdict = ("crashed", f"printed more than {limits.output_mb} MB (output limit)")
                    try:
                        lines = _read_lines(out_fd)
                    except ValueError as err:
                        verdict = ("crashed", str(err))
                        _kill(proc)
                        lines = []
                    starts = [ln["start"] for ln in lines if "start" in ln]
                    done = {ln["id"] for ln in lines if "id" in ln}
                    pending = [s for s in starts if s not in done]
                    if pending and pending[-1] != current:
                        current, started = pending[-1], time.monotonic()
                    if verdict or rc is not None:
                        break
                    # the first exercise also pays for starting Python and importing JAX
                    grace = 20.0 if current is None or current == remaining[0][0].id else 0.0
                    if time.monotonic() - started > limits.per_exercise_s + grace:
                        _kill(proc)
                        verdict = ("timeout", f"stopped after {limits.per_exercise_s:g} s (time limit)")
                        break
                    time.sleep(0.02)
                rc = proc.wait()
                if not use_server:
                    sandbox.cleanup()
            try:
                lines = _read_lines(out_fd) if verdict is None or verdict[0] != "crashed" else []
            except ValueError as err:
                verdict, lines = ("crashed", str(err)), []
            finally:
                os.close(out_fd)
            for ln in lines:
                if "id" in ln and ln["id"] in {ex.id for ex, _ in remaining}:
                    try:
                        raw[ln["id"]] = values.decode(ln["results"])
                    except (values.ValueFormatError, KeyError, TypeError) as err:
                        raw[ln["id"]] = [{"status": "bad_value", "message": f"unreadable result: {err}"}]
            todo = [(ex, cases) for ex, cases in remaining if ex.id not in raw]
            if not todo:
                break
            culprit = todo[0][0].id if current is None or current in raw else current
            if culprit not in {ex.id for ex, _ in todo}:
                culprit = todo[0][0].id
            if verdict is None:
                with open(log, "rb") as f:  # the last output line explains most crashes
                    f.seek(max(0, log.stat().st_size - 4096))
                    tail = f.read().decode(errors="replace").strip().splitlines()
                why = describe_exit(rc)
                verdict = ("crashed", why + (f"; last output: {tail[-1][:200]}" if tail else ""))
            n = len(next(cases for ex, cases in todo if ex.id == culprit))
            raw[culprit] = [{"status": verdict[0], "message": verdict[1]}] * max(n, 1)
            remaining = [(ex, cases) for ex, cases in todo if ex.id != culprit]
    return raw


def describe_exit(rc: int) -> str:
    import signal

    if rc is None:
        return "the worker did not finish"
    if rc > 128 and rc - 128 in (4, 6, 7, 8, 9, 11, 24, 25):
        rc = -(rc - 128)  # bubblewrap reports its child's death by signal N as 128 + N
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        extra = {"SIGSEGV": " (segmentation fault)", "SIGKILL": " (killed: a limit on memory or CPU time)",
                 "SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)"}.get(name, "")
        return f"the worker died with {name}{extra}"
    return f"the worker exited early with status {rc}"


def _kill(proc) -> None:
    import signal

    if not isinstance(proc, subprocess.Popen):
        proc.kill()  # a fork-server job: stop the whole server (a new one starts later)
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


# -- XLA's compilation cache ------------------------------------------------------


def cache_dir() -> Path:
    """Where compiled XLA executables are kept between runs (ATTN_COURSE_CACHE)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attn-course" / "xla"
    return Path(os.environ.get("ATTN_COURSE_CACHE", default))


def enable_compile_cache(path: Path | str | None = None) -> None:
    """Use JAX's persistent compilation cache: eager ops compile once per shape, ever.

    A check or a grading run makes hundreds of small eager calls whose
    compilation dominates the time; the cache makes a second run ~5x faster.
    """
    import jax

    path = Path(path or cache_dir())
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# -- expected values (trusted side only) ----------------------------------------------


def reference_results(ex: Exercise, cases: Iterable[Case]) -> list[dict]:
    """The reference library's outputs, computed in this (trusted) process."""
    import jax

    jax.config.update("jax_enable_x64", True)
    enable_compile_cache()
    from .worker import evaluate, resolve

    fn = resolve(ex.function)
    return [values.decode(values.encode(evaluate(fn, ex.probe, c.inputs))) for c in cases]


# -- comparing -------------------------------------------------------------------


def _label(key: str) -> str:
    if key == "value":
        return "the result"
    if key.isdigit():
        return f"result[{key}]"
    return key


def _fmt(a: np.ndarray) -> str:
    return np.array2string(np.asarray(a), precision=6, threshold=24, edgeitems=3, max_line_width=72)


def compare_values(exp: dict, got: dict, rtol: float, atol: float, show: bool) -> str:
    """'' when ``got`` matches ``exp``; else what differs (values only if ``show``)."""
    if set(exp) != set(got):
        if list(exp) == ["value"]:
            return f"returned {len(got)} values ({', '.join(got)}), expected one array"
        return f"returned {', '.join(got) or 'nothing'}, expected {', '.join(exp)}"
    for key in exp:
        e, g = np.asarray(exp[key]), np.asarray(got[key])
        name = _label(key)
        if e.shape != g.shape:
            return f"{name} has shape {g.shape}, expected {e.shape}"
        if e.dtype.kind == "b" or g.dtype.kind == "b":
            if not np.array_equal(e.astype(bool), g.astype(bool)) or e.dtype.kind != g.dtype.kind:
                if e.dtype.kind != g.dtype.kind:
                    msg = f"{name} has dtype {g.dtype}, expected {e.dtype}"
                elif e.ndim == 0:
                    msg = f"{name} is {g.item()!r}, expected {e.item()!r}"
                else:
                    bad = tuple(int(i) for i in np.argwhere(e != g)[0])
                    msg = f"{name} is wrong at index {bad}"
                return msg + (f"\n  expected {_fmt(e)}\n  got      {_fmt(g)}" if show else "")
            continue
        e64, g64 = e.astype(np.float64), g.astype(np.float64)
        problems = []
        nan = np.isnan(g64) & ~np.isnan(e64)
        if nan.any():
            problems.append((np.argwhere(nan)[0], "nan"))
        inf_bad = (np.isinf(e64) | np.isinf(g64)) & ~(e64 == g64) & ~np.isnan(g64)
        if inf_bad.any():
            problems.append((np.argwhere(inf_bad)[0], "infinite mismatch"))
        fin = np.isfinite(e64) & np.isfinite(g64)
        close = np.isclose(g64, e64, rtol=rtol, atol=atol) | ~fin
        if not close.all():
            problems.append((np.argwhere(~close)[0], "value"))
        if problems:
            idx, kind = problems[0]
            idx = tuple(int(i) for i in idx)
            if show:
                msg = f"{name} differs at index {idx}: expected {e64[idx]!r}, got {g64[idx]!r}"
                if kind == "value":
                    err = np.max(np.abs(g64 - e64)[fin])
                    msg += f" (largest error {err:.3g}; tolerance rtol={rtol:g}, atol={atol:g})"
                return msg + f"\n  expected {_fmt(e)}\n  got      {_fmt(g)}"
            what = {"nan": "contains nan where the answer is a number",
                    "infinite mismatch": "is infinite where it should not be (or finite where it should be)",
                    "value": "has wrong values"}[kind]
            return f"{name} {what}"
    return ""


def stubbed_exercises(package: Path) -> set[str]:
    """Exercises whose stub line is still in a package's source (read as text, never run)."""
    import re

    found = set()
    for path in Path(package, "attn_tensors").rglob("*.py"):
        try:
            text = path.read_text(errors="replace")[: 4 * 2**20]
        except OSError:
            continue
        found.update(re.findall(r"raise NotImplementedError\(\s*['\"]Exercise (\d+\.\d+): implement ", text))
        found.update(re.findall(r"# not implemented yet: Exercise (\d+\.\d+)\b", text))
    return found


def compare(ex: Exercise, case: Case, expected: dict, got: dict, hidden: bool,
            own_stub: bool = False) -> CaseResult:
    name = f"hidden case {case.name}" if hidden else case.name
    st = got.get("status")
    note = f" [{case.note}]" if case.note and not hidden else ""
    if st == "not_implemented":
        owner = got.get("exercise") or ""
        if owner and owner != ex.owner and not own_stub:
            return CaseResult(name, False, "blocked",
                              f"needs exercise {owner} first (its stub raised NotImplementedError"
                              f"{' at ' + got['where'] if got.get('where') else ''})", hidden)
        return CaseResult(name, False, "not_implemented", "not implemented yet", hidden)
    if st in ("timeout", "crashed", "bad_value"):
        return CaseResult(name, False, st, got.get("message", st), hidden)
    if expected.get("status") == "raised":
        if st == "raised" and got.get("type") == expected.get("type"):
            return CaseResult(name, True, "pass", "", hidden)
        what = f"raised {got.get('type')}: {got.get('message', '')}" if st == "raised" else "returned a value"
        return CaseResult(name, False, "wrong", f"should raise {expected.get('type')}, but {what}{note}", hidden)
    if st == "raised":
        where = f" ({got['where']})" if got.get("where") else ""
        return CaseResult(name, False, "raised", f"raised {got.get('type')}: {got.get('message', '')}{where}{note}", hidden)
    if st != "ok":
        return CaseResult(name, False, "crashed", f"no result ({st})", hidden)
    msg = compare_values(expected["value"], got["value"], ex.rtol, ex.atol, show=not hidden)
    if msg:
        return CaseResult(name, False, "wrong", msg + note, hidden)
    return CaseResult(name, True, "pass", "", hidden)


def grade(ex: Exercise, cases: list[Case], expected: list[dict], got: list[dict], hidden: bool,
          stubbed: set[str] | frozenset = frozenset()) -> list[CaseResult]:
    """Compare case by case; ``stubbed``: exercises whose stub is still in the source."""
    if len(got) == 1 and len(cases) > 1:
        got = got * len(cases)  # one verdict (timeout, crash) for every case
    if len(got) != len(cases):
        return [CaseResult(c.name, False, "crashed", "no result for this case", hidden) for c in cases]
    own = ex.owner in stubbed
    results = [compare(ex, c, e, g, hidden, own) for c, e, g in zip(cases, expected, got)]
    # A function that raises NotImplementedError on some inputs is not done,
    # even if its given input checks already raise the right error on others.
    stub = next((r for r in results if r.status in ("not_implemented", "blocked")), None)
    if stub is None and own and not any(r.passed for r in results):
        # its placeholder stub (not a raise) is still in the source: not done yet
        stub = CaseResult("", False, "not_implemented", "not implemented yet", hidden)
    if stub is not None:
        for r in results:
            r.passed, r.status, r.message = False, stub.status, stub.message
    return results
