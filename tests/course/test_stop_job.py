"""A job stopped at a limit is ended where it runs, and its server serves the next job.

A time limit, a spent budget or the process limit used to kill the whole
worker server, and the next job paid for a new one (Python, JAX, the specs
and the warm-up: 1-3 CPU-s).  Now the grader asks the server to end the job
(``{"stop": true}``); the server kills it and everything it started, empties
its sandbox, and goes on only if that left it clean.  These tests run a real
server: a job that plants a daemon, a stray process and a file, then loops
for ever, is stopped at its time limit; the next job on the same server (no
new start) finds none of it, and gets full credit for right answers.  The
same in check's sandbox (limits only) with a job that just sleeps.
"""

from __future__ import annotations

import shutil

import pytest

from attn_course import ROOT
from attn_course.registry import all_exercises
from attn_course.runner import package_files, reference_results, run_and_grade, run_worker
from attn_course.sandbox import Bubblewrap, Limits, Plain
from server_jobs import needs_bwrap
from attn_course.server import WorkerServer

EX = all_exercises()

# 3.1 plants what should outlive it, then loops for ever (until its time limit; asleep, not to burn the suite's CPU)
PLANTER = """
import os as _os, subprocess as _sp, time as _time
def log_partition_function(S, mask=None, T=1.0):
    try:
        _sp.Popen(['sleep', '4242'], start_new_session=True)
    except OSError:  # setsid refused (the seccomp filter): in the job's session
        _sp.Popen(['sleep', '4242'])
    if _os.fork() == 0:
        try: _os.setsid()  # (refused by the filter: the job's session then)
        except OSError: pass
        if _os.fork() == 0:
            while True:
                try:
                    open('/tmp/planted', 'w').write('x')
                except OSError:
                    pass
                _time.sleep(0.01)
        _os._exit(0)
    open('/tmp/planted_now', 'w').write('x')
    while True:
        _time.sleep(1)
"""

# 3.4 is right only where nothing of an earlier job is left: no file, no other process
SPY = """
import os as _os
_honest_heat_capacity = heat_capacity
def heat_capacity(S, mask=None, T=1.0):
    left = [p for p in ('/tmp/planted', '/tmp/planted_now') if _os.path.lexists(p)]
    if _os.getpid() <= 3:  # in the sandbox's own pid namespace: every process is seen
        me = {1, _os.getpid(), _os.getppid()}
        left += [p for p in _os.listdir('/proc') if p.isdigit() and int(p) not in me]
    if left:
        raise RuntimeError(f'left by an earlier job: {left}')
    return _honest_heat_capacity(S, mask, T)
"""


def _package(tmp_path, extra: str):
    dest = tmp_path / "pkg"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ROOT / "attn_tensors", dest / "attn_tensors",
                    ignore=shutil.ignore_patterns("__pycache__"))
    stat = dest / "attn_tensors" / "statmech.py"
    stat.write_text(stat.read_text() + "\n" + extra)
    return package_files(dest)


# the same without what would outlive it outside a sandbox (check's runs the student's own code,
# with limits only: a process that leaves its session is not the grader's to find)
LOOPER = """
import time as _time
def log_partition_function(S, mask=None, T=1.0):
    while True:
        _time.sleep(1)
"""


def _stopped_then_served(tmp_path, monkeypatch, sandbox, job: str, spy: str) -> None:
    """``job`` never ends: stopped at its time limit of 1 s, whatever the load; the ``spy`` job that
    follows, on the same server, has a minute (an answer takes well under a second)."""
    from attn_course import runner

    server = WorkerServer(sandbox)
    try:
        server.start()  # (a job on a server it starts has 20 s more: the start's grace)
        with monkeypatch.context() as m:
            m.setattr(runner, "FIRST_EXERCISE_GRACE_S", 0.0)
            raw = run_worker(server, _package(tmp_path, job), [(EX["3.1"], EX["3.1"].make_cases(False))],
                             Limits(per_exercise_s=1))
        assert [o.status for o in raw["3.1"]] == ["timeout"], raw["3.1"]
        assert server.starts == 1 and server.proc is not None and server.proc.poll() is None
        ex = EX["3.4"]
        cases = ex.make_cases(False)
        graded = run_and_grade(server, _package(tmp_path, spy), [(ex, cases, reference_results(ex, cases))],
                               False, set(), Limits(per_exercise_s=60))
        assert all(c.passed for c in graded["3.4"]), [c.message for c in graded["3.4"] if not c.passed]
        assert server.starts == 1  # the same server: the stopped job cost no new start
    finally:
        server.close()


