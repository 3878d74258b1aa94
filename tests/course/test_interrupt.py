"""Ctrl-C during a run of the grader: a KeyboardInterrupt, whenever it comes (:mod:`attn_course.interrupt`).

Python raises the interrupt wherever the main thread is; inside a condition's
wait, after the wait let go of its lock and before it took it back, the
interrupt became ``RuntimeError: release unlocked lock`` (a loaded run of the
suite, ``test_ctrl_c_stops_within_seconds_and_keeps_finished_results``).
Here that moment is made certain: SIGINT is raised as a condition's wait of
the main thread is about to take its lock back.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from contextlib import contextmanager

import pytest

from attn_course.grade import Grader
from attn_course.interrupt import Interrupts
from attn_course.results import ArchiveResult


@contextmanager
def _python_sigint():
    """Python's own SIGINT handler for the test (a pytest worker may have another)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_interrupt_in_a_deferred_region_is_raised_at_its_end():
    it = Interrupts()
    reached = []
    with _python_sigint(), it.handled():
        with pytest.raises(KeyboardInterrupt):
            with it.deferred():
                signal.raise_signal(signal.SIGINT)
                time.sleep(0.05)  # the handler has run by now
                reached.append("end of the region")
        assert reached == ["end of the region"]
        with pytest.raises(KeyboardInterrupt):  # outside a region: at once
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.05)
            reached.append("after the signal")
    assert reached == ["end of the region"]
    assert signal.getsignal(signal.SIGINT) is not it._handle  # handed back


def test_ctrl_c_as_the_pools_wait_takes_its_lock_back_stops_the_run(tmp_path, monkeypatch):
    """The grader's local pool, its archives stood in for: none finishes until SIGINT has come at
    the worst moment of the main thread's wait on them (as the wait takes its lock back), whatever
    the machine's load; the run ends in a KeyboardInterrupt."""
    monkeypatch.setenv("ATTN_COURSE_SECRET", "interrupt-test-secret")
    subs = tmp_path / "subs"
    subs.mkdir()
    for k in range(4):
        (subs / f"s{k}.zip").write_bytes(b"not read")
    g = Grader(tmp_path / "out", "3.5", jobs=2, log=lambda *a: None)
    fired = threading.Event()

    def grade_one(archive, slot, received=None):
        fired.wait(60)
        return ArchiveResult(archive.name, "", g.fingerprint, ["3.5"], scores={"3.5": 0.0})

    for name, stand_in in (("prepare", lambda: None), ("start_workers", lambda *a, **k: None),
                           ("worth_warming", lambda *a: False), ("warm_after_job", lambda *a: None),
                           ("grade_one", grade_one)):
        monkeypatch.setattr(g, name, stand_in)
    restore = threading.Condition._acquire_restore  # (a condition on a plain lock, as an Event's)

    def racy(self, x):
        if (threading.current_thread() is threading.main_thread() and not fired.is_set()
                and any(f.name == "wait" and f.filename.endswith(os.path.join("concurrent", "futures", "_base.py"))
                        for f in traceback.extract_stack())):
            fired.set()
            signal.raise_signal(signal.SIGINT)  # the handler runs before the lock is taken back
        return restore(self, x)

    monkeypatch.setattr(threading.Condition, "_acquire_restore", racy)
    with _python_sigint(), pytest.raises(KeyboardInterrupt):
        g.run(subs)
    assert fired.is_set()
