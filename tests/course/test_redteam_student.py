"""A student's commands against a student's mistakes: one line that says what is wrong, never a
traceback; never an archive the grader will refuse; nothing the student's code says reaches the
terminal as raw escape sequences; nothing stored is lost without a word.
"""

from __future__ import annotations

import json
import re

import pytest

from attn_course import cli, workspace
from attn_course.check import report
from attn_course.registry import all_exercises
from attn_course.scoring import CaseResult, ExerciseResult, Status

TOKEN_A = "ABCDE-FGHIJ-KLMNO-PQRST"
TOKEN_B = "BCDEF-GHIJK-LMNOP-QRSTU"
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"


@pytest.fixture
def ws(tmp_path):
    return workspace.create(tmp_path / "ws", "s1234567")


def _one_line_error(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attn-course: "), err
    return lines[0]


# -- workspace ---------------------------------------------------------------------------


def test_workspace_on_a_file_says_so_and_keeps_the_file(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert cli.main(["workspace", str(notes), "--student", "s1"]) == 2
    assert "is a file, not a folder" in _one_line_error(capsys)
    assert notes.read_text() == "my notes\n"


def test_workspace_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("my notes\n")
    assert cli.main(["workspace", str(tmp_path / "notes.txt" / "ws"), "--student", "s1"]) == 2
    line = _one_line_error(capsys)
    assert "cannot be made a workspace" in line and "notes.txt" in line


@pytest.mark.parametrize("existing, full_at", [(False, ".ipynb"), (True, ".ipynb"), (False, "statmech.py")])
def test_a_workspace_that_fails_half_way_leaves_nothing_and_can_be_made_again(tmp_path, capsys, monkeypatch,
                                                                             existing, full_at):
    """A full disk half-way (at the first notebook, or in the library's copy, whose errors
    ``shutil.copytree`` gathers into a list) left a half-made workspace, which the next try refused
    as a folder that "already has files"; the list was printed as Python's text of it."""
    import errno
    import shutil

    dest = tmp_path / "ws"
    if existing:
        dest.mkdir()  # an empty folder the student made (or is in): it stays, empty
    real = shutil.copyfile

    def full(src, dst, *a, **k):
        if str(dst).endswith(full_at):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(workspace.shutil, "copyfile", full)
    assert cli.main(["workspace", str(dest), "--student", "s1"]) == 2
    line = _one_line_error(capsys)
    assert "No space left on device" in line and "nothing was left in it" in line
    assert "[(" not in line and "Errno" not in line, line
    if full_at == "statmech.py":  # the file that could not be written is named
        assert f"No space left on device: {dest / 'attn_tensors' / 'statmech.py'}" in line, line
    assert (dest.is_dir() and not any(dest.iterdir())) if existing else not dest.exists()
    monkeypatch.setattr(workspace.shutil, "copyfile", real)
    assert cli.main(["workspace", str(dest), "--student", "s1"]) == 0
    assert (dest / "course.json").is_file()


def test_set_token_twice_names_the_token_it_replaces(ws, capsys):
    assert cli.main(["workspace", str(ws), "--set-token", TOKEN_A]) == 0
    assert "replaces" not in capsys.readouterr().out
    assert cli.main(["workspace", str(ws), "--set-token", TOKEN_B]) == 0
    out = capsys.readouterr().out
    assert json.loads((ws / "course.json").read_text())["token"] == TOKEN_B
    assert f"replaces the token {TOKEN_A[:5]}-*****-*****-*****" in out
    # (masked: a notebook cell that set it kept it in its output, and the archive gave it away)
    assert TOKEN_A not in out and TOKEN_B not in out


@pytest.mark.parametrize("spelt", ["{t}", "{t_lower}", "{t_plain}", "{t_spaced}"])
def test_submit_refuses_a_file_that_holds_the_token(ws, capsys, spelt):
    """Red team, round 13: a notebook cell that ran ``attn-course workspace --set-token T`` kept the
    token in its source and its output, and submit packed it: anyone who saw the archive could seal
    archives as the student.  Such a file is refused, however the token is spelt."""
    assert cli.main(["workspace", str(ws), "--set-token", TOKEN_A]) == 0
    raw = TOKEN_A.replace("-", "")
    text = spelt.format(t=TOKEN_A, t_lower=TOKEN_A.lower(), t_plain=raw,
                        t_spaced=" ".join(raw[i:i + 5] for i in range(0, 20, 5)))
    nb = ws / "notebooks" / "ch03.ipynb"
    data = json.loads(nb.read_text())
    data["cells"].append({"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [],
                          "source": f"!attn-course workspace --set-token {text}"})
    nb.write_text(json.dumps(data))
    capsys.readouterr()
    before = sorted((ws / "submissions").glob("*.zip")) if (ws / "submissions").exists() else []
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    err = capsys.readouterr().err
    assert "notebooks/ch03.ipynb" in err and "holds your token" in err and TOKEN_A not in err
    after = sorted((ws / "submissions").glob("*.zip")) if (ws / "submissions").exists() else []
    assert after == before


# -- submit ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["attn_tensors/my-helper.py", "attn_tensors/2nd.py", "notebooks/ch03 copy.ipynb"])
def test_submit_refuses_a_file_the_grader_would_reject(ws, capsys, name):
    (ws / name).write_text("{}\n" if name.endswith(".ipynb") else "x = 1\n")
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    line = _one_line_error(capsys)
    assert name in line and "cannot be submitted" in line and "nothing was submitted" in line
    assert not list((ws / "submissions").iterdir())  # no archive, no temporary file left over


def test_submit_refuses_a_file_larger_than_the_grader_takes(ws, capsys):
    from attn_course.archive import MAX_FILE

    (ws / "attn_tensors" / "data.py").write_text("# " + "x" * MAX_FILE + "\n")
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    assert "attn_tensors/data.py is larger than" in _one_line_error(capsys)
    assert not list((ws / "submissions").iterdir())


def test_submit_refuses_an_archive_the_grader_would_reject(ws, capsys):
    info = json.loads((ws / "course.json").read_text())
    info["library_version"] = "v" * 100  # the manifest allows 32 characters
    (ws / "course.json").write_text(json.dumps(info))
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    assert "the grader would reject this archive" in _one_line_error(capsys)
    assert not list((ws / "submissions").iterdir())


def test_submit_where_it_cannot_write_is_one_line(ws, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("my notes\n")
    assert cli.main(["submit", "--workspace", str(ws), "--out", str(tmp_path / "notes.txt" / "a.zip")]) == 2
    assert "cannot be written" in _one_line_error(capsys)
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"


def test_submit_with_a_link_loop_in_the_library_is_one_line(ws, capsys):
    (ws / "attn_tensors" / "loop.py").symlink_to("loop.py")
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    assert "attn_tensors/loop.py cannot be read" in _one_line_error(capsys)


# -- check -------------------------------------------------------------------------------


def test_report_prints_no_escape_sequence_from_the_students_code():
    ex = all_exercises()["3.5"]
    said = f"{ESCAPES}boom\r\x08" + "x" * 100_000
    wrong = ExerciseResult(ex, [CaseResult("ties", False, Status.FAIL, said)])
    text = report([wrong], errors={}) + report([wrong], errors={"3.5": said}) + report([], library_error=said)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text), ascii(text[:300])
    assert "boom" in text and len(text) < 20_000


@pytest.mark.parametrize("hidden", [False, True])
def test_a_notebook_test_cell_says_no_escape_sequence_from_the_students_code(hidden):
    """The test cell's failure (nbcheck.failure_text) is what nbgrader's feedback and the
    notebook show: the student's raised words, without their escapes, and bounded."""
    from attn_course.nbcheck import failure_text

    ex = all_exercises()["3.5"]
    said = f"{ESCAPES}boom\r\x08" + "x" * 100_000
    text = failure_text(ExerciseResult(ex, [CaseResult("ties", False, Status.FAIL, said)]), hidden=hidden)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text), ascii(text[:300])
    assert "Exercise 3.5" in text and len(text) < 20_000


def test_check_shows_a_raised_message_without_its_escapes(ws, capsys):
    path = ws / "attn_tensors" / "statmech.py"
    stub = "    raise NotImplementedError('Exercise 3.5: "
    src = path.read_text()
    start = src.index(stub)
    end = src.index("\n", start)
    path.write_text(src[:start] + f"    raise ValueError({ESCAPES + 'my own bug'!r})" + src[end:])
    assert cli.main(["check", "3.5", "--workspace", str(ws)]) == 1
    out, err = capsys.readouterr()
    assert "my own bug" in out
    assert "\x1b" not in out + err and "\x07" not in out + err


def test_check_in_a_workspace_it_cannot_write_still_gives_its_verdicts(ws, capsys):
    (ws / ".course" / "progress.json").mkdir()  # progress.json cannot be replaced (a folder in its place)
    assert cli.main(["check", "3.5", "--workspace", str(ws)]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "[ TODO] Exercise 3.5" in out and "progress was not saved" in err


def test_a_nul_byte_in_a_module_is_named_with_its_file(ws, capsys):
    """Python's SyntaxError for a NUL byte names no file ("None" was shown where the file goes)."""
    path = ws / "attn_tensors" / "statmech.py"
    src = path.read_text()
    start = src.index("    raise NotImplementedError('Exercise 3.5: ")
    src = src[:start] + "    return S" + src[src.index("\n", start):]  # written (not a stub), and a NUL below
    path.write_bytes(src.encode() + b"\nx = 1\0\n")
    assert cli.main(["check", "3.5", "--workspace", str(ws)]) == 1
    out, err = capsys.readouterr()
    assert "attn_tensors/statmech.py: SyntaxError" in out and "None" not in out, out[-2000:]


@pytest.mark.parametrize("spec", ["", "   "])
def test_check_with_an_empty_name_runs_nothing_and_says_so(ws, capsys, spec):
    """`attn-course check "$EX"` with EX unset once checked every exercise of the course, silently."""
    assert cli.main(["check", spec, "--workspace", str(ws)]) == 2
    assert "empty name" in _one_line_error(capsys)
    assert not (ws / ".course" / "progress.json").exists()


# -- a tester's findings: what a student made is kept, odd input is one line ---------------------


def test_a_workspace_interrupted_half_way_leaves_nothing_and_can_be_made_again(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the workspace was copied left a half-made folder that the next try refused."""
    import shutil

    dest = tmp_path / "ws"
    real = shutil.copyfile

    def interrupted(src, dst, *a, **k):
        if str(dst).endswith(".ipynb"):
            raise KeyboardInterrupt
        return real(src, dst, *a, **k)

    monkeypatch.setattr(workspace.shutil, "copyfile", interrupted)
    assert cli.main(["workspace", str(dest), "--student", "s1"]) == 130
    assert not dest.exists()
    monkeypatch.setattr(workspace.shutil, "copyfile", real)
    assert cli.main(["workspace", str(dest), "--student", "s1"]) == 0


def test_set_token_keeps_a_file_of_the_students_named_like_its_temporary(ws):
    """The token was written through course.tmp, replacing a file of that name."""
    (ws / "course.tmp").write_text("my notes\n")
    assert cli.main(["workspace", str(ws), "--set-token", TOKEN_A]) == 0
    assert (ws / "course.tmp").read_text() == "my notes\n"
    assert sorted(p.name for p in ws.iterdir() if p.name.startswith(".course.json")) == []


def test_submit_takes_files_only(ws, capsys):
    """A folder named like a module or a notebook was read as a file (a traceback), and a pipe
    named like a module hung submit: neither is a file to submit."""
    import os
    import zipfile

    (ws / "attn_tensors" / "weird.py").mkdir()
    (ws / "notebooks" / "ch11.ipynb").mkdir()
    os.mkfifo(ws / "attn_tensors" / "pipe.py")
    assert cli.main(["submit", "--workspace", str(ws)]) == 0, capsys.readouterr().err
    (archive,) = (ws / "submissions").iterdir()
    names = zipfile.ZipFile(archive).namelist()
    assert "attn_tensors/statmech.py" in names
    assert not {"attn_tensors/weird.py", "notebooks/ch11.ipynb", "attn_tensors/pipe.py"} & set(names)


def test_submit_refuses_links_to_folders_and_out_of_the_workspace(ws, tmp_path, capsys):
    """A link in the library was followed: one to a folder walked it (a link to / walked the
    whole machine), one to a file elsewhere sent that file to the grader unseen."""
    (tmp_path / "diary.py").write_text("SECRET = 'my diary'\n")
    (ws / "attn_tensors" / "everything").symlink_to("/")
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    line = _one_line_error(capsys)
    assert "attn_tensors/everything" in line and "a folder" in line
    (ws / "attn_tensors" / "everything").unlink()
    (ws / "attn_tensors" / "diary.py").symlink_to(tmp_path / "diary.py")
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    line = _one_line_error(capsys)
    assert "attn_tensors/diary.py" in line and "outside the workspace" in line
    (ws / "notebooks" / "diary.ipynb").symlink_to(tmp_path / "diary.py")
    (ws / "attn_tensors" / "diary.py").unlink()
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    assert "notebooks/diary.ipynb" in _one_line_error(capsys)
    assert not (ws / "submissions").exists() or not any((ws / "submissions").iterdir())


def test_a_link_to_a_file_in_the_workspace_is_submitted_as_that_file(ws, capsys):
    import zipfile

    (ws / "my_helpers.py").write_text("HELPER = 1\n")
    (ws / "attn_tensors" / "helpers.py").symlink_to("../my_helpers.py")
    assert cli.main(["submit", "--workspace", str(ws)]) == 0, capsys.readouterr().err
    (archive,) = (ws / "submissions").iterdir()
    assert zipfile.ZipFile(archive).read("attn_tensors/helpers.py") == b"HELPER = 1\n"


def test_check_reads_no_module_through_a_link_to_a_folder(ws):
    from attn_course.runner import package_files

    (ws / "attn_tensors" / "everything").symlink_to("/")
    (ws / "attn_tensors" / "loop").symlink_to(".")
    files = package_files(ws)
    assert "attn_tensors/statmech.py" in files
    assert not [name for name in files if name.startswith(("attn_tensors/everything/", "attn_tensors/loop/"))]


@pytest.mark.parametrize("damage", ["delete", b"{not json", b"3"])
def test_check_without_its_public_cases_says_how_to_restore_them(ws, capsys, damage):
    import shutil
    import subprocess

    cases = ws / ".course" / "cases"
    if damage == "delete":
        shutil.rmtree(ws / ".course")
    else:
        (cases / "ch03.json").write_bytes(damage)
    assert cli.main(["check", "--workspace", str(ws), "3.1"]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    line = err.strip().splitlines()[-1]
    assert line.startswith("attn-course: ") and "ch03.json" in line
    restore = re.search(r"`(cp .*?)`", line).group(1)
    cases.mkdir(parents=True, exist_ok=True)
    subprocess.run(restore, shell=True, check=True)
    assert json.loads((cases / "ch03.json").read_text())["3.1"]


def test_submit_beside_a_file_named_submissions_is_one_line(ws, capsys):
    (ws / "submissions").write_text("my list\n")
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    assert "is a file, where submissions are kept" in _one_line_error(capsys)
    assert (ws / "submissions").read_text() == "my list\n"


@pytest.mark.parametrize("text", [b"{not json", b"", b"[]", b'{"cells": 3}'])
def test_submit_refuses_a_notebook_the_grader_cannot_read(ws, capsys, text):
    (ws / "notebooks" / "ch03.ipynb").write_bytes(text)
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    line = _one_line_error(capsys)
    assert "notebooks/ch03.ipynb is not a notebook Jupyter can open" in line and "nothing was submitted" in line
    assert not list((ws / "submissions").iterdir())


@pytest.mark.parametrize("args, words", [
    (["--out", ""], "--out needs an archive name"),
    (["--out", "{tmp}/mine.txt"], "an archive's name ends in .zip"),
    (["--out", "{tmp}/nodir/mine.zip"], "there is no folder"),
    (["--workspace", ""], "--workspace needs a folder"),
    (["--workspace", "{tmp}/nowhere"], "no such folder"),
])
def test_submit_with_odd_options_is_one_line(ws, tmp_path, capsys, args, words):
    args = [a.format(tmp=tmp_path) for a in args]
    if "--workspace" not in args:
        args += ["--workspace", str(ws)]
    assert cli.main(["submit", *args]) == 2
    assert words in _one_line_error(capsys)
    assert not (tmp_path / "mine.txt").exists() and not (tmp_path / "nodir").exists()


def test_a_module_the_student_deleted_is_not_found_in_the_reference(ws, capsys):
    """Where the course is installed editable (a clone), ``attn_tensors.*`` resolved to the reference
    library's files: a workspace without masking.py passed exercise 7.2 in ``check``, and the grader,
    which fills in the stub, gave it 0.  A module is found in the workspace's package or not at all."""
    import subprocess
    import sys

    from attn_course import ROOT

    (ws / "attn_tensors" / "masking.py").unlink()
    probe = ("import sys; from attn_course.worker import load_package; load_package(sys.argv[1])\n"
             "import importlib, attn_tensors\n"
             "print(attn_tensors.__file__)\n"
             "try:\n    importlib.import_module('attn_tensors.masking')\nexcept ModuleNotFoundError:\n"
             "    print('not found')\nelse:\n    print('found at', sys.modules['attn_tensors.masking'].__file__)\n")
    out = subprocess.run([sys.executable, "-c", probe, str(ws)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.splitlines()
    assert first == str(ws / "attn_tensors" / "__init__.py") and second == "not found", out.stdout
    assert cli.main(["check", "7.2", "--workspace", str(ws)]) == 1
    assert "PASS" not in capsys.readouterr().out


def test_a_workspace_without_its_library_says_so(ws, capsys):
    """A workspace whose attn_tensors/ was deleted was said to have 'no course.json'."""
    import shutil

    shutil.rmtree(ws / "attn_tensors")
    assert cli.main(["submit", "--workspace", str(ws)]) == 2
    line = _one_line_error(capsys)
    assert "has its course.json but no attn_tensors/ folder" in line and "no course.json" not in line
