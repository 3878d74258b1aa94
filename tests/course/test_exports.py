"""Late policy at its boundaries; Canvas and Moodle exports; the gradebook with a policy.

No sandbox runs here: results are made directly, as the grader stores them.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone

import pytest

from attn_course.exports import canvas_csv, grade_rows, moodle_csv
from attn_course.identity import Roster
from attn_course.late import DAY_S, LatePolicy, LatePolicyError
from attn_course.registry import select
from attn_course.report import write_outputs
from attn_course.results import ArchiveResult
from attn_course.text import md_inline

EX = select("3")
D = datetime(2026, 12, 1, 23, 59, tzinfo=timezone.utc).timestamp()


def _result(sid: str, received: float, scores: dict[str, float], archive: str | None = None) -> ArchiveResult:
    return ArchiveResult(archive or f"{sid}.zip", "0" * 64, "fp", [e.id for e in EX], received=received,
                         student_id=sid, identity="ok", scores=scores)


def _full() -> dict[str, float]:
    return {e.id: float(e.points) for e in EX}


@pytest.mark.parametrize("offset, days", [
    (-DAY_S, 0), (0.0, 0), (600.0, 0),            # before, at the deadline, at the end of the grace
    (600.001, 1), (600 + DAY_S, 1),               # a moment late is a day late; a full day is still one
    (600 + DAY_S + 1, 2), (600 + 9 * DAY_S, 9),
])
def test_days_late_at_the_boundaries(offset, days):
    policy = LatePolicy(D, grace_s=600, penalty_per_day=0.25)
    got = policy.lateness(D + offset)
    assert got.days == days
    assert got.factor == pytest.approx(max(0.0, 1 - 0.25 * days))


def test_penalty_is_capped_and_never_negative():
    policy = LatePolicy(D, penalty_per_day=0.3, max_penalty=0.5)
    assert policy.lateness(D + 1).apply(12) == pytest.approx(12 * 0.7)
    assert policy.lateness(D + 5 * DAY_S).apply(12) == pytest.approx(6.0)
    assert LatePolicy(D, penalty_per_day=0.3).lateness(D + 10 * DAY_S).factor == 0.0


def test_parse_needs_a_time_zone_and_sane_numbers():
    p = LatePolicy.parse("2026-12-01T23:59:00Z", grace_minutes=10, penalty_percent_per_day=10)
    assert (p.deadline, p.grace_s, p.penalty_per_day) == (D, 600.0, 0.1)
    assert LatePolicy.parse("2026-12-02T00:59:00+01:00").deadline == D
    with pytest.raises(LatePolicyError, match="time zone"):
        LatePolicy.parse("2026-12-01T23:59:00")
    with pytest.raises(LatePolicyError, match="ISO 8601"):
        LatePolicy.parse("next tuesday")
    with pytest.raises(LatePolicyError, match="penalty_per_day"):
        LatePolicy(D, penalty_per_day=-0.1)
    with pytest.raises(LatePolicyError, match="at most 1"):
        LatePolicy.parse("2026-12-01T23:59:00Z", penalty_percent_per_day=150)


def _rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_canvas_and_moodle_exports_carry_the_late_total_and_neutralise_formulas():
    best = {"alice": _result("alice", D - 60, _full()),
            "bob": _result("bob", D + 2 * DAY_S - 5, dict(_full(), **{"3.1": 0.0}))}
    roster = Roster(("alice", "bob"), ("=HYPERLINK(\"http://x\")", "Bob\x1b[2J Builder"))
    late = LatePolicy(D, penalty_per_day=0.1)
    rows = grade_rows(best, EX, roster, late)
    maxp = sum(e.points for e in EX)
    assert [(r.student_id, r.late_days, r.raw_total) for r in rows] == [("alice", 0, maxp), ("bob", 2, maxp - 3)]
    assert rows[1].total == pytest.approx((maxp - 3) * 0.8)

    canvas = _rows(canvas_csv(rows, EX, "attn"))
    assert canvas[0][:6] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "attn"]
    assert canvas[1][0].strip() == "Points Possible" and float(canvas[1][5]) == maxp
    alice, bob = canvas[2], canvas[3]
    assert alice[0].startswith("'=") and alice[2] == "alice"  # a name is text, never a formula
    assert "\x1b" not in bob[0]
    assert float(bob[5]) == pytest.approx((maxp - 3) * 0.8) and float(bob[6]) == 0.0

    moodle = _rows(moodle_csv(rows, EX, "attn"))
    assert moodle[0][:4] == ["ID number", "Full name", "attn", "Days late"]
    assert moodle[2][0] == "bob" and moodle[2][3] == "2" and float(moodle[2][2]) == pytest.approx((maxp - 3) * 0.8)


def test_gradebook_with_a_late_policy(tmp_path):
    results = [_result("alice", D - 60, _full()), _result("carol", D + 3600, _full()),
               _result("=cmd", D, _full(), archive="=cmd.zip")]
    results[2].student_id = "cmd"
    write_outputs(tmp_path, results, EX, late=LatePolicy(D, penalty_per_day=0.5), assignment="attn")
    book = {r["student_id"]: r for r in csv.DictReader(open(tmp_path / "gradebook.csv"))}
    maxp = sum(e.points for e in EX)
    assert book["alice"]["days_late"] == "0" and float(book["alice"]["final"]) == maxp
    assert book["carol"]["days_late"] == "1" and float(book["carol"]["final"]) == maxp / 2
    assert book["cmd"]["archive"].startswith("'=")
    assert "1 day(s) late" in (tmp_path / "feedback" / "carol.md").read_text()
    assert "late" not in (tmp_path / "feedback" / "alice.md").read_text()
    assert (tmp_path / "exports" / "canvas.csv").exists() and (tmp_path / "exports" / "moodle.csv").exists()


def test_the_late_policy_reaches_the_notebooks_and_nbgraders_export(tmp_path):
    """A student two days late under 25 % a day keeps half of each total, the notebooks' and
    nbgrader's (grades.csv: library and ch03) as the library's; on time, all of it.  Graded again
    without the policy, nbgrader's gradebook keeps no penalty."""
    from attn_course.nbgrader_bridge import export_csv, write_gradebook

    notebook = {e.id: float(e.points) - 1 for e in EX}  # one point short on every exercise
    results = [_result("ontime", D - 60, _full()), _result("late", D + DAY_S + 1, _full())]
    for r in results:
        r.notebook_scores = dict(notebook)
    policy = LatePolicy(D, penalty_per_day=0.25)
    raw = {"library": float(sum(_full().values())), "ch03": sum(notebook.values())}
    half = 1 - 0.25 * 2  # two started days late

    write_outputs(tmp_path, results, EX, notebooks=True, late=policy)
    book = {r["student_id"]: r for r in csv.DictReader(open(tmp_path / "gradebook.csv"))}
    assert float(book["late"]["notebook final"]) == raw["ch03"] * half
    assert float(book["ontime"]["notebook final"]) == raw["ch03"]

    db = f"sqlite:///{tmp_path / 'nbgrader' / 'gradebook.db'}"
    best = {r.student_id: r for r in results}
    for policy_now, factor in ((policy, half), (None, 1.0)):
        write_gradebook(db, best, EX, notebooks=True, late=policy_now)
        rows = list(csv.DictReader(open(export_csv(db, tmp_path).path)))
        got = {(row["assignment"], row["student_id"]): row for row in rows}
        for assignment, total in raw.items():
            late, ontime = got[(assignment, "late")], got[(assignment, "ontime")]
            assert float(late["raw_score"]) == total and float(late["score"]) == total * factor, late
            assert float(ontime["score"]) == total, ontime
            assert bool(late["timestamp"]) == (policy_now is not None)
            assert bool(late["duedate"]) == (policy_now is not None)


