"""A class graded by an instructor who is not root, end to end, with a hostile archive.

CI runs as root, and so did every other test of `attn-course grade`; most
instructors grade as an ordinary user.  Here the grader itself runs as
``nobody`` (from root: in a mount namespace of its own where the folders
above Python and the course that only root may pass are covered, and the
sources bound again; otherwise as the user running the tests).  Either the
batch is graded in bubblewrap, and the hostile archive's attempts on the
grading folder, the grader's home and cache, the other archives and the
grader's processes leave no trace; or the grader refuses the batch, saying
why, and runs nothing (a grader that is not root, with limits only, would
run jobs as its own user, who owns the gradebook).  ``--no-bwrap`` is
refused as well, unless the instructor trusts the archives
(``--unconfined``).
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from attn_course import RELEASE_LIBRARY, ROOT
from attn_course.archive import build_archive, library_files
from attn_course.identity import token_for
from attn_course.limit import closed_above

pytestmark = pytest.mark.slow

SECRET = "not-root-secret"
NOBODY = 65534

HOSTILE = '''

import os as _os
import signal as _signal


def _trace(what):
    """Try to leave a mark where a job must never write; and read what it must never read."""
    for folder in {folders!r}:
        try:
            with open(_os.path.join(folder, "planted-" + what), "w") as f:
                f.write(_os.environ.get("ATTN_COURSE_SECRET", "no secret"))
        except OSError:
            pass
    for path in {secrets!r}:
        try:
            raise RuntimeError("read " + open(path, "rb").read(200).hex())
        except OSError:
            pass


def log_partition_function(S, mask=None, T=1.0):
    _trace("log-partition")
    raise RuntimeError("the secret: " + _os.environ.get("ATTN_COURSE_SECRET", "none"))


def zero_temperature_limit(S, mask=None):
    _trace("zero-temperature")
    _os.kill(-1, _signal.SIGKILL)  # every process this job may signal: the grader's too, if it may
'''


def _tools() -> None:
    if os.geteuid() == 0 and not all(shutil.which(t) for t in ("unshare", "setpriv", "mount")):
        pytest.skip("needs util-linux's unshare, setpriv and mount to grade as a user who is not root")


def _as_not_root(argv: list[str], env: dict[str, str], home: Path) -> list[str]:
    """``argv`` as ``nobody`` where this is root (a shell command in a mount namespace of its own
    that lets nobody reach Python and the course), else as it is."""
    if os.geteuid() != 0:
        return argv
    sources = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, str(ROOT),
                                                    str(Path(sys.executable).resolve().parents[1]))})
    sources = [s for s in sources if not any(s != o and s.startswith(o + "/") for o in sources)]
    covers = sorted({c for c in (closed_above(s + "/x") for s in sources) if c})
    stage = Path(tempfile.mkdtemp(prefix="stage-", dir=home))
    lines = ["set -e"]
    held = []
    for k, source in enumerate(sources):
        if not any(source.startswith(c + "/") for c in covers):
            continue
        point = stage / str(k)
        point.mkdir()
        held.append((source, point))
        lines.append(f"mount --bind {shlex.quote(source)} {shlex.quote(str(point))}")
    for cover in covers:
        lines.append(f"mount -t tmpfs -o mode=755,size=1m tmpfs {shlex.quote(cover)}")
    for source, point in held:
        lines.append(f"mkdir -p {shlex.quote(source)} && mount --bind {shlex.quote(str(point))} {shlex.quote(source)}")
    variables = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    lines.append(f"exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups env -i {variables} "
                 + " ".join(shlex.quote(a) for a in argv))
    return ["unshare", "-m", "--propagation", "private", "bash", "-c", "\n".join(lines)]


@pytest.fixture
def place():
    """A folder nobody owns and reaches (not the test's tmp_path, which only root may pass)."""
    folder = Path(tempfile.mkdtemp(prefix="not-root-", dir="/tmp"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _class(place: Path) -> tuple[Path, Path, Path]:
    subs, out, home = place / "submitted", place / "grading", place / "home"
    subs.mkdir()
    home.mkdir()
    cache = home / ".cache"
    ref, stub = library_files(ROOT), library_files(RELEASE_LIBRARY)
    build_archive(subs / "honest.zip", "honest", ref, token=token_for("honest", SECRET))
    build_archive(subs / "stub.zip", "stub", stub, token=token_for("stub", SECRET))
    hostile = dict(ref)
    code = HOSTILE.format(folders=[str(place), str(out), str(out / "results"), str(home), str(cache), str(subs)],
                          secrets=[str(subs / "honest.zip"), str(out / "gradebook.csv"), "/proc/1/environ"])
    hostile["attn_tensors/statmech.py"] = ref["attn_tensors/statmech.py"] + code.encode()
    build_archive(subs / "hostile.zip", "hostile", hostile, token=token_for("hostile", SECRET))
    if os.geteuid() == 0:
        for path in [place, *place.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
    return subs, out, home


def _grade(place: Path, *options: str) -> subprocess.CompletedProcess:
    subs, out, home = place / "submitted", place / "grading", place / "home"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(home),
           "XDG_CACHE_HOME": str(home / ".cache"), "ATTN_COURSE_SECRET": SECRET, "PYTHONHASHSEED": "0"}
    argv = [sys.executable, "-m", "attn_course.cli", "grade", str(subs), "--out", str(out),
            "--exercises", "3", *options]
    if os.geteuid() != 0:
        env = dict(os.environ, **env)
    return subprocess.run(_as_not_root(argv, env, home), capture_output=True, text=True, timeout=900,
                          cwd=str(place))


def _traces(place: Path) -> list[str]:
    return sorted(str(p.relative_to(place)) for p in place.rglob("planted-*"))


def test_a_grader_that_is_not_root_confines_a_hostile_archive_or_refuses(place):
    _tools()
    _class(place)
    r = _grade(place)
    out = place / "grading"
    assert _traces(place) == [], r.stderr[-2000:]
    if r.returncode == 2:  # bubblewrap does not start for this user here: nothing may run, and it says why
        assert "bubblewrap is not available" in r.stderr and "--unconfined" in r.stderr, r.stderr[-2000:]
        assert not (out / "results").exists()
        return
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[3/3]" in r.stdout, r.stdout
    rows = {row["student_id"]: row for row in csv.DictReader(open(out / "gradebook.csv"))}
    assert rows["honest"]["total"] == rows["honest"]["max"] == "12"
    assert rows["stub"]["total"] == "0"
    assert rows["hostile"]["3.1"] == "0" and rows["hostile"]["3.5"] == "0" and rows["hostile"]["3.2"] == "3"
    results = [json.loads(p.read_text()) for p in (out / "results").glob("*.json")]
    assert {res["sandbox"] for res in results} == {"bubblewrap"}
    feedback = (out / "feedback" / "hostile.md").read_text()
    assert SECRET not in feedback and "the secret: none" in feedback.replace("\\", "")
    assert "read " not in feedback.replace("\\", "")  # no file of the grader's or the class's was read


def test_limits_only_as_a_user_who_is_not_root_is_refused_unless_trusted(place):
    _tools()
    _class(place)
    r = _grade(place, "--no-bwrap")
    assert r.returncode == 2, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("attn-course: --no-bwrap") and "can read, write and signal what this user can" in line
    assert "--unconfined grades anyway" in line and "Traceback" not in r.stderr
    assert not (place / "grading").exists() and _traces(place) == []
    # trusted archives (here the honest one alone) are graded, with the warning's words
    (place / "submitted" / "hostile.zip").unlink()
    r = _grade(place, "--no-bwrap", "--unconfined")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["student_id"]: row for row in csv.DictReader(open(place / "grading" / "gradebook.csv"))}
    assert rows["honest"]["total"] == "12" and rows["stub"]["total"] == "0"
