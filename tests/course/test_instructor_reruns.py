"""A grading folder over several runs: what a rerun must not undo by accident.

From a tester's findings: a rerun that added ``--roster`` (or dropped
``--trust-manifest-ids``) kept a forged archive's marks, because finished
results were "already graded" whatever rule their identity was checked under;
a rerun without ``--deadline`` (a resume) silently dropped the late penalties;
a receipt time the instructor corrected never counted; an empty submissions
folder emptied the gradebook and the exports; and two graders on one folder
both graded everything, the last to end writing the gradebook.
"""

from __future__ import annotations

import csv
import fcntl
import os
import stat
from pathlib import Path

import pytest

from attn_course import ROOT, cli
from attn_course.archive import build_archive, library_files
from attn_course.identity import token_for

pytestmark = pytest.mark.slow

SECRET = "reruns-secret"
DEADLINE = 1_700_000_000  # 2023-11-14T22:13:20Z


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)


def _grade(subs: Path, out: Path, capsys, *options: str) -> tuple[int, str, str]:
    rc = cli.main(["grade", str(subs), "--out", str(out), "--exercises", "3.5", "--jobs", "1", *options])
    got = capsys.readouterr()
    return rc, got.out, got.err


def _rows(out: Path) -> dict[str, dict]:
    return {row["student_id"]: row for row in csv.DictReader(open(out / "gradebook.csv"))}


def _class(subs: Path) -> None:
    subs.mkdir()
    ref = library_files(ROOT)
    build_archive(subs / "s1.zip", "s1", ref, token=token_for("s1", SECRET))
    build_archive(subs / "forged.zip", "s2", ref, token=token_for("s1", SECRET))  # s1's token on s2's claim
    for name in ("s1.zip", "forged.zip"):
        os.utime(subs / name, (DEADLINE + 3 * 86400, DEADLINE + 3 * 86400))  # three days late


def test_a_stricter_identity_rule_is_applied_to_finished_archives(env, tmp_path, capsys):
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    _class(subs)
    rc, _, err = _grade(subs, out, capsys, "--trust-manifest-ids")
    assert rc == 0, err
    assert set(_rows(out)) == {"s1", "s2"}
    rc, stdout, err = _grade(subs, out, capsys)
    assert rc == 0, err
    assert "0 already graded, 2 to grade" in stdout
    assert set(_rows(out)) == {"s1"}  # the forged claim is rejected now


def test_the_late_policy_and_corrected_receipt_times_hold_on_a_rerun(env, tmp_path, capsys):
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    _class(subs)
    deadline = ["--deadline", "2023-11-14T22:13:20+00:00", "--late-penalty", "10"]
    rc, _, err = _grade(subs, out, capsys, *deadline)
    assert rc == 0, err
    first = _rows(out)["s1"]
    assert first["days_late"] == "3" and float(first["final"]) < float(first["total"])
    rc, stdout, err = _grade(subs, out, capsys)  # a resume without the options
    assert rc == 0, err
    assert "the late policy saved in" in stdout
    assert _rows(out)["s1"] == first
    os.utime(subs / "s1.zip", (DEADLINE - 60, DEADLINE - 60))  # an extension: the instructor corrects it
    rc, stdout, err = _grade(subs, out, capsys)
    assert rc == 0, err
    assert "s1.zip: its receipt time changed" in stdout
    row = _rows(out)["s1"]
    assert row["days_late"] == "0" and row["final"] == row["total"]


def test_an_empty_submissions_folder_leaves_the_grading_as_it_was(env, tmp_path, capsys):
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    _class(subs)
    rc, _, err = _grade(subs, out, capsys)
    assert rc == 0, err
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = _grade(empty, out, capsys)  # a wrong path
    assert rc == 2 and "no archives (*.zip) in" in err and "Traceback" not in err, err
    rc, _, err = _grade(out, out, capsys)  # the grading folder itself
    assert rc == 2 and "is inside the submissions folder" in err, err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    rc, _, err = _grade(subs, subs / "g.zip", capsys)  # a grading folder inside the submissions
    assert rc == 2 and "is inside the submissions folder" in err and not (subs / "g.zip").exists(), err


def test_a_second_grader_on_the_same_folder_is_refused(env, tmp_path, capsys):
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    _class(subs)
    rc, _, err = _grade(subs, out, capsys)
    assert rc == 0, err
    before = (out / "gradebook.csv").read_bytes()
    with open(out / "run.lock", "r+") as held:  # another grader, running
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242")
        held.flush()
        rc, _, err = _grade(subs, out, capsys, "--regrade")
    assert rc == 2 and "another attn-course grade is grading into" in err and "pid 4242" in err, err
    assert (out / "gradebook.csv").read_bytes() == before
    rc, _, err = _grade(subs, out, capsys, "--regrade")  # and once it has ended
    assert rc == 0, err


