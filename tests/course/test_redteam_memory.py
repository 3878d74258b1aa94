"""A job's memory, summed over its processes, is capped where a memory cgroup can be made.

The address-space limit is per process: a job that forks as many processes
as the process limit allows, each under that limit, could hold 64 times it
and take the machine's memory from every other slot and from the grader.
Each slot's sandbox has a memory group (root, cgroup v1 or v2): at its limit
the kernel kills one of its processes, the job's first (they rank first for
the OOM killer); the runner names the limit and blames
the exercise, and the next job on the slot is graded as usual.
"""

from __future__ import annotations

import functools

import pytest

from attn_course.runner import run_and_grade
from attn_course.sandbox import Limits, SlotGroups

from server_jobs import _expected, fresh_server, package

pytestmark = pytest.mark.slow

# six processes of 160 MB each, every one far under the address-space limit, hold 960 MB together
HOARD = """
import os as _os, time as _time
_honest_entropy = entropy


def entropy(A, mask=None):
    kids = []
    for _ in range(6):
        pid = _os.fork()
        if pid == 0:
            b = bytearray(160 * 2**20)
            for i in range(0, len(b), 4096):  # (calloc's pages are the kernel's zero page until written)
                b[i] = 1
            _time.sleep(2)
            _os._exit(0)
        kids.append(pid)
    for pid in kids:
        _os.waitpid(pid, 0)
    return _honest_entropy(A, mask)
"""
CAPPED = Limits(per_exercise_s=60, total_memory_mb=512)


@functools.cache
def _memory_counted() -> bool:
    groups = SlotGroups(0, CAPPED)
    try:
        return groups.oom_events is not None
    finally:
        groups.remove()


def _grade(server, files, limits: Limits):
    return run_and_grade(server, files, [_expected("3.2", False, "")], False, set(), limits)["3.2"]


def test_processes_that_together_pass_the_memory_limit_are_stopped_by_its_name(tmp_path):
    if not _memory_counted():
        pytest.skip("no memory cgroup can be made here (not root, or no memory controller)")
    with fresh_server(71, CAPPED) as server:
        hoarded = _grade(server, package(tmp_path, HOARD), CAPPED)
        assert server.sandbox.memory_kills() >= 1
        honest = _grade(server, package(tmp_path, "", "honest"), CAPPED)  # the next job on the slot
    assert hoarded and all(not c.passed for c in hoarded), hoarded
    assert any("more than 512 MB of memory (memory limit)" in c.message for c in hoarded), hoarded
    assert honest and all(c.passed for c in honest), [c.message for c in honest if not c.passed]


def test_without_the_memory_group_the_same_processes_hold_it_all(tmp_path):
    """The control: with no cap, the six processes hold 960 MB together and the answer is graded right."""
    uncapped = Limits(per_exercise_s=60, total_memory_mb=0)
    with fresh_server(72, uncapped) as server:
        assert server.sandbox.groups.oom_events is None
        hoarded = _grade(server, package(tmp_path, HOARD), uncapped)
    assert hoarded and all(c.passed for c in hoarded), [c.message for c in hoarded if not c.passed]


def test_tcp_buffers_count_against_the_group_on_cgroup_v1():
    """Loopback TCP buffers escape a v1 memory group unless they have a limit of their own (the red
    team queued 1 GB beside a 512 MB cap where the filter was missing; the filter refuses sockets
    now).  With it, such a job's TCP buffers peaked at the group's limit (256 MB, measured by hand:
    a 50 s attack, too slow and too machine-wide to be a test)."""
    if not _memory_counted():
        pytest.skip("no memory cgroup can be made here (not root, or no memory controller)")
    groups = SlotGroups(0, CAPPED)
    try:
        group = groups.oom_events.parent
        tcp = group / "memory.kmem.tcp.limit_in_bytes"
        if not tcp.exists():
            pytest.skip("cgroup v2 (socket memory is counted as memory there) or no kmem accounting")
        assert int(tcp.read_text()) == CAPPED.total_memory_mb * 2**20
        assert int((group / "memory.limit_in_bytes").read_text()) == CAPPED.total_memory_mb * 2**20
    finally:
        groups.remove()
