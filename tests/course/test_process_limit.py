"""A sandbox's process limit is on top of what its user already runs.

The kernel's RLIMIT_NPROC counts every process and thread of a user, not of
a sandbox.  Where the grader is not root (an instructor's own machine), the
sandbox, bubblewrap or limits only, runs as the grader's own user, who on a
desktop already runs hundreds (a browser alone): a limit of 64 refused the
sandbox its first fork, and no archive could be graded.  Now the launcher
adds what the user runs as the sandbox starts.  Shown with a user of the
sandbox's own (the test needs root to make one) who runs more than the limit.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from attn_course import slot_user
from attn_course.sandbox import Limits, _launcher, tasks_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not slot_user.wanted(),
                                reason="a busy user of its own needs a root grader (CI runs as root)")


def test_a_sandbox_forks_whatever_its_user_already_runs():
    limits = Limits()
    user = slot_user.claim()
    assert user is not None
    busy: list[subprocess.Popen] = []
    try:
        busy = [subprocess.Popen(["sleep", "120"], user=user.uid, group=user.uid, extra_groups=[])
                for _ in range(limits.processes + 16)]
        assert tasks_of(user.uid) >= limits.processes + 16
        argv = _launcher(limits, False, None, uid=user.uid) + [
            "/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do /bin/true || exit 9; done; echo forked"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        for p in busy:
            p.kill()
            p.wait()
        user.release()
    assert r.returncode == 0 and "forked" in r.stdout, (r.returncode, r.stdout, r.stderr)