def test_the_gradebook_lists_the_whole_roster_with_blanks_for_who_sent_nothing(tmp_path):
    """A roster student with no accepted archive is a row of the gradebook, in order, its scores
    blank (not 0: nothing was graded); the exports and feedback hold only graded students."""
    roster = Roster(("alice", "bob", "=carol"), ("", "", ""))
    results = [_result("bob", D - 60, dict(_full(), **{"3.1": 0.0}))]
    late = LatePolicy(D, penalty_per_day=0.5)
    write_outputs(tmp_path, results, EX, roster=roster, late=late, notebooks=True, assignment="attn")
    rows = _rows((tmp_path / "gradebook.csv").read_text())
    head, body = rows[0], rows[1:]
    assert [r[0] for r in body] == ["'=carol", "alice", "bob"]  # sorted on the ids, a formula neutralised
    assert all(len(r) == len(head) for r in body)
    book = {r[0]: dict(zip(head, r)) for r in body}
    maxp = sum(e.points for e in EX)
    assert float(book["bob"]["total"]) == maxp - EX[0].points and book["bob"]["archive"] == "bob.zip"
    for sid in ("alice", "'=carol"):
        blank = {k: v for k, v in book[sid].items() if k not in ("student_id", "max")}
        assert set(blank.values()) == {""}, blank
        assert float(book[sid]["max"]) == maxp
    assert [r[0] for r in _rows((tmp_path / "exports" / "moodle.csv").read_text())[1:]] == ["bob"]
    assert sorted(p.name for p in (tmp_path / "feedback").glob("*.md")) == ["bob.md"]
    assert "alice" in (tmp_path / "report.md").read_text()


