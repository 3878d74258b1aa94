"""The similarity report: a renamed copy is found, independent work and the stub are not, output escaped."""

from __future__ import annotations

import subprocess
import sys

from attn_course import RELEASE_LIBRARY
from attn_course.archive import build_archive, library_files
from attn_course.results import ArchiveResult
from attn_course.similarity import student_code, write_similarity

STUB = library_files(RELEASE_LIBRARY)
MODULE = "attn_tensors/statmech.py"
RAISE = "    raise NotImplementedError('Exercise 3.1:"

ORIGINAL = """    note = "</pre><script>alert('x')</script>"
    if mask is not None:
        S = xp.where(mask, S, -xp.inf)
    peak = xp.max(S / T, axis=-1, keepdims=True)
    total = xp.sum(xp.exp(S / T - peak), axis=-1)
    shifted = xp.log(total)
    return shifted + peak[..., 0]
"""
RENAMED = """    remark = "my own work"
    if mask is not None:
        S = xp.where(mask, S, -xp.inf)
    biggest = xp.max(S / T, axis=-1, keepdims=True)
    acc = xp.sum(xp.exp(S / T - biggest), axis=-1)
    res = xp.log(acc)
    return res + biggest[..., 0]
"""
OTHER = """    import numpy as np
    values = np.asarray(S, dtype=float) / float(T)
    if mask is not None:
        values = np.where(np.asarray(mask), values, -np.inf)
    out = []
    for row in values.reshape(-1, values.shape[-1]):
        top = row.max()
        out.append(top + np.log(np.exp(row - top).sum()))
    return xp.asarray(np.array(out).reshape(values.shape[:-1]))
"""


def _with_31(body: str) -> dict[str, bytes]:
    files = dict(STUB)
    lines = files[MODULE].decode().splitlines(keepends=True)
    (k,) = [i for i, line in enumerate(lines) if line.startswith(RAISE)]
    lines[k] = body
    files[MODULE] = "".join(lines).encode()
    return files


def _class(tmp_path):
    subs = tmp_path / "submitted"
    subs.mkdir()
    who = {"ada": ORIGINAL, "bea": RENAMED, "cy": OTHER, "dee": None}
    results = []
    for sid, body in who.items():
        build_archive(subs / f"{sid}.zip", sid, _with_31(body) if body else STUB)
        results.append(ArchiveResult(f"{sid}.zip", "", "fp", ["3.1"], received=1.0, student_id=sid, identity="ok"))
    return subs, results


def test_student_code_is_what_differs_from_the_stub():
    code = student_code(_with_31(ORIGINAL)[MODULE].decode(), STUB[MODULE].decode())
    assert code.strip() == ORIGINAL.strip()
    assert student_code(STUB[MODULE].decode(), STUB[MODULE].decode()) == ""


