"""Grade a folder of submission archives (library and notebooks) for a class.

``attn-course grade SUBMISSIONS --out GRADING [--exercises 3] [--jobs 2] [--roster R.csv]
[--scheduler ADDRESS]``

For every ``*.zip`` in SUBMISSIONS (in one batch that always finishes):

1. the archive is verified on this side without running anything
   (:mod:`attn_course.archive`), and its student is identified by the token
   in its manifest (an HMAC of the id under the course secret,
   :mod:`attn_course.identity`; a classmate cannot forge it);
2. its library (the stub release overlaid with the submitted modules) runs in
   a worker server in a sandbox (:mod:`attn_course.sandbox`) on the hidden
   cases; the exercises that lost points run again on the public cases, so
   the feedback can show expected against obtained values; with
   ``--notebooks`` the answer cells of its notebooks run in the same sandbox
   the same way (nothing of a notebook runs anywhere else);
3. the result, with the archive's SHA-256 and the secret's fingerprint, is
   written to ``GRADING/results/``: a rerun skips finished archives unless
   ``--regrade``, the archive changed or the secret changed.

``--backend mlx`` runs the library's cases on MLX arrays instead of JAX ones
(the same expected values, MLX's tolerances).  ``--backend both`` runs them on
both, each with its own time budget; the policy: **the score is the JAX
one**, and each exercise's feedback also shows its verdict on MLX, for
information (JAX is the course's reference framework, and every student can
run it; MLX's results differ from it by rounding that its tolerance allows).
Notebooks are graded on the scored backend only.

Then the gradebook, feedback, report (:mod:`attn_course.report`) and, with
``--notebooks`` or ``--nbgrader``, nbgrader's gradebook and its export
(:mod:`attn_course.nbgrader_bridge`) are written.  The archive that counts
for a student is the one received last (the archive file's modification
time, as the learning platform's download or the instructor's copy set it;
never the manifest's self-declared time); duplicates, bad tokens and
unknown students are listed in the report.

Archives are graded by a local pool of ``--jobs`` worker servers, or with
``--scheduler ADDRESS`` on a Dask cluster, one task per archive
(:mod:`attn_course.dask_pool`): each task runs :meth:`Grader.grade_one`, the
same function the local pool runs, on its Dask worker, and only the
:class:`ArchiveResult` comes back; results, resume and the gradebook are
written here as before.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import functools
import hashlib
import json
import os
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait, FIRST_COMPLETED
from dataclasses import asdict, replace
from pathlib import Path

from . import EXERCISES, RELEASE_LIBRARY
from .archive import Rejected, overlay, read_submission, sha256_file
from .identity import IdentityVerdict, sealed_time, secret_fingerprint, submission_digest
from .interrupt import Interrupts
from .outputs import beside, is_beside_name
from .registry import Exercise, secret, select
from .runner import Budget, fill_worker_cache, package_files, reference_results, run_and_grade, run_worker
from .sandbox import GRADING_LIMITS, Limits, confinement
from .scoring import ExerciseResult, Status, stubbed_exercises
from .server import StartError, WorkerServer
from .results import ArchiveResult, atomic_write, latest_by_student, own_result, result_name
from .text import terminal
from .workspace import ASSIGNMENT


BACKEND_CHOICES = ("jax", "mlx", "both")
# an exercise whose hidden cases end so is not run again on the public ones: the public cases would
# end the same way, or tell nothing (a stub; another exercise's stub; the time limit, waited for
# again; the archive's budget, spent; code it does not own changed, which the public job would change
# again: "tampered" twice, at the cost of a second job of every exercise (such an archive: 1.0 -> 0.5 core-s)
NOT_RUN_AGAIN = frozenset({Status.NOT_IMPLEMENTED, Status.BLOCKED, Status.TIMEOUT, Status.BUDGET, Status.TAMPERED})

# what a grading folder holds: the grader's files (report, similarity, nbgrader's part) and nothing else
GRADING_NAMES = frozenset({"results", "feedback", "exports", "similarity", "nbgrader", "gradebook.csv", "grades.csv",
                           "report.md", "histograms.svg", "histograms.png", ".histograms.key", "run.lock",
                           "late-policy.json", ".written.json", ".written.journal"})


class OutputFolderError(ValueError):
    """``--out`` names a folder that is not the grader's to write in."""


