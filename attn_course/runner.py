"""Run a package's exercises in a worker server and read back what it reported.

Submitted code runs only in a worker (:mod:`attn_course.worker`) inside a
sandbox (:mod:`attn_course.sandbox`), reached through
:class:`attn_course.server.WorkerServer`.  This side sends a job (the
package's source files and the cases' inputs), reads the job's lines, checks
each against a schema before using it (the job may write anything there), and
enforces the per-exercise time limit and the archive's budget.  An exercise
that hangs, crashes or exits costs only itself: the others run again on a
clean (or new) server.  Comparing and scoring is :mod:`attn_course.scoring`.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from . import values
from .registry import Case, Exercise
from .sandbox import Limits
from .scoring import CaseResult, Outcome, grade
from .server import Done, ServerError, StartError, Stopped, WorkerServer
from .source_tree import walk
from .watch import unseal

# the first exercise of a job also starts JAX's backend (a server's own start, and its warm-up after a
# job, are before the job's clock: WorkerServer.ready_for_job)
FIRST_EXERCISE_GRACE_S = 3.0


def package_files(package: Path) -> dict[str, str]:
    """``attn_tensors/**/*.py`` of a folder, as the job's files."""
    package = Path(package)
    return {str(p): (package / p).read_text(errors="replace") for p in walk(package).modules
            if (package / p).is_file()}  # (a link that leads nowhere is no module)


SETUP_TIMEOUT = ("stopped at the time limit before any exercise started: importing attn_tensors "
                 "(the code at a module's top level) or the notebook's set-up never ended")
COMPILING = "(the job's program)"  # what runs between a JAX job's tracing and its results


class Programs(str, Enum):
    """How a JAX job's cases are compiled (:func:`attn_course.worker.evaluate_job`)."""

    JOB = "job"  # one program for the whole job: grading, whose cache holds the reference's
    EXERCISE = "exercise"  # one per exercise: check, whose cache then keeps what an edit left unchanged


@dataclass(frozen=True)
class Ran:
    """What a job's own code was seen doing as it ran (:func:`attn_course.watch.watch_runs`): a
    rule of :mod:`attn_course.review`, and where (a file of the package and its line; ``<cells>`` for
    a notebook's cells, "" for other code of the job's, line 0): the job's word, checked for its
    shape only, and read by people only."""

    rule: str
    file: str
    line: int


@dataclass
class Staged:
    """An exercise whose job traced its cases (:func:`attn_course.worker.record_job`): the outcome of
    each case that failed as it was traced (None for a case recorded), and what an evaluation job
    needs for the rest (the programs, and the recorded cases in order)."""

    outcomes: list[Outcome | None]
    programs: dict
    records: list[dict]

    @property
    def recorded(self) -> list[int]:
        return [i for i, o in enumerate(self.outcomes) if o is None]

    def evaluation(self, ex_id: str, cases: list[Case]) -> dict:
        """This exercise in an evaluation job (:func:`attn_course.worker.evaluate_job_records`)."""
        return {"id": ex_id, "cases": [{"name": cases[i].name, "inputs": values.encode(cases[i].inputs)}
                                       for i in self.recorded],
                "staged": {"programs": self.programs, "cases": self.records}}

    def merged(self, evaluated: list[Outcome]) -> list[Outcome]:
        """Every case's outcome: the evaluation job's for the recorded cases (one for all of them
        where it failed as a whole), the job's own for the others."""
        if len(evaluated) != len(self.recorded):
            return evaluated  # (one failure for the whole exercise: a crash, a limit)
        found = iter(evaluated)
        return [o if o is not None else next(found) for o in self.outcomes]


