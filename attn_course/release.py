"""Write (or check) what students receive, from the instructor's source.

* ``exercises/library/attn_tensors/``: the library with every solution region
  replaced by its ``raise NotImplementedError("Exercise N.k: ...")``.
* ``exercises/library/cases/chNN.json``: each exercise's public cases, inputs
  and the reference outputs, as data.
* ``solutions/chNN/chNN.ipynb``: the nbgrader source notebooks (see
  :mod:`attn_course.notebooks`), and ``exercises/chNN/`` released from them
  by ``nbgrader generate_assignment``.

``attn-course release`` writes them; ``attn-course release --check`` rebuilds
them in a temporary folder and fails if the committed ones differ (CI).
"""

from __future__ import annotations

import filecmp
import json
import os
import sys
import shutil
import tempfile
from pathlib import Path

import numpy as np

from . import LIBRARY, ROOT, values
from .regions import library_regions, stub_source
from .registry import CHAPTERS, Exercise, all_exercises

SKIP = {"__pycache__"}


def titles(exercises: dict[str, Exercise]) -> dict[str, tuple[str, str]]:
    """exercise id -> (the public function, title) for the stub messages."""
    return {e.id: (e.name, e.title) for e in exercises.values() if not e.region}


def check_regions(exercises: dict[str, Exercise], strict: bool = True) -> list:
    """Every exercise that owns a region has one, and every region an owner.

    ``strict=False`` (while chapters are being written) only requires the
    second half.
    """
    regions = library_regions(LIBRARY)
    owners = {r.exercise for r in regions}
    problems = []
    for e in exercises.values():
        if e.owner not in owners and strict:
            problems.append(f"exercise {e.id}: no '### BEGIN SOLUTION {e.owner}' region in attn_tensors/")
        if e.region and e.region not in exercises and strict:
            problems.append(f"exercise {e.id}: its region {e.region} is not an exercise")
    for r in regions:
        if r.exercise not in exercises or exercises[r.exercise].region:
            problems.append(f"{r.path.name}:{r.begin}: region {r.exercise} has no exercise that owns it")
    if problems:
        raise ValueError("\n".join(problems))
    return regions


def write_stubs(dest: Path, exercises: dict[str, Exercise], strict: bool = True) -> None:
    """The stubbed package in ``dest/attn_tensors``."""
    check_regions(exercises, strict)
    t = titles(exercises)
    out = Path(dest) / "attn_tensors"
    if out.exists():
        shutil.rmtree(out)
    for path in sorted(LIBRARY.rglob("*")):
        rel = path.relative_to(LIBRARY)
        if SKIP & set(rel.parts) or path.is_dir():
            continue
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".py":
            target.write_text(stub_source(path, t))
        else:
            shutil.copyfile(path, target)


def public_cases(exercises: dict[str, Exercise], chapter: int) -> dict:
    """``{"3.1": {"title", "points", "function", "mistakes", "cases": [{name, note, inputs,
    expected, wrong}]}}``.

    ``mistakes`` are the catalogue's entries of the exercise as words (key,
    message, book section) and each case's ``wrong`` their outputs on it
    (:func:`attn_course.diagnose.catalogue_outputs`): data, so that a
    student's check names a mistake without the catalogue, whose code never
    leaves the trusted side.
    """
    from .diagnose import catalogue_outputs, known_mistakes
    from .runner import reference_results

    out = {}
    for e in exercises.values():
        if e.chapter != chapter:
            continue
        cases = e.make_cases(hidden=False)
        expected = reference_results(e, cases)
        wrong = catalogue_outputs(e, cases, [{"status": x.status, "value": x.value} for x in expected])
        out[e.id] = {
            "title": e.title, "points": e.points, "function": e.function, "hint": e.hint,
            "book": e.book_page, "rtol": e.rtol, "atol": e.atol,
            "mistakes": [m.to_dict() for m in known_mistakes(e)],
            "cases": [
                {"name": c.name, "note": c.note, "inputs": values.encode(c.inputs),
                 "expected": values.encode(x.public_dict()), "wrong": values.encode(w),
                 **({"eager": True} if c.eager else {})}
                for c, x, w in zip(cases, expected, wrong)
            ],
        }
    return out


def write_cases(dest: Path, exercises: dict[str, Exercise]) -> None:
    folder = Path(dest) / "cases"
    folder.mkdir(parents=True, exist_ok=True)
    for ch in CHAPTERS:
        data = public_cases(exercises, ch)
        if data:
            (folder / f"ch{ch:02d}.json").write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")


def write_library_release(dest: Path | None = None, strict: bool = True) -> Path:
    dest = Path(dest or ROOT / "exercises" / "library")
    exercises = all_exercises()
    write_stubs(dest, exercises, strict)
    write_cases(dest, exercises)
    return dest


