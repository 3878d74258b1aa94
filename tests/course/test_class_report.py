"""The class report: totals histogram, titles, and catalogued mistakes ranked by frequency.

Students' answers here are the catalogue's own wrong implementations (and the
reference), scored through the one scoring path (:func:`scoring.grade` with
the grader's diagnosis), as the grader stores them; no sandbox runs.
"""

from __future__ import annotations

from attn_course.class_stats import mistake_counts, totals
from attn_course.diagnose import explain, wrong_outputs
from attn_course.mistakes import for_exercise
from attn_course.registry import select
from attn_course.report import write_outputs
from attn_course.results import ArchiveResult
from attn_course.runner import reference_results
from attn_course.scoring import ExerciseResult, Outcome, grade

EX = select("3")


def _graded(sid: str, answers: dict[str, str | None]) -> ArchiveResult:
    """answers[exercise] = a catalogue key (that wrong implementation) or None (the reference)."""
    r = ArchiveResult(f"{sid}.zip", "", "fp", [e.id for e in EX], received=1.0, student_id=sid, identity="ok")
    for e in EX:
        cases = e.make_cases(False)
        expected = reference_results(e, cases)
        key = answers.get(e.id)
        got = expected if key is None else [Outcome("ok", wrong_outputs(e, c)[key]) for c in cases]
        res = ExerciseResult(e, grade(e, cases, expected, got, False, diagnose=explain))
        r.scores[e.id] = round(res.score, 4)
        r.feedback[e.id] = {"status": res.status.value, "points": e.points,
                            "cases": [{"case": c.case, "passed": c.passed, "status": c.status.value,
                                       "message": c.message, "hidden": c.hidden} for c in res.cases]}
    return r


def test_mistakes_are_ranked_by_how_many_students_make_them(tmp_path):
    m31, m32 = for_exercise("3.1")[0].key, for_exercise("3.2")[0].key
    best = {"a": _graded("a", {"3.1": m31}), "b": _graded("b", {"3.1": m31, "3.2": m32}),
            "c": _graded("c", {"3.2": m32}), "d": _graded("d", {"3.1": m31}), "e": _graded("e", {})}
    counts = [(m.exercise, m.key, m.students) for m in mistake_counts(best, EX)]
    assert counts[:2] == [("3.1", m31, 3), ("3.2", m32, 2)], counts
    assert len(counts) == 2  # the reference is never a mistake
    t = totals(best, EX)
    maxp = sum(e.points for e in EX)
    assert (t.n, t.full) == (5, 1) and t.mean == sum(sum(r.scores.values()) for r in best.values()) / 5
    assert t.mean < maxp

    write_outputs(tmp_path, list(best.values()), EX)
    report = (tmp_path / "report.md").read_text()
    assert "## Catalogued mistakes, most frequent first" in report
    rows = [line for line in report.splitlines() if line.startswith("| 3 | 3.1 |") or line.startswith("| 2 | 3.2 |")]
    assert len(rows) == 2 and report.index(rows[0]) < report.index(rows[1]), report
    assert f"Totals out of {maxp:g}" in report
    assert (tmp_path / "histograms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_figure_is_drawn_again_only_when_what_it_shows_changed(tmp_path, monkeypatch):
    import attn_course.report as report

    drawn = []
    real = report._histograms
    monkeypatch.setattr(report, "_histograms", lambda *a: drawn.append(1) or real(*a))
    best = {"a": _graded("a", {}), "b": _graded("b", {"3.1": for_exercise("3.1")[0].key})}
    png = tmp_path / "histograms.png"
    write_outputs(tmp_path, list(best.values()), EX)
    first = png.read_bytes()
    write_outputs(tmp_path, list(reversed(best.values())), EX)  # the same class (a rerun that graded nothing)
    assert len(drawn) == 1 and png.read_bytes() == first
    best["c"] = _graded("c", {})  # one more student: another picture
    write_outputs(tmp_path, list(best.values()), EX)
    assert len(drawn) == 2 and png.read_bytes() != first
    png.write_bytes(b"not the grader's figure")  # a file that is not the one written is replaced
    write_outputs(tmp_path, list(best.values()), EX)
    assert len(drawn) == 3 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    png.unlink()
    write_outputs(tmp_path, list(best.values()), EX)
    assert len(drawn) == 4 and png.exists()
