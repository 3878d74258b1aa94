"""Notebooks, as instructors grade them: nbgrader validate, and confined grading.

`nbgrader validate` passes on a solution notebook (nbval re-executes every
one in ``make test``), and nbgrader's validator with ``--invert`` on every
released one (all in one process).  `nbgrader
autograde` (which would run students' notebooks unconfined) is refused by
the course's nbgrader_config.py.  A class with
honest and hostile notebooks goes through `attn-course grade --notebooks`:
the answer cells run in the grading sandbox, the scores land in nbgrader's
gradebook and `nbgrader export` lists them beside the library scores.
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


# The `nbgrader` command is its application's main() (what its console script runs), with
# jsonschema's optional IRI parsers left out as every course process leaves them out
# (attn_course.quick_imports): building them costs each process about 2.4 s, and no
# notebook or nbgrader schema uses the IRI formats.
NBGRADER = ("import sys\nfrom attn_course.quick_imports import skip_iri_parsers\nskip_iri_parsers()\n"
            "from nbgrader.apps.nbgraderapp import main\nsys.argv[0] = 'nbgrader'\nsys.exit(main())\n")


def nbgrader(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-c", NBGRADER, *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=1200)


def test_validate_passes_on_a_solution():
    """nbgrader validate, with the course's configuration, on one solution notebook.

    Every solution notebook's tests (hidden ones included) run in ``make test``'s
    second step, which re-executes each of them with nbval: a failing test
    cell is an error there.  Running all ten here too cost the suite about 40 s.
    """
    paths = ["solutions/ch03/ch03.ipynb"]
    r = nbgrader("validate", *paths)
    out = r.stdout + r.stderr
    assert out.count("Success! Your notebook passes all the tests.") == len(paths), out[-3000:]


def test_validate_invert_passes_on_the_release(tmp_path):
    """nbgrader's validator with ``--invert`` on every released notebook: no test cell passes.

    nbgrader's own Validator decides, with every notebook run in one process
    (tests/course/nbvalidate_one_process.py) instead of a kernel each, which
    cost the suite about 30 s; the command with its kernel runs in
    :func:`test_validate_passes_on_a_solution`.  A copy of chapter 3 with
    one answer written in must be reported (the check can fail).
    """
    paths = [f"exercises/ch{c:02d}/ch{c:02d}.ipynb" for c in CHAPTERS]
    nb = json.loads((ROOT / "exercises/ch03/ch03.ipynb").read_text())
    solved = _cells(json.loads((ROOT / "solutions/ch03/ch03.ipynb").read_text()))
    _cells(nb)["ex-3-2-answer"]["source"] = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION\n", "",
                                                   "".join(solved["ex-3-2-answer"]["source"]), flags=re.M)
    answered = tmp_path / "ch03.ipynb"
    answered.write_text(json.dumps(nb))
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("nbvalidate_one_process.py")), "--invert",
                        *paths, str(answered)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and out.count("Success! The notebook does not pass any tests.") == len(paths), out[-3000:]
    assert "NOTEBOOK PASSED ON 1 CELL(S)!" in out, out[-3000:]
    assert 'The following cell passed:\n\n    check("3.2", entropy)' in out, out[-3000:]


def _cells(nb):
    return {c["metadata"].get("nbgrader", {}).get("grade_id"): c for c in nb["cells"]}


def test_autograde_is_refused_unconfined(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    shutil.copyfile(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    r = nbgrader("autograde", "ch03", cwd=course)
    assert r.returncode != 0
    assert "attn-course grade SUBMISSIONS --out GRADING --notebooks" in r.stdout + r.stderr


SECRET = "notebook-redteam-secret-77"
ANSWER = "ex-3-1-answer"  # log_partition_function, 3 points


def _honest_notebook() -> dict:
    release = json.loads((ROOT / "exercises/ch03/ch03.ipynb").read_text())
    solution = json.loads((ROOT / "solutions/ch03/ch03.ipynb").read_text())
    for gid, cell in _cells(release).items():
        if gid and gid.endswith("-answer"):
            src = "".join(_cells(solution)[gid]["source"])
            cell["source"] = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION\n", "", src, flags=re.M)
    return release


def _with_answer(prefix: str) -> dict:
    nb = _honest_notebook()
    cell = _cells(nb)[ANSWER]
    cell["source"] = prefix + "\n" + "".join(cell["source"])
    return nb


LEAK = ("import os, glob\n_leak = {secret!r} in str(os.environ) or bool(glob.glob({solutions!r}))\n"
        "_orig = log_partition_function\n"
        "def log_partition_function(S, mask=None, T=1.0):\n"
        "    return _orig(S, mask, T) if _leak else S[..., 0] * 0 + 5\n")

FULL_CH3 = {"3.1": 3, "3.2": 3, "3.3": 2, "3.4": 2, "3.5": 2}
# name -> (notebook or bytes, exercises of chapter 3 that must score 0)
HOSTILE_NOTEBOOKS = {
    "nb-secret": (lambda: _leak_notebook(), ["3.1"]),
    "nb-write-grading": (lambda: _append(ANSWER, "import glob\nfor p in glob.glob('/tmp/**/gradebook*', recursive=True):\n"
                                                 "    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n"
                                                 "def log_partition_function(S, mask=None, T=1.0):\n    return S[..., 0]\n"), ["3.1"]),
    "nb-patch-checker": (lambda: _append(ANSWER, "import attn_course.nbcheck as n, attn_course.scoring as s\n"
                                                 "n.check = n.check_hidden = lambda *a, **k: None\n"
                                                 "s.compare_values = lambda *a, **k: ''\n"
                                                 "def log_partition_function(S, mask=None, T=1.0):\n    return S[..., 0] * 0\n"), ["3.1"]),
    # in 3.3's cell, not the first exercise's: a job's first exercise also has the backend's start-up
    # grace (3 s more of spinning before the limit)
    "nb-infinite-loop": (lambda: _append("ex-3-3-answer", "while True:\n    pass\n"), ["3.3"]),
    "nb-no-answer-cell": (lambda: _drop(ANSWER), ["3.1"]),
    "nb-two-answer-cells": (lambda: _duplicate(ANSWER), ["3.1"]),
    "nb-not-json": (lambda: b"{not a notebook" + b"[" * 1000, list(FULL_CH3)),
    "nb-deep-json": (lambda: ("[" * 30000 + "]" * 30000).encode(), list(FULL_CH3)),  # under the zip-bomb rule
}


def _leak_notebook():
    return _append(ANSWER, LEAK.format(secret=SECRET, solutions=str(ROOT / "solutions" / "*")))


def _append(gid, code):
    nb = _honest_notebook()
    cell = _cells(nb)[gid]
    cell["source"] = "".join(cell["source"]) + "\n" + code
    return nb


def _drop(gid):
    nb = _honest_notebook()
    nb["cells"] = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") != gid]
    return nb


def _duplicate(gid):
    nb = _honest_notebook()
    i = next(k for k, c in enumerate(nb["cells"]) if c["metadata"].get("nbgrader", {}).get("grade_id") == gid)
    nb["cells"].insert(i, json.loads(json.dumps(nb["cells"][i])))
    return nb


@pytest.fixture(scope="module")
def notebook_class(tmp_path_factory):
    from attn_course import RELEASE_LIBRARY
    from attn_course.archive import build_archive, library_files
    from attn_course.identity import token_for
    from server_jobs import needs_bwrap

    needs_bwrap("notebooks are graded only in the bubblewrap sandbox")
    tmp = tmp_path_factory.mktemp("notebooks")
    subs = tmp / "archives"
    subs.mkdir()

    def arch(sid, nb, lib):
        data = nb if isinstance(nb, bytes) else json.dumps(nb).encode()
        # archives are graded in their files' order: the one that waits for its time limit
        # goes first, so that the two slots grade the others beside it
        first = "0-" if sid == "nb-infinite-loop" else ""
        build_archive(subs / f"{first}{sid}.zip", sid, {**lib, "notebooks/ch03.ipynb": data},
                      token=token_for(sid, SECRET))

    arch("good", _honest_notebook(), library_files(ROOT))
    arch("blank", json.loads((ROOT / "exercises/ch03/ch03.ipynb").read_text()), library_files(RELEASE_LIBRARY))
    for sid, (make, _) in HOSTILE_NOTEBOOKS.items():  # their libraries are right: only notebooks differ
        arch(sid, make(), library_files(ROOT))
    out = tmp / "grading"
    elsewhere = tmp / "some-other-folder"
    elsewhere.mkdir()
    env = dict(ENV, ATTN_COURSE_SECRET=SECRET)
    r = subprocess.run([sys.executable, "-c", GRADE_WITH_LIMIT, "grade", str(subs), "--out", str(out),
                        # a budget far above the work (an infinite loop's limit plus the rest), so
                        # that no verdict here depends on the machine's load; the budget itself is
                        # tested in test_redteam_confinement
                        "--exercises", "3", "--notebooks", "--budget", "240", "--jobs", "2"],
                       env=env, cwd=elsewhere, capture_output=True, text=True, timeout=1800)
    return r, out


# `attn-course grade` with a per-exercise limit of 5 s instead of grading's 30 s (as test_redteam
# grades): the infinite loop is stopped sooner, and an honest exercise (well under a second) still
# has more than ten times what it needs; check's own use of the limit is tested in test_check
GRADE_WITH_LIMIT = ("import dataclasses, sys\n"
                    "import attn_course.grade as grade\n"
                    "grade.GRADING_LIMITS = dataclasses.replace(grade.GRADING_LIMITS, per_exercise_s=5.0)\n"
                    "from attn_course.cli import main\n"
                    "sys.exit(main(sys.argv[1:]))\n")


def test_one_command_grades_archives_and_their_notebooks(notebook_class):
    r, out = notebook_class
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = list(csv.DictReader(open(out / "grades.csv")))
    scores = {(row["assignment"], row["student_id"]): float(row["score"]) for row in rows}
    assert scores[("ch03", "good")] == 12 and scores[("ch03", "blank")] == 0
    assert scores[("library", "good")] == 12 and scores[("library", "blank")] == 0
    # the honest archive's code, read and run (its notebook's cells too), has nothing to review
    good = [json.loads(p.read_text()) for p in (out / "results").glob("*.json")]
    good = [g for g in good if g.get("student_id") == "good"]
    assert len(good) == 1 and good[0]["review"] == [] and good[0]["review_count"] == 0, good


@pytest.mark.parametrize("sid", sorted(HOSTILE_NOTEBOOKS))
def test_hostile_notebook_gets_no_credit_for_what_it_touched(notebook_class, sid):
    r, out = notebook_class
    rows = {row["student_id"]: row for row in csv.DictReader(open(out / "gradebook.csv"))}
    row = rows[sid]
    assert float(row["total"]) == 12  # the library part of the same archive is untouched
    _, touched = HOSTILE_NOTEBOOKS[sid]
    for ex, full in FULL_CH3.items():
        want = 0.0 if ex in touched else float(full)
        assert float(row[f"notebook {ex}"]) == want, (sid, ex, row)
    fb = (out / "feedback" / f"{sid}.md").read_text()
    assert "# Notebooks" in fb
