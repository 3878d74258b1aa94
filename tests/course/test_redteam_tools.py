"""Red team of the instructor's tools: similarity report, late policy, and the grade command's options.

A submission is hostile (its code can be any bytes within the archive's
limits); the instructor's options can be mistyped.  No sandbox runs here.
"""

from __future__ import annotations

import re

import pytest

from attn_course import RELEASE_LIBRARY
from attn_course.archive import library_files
from attn_course.cli import main
from attn_course.late import LatePolicy, LatePolicyError
from attn_course.similarity import MAX_CODE, compare_class, report_html, student_code

STUBS = {n: d.decode() for n, d in library_files(RELEASE_LIBRARY).items()}
MODULE = "attn_tensors/statmech.py"
BODY = """    if mask is not None:
        S = xp.where(mask, S, -xp.inf)
    peak = xp.max(S / T, axis=-1, keepdims=True)
    total = xp.sum(xp.exp(S / T - peak), axis=-1)
    return xp.log(total) + peak[..., 0]
"""


# -- similarity ------------------------------------------------------------------------------


def test_a_file_of_padding_costs_no_more_than_its_capped_code(monkeypatch):
    """400k blank lines (400 KB, well inside an archive's 2 MB per file) once took difflib ~10 s per module,
    and lines repeating the stub's commonest ones ~1 s (red team, round 7: 20 CPU-s an archive): the diff is
    given the stub's lines of code and MAX_LINES more, whatever the file holds; blank lines and comments
    are not code, and not counted."""
    import collections
    import difflib

    from attn_course import similarity
    from attn_course.similarity import code_lines, own_code

    stub = STUBS[MODULE]
    seen = []
    real = difflib.SequenceMatcher

    def matcher(junk, a, b, **kw):
        seen.append((len(a), len(b)))
        return real(junk, a, b, **kw)

    monkeypatch.setattr(similarity.difflib, "SequenceMatcher", matcher)
    n_stub = len(code_lines(stub))
    padding = "\n" * 100_000 + "    # x\n" * 10_000 + '    """\n' * 2_000  # (a string alone does nothing)
    assert len(padding) < similarity.MAX_SOURCE
    found = own_code(stub + padding + BODY, stub)
    assert found.text.strip() == BODY.strip() and not found.cut, found.text[:200]
    assert own_code(stub + "\n" * similarity.MAX_SOURCE + BODY, stub).cut  # (read up to MAX_SOURCE only)
    common = collections.Counter(code_lines(stub)).most_common(1)[0][0]
    padded = own_code(stub + (common + "\n") * 200_000, stub)
    assert padded.cut and len(padded.text) <= MAX_CODE
    assert seen[0] == (n_stub, n_stub + BODY.count("\n")) and seen[-1] == (n_stub, n_stub + similarity.MAX_LINES), seen
    # what a student wrote in an ordinary file is still found whole, and not cut
    ordinary = own_code(stub.replace("    raise NotImplementedError", BODY + "    raise NotImplementedError", 1), stub)
    assert ordinary.text.strip() == BODY.strip() and not ordinary.cut


def test_the_caps_bound_an_archive_and_leave_honest_code_whole():
    """What one archive costs the report is capped (a red team's archive of 100 KB of junk a module
    took the class's report from 7 to 68 s); the caps are at least four times what the reference
    library's own code needs, module by module and whole, so honest code is compared whole."""
    from attn_course import EXERCISES, ROOT
    from attn_course.similarity import MAX_WHOLE

    ref = library_files(ROOT)
    from attn_course.similarity import MAX_LINES, own_code

    own = {m: own_code(ref[m].decode(), stub) for m, stub in STUBS.items() if m in ref}
    assert not any(c.cut for c in own.values())
    code = {m: c.text for m, c in own.items()}
    assert 4 * max(map(len, code.values())) <= MAX_CODE and 4 * sum(map(len, code.values())) <= MAX_WHOLE
    assert 4 * max(len(c.splitlines()) for c in code.values()) <= MAX_LINES
    notebooks = len(list(EXERCISES.glob("ch*/ch*.ipynb")))  # their answer cells: one module each
    assert (len(STUBS) + notebooks) * MAX_CODE + MAX_WHOLE <= 850_000  # characters tokenised for one archive


