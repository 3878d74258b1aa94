"""Grade a folder of submission archives: gradebook, feedback and class report.

``attn-course grade SUBMISSIONS --out GRADING [--exercises 3] [--jobs 2]``

* every ``*.zip`` in SUBMISSIONS is verified (:mod:`attn_course.archive`),
  unpacked over the stub release and run in a confined worker
  (:mod:`attn_course.sandbox`) on the public and hidden cases;
* the score of an exercise is its points times the fraction of hidden cases
  passed (public cases are feedback only: answers that only know the public
  values score nothing);
* ``GRADING/results/<archive>.json`` holds each archive's result and the
  archive's SHA-256: a rerun skips finished archives (resume after an
  interrupt), unless ``--regrade``;
* ``GRADING/gradebook.csv`` (student x exercise, total),
  ``GRADING/feedback/<student>.md`` (what failed and why; expected vs got on
  public cases only), ``GRADING/report.md`` and ``GRADING/histograms.png``;
* with ``--nbgrader`` the scores also go into nbgrader's gradebook as the
  assignment ``library``, so ``nbgrader export`` lists them beside the notebooks.

Every file is written atomically (a temporary file, then ``os.replace``).
The grading folder is mode 0700.  Expected values and the hidden cases'
secret stay in this process.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from . import RELEASE_LIBRARY
from .archive import Rejected, read_submission, sha256_file, unpack
from .registry import Exercise, secret, select
from .runner import ExerciseResult, Limits, grade, reference_results, run_worker, stubbed_exercises
from .workspace import ASSIGNMENT

RESULT_FORMAT = 1


def atomic_write(path: Path, data: str | bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class Grader:
    def __init__(self, out: Path, spec: str = "all", jobs: int = 2, limits: Limits | None = None,
                 use_bwrap: bool | None = None, log=print):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        os.chmod(self.out, 0o700)
        self.exercises: list[Exercise] = select(spec)
        self.jobs = max(1, jobs)
        self.limits = limits or Limits(per_exercise_s=30, cpu_s=120)
        self.use_bwrap = use_bwrap
        self.log = log
        self._lock = threading.Lock()
        self._expected: dict[str, tuple] = {}
        self._sandboxes: dict = {}
        self.fork_server = True

    # -- expected values, computed once, here ---------------------------------------
    def prepare(self) -> None:
        from .runner import cache_dir

        s = secret()
        for e in self.exercises:
            public, hidden = e.make_cases(False), e.make_cases(True, s)
            self._expected[e.id] = (public, reference_results(e, public), hidden, reference_results(e, hidden))
        self.cache = cache_dir()

    def _sandbox(self, slot: int):
        """The slot's sandbox, with a fork server under bubblewrap (started on first use)."""
        from .sandbox import Confined, ForkServer

        if slot not in self._sandboxes:
            sb = Confined(slot, use_bwrap=self.use_bwrap, cache=self.cache, limits=self.limits)
            if sb.bwrap and self.fork_server:
                sb.slot_dir = Path(tempfile.mkdtemp(prefix=f"attn-slot{slot}-"))
                sb.server = ForkServer(sb, sb.slot_dir, self.limits)
            self._sandboxes[slot] = sb
        return self._sandboxes[slot]

    def close(self) -> None:
        import shutil

        for sb in self._sandboxes.values():
            if getattr(sb, "server", None) is not None:
                sb.server.close()
                shutil.rmtree(sb.slot_dir, ignore_errors=True)
        self._sandboxes.clear()

    # -- one archive -------------------------------------------------------------------
    def result_path(self, archive: Path) -> Path:
        return self.out / "results" / f"{archive.stem}.json"

    def done(self, archive: Path) -> bool:
        path = self.result_path(archive)
        if not path.exists():
            return False
        try:
            old = json.loads(path.read_text())
        except ValueError:
            return False
        return old.get("sha256") == sha256_file(archive) and old.get("exercises") == [e.id for e in self.exercises]

    def grade_one(self, archive: Path, slot: int) -> dict:
        t0 = time.monotonic()
        result = {"format": RESULT_FORMAT, "archive": archive.name, "sha256": sha256_file(archive),
                  "exercises": [e.id for e in self.exercises], "student_id": None, "rejected": None,
                  "scores": {}, "feedback": {}}
        try:
            sub = read_submission(archive, ASSIGNMENT)
        except Rejected as err:
            result["rejected"] = str(err)
            result["scores"] = {e.id: 0.0 for e in self.exercises}
            result["seconds"] = round(time.monotonic() - t0, 3)
            return result
        result["student_id"] = sub.student_id
        result["submitted"] = sub.manifest.get("submitted")
        with tempfile.TemporaryDirectory(prefix="attn-sub-") as tmp:
            os.chmod(tmp, 0o755)
            package = unpack(sub, RELEASE_LIBRARY, Path(tmp)).parent
            sandbox = self._sandbox(slot)
            stubbed = stubbed_exercises(package)
            # Phase 1, the score: the hidden cases of every exercise.
            hidden_raw = run_worker(package, [(e, self._expected[e.id][2]) for e in self.exercises],
                                    self.limits, sandbox)
            hidden_res = {}
            for e in self.exercises:
                _, _, hidden, exp_h = self._expected[e.id]
                hidden_res[e.id] = grade(e, hidden, exp_h, hidden_raw.get(e.id, []), True, stubbed)
            # Phase 2, the explanation: the public cases (expected vs got may be
            # shown) of the exercises that lost points.  Not needed when all pass.
            failing = [e for e in self.exercises
                       if not all(c.passed for c in hidden_res[e.id])
                       and hidden_res[e.id][0].status not in ("not_implemented", "blocked", "timeout")]
            public_raw = run_worker(package, [(e, self._expected[e.id][0]) for e in failing],
                                    self.limits, sandbox) if failing else {}
        result["sandbox"] = sandbox.kind + (" (fork server)" if getattr(sandbox, "server", None) else "")
        for e in self.exercises:
            public, exp_p, _, _ = self._expected[e.id]
            cases = hidden_res[e.id]
            if e in failing:
                cases = grade(e, public, exp_p, public_raw.get(e.id, []), False, stubbed) + cases
            r = ExerciseResult(e, cases)
            result["scores"][e.id] = round(r.score, 4)
            result["feedback"][e.id] = {
                "status": r.status, "points": e.points,
                "cases": [{"case": c.case, "passed": c.passed, "status": c.status, "message": c.message,
                           "hidden": c.hidden} for c in r.cases],
            }
        result["seconds"] = round(time.monotonic() - t0, 3)
        return result

    # -- the class -----------------------------------------------------------------------
    def run(self, submissions: Path, regrade: bool = False) -> list[dict]:
        if not Path(submissions).is_dir():
            raise FileNotFoundError(f"no folder of submissions at {submissions}")
        archives = sorted(Path(submissions).glob("*.zip"))
        todo = [a for a in archives if regrade or not self.done(a)]
        skipped = len(archives) - len(todo)
        self.log(f"{len(archives)} archives; {skipped} already graded, {len(todo)} to grade "
                 f"({len(self.exercises)} exercises, {self.jobs} workers)")
        if todo:
            self.prepare()
        slots = list(range(self.jobs))
        t0 = time.monotonic()
        finished = 0

        def work(archive):
            with self._lock:
                slot = slots.pop()
            try:
                return self.grade_one(archive, slot)
            finally:
                with self._lock:
                    slots.append(slot)

        try:
            with ThreadPoolExecutor(self.jobs) as pool:
                futures = {pool.submit(work, a): a for a in todo}
                for fut in as_completed(futures):
                    archive = futures[fut]
                    res = fut.result()
                    atomic_write(self.result_path(archive), json.dumps(res, indent=1))
                    finished += 1
                    total = sum(res["scores"].values())
                    who = res["student_id"] or "(rejected)"
                    why = f"  REJECTED: {res['rejected']}" if res["rejected"] else ""
                    self.log(f"[{finished + skipped}/{len(archives)}] {archive.name}: {who} "
                             f"{total:g}/{self.max_points:g} pts ({res['seconds']:.1f} s){why}")
        except KeyboardInterrupt:
            self.log("interrupted: finished results are kept; run again to resume")
            raise
        finally:
            self.close()
        results = self.load_results()
        self.write_outputs(results)
        self.log(f"graded {len(todo)} archives in {time.monotonic() - t0:.1f} s; see {self.out}")
        return results

    @property
    def max_points(self) -> float:
        return float(sum(e.points for e in self.exercises))

    def load_results(self) -> list[dict]:
        out = []
        for p in sorted((self.out / "results").glob("*.json")):
            try:
                out.append(json.loads(p.read_text()))
            except ValueError:
                continue
        return out

    def latest_by_student(self, results: list[dict]) -> dict[str, dict]:
        """Each student's latest accepted submission (by the manifest's time, then name)."""
        best: dict[str, dict] = {}
        for r in results:
            sid = r.get("student_id")
            if not sid:
                continue
            key = (r.get("submitted") or "", r["archive"])
            if sid not in best or key > (best[sid].get("submitted") or "", best[sid]["archive"]):
                best[sid] = r
        return best

    def write_outputs(self, results: list[dict]) -> None:
        ids = [e.id for e in self.exercises]
        best = self.latest_by_student(results)
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["student_id", *ids, "total", "max", "archive"])
        for sid in sorted(best):
            r = best[sid]
            scores = [r["scores"].get(i, 0.0) for i in ids]
            w.writerow([sid, *[f"{s:g}" for s in scores], f"{sum(scores):g}", f"{self.max_points:g}", r["archive"]])
        atomic_write(self.out / "gradebook.csv", buf.getvalue())
        rejected = [r for r in results if r.get("rejected")]
        for sid, r in best.items():
            atomic_write(self.out / "feedback" / f"{sid}.md", feedback_text(r, self.exercises))
        for r in rejected:
            atomic_write(self.out / "feedback" / "rejected" / f"{Path(r['archive']).stem}.md",
                         f"# {r['archive']}: not graded\n\n{r['rejected']}\n")
        self.write_report(best, rejected)

    def write_report(self, best: dict[str, dict], rejected: list[dict]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n = len(self.exercises)
        cols = min(n, 5)
        rows = (n + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 2.4 * rows), squeeze=False)
        lines = [f"# Class report ({len(best)} students, {len(rejected)} rejected archives)", "",
                 "| exercise | points | mean | full marks | zero |", "|---|---|---|---|---|"]
        for ax, e in zip(axes.flat, self.exercises):
            s = [r["scores"].get(e.id, 0.0) for r in best.values()]
            ax.hist(s, bins=[x - 0.5 for x in range(e.points + 2)] if s else 1, color="#4c72b0", rwidth=0.85)
            ax.set_title(f"{e.id}: {e.title[:28]}", fontsize=8)
            ax.set_xlabel("score", fontsize=7)
            ax.tick_params(labelsize=7)
            mean = sum(s) / len(s) if s else 0.0
            lines.append(f"| {e.id} | {e.points} | {mean:.2f} | {sum(x == e.points for x in s)} | {sum(x == 0 for x in s)} |")
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        atomic_write(self.out / "histograms.png", buf.getvalue())
        if rejected:
            lines += ["", "## Rejected archives", ""] + [f"* {r['archive']}: {r['rejected']}" for r in rejected]
        lines += ["", "![per-exercise scores](histograms.png)", ""]
        atomic_write(self.out / "report.md", "\n".join(lines))


