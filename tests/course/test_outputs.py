"""The grading folder's generated files (attn_course.outputs): what the instructor made is never
replaced; what the grader wrote (or was about to, in a run that stopped) is its own to write again."""

from __future__ import annotations

import json

from attn_course.outputs import JOURNAL, LEDGER, Outputs


def _run(out, files: dict[str, str]) -> list[str]:
    outputs = Outputs(out)
    for rel, text in files.items():
        outputs.write(out / rel, text)
    outputs.close()
    return outputs.kept


def test_a_file_the_instructor_wrote_where_the_grader_had_not_is_kept(tmp_path):
    """Red team: feedback/bob.md, written by hand for a student who had sent nothing, was replaced
    by bob's feedback when his archive came (a path with no record was taken as the grader's)."""
    out = tmp_path / "grading"
    assert _run(out, {"feedback/alice.md": "alice v1"}) == []
    (out / "feedback" / "bob.md").write_text("extension granted -- the instructor")
    (out / "feedback" / "alice.md").write_text("alice, edited")
    assert sorted(_run(out, {"feedback/alice.md": "alice v2", "feedback/bob.md": "bob v1"})) == \
        ["feedback/alice.md", "feedback/bob.md"]
    assert (out / "feedback" / "bob.md").read_text() == "extension granted -- the instructor"
    assert (out / "feedback" / "bob.md.new").read_text() == "bob v1"
    assert (out / "feedback" / "alice.md").read_text() == "alice, edited"
    assert (out / "feedback" / "alice.md.new").read_text() == "alice v2"
    # still the instructor's on the next run; the grader's own files are its own to write again
    assert _run(out, {"feedback/alice.md": "alice v2", "feedback/carol.md": "carol"}) == ["feedback/alice.md"]
    assert _run(out, {"feedback/carol.md": "carol v2"}) == [] and (out / "feedback" / "carol.md").read_text() == "carol v2"


def test_a_run_stopped_before_its_ledger_leaves_no_file_taken_for_the_instructors(tmp_path):
    """The journal says what a run is about to write: a run that stopped half-way (its ledger not
    written) leaves files the next run still knows as the grader's, old version or new."""
    out = tmp_path / "grading"
    _run(out, {"a.md": "a1", "b.md": "b1"})
    stopped = Outputs(out)
    stopped.write(out / "a.md", "a2")  # written; b.md not yet: the run stops here, no close()
    assert (out / JOURNAL).exists() and json.loads((out / LEDGER).read_text())["a.md"] != []
    assert _run(out, {"a.md": "a3", "b.md": "b3"}) == []
    assert (out / "a.md").read_text() == "a3" and (out / "b.md").read_text() == "b3"
    assert not (out / JOURNAL).exists()


def test_a_folder_graded_before_the_ledger_is_written_as_before(tmp_path):
    out = tmp_path / "grading"
    out.mkdir()
    (out / "report.md").write_text("from an old version of the grader")
    assert _run(out, {"report.md": "new"}) == [] and (out / "report.md").read_text() == "new"


def test_a_new_file_the_instructor_merged_into_is_kept_too(tmp_path):
    """The run says "this run's version is report.md.new"; the instructor merges there.  The next
    run overwrote that ``.new`` without a word (red team, round 17): kept now, this run's version
    beside it, and the run says which file it kept.  A ``.new`` the grader wrote is its own to replace."""
    out = tmp_path
    _run(out, {"report.md": "v1\n"})
    (out / "report.md").write_text("v1 + notes\n")
    assert _run(out, {"report.md": "v2\n"}) == ["report.md"]
    assert (out / "report.md.new").read_text() == "v2\n"
    assert _run(out, {"report.md": "v3\n"}) == ["report.md"]  # (its own .new: replaced)
    assert (out / "report.md.new").read_text() == "v3\n"
    (out / "report.md.new").write_text("v3 + merged notes\n")
    assert _run(out, {"report.md": "v4\n"}) == ["report.md.new"]  # (beside it is this run's version)
    assert (out / "report.md.new").read_text() == "v3 + merged notes\n"
    assert (out / "report.md.new.new").read_text() == "v4\n"
    assert _run(out, {"report.md": "v5\n"}) == ["report.md.new"]
    assert [(out / n).read_text() for n in ("report.md", "report.md.new", "report.md.new.new")] == [
        "v1 + notes\n", "v3 + merged notes\n", "v5\n"]


def test_a_new_file_of_a_folder_graded_before_it_was_recorded_is_kept(tmp_path):
    """A ``.new`` the ledger has no record of (written by a grader that did not record them, or by
    the instructor) is not the grader's to replace."""
    out = tmp_path
    _run(out, {"report.md": "v1\n"})
    (out / "report.md").write_text("v1 + notes\n")
    (out / "report.md.new").write_text("merged by hand\n")
    assert _run(out, {"report.md": "v2\n"}) == ["report.md.new"]
    assert (out / "report.md.new").read_text() == "merged by hand\n"
    assert (out / "report.md.new.new").read_text() == "v2\n"


def test_a_grading_folder_with_new_files_beside_new_files_is_still_the_graders():
    from attn_course.grade import GRADING_NAMES
    from attn_course.outputs import is_beside_name

    assert is_beside_name("gradebook.csv.new", GRADING_NAMES) and is_beside_name("gradebook.csv.new.new", GRADING_NAMES)
    assert not is_beside_name("gradebook.csv", GRADING_NAMES) and not is_beside_name("notes.new", GRADING_NAMES)
    assert not is_beside_name(".new", GRADING_NAMES)
