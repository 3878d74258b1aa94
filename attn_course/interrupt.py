"""Ctrl-C while the grader waits on its threads: raised where it is safe to raise.

Python raises :class:`KeyboardInterrupt` wherever the main thread is when
SIGINT arrives.  Inside ``threading.Condition.wait`` (under
``concurrent.futures.wait``, and Dask's ``Future.result``) that can be after
the wait has let go of its lock and before it takes it back; the ``with``
around the wait then raises ``RuntimeError: release unlocked lock`` in place
of the interrupt, and ``attn-course grade`` ended with that traceback and
status 1, instead of stopping its workers and exiting with 130 (seen in a
loaded run of the test suite).

While :meth:`Interrupts.handled` is on (the grader's run, in the main
thread), an interrupt that comes inside :meth:`Interrupts.deferred` (a wait
of the main thread on the workers' threads, bounded) is raised as that
region ends; anywhere else at once, as Python does.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


class Interrupts:
    """SIGINT for one run of the grader (one object per :class:`attn_course.grade.Grader`)."""

    def __init__(self) -> None:
        self.pending = False  # an interrupt came inside a deferred region
        self._depth = 0  # deferred regions the main thread is in

    def _handle(self, signum, frame) -> None:
        if self._depth:
            self.pending = True
        else:
            raise KeyboardInterrupt

    @contextmanager
    def handled(self) -> Iterator[None]:
        """SIGINT goes through this object while on: only in the main thread, and only where
        Python's own handler is in place (a program that set its own keeps it)."""
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handle)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
            self.pending = False

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """An interrupt inside is raised as the region ends (the main thread's regions only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self.pending and not self._depth:
            self.pending = False
            raise KeyboardInterrupt