def feedback_text(r: dict, exercises: list[Exercise]) -> str:
    total = sum(r["scores"].values())
    maxp = sum(e.points for e in exercises)
    out = [f"# Feedback for {r['student_id']}", "", f"Archive: {r['archive']}  ",
           f"Total: {total:g} / {maxp:g} points", "",
           "Each exercise is scored on hidden cases; the public cases (the ones "
           "`attn-course check` runs) are shown with expected and obtained values.", ""]
    for e in exercises:
        fb = r["feedback"].get(e.id, {})
        score = r["scores"].get(e.id, 0.0)
        out.append(f"## Exercise {e.id}: {e.title} ({score:g}/{e.points})")
        status = fb.get("status", "")
        if status == "pass":
            out.append("All cases pass.")
        elif status == "not_implemented":
            out.append("Not implemented.")
        else:
            for c in fb.get("cases", []):
                if not c["passed"]:
                    out.append(f"* {c['case']}: {c['message']}".replace("\n", "\n    "))
            if e.hint:
                out.append(f"\nHint: {e.hint}")
        out.append("")
    return "\n".join(out)


def export_to_nbgrader(results_best: dict[str, dict], exercises: list[Exercise], db_url: str,
                       assignment: str = "library") -> None:
    """Put the library scores into nbgrader's gradebook as one more assignment."""
    import warnings

    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    # nbgrader's add_submission triggers an autoflush warning with SQLAlchemy 2
    # (its own `nbgrader autograde` shows the same); the rows are added all the same.
    with warnings.catch_warnings(), Gradebook(db_url) as gb:
        warnings.simplefilter("ignore", SAWarning)
        gb.update_or_create_assignment(assignment)
        gb.update_or_create_notebook(assignment, assignment)
        for e in exercises:
            gb.update_or_create_grade_cell(e.label, assignment, assignment, max_score=float(e.points),
                                           cell_type="code")
        gb.db.commit()
        for sid, r in results_best.items():
            gb.update_or_create_student(sid)
            gb.update_or_create_submission(assignment, sid)
            for e in exercises:
                g = gb.find_grade(e.label, assignment, assignment, sid)
                g.auto_score = float(r["scores"].get(e.id, 0.0))
            gb.db.commit()