def _marked(page: str, side: int) -> str:
    """The highlighted text of one side (0: A, 1: B) of the first pair in the HTML view."""
    pre = re.findall(r"<pre>(.*?)</pre>", page, re.S)[side]
    return "".join(re.findall(r"<mark>(.*?)</mark>", pre, re.S))


def test_invisible_characters_do_not_shift_the_highlighted_copy():
    """Zero-width characters are removed from the view; the highlight must still cover the copied code."""
    prefix = "    # " + "\u200b" * 40 + " unrelated words here and there\n    zz = 12345\n"
    rep = compare_class({"a": {MODULE: BODY}, "b": {MODULE: prefix + BODY}}, {MODULE: STUBS[MODULE]}, 0.5)
    assert [(p.a, p.b) for p in rep.pairs] == [("a", "b")]
    page = report_html(rep)
    assert "\u200b" not in page
    for side in (0, 1):
        shown = _marked(page, side)
        assert shown.lstrip().startswith("if mask is not None:"), shown[:60]
        assert "unrelated" not in shown and "zz" not in shown


def test_code_indented_with_tabs_keeps_its_shape_in_the_view():
    """A tab became one space: a block indented with tabs looked flat beside its copy."""
    tabbed = BODY.replace("        ", "\t\t").replace("    ", "\t")
    rep = compare_class({"a": {MODULE: BODY}, "b": {MODULE: tabbed}}, {MODULE: STUBS[MODULE]}, 0.5)
    assert [(p.a, p.b) for p in rep.pairs] == [("a", "b")]
    pre = re.findall(r"<pre>(.*?)</pre>", report_html(rep), re.S)[1]
    text = re.sub(r"</?mark>", "", pre)
    assert "\t" not in text
    assert "\n        S = xp.where(mask, S, -xp.inf)" in text, text[:300]  # two tabs: two indents


# -- late policy -----------------------------------------------------------------------------


@pytest.mark.parametrize("deadline", ["9999-12-31T23:59:00-14:00", "0001-01-01T00:00:00+14:00"])
def test_a_deadline_no_date_can_show_is_refused_when_parsed(deadline, monkeypatch):
    """Such a deadline once parsed, then crashed every late student's feedback (describe) after grading."""
    import time

    # UTC years 10000 and 0: outside datetime's range in UTC (the machine's zone is set, so that the
    # verdict is the same on every machine: UTC+14 could still show the second one)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        with pytest.raises(LatePolicyError, match="--deadline"):
            LatePolicy.parse(deadline)
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("kwargs, flag", [
    (dict(grace_minutes=-5), "--grace"), (dict(grace_minutes=1e308), "--grace"),
    (dict(grace_minutes=float("nan")), "--grace"), (dict(penalty_percent_per_day=-5), "--late-penalty"),
])
def test_late_option_errors_name_the_option_as_typed(kwargs, flag):
    with pytest.raises(LatePolicyError, match=re.escape(flag)):
        LatePolicy.parse("2026-12-01T23:59:00Z", **kwargs)


# -- the grade command's options -------------------------------------------------------------


