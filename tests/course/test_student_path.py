"""A new student's path, end to end, through the `attn-course` command.

Fresh workspace -> every check fails as "not implemented yet" (never a
crash) -> implement exercise 3.1 -> it passes -> a submission archive whose
manifest lists the student, the assignment, the library version and the
hash of every file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attn_course.registry import all_exercises

pytestmark = pytest.mark.slow

# A student's answer to 3.1, written from the formula (it calls no other stub).
ANSWER_3_1 = '''\
    check_temperature(T, xp)
    s = S / T
    if mask is not None:
        s = xp.where(mask, s, -xp.inf)
    m = xp.stop_gradient(xp.max(s, axis=-1, keepdims=True))
    m = xp.where(xp.isfinite(m), m, 0.0)
    z = xp.sum(xp.exp(s - m), axis=-1, keepdims=True)
    alive = z > 0
    log_Z = xp.where(alive, xp.log(xp.where(alive, z, 1.0)) + m, -xp.inf)
    return log_Z[..., 0]
'''


def course(*args, cwd):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    return subprocess.run([sys.executable, "-m", "attn_course.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_fresh_workspace_to_submission(tmp_path):
    ws = tmp_path / "ws"
    r = course("workspace", str(ws), "--student", "s1234567", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (ws / "attn_tensors" / "statmech.py").exists() and (ws / "course.json").exists()
    assert sorted(p.name for p in (ws / "notebooks").glob("*.ipynb"))[:1] == ["ch01.ipynb"]

    # a second workspace in the same folder is refused, and nothing is touched
    before = (ws / "course.json").read_text()
    r = course("workspace", str(ws), "--student", "someone", cwd=tmp_path)
    assert r.returncode == 2 and "already has files" in r.stderr
    assert (ws / "course.json").read_text() == before

    # untouched: every exercise is "not implemented yet", and no traceback
    r = course("check", "all", cwd=ws)
    assert r.returncode == 1
    assert "Traceback" not in r.stdout + r.stderr
    n = len(all_exercises())
    assert r.stdout.count("[ TODO]") == n, r.stdout
    assert r.stdout.count("not implemented yet") == n
    assert f"Progress: 0/{n} exercises" in r.stdout

    # implement 3.1 in the stubbed module
    path = ws / "attn_tensors" / "statmech.py"
    src = path.read_text()
    stub = re.search(r"^    raise NotImplementedError\('Exercise 3\.1: .*\n", src, re.M)
    assert stub, "the 3.1 stub line"
    path.write_text(src[: stub.start()] + ANSWER_3_1 + src[stub.end():])

    r = course("check", "3.1", cwd=ws)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[ PASS] Exercise 3.1" in r.stdout
    assert f"Progress: 1/{n} exercises" in r.stdout

    # the same answer on MLX arrays (Apple Silicon; mlx[cpu] on Linux), as the README says
    if importlib.util.find_spec("mlx") is not None:
        r = course("check", "3.1", "--backend", "mlx", cwd=ws)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "[ PASS] Exercise 3.1" in r.stdout and "Traceback" not in r.stdout + r.stderr

    r = course("check", "3", cwd=ws)
    assert r.returncode == 1 and "[ PASS] Exercise 3.1" in r.stdout and "[ TODO] Exercise 3.2" in r.stdout

    # the public tests in the workspace agree
    t = subprocess.run([sys.executable, "-m", "pytest", "-m", "ex3_1", "-p", "no:cacheprovider"],
                       cwd=ws, capture_output=True, text=True, timeout=600)
    assert t.returncode == 0, t.stdout + t.stderr
    assert "1 passed" in t.stdout

    # hand in
    r = course("submit", cwd=ws)
    assert r.returncode == 0, r.stderr
    archive = Path(r.stdout.split("Wrote ", 1)[1].strip())
    with zipfile.ZipFile(archive) as z:
        manifest = json.loads(z.read("manifest.json"))
        assert manifest["student_id"] == "s1234567"
        assert manifest["assignment"] == "attn-tensors-library"
        assert manifest["library_version"]
        assert "attn_tensors/statmech.py" in manifest["files"]
        for name, digest in manifest["files"].items():
            assert hashlib.sha256(z.read(name)).hexdigest() == digest, name
        assert ANSWER_3_1 in z.read("attn_tensors/statmech.py").decode()
    # a second submission is a new archive; the first is kept
    r2 = course("submit", cwd=ws)
    assert r2.returncode == 0 and archive.exists()


def test_bad_student_id_and_no_workspace(tmp_path):
    r = course("workspace", str(tmp_path / "w"), "--student", "../evil", cwd=tmp_path)
    assert r.returncode == 2 and "student id" in r.stderr
    r = course("check", "3.1", cwd=tmp_path)
    assert r.returncode == 2 and "not inside a workspace" in r.stderr
    r = course("check", "42.1", "--workspace", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2
    r = course("grade", str(tmp_path / "nowhere"), "--out", str(tmp_path / "g"), cwd=tmp_path)
    assert r.returncode == 2 and "no folder of submissions" in r.stderr