def grade_notebooks(results_best: dict[str, dict], submissions: Path, course: Path, out: Path,
                    exercises: list[Exercise], log=print) -> Path:
    """The notebooks of the archives through nbgrader, and one CSV for everything.

    Each accepted archive's ``notebooks/chNN.ipynb`` goes to nbgrader's
    ``grading/submitted/<student>/chNN/`` (an existing, different file there is
    kept, never overwritten: the instructor decides); ``nbgrader autograde``
    runs per chapter (it skips what it already graded); the library scores go
    into the same gradebook; ``nbgrader export`` writes ``OUT/grades.csv``.
    """
    import filecmp
    import subprocess

    from .archive import read_submission

    course = Path(course)
    submitted = course / "grading" / "submitted"
    chapters: set[str] = set()
    by_archive = {r["archive"]: r for r in results_best.values()}
    for archive in sorted(Path(submissions).glob("*.zip")):
        r = by_archive.get(archive.name)
        if r is None:
            continue
        sub = read_submission(archive, ASSIGNMENT)
        for name, data in sub.files.items():
            if not name.startswith("notebooks/") or not name.endswith(".ipynb"):
                continue
            ch = Path(name).stem
            if not (course / "solutions" / ch / f"{ch}.ipynb").exists():
                continue
            target = submitted / sub.student_id / ch / f"{ch}.ipynb"
            if target.exists():
                tmp = target.with_suffix(".incoming")
                tmp.write_bytes(data)
                same = filecmp.cmp(tmp, target, shallow=False)
                tmp.unlink()
                if not same:
                    log(f"kept {target} (differs from {archive.name}; remove it to grade the archive's)")
                    chapters.add(ch)
                    continue
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(target, data)
            chapters.add(ch)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    nbgrader = [sys.executable, "-m", "nbgrader"]
    for ch in sorted(chapters):
        log(f"nbgrader autograde {ch}")
        r = subprocess.run(nbgrader + ["autograde", ch, "--create"], cwd=course, env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            log(f"nbgrader autograde {ch} reported problems:\n{r.stderr[-1500:]}")
    export_to_nbgrader(results_best, exercises, f"sqlite:///{course / 'grading' / 'gradebook.db'}")
    target = Path(out) / "grades.csv"
    r = subprocess.run(nbgrader + ["export", "--to", str(target)], cwd=course, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nbgrader export failed:\n{r.stderr[-1500:]}")
    return target


def main_grade(args) -> int:
    g = Grader(Path(args.out), args.exercises, jobs=args.jobs,
               use_bwrap=False if args.no_bwrap else None)
    if g.use_bwrap is not False:
        from .sandbox import bwrap_works

        if not bwrap_works():
            print("warning: bubblewrap is not available; workers run with limits only and can read "
                  "what this user can read (install the Debian package bubblewrap)", file=sys.stderr)
    results = g.run(Path(args.submissions), regrade=args.regrade)
    if args.nbgrader:
        export_to_nbgrader(g.latest_by_student(results), g.exercises, args.nbgrader)
        print(f"scores written to nbgrader's gradebook {args.nbgrader} (assignment 'library')")
    if args.notebooks:
        from . import ROOT

        course = Path(args.course) if args.course else ROOT
        csv_path = grade_notebooks(g.latest_by_student(results), Path(args.submissions), course,
                                   Path(args.out), g.exercises)
        print(f"notebooks autograded by nbgrader; one CSV for notebooks and library: {csv_path}")
    return 0