class BatchRefused(OutputFolderError):
    """A run that would replace the grading folder's results or outputs by mistake (another
    secret, no archives) or while another grader writes there; nothing is graded or written."""


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def claim_output(out: Path) -> None:
    """Make ``out`` the grading folder (created if need be, private: mode 0700).

    A folder that already holds anything the grader does not write (the
    names of :data:`GRADING_NAMES`, or an interrupted write's temporary
    ``.NAME.*``) is refused, untouched: ``--out`` naming a folder of the
    user's own (the home folder, the submissions) would otherwise have its
    mode changed and a ``gradebook.csv`` or ``report.md`` of theirs replaced.
    A folder the grader wrote is taken again (resume).
    """
    if out.exists() and not out.is_dir():
        raise OutputFolderError(f"--out {out}: a file, not a folder; name a new folder")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir()
                       if p.name not in GRADING_NAMES and not is_beside_name(p.name, GRADING_NAMES)
                       and not any(p.name.startswith(f".{n}.") for n in GRADING_NAMES))
        if other:
            shown = ", ".join(terminal(n, 60) for n in other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
            raise OutputFolderError(f"--out {out} holds files that attn-course grade did not write ({shown}): "
                                    "name a new or empty folder, or one it graded into before")
    try:
        out.mkdir(parents=True, exist_ok=True)
        os.chmod(out, 0o700)
    except OSError as err:
        raise OutputFolderError(f"--out {terminal(str(out), 200)} cannot be made private or written "
                                f"({err.strerror or type(err).__name__}): name a folder you may write") from None


class Grader:
    def __init__(self, out: Path | None, spec: str = "all", jobs: int = 2, limits: Limits | None = None,
                 use_bwrap: bool | None = None, log=print, ci_secret: bool = False,
                 roster=None, require_token: bool = True, notebooks: bool = False, backend: str = "jax",
                 scheduler: str | None = None, late=None, unconfined: bool = False):
        """``out`` None: a grader that only grades archives (on a Dask worker), writing nothing.
        ``unconfined``: the archives are trusted, and may run where limits only would leave the
        grader's files in their reach (:func:`attn_course.sandbox.unconfined_reach`)."""
        self.secret = secret(allow_ci=ci_secret)  # refuses before anything is written
        self.fingerprint = secret_fingerprint(self.secret)
        self.ci_secret = ci_secret
        self.scheduler = scheduler
        self.late = late  # attn_course.late.LatePolicy | None: applied to the totals, not to the scores
        self.out = Path(out) if out is not None else None
        if self.out is not None:
            claim_output(self.out)
        self.spec = spec
        self.exercises: list[Exercise] = select(spec)
        self.jobs = max(1, jobs)
        self.limits = limits or GRADING_LIMITS
        self.use_bwrap = use_bwrap
        self.unconfined = unconfined
        self.log = log
        self.roster = roster
        self.require_token = require_token
        self.notebooks = notebooks
        if backend not in BACKEND_CHOICES:
            raise ValueError(f"unknown backend {backend!r}: one of {', '.join(BACKEND_CHOICES)}")
        self.backend = backend
        self.backends = ("jax", "mlx") if backend == "both" else (backend,)  # the first one is scored
        self._lock = threading.Lock()
        self._expected: dict[str, tuple] = {}
        self._servers: dict[int, WorkerServer] = {}
        self._stop = threading.Event()
        self.interrupts = Interrupts()  # Ctrl-C, deferred while the run waits on its threads
        self.cache = None
        self.release = package_files(RELEASE_LIBRARY)  # the stub release, read once: archives overlay it
        self._untouched: tuple[dict, dict, bool] | None = None  # the release's own verdict (see _library)
        self._warm = True  # whether the servers warm up (start_workers)
        self._begun: dict[int, int] = {}  # archives begun on each slot (warm_after_job)
        self._shapes: int | None = None  # case_shapes, counted once

    # -- expected values, computed once, here ---------------------------------------
    def prepare(self) -> None:
        """Once per class: the expected values (and the cases that diagnoses will run the catalogue on).

        Idempotent: a second call (each pool calls it) computes nothing again."""
        from .diagnose import expect_cases
        from .xla_cache import worker_cache_dir

        for e in self.exercises:
            if e.id in self._expected:
                continue
            public, hidden = e.make_cases(False), e.make_cases(True, self.secret)
            self._expected[e.id] = (public, reference_results(e, public, worker_cache=True),
                                    hidden, reference_results(e, hidden, worker_cache=True))
            expect_cases(e, hidden + public)
        if self.cache is None:
            # an archive's hidden cases run as one program (worker.evaluate_job): the reference's, compiled once
            fill_worker_cache([(e, self._expected[e.id][2]) for e in self.exercises])
        self.cache = worker_cache_dir()

    def case_shapes(self) -> int:
        """How many distinct shapes the class's case arrays have (what a server warms on; after :meth:`prepare`)."""
        from . import values
        from .warm import case_avals

        if self._shapes is None:
            cases = [c for e in self.exercises for c in self._expected[e.id][2] + self._expected[e.id][0]]
            self._shapes = len(case_avals({"exercises": [{"cases": [{"inputs": values.encode(c.inputs)}
                                                                     for c in cases]}]}))
        return self._shapes

    def worth_warming(self, archives: int, slots: int) -> bool:
        """Whether warming the servers repays itself on ``archives`` graded by ``slots`` servers.

        A server's warm-up costs about 0.24 CPU-s per distinct shape of the
        class's cases (chapter 3: 8 shapes, 1.9 s; the whole course: 117
        shapes, 24 s), and saves each later archive's child about as much,
        0.2-0.24 s (a chapter-3 child: 0.63-0.69 -> 0.45 CPU-s).  A server
        warms when it has at least as many archives to grade as the class
        has shapes: a class of hundreds always, a regrade of a few late
        archives never.
        """
        return archives >= max(1, slots) * max(1, self.case_shapes())

    def warm_after_job(self, slot: int, left: int, slots: int) -> None:
        """Whether ``slot``'s server warms after its next job: only when the servers warm at all
        (:meth:`start_workers`) and the ``left`` archives not yet begun, over ``slots`` servers,
        repay it (:meth:`worth_warming`).  So a server started again near the end of a batch,
        after a job that killed it, does not spend a warm-up on the last few archives (a server
        already warm has nothing left to warm either way).  The local pool and a Dask task both
        call this before each archive.

        Nor does a server warm while the slot's servers die young: a server
        started again after a job that killed it (or left its sandbox
        unclean) warms only if the slot's servers have so far lasted, on
        average, as many archives as the class has shapes (a batch where
        every few archives crash or attack their sandbox would otherwise
        pay a warm-up for each of them: 7 of the 40 CPU-s of the red team's
        confinement batch)."""
        server = self._server(slot)
        self._begun[slot] = begun = self._begun.get(slot, 0) + 1  # this archive included
        started = server.starts + (server.proc is None)  # a killed server starts again with this archive
        lasting = started <= 1 or begun / (started - 1) >= self.case_shapes()
        server.warm = self._warm and self.worth_warming(left, slots) and lasting

    def start_workers(self, count: int | None = None, warm: bool = True) -> None:
        """Start each slot's worker server and warm it on the class's case shapes (after :meth:`prepare`).

        ``count``: the first ``count`` slots only (default: all ``jobs``), for a
        run with fewer archives than slots.  ``warm=False``: the servers are
        only started, and never warm up after a job either (a run too small
        to repay it, :meth:`worth_warming`).

        A server traces JAX's own operations on the shapes of the cases it has
        served, so that each later job's child starts warm
        (:mod:`attn_course.warm`); here every server first serves the stub
        release (trusted code, which raises at once) on every case of the
        class, so that no archive pays for starting or warming a server.
        Idempotent; a server that fails to start is started again by the
        first archive that needs it.  The servers are launched from this
        thread (a sandbox dies with the thread that launched it), then made
        ready and warmed side by side.  Raises
        :class:`attn_course.server.StartError` where not one of them starts:
        no archive could be graded, and none is.
        """
        items = [(e, self._expected[e.id][2] + self._expected[e.id][0]) for e in self.exercises]
        failed: list[StartError] = []  # (list.append is atomic: the threads below share it)

        def start(server: WorkerServer) -> None:
            try:
                server.wait_ready()
            except StartError as err:
                failed.append(err)
                return
            try:
                if not warm:
                    return
                for backend in self.backends:
                    run_worker(server, self.release, items, self.limits, backend=backend)
                # the server warms after it has answered a job: a job of one case waits for that
                # (a whole course's shapes take seconds, which the first archive would pay)
                run_worker(server, self.release, [(items[0][0], items[0][1][:1])], self.limits)
            except Exception:  # noqa: BLE001 - a warm-up only
                pass

        self._warm = warm
        slots = self.jobs if count is None else max(1, min(count, self.jobs))
        idle = [s for s in map(self._server, range(slots)) if s.proc is None]
        for server in idle:
            server.launch()
        for server in self._servers.values():
            server.warm = warm  # (after the launches: a server launched again starts off)
        threads = [threading.Thread(target=start, args=(s,), daemon=True) for s in idle]
        with self.interrupts.deferred():  # Thread.start waits on an Event (attn_course.interrupt)
            for t in threads:
                t.start()
        for t in threads:
            t.join()
        if idle and len(failed) == len(idle):  # not one server started: no archive could be graded
            raise failed[-1]

    def _server(self, slot: int) -> WorkerServer:
        if slot not in self._servers:
            sandbox = confinement(slot, self.limits, self.cache, self.use_bwrap)
            self._servers[slot] = WorkerServer(sandbox)
            self._servers[slot].warm = self._warm
        return self._servers[slot]

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()

    # -- one archive -------------------------------------------------------------------
    def result_path(self, archive: Path) -> Path:
        return self.out / "results" / result_name(archive)

    def done(self, archive: Path) -> bool:
        return self._finished(archive) is not None

    def _finished(self, archive: Path) -> ArchiveResult | None:
        """The archive's result where it needs no grading again (same bytes, secret, exercises,
        backend and identity rule), else None."""
        old = own_result(self.out / "results", archive)
        if old is None or old.error:
            return None
        try:
            digest = sha256_file(archive)
        except OSError:
            return None
        same = (old.sha256 == digest and old.secret == self.fingerprint
                and old.exercises == [e.id for e in self.exercises] and old.backend == self.backend
                and old.identity_policy == self.identity_policy)
        return old if same else None

    @functools.cached_property
    def identity_policy(self) -> str:
        """The rule an archive's identity is checked under (whether a token is required, and the
        roster's students): a result checked under another (a run without ``--roster``, or with
        ``--trust-manifest-ids``) is not done, so a forged or unlisted archive is checked again.
        (Once per grader: a roster of thousands, sorted and hashed for each archive, cost seconds.)"""
        roster = sorted(self.roster.ids) if self.roster is not None else None
        # (and each student's token generation: a token re-issued checks the student's archives
        # again, the old token's refused)
        generations = sorted((s, self.roster.generation(s)) for s in self.roster.ids
                             if self.roster.generation(s)) if self.roster is not None else []
        # ("sealed": archives are sealed with the token, never carry it; a folder graded when a plain
        # token was accepted is checked again: red team, round 13)
        return hashlib.sha256(json.dumps([self.require_token, roster, "sealed", generations]).encode()).hexdigest()[:16]

    def _identify(self, sub, result: ArchiveResult) -> None:
        if not self.require_token and self.roster is None:
            result.identity = "ok"
            return
        from .identity import check_archive

        # (without tokens required, only the roster is asked: the id alone, seal or not)
        manifest = sub.manifest if self.require_token else {"student_id": sub.student_id}
        verdict = check_archive(manifest, self.roster, self.secret, require_token=self.require_token)
        result.identity = verdict.value

    def _run(self, slot: int, exercises: list[Exercise], files: dict[str, str], stubbed: set[str],
             budget: Budget, notebook: dict | None = None, backend: str = "jax",
             first: bool = False, ran: list | None = None) -> tuple[dict[str, float], dict[str, dict], bool]:
        """Hidden cases of every exercise, then public ones for those that lost points (on ``backend``).

        ``budget``: the archive's (:class:`Budget`), which the diagnoses made here do not spend.
        ``first``: the archive's first job, whose server not starting is the grader's
        problem (:class:`attn_course.server.StartError` is raised, :meth:`grade_one`).
        ``ran``: what the jobs' code was seen doing is added to it (:class:`attn_course.runner.Ran`)."""
        server = self._server(slot)
        exp = self._expected
        from .diagnose import explain

        diagnose = budget.not_charged(explain)
        hidden_res = run_and_grade(server, files, [(e, exp[e.id][2], exp[e.id][3]) for e in exercises],
                                   True, stubbed, self.limits, budget, notebook, diagnose, backend,
                                   start_errors=first, ran=ran)
        failing = [e for e in exercises
                   if not all(c.passed for c in hidden_res[e.id]) and hidden_res[e.id][0].status not in NOT_RUN_AGAIN]
        public_res = run_and_grade(server, files, [(e, exp[e.id][0], exp[e.id][1]) for e in failing],
                                   False, stubbed, self.limits, budget, notebook, diagnose,
                                   backend, ran=ran) if failing else {}
        scores, feedback, spent = {}, {}, False
        for e in exercises:
            cases = public_res.get(e.id, []) + hidden_res[e.id]
            r = ExerciseResult(e, cases)
            spent |= any(c.status.value == "budget" for c in cases)
            scores[e.id] = round(r.score, 4)
            feedback[e.id] = r.feedback()
        return scores, feedback, spent

    def _library(self, slot: int, files: dict[str, str], budget: Budget,
                 ran: list | None = None) -> tuple[dict, dict, bool]:
        """Scores, feedback and budget verdict of a package's library, on every backend of the grader.

        A package that is the stub release itself (an archive that changes
        none of its modules: a student who submits only notebooks, or
        nothing yet) is run once per class; its verdict is the same for all.
        """
        untouched = files == self.release
        if untouched and self._untouched is not None:
            return copy.deepcopy(self._untouched)
        stubbed = stubbed_exercises(files)
        scores, feedback, spent = self._run(slot, self.exercises, files, stubbed, budget,
                                            backend=self.backends[0], first=True, ran=ran)
        for other in self.backends[1:]:  # for information: its own budget, never the score
            s, fb, other_spent = self._run(slot, self.exercises, files, stubbed,
                                           Budget(time.monotonic() + self.limits.per_archive_s), backend=other,
                                           ran=ran)
            for ex_id, verdict in fb.items():
                feedback[ex_id].setdefault("other", {})[other] = {
                    "status": verdict["status"], "score": s[ex_id],
                    "cases": [c for c in verdict["cases"] if not c["passed"]]}
            spent |= other_spent
        if untouched and not spent and all(self._reproducible(fb) for fb in feedback.values()):
            self._untouched = copy.deepcopy((scores, feedback, spent))
        return scores, feedback, spent

    @staticmethod
    def _ran(ran: list, files: dict[str, str], result: ArchiveResult) -> None:
        """What the archive's code was seen doing as it ran, before what was read of it (the report's
        "Code to review"): each rule once, where it was not read already; of them all, every rule's
        first is kept (:func:`attn_course.review.kept`)."""
        from .review import Flag, kept, ran_flags

        read = {f["rule"] for f in result.review}
        flags = [f for f in ran_flags(ran, files) if f.rule not in read]
        result.review_count += len(flags)
        result.review = [f.to_dict() for f in kept(flags + [Flag.from_dict(d) for d in result.review])]

    @functools.cached_property
    def _release_answers(self) -> dict[str, str]:
        """The release notebooks' answer cells, by archive name (``notebooks/ch03.ipynb``)."""
        from .notebook_cells import answer_cells

        return {f"notebooks/{nb.name}": answer_cells(nb.read_bytes())
                for nb in sorted(Path(EXERCISES).glob("ch*/ch*.ipynb"))}

    def _review(self, sub, files: dict[str, str], result: ArchiveResult) -> None:
        """What of the archive's code the class report lists for review (:mod:`attn_course.review`):
        read, never run; no score depends on it."""
        from .review import review_package

        notebooks = {n: d for n, d in sub.files.items() if n.startswith("notebooks/") and n.endswith(".ipynb")}
        flags, result.review_count = review_package(files, self.release, notebooks, self._release_answers)
        result.review = [f.to_dict() for f in flags]

    @staticmethod
    def _reproducible(feedback: dict) -> bool:
        """No case of this verdict depends on the machine's state (a time limit, a crash)."""
        machine = {Status.TIMEOUT.value, Status.BUDGET.value, Status.CRASHED.value}
        return all(c["status"] not in machine for c in feedback["cases"])

    def grade_one(self, archive: Path, slot: int, received: float | None = None) -> ArchiveResult:
        """Verify, run and score one archive (``received``: its receipt time, if not its file's mtime)."""
        t0 = time.monotonic()
        result = ArchiveResult(archive.name, "", self.fingerprint, [e.id for e in self.exercises],
                               scores={e.id: 0.0 for e in self.exercises}, identity_policy=self.identity_policy)
        try:
            st = os.lstat(archive)
            result.received = st.st_mtime if received is None else received
            if not stat.S_ISREG(st.st_mode):
                result.rejected = "not a regular file (a link, a folder or a device)"
                return result
            result.sha256 = sha256_file(archive)
            try:
                sub = read_submission(archive, ASSIGNMENT)
            except Rejected as err:
                result.rejected = str(err)
                return result
            result.student_id = sub.student_id
            result.submission = submission_digest(sub.manifest)
            self._identify(sub, result)
            if result.identity == "ok" and self.require_token:  # (its seal verified: the time is its student's)
                result.sealed_at = sealed_time(sub.manifest)
            if result.identity != "ok":
                result.rejected = f"identity: {result.identity}: {IdentityVerdict(result.identity).reason}"
                return result
            budget = Budget(t0 + self.limits.per_archive_s)
            files = overlay(sub, self.release)
            self._review(sub, files, result)
            result.backend = self.backend
            ran: list = []  # what its code was seen doing as it ran: listed for review beside what was read
            result.scores, result.feedback, result.budget_spent = self._library(slot, files, budget, ran)
            if self.notebooks:
                from .nbgrader_bridge import notebook_jobs

                for ch, cells, problems in notebook_jobs(sub, self.exercises):
                    chosen = [e for e in self.exercises if e.chapter == ch]
                    s, fb, spent = self._run(slot, chosen, files, set(), budget, notebook=cells,
                                             backend=self.backends[0], ran=ran)
                    for ex_id, why in problems.items():
                        s[ex_id] = 0.0
                        fb[ex_id] = {"status": "fail", "points": fb[ex_id]["points"],
                                     "cases": [{"case": "notebook", "passed": False, "status": "wrong",
                                                "message": why, "hidden": False}]}
                    result.notebook_scores.update(s)
                    result.notebook_feedback.update(fb)
                    result.budget_spent |= spent
            self._ran(ran, files, result)
            result.sandbox = self._server(slot).sandbox.kind
            return result
        except Exception as err:  # noqa: BLE001 - one archive never stops the batch
            result.error = True
            # (a server that did not start: nothing of the archive ran, the grader's problem, never its score)
            why = f"not graded: {err}" if isinstance(err, StartError) else \
                f"the grader failed on this archive ({type(err).__name__})"
            result.rejected = f"{why}; it is retried on the next run"
            result.scores = {e.id: 0.0 for e in self.exercises}
            return result
        finally:
            result.seconds = round(time.monotonic() - t0, 3)

    # -- the class -----------------------------------------------------------------------
    def run(self, submissions: Path, regrade: bool = False) -> list[ArchiveResult]:
        with self.interrupts.handled(), self._only_grader():
            return self._run_batch(submissions, regrade)

    @contextlib.contextmanager
    def _only_grader(self):
        """The grading folder for this run alone: a second grader on it is refused (both graded
        every archive, and the last to end wrote the gradebook, its options winning)."""
        if self.out is None:
            yield
            return
        fd = os.open(self.out / "run.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                other = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                raise BatchRefused(f"another attn-course grade is grading into {terminal(str(self.out), 200)}"
                                   f"{f' (pid {terminal(other, 20)})' if other else ''}: wait for it to end, "
                                   "or grade into another folder; nothing was graded") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            os.close(fd)

    def _check_batch(self, submissions: Path, archives: list[Path], regrade: bool) -> None:
        """Refuse a run that would replace the folder's grading by mistake; warn where it drops
        students (before anything is graded or written)."""
        shown = terminal(str(submissions), 200)
        if not archives:
            raise BatchRefused(f"no archives (*.zip) in {shown}: nothing was graded, and "
                               f"{terminal(str(self.out), 200)} was left as it was")
        results = self.out / "results"
        stored = [ArchiveResult.load(p) for p in sorted(results.glob("*.json"))] if results.is_dir() else []
        other = sorted({r.secret for r in stored if r is not None and r.secret != self.fingerprint})
        if other and not regrade:
            raise BatchRefused(
                f"{sum(r is not None and r.secret in other for r in stored)} results in "
                f"{terminal(str(self.out), 200)} were graded under another course secret (fingerprint "
                f"{other[0]}; this one is {self.fingerprint}): a mistyped ATTN_COURSE_SECRET? Set the one they "
                "were graded with, or pass --regrade to grade every archive again under this one; nothing "
                "was graded")
        future = [a for a in archives if _mtime(a) > time.time() + 3600]
        if future:
            self.log(f"warning: {len(future)} archives were received in the future by this machine's clock "
                     f"(e.g. {terminal(future[0].name, 80)}): a late policy counts them as late")
        names = {self.result_path(a).name for a in archives} | {result_name(a, 8) for a in archives}
        away = [p for p in results.glob("*.json") if p.name not in names] if results.is_dir() else []
        if away:
            self.log(f"warning: {len(away)} results in {terminal(str(results), 200)} are of archives that are "
                     f"not in {shown}: they are kept, but left out of this gradebook and the exports")

    def _received_again(self, archive: Path, old: ArchiveResult) -> None:
        """A finished archive's receipt time read again: one the instructor corrected (an extension,
        a download with the platform's times) counts from now on (the late policy, the latest)."""
        try:
            now = os.lstat(archive).st_mtime
        except OSError:
            return
        if old.received != now:
            self.log(f"{terminal(archive.name, 120)}: its receipt time changed since it was graded; the new one counts")
            atomic_write(self.result_path(archive), json.dumps(asdict(replace(old, received=now)), indent=1))

    def _late_policy(self) -> None:
        """The late policy of the folder: kept in it, so that a run without ``--deadline`` (a resume)
        applies the one it was graded with; a different one replaces it, said so."""
        from .late import LatePolicy

        path = self.out / "late-policy.json"
        saved = None
        try:
            saved = LatePolicy(**json.loads(path.read_text()))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError):
            self.log(f"warning: {path} cannot be read as a late policy; it is ignored")
        if self.late is None and saved is not None:
            self.late = saved
            self.log(f"the late policy saved in {terminal(str(self.out), 200)} applies ({saved.describe()}); "
                     f"pass --deadline to change it, or remove {path.name} to grade without one")
        elif self.late is not None and saved != self.late:
            if saved is not None:
                self.log(f"the late policy changed: it was {saved.describe()}; now {self.late.describe()}")
            atomic_write(path, json.dumps(asdict(self.late)))

    def _run_batch(self, submissions: Path, regrade: bool) -> list[ArchiveResult]:
        if not Path(submissions).is_dir():
            raise FileNotFoundError(f"no folder of submissions at {submissions}")
        entries = list(Path(submissions).iterdir())
        archives = sorted(p for p in entries if p.name.lower().endswith(".zip"))  # (UPPER.ZIP too)
        skipped_files = sorted(p.name for p in entries if not p.name.lower().endswith(".zip"))
        if skipped_files:
            self.log(f"{len(skipped_files)} entries of {terminal(str(submissions), 200)} are not archives (*.zip) "
                     f"and are not graded (e.g. {terminal(skipped_files[0], 80)})")
        self._check_batch(Path(submissions), archives, regrade)
        self._late_policy()
        todo = []
        for archive in archives:
            old = None if regrade else self._finished(archive)
            if old is None:
                todo.append(archive)
            else:
                self._received_again(archive, old)
        skipped = len(archives) - len(todo)
        where = f"Dask cluster {terminal(self.scheduler, 200)}" if self.scheduler else f"{self.jobs} workers"
        self.log(f"{len(archives)} archives; {skipped} already graded, {len(todo)} to grade "
                 f"({len(self.exercises)} exercises, {where})")
        t0 = time.monotonic()
        finished = 0
        if self.scheduler:
            from .dask_pool import DaskPool

            pool = DaskPool(self.scheduler, self)
        else:
            pool = LocalPool(self)
        try:
            for archive, res in pool.grade(todo):
                if self._stop.is_set():
                    continue
                atomic_write(self.result_path(archive), json.dumps(asdict(res), indent=1))
                finished += 1
                self.log(self.progress_line(finished + skipped, len(archives), res))
        except KeyboardInterrupt:
            self._stop.set()
            pool.cancel()
            self.close()  # running jobs fail at once; their results are not written
            self.log("interrupted: finished results are kept; run again to resume")
            raise
        finally:
            pool.shutdown()
            self.close()
        results = self.load_results(archives)
        from .report import write_outputs

        kept = write_outputs(self.out, results, self.exercises, self.roster, self.notebooks, late=self.late,
                             assignment=ASSIGNMENT)
        for rel in kept:
            self.log(f"kept {terminal(rel, 200)}, edited since it was written; this run's version is "
                     f"{terminal(beside(Path(rel)).as_posix(), 200)}")
        self.log(f"graded {len(todo)} archives in {time.monotonic() - t0:.1f} s; see {self.out}")
        return results

    def progress_line(self, i: int, n: int, res: ArchiveResult) -> str:
        who = terminal(res.student_id or "(rejected)", 64)
        extra = ""
        if res.rejected:
            extra = "  REJECTED: " + terminal(res.rejected, 200)
        elif res.budget_spent:
            extra = f"  TIME BUDGET SPENT ({self.limits.per_archive_s:g} s)"
        return (f"[{i}/{n}] {terminal(res.archive, 120)}: {who} {res.total:g}/{self.max_points:g} pts "
                f"({res.seconds:.1f} s){extra}")

    @property
    def max_points(self) -> float:
        return float(sum(e.points for e in self.exercises))

    def load_results(self, archives: list[Path]) -> list[ArchiveResult]:
        out = []
        for a in archives:
            r = own_result(self.out / "results", a)
            if r is not None:
                out.append(r)
        return out