class Evaluated:
    """What evaluation jobs gave, by what they evaluated: an exercise's recorded programs and calls
    and its cases' inputs.  The evaluation runs none of a submission's code, only those programs
    (with the probes, the same for all), so two archives whose functions traced to the same
    programs get the same outcomes: a class's many equal solutions are evaluated once.  Kept in
    this process only, for the most recent :data:`SIZE` exercises (``ATTN_COURSE_EVALUATED=0``: none,
    every archive's evaluated on its own -- what a benchmark of a class of distinct answers measures)."""

    SIZE = 2048
    MAX_BYTES = 64 << 20  # of the outcomes' arrays together (red team 19: 96 MB kept from one archive)
    MAX_ENTRY_BYTES = 1 << 20  # an exercise's: a larger one is not kept

    def __init__(self) -> None:
        self._outcomes: OrderedDict[str, tuple[list[Outcome], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # (a grader's slots are threads)

    @property
    def size(self) -> int:
        return 0 if os.environ.get("ATTN_COURSE_EVALUATED") == "0" else self.SIZE

    @staticmethod
    def key(ex_id: str, staged: Staged, cases: list[Case]) -> str:
        inputs = [values.encode(cases[i].inputs) for i in staged.recorded]
        text = json.dumps([ex_id, staged.programs, staged.records, inputs], sort_keys=True, allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, key: str) -> list[Outcome] | None:
        if not self.size:
            return None
        with self._lock:
            found = self._outcomes.get(key)
            if found is None:
                return None
            self._outcomes.move_to_end(key)
            return found[0]

    def put(self, key: str, outcomes: list[Outcome]) -> None:
        size = sum(sum(np.asarray(v).nbytes for v in (o.value or {}).values()) + len(o.message) for o in outcomes)
        if not self.size or size > self.MAX_ENTRY_BYTES:
            return
        with self._lock:
            if key in self._outcomes:
                self._bytes -= self._outcomes.pop(key)[1]
            self._outcomes[key] = (outcomes, size)
            self._bytes += size
            while len(self._outcomes) > self.size or self._bytes > self.MAX_BYTES:
                self._bytes -= self._outcomes.popitem(last=False)[1][1]


EVALUATED = Evaluated()


# a job's failures of a case as it was traced (never "ok": a value comes from an evaluation job only)
TRACED_FAILURES = ("raised", "not_implemented", "bad_value", "tampered")


MAX_DEPTH = 100  # of a job's data kept to be sent again (json.dumps recurses: red team 19's 489 levels)


def _deeper(data: object, limit: int) -> bool:
    """Whether ``data`` (lists and dicts) nests deeper than ``limit``."""
    level, todo = 0, [data]
    while todo:
        level += 1
        if level > limit:
            return True
        todo = [v for x in todo for v in (x.values() if isinstance(x, dict) else x if isinstance(x, list) else ())
                if isinstance(v, (dict, list))]
    return False


def _staged(obj: dict, n: int) -> Staged | list[Outcome]:
    """A job's ``{"id", "staged"}`` line's data, checked: a case is recorded calls or a failure."""
    data = obj["staged"]
    unreadable = [Outcome.failure("bad_value", "an unreadable result")]
    if not isinstance(data, dict) or not isinstance(data.get("programs"), dict) or _deeper(data, MAX_DEPTH):
        return unreadable
    cases = data.get("cases")
    if not isinstance(cases, list) or len(cases) != n:
        return unreadable
    outcomes: list[Outcome | None] = []
    records = []
    for c in cases:
        if isinstance(c, dict) and c.get("status") == "staged":
            outcomes.append(None)
            records.append(c)
            continue
        try:
            o = Outcome.from_dict(values.decode(c))
        except Exception:  # noqa: BLE001 - malformed data from the job is that case's failure
            o = unreadable[0]
        outcomes.append(o if o.status in TRACED_FAILURES else unreadable[0])
    if not records:
        return [o for o in outcomes if o is not None]
    return Staged(outcomes, data["programs"], records)


def _parse(text: str, todo: dict[str, int], key: str | None,
           traced: frozenset[str] = frozenset()) -> tuple[str, str, list[Outcome] | Ran | Staged | None] | None:
    """A job's line as ("start", id, None), ("phase", COMPILING, None), ("result", id, outcomes),
    ("watch", key, None), ("ran", "", :class:`Ran`), ("swapped", name, None) or ("staged", id,
    :class:`Staged`) (a case's outcomes, when none was recorded: "result"); None if it is not one.

    ``key``: the job's watch's, from its first line (None until then).  Every
    other line counts only sealed with it (:func:`attn_course.watch.sealer`):
    the job's code writes to the same channel, and a result line of its own
    making came first and counted (red team: full credit for a gradient the
    job computed its own way, past the checks of what it changed).
    ``todo`` maps the exercises still expected to their number of cases; a
    line about anything else, of another shape, too deep or unreadable is
    ignored (the job may write what it likes on its channel).  ``traced``:
    the exercises whose values only an evaluation job gives (a job that runs
    the submission traces them): their results from this job are failures
    only, an "ok" is unreadable (red team 19: a job that found its seal
    through frames wrote its own values, the mistake's nan made 0, 3/3).
    """
    if key is not None:
        sealed = unseal(key, text)
        if sealed is None:
            return None
        text = sealed
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    if key is None:  # only the watch's first line, before any of the job's code ran
        if set(obj) == {"watch"} and isinstance(obj["watch"], str) and len(obj["watch"]) == 32:
            return "watch", obj["watch"], None
        return None
    if set(obj) == {"start"} and isinstance(obj["start"], str) and obj["start"] in todo:
        return "start", obj["start"], None
    if obj == {"phase": "compile"}:
        return "phase", COMPILING, None
    if set(obj) == {"swapped"} and isinstance(obj["swapped"], str):  # the watch's hook, as a swap was made
        return "swapped", obj["swapped"][:200], None
    if set(obj) == {"ran", "file", "line"}:
        from .review import WHY

        rule, file, line = obj["ran"], obj["file"], obj["line"]
        if (isinstance(rule, str) and rule in WHY and isinstance(file, str) and len(file) <= 300
                and type(line) is int and 0 <= line <= 10**7):
            return "ran", "", Ran(rule, file, line)
        return None
    if set(obj) == {"id", "staged"} and isinstance(obj["id"], str) and obj["id"] in todo:
        found = _staged(obj, todo[obj["id"]])
        return ("staged" if isinstance(found, Staged) else "result"), obj["id"], found
    if set(obj) == {"id", "results"} and isinstance(obj["id"], str) and obj["id"] in todo:
        results = obj["results"]
        if not isinstance(results, list) or len(results) != todo[obj["id"]]:
            return "result", obj["id"], [Outcome.failure("bad_value", "an unreadable result")]
        outcomes = []
        for r in results:
            try:
                outcomes.append(Outcome.from_dict(values.decode(r)))
            except Exception:  # noqa: BLE001 - malformed data from the job is that case's failure
                outcomes.append(Outcome.failure("bad_value", "an unreadable result"))
        if obj["id"] in traced:
            outcomes = [o if o.status in TRACED_FAILURES else Outcome.failure("bad_value", "an unreadable result")
                        for o in outcomes]
        return "result", obj["id"], outcomes
    return None


def describe_exit(rc: int | None) -> str:
    import signal

    if rc is None:
        return "the worker did not finish"
    if rc > 128 and rc - 128 in (4, 6, 7, 8, 9, 11, 24, 25):
        rc = -(rc - 128)
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        if name == "SIGSTOP":  # (the server's word for it: a stop ends no process)
            return "the worker was ended: it stopped the process it was started from"
        # (a SIGKILL at the memory limit is seen and named before this: _memory_limit; the job's own
        # code can send one too, to itself or its group: red team, round 7)
        extra = {"SIGSEGV": " (segmentation fault)",
                 "SIGKILL": " (killed: at the hard limit on CPU time, by the machine's memory, or by its own code)",
                 "SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)"}.get(name, "")
        return f"the worker died with {name}{extra}"
    return f"the worker exited early with status {rc}"


class Budget:
    """An archive's time budget: what it runs must end by ``deadline`` (``time.monotonic()``).

    The grader's own work while the archive is graded is not the
    archive's: a diagnosis (:func:`attn_course.diagnose.explain`) may run the
    mistakes catalogue, once per exercise for the whole class, on whichever
    archive first gets that exercise wrong; a slow machine spent that
    archive's budget on it, and its public cases, or its notebooks, were
    then "stopped: the archive's time budget was spent".  Nor is a worker
    server's start, or its warm-up after the previous job (what
    :meth:`attn_course.server.WorkerServer.submit` waits for), unless the
    archive's own job ended the server before (``lost_server``): a new one
    for it is then the archive's cost, so that crashing its server at every
    exercise buys a submission no time.  The time such work takes moves the
    deadline back by as much.
    """

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.lost_server = False  # a job of this archive ended its server (killed, or it died)

    def not_charged(self, fn):
        """``fn``, whose time (the grader's own work) moves the deadline back by as much."""
        def timed(*args, **kwargs):
            t = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                self.deadline += time.monotonic() - t

        return timed


def run_worker(server: WorkerServer, files: dict[str, str], items: list[tuple[Exercise, list[Case]]],
               limits: Limits, budget: Budget | None = None,
               notebook: dict | None = None, backend: str = "jax",
               on_result: Callable[[str, list[Outcome]], None] | None = None,
               programs: Programs = Programs.JOB, start_errors: bool = False,
               ran: list[Ran] | None = None) -> dict[str, list[Outcome]]:
    """Each exercise's outcomes (one per case, or one for all when it failed as a whole).

    ``budget`` (:class:`Budget`) is the archive's: what has not run by its
    deadline is reported as ``budget``.  ``notebook`` (see
    :func:`attn_course.worker.run_job`): the functions are a notebook's
    answer cells, run over ``files``, instead of the package's own.
    ``backend``: the framework the worker runs the cases on, "jax" or "mlx".
    ``on_result(exercise id, outcomes)`` is called as each exercise's
    outcomes are known (a progress display), in the order they arrive; it
    should be quick, since the next exercise's clock runs meanwhile.
    ``programs``: on JAX, one program for the job or one per exercise (:class:`Programs`).

    ``start_errors``: raise :class:`attn_course.server.StartError` where the
    server does not start for this call's first job (nothing has run: there
    is nothing to score, and the caller reports it); the grader asks so for
    an archive's first job only, since a server that does not start after a
    job of the same archive crashed it costs the exercises still to run, as
    a crash.  Otherwise such a start is every exercise's failure, with its
    reason (a student's ``check``).

    ``ran``: where given, what the jobs' own code was seen doing as it ran (:class:`Ran`, the
    first line of each rule that carries the key of the job's watch, its first line: a line of the
    job's own making has none) is added to it.
    """
    if backend not in ("jax", "mlx"):
        raise ValueError(f"unknown backend {backend!r}: jax or mlx")
    raw = _Reported(on_result, [ex.id for ex, _ in items])
    remaining = list(items)
    alone = False  # after a crash: one exercise per job, so that a crash names its exercise for certain
    first = start_errors  # no job was sent yet: a server that does not start now is the caller's problem
    staged: dict[str, Staged] = {}  # exercises whose job traced them, to be evaluated (an evaluation job)
    keys: dict[str, str] = {}  # their keys in EVALUATED
    while remaining:
        # an evaluation job first, for the exercises a job traced (worker.evaluate_job_records): it
        # runs none of the submission's code, only the programs that code traced to
        pending = []
        for ex, cases in remaining:
            if ex.id in staged:
                key = keys.setdefault(ex.id, EVALUATED.key(ex.id, staged[ex.id], cases))
                known = EVALUATED.get(key)
                if known is not None:  # (the same programs on the same cases: evaluated before)
                    raw[ex.id] = staged.pop(ex.id).merged(known)
                else:
                    pending.append((ex, cases))
        remaining = [(ex, cases) for ex, cases in remaining if ex.id not in raw]
        if not remaining:
            break
        evaluating = bool(pending)
        batch = pending or remaining
        batch = batch[:1] if alone else batch
        todo = {ex.id: len(staged[ex.id].recorded) if evaluating else len(cases) for ex, cases in batch}
        if budget is not None and time.monotonic() >= budget.deadline:
            for ex, _ in remaining:
                raw[ex.id] = [Outcome.failure("budget", "not run: the archive's time budget was spent")]
            break
        if evaluating:
            job = {"files": {}, "cpu_s": limits.cpu_s, "evaluate": True, "warm": False,
                   "exercises": [staged[ex.id].evaluation(ex.id, cases) for ex, cases in batch]}
        else:
            job = {"files": files, "cpu_s": limits.cpu_s,
                   "exercises": [{"id": ex.id, "cases": [{"name": c.name, "inputs": values.encode(c.inputs),
                                                          **({"eager": True} if c.eager else {})}
                                                         for c in cases]} for ex, cases in batch]}
            if notebook is not None:
                job["notebook"] = notebook
            if backend != "jax":
                job["backend"] = backend
        if programs is not Programs.JOB:
            job["programs"] = programs.value
        # the exercises whose values only an evaluation job gives (worker.record_job traces them)
        traced = frozenset() if evaluating or backend != "jax" else frozenset(ex.id for ex, _ in batch if ex.traced)
        current, verdict, done, received = None, None, None, 0
        key = None  # the job's watch's (its first line): a "ran" line without it is the job's own making
        swapped = None  # code not the job's that it replaced, as the watch saw it made: what follows is tampered
        seen: dict[str, float] = {}  # when each exercise started: a clock is never reset
        refused = server.sandbox.processes_refused()  # the process limit's count before this job
        killed = server.sandbox.memory_kills()  # and the memory limit's
        stopped = False  # the runner stopped the job at its process or memory limit, in its current exercise
        gone = False  # the server could not take the job, died in it, or lost or delayed its last lines
        submit = server.submit
        if budget is not None and (server.running() or not budget.lost_server):
            submit = budget.not_charged(submit)  # (a new server after its own job ended the last: its cost)
        try:
            submit(job)
        except ServerError as err:
            if first and isinstance(err, StartError):  # nothing has run: not the submission's doing
                raise
            verdict = Outcome.failure("crashed", f"the worker could not start ({err})")
            gone = True
        first = False
        # the job's clock starts as the server takes it: what submit waited for (a start, the warm-up
        # after the previous job) was the grader's time (WorkerServer.ready_for_job)
        started = look = time.monotonic()
        while verdict is None and done is None:
            try:
                msgs = server.poll()
            except ServerError:
                verdict = Outcome.failure("crashed", "the worker died (it was killed, or ended its sandbox)")
                gone = True
                break
            for m in msgs:
                if isinstance(m, Done):
                    done = m
                    break
                received += len(m.text) + 1  # (its end too: a flood of empty lines is output as well)
                if received > limits.output_mb * 2**20:
                    verdict = Outcome.failure("crashed", f"reported more than {limits.output_mb} MB (output limit)")
                    break
                parsed = _parse(m.text, {k: v for k, v in todo.items() if k not in raw and (evaluating or k not in staged)},
                                key, traced)
                if parsed is None:
                    continue
                kind, ex_id, outcomes = parsed
                if kind == "watch":
                    key = ex_id
                elif kind == "ran":  # the watch's (sealed), the first of each rule (an evaluation job runs none of
                    if ran is not None and not evaluating and all(r.rule != outcomes.rule for r in ran):  # the job's)
                        ran.append(outcomes)
                elif kind == "start":  # again: a case of it runs alone after the job's program
                    current, started = ex_id, seen.setdefault(ex_id, time.monotonic())
                elif kind == "phase" and COMPILING not in seen:
                    current, started = ex_id, seen.setdefault(ex_id, time.monotonic())
                elif kind == "swapped":
                    swapped = swapped or ex_id
                elif kind == "result" and evaluating:  # (a job that runs no submission: nothing swapped)
                    if len(outcomes) == todo[ex_id]:
                        EVALUATED.put(keys[ex_id], outcomes)
                    raw[ex_id] = staged.pop(ex_id).merged(outcomes)
                elif kind in ("result", "staged"):  # (every result after a swap was computed with the code swapped)
                    if swapped is not None:
                        raw[ex_id] = [Outcome.failure("tampered", f"{values.TAMPERED}: the code of {swapped} (replaced)")
                                      ] * todo[ex_id]
                    elif kind == "staged":
                        staged[ex_id] = outcomes
                    else:
                        raw[ex_id] = outcomes
            if verdict is not None or done is not None:
                break
            now = time.monotonic()
            grace = 0.0
            if current is None or current == remaining[0][0].id or current == COMPILING:
                grace = FIRST_EXERCISE_GRACE_S
            if now >= look:  # a fork bomb is stopped at once, not when its time is up
                look = now + 0.1
                if server.sandbox.processes_refused() > refused:
                    verdict = Outcome.failure("crashed", "stopped: it tried to run more than "
                                              f"{limits.processes} processes and threads at once (process limit)")
                    stopped = True
                    break
                if server.sandbox.memory_kills() > killed:
                    verdict, stopped = _memory_limit(limits), True
                    break
            if now - started > limits.per_exercise_s + grace:
                verdict = Outcome.failure("timeout", f"stopped after {limits.per_exercise_s:g} s (time limit)")
            elif budget is not None and now >= budget.deadline:
                verdict = Outcome.failure("budget", "stopped: the archive's time budget was spent")
            else:  # until the worker writes, the next look at the process limit, or a limit's end
                until = min(look, started + limits.per_exercise_s + grace, budget.deadline if budget is not None else look)
                server.wait(min(max(until - now, 0.0), 0.1) + 0.001)
        if (gone or (done is not None and done.status != 0)) and server.sandbox.memory_kills() > killed:
            # the kernel killed the job, or its server, at the memory limit before a look saw it
            verdict, stopped = _memory_limit(limits), True
        if verdict is not None and done is None and not gone:
            # the job reached a limit: it is ended, and its server kept if it is clean; a server
            # that does not answer is killed (a job can stop its server: then the lines the
            # server had not yet relayed are lost, and the job's last exercise is not known)
            late: list[str] = []
            gone = server.stop_job(late) is Stopped.LOST
            # a line about an exercise relayed only now: the job had moved on (another exercise's
            # start, a result, its program) before the limit was seen, so whose it is is not known
            unreported = {k: v for k, v in todo.items() if k not in raw}
            for text in late:
                parsed = _parse(text, unreported, key, traced)
                if parsed is not None and parsed[0] == "watch":
                    key = parsed[1]
                elif parsed is not None:
                    gone = True
        elif verdict is not None or (done is not None and not done.clean):
            server.kill()  # a new, pristine server for what follows
        if budget is not None and server.proc is None:  # this job ended its server (killed here, or it died)
            budget.lost_server = True  # (not a server that ends by itself after the job: its warm-up failed)
        left = [(ex, cases) for ex, cases in remaining if ex.id not in raw]
        if not left:
            break
        unfinished = [ex.id for ex, _ in batch if ex.id not in raw and (evaluating or ex.id not in staged)]
        if not unfinished:  # (one exercise alone, which reported: on to the next)
            remaining = left
            continue
        if verdict is None:
            why = describe_exit(done.status if done else None)
            verdict = Outcome.failure("crashed", why + (f"; last output: {done.tail[:200]}" if done and done.tail else ""))
        if verdict.status == "budget":
            for ex, _ in left:
                raw[ex.id] = [verdict]
            break
        if verdict.status == "timeout" and current is None and not evaluating:
            # nothing had started: the package's import (a module's top-level code) or a notebook's
            # set-up never ended, and would not for any exercise run again alone (each its limit)
            for ex, _ in left:
                raw[ex.id] = [Outcome.failure("timeout", SETUP_TIMEOUT)]
            break
        if len(unfinished) > 1 and ((verdict.status == "crashed" and not stopped) or gone or current not in unfinished):
            # The job or its server died, or the server did not answer a stop: the last lines the
            # job wrote may be lost (an exercise that finished can look unfinished, or not even
            # started), so which one did it is not certain; or the time ran out in the program of the whole job (COMPILING), which is
            # every exercise's.  Each runs again alone; a crash or a limit then names its exercise.
            alone, remaining = True, left
            continue
        culprit = current if current in unfinished else unfinished[0]
        raw[culprit] = [verdict]
        remaining = [(ex, cases) for ex, cases in left if ex.id != culprit]
    return dict(raw)


def _memory_limit(limits: Limits) -> Outcome:
    return Outcome.failure("crashed", f"stopped: its processes together used more than {limits.total_memory_mb} MB "
                                      "of memory (memory limit)")


class _Reported(dict):
    """The outcomes found so far; each new entry is passed on to a callback, in the exercises' order
    (``order``): one that an evaluation job still owes holds back those after it."""

    def __init__(self, callback: Callable[[str, list[Outcome]], None] | None, order: list[str] = ()):
        super().__init__()
        self.callback, self.order, self._said = callback, list(order), 0

    def __setitem__(self, key: str, outcomes: list[Outcome]) -> None:
        super().__setitem__(key, outcomes)
        if self.callback is None:
            return
        if key not in self.order:
            self.callback(key, outcomes)
            return
        while self._said < len(self.order) and self.order[self._said] in self:
            name = self.order[self._said]
            self._said += 1
            self.callback(name, self[name])


def run_and_grade(server: WorkerServer, files: dict[str, str],
                  items: list[tuple[Exercise, list[Case], list[Outcome]]], hidden: bool, stubbed: set[str],
                  limits: Limits, budget: Budget | None = None,
                  notebook: dict | None = None, diagnose=None, backend: str = "jax",
                  start_errors: bool = False, ran: list[Ran] | None = None) -> dict[str, list[CaseResult]]:
    """Run (exercise, cases, expected outcomes) in the worker and score each case: the one path
    of ``check``, ``grade`` and the notebooks' grading.  ``backend``: "jax" or "mlx" (the
    expected outcomes are the same, the tolerances :func:`attn_course.scoring.tolerance`'s).
    ``start_errors``, ``ran``: see :func:`run_worker`."""
    raw = run_worker(server, files, [(e, cases) for e, cases, _ in items], limits, budget, notebook, backend,
                     start_errors=start_errors, ran=ran)
    return {e.id: grade(e, cases, expected, raw.get(e.id, []), hidden, stubbed, diagnose, backend)
            for e, cases, expected in items}


# -- expected values (trusted side only) ----------------------------------------------


def reference_results(ex: Exercise, cases: Iterable[Case], worker_cache: bool = False) -> list[Outcome]:
    """The reference library's outcomes, computed in this (trusted) process.

    Computed as a worker computes a submission's, one exercise at a time
    (one program for its cases, :func:`attn_course.worker.evaluate_all`; a
    worker runs a whole job as one program, with the same results:
    ``tests/course/test_job_program.py``); with ``worker_cache`` the programs
    also fill the workers' compilation cache.
    Kept between processes when ``ATTN_COURSE_RESULT_CACHE`` names a folder
    (:mod:`attn_course.result_cache`; the test suite sets it).
    """
    import jax

    jax.config.update("jax_enable_x64", True)
    from . import result_cache
    from .worker import evaluate_all, resolve
    from .xla_cache import compile_cache, enable_compile_cache, worker_cache_dir, worker_keys

    cases = list(cases)
    fn = resolve(ex.function)
    if jax.config.jax_compilation_cache_dir is None:
        enable_compile_cache()  # this process's own programs: the trusted side's cache

    def compute() -> list:
        inputs, eager = [c.inputs for c in cases], [c.eager for c in cases]
        if worker_cache:
            with compile_cache(worker_cache_dir()), worker_keys():
                raw = evaluate_all(fn, ex.probe, inputs, eager=eager)
        else:
            raw = evaluate_all(fn, ex.probe, inputs, eager=eager)
        return [values.encode(r) for r in raw]

    parts = [ex.id, ex.function, result_cache.cases_digest(cases)]
    if worker_cache:  # a result read back fills no compilation cache: only one that filled this one counts
        parts += _worker_cache_identity()
    return [Outcome.from_dict(values.decode(r)) for r in result_cache.cached("reference", parts, compute)]


def fill_worker_cache(items: list[tuple[Exercise, list[Case]]]) -> None:
    """Compile the reference's program of a whole job (these exercises, these cases) into the
    workers' cache, as a job and its evaluation job compile a submission's
    (:func:`attn_course.worker.record_job`, :func:`attn_course.worker.evaluate_staged`).

    A job is one program: an archive whose program is the reference's then
    loads it instead of compiling it.  Done once per class and set of cases
    (:mod:`attn_course.result_cache` remembers it); the results are not used.
    """
    import io

    import jax

    jax.config.update("jax_enable_x64", True)
    from . import result_cache
    from .registry import all_exercises
    from .worker import JobItem, as_graded, evaluate_job_records, record_job, resolve
    from .xla_cache import compile_cache, worker_cache_dir, worker_keys

    def compute() -> list:
        job = [JobItem(ex.id, ex.probe, [c.inputs for c in cases], [c.eager for c in cases], ex.traced)
               for ex, cases in items]
        functions = {ex.id: ex.function for ex, _ in items}
        with compile_cache(worker_cache_dir()), worker_keys():
            # as a job traces it (an exercise not traced is compiled there), then as its evaluation job
            # evaluates what it traced, from what the job's lines carry
            staged = record_job(job, lambda ex_id: (as_graded(resolve(functions[ex_id])), None))
            evaluation = []
            for ex, cases in items:
                if "cases" in staged[ex.id] and staged[ex.id]["programs"] is not None:
                    found = _staged({"staged": json.loads(json.dumps(staged[ex.id]))}, len(cases))
                    if isinstance(found, Staged):
                        evaluation.append(found.evaluation(ex.id, cases))
            if evaluation:
                evaluate_job_records({"exercises": evaluation}, all_exercises(), io.StringIO())
        return []

    parts = _worker_cache_identity() + [[ex.id, ex.function, result_cache.cases_digest(cases)] for ex, cases in items]
    result_cache.cached("evaluation-program", parts, compute)


def _worker_cache_identity() -> list:
    """Which workers' cache folder this is (path and inode): a result cached for one that was
    filled says nothing about another, or about the same path made anew."""
    from .xla_cache import worker_cache_dir

    st = worker_cache_dir().stat()
    return ["worker cache", str(worker_cache_dir()), st.st_dev, st.st_ino]