@pytest.mark.parametrize("extra, flag", [
    (["--late-penalty", "10"], "--deadline"), (["--grace", "30"], "--deadline"),
    (["--budget", "0"], "--budget"), (["--budget", "nan"], "--budget"), (["--budget", "-5"], "--budget"),
])
def test_grade_refuses_options_it_would_silently_ignore_or_misuse(tmp_path, capsys, extra, flag):
    """A penalty without a deadline was dropped; a budget of 0 scored every archive 0 (budget spent)."""
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    subs.mkdir()
    rc = main(["grade", str(subs), "--out", str(out), "--ci-secret", "--no-bwrap", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and "Traceback" not in err, err
    assert not out.exists()  # refused before anything is written


def test_grade_refuses_an_out_folder_it_did_not_write_and_leaves_it_untouched(tmp_path, capsys):
    """`--out` naming a folder of the user's would have had its mode set to 0700 and its
    gradebook.csv replaced; a folder the grader wrote (or an empty one) is taken."""
    import os

    from attn_course.grade import claim_output

    subs, mine = tmp_path / "submitted", tmp_path / "mine"
    subs.mkdir()
    mine.mkdir()
    (mine / "gradebook.csv").write_text("my own marks\n")
    (mine / "notes\x1b[2J.txt").write_text("x")
    os.chmod(mine, 0o755)
    rc = main(["grade", str(subs), "--out", str(mine), "--ci-secret", "--no-bwrap"])
    err = capsys.readouterr().err
    assert rc == 2 and "did not write" in err and "notes" in err and "\x1b" not in err, err
    assert (mine / "gradebook.csv").read_text() == "my own marks\n"
    assert oct(mine.stat().st_mode & 0o777) == "0o755" and len(list(mine.iterdir())) == 2
    # a link to it is the same folder, and a file is no folder; the grader's own folder (an
    # interrupted write's temporary included) is taken
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(ValueError, match="did not write"):
        claim_output(tmp_path / "link")
    with pytest.raises(ValueError, match="not a folder"):
        claim_output(mine / "gradebook.csv")
    assert oct(mine.stat().st_mode & 0o777) == "0o755"
    ours = tmp_path / "ours"
    for d in ("results", "feedback", "exports"):
        (ours / d).mkdir(parents=True)
    (ours / "report.md").write_text("r")
    (ours / ".gradebook.csv.k2j3h4").write_text("")
    claim_output(ours)
    claim_output(tmp_path / "new" / "grading")
    assert oct(ours.stat().st_mode & 0o777) == oct((tmp_path / "new" / "grading").stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("fill", ["'", "<", "&", "\t"])
def test_the_view_of_a_pair_is_capped_as_escaped(fill):
    """Red team (ninth session, round 9): ten archives of one line of 19,986 quotes each, within every
    cap, made a 48 MB index.html (the view's cap counted characters before escaping made each six)."""
    from attn_course.similarity import SHOW_CHARS

    code = "    note = \"" + fill * 24_000 + "\"\n" + BODY
    rep = compare_class({"a": {MODULE: code}, "b": {MODULE: code}}, {MODULE: STUBS[MODULE]}, 0.5)
    assert [(p.a, p.b) for p in rep.pairs] == [("a", "b")]
    for pre in re.findall(r"<pre>(.*?)</pre>", report_html(rep), re.S):
        assert len(re.sub(r"</?mark>", "", pre)) <= SHOW_CHARS + len("[...]"), len(pre)


def test_a_group_larger_than_common_knowledge_is_named():
    """Red team (ninth session, round 9): ten copies of one solution in a class of 13 made 45 pairs,
    eleven made none (every fingerprint more than ten share is common knowledge); the group is named."""
    from attn_course.similarity import Shared, report_markdown

    other = ("    import numpy as np\n    v = np.asarray(S, dtype=float) / float(T)\n    out = []\n"
             "    for row in v.reshape(-1, v.shape[-1]):\n        out.append(row.max() + np.log(np.exp(row - row.max()).sum()))\n")
    for copies, pairs in ((9, 45), (10, 0)):
        codes = {f"s{k:02d}": {MODULE: BODY} for k in range(copies + 1)}
        codes |= {"x1": {MODULE: other + "\n    zz = 3\n"}, "x2": {MODULE: "    return S.sum(axis=-1) * 2.0 + T\n"}}
        rep = compare_class(codes, {MODULE: STUBS[MODULE]}, 0.6)
        among = [p for p in rep.pairs if p.a.startswith("s") and p.b.startswith("s")]
        assert len(among) == pairs, (copies, len(among))
        if pairs:
            assert rep.shared == []
        else:
            assert rep.shared == [Shared(MODULE, tuple(f"s{k:02d}" for k in range(copies + 1)))], rep.shared
            assert "## The same code in many archives" in report_markdown(rep)
            assert "The same code in many archives" in report_html(rep)
