"""The class report: totals histogram, titles, and catalogued mistakes ranked by frequency.

Students' answers here are the catalogue's own wrong implementations (and the
reference), scored through the one scoring path (:func:`scoring.grade` with
the grader's diagnosis), as the grader stores them; no sandbox runs.
"""

from __future__ import annotations

import hashlib

from attn_course.class_stats import mistake_counts, totals
from attn_course.diagnose import explain, wrong_outputs
from attn_course.mistakes import for_exercise
from attn_course.registry import select
from attn_course.report import write_outputs
from attn_course.results import ArchiveResult
from attn_course.text import md_inline
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
        r.feedback[e.id] = res.feedback()
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
    assert "](histograms.svg)" in report
    assert sum(_bars(tmp_path / "histograms.svg")[0].values()) == 5  # the totals: every student once


def test_a_message_that_quotes_the_catalogue_is_not_a_mistake():
    """Where the reference raises, a wrong answer's line quotes the student's own exception: an
    archive that raises the catalogue's words there (and computes nothing) is counted for no entry."""
    r = ArchiveResult("m.zip", "", "fp", [e.id for e in EX], received=1.0, student_id="m", identity="ok")
    quoted = 0
    for e in EX:
        cases = e.make_cases(False)
        expected = reference_results(e, cases)
        words = "; ".join(f"{m.message} (see {m.section})" for m in for_exercise(e.id))
        got = [Outcome("raised", type="ValueError", message=words) if x.status == "raised"
               else Outcome("raised", type="RuntimeError", message="no") for x in expected]
        res = ExerciseResult(e, grade(e, cases, expected, got, False, diagnose=explain))
        quoted += sum(words in c.message and c.status.value == "wrong" for c in res.cases)
        r.feedback[e.id] = res.feedback()
    assert quoted, "no public case of chapter 3 checks an error: the attack is not tried"
    assert mistake_counts({"m": r}, EX) == []


SVG = "{http://www.w3.org/2000/svg}"


def _bars(path) -> list[dict[float, int]]:
    """Each panel's bars of the figure, {left edge: students}, with every bar's height checked
    to be in proportion to its count (one scale per panel)."""
    import xml.etree.ElementTree as ET

    panels = []
    for g in ET.parse(path).getroot().iter(f"{SVG}g"):
        bars = [b for b in g.iter(f"{SVG}rect") if b.get("class") == "bar"]
        scale = [float(b.get("height")) / int(b.get("data-count")) for b in bars]
        assert not scale or max(scale) - min(scale) < 0.01, scale  # coordinates are written to 0.01
        panels.append({float(b.get("data-lo")): int(b.get("data-count")) for b in bars})
    return panels


def test_the_figure_counts_what_numpy_counts(tmp_path):
    """Totals over [0, max] in min(max, 40) bins, each exercise in whole points (a partial
    score to the nearest point): every bar's count is numpy.histogram's, and titles fit."""
    import re

    import numpy as np

    from attn_course.results import ArchiveResult

    rng = np.random.default_rng(5)
    results = []
    for k in range(37):
        r = ArchiveResult(f"s{k}.zip", "", "fp", [e.id for e in EX], received=1.0, student_id=f"s{k}", identity="ok")
        for e in EX:  # whole points, partial credit (2.4, 2.5, 0.4) and full marks
            r.scores[e.id] = float(rng.choice([0, e.points, round(rng.uniform(0, e.points), 1), 2.5, 0.4]))
        results.append(r)
    write_outputs(tmp_path, results, EX)
    panels = _bars(tmp_path / "histograms.svg")
    assert len(panels) == 1 + len(EX)
    maxp = sum(e.points for e in EX)
    totals = [sum(r.scores.values()) for r in results]
    counts, edges = np.histogram(totals, bins=min(maxp, 40), range=(0, maxp))
    assert panels[0] == {float(lo): int(c) for lo, c in zip(edges, counts) if c}  # 12 points: whole edges
    for e, bars in zip(EX, panels[1:]):
        counts, edges = np.histogram([r.scores[e.id] for r in results], bins=np.arange(e.points + 2) - 0.5)
        assert bars == {float(lo): int(c) for lo, c in zip(edges, counts) if c}, e.id
        assert sum(bars.values()) == len(results)
    text = (tmp_path / "histograms.svg").read_text()
    titles = re.findall(r'<text class="title"[^>]*>([^<]*)</text>', text)
    assert titles[0] == f"Totals (37 students, out of {maxp} points)"
    assert all(len(t) <= 34 for t in titles[1:]) and len(titles) > len(EX), titles


