"""nbgrader, as instructors use it: validate both ways, autograde, feedback, export.

`nbgrader validate` passes on every solution notebook and `--invert` on every
released one.  Then a small class goes through `nbgrader autograde` in a copy
of the course: an honest notebook, one with an edited test cell, one with a
deleted test cell, and the untouched release; the feedback has no hidden
tests; and `nbgrader export` lists the notebook scores beside the library
scores that `attn-course grade --nbgrader` put in the same gradebook.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attn_course import ROOT
from attn_course.registry import CHAPTERS

pytestmark = pytest.mark.slow
BIN = str(Path(sys.executable).parent)
ENV = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")  # nbgrader runs `alembic`


def nbgrader(*args, cwd=ROOT):
    return subprocess.run([f"{BIN}/nbgrader", *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=1200)


def test_validate_passes_on_solutions():
    paths = [f"solutions/ch{c:02d}/ch{c:02d}.ipynb" for c in CHAPTERS]
    r = nbgrader("validate", *paths)
    out = r.stdout + r.stderr
    assert out.count("Success! Your notebook passes all the tests.") == len(paths), out[-3000:]


def test_validate_invert_passes_on_the_release():
    paths = [f"exercises/ch{c:02d}/ch{c:02d}.ipynb" for c in CHAPTERS]
    r = nbgrader("validate", "--invert", *paths)
    out = r.stdout + r.stderr
    assert out.count("Success! The notebook does not pass any tests.") == len(paths), out[-3000:]


def _cells(nb):
    return {c["metadata"].get("nbgrader", {}).get("grade_id"): c for c in nb["cells"]}


def test_autograde_feedback_and_one_export(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    shutil.copyfile(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(ROOT / "solutions" / "ch03", course / "solutions" / "ch03")
    r = nbgrader("generate_assignment", "ch03", "--force", cwd=course)
    assert r.returncode == 0, r.stderr[-2000:]
    solution = json.loads((course / "solutions/ch03/ch03.ipynb").read_text())
    release = json.loads((course / "exercises/ch03/ch03.ipynb").read_text())
    answered = json.loads(json.dumps(release))
    for gid, cell in _cells(answered).items():  # the student's answers: the solutions, markers removed
        if gid and gid.endswith("-answer"):
            src = "".join(_cells(solution)[gid]["source"])
            cell["source"] = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION\n", "", src, flags=re.M)

    def submit(student, nb):
        d = course / "grading" / "submitted" / student / "ch03"
        d.mkdir(parents=True)
        (d / "ch03.ipynb").write_text(json.dumps(nb))

    submit("honest", answered)
    edited = json.loads(json.dumps(answered))
    _cells(edited)["ex-3-1-answer"]["source"] = "def log_partition_function(S, mask=None, T=1.0):\n    return S[..., 0]\n"
    _cells(edited)["ex-3-1-tests"]["source"] = "pass  # nothing to see here\n"
    submit("edited", edited)
    deleted = json.loads(json.dumps(answered))
    _cells(deleted)["ex-3-2-answer"]["source"] = "def entropy(A, mask=None):\n    return A[..., 0]\n"
    deleted["cells"] = [c for c in deleted["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") != "ex-3-2-tests"]
    submit("deleted", deleted)
    submit("untouched", release)

    r = nbgrader("autograde", "ch03", "--create", "--force", cwd=course)
    assert "Traceback" not in r.stdout, r.stdout[-3000:]

    from nbgrader.api import Gradebook

    db = f"sqlite:///{course / 'grading' / 'gradebook.db'}"
    with Gradebook(db) as gb:
        def score(student, cell):
            return gb.find_grade(cell, "ch03", "ch03", student).score

        assert gb.find_submission("ch03", "honest").score == 12
        assert score("edited", "ex-3-1-tests") == 0          # the test cell came back
        assert score("edited", "ex-3-2-tests") == 3
        assert score("deleted", "ex-3-2-tests") == 0         # the deleted test cell came back
        assert gb.find_submission("ch03", "untouched").score == 0

    r = nbgrader("generate_feedback", "ch03", "--force", cwd=course)
    assert r.returncode == 0, r.stderr[-2000:]
    html = (course / "grading/feedback/honest/ch03/ch03.html").read_text()
    assert "check_hidden" not in html and "HIDDEN TESTS" not in html
    assert "public cases pass" in html

    # the library exercises, graded by attn-course, land in the same gradebook
    from attn_course.archive import build_archive, library_files
    from attn_course.grade import Grader, export_to_nbgrader

    subs = tmp_path / "library"
    subs.mkdir()
    build_archive(subs / "honest.zip", "honest", library_files(ROOT))
    g = Grader(tmp_path / "library-grading", "3.5", jobs=1, log=lambda *a: None)
    export_to_nbgrader(g.latest_by_student(g.run(subs)), g.exercises, db)
    r = nbgrader("export", cwd=course)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader(open(course / "grades.csv")))
    mine = {(row["assignment"], row["student_id"]): float(row["score"]) for row in rows}
    assert mine[("ch03", "honest")] == 12
    assert mine[("library", "honest")] == 2


def test_one_command_grades_archives_and_their_notebooks(tmp_path):
    """`attn-course grade --notebooks`: library in the sandbox, notebooks through nbgrader, one CSV."""
    from attn_course.archive import build_archive, library_files
    from attn_course import RELEASE_LIBRARY

    course = tmp_path / "course"
    course.mkdir()
    shutil.copyfile(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(ROOT / "solutions" / "ch03", course / "solutions" / "ch03")
    assert nbgrader("generate_assignment", "ch03", "--force", cwd=course).returncode == 0
    release = (course / "exercises/ch03/ch03.ipynb").read_text()
    solution = json.loads((course / "solutions/ch03/ch03.ipynb").read_text())
    answered = json.loads(release)
    for gid, cell in _cells(answered).items():
        if gid and gid.endswith("-answer"):
            src = "".join(_cells(solution)[gid]["source"])
            cell["source"] = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION\n", "", src, flags=re.M)
    subs = tmp_path / "archives"
    subs.mkdir()
    build_archive(subs / "good.zip", "good", {**library_files(ROOT),
                                              "notebooks/ch03.ipynb": json.dumps(answered).encode()})
    build_archive(subs / "blank.zip", "blank", {**library_files(RELEASE_LIBRARY),
                                                "notebooks/ch03.ipynb": release.encode()})
    out = tmp_path / "grading"
    r = subprocess.run([sys.executable, "-m", "attn_course.cli", "grade", str(subs), "--out", str(out),
                        "--exercises", "3.5", "--notebooks", "--course", str(course)],
                       env=ENV, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "grades.csv")))
    scores = {(row["assignment"], row["student_id"]): float(row["score"]) for row in rows}
    assert scores[("ch03", "good")] == 12 and scores[("ch03", "blank")] == 0
    assert scores[("library", "good")] == 2 and scores[("library", "blank")] == 0
    assert (course / "grading/submitted/good/ch03/ch03.ipynb").exists()
