"""Class statistics for the report: totals, and how often each catalogued mistake occurred.

The grader already diagnoses every wrong case against the catalogue of
mistakes (:mod:`attn_course.diagnose`, :mod:`attn_course.mistakes`): the
catalogue entry's fixed text, ``message (see section)``, ends the case's
feedback line.  Here a student's exercise counts once for an entry when a
case of status ``wrong`` carries that exact text (the catalogue's own words:
an answer's values cannot spell them; a raised exception is another status).
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
    entries = {}
    for e in exercises:
        for m in for_exercise(e.id):
            entries[(e.id, m.key)] = (m, f"{m.message} (see {m.section})")
    for r in best.values():
        for ex_id, fb in r.feedback.items():
            wrong = [c.get("message", "") for c in fb.get("cases", []) if c.get("status") == "wrong"]
            if not wrong:
                continue
            for (eid, key), (_, text) in entries.items():
                if eid == ex_id and any(text in msg for msg in wrong):
                    counts[(eid, key)] += 1
    out = [MistakeCount(eid, key, entries[(eid, key)][0].message, k) for (eid, key), k in counts.items()]
    order = {e.id: i for i, e in enumerate(exercises)}
    return sorted(out, key=lambda m: (-m.students, order[m.exercise], m.key))