def test_the_figure_is_written_again_only_when_what_it_shows_changed(tmp_path):

    best = {"a": _graded("a", {}), "b": _graded("b", {"3.1": for_exercise("3.1")[0].key})}
    svg = tmp_path / "histograms.svg"
    write_outputs(tmp_path, list(best.values()), EX)
    first, stamp = svg.read_bytes(), svg.stat().st_mtime_ns
    write_outputs(tmp_path, list(reversed(best.values())), EX)  # the same class (a rerun that graded nothing)
    assert svg.read_bytes() == first and svg.stat().st_mtime_ns == stamp
    best["c"] = _graded("c", {})  # one more student: another picture
    write_outputs(tmp_path, list(best.values()), EX)
    assert svg.read_bytes() != first and "Totals (3 students" in svg.read_text()
    svg.write_bytes(b"the instructor's figure")  # edited since it was written: the instructor's, kept
    assert write_outputs(tmp_path, list(best.values()), EX) == []  # (nothing new to show beside it)
    assert svg.read_bytes() == b"the instructor's figure"
    best["d"] = _graded("d", {})
    assert write_outputs(tmp_path, list(best.values()), EX) == ["histograms.svg"]
    assert svg.read_bytes() == b"the instructor's figure"
    assert "Totals (4 students" in (tmp_path / "histograms.svg.new").read_text()
    svg.unlink()  # removed: written again
    write_outputs(tmp_path, list(best.values()), EX)
    assert svg.read_bytes().startswith(b"<svg")
    # the PNG an earlier version drew is removed when its key says it is that version's file,
    # and a PNG that is not (one a person put there) is kept
    png, key = tmp_path / "histograms.png", tmp_path / ".histograms.key"
    png.write_bytes(b"\x89PNG old")
    key.write_text(f"{'0' * 64} {hashlib.sha256(png.read_bytes()).hexdigest()}\n")
    write_outputs(tmp_path, list(best.values()), EX)
    assert not png.exists() and not key.exists()
    png.write_bytes(b"\x89PNG someone's")
    key.write_text(f"{'0' * 64} {'1' * 64}\n")
    write_outputs(tmp_path, list(best.values()), EX)
    assert png.read_bytes() == b"\x89PNG someone's"


def test_no_student_id_is_the_name_of_another_students_feedback(tmp_path):
    """From the red team: s1 and S1 took ``<id>-<digest>.md``, which is itself a valid id; a third
    student with the id ``s1-<s1's digest>`` then had the same file as s1, and one of the two
    feedbacks was lost (or the third's file held s1's).  Every student keeps a file of their own."""
    third = f"s1-{hashlib.sha256(b's1').hexdigest()[:8]}"
    for order in (["s1", "S1", third], [third, "S1", "s1"]):
        out = tmp_path / "-".join(order)
        best = {sid: _graded(sid, {}) for sid in order}
        write_outputs(out, list(best.values()), EX)
        names = sorted(p.name for p in (out / "feedback").glob("*.md"))
        assert len({n.lower() for n in names}) == 3, names
        heads = sorted((out / "feedback" / n).read_text().splitlines()[0] for n in names)
        assert heads == sorted(f"# Feedback for {md_inline(sid, 64)}" for sid in order), heads


def test_students_whose_ids_differ_only_in_case_get_feedback_files_of_their_own(tmp_path):
    """s1 and S1 (two students without a roster): feedback/s1.md and feedback/S1.md are one file
    on macOS's and Windows's file systems, and the second replaced the first."""
    best = {"s1": _graded("s1", {}), "S1": _graded("S1", {"3.1": for_exercise("3.1")[0].key}), "t2": _graded("t2", {})}
    write_outputs(tmp_path, list(best.values()), EX)
    names = sorted(p.name for p in (tmp_path / "feedback").glob("*.md"))
    assert "t2.md" in names and len(names) == 3
    assert len({n.lower() for n in names}) == 3  # apart on a file system that ignores case
    texts = {n: (tmp_path / "feedback" / n).read_text() for n in names if n != "t2.md"}
    assert len(set(texts.values())) == 2  # each student's own
