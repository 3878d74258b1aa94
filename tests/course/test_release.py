"""The committed student release is what the source gives (CI regenerates it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from attn_course import EXERCISES, LIBRARY, RELEASE_LIBRARY, ROOT
from attn_course.regions import exercise_of_stub, library_regions
from attn_course.registry import CHAPTERS, all_exercises
from attn_course.release import check_regions, check_release


def test_at_least_three_exercises_per_chapter():
    exercises = all_exercises()
    for ch in CHAPTERS:
        assert sum(e.chapter == ch for e in exercises.values()) >= 3, f"chapter {ch}"
    assert len(exercises) >= 30


def test_every_region_has_an_exercise_and_every_exercise_a_region():
    check_regions(all_exercises(), strict=True)


def test_book_defines_every_graded_exercise():
    """Each exercise is in its chapter, labelled, titled as in the registry, with the check command."""
    import re

    for e in all_exercises().values():
        text = (ROOT / "chapters" / f"{CHAPTERS[e.chapter][0]}.md").read_text()
        m = re.search(r"`{3,}\{exercise\} ([^\n]*)\n:label: " + re.escape(e.label) + r"\n", text)
        assert m, e.id
        assert m.group(1).strip() == e.title, (e.id, m.group(1), e.title)
        assert f"Graded exercise {e.id}: run `attn-course check {e.id}`" in text, e.id


def test_stub_messages_name_their_exercise():
    text = "\n".join(p.read_text() for p in (RELEASE_LIBRARY / "attn_tensors").rglob("*.py"))
    owners = {r.exercise for r in library_regions(LIBRARY)}
    for ex in owners:
        assert (f"NotImplementedError('Exercise {ex}: implement " in text
                or f"# not implemented yet: Exercise {ex}\n" in text), ex
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert exercise_of_stub("Exercise 5.2: implement softmax_jacobian (x)") == "5.2"


def test_stub_package_imports_everything():
    code = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); import attn_tensors; "
            "assert attn_tensors.__file__.startswith(sys.argv[1]), attn_tensors.__file__; "
            "[importlib.import_module('attn_tensors.' + m) for m in sorted(attn_tensors._SUBMODULES)]")
    subprocess.run([sys.executable, "-c", code, str(RELEASE_LIBRARY)], check=True, cwd="/")


def test_hidden_cases_are_not_released():
    """The release holds the public cases only: no hidden input reaches it."""
    import json

    from attn_course import values
    from attn_course.registry import secret

    released = {}
    for path in (RELEASE_LIBRARY / "cases").glob("*.json"):
        released.update(json.loads(path.read_text()))
    text = "\n".join(p.read_text() for p in (RELEASE_LIBRARY / "cases").glob("*.json"))
    for e in all_exercises().values():
        assert len(released[e.id]["cases"]) == len(e.make_cases(False)), e.id
        for case in e.make_cases(True, secret(allow_ci=True)):
            for name, v in case.inputs.items():
                if hasattr(v, "size") and v.size >= 4 and v.dtype.kind == "f":
                    enc = json.dumps(values.encode(v)["data"][:4])[1:-1]
                    assert enc not in text, f"hidden input {name} of {e.id} is in the release"
    for nb in EXERCISES.glob("ch*/*.ipynb"):
        text = nb.read_text()
        assert "check_hidden" not in text and "HIDDEN TESTS" not in text, nb


@pytest.mark.slow
def test_committed_release_matches_the_source():
    problems = check_release()
    assert not problems, "\n".join(problems) + "\nrun `attn-course release` and commit"


def test_release_comparison_allows_rounding_only():
    """Another CPU's last bits pass (an eigenvalue of 1e-9 from entries of order one moves by
    1e-16 between LAPACK builds); a changed value does not."""
    import numpy as np

    from attn_course import values
    from attn_course.release import _close

    def enc(x):
        return values.encode(np.asarray(x, dtype=np.float64))

    assert _close(enc([1e-9, 3.0]), enc([1e-9 + 1.1e-16, 3.0 * (1 + 1e-13)]))
    assert _close(enc([-1.3e-16]), enc([-2.7e-17]))
    assert not _close(enc([1e-9, 3.0]), enc([1e-9, 3.0 * (1 + 1e-9)]))
    assert not _close(enc([1e-9]), enc([2e-9 + 1e-12]))
    assert not _close(enc([1.0]), enc([np.nan]))


def test_a_new_gradebook_is_stamped_with_nbgraders_newest_migration(tmp_path):
    """nbgrader stamps a new gradebook with its newest migration, which it asks the `alembic heads`
    command for (4-5 s); the course reads it in-process (attn_course.nbgrader_db). Here it is
    found from nbgrader's migration files: the one revision no other revises."""
    import re
    import sqlite3

    import nbgrader

    from attn_course.nbgrader_bridge import write_gradebook
    from attn_course.nbgrader_db import alembic_head
    from attn_course.registry import select

    revises = {}
    for f in (Path(nbgrader.__file__).parent / "alembic" / "versions").glob("*.py"):
        text = f.read_text()
        rev = re.search(r"^revision = '(\w+)'", text, re.M).group(1)
        revises[rev] = re.search(r"^down_revision = (?:'(\w+)'|None)", text, re.M).group(1)
    (newest,) = set(revises) - set(revises.values())
    assert len(revises) >= 6 and alembic_head() == newest
    db = tmp_path / "gradebook.db"
    write_gradebook(f"sqlite:///{db}", {}, select("3.1"))
    with sqlite3.connect(db) as con:
        assert con.execute("select version_num from alembic_version").fetchall() == [(newest,)]
