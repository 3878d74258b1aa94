"""Helpers the red-team files on the worker server share (not a test file).

An attack is code added to a copy of the reference library's ``statmech.py``;
it runs in a real server's job, then a spy or honest job runs on the same
server and must get full credit.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from typing import Iterator

import pytest

from attn_course import ROOT
from attn_course.registry import all_exercises
from attn_course.runner import package_files, reference_results, run_and_grade, run_worker
from attn_course.sandbox import Bubblewrap, Limits, bwrap_works
from attn_course.server import WorkerServer

EX = all_exercises()
SLOW = Limits(per_exercise_s=60)  # the spy's: an answer takes well under a second


@functools.cache
def _bwrap_works() -> bool:
    return bwrap_works()  # (asked once: each ask runs bubblewrap)


def needs_bwrap(reason: str = "needs bubblewrap") -> None:
    """Skip where bubblewrap does not work, or fail where it is required (ATTN_REQUIRE_BWRAP=1:
    ``make test`` and CI), so that no confinement test is skipped there unseen."""
    if not _bwrap_works():
        if os.environ.get("ATTN_REQUIRE_BWRAP") == "1":
            pytest.fail(f"bubblewrap is required (ATTN_REQUIRE_BWRAP=1) but does not work here ({reason})")
        pytest.skip(reason)


@contextlib.contextmanager
def started(sandbox) -> Iterator[WorkerServer]:
    """A server started in ``sandbox`` (Plain, Limited, Bubblewrap), closed after."""
    server = WorkerServer(sandbox)
    server.start()
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def fresh_server(slot: int, limits: Limits | None = None) -> Iterator[WorkerServer]:
    """A started server in bubblewrap, closed after; a new one starts by itself with the next job
    wherever an attack leaves it unclean (:func:`needs_bwrap` first)."""
    needs_bwrap()
    with started(Bubblewrap(slot, limits or Limits())) as server:
        yield server


class Unfiltered(Bubblewrap):
    """Bubblewrap as on a kernel without seccomp filters (jobs without ``--confined``): for the
    attacks the filter now refuses (sockets, for one), whose cleanup by the server beneath the
    filter is still tested."""

    def server_command(self):
        argv, env = super().server_command()
        return [a for a in argv if a != "--confined"], env


@contextlib.contextmanager
def unfiltered_server(slot: int, limits: Limits | None = None) -> Iterator[WorkerServer]:
    """:func:`fresh_server` in :class:`Unfiltered`."""
    needs_bwrap()
    with started(Unfiltered(slot, limits or Limits())) as server:
        yield server


def bwrap_server(slot: int, limits: Limits | None = None) -> Iterator[WorkerServer]:
    """:func:`fresh_server` as the body of a fixture (``yield from``)."""
    with fresh_server(slot, limits) as server:
        yield server


def spy_source(body: str) -> str:
    """A spy's code: ``entropy`` (3.2) runs ``body`` (statements that append to ``found`` what an
    earlier job left; ``_ct``, ``_os``, ``_r``, ``_struct`` and ``_time`` imported) and raises with
    it, so the case fails; else it answers honestly."""
    return (
        "import ctypes as _ct, os as _os, resource as _r, struct as _struct, time as _time\n"
        "_honest_entropy = entropy\n"
        "def _found():\n"
        "    found = []\n"
        + "".join("    " + line + "\n" for line in body.strip("\n").splitlines())
        + "    return found\n"
        "def entropy(A, mask=None):\n"
        "    found = _found()\n"
        "    if found:\n"
        "        raise RuntimeError(f'left by an earlier job: {found}')\n"
        "    return _honest_entropy(A, mask)\n"
    )


# What a probe of the kernel's calls (code added to a job's package) starts with: ``_ct``,
# ``_os``, ``_struct`` and ``_libc`` (its ``syscall`` answering a long), and three helpers
PROBE_HELPERS = r'''
import ctypes as _ct, os as _os, struct as _struct
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long


def _in_child(attempt, seconds=5):
    """attempt() in a forked process (one thread: unshare refuses more), ended after ``seconds``:
    True if it returned True."""
    pid = _os.fork()
    if pid == 0:
        try:
            import signal
            signal.alarm(seconds)
            ok = bool(attempt())
        except BaseException:
            ok = False
        _os._exit(0 if ok else 1)
    _, status = _os.waitpid(pid, 0)
    return _os.WIFEXITED(status) and _os.WEXITSTATUS(status) == 0


def _reached(nr, *args):
    """True if the raw call ran the kernel's code: anything but the seccomp filter's -1/EPERM."""
    _ct.set_errno(0)
    r = _libc.syscall(_ct.c_long(nr), *args)
    return r != -1 or _ct.get_errno() != 1


def _status(field, path="/proc/self/status"):
    for line in open(path):
        if line.startswith(field + ":"):
            return line.split()[1]
    return "?"
'''


def package(tmp_path, extra: str, name: str = "pkg") -> dict[str, str]:
    """The reference library with ``extra`` appended to its ``statmech.py``, as a job's files."""
    dest = tmp_path / name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ROOT / "attn_tensors", dest / "attn_tensors", ignore=shutil.ignore_patterns("__pycache__"))
    stat = dest / "attn_tensors" / "statmech.py"
    stat.write_text(stat.read_text() + "\n" + extra)
    return package_files(dest)


def stop(server: WorkerServer, monkeypatch, files, ex_id: str = "3.1") -> list:
    """Run ``files``' ``ex_id`` alone, stopped at 1 s (no first-exercise grace): its outcomes."""
    from attn_course import runner

    with monkeypatch.context() as m:
        m.setattr(runner, "FIRST_EXERCISE_GRACE_S", 0.0)
        raw = run_worker(server, files, [(EX[ex_id], EX[ex_id].make_cases(False))], Limits(per_exercise_s=1))
    return raw[ex_id]


@functools.cache
def _expected(ex_id: str, hidden: bool, secret: str) -> tuple:
    """An exercise's cases and the reference's results on them (computed once a process)."""
    ex = EX[ex_id]
    cases = ex.make_cases(hidden, secret)
    return ex, cases, reference_results(ex, cases)


def spy(server: WorkerServer, files, ex_id: str = "3.2", hidden: bool = False, secret: str = "") -> list[str]:
    """Grade ``files``' ``ex_id`` on ``server`` (3.2, ``entropy``: among the cheapest to trace):
    the messages of the cases that failed."""
    graded = run_and_grade(server, files, [_expected(ex_id, hidden, secret)], hidden, set(), SLOW)
    return [c.message for c in graded[ex_id] if not c.passed]


def attacked_then_spied(tmp_path, server: WorkerServer, attack: str, spy_code: str = "",
                        ex_id: str = "3.2") -> tuple[list[str], list[str]]:
    """``attack`` (module-level code in the package, ``ex_id`` graded) then ``spy_code`` (``ex_id``)
    on the same server: (the attacker's failures, the spy's failures)."""
    own_failed = spy(server, package(tmp_path, attack), ex_id)
    return own_failed, spy(server, package(tmp_path, spy_code, "spy"), ex_id)