def test_renamed_copy_is_found_and_independent_work_is_not(tmp_path):
    subs, results = _class(tmp_path)
    out = tmp_path / "grading"
    rep = write_similarity(out, subs, results, threshold=0.6)
    pairs = {(p.a, p.b, p.module) for p in rep.pairs}
    assert pairs == {("ada", "bea", MODULE)}, rep.pairs
    (p,) = rep.pairs
    assert p.similarity >= 0.6 and p.slices_a and p.slices_b
    md = (out / "similarity" / "report.md").read_text()
    assert "| ada | bea |" in md.replace("\\", "")
    page = (out / "similarity" / "index.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page and "<mark>" in page
    # everyone's identical stub never makes a pair: a class of untouched stubs has none
    rep = write_similarity(tmp_path / "g2", subs, [r for r in results if r.student_id == "dee"])
    assert rep.pairs == []


def test_cli(tmp_path):
    subs, results = _class(tmp_path)
    out = tmp_path / "grading"
    import json
    from dataclasses import asdict

    from attn_course.results import atomic_write, result_name
    from pathlib import Path

    for r in results:
        atomic_write(out / "results" / result_name(Path(r.archive)), json.dumps(asdict(r)))
    r = subprocess.run([sys.executable, "-m", "attn_course.cli", "similarity", str(subs), "--out", str(out),
                        "--threshold", "0.5"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "1 pairs at or above 50% among 4 students" in r.stdout, r.stdout
    # another class's folder: refused, the report kept (it was replaced by one of 0 pairs among 0)
    report = (out / "similarity" / "report.md").read_bytes()
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.zip").write_bytes((subs / sorted(p.name for p in subs.iterdir())[0]).read_bytes())
    r = subprocess.run([sys.executable, "-m", "attn_course.cli", "similarity", str(other), "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "none of the archives in" in r.stderr, r.stderr[-2000:]
    assert (out / "similarity" / "report.md").read_bytes() == report


def test_a_copy_moved_to_another_module_or_a_new_file_is_found(tmp_path):
    """What runs is compared, wherever it is: the copy in a file the release does not have (imported
    from statmech.py) or in another module is found under the whole library; a pair already listed
    for a module is not listed again."""
    from attn_course.similarity import WHOLE

    subs = tmp_path / "submitted"
    subs.mkdir()
    imported = _with_31("    from attn_tensors._mine import lpf\n    return lpf(S, mask, T, xp)\n")
    other = "attn_tensors/attention.py"
    moved = dict(imported, **{"attn_tensors/_mine.py": ("def lpf(S, mask, T, xp):\n" + RENAMED).encode()})
    elsewhere = dict(imported, **{other: STUB[other] + ("\n\ndef lpf(S, mask, T, xp):\n" + RENAMED).encode()})
    elsewhere = {k: v.replace(b"attn_tensors._mine", b"attn_tensors.attention") for k, v in elsewhere.items()}
    who = {"ada": _with_31(ORIGINAL), "bea": _with_31(RENAMED), "cy": _with_31(OTHER), "eve": moved, "fay": elsewhere}
    results = []
    for sid, files in who.items():
        build_archive(subs / f"{sid}.zip", sid, files)
        results.append(ArchiveResult(f"{sid}.zip", "", "fp", ["3.1"], received=1.0, student_id=sid, identity="ok"))
    rep = write_similarity(tmp_path / "grading", subs, results, threshold=0.6)
    pairs = {(p.a, p.b, p.module) for p in rep.pairs}
    assert ("ada", "bea", MODULE) in pairs and ("ada", "bea", WHOLE) not in pairs, pairs
    for a, b in (("ada", "eve"), ("ada", "fay"), ("bea", "eve"), ("bea", "fay")):
        assert (a, b, WHOLE) in pairs, (a, b, pairs)
    # the view's highlights are where the copy is: the whole's code starts with code (a module with none
    # of the student's own was a leading line end, which the lexer dropped: every highlight came early)
    for p in rep.pairs:
        for who, slices in ((p.a, p.slices_a), (p.b, p.slices_b)):
            code = rep.code[(who, p.module)]
            assert slices and not code.startswith("\n"), (who, p.module, code[:40])
            for start, end in slices:
                assert code[start:end].strip() and not code[start:end].startswith("\n"), (who, p.module, code[start:end][:40])
    assert not any("cy" in (p.a, p.b) for p in rep.pairs), pairs
    assert rep.modules == len(STUB)


def _notebook(answer_31: str) -> bytes:
    """The release's chapter-3 notebook with ``answer_31`` as exercise 3.1's answer cell."""
    import json

    from attn_course import EXERCISES

    nb = json.loads((EXERCISES / "ch03" / "ch03.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "ex-3-1-answer"]
    cell["source"] = answer_31
    return json.dumps(nb).encode()


def test_copied_notebook_answers_are_found(tmp_path):
    """Two students whose library is the stub and whose notebooks answer 3.1 with a renamed copy
    make a pair under the notebook's answer cells; independent work, and a notebook left as
    released, do not; a notebook that is not JSON is named among the archives not compared."""
    from attn_course.similarity import ANSWERS

    from attn_course import EXERCISES

    subs = tmp_path / "submitted"
    subs.mkdir()
    head = "def log_partition_function(S, mask=None, T=1.0):\n    xp = namespace(S)\n"
    who = {"ada": _notebook(head + ORIGINAL), "bea": _notebook(head + RENAMED), "cy": _notebook(head + OTHER),
           "dee": (EXERCISES / "ch03" / "ch03.ipynb").read_bytes(), "eve": b"{not json"}
    results = []
    for sid, nb in who.items():
        build_archive(subs / f"{sid}.zip", sid, dict(STUB, **{"notebooks/ch03.ipynb": nb}))
        results.append(ArchiveResult(f"{sid}.zip", "", "fp", ["3.1"], received=1.0, student_id=sid, identity="ok"))
    rep = write_similarity(tmp_path / "grading", subs, results, threshold=0.6)
    assert {(p.a, p.b, p.module) for p in rep.pairs} == {("ada", "bea", f"notebooks/ch03.ipynb{ANSWERS}")}, rep.pairs
    assert any("eve.zip" in s and "not a readable notebook" in s for s in rep.skipped), rep.skipped


def test_padding_hides_no_copy_and_code_past_the_caps_is_listed(tmp_path):
    """Red team, round 7: a word-for-word copy behind one comment line of 25 k characters, or 6,000
    blank lines, at the top of the module made no pair (the caps counted them: nothing after them was
    compared).  Comments and blank lines are not code; code past the caps (a copy behind 2,500 lines of
    code of another kind) is listed as not compared in full, in the report and its HTML view."""
    from attn_course.similarity import Cut

    subs = tmp_path / "submitted"
    subs.mkdir()
    copy = _with_31(ORIGINAL)

    def padded(pad: str) -> dict[str, bytes]:
        return dict(copy, **{MODULE: pad.encode() + copy[MODULE]})

    who = {"ada": copy, "bea": padded("# notes " * 3_200 + "\n"), "cy": padded("\n" * 6_000),
           "dee": _with_31(OTHER), "eve": padded("".join(f"x_{k} = {k}\n" for k in range(2_500)))}
    results = []
    for sid, files in who.items():
        build_archive(subs / f"{sid}.zip", sid, files)
        results.append(ArchiveResult(f"{sid}.zip", "", "fp", ["3.1"], received=1.0, student_id=sid, identity="ok"))
    out = tmp_path / "grading"
    rep = write_similarity(out, subs, results, threshold=0.6)
    pairs = {(p.a, p.b) for p in rep.pairs if p.module == MODULE}
    assert {("ada", "bea"), ("ada", "cy"), ("bea", "cy")} <= pairs, rep.pairs
    assert not any("dee" in pair or "eve" in pair for pair in pairs), pairs
    assert rep.cut == [Cut("eve", MODULE)], rep.cut
    md = (out / "similarity" / "report.md").read_text()
    assert "## Code not compared in full" in md and f"* eve: {MODULE}" in md.replace("\\", ""), md[-800:]
    page = (out / "similarity" / "index.html").read_text()
    assert "Code not compared in full" in page and f"<li>eve: {MODULE}</li>" in page


def test_an_archive_of_many_files_is_read_up_to_its_budget(tmp_path, monkeypatch):
    """Red team, round 12: the cap was a file's (MAX_SOURCE), and an archive of 78 extra modules of
    200 k characters each held the class's comparison 80 s.  An archive's files are read up to
    MAX_ARCHIVE_SOURCE past their stubs, all together; the files past it are listed as cut."""
    from attn_course import similarity
    from attn_course.similarity import MAX_ARCHIVE_SOURCE, MAX_SOURCE, WHOLE, Cut, class_codes

    subs = tmp_path / "submitted"
    subs.mkdir()
    module = "".join(f"v{k} = {k} * {k}\n" for k in range(20_000))[:MAX_SOURCE]
    extra = {f"attn_tensors/extra_{k:02d}.py": module.encode() for k in range(10)}
    build_archive(subs / "ada.zip", "ada", {**_with_31(ORIGINAL), **extra})
    build_archive(subs / "bea.zip", "bea", _with_31(ORIGINAL))
    results = [ArchiveResult(f"{sid}.zip", "", "fp", ["3.1"], received=1.0, student_id=sid, identity="ok")
               for sid in ("ada", "bea")]
    read: list[int] = []
    real = similarity.code_lines

    def counted(text: str) -> list[str]:
        read.append(len(text))
        return real(text)

    monkeypatch.setattr(similarity, "code_lines", counted)
    found = class_codes(subs, results)
    stubs = sum(len(v) for v in library_files(RELEASE_LIBRARY).values())
    assert sum(read) <= 2 * stubs + MAX_ARCHIVE_SOURCE + MAX_SOURCE, (sum(read), stubs)
    unread = {c.module for c in found.cut if c.student == "ada"}
    assert len(unread & set(extra)) >= len(extra) - MAX_ARCHIVE_SOURCE // MAX_SOURCE, found.cut
    assert Cut("ada", WHOLE) in found.cut and not any(c.student == "bea" for c in found.cut)


def test_what_python_ignores_hides_no_copy(tmp_path):
    """Red team (ninth session, round 9): a comment holding ``\\x1c`` or ``\\u2028`` (a line end to
    ``str.splitlines``, not to Python) then ``\\\"\"\"``, or a string constant closed on a line that
    starts with ``#``, opened a string to the comparison's lexer that swallowed the module: no pair,
    nothing listed; ``;`` after each statement or a ``pass`` before it broke every k-gram; reordered
    functions left docstrings' pieces read as code.  Each is read as Python reads it now."""
    subs = tmp_path / "submitted"
    subs.mkdir()
    copy = _with_31(ORIGINAL)[MODULE].decode()
    head, rest = copy.split("from __future__ import annotations\n", 1)
    head += "from __future__ import annotations"

    def lines_of(body: str, edit) -> str:
        return copy.replace(ORIGINAL, "".join(edit(line) + "\n" for line in body.splitlines()))

    variants = {
        "opener": head + '\n_QUOTE = """\\"""\n#"""\n' + rest,
        "fs": head + '\n# TODO: escape\x1c quotes """ in docstrings as \\"""\n' + rest,
        "ls": head + '\n# TODO: escape\u2028 quotes """ in docstrings as \\"""\n' + rest,
        "semicolons": lines_of(ORIGINAL, lambda line: line if line.rstrip().endswith(":") else line + ";"),
        "passes": lines_of(ORIGINAL, lambda line: line[: len(line) - len(line.lstrip())] + "pass\n" + line),
    }
    who = {"ada": copy, **variants, "dee": _with_31(OTHER)[MODULE].decode()}
    results = []
    for sid, text in who.items():
        compile(text, MODULE, "exec")  # (each runs as the copy does)
        build_archive(subs / f"{sid}.zip", sid, dict(STUB, **{MODULE: text.encode()}))
        results.append(ArchiveResult(f"{sid}.zip", "", "fp", ["3.1"], received=1.0, student_id=sid, identity="ok"))
    rep = write_similarity(tmp_path / "grading", subs, results, threshold=0.6)
    paired = {p.b for p in rep.pairs if p.a == "ada" and p.module == MODULE}
    assert paired == set(variants), rep.pairs
    assert rep.cut == []


def test_only_statements_that_do_nothing_are_left_out():
    """A string alone, ``pass`` and ``...`` do nothing; a name that reads like the strings' marker is code."""
    from attn_course.similarity import code_lines

    assert code_lines('S\n"doc"\n"a" "b"\npass\n...\nx = 1; ...\ny = "s"\n') == ["S", "x = 1", 'y = "s"']


def test_one_archive_of_many_cut_files_does_not_push_the_others_out_of_the_cut_list():
    """Two hundred one-line files, each cut once one archive's reading budget is spent, were two hundred
    entries of the list, and a classmate's padded module (the only lead to a copy hidden past the cap)
    went unnamed (red team, round 17): a line per student now, in the report and the HTML view."""
    from attn_course.similarity import CUT_MODULES_SHOWN, MAX_SHOWN, Cut, SimilarityReport, report_html, report_markdown

    cut = [Cut("aaron", f"attn_tensors/pad{k:03d}.py") for k in range(MAX_SHOWN + 50)] + [Cut("zoe", MODULE)]
    rep = SimilarityReport(students=2, modules=1, threshold=0.6, cut=cut)
    md, page = report_markdown(rep), report_html(rep)
    for text in (md, page):
        assert "zoe" in text and "statmech" in text, text[-500:]
        assert text.count("pad0") == CUT_MODULES_SHOWN and f"and {MAX_SHOWN + 50 - CUT_MODULES_SHOWN} more" in text
