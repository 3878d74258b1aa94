"""A sandbox's cgroups: its processes counted, its CPU capped at ``Limits.cores``, and removed after.

Where the grader cannot make cgroups (not root, no delegation) the sandbox has
none and these tests skip; CI runs as root.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attn_course import sandbox
from attn_course.sandbox import Limited, Limits, SlotGroups, _launcher

BUSY = ("import os, time\n"
        "os.fork()  # two processes, each busy for 1.5 s of wall time\n"
        "t = time.monotonic()\n"
        "while time.monotonic() - t < 1.5:\n    pass\n")


def _groups_or_skip(limits: Limits) -> SlotGroups:
    groups = SlotGroups(0, limits)
    if not groups.paths:
        pytest.skip("no cgroups can be made here")
    return groups


def test_a_slot_is_capped_at_its_cores_and_its_groups_go_when_it_closes():
    limits = Limits(cores=1, processes=16)
    groups = _groups_or_skip(limits)
    cpu = [g for g in groups.paths if (g / "cpu.cfs_quota_us").exists() or (g / "cpu.max").exists()]
    if not cpu:
        groups.remove()
        # as root on cgroup v1 (CI) the CPU group must be there; elsewhere it may not be delegated
        assert not Path("/sys/fs/cgroup/cpu/cgroup.procs").exists() or os.geteuid() != 0
        pytest.skip("no CPU controller here")
    argv = _launcher(limits, False, groups) + [sys.executable, "-c", BUSY + "print(open('/proc/self/cgroup').read())\n"]
    t = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    wall = time.monotonic() - t
    assert r.returncode == 0, r.stderr
    joined = r.stdout
    for g in groups.paths:  # both processes ran in every group of the slot
        assert f":/{g.name}\n" in joined, (g, joined)
    quota = (cpu[0] / "cpu.cfs_quota_us")
    if quota.exists():
        assert int(quota.read_text()) == 100_000 * limits.cores
        assert int((cpu[0] / "cpu.cfs_period_us").read_text()) == 100_000
    else:
        assert (cpu[0] / "cpu.max").read_text().split() == [str(100_000 * limits.cores), "100000"]
    assert wall >= 1.5 and joined.count("cpu") >= 2  # both processes reported their groups
    paths = list(groups.paths)
    groups.remove()
    assert not any(p.exists() for p in paths)


def test_groups_of_a_grader_that_died_are_removed_and_others_kept(monkeypatch):
    probe = _groups_or_skip(Limits())
    base = probe.paths[0].parent
    probe.remove()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ns = sandbox._pid_namespace()
    stale = base / f"attn-course-{ns}-{dead.pid}-slot0-1"
    alive = base / f"attn-course-{ns}-{os.getpid()}-slot9-99"
    elsewhere = base / f"attn-course-{ns}0-{dead.pid}-slot0-1"  # another pid namespace: not ours to judge
    for p in (stale, alive, elsewhere):
        p.mkdir()
    try:
        monkeypatch.setattr(sandbox, "_swept", set())
        fresh = SlotGroups(1, Limits())
        assert not stale.exists() and alive.exists() and elsewhere.exists()
        fresh.remove()
    finally:
        for p in (stale, alive, elsewhere):
            if p.exists():
                p.rmdir()


def test_a_limited_sandbox_removes_its_groups_when_closed():
    box = Limited(0, Limits())
    if not box.groups.paths:
        pytest.skip("no cgroups can be made here")
    paths = list(box.groups.paths)
    assert all(p.exists() for p in paths)
    box.close()
    assert not any(Path(p).exists() for p in paths)


def test_the_forks_a_slot_refuses_are_counted():
    """What lets the runner stop a fork bomb at once: the pids group counts each refused fork."""
    limits = Limits(processes=8)
    groups = _groups_or_skip(limits)
    try:
        assert groups.refused() == 0
        spawn = ("import os\nkids = []\nfor _ in range(20):\n    try:\n        pid = os.fork()\n"
                 "    except OSError:\n        break\n    if pid == 0:\n        import time; time.sleep(5); os._exit(0)\n"
                 "    kids.append(pid)\nprint(len(kids))\nfor k in kids:\n    os.kill(k, 9)\n")
        r = subprocess.run(_launcher(Limits(processes=64), False, groups) + [sys.executable, "-c", spawn],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert int(r.stdout) < 8  # the group's limit, not the launcher's larger RLIMIT_NPROC, stopped it
        assert groups.refused() >= 1
    finally:
        groups.remove()
    assert groups.refused() == 0  # gone with its group
