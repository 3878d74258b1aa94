"""A job loads the stub release's compiled modules where its own are the release's, byte for byte.

The sandbox's copy of the course holds the release's modules compiled
(:func:`attn_course.sandbox._stage_release_bytecode`, hash-checked bytecode,
PEP 552); the server puts each beside the job's module of the same source
(:func:`attn_course.worker.place_release_bytecode`).  What must hold: a module
that differs from the release's in any byte is the job's own, compiled from
its own source; the bytecode's code is the job's file (the watch's test of
the job's own code reads it); and the bytecode is used where it may be.
"""

from __future__ import annotations

import json
import subprocess
import sys

from attn_course import RELEASE_LIBRARY, ROOT
from attn_course.runner import package_files, run_and_grade
from attn_course.sandbox import _stage_release_bytecode
from attn_course.worker import _write_package, place_release_bytecode
from tests.course.server_jobs import SLOW, _expected, fresh_server, package, spy

# Imports the package under the folder argv[1] as a job does (-B: no bytecode written), with each
# module compiled from source recorded: what was compiled, and each module's code file name.
IMPORT = r"""
import importlib._bootstrap_external as ext, json, sys
compiled = []
real = ext.SourceLoader.source_to_code
def source_to_code(self, data, path, *, _optimize=-1):
    compiled.append(path.rsplit("/", 1)[-1])
    return real(self, data, path, _optimize=_optimize)
ext.SourceLoader.source_to_code = source_to_code
sys.path.insert(0, sys.argv[1])
import attn_tensors.backend, attn_tensors._checks
print(json.dumps({"compiled": sorted(compiled), "files": [attn_tensors.backend.to_numpy.__code__.co_filename,
                  attn_tensors._checks.__file__], "mark": getattr(attn_tensors.backend, "MARK", None)}))
"""


def _job_folder(tmp_path, files: dict[str, str]):
    staged = tmp_path / "staged"
    if not staged.exists():
        _stage_release_bytecode(staged)
    pkg = tmp_path / "pkg"
    _write_package(files, pkg)
    return pkg, place_release_bytecode(files, pkg, staged)


def _imported(pkg) -> dict:
    out = subprocess.run([sys.executable, "-B", "-c", IMPORT, str(pkg)], cwd=pkg, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_release_modules_load_from_the_staged_bytecode_and_are_the_jobs_files(tmp_path):
    release = package_files(RELEASE_LIBRARY)
    pkg, placed = _job_folder(tmp_path, release)
    assert sorted(placed) == sorted(release), sorted(set(release) - set(placed))
    got = _imported(pkg)
    assert got["compiled"] == [], got  # none compiled: each module's bytecode was the release's
    # the code is the job's file, not the release's nor the staged copy's (the watch reads it)
    assert got["files"] == [str(pkg / "attn_tensors" / "backend.py"), str(pkg / "attn_tensors" / "_checks.py")], got


def test_a_module_that_differs_in_one_byte_is_compiled_from_its_own_source(tmp_path):
    files = dict(package_files(RELEASE_LIBRARY))
    files["attn_tensors/backend.py"] += "\nMARK = 'own'\n"
    pkg, placed = _job_folder(tmp_path, files)
    assert "attn_tensors/backend.py" not in placed and "attn_tensors/_checks.py" in placed
    got = _imported(pkg)
    assert got["compiled"] == ["backend.py"] and got["mark"] == "own", got
    # and where the bytecode of the release is planted anyway (a job writes its own folder), Python
    # checks it against the source: the job's own source still wins
    staged = tmp_path / "staged" / "attn_tensors" / "__pycache__"
    for pyc in staged.glob("backend.*.pyc"):
        (pkg / "attn_tensors" / "__pycache__" / pyc.name).write_bytes(pyc.read_bytes())
    got = _imported(pkg)
    assert got["compiled"] == ["backend.py"] and got["mark"] == "own", got


def test_a_job_on_a_server_runs_its_own_module_where_it_differs_and_the_release_where_it_does_not(tmp_path):
    """On a real server in bubblewrap: the reference library (three of its modules the release's)
    gets full credit, its release modules loaded from the bytecode (the job looks for it beside
    them); a package whose ``_checks.py`` differs from the release's runs that module's own code."""
    assert package_files(ROOT)["attn_tensors/_checks.py"] == package_files(RELEASE_LIBRARY)["attn_tensors/_checks.py"]
    looks = ("import importlib.util as _u, os as _o, attn_tensors._checks as _c\n"
             "_honest = entropy\n"
             "def entropy(A, mask=None):\n"
             "    if not _o.path.exists(_u.cache_from_source(_c.__file__)):\n"
             "        raise RuntimeError('no bytecode beside _checks.py')\n"
             "    return _honest(A, mask)\n")
    with fresh_server(96) as server:
        ran: list = []
        ex, cases, expected = _expected("3.2", False, "")
        graded = run_and_grade(server, package(tmp_path, looks), [(ex, cases, expected)], False, set(), SLOW, ran=ran)
        assert [c.message for c in graded["3.2"] if not c.passed] == []
        # loading the release's code is not code of the job's making (red team, round 18: the watch
        # flagged every honest job "code objects", and a job's own later such code hid behind it)
        assert ran == [], ran
        own = package(tmp_path, "", "own")
        own["attn_tensors/_checks.py"] += "\nraise RuntimeError('the checks of its own')\n"
        failed = spy(server, own)
    assert failed and all("the checks of its own" in m for m in failed), failed