class LocalPool:
    """``jobs`` worker servers on this machine, one archive each at a time (the default)."""

    def __init__(self, grader: Grader):
        self.grader = grader
        self.executor = ThreadPoolExecutor(grader.jobs)

    def grade(self, todo: list[Path]):
        """Yields ``(archive, result)`` as each archive finishes."""
        g = self.grader
        if not todo:
            return
        g.prepare()
        n = min(g.jobs, len(todo))  # no more servers than archives (regrading one archive starts one)
        warm = g.worth_warming(len(todo), n)
        g.start_workers(n, warm=warm)
        slots = list(range(n))
        left = [len(todo)]  # archives not yet begun

        def work(archive):
            with g._lock:
                slot = slots.pop()
                g.warm_after_job(slot, left[0], n)
                left[0] -= 1
            try:
                return g.grade_one(archive, slot)
            finally:
                with g._lock:
                    slots.append(slot)

        with g.interrupts.deferred():  # starts threads, and Thread.start waits on an Event
            futures = {self.executor.submit(work, a): a for a in todo}
        pending = set(futures)
        while pending:
            with g.interrupts.deferred():  # (Ctrl-C within 0.5 s, :mod:`attn_course.interrupt`)
                done_now, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done_now:
                yield futures[fut], fut.result()

    def cancel(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True)