def test_outputs_the_instructor_edited_are_kept(env, tmp_path, capsys):
    """A comment added to a student's feedback, a corrected gradebook: a rerun restored the
    generated files silently.  Kept now; a run whose version differs writes it beside them."""
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    _class(subs)
    # a student whose id is what a naive name beside s1's feedback would be (s1.new.md)
    build_archive(subs / "s1new.zip", "s1.new", library_files(ROOT), token=token_for("s1.new", SECRET))
    rc, _, err = _grade(subs, out, capsys)
    assert rc == 0, err
    theirs = (out / "feedback" / "s1.new.md").read_text()
    edited = {"feedback/s1.md": "Well done. -- the instructor\n", "gradebook.csv": "student_id,total\ns1,99\n"}
    for rel, text in edited.items():
        (out / rel).write_text(text)
    rc, stdout, err = _grade(subs, out, capsys)  # nothing new to show: the edits stay, nothing beside
    assert rc == 0, err
    assert {rel: (out / rel).read_text() for rel in edited} == edited
    assert not list(out.rglob("*.new")) and "kept" not in stdout
    rc, stdout, err = _grade(subs, out, capsys, "--deadline", "2023-11-14T22:13:20+00:00", "--late-penalty", "10")
    assert rc == 0, err  # (the folder, with its .new files, is still the grader's)
    assert {rel: (out / rel).read_text() for rel in edited} == edited
    assert "days_late" in (out / "gradebook.csv.new").read_text()
    assert "late" in (out / "feedback" / "s1.md.new").read_text()
    assert "kept gradebook.csv, edited since it was written; this run's version is gradebook.csv.new" in stdout
    assert "report.md" not in stdout  # what nobody edited is written as before
    assert "days_late" not in theirs and "late" in (out / "feedback" / "s1.new.md").read_text()  # their own
    rc, _, err = _grade(subs, out, capsys)
    assert rc == 0, err


@pytest.mark.parametrize("url, words", [
    ("garbage", "is not a database URL"),
    ("postgresql+nosuchdriver://u@h/db", "no driver for"),
    ("sqlite:///:memory:", "a database in memory"),
    ("sqlite://", "a database in memory"),
    ("FILE", "is a file that is not an SQLite database"),
])
def test_a_bad_nbgrader_database_is_refused_before_grading(env, tmp_path, capsys, url, words):
    """It was found after the whole batch was graded, or never (in memory: the scores thrown away)."""
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    _class(subs)
    precious = tmp_path / "precious.csv"
    precious.write_text("a,b\n1,2\n")
    url = url.replace("FILE", f"sqlite:///{precious}")
    rc, stdout, err = _grade(subs, out, capsys, "--nbgrader", url)
    assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and precious.read_text() == "a,b\n1,2\n"


def test_odd_entries_of_the_submissions_folder_are_named(env, tmp_path, capsys):
    """UPPER.ZIP was skipped silently, as was every other file; a receipt time in the future
    (a wrong clock) was taken without a word."""
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    _class(subs)
    (subs / "s1.zip").rename(subs / "S1-UPPER.ZIP")
    (subs / "notes.txt").write_text("not an archive\n")
    os.utime(subs / "forged.zip", (4_000_000_000, 4_000_000_000))  # 2096
    rc, stdout, err = _grade(subs, out, capsys)
    assert rc == 0, err
    assert "1 entries of" in stdout and "(e.g. notes.txt)" in stdout
    assert "received in the future" in stdout and "forged.zip" in stdout
    assert set(_rows(out)) == {"s1"}  # the upper-case archive was graded


def test_the_nbgrader_export_and_the_similarity_report_the_instructor_edited_are_kept(env, tmp_path, capsys):
    """grades.csv (nbgrader's export) and the similarity report were written in place: an edited
    one was lost at the next run.  They are kept now, as the grading folder's other files; a new
    gradebook outside the grading folder is its owner's only, and no password reaches the terminal."""
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    _class(subs)
    db = tmp_path / "elsewhere" / "gradebook.db"
    rc, stdout, err = _grade(subs, out, capsys, "--nbgrader", f"sqlite:///{db}")
    assert rc == 0, err
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    edited = "student_id,score\ns1,99\n"
    (out / "grades.csv").write_text(edited)
    rc, stdout, err = _grade(subs, out, capsys, "--nbgrader", f"sqlite:///{db}")  # nothing new: kept, silent
    assert rc == 0, err
    assert (out / "grades.csv").read_text() == edited and not (out / "grades.csv.new").exists()
    rc, stdout, err = _grade(subs, out, capsys, "--nbgrader", f"sqlite:///{db}",
                             "--deadline", "2023-11-14T22:13:20+00:00", "--late-penalty", "10")
    assert rc == 0, err
    assert (out / "grades.csv").read_text() == edited
    assert "kept grades.csv, edited since it was written; this run's version is grades.csv.new" in stdout
    assert "s1" in (out / "grades.csv.new").read_text()

    assert cli.main(["similarity", str(subs), "--out", str(out)]) == 0, capsys.readouterr().err
    report = out / "similarity" / "report.md"
    note = report.read_text() + "\nReviewed: no case to answer. -- the instructor\n"
    report.write_text(note)
    capsys.readouterr()
    assert cli.main(["similarity", str(subs), "--out", str(out), "--threshold", "0.99"]) == 0
    stdout = capsys.readouterr().out
    assert report.read_text() == note
    assert "99%" in (out / "similarity" / "report.md.new").read_text()
    assert "kept similarity/report.md, edited since it was written" in stdout


def test_a_database_password_is_not_shown(env, tmp_path, capsys):
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    _class(subs)
    rc, _, err = _grade(subs, out, capsys, "--nbgrader", "postgresql+nosuchdriver://user:hunter2@db.example/grades")
    assert rc == 2 and "no driver for" in err and "hunter2" not in err and "***" in err, err