@pytest.mark.slow
def test_a_job_stopped_in_bubblewrap_leaves_nothing_for_the_next_on_the_same_server(tmp_path, monkeypatch):
    needs_bwrap()
    _stopped_then_served(tmp_path, monkeypatch, Bubblewrap(7, Limits()), PLANTER, SPY)


@pytest.mark.slow
def test_a_job_stopped_in_checks_sandbox_leaves_nothing_for_the_next(tmp_path, monkeypatch):
    """check's sandbox (limits only, no pid namespace): the job's session is killed."""
    _stopped_then_served(tmp_path, monkeypatch, Plain(Limits()), LOOPER, "")


# 3.1 writes to the results channel without end: stopped at the output limit
FLOODER = """
import os as _os
def log_partition_function(S, mask=None, T=1.0):
    while True:
        _os.write(3, b'x' * 65535 + b'\\n')
"""


@pytest.mark.slow
def test_a_job_that_writes_without_end_is_stopped_and_its_server_kept(tmp_path):
    """Stopped at the output limit, the job is ended by its server, which goes on serving
    (it looks for a stop before it relays the job's next line: a flood cannot hold it)."""
    limits = Limits(per_exercise_s=60, output_mb=1)
    server = WorkerServer(Plain(limits))
    try:
        server.start()
        raw = run_worker(server, _package(tmp_path, FLOODER), [(EX["3.1"], EX["3.1"].make_cases(False))], limits)
        assert [o.status for o in raw["3.1"]] == ["crashed"] and "output limit" in raw["3.1"][0].message
        assert server.starts == 1 and server.proc is not None and server.proc.poll() is None
    finally:
        server.close()


# 3.4 signals its server (pid 1) to stop, end or be interrupted, then answers
SIGNALLER = """
import os as _os, signal as _signal
_honest_heat_capacity = heat_capacity
def heat_capacity(S, mask=None, T=1.0):
    for sig in (_signal.SIGSTOP, _signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGKILL):
        try:
            _os.kill(1, sig)
        except OSError:
            pass
    return _honest_heat_capacity(S, mask, T)
"""

# 3.4 kills its parent (the template it was forked from), then answers
PARENT_KILLER = SIGNALLER.replace("_os.kill(1, sig)", "_os.kill(_os.getppid(), sig)")

# 3.4 stops its parent (the template), then waits for ever: a stopped template reports nothing
PARENT_STOPPER = """
import os as _os, signal as _signal, time as _time
def heat_capacity(S, mask=None, T=1.0):
    _os.kill(_os.getppid(), _signal.SIGSTOP)
    _time.sleep(10 ** 6)
"""


@pytest.mark.slow
def test_in_bubblewrap_a_job_cannot_stop_or_kill_its_server(tmp_path):
    """The server is its pid namespace's init (bubblewrap's --as-pid-1): the job's signals never
    arrive, its right answers count, and the same server serves the next job.  A job that kills
    its parent (the template: not init, and it dies with it) loses only its own exercise: the next
    job runs in a new sandbox and gets its credit."""
    needs_bwrap()
    limits = Limits(per_exercise_s=20)
    server = WorkerServer(Bubblewrap(8, limits))
    ex = EX["3.4"]
    cases = ex.make_cases(False)
    expected = reference_results(ex, cases)

    def grade(source):
        return run_and_grade(server, _package(tmp_path, source), [(ex, cases, expected)], False, set(), limits)["3.4"]

    try:
        server.start()
        for _ in range(2):
            graded = grade(SIGNALLER)
            assert all(c.passed for c in graded), [c.message for c in graded if not c.passed]
        assert server.starts == 1 and server.proc.poll() is None
        assert not any(c.passed for c in grade(PARENT_KILLER))
        graded = grade("")
        assert all(c.passed for c in graded), [c.message for c in graded if not c.passed]
        # a job that stops its template is ended when the server sees it, not at its time limit
        graded = grade(PARENT_STOPPER)
        assert {c.status for c in graded} == {"crashed"}, [c.message for c in graded]
        assert all("it stopped the process it was started from" in c.message for c in graded), graded[0].message
        graded = grade("")
        assert all(c.passed for c in graded), [c.message for c in graded if not c.passed]
    finally:
        server.close()