def _bad_option(args) -> str | None:
    """What is wrong with the grade command's budget, scheduler, jobs or uid range, before anything is written.

    Each was taken silently: a budget of 0 (or less, or nan) spent every
    archive's budget at once (every student 0), ``--scheduler ""`` graded on
    this machine, ``--jobs 0`` ran one worker, ``--jobs`` with ``--scheduler``
    was ignored (the cluster's workers grade).
    """
    if not args.budget > 0:
        return f"--budget must be a number of seconds above 0, got {args.budget:g}"
    if getattr(args, "scheduler", None) is not None and not args.scheduler.strip():
        return "--scheduler needs an address (e.g. tcp://HOST:8786); leave it out to grade on this machine"
    if args.jobs is not None and getattr(args, "scheduler", None) is not None:
        return ("--jobs sets the workers on this machine; with --scheduler the Dask cluster's workers grade "
                "(give the cluster more workers instead)")
    if args.jobs is not None and args.jobs < 1:
        return f"--jobs must be a number of workers of at least 1, got {args.jobs}"
    out, subs = Path(args.out).resolve(), Path(args.submissions).resolve()
    if out == subs or subs in out.parents:  # (its folder was then graded as a rejected "archive" each run)
        return (f"--out {terminal(args.out, 200)} is inside the submissions folder {terminal(args.submissions, 200)}: "
                "grade into a folder beside it")
    if getattr(args, "nbgrader", None) is not None:
        problem = _bad_database(args.nbgrader)
        if problem:
            return problem
    from .slot_user import setting_problem

    return setting_problem()


