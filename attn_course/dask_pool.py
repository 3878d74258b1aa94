"""Grading on a Dask cluster: one task per archive, confined on its worker as locally.

``attn-course grade SUBMISSIONS --out GRADING --scheduler tcp://HOST:8786``

The grader (this process) lists the archives, skips the finished ones and
sends each other archive's bytes, with its receipt time (the file's mtime,
read here), as one task.  The task runs on a Dask worker process, which is
trusted like this one: it builds, once per process, a
:class:`~attn_course.grade.Grader` that writes nothing (the class's expected
values computed there, its worker servers started there), and runs
:meth:`Grader.grade_one` on the archive: the very function the local pool
runs (verify, run the worker server in the sandbox, score).  Only the
:class:`~attn_course.results.ArchiveResult` comes back; results, resume and
the gradebook are written here, as locally.

The course secret never travels: each Dask worker reads it from its own
environment (``ATTN_COURSE_SECRET``, set where the workers start: a
Kubernetes Secret, the batch job's environment) and only its fingerprint is
compared with the grader's; a worker with another secret or none refuses
every task, with that reason, before running anything.  The sandbox sees
neither (:func:`attn_course.sandbox.worker_env`).  Every worker is asked
before the batch starts; one that joins later and refuses its first task
(:class:`WorkerRefused`) gets no more of the batch, and the archive it
refused goes to the other workers.

A worker lost mid-batch costs only the archives it was grading: the
scheduler runs their tasks again elsewhere (Dask's ``allowed-failures``), and
an archive whose task fails for good gets an ``error`` result, graded again
on the next run, like any grader failure.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import hashlib
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .archive import Rejected, _archive_bytes
from .results import ArchiveResult
from .run_dir import run_dir
from .sandbox import Limits
from .server import StartError
from .text import terminal

if TYPE_CHECKING:
    from .grade import Grader


class ClusterError(RuntimeError):
    """The Dask cluster cannot grade (no worker, or a worker without the grader's secret)."""


class WorkerRefused(ClusterError):
    """A worker that cannot grade this batch (another secret, no bubblewrap for notebooks, or no
    worker server starts there),
    raised by each task it is given, with its address: the grader sends the archive elsewhere."""

    def __init__(self, message: str, address: str):
        super().__init__(message)
        self.address = address

    def __reduce__(self):
        return WorkerRefused, (str(self), self.address)


def _this_worker() -> str:
    """The address of the Dask worker this runs on ("" outside a task)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return ""


@dataclass(frozen=True)
class TaskConfig:
    """What a Dask worker needs to grade as this grader does (no secret: its fingerprint)."""

    spec: str
    limits: Limits
    use_bwrap: bool | None
    ci_secret: bool
    roster: object  # attn_course.identity.Roster | None
    require_token: bool
    notebooks: bool
    fingerprint: str
    backend: str = "jax"  # "jax", "mlx" or "both", as the grader's --backend
    unconfined: bool = False  # the archives are trusted: graded even where limits only reach the worker's files

    @classmethod
    def of(cls, g: "Grader") -> "TaskConfig":
        return cls(g.spec, g.limits, g.use_bwrap, g.ci_secret, g.roster,
                   g.require_token, g.notebooks, g.fingerprint, g.backend, g.unconfined)

    def key(self) -> str:
        return hashlib.sha256(pickle.dumps(self)).hexdigest()


# -- on the Dask worker ------------------------------------------------------------------

_LOCK = threading.Lock()
_GRADERS: dict[str, "_WorkerGrader"] = {}  # by configuration, the most recently used last
MAX_GRADERS = 2  # graders (each with a server per thread) a worker keeps; idle older ones are closed


def _worker_threads() -> int:
    """How many tasks this Dask worker runs at once (1 outside a worker)."""
    try:
        from distributed import get_worker

        return max(1, int(get_worker().state.nthreads))
    except Exception:  # noqa: BLE001 - not in a worker, or another version: one slot
        return 1


class _WorkerGrader:
    """One Grader per worker process and configuration, with a slot per worker thread.

    Built by the worker's first task (or :func:`warm_worker`): the class's
    expected values, then one worker server per thread, started and warmed
    on the class's shapes as the local pool's are
    (:meth:`~attn_course.grade.Grader.start_workers`), so that no archive
    pays for starting a server (a whole course's warm-up takes seconds).
    """

    def __init__(self, config: TaskConfig):
        from .grade import Grader

        threads = _worker_threads()
        self.grader = Grader(None, config.spec, jobs=threads, limits=config.limits, use_bwrap=config.use_bwrap,
                             log=lambda *a: None, ci_secret=config.ci_secret, roster=config.roster,
                             require_token=config.require_token, notebooks=config.notebooks,
                             backend=config.backend)
        # (a worker that joined after DaskPool.check_workers looked)
        if self.grader.fingerprint != config.fingerprint:
            raise WorkerRefused(f"the Dask worker {os.uname().nodename} (pid {os.getpid()}) has another course "
                                "secret than the grader (ATTN_COURSE_SECRET in the workers' environment)",
                                _this_worker())
        if config.notebooks and worker_sandbox(config.use_bwrap) != "bubblewrap":
            # notebook code never runs with limits only
            raise WorkerRefused(f"the Dask worker {os.uname().nodename} (pid {os.getpid()}) has no working "
                                "bubblewrap, which --notebooks needs", _this_worker())
        if not config.unconfined:
            from .sandbox import unconfined_reach

            reach = unconfined_reach(config.use_bwrap)
            if reach:  # (a worker that joined after DaskPool.check_workers looked)
                raise WorkerRefused(f"the Dask worker {os.uname().nodename} (pid {os.getpid()}) would run the "
                                    f"archives' code with limits only {reach} (no --unconfined)", _this_worker())
        self.grader.prepare()
        try:
            self.grader.start_workers()
        except StartError as err:  # not one server starts here: another worker grades the archive
            self.grader.close()
            raise WorkerRefused(f"the Dask worker {os.uname().nodename} (pid {os.getpid()}) could not start "
                                f"a worker server ({err})", _this_worker()) from None
        except BaseException:
            self.grader.close()
            raise
        self.free: list[int] = []
        self.slots = 0
        self.busy = 0  # tasks holding a slot (changed under _LOCK)
        self.lock = threading.Lock()
        atexit.register(self.grader.close)

    def acquire(self) -> int:
        with self.lock:
            if self.free:
                return self.free.pop()
            self.slots += 1
            return self.slots - 1

    def release(self, slot: int) -> None:
        with self.lock:
            self.free.append(slot)


def _worker_grader(config: TaskConfig) -> _WorkerGrader:
    """This worker's grader for ``config`` (built on first use), now the most recently used.

    A long-lived worker sees configuration after configuration (another
    ``--budget``, other exercises, another backend): it keeps the
    :data:`MAX_GRADERS` most recently used graders and closes older ones
    that no task is using (their servers stopped), so that servers do not
    pile up for the worker's lifetime.  Call with ``_LOCK`` held.
    """
    key = config.key()
    wg = _GRADERS.pop(key, None) or _WorkerGrader(config)
    _GRADERS[key] = wg
    for old in list(_GRADERS)[:-MAX_GRADERS]:
        if _GRADERS[old].busy == 0:
            closed = _GRADERS.pop(old).grader
            atexit.unregister(closed.close)
            closed.close()
    return wg


@contextlib.contextmanager
def _slot(config: TaskConfig) -> Iterator[tuple[_WorkerGrader, int]]:
    """A slot of this worker's grader for ``config``, held for one task (never closed meanwhile)."""
    with _LOCK:
        wg = _worker_grader(config)
        wg.busy += 1
    try:
        slot = wg.acquire()
        try:
            yield wg, slot
        finally:
            wg.release(slot)
    finally:
        with _LOCK:
            wg.busy -= 1


def warm_worker(config: TaskConfig) -> str:
    """Builds this worker's grader now (its expected values), so a timing leaves it out."""
    with _LOCK:
        _worker_grader(config)
    return f"{os.uname().nodename}:{os.getpid()}"


def stop_graders(key: str) -> int:
    """On a Dask worker: close its grader for the configuration ``key``; how many it closed (0 or 1).

    Run on every worker by :meth:`DaskPool.cancel` when the instructor stops
    a batch (Ctrl-C).  Dask cannot stop a task that is running, and each one
    went on grading its archive, up to the archive's budget, for nobody:
    with the grader's servers stopped, each fails at once (its result was
    discarded anyway, and the archive is graded on the next run).  A task of
    another batch of the same configuration on this worker fails with it,
    and is graded again on that batch's next run.
    """
    with _LOCK:
        wg = _GRADERS.pop(key, None)
    if wg is None:
        return 0
    atexit.unregister(wg.grader.close)
    wg.grader.close()
    return 1


def worker_fingerprint(ci_secret: bool) -> str:
    """This worker's secret fingerprint, or why it has none (run on every worker before a batch)."""
    from .identity import secret_fingerprint
    from .registry import secret

    try:
        return secret_fingerprint(secret(allow_ci=ci_secret))
    except Exception as err:  # noqa: BLE001 - reported to the grader by name
        return f"no secret: {type(err).__name__}"


def worker_sandbox(use_bwrap: bool | None) -> str:
    """The sandbox this worker's graders confine archives in (``"bubblewrap"`` or ``"limits"``),
    decided as :func:`~attn_course.sandbox.confinement` decides (run on every worker before a batch)."""
    from .sandbox import uses_bwrap

    return "bubblewrap" if uses_bwrap(use_bwrap) else "limits"


def grade_task(config: TaskConfig, name: str, data: bytes, received: float,
               left: int | None = None, slots: int = 1) -> ArchiveResult:
    """One archive, on a Dask worker: :meth:`Grader.grade_one` on a private copy of its bytes.

    ``left``: the archives of the batch not yet sent when this one was, and
    ``slots`` the cluster's worker threads: whether the slot's server warms
    after this job (:meth:`Grader.warm_after_job`, as in the local pool).
    """
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"not an archive name: {name!r}")
    with _slot(config) as (wg, slot):
        if left is not None:
            wg.grader.warm_after_job(slot, left, slots)
        with tempfile.TemporaryDirectory(prefix="archive-", dir=run_dir()) as tmp:
            path = Path(tmp) / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return wg.grader.grade_one(path, slot, received=received)


# -- on the grader -----------------------------------------------------------------------

def check_address(address: str) -> None:
    """Refuses, by name, an address that no Dask scheduler can have, before connecting.

    Dask's ``Client`` raises a bare ``ValueError`` for an unknown scheme or
    a bad port, and the half-built client then waits twice the connect
    timeout (two minutes) when it is collected: a traceback, then a hang.
    """
    from distributed.comm.addressing import get_address_host_port, parse_address
    from distributed.comm.registry import get_backend

    try:
        scheme, _ = parse_address(address)
        get_backend(scheme)
        if scheme in ("tcp", "tls", "ws", "wss"):
            _, port = get_address_host_port(address)
            if not 0 < port < 65536:
                raise ValueError(f"no port {port}")
    except ValueError as err:
        raise ClusterError(f"--scheduler {terminal(address, 200)}: not a Dask scheduler's address "
                           f"({terminal(err, 200)}); e.g. tcp://HOST:8786") from None


def task_key(name: str) -> str:
    """A Dask key for one archive's task: its name's first characters, in ASCII, and a random tail.

    Keys travel as msgpack strings (strict UTF-8): a file name that is not
    UTF-8 (``surrogateescape`` characters) broke the client's connection to
    the scheduler, and every archive of the batch failed with it.
    """
    return f"grade-{re.sub(r'[^A-Za-z0-9_.-]', '_', name[:60])}-{os.urandom(6).hex()}"


POLL_S = 0.02  # how often the grader's main thread looks for a finished task


def _completed(done) -> Iterator:
    """The futures of ``distributed.as_completed`` as they finish, waited for in ``time.sleep``:
    its own iteration waits on a condition, where Ctrl-C may break the condition's lock
    (:mod:`attn_course.interrupt`); a sleep ends cleanly.  Taking a ready one never waits."""
    while True:
        if done.has_ready():
            yield next(done)
        elif done.is_empty():
            return
        else:
            time.sleep(POLL_S)


class DaskPool:
    """Grades a batch on the Dask cluster at ``address``, a bounded number of tasks in flight."""

    def __init__(self, address: str, grader: "Grader", connect_timeout_s: float = 60.0):
        from distributed import Client

        check_address(address)
        self.grader = grader
        self.config = TaskConfig.of(grader)
        try:
            self.client = Client(address, timeout=connect_timeout_s, set_as_default=False)
        except (OSError, ValueError) as err:  # TimeoutError is an OSError: the scheduler never answered
            raise ClusterError(f"cannot connect to the Dask scheduler at {terminal(address, 200)} "
                               f"({terminal(err, 200)})") from None
        self.futures: dict = {}
        self.refused: set[str] = set()  # workers that refused a task of this batch (their addresses)

    def _on_every_worker(self, function, *args) -> dict:
        """``function(*args)`` on every worker, by worker; refuses a cluster where it cannot run.

        A worker without this package (or with a version that lacks
        ``function``) cannot unpickle it: ``client.run`` raised a bare
        ``Exception`` with the worker's text, a traceback for the instructor.
        """
        answers = self.client.run(function, *args, on_error="return")
        failed = sorted(w for w, a in answers.items() if isinstance(a, BaseException))
        if failed:
            raise ClusterError(f"{len(failed)} of {len(answers)} Dask workers cannot run the grader "
                               f"({terminal(answers[failed[0]], 200)}), e.g. {failed[0]}: install this "
                               "attn-course where the workers start")
        return answers

    def check_workers(self) -> int:
        """The number of worker threads; refuses a cluster whose workers lack this package, the
        grader's secret, or (for ``--notebooks``) a working bubblewrap; warns where jobs would run
        with limits only or without their filter of kernel calls."""
        deadline = time.monotonic() + 120
        while not self.client.scheduler_info().get("workers"):
            if time.monotonic() > deadline:
                raise ClusterError("the Dask cluster has no worker (waited 120 s)")
            time.sleep(0.5)
        prints = self._on_every_worker(worker_fingerprint, self.config.ci_secret)
        wrong = sorted(w for w, fp in prints.items() if fp != self.config.fingerprint)
        if wrong:
            raise ClusterError(f"{len(wrong)} of {len(prints)} Dask workers have another course secret or none "
                               f"(set ATTN_COURSE_SECRET where the workers start), e.g. {wrong[0]}")
        self._check_sandboxes()
        self._check_filters()
        self._check_host_users()
        return sum(w.get("nthreads", 1) for w in self.client.scheduler_info()["workers"].values())

    def _check_sandboxes(self) -> None:
        """As locally (:func:`~attn_course.grade.main_grade`): without a working bubblewrap on a
        worker (or with ``--no-bwrap``), ``--notebooks`` is refused (notebook code is not run with
        limits only), and so is a library batch where a worker's jobs would reach the worker's own
        files (:func:`~attn_course.sandbox.unconfined_reach`: not as users of their own), unless
        the instructor trusts the archives (``--unconfined``); elsewhere it goes on with a
        warning.  Before, a worker without bubblewrap ran notebooks with limits, silently."""
        kinds = self._on_every_worker(worker_sandbox, self.config.use_bwrap)
        limited = sorted(w for w, kind in kinds.items() if kind != "bubblewrap")
        if not limited:
            return
        without = "have no working bubblewrap" if self.config.use_bwrap is None else "grade with --no-bwrap"
        which = f"{len(limited)} of {len(kinds)} Dask workers (e.g. {limited[0]}) {without}"
        if self.config.notebooks:
            raise ClusterError(f"--notebooks needs bubblewrap: {which}; notebook code is not run without it "
                               "(install the Debian package bubblewrap on the worker nodes)")
        from .sandbox import limits_only_reach, unconfined_reach

        reaches = self._on_every_worker(unconfined_reach, self.config.use_bwrap)
        open_ = sorted(w for w, reach in reaches.items() if reach)
        if open_ and not self.config.unconfined:
            raise ClusterError(
                f"{len(open_)} of {len(kinds)} Dask workers (e.g. {open_[0]}) would run the archives' code with "
                f"limits only {terminal(str(reaches[open_[0]]), 600)}: install the Debian package bubblewrap "
                "on the worker nodes, or start the workers as root (the jobs then run as users of their own); "
                "--unconfined grades anyway, for archives you trust")
        # in the first such worker's own words (as a user of its own, or as root and why)
        reach = self.client.run(limits_only_reach, workers=limited[:1], on_error="return").get(limited[0])
        words = terminal(reach, 600) if isinstance(reach, str) else "and can read what the workers' user can read"
        self.grader.log(f"warning: {which}; they run submissions with limits only {words} "
                        "(install the Debian package bubblewrap on the worker nodes)")

    def _check_filters(self) -> None:
        """As locally: a warning where a worker's jobs would run without their filter of kernel
        calls (:func:`~attn_course.seccomp.filter_problem`, asked on every worker)."""
        from .seccomp import filter_problem, unfiltered_warning

        self._warn_where(filter_problem, (), unfiltered_warning)

    def _check_host_users(self) -> None:
        """As locally: a warning where a root worker's jobs would run as root on its host
        (:func:`~attn_course.sandbox.host_user_problem`, asked on every worker)."""
        from .sandbox import host_user_problem, host_user_warning

        self._warn_where(host_user_problem, (self.config.use_bwrap,), host_user_warning)

    def _warn_where(self, probe, args: tuple, warning) -> None:
        """One line in the grader's log naming how many workers ``probe(*args)`` finds a problem
        on, and the first one's, as ``warning(problem)`` words it; nothing where none has one."""
        problems = self._on_every_worker(probe, *args)
        found = sorted(w for w, problem in problems.items() if problem)
        if found:
            problem = terminal(str(problems[found[0]]), 300)
            self.grader.log(f"warning: on {len(found)} of {len(problems)} Dask workers (e.g. {found[0]}), "
                            f"{warning(problem)}")

    def grade(self, todo: list[Path]) -> Iterator[tuple[Path, ArchiveResult]]:
        """Yields ``(archive, result)`` as each archive finishes, on whichever worker."""
        from distributed import as_completed

        if not todo:
            return
        slots = self.check_workers()
        window = max(4, 2 * slots)  # archives in flight (their bytes live in the scheduler)
        queue = list(reversed(todo))
        done = as_completed(loop=self.client.loop)

        def submit(archive: Path, data: bytes, received: float) -> bool:
            """Sends one archive's task to a worker that has not refused; False if none is left."""
            where = {}
            if self.refused:
                allowed = sorted(set(self.client.scheduler_info().get("workers", {})) - self.refused)
                if not allowed:
                    return False
                where = {"workers": allowed, "allow_other_workers": False}
            fut = self.client.submit(grade_task, self.config, archive.name, data, received, len(queue), slots,
                                     pure=False, key=task_key(archive.name), **where)
            self.futures[fut] = (archive, data, received)
            done.add(fut)
            return True

        def submit_next() -> Iterator[tuple[Path, ArchiveResult]]:
            while queue:
                archive = queue.pop()
                try:
                    data = _archive_bytes(archive)
                    received = os.lstat(archive).st_mtime
                except (Rejected, OSError):
                    # not a readable regular file of bounded size: rejected here, by the same function
                    yield archive, self.grader.grade_one(archive, 0)
                    continue
                with self.grader.interrupts.deferred():
                    sent = submit(archive, data, received)
                if not sent:
                    yield archive, self._failed(archive, data, received, ClusterError("every worker refused"))
                    continue
                return

        deferred = self.grader.interrupts.deferred  # Ctrl-C, raised after Dask's waits (attn_course.interrupt)
        for _ in range(window):
            yield from submit_next()
        for fut in _completed(done):
            with deferred():
                archive, data, received = self.futures.pop(fut)
                refused = self._refused_by(fut)
                if refused is not None and refused.address:  # (one without an address cannot be avoided)
                    if refused.address not in self.refused:  # named once, though it may refuse more in flight
                        self.refused.add(refused.address)
                        self.grader.log(f"warning: {terminal(refused, 300)}; it gets no more archives of this batch")
                    if submit(archive, data, received):
                        continue  # the archive it refused goes to another worker
                res = self._result(fut, archive, data, received)
            yield archive, res
            yield from submit_next()

    @staticmethod
    def _refused_by(fut) -> "WorkerRefused | None":
        """The refusal a finished task raised, if it raised one."""
        try:
            err = fut.exception() if fut.status == "error" else None
        except Exception:  # noqa: BLE001 - cancelled, or the scheduler gone: not a refusal
            return None
        return err if isinstance(err, WorkerRefused) else None

    def _result(self, fut, archive: Path, data: bytes, received: float) -> ArchiveResult:
        try:
            res = fut.result()
            if not isinstance(res, ArchiveResult) or res.archive != archive.name:
                raise ClusterError("a Dask worker returned a result for another archive")
            return res
        except Exception as err:  # noqa: BLE001 - a lost task is one archive's failure, retried next run
            return self._failed(archive, data, received, err)

    def _failed(self, archive: Path, data: bytes, received: float, err: Exception) -> ArchiveResult:
        """The result of an archive the cluster could not grade: an error, graded again on the next run."""
        res = ArchiveResult(archive.name, hashlib.sha256(data).hexdigest(), self.config.fingerprint,
                            [e.id for e in self.grader.exercises],
                            received=received, scores={e.id: 0.0 for e in self.grader.exercises})
        res.error = True
        why = str(err)[:300] if isinstance(err, ClusterError) else type(err).__name__
        res.rejected = (f"the grader failed on this archive on the Dask cluster ({why}); "
                        "it is retried on the next run")
        return res

    def cancel(self) -> None:
        """Cancels the batch's tasks, and stops those already running on the workers (:func:`stop_graders`)."""
        self.client.cancel(list(self.futures))
        try:
            self.client.run(stop_graders, self.config.key(), on_error="return")
        except Exception:  # noqa: BLE001 - a worker gone or the scheduler unreachable: nothing left to stop there
            pass

    def shutdown(self) -> None:
        self.futures.clear()
        self.client.close()
