"""Class statistics for the report: totals, and how often each catalogued mistake occurred.

The grader already diagnoses every wrong case against the catalogue of
mistakes (:mod:`attn_course.diagnose`, :mod:`attn_course.mistakes`), and
records the key of the entry an answer reproduces in the case's result
(``"mistake"``, written by the grader, :attr:`attn_course.scoring.CaseResult.mistake`).
Here a student's exercise counts once for an entry when a case of status
``wrong`` carries its key.  The key, never the feedback's words: a case whose
reference raises shows the student's own exception message in its line, which
may quote the catalogue's text.  Results written before the key existed count
no mistakes.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from .registry import Exercise
from .results import ArchiveResult


@dataclass(frozen=True)
class MistakeCount:
    exercise: str
    key: str
    message: str
    students: int  # students whose counted archive reproduces it in this exercise


@dataclass(frozen=True)
class Totals:
    n: int
    mean: float
    median: float
    full: int  # students with every point
    zero: int


def totals(best: dict[str, ArchiveResult], exercises: list[Exercise]) -> Totals:
    ids = [e.id for e in exercises]
    maxp = sum(e.points for e in exercises)
    t = [sum(r.scores.get(i, 0.0) for i in ids) for r in best.values()]
    if not t:
        return Totals(0, 0.0, 0.0, 0, 0)
    return Totals(len(t), statistics.fmean(t), statistics.median(t), sum(x == maxp for x in t), sum(x == 0 for x in t))


def mistake_counts(best: dict[str, ArchiveResult], exercises: list[Exercise]) -> list[MistakeCount]:
    """Catalogued mistakes found in the class, most frequent first (each student and exercise once)."""
    from .mistakes import for_exercise

    counts: Counter = Counter()
    entries = {(e.id, m.key): m for e in exercises for m in for_exercise(e.id)}
    for r in best.values():
        for ex_id, fb in r.feedback.items():
            found = {c.get("mistake") for c in fb.get("cases", [])
                     if c.get("status") == "wrong" and isinstance(c.get("mistake"), str)}
            for key in found:
                if (ex_id, key) in entries:
                    counts[(ex_id, key)] += 1
    out = [MistakeCount(eid, key, entries[(eid, key)].message, k) for (eid, key), k in counts.items()]
    order = {e.id: i for i, e in enumerate(exercises)}
    return sorted(out, key=lambda m: (-m.students, order[m.exercise], m.key))