def _shown_url(url: str) -> str:
    """A database URL as the terminal shows it: its password hidden (``postgresql://u:***@h/db``)."""
    try:
        from sqlalchemy.engine import make_url

        url = make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL (said so by _bad_database): shown as given
        pass
    return terminal(url, 200)


def _bad_database(url: str) -> str | None:
    """What is wrong with ``--nbgrader DB_URL``, found before the batch (it was found after it, with
    every archive graded, or never: an in-memory database took the scores and threw them away)."""
    shown = _shown_url(url)
    try:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError
    except ImportError:
        return "--nbgrader needs nbgrader installed (pip install nbgrader)"
    try:
        parsed = make_url(url)
    except ArgumentError:
        return f"--nbgrader {shown} is not a database URL (e.g. sqlite:////path/to/gradebook.db)"
    try:
        parsed.get_dialect()
    except NoSuchModuleError:
        return f"--nbgrader {shown}: this Python has no driver for {terminal(parsed.drivername, 40)} databases"
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:") or (parsed.database or "").startswith("file::memory:"):
            return f"--nbgrader {shown} is a database in memory: the scores would be thrown away; name a file"
        path = Path(parsed.database)
        try:
            head = path.open("rb").read(16) if path.is_file() else None
        except OSError as err:
            return f"--nbgrader {shown} cannot be read ({err.strerror or type(err).__name__})"
        if head and head != b"SQLite format 3\x00":
            return f"--nbgrader {shown} is a file that is not an SQLite database; it was left as it was"
    return None


