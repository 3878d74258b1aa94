"""`attn-course check` on a machine that is not Linux (a student's Mac), simulated here.

The worker server that `check` starts (the Plain sandbox) used Linux's own
calls: ``prctl``, ``prlimit``, the ``sched_*`` family, ``RLIMIT_MSGQUEUE``,
sequenced-packet Unix sockets and ``/proc``.  macOS has none of them.  Here
the server starts with all of them taken away (a shim run before the worker's
own code) and must still grade: the public cases of a chapter, twice on the
same server; a template that outlives its server (no death signal
there, and a datagram socket has no end of file) ends by itself, and so
does a job that spins on when its server is killed (a Ctrl-C of check).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from attn_course import ROOT, check, sandbox, workspace
from attn_course.registry import all_exercises
from attn_course.runner import Programs, package_files, run_worker
from attn_course.sandbox import GRADING_LIMITS, Plain
from attn_course.server import WorkerServer

pytestmark = pytest.mark.slow

# Run in the server before anything of the course: what macOS lacks is gone.
SHIM = r"""
import builtins, ctypes, errno, os, resource, socket
for name in ("prlimit", "RLIMIT_MSGQUEUE"):
    delattr(resource, name)
for name in ("sched_getaffinity", "sched_getscheduler", "sched_getparam"):
    delattr(os, name)
_pair = socket.socketpair
def _socketpair(family=socket.AF_UNIX, type=socket.SOCK_STREAM, proto=0):
    if type == socket.SOCK_SEQPACKET:
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")
    return _pair(family, type, proto)
socket.socketpair = _socketpair
class _NoPrctl:
    def __init__(self, real):
        self._real = real
    def __getattr__(self, name):
        if name == "prctl":
            raise AttributeError(name)
        return getattr(self._real, name)
_CDLL = ctypes.CDLL
ctypes.CDLL = lambda name, *a, **k: _NoPrctl(_CDLL(name, *a, **k)) if name is None else _CDLL(name, *a, **k)
_open, _isdir = builtins.open, os.path.isdir
def _no_proc(path):
    return isinstance(path, (str, bytes, os.PathLike)) and os.fsdecode(path).startswith("/proc")
def _open_(file, *args, **kwargs):
    if _no_proc(file):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", file)
    return _open(file, *args, **kwargs)
builtins.open = _open_
os.path.isdir = lambda path: False if _no_proc(path) else _isdir(path)
"""


class NotLinux(Plain):
    """check's sandbox, its server started with the shim first."""

    def server_command(self):
        argv, env = super().server_command()
        i = argv.index("-c")
        return [*argv[: i + 1], SHIM + "\n" + argv[i + 1], *argv[i + 2:]], env


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return _state(pid) == "Z"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_check_grades_without_linuxs_own_calls(tmp_path, monkeypatch):
    ws = workspace.create(tmp_path / "ws", "s7654321")
    chapter = [e for e in all_exercises().values() if e.id.startswith("3.")]
    monkeypatch.setattr(sandbox, "Plain", NotLinux)  # what check_server makes its server with
    for path in (ws / "attn_tensors").rglob("*.py"):  # the reference library, every stub answered
        path.write_bytes((ROOT / path.relative_to(ws)).read_bytes())
    done = check.run_check(ws, chapter)
    assert not done.library_error
    for r in done.results:
        assert r.cases and all(c.passed for c in r.cases), (r.exercise.id, r.cases)


def test_one_server_serves_job_after_job_and_its_template_ends_without_it(tmp_path):
    ex = all_exercises()["3.2"]
    cases = check.load_cases(workspace.create(tmp_path / "ws", "s7654322") / ".course" / "cases", [ex])[ex.id].cases
    server = WorkerServer(NotLinux(GRADING_LIMITS))
    try:
        for _ in range(2):
            seen = {}
            run_worker(server, package_files(ROOT), [(ex, cases)], GRADING_LIMITS,
                       on_result=lambda ex_id, outcomes: seen.update({ex_id: outcomes}), programs=Programs.EXERCISE)
            assert [o.status for o in seen[ex.id]] == ["ok"] * len(cases), seen
        assert server.starts == 1  # each job left the server clean
        pid = server.proc.pid
        (template,) = _children(pid)
        os.kill(pid, signal.SIGKILL)  # the server alone: its template is left without it
        deadline = time.monotonic() + 10
        while not _gone(template) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(template), "the template outlived its server"
    finally:
        server.close()


LOOP = "\n\ndef entropy(A, mask=None):\n    while True:\n        pass\n"


def test_a_spinning_job_ends_when_its_server_is_killed(tmp_path):
    ex = all_exercises()["3.2"]
    cases = check.load_cases(workspace.create(tmp_path / "ws", "s7654323") / ".course" / "cases", [ex])[ex.id].cases
    files = package_files(ROOT)
    files["attn_tensors/statmech.py"] += LOOP
    server = WorkerServer(NotLinux(GRADING_LIMITS))  # 30 s an exercise: far longer than this test waits
    server.start()
    (template,) = _children(server.proc.pid)
    grading = threading.Thread(target=run_worker, args=(server, files, [(ex, cases)], GRADING_LIMITS), daemon=True)
    grading.start()
    deadline = time.monotonic() + 60
    while not _children(template):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    (job,) = _children(template)
    server.close()  # check's end (a Ctrl-C): the server and its process group, not the job's own session
    try:
        deadline = time.monotonic() + 10
        while not _gone(job) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(job), "the job spun on after its server was killed"
    finally:
        try:
            os.kill(job, signal.SIGKILL)  # (when it did not end: not left spinning until its CPU limit)
        except ProcessLookupError:
            pass
    grading.join(timeout=30)