# -- checking the committed release ---------------------------------------------------


def _close(a, b) -> bool:
    """Equal JSON trees, arrays compared to 1e-12 relative, and 1e-12 absolute on values of order
    one or less (other CPUs round differently: a smallest eigenvalue of 1e-9 computed from entries
    of order one moves by 1e-16 between LAPACK builds)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if "__array__" in a and "__array__" in b:
            x, y = values.decode(a), values.decode(b)
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if x.dtype.kind != "f":
                return bool(np.all(x == y))
            return bool(np.all(np.isclose(x, y, rtol=1e-12, atol=1e-12, equal_nan=True) | (x == y)))
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def diff_library_release(committed: Path | None = None) -> list[str]:
    """What differs between the committed student library and a fresh build."""
    committed = Path(committed or ROOT / "exercises" / "library")
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        fresh = write_library_release(Path(tmp))
        for path in sorted(fresh.rglob("*")):
            if path.is_dir():
                continue
            rel = path.relative_to(fresh)
            old = committed / rel
            if not old.exists():
                problems.append(f"missing: exercises/library/{rel}")
            elif path.suffix == ".json":
                if not _close(json.loads(path.read_text()), json.loads(old.read_text())):
                    problems.append(f"differs: exercises/library/{rel}")
            elif not filecmp.cmp(path, old, shallow=False):
                problems.append(f"differs: exercises/library/{rel}")
        for path in sorted(committed.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and not (fresh / path.relative_to(committed)).exists():
                problems.append(f"not generated (remove it): exercises/library/{path.relative_to(committed)}")
    return problems


# -- notebooks ----------------------------------------------------------------------


def _nbgrader_api(root: Path):
    """nbgrader's Python API on the course at ``root`` (its nbgrader_config.py)."""
    from .quick_imports import skip_iri_parsers

    skip_iri_parsers()
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    from .nbgrader_db import fast_alembic_head

    fast_alembic_head()  # its gradebook is made without a second Python for `alembic heads`
    # nbgrader runs `alembic` as a command: this environment's bin must be on PATH
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.db_url = f"sqlite:///{root / 'grading' / 'gradebook.db'}"
    (root / "grading").mkdir(exist_ok=True)
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def release_notebooks(root: Path, chapters: list[int]) -> None:
    """``nbgrader generate_assignment chNN`` for each chapter, at ``root``."""
    import logging

    api = _nbgrader_api(root)
    api.log.setLevel(logging.WARNING)
    for ch in chapters:
        result = api.generate_assignment(f"ch{ch:02d}", force=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader generate_assignment ch{ch:02d} failed:\n{result['log']}")


def _chapters() -> list[int]:
    exercises = all_exercises()
    return [ch for ch in CHAPTERS if any(e.chapter == ch for e in exercises.values())]


def release_all(execute: bool = True) -> None:
    """Write the whole student release and the instructor's notebooks."""
    from .notebooks import write_solutions

    write_library_release()
    print("wrote exercises/library (stubs and public cases)")
    write_solutions(execute_cells=execute)
    print("wrote solutions/chNN/chNN.ipynb" + (" (executed)" if execute else ""))
    release_notebooks(ROOT, _chapters())
    print("wrote exercises/chNN/chNN.ipynb (nbgrader generate_assignment)")


def check_release() -> list[str]:
    """Differences between the committed release and one built from the source now."""
    from .notebooks import sources, write_solutions

    problems = diff_library_release()
    chapters = _chapters()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shutil.copyfile(ROOT / "nbgrader_config.py", tmp / "nbgrader_config.py")
        write_solutions(execute_cells=False, dest=tmp / "solutions")
        for ch in chapters:
            name = f"ch{ch:02d}/ch{ch:02d}.ipynb"
            committed = ROOT / "solutions" / name
            if not committed.exists():
                problems.append(f"missing: solutions/{name}")
            elif sources(committed) != sources(tmp / "solutions" / name):
                problems.append(f"differs: solutions/{name} (its cells are not what the library source gives)")
        # release from the COMMITTED solutions, as an instructor would
        shutil.rmtree(tmp / "solutions")
        shutil.copytree(ROOT / "solutions", tmp / "solutions")
        release_notebooks(tmp, chapters)
        for ch in chapters:
            name = f"ch{ch:02d}/ch{ch:02d}.ipynb"
            committed = ROOT / "exercises" / name
            fresh = tmp / "exercises" / name
            if not committed.exists():
                problems.append(f"missing: exercises/{name}")
            elif json.loads(committed.read_text()) != json.loads(fresh.read_text()):
                problems.append(f"differs: exercises/{name} (run nbgrader generate_assignment ch{ch:02d})")
    return problems