def _local_confinement(args, use_bwrap: bool | None) -> str | None:
    """Why this machine's sandboxes would not confine the archives' code (the refusal), or None;
    warns about what limits only leave open where they run anyway.

    Without bubblewrap (or with ``--no-bwrap``), notebook code is never run, and library code
    only where the jobs run as users of their own (:func:`attn_course.sandbox.unconfined_reach`)
    or the instructor says the archives are trusted (``--unconfined``)."""
    from .sandbox import (hidden_course_copies, limited_as_own_users, limits_only_reach, readable_by_all,
                          unconfined_reach, uses_bwrap, worker_site_dirs)

    if uses_bwrap(use_bwrap):
        return None
    why = "bubblewrap is not available (the Debian package bubblewrap)" if use_bwrap is None else "--no-bwrap"
    if args.notebooks:
        return f"--notebooks needs bubblewrap, and {why}: notebook code is not run without it"
    reach = unconfined_reach(use_bwrap)
    if reach and not args.unconfined:
        return (f"{why}, and with limits only the archives' code would run {reach}. Install bubblewrap, or "
                "grade as root (the jobs then run as users of their own); --unconfined grades anyway, for "
                "archives you trust. Nothing was graded")
    if use_bwrap is None:
        print(f"warning: bubblewrap is not available; workers run with limits only {limits_only_reach()} "
              "(install the Debian package bubblewrap)", file=sys.stderr)
    open_to_all = readable_by_all(Path(args.submissions)) if limited_as_own_users() else None
    if open_to_all:
        print(f"warning: {terminal(str(open_to_all), 300)} lets every user of this machine read the "
              "submissions, the jobs too (limits only): chmod 0700 it", file=sys.stderr)
    installed = [c for c in hidden_course_copies([sys.prefix, sys.base_prefix, *worker_site_dirs()])
                 if readable_by_all(Path(c))]
    if installed:  # (bubblewrap hides them; limits only cannot)
        print(f"warning: an installed copy of the course ({terminal(installed[0], 300)}) holds the "
              "reference library, and every user may read it, the jobs too (limits only): "
              "install the course with pip install -e, or install bubblewrap", file=sys.stderr)
    return None


