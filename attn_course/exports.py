"""Gradebook exports a learning platform imports: Canvas and Moodle CSV files.

Both carry, per student, the archive that counts (received last) and its
total after the late policy (:mod:`attn_course.late`), with each exercise's
score beside it.  Every text cell is :func:`attn_course.text.csv_cell`
(no spreadsheet formula can start); numbers are written as numbers.

* ``exports/canvas.csv``: Canvas's gradebook import layout: ``Student, ID,
  SIS User ID, SIS Login ID, Section`` then one column per graded item, the
  first data row ``Points Possible``.  Students are matched on ``SIS User ID``
  (the course's student id); ``ID`` (Canvas's own number) is left empty.
* ``exports/moodle.csv``: for Moodle's "Import grades: CSV file": an
  ``ID number`` column to map to the user's ID number, then the items.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .late import LatePolicy
from .registry import Exercise
from .results import ArchiveResult, atomic_write
from .text import csv_cell


@dataclass(frozen=True)
class GradeRow:
    """One student's line in every export."""

    student_id: str
    name: str
    scores: dict[str, float]
    raw_total: float
    late_days: int
    total: float


def grade_rows(best: dict[str, ArchiveResult], exercises: list[Exercise], roster=None,
               late: LatePolicy | None = None) -> list[GradeRow]:
    names = dict(zip(roster.ids, roster.names)) if roster is not None and roster.names else {}
    rows = []
    for sid in sorted(best):
        r = best[sid]
        scores = {e.id: float(r.scores.get(e.id, 0.0)) for e in exercises}
        raw = round(sum(scores.values()), 4)
        lateness = late.lateness(r.received) if late else None
        rows.append(GradeRow(sid, names.get(sid, ""), scores, raw, lateness.days if lateness else 0,
                             lateness.apply(raw) if lateness else raw))
    return rows


def _num(x: float) -> str:
    return f"{x:g}"


def canvas_csv(rows: list[GradeRow], exercises: list[Exercise], assignment: str) -> str:
    maxp = float(sum(e.points for e in exercises))
    title = csv_cell(assignment, 120)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", title,
                *[csv_cell(f"{assignment} {e.id}", 120) for e in exercises]])
    w.writerow(["    Points Possible", "", "", "", "", _num(maxp), *[_num(e.points) for e in exercises]])
    for r in rows:
        w.writerow([csv_cell(r.name or r.student_id, 200), "", csv_cell(r.student_id, 64), csv_cell(r.student_id, 64),
                    "", _num(r.total), *[_num(r.scores[e.id]) for e in exercises]])
    return buf.getvalue()


def moodle_csv(rows: list[GradeRow], exercises: list[Exercise], assignment: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["ID number", "Full name", csv_cell(assignment, 120), "Days late",
                *[csv_cell(f"{assignment} {e.id}", 120) for e in exercises]])
    for r in rows:
        w.writerow([csv_cell(r.student_id, 64), csv_cell(r.name, 200), _num(r.total), str(r.late_days),
                    *[_num(r.scores[e.id]) for e in exercises]])
    return buf.getvalue()


def write_exports(out: Path, rows: list[GradeRow], exercises: list[Exercise], assignment: str,
                  write: Callable[[Path, str | bytes], None] = atomic_write) -> None:
    write(out / "exports" / "canvas.csv", canvas_csv(rows, exercises, assignment))
    write(out / "exports" / "moodle.csv", moodle_csv(rows, exercises, assignment))
