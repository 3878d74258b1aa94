"""What a grader process leaves in the temporary directory is removed, even when it was killed.

Each process's folders live in one folder of its own, locked while it lives
(:mod:`attn_course.run_dir`).  Killed processes' folders are swept; a living
process's, another user's, a link and a folder that was never locked are not.
The children here use a temporary directory of the test's own (``TMPDIR``),
so no other process of the suite sweeps them meanwhile.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attn_course import ROOT
from attn_course.run_dir import LOCK, PREFIX, run_dir, sweep
from attn_course.sandbox import Limited, worker_course

CHILD = """
import os, sys
from pathlib import Path
from attn_course.run_dir import run_dir
p = run_dir()
(p / "submission.zip").write_bytes(b"a student's bytes")
ro = p / "course"
ro.mkdir()
(ro / "m.py").write_text("")
os.chmod(ro / "m.py", 0o444)
os.chmod(ro, 0o555)  # as the worker's course modules: the sweep must still remove them
print(p, flush=True)
how = sys.argv[1]
if how == "kill":
    os.kill(os.getpid(), 9)
elif how == "wait":
    sys.stdin.read()
elif how == "fork":
    pid = os.fork()
    if pid == 0:
        print(run_dir(), flush=True)  # the child's own folder, not its parent's
        sys.exit(0)  # through Python: its exit must not remove the parent's folder
    os.waitpid(pid, 0)
    print(int(p.exists()), flush=True)
    os.kill(os.getpid(), 9)
"""


def _child(how: str, tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", CHILD, how], env=env, cwd=tmp, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_a_killed_process_folder_is_swept_and_a_living_ones_is_not(tmp_path):
    ended = _child("exit", tmp_path)
    gone = Path(ended.stdout.readline().strip())
    assert ended.wait(30) == 0
    assert not gone.exists()  # an ordinary exit removes its own folder
    living = _child("wait", tmp_path)
    alive = Path(living.stdout.readline().strip())
    killed = _child("kill", tmp_path)  # (its first use of run_dir sweeps: nothing to sweep yet)
    dead = Path(killed.stdout.readline().strip())
    assert killed.wait(30) == -signal.SIGKILL
    assert dead.parent == alive.parent == tmp_path and dead.name.startswith(PREFIX)
    assert (dead / "submission.zip").exists()  # what a killed process leaves ...

    # what is not a dead grader's: a link to a folder with a free lock, a folder never locked,
    # and (as root) another user's folder with a free lock
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / LOCK).write_text("")
    (tmp_path / f"{PREFIX}link").symlink_to(target)
    (tmp_path / f"{PREFIX}unlocked").mkdir()
    others = tmp_path / f"{PREFIX}other-user"
    others.mkdir()
    (others / LOCK).write_text("")
    if os.geteuid() == 0:
        os.chown(others, 12345, 12345)

    removed = sweep(str(tmp_path))
    assert removed == [str(dead)] and not dead.exists()  # ... the next process's sweep removes
    assert alive.exists() and (alive / "submission.zip").exists()
    assert (target / LOCK).exists() and (tmp_path / f"{PREFIX}unlocked").exists()
    assert others.exists() or os.geteuid() != 0
    living.stdin.close()
    assert living.wait(30) == 0 and not alive.exists()
    assert sweep(str(tmp_path)) == []


def test_a_forked_child_has_its_own_folder(tmp_path):
    parent = _child("fork", tmp_path)
    own = Path(parent.stdout.readline().strip())
    childs = Path(parent.stdout.readline().strip())
    kept = parent.stdout.readline().strip()
    assert parent.wait(30) == -signal.SIGKILL
    assert childs != own and childs.parent == tmp_path and not childs.exists()
    assert kept == "1"  # the child's exit left the parent's folder alone
    assert sweep(str(tmp_path)) == [str(own)]


@pytest.mark.parametrize("where", ["worker course", "job scratch"])
def test_what_the_grader_makes_lives_in_its_process_folder(where):
    if where == "worker course":
        path = Path(worker_course())
    else:
        sandbox = Limited()
        try:
            _, env = sandbox.server_command()
            path = Path(env["HOME"])
        finally:
            sandbox.close()
    assert path.is_relative_to(run_dir()), path


def test_the_worker_course_is_compiled_where_a_server_cannot_write():
    """A server runs with ``-B`` from a read-only copy: each module comes from the bytecode staged
    beside it (none compiled again at every start), and nothing there can be written."""
    course = Path(worker_course())
    code = (f"import sys; sys.path.insert(0, {str(course.parent)!r}); "
            "import attn_course.worker, attn_course.watch, attn_course.registry; "
            "attn_course.registry.all_exercises()")
    r = subprocess.run([sys.executable, "-I", "-B", "-v", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    staged = sorted(course.rglob("*.py"))
    loaded = {line.split("code object from ", 1)[1].strip(" '") for line in r.stderr.splitlines()
              if "code object from " in line and str(course) in line}
    imported = {p for p in staged if f"matches {p}" in r.stderr}
    assert len(imported) >= 10, sorted(imported)  # the worker's own modules and the specs it registers
    for source in imported:
        pyc = importlib.util.cache_from_source(str(source))
        assert pyc in loaded, (source, sorted(loaded))
    for path in [course, *course.rglob("*")]:
        assert not path.stat().st_mode & 0o222, path  # read-only, bytecode included