def main_grade(args) -> int:
    if not Path(args.submissions).is_dir():
        raise FileNotFoundError(f"no folder of submissions at {args.submissions}")
    roster = None
    if args.roster:
        from .identity import load_roster

        roster = load_roster(Path(args.roster))
    problem = _bad_option(args)
    if problem:
        print(f"attn-course: {problem}", file=sys.stderr)
        return 2
    limits = replace(GRADING_LIMITS, per_archive_s=args.budget)
    from .late import policy_from_options

    late = policy_from_options(getattr(args, "deadline", None), getattr(args, "grace", 0.0),
                               getattr(args, "late_penalty", 0.0))
    use_bwrap = False if args.no_bwrap else None
    if not getattr(args, "scheduler", None):  # (on a cluster, each worker is asked: DaskPool.check_workers)
        refusal = _local_confinement(args, use_bwrap)
        if refusal:
            print(f"attn-course: {refusal}", file=sys.stderr)
            return 2
    g = Grader(Path(args.out), args.exercises, jobs=2 if args.jobs is None else args.jobs, limits=limits,
               use_bwrap=use_bwrap, ci_secret=args.ci_secret, roster=roster,
               require_token=not args.trust_manifest_ids, notebooks=args.notebooks, backend=args.backend,
               scheduler=getattr(args, "scheduler", None), late=late, unconfined=args.unconfined)
    if not g.scheduler:  # (on a cluster, each worker is asked: DaskPool.check_workers)
        from .seccomp import filter_problem, unfiltered_warning

        problem = filter_problem()
        if problem:
            print(f"warning: {unfiltered_warning(problem)}", file=sys.stderr)
        from .sandbox import host_user_problem, host_user_warning

        problem = host_user_problem(g.use_bwrap)
        if problem:
            print(f"warning: {host_user_warning(problem)}", file=sys.stderr)
    try:
        results = g.run(Path(args.submissions), regrade=args.regrade)
    except StartError as err:
        print(f"attn-course: cannot grade: {err}. Nothing was graded; finished results are kept "
              "(check that the grader's Python environment can be read where its sandboxes run)", file=sys.stderr)
        return 1
    best = latest_by_student(results)
    if args.nbgrader or args.notebooks:
        from .nbgrader_bridge import export_csv, write_gradebook

        db = args.nbgrader or f"sqlite:///{(Path(args.out) / 'nbgrader' / 'gradebook.db').resolve()}"
        try:
            write_gradebook(db, best, g.exercises, notebooks=args.notebooks, late=g.late)
            export = export_csv(db, Path(args.out))
        except Exception as err:  # noqa: BLE001 - nbgrader's failure, reported as such
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            print(f"attn-course: writing nbgrader's gradebook failed: {type(err).__name__}: {terminal(first, 300)}",
                  file=sys.stderr)
            return 1
        if export.kept:
            print(f"kept grades.csv, edited since it was written; this run's version is {export.path.name}")
        print(f"scores written to nbgrader's gradebook {_shown_url(db)}; nbgrader export: "
              f"{terminal(str(export.path), 300)}")
    failed = [r for r in results if r.error]
    if failed:
        print(f"attn-course: {len(failed)} archive(s) not graded ({terminal(failed[0].rejected, 300)}, ...): "
              "they have no score yet; run the same command again to grade them", file=sys.stderr)
        return 1
    return 0
