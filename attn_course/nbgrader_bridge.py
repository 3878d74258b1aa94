"""Notebooks graded in the sandbox, and scores kept in nbgrader's gradebook.

A submitted notebook is never executed by nbgrader here: its answer cells
(the cells nbgrader marks ``solution``, found by their ``grade_id``) run in
the same sandboxed worker as a library archive, between the release's own
locked cells (setup and imports, taken from ``exercises/``, not from the
submission), and are scored on the hidden cases by the trusted side.  The
scores go into nbgrader's gradebook (one assignment per chapter, one grade
cell per exercise's test cell, and the assignment ``library``), so
``nbgrader export`` and the formgrader work as instructors know them.
Running ``nbgrader autograde`` on students' notebooks instead would execute
them unconfined, as the grader's user: ``nbgrader_config.py`` refuses it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import NamedTuple

from . import EXERCISES
from .late import LatePolicy
from .notebook_cells import cells_by_id
from .registry import Exercise

def notebook_jobs(sub, exercises: list[Exercise]):
    """(chapter, notebook job, {exercise: why it scores 0}) for each notebook of the archive."""
    chapters = sorted({e.chapter for e in exercises})
    for ch in chapters:
        name = f"notebooks/ch{ch:02d}.ipynb"
        release = EXERCISES / f"ch{ch:02d}" / f"ch{ch:02d}.ipynb"
        if name not in sub.files or not release.exists():
            continue
        locked = cells_by_id(json.loads(release.read_text()))
        problems: dict[str, str] = {}
        try:
            theirs = cells_by_id(json.loads(sub.files[name]))
        except (ValueError, RecursionError, UnicodeDecodeError, TypeError, AttributeError):
            theirs = {}
            problems = {e.id: "the notebook is not a readable .ipynb file" for e in exercises if e.chapter == ch}
        items = []
        for e in exercises:
            if e.chapter != ch:
                continue
            answer = theirs.get(f"{e.label}-answer", [])
            if len(answer) != 1 and e.id not in problems:
                problems[e.id] = (f"the notebook has {len(answer)} answer cells for exercise {e.id} "
                                  f"(expected one, with grade_id {e.label}-answer)")
            cells = [{"name": f"{e.label}-imports", "source": s} for s in locked.get(f"{e.label}-imports", [])]
            cells += [{"name": f"{e.label}-answer", "source": answer[0] if len(answer) == 1 else ""}]
            items.append({"id": e.id, "cells": cells})
        # the test cells are not run here, so their checker is not imported (nor in the sandbox),
        # and the library is the archive's own (no workspace to load it from)
        setup = "\n".join(line for src in locked.get(f"ch{ch:02d}-setup", []) for line in src.splitlines()
                          if not re.match(r"\s*(from attn_course\.nbcheck import|use_workspace\(\))", line))
        yield ch, {"setup": setup, "exercises": items}, problems


def write_gradebook(db_url: str, best: dict, exercises: list[Exercise], notebooks: bool = False,
                    late: LatePolicy | None = None) -> None:
    """The library scores as assignment ``library``; notebook scores as ``chNN``.

    With a late policy, nbgrader's gradebook carries it as nbgrader does its
    own: each assignment's due date (the deadline with its grace), each
    submission's time (the archive's receipt time) and each notebook's late
    penalty in points (what the policy takes from its score), so that
    ``nbgrader export`` (``score = raw_score - late_submission_penalty``) and
    the formgrader show the same total as ``gradebook.csv``, for the library
    and the notebooks alike.  Without one, all three are cleared (a gradebook
    written before with another policy keeps none of its penalties).
    """
    import warnings
    from datetime import datetime, timezone

    from .quick_imports import skip_iri_parsers

    skip_iri_parsers()
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    from .nbgrader_db import fast_alembic_head

    fast_alembic_head()  # a new gradebook without a second Python for `alembic heads`

    if db_url.startswith("sqlite:///"):
        path = Path(db_url.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True)
        try:  # a new gradebook holds the class's grades: its owner's only (SQLite made it 0644)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        except FileExistsError:
            pass  # (one there already keeps its mode: the instructor's, or nbgrader's own)
    groups = [("library", "library", "{label}", exercises, "scores")]
    if notebooks:
        for ch in sorted({e.chapter for e in exercises}):
            chosen = [e for e in exercises if e.chapter == ch]
            groups.append((f"ch{ch:02d}", f"ch{ch:02d}", "{label}-tests", chosen, "notebook_scores"))
    def utc(stamp: float) -> datetime:
        return datetime.fromtimestamp(stamp, timezone.utc)

    due = utc(late.deadline + late.grace_s) if late is not None else None
    with warnings.catch_warnings(), Gradebook(db_url) as gb:
        # nbgrader's add_submission triggers an autoflush warning with SQLAlchemy 2
        warnings.simplefilter("ignore", SAWarning)
        for assignment, notebook, cell, chosen, attr in groups:
            gb.update_or_create_assignment(assignment, duedate=due)
            gb.update_or_create_notebook(notebook, assignment)
            for e in chosen:
                gb.update_or_create_grade_cell(cell.format(label=e.label), notebook, assignment,
                                               max_score=float(e.points), cell_type="code")
            gb.db.commit()
            for sid, r in best.items():
                gb.update_or_create_student(sid)
                gb.update_or_create_submission(assignment, sid, timestamp=utc(r.received) if late else None)
                raw = 0.0
                for e in chosen:
                    g = gb.find_grade(cell.format(label=e.label), notebook, assignment, sid)
                    g.auto_score = float(getattr(r, attr).get(e.id, 0.0))
                    raw += g.auto_score
                penalty = round(raw - late.lateness(r.received).apply(raw), 4) if late is not None else 0.0
                gb.find_submission_notebook(notebook, assignment, sid).late_submission_penalty = penalty
                gb.db.commit()


class Export(NamedTuple):
    """Where :func:`export_csv` wrote nbgrader's export, and whether the instructor's edited
    ``grades.csv`` was kept (``path`` is then this run's version beside it)."""

    path: Path
    kept: bool


def export_csv(db_url: str, out: Path) -> Export:
    """``nbgrader export`` of the gradebook into ``OUT/grades.csv``: nbgrader's own CSV exporter
    (the plugin the command runs), here, instead of a second Python that imports nbgrader again
    (about 4 CPU-s); raises if nbgrader fails.

    The export is written as the grading folder's other generated files
    (:class:`attn_course.outputs.Outputs`): a ``grades.csv`` the instructor
    edited since it was written is kept, and this run's version goes beside
    it (``grades.csv.new``).
    """
    import tempfile

    from .outputs import Outputs, beside
    from .quick_imports import skip_iri_parsers
    from .run_dir import run_dir

    skip_iri_parsers()
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    out = Path(out).resolve()
    target = out / "grades.csv"
    # nbgrader's exporter writes its file in place: it writes into a private folder of the run,
    # and the grading folder gets it as its other files
    with tempfile.TemporaryDirectory(dir=run_dir()) as tmp:
        staged = Path(tmp) / "grades.csv"
        try:
            with Gradebook(db_url) as gb:
                CsvExportPlugin(to=str(staged)).export(gb)
        except Exception as err:  # noqa: BLE001 - whatever nbgrader raises, said as the command would
            raise RuntimeError(f"nbgrader export failed: {type(err).__name__}: {err}"[:1500]) from err
        if not staged.exists():
            raise RuntimeError("nbgrader export failed: it wrote no grades.csv")
        outputs = Outputs(out)
        outputs.write(target, staged.read_bytes())
        outputs.close()
    return Export(beside(out / outputs.kept[0]), True) if outputs.kept else Export(target, False)  # (kept[0]: grades.csv, or its .new)