FORMULA_AFTER_SEPARATORS = "x;=cmd|' /C calc'!A0;=2+3, @SUM(1);+1;﹦2; -3"


def _formula_cells(text: str) -> list[str]:
    """The cells of ``text`` that start a formula, read as a spreadsheet that splits on ``;`` reads it
    (Excel where the comma is the decimal mark; LibreOffice with "Semicolon" ticked), or on ``,``
    with the writer's quotes honoured."""
    found = []
    for delimiter in (";", ","):
        for row in csv.reader(io.StringIO(text), delimiter=delimiter):
            found += [c for c in row if c.lstrip()[:1] in tuple("=+-@﹦＝")]
    return found


def test_no_cell_starts_a_formula_where_a_spreadsheet_splits_on_semicolons(tmp_path):
    """A name (the roster's, from the platform, which the student may set) or an archive's name (a
    platform's bulk download keeps the uploaded file's) holding ``;=cmd``: the CSV writer quotes only
    commas, quotes and line ends, and a spreadsheet splitting on ``;`` made ``=cmd`` a cell of its own
    (red team, round 17).  Every part after a separator is neutralised, as the cell's start is."""
    r = _result("s1", D, _full(), archive=f"smith_1234_{FORMULA_AFTER_SEPARATORS}.zip")
    write_outputs(tmp_path, [r], EX, roster=Roster(("s1",), (FORMULA_AFTER_SEPARATORS,)), assignment="attn")
    for f in ("gradebook.csv", "exports/canvas.csv", "exports/moodle.csv"):
        text = (tmp_path / f).read_text()
        assert "=cmd" in text and "SUM" in text, f  # (what was written is there, as text)
        assert _formula_cells(text) == [], (f, _formula_cells(text))


def test_a_counted_archive_that_came_late_though_an_earlier_was_on_time_is_listed_for_review(tmp_path):
    """The archive made last counts; one she sealed after her final one and never handed in, handed in
    late by a classmate who had the file, counts so too, and makes her late (red team, round 17).  The
    grader cannot tell that from a late improvement she handed in herself: the report lists it."""
    def sealed(sid, archive, received, at, scores):
        r = _result(sid, received, scores, archive=archive)
        r.submission, r.sealed_at = f"{archive}-manifest", at
        return r
    results = [sealed("vera", "vera_111_final.zip", D - 3600, D - 4 * 3600, _full()),
               sealed("vera", "mallory_222_vera-draft.zip", D + 3 * DAY_S, D - 3 * 3600, {e.id: 0.0 for e in EX}),
               sealed("walt", "walt_late.zip", D + DAY_S, D + DAY_S - 60, _full()),  # late, and only late
               sealed("xena", "xena_1.zip", D - 7200, D - 7300, _full()), sealed("xena", "xena_2.zip", D - 60, D - 120, _full())]
    write_outputs(tmp_path, results, EX, late=LatePolicy(D, penalty_per_day=0.2), assignment="attn")
    report = (tmp_path / "report.md").read_text()
    section = report.split("## Counted late though an earlier archive was on time", 1)[1].split("\n## ", 1)[0]
    assert "vera" in section and md_inline("mallory_222_vera-draft.zip", 120) in section, section
    assert "3 day(s) late" in section and md_inline("vera_111_final.zip", 120) in section, section
    assert "walt" not in section and "xena" not in section
    write_outputs(tmp_path / "no-policy", results, EX, assignment="attn")
    assert "Counted late" not in (tmp_path / "no-policy" / "report.md").read_text()
