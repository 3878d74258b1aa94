"""A student's check: the public cases of some exercises, run on a workspace.

The expected values come from the public case files (data shipped with the
release); the student's code runs in a worker process, so an exception, a
hang or a crash in one exercise is reported for that exercise and the others
still run.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import values
from .registry import CHAPTERS, Case, Exercise, all_exercises
from .runner import package_files, run_and_grade
from .sandbox import Limits, Plain
from .scoring import ExerciseResult, Outcome, Status, stubbed_exercises
from .server import WorkerServer


def load_public(cases_dir: Path, exercises: list[Exercise]) -> dict[str, tuple[list[Case], list[Outcome]]]:
    """exercise id -> (public cases, expected results) from ``cases_dir/chNN.json``."""
    out = {}
    chapters = sorted({e.chapter for e in exercises})
    data = {}
    for ch in chapters:
        path = Path(cases_dir) / f"ch{ch:02d}.json"
        if path.exists():
            data.update(json.loads(path.read_text()))
    for e in exercises:
        if e.id not in data:
            raise FileNotFoundError(f"no public cases for exercise {e.id} in {cases_dir}")
        entry = data[e.id]
        cases = [Case(c["name"], values.decode(c["inputs"]), c.get("note", ""), c.get("eager") is True)
                 for c in entry["cases"]]
        expected = [Outcome.from_dict(values.decode(c["expected"])) for c in entry["cases"]]
        out[e.id] = (cases, expected)
    return out


def check_public(workspace: Path, exercises: list[Exercise], limits: Limits | None = None,
                 backend: str = "jax") -> list[ExerciseResult]:
    """The public cases of ``exercises`` on the workspace's package, run on ``backend`` ("jax" or "mlx")."""
    workspace = Path(workspace)
    public = load_public(workspace / ".course" / "cases", exercises)
    limits = limits or Limits(per_exercise_s=120, per_archive_s=3600)
    server = WorkerServer(Plain(limits))
    try:
        graded = run_and_grade(server, package_files(workspace), [(e, *public[e.id]) for e in exercises],
                               False, stubbed_exercises(workspace), limits, backend=backend)
    finally:
        server.close()
    return [ExerciseResult(e, graded[e.id]) for e in exercises]


SYMBOL = {Status.PASS: "PASS", Status.FAIL: "FAIL", Status.NOT_IMPLEMENTED: "TODO", Status.BLOCKED: "WAIT",
          Status.TIMEOUT: "TIME", Status.CRASHED: "CRASH", Status.BUDGET: "TIME"}


def report(results: list[ExerciseResult], verbose: bool = True) -> str:
    """The readable report: one block per exercise, then progress."""
    lines = []
    for r in results:
        e = r.exercise
        head = f"[{SYMBOL[r.status]:>5}] Exercise {e.id:<5} {e.title}  ({e.points} pts)"
        lines.append(head)
        if r.status == Status.PASS:
            lines.append(f"        all {len(r.cases)} public cases pass")
        elif r.status == Status.NOT_IMPLEMENTED:
            lines.append(f"        not implemented yet: write {e.name} in attn_tensors/{e.module}.py"
                         f"  (book: {e.book_page})")
        elif r.status == Status.BLOCKED:
            lines.append(f"        {r.cases[0].message}")
        else:
            for c in r.cases:
                if c.passed:
                    lines.append(f"        ok    {c.case}")
                else:
                    msg = c.message.replace("\n", "\n              ")
                    lines.append(f"        wrong {c.case}: {msg}")
            if e.hint and verbose:
                lines.append(f"        hint: {e.hint}")
    return "\n".join(lines)


def progress(passed: set[str]) -> str:
    """Progress across the course, by chapter."""
    exercises = all_exercises()
    total = sum(e.points for e in exercises.values())
    got = sum(e.points for e in exercises.values() if e.id in passed)
    parts = []
    for ch in CHAPTERS:
        ids = [e.id for e in exercises.values() if e.chapter == ch]
        if ids:
            parts.append(f"ch{ch:02d} {sum(i in passed for i in ids)}/{len(ids)}")
    return (f"Progress: {len(passed & set(exercises))}/{len(exercises)} exercises, "
            f"{got}/{total} points on the public cases\n  " + "  ".join(parts))
