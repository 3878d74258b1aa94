"""The students' wheel: the tools and the release, never the reference or the grader."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attn_course import EXERCISES
from attn_course.regions import BEGIN
from attn_course.student_dist import NEVER_SHIPPED, StudentDistError, build, student_modules


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("dist")).wheel


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    """The wheel unpacked, as pip would lay it out in site-packages."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def test_no_reference_solution_grader_or_catalogue_inside(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        texts = {n: z.read(n).decode(errors="replace") for n in names if n.endswith((".py", ".ipynb"))}
    assert not [n for n in names if n.startswith("attn_tensors/")], "the reference library is inside"
    modules = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in names
               if n.startswith("attn_course/") and n.endswith(".py") and "release_data" not in n}
    assert not [m for m in modules if any(m == b or m.startswith(b + ".") for b in NEVER_SHIPPED)]
    region = re.compile(BEGIN.pattern, re.M)
    assert not [n for n, t in texts.items() if "/release_data/" in n and region.search(t)]
    assert any(region.search(t) for n, t in texts.items() if n == "attn_course/regions.py")  # the probe works
    assert not [n for n in names if n.startswith(("solutions/", "attn_course/mistakes"))]
    # the release is inside, whole: the stubbed library and the public cases
    released = {str(p.relative_to(EXERCISES)) for p in EXERCISES.rglob("*") if p.is_file()
                and "__pycache__" not in p.parts and not p.name.startswith(".")}
    inside = {n.split("release_data/", 1)[1] for n in names if "/release_data/" in n}
    assert inside == released


def test_an_existing_wheel_is_never_overwritten(wheel):
    before = wheel.read_bytes()
    with pytest.raises(StudentDistError, match="exists"):
        build(wheel.parent)
    assert wheel.read_bytes() == before


def test_the_wheel_records_every_file_with_its_hash(wheel):
    import base64
    import hashlib

    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        rows = [r.split(",") for r in z.read(record).decode().splitlines()]
        for name, digest, size in rows:
            if name == record:
                continue
            data = z.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data), name
        assert {r[0] for r in rows} == set(z.namelist())


def test_a_trusted_import_from_a_student_module_is_refused(monkeypatch):
    """Were check to import the catalogue, the wheel would ship it: build says so instead."""
    import attn_course.student_dist as sd

    real = sd._imports

    def leaky(name, path):
        found = real(name, path)
        return found | {"attn_course.mistakes"} if name == "attn_course.check" else found

    monkeypatch.setattr(sd, "_imports", leaky)
    with pytest.raises(StudentDistError, match="attn_course.mistakes"):
        student_modules()


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # -I and only the wheel's folder first on sys.path; the dev venv's editable install of
    # the whole repository (a meta-path finder) is taken out, as a student has none.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, '__module__', '').startswith('__editable__')]; "
            "import attn_course; "
            "assert attn_course.__file__.startswith(sys.argv[1]), attn_course.__file__; "
            "from attn_course.cli import main; sys.exit(main(sys.argv[2:]))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTN_COURSE_SECRET")}
    return subprocess.run([sys.executable, "-I", "-c", code, str(site), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_student_works_from_the_wheel_alone(site, tmp_path):
    """Workspace, check and the refusal of instructors' commands, with only the wheel's attn_course."""
    ws = tmp_path / "work"
    r = _run(site, tmp_path, "workspace", str(ws), "--student", "s01")
    assert r.returncode == 0, r.stderr
    assert (ws / "attn_tensors" / "bilinear.py").is_file()
    r = _run(site, ws, "check", "1.1")
    assert "not implemented" in r.stdout, r.stdout + r.stderr
    r = _run(site, tmp_path, "grade", str(tmp_path), "--out", str(tmp_path / "g"), "--ci-secret")
    assert r.returncode == 2 and "instructor" in r.stderr, r.stderr
