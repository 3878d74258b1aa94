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


# another grader: makes its groups, says where they are, and waits to be killed
OTHER_GRADER = ("import sys\nfrom attn_course.sandbox import Limits, SlotGroups\n"
                "g = SlotGroups(0, Limits())\nprint(','.join(map(str, g.paths)), flush=True)\nsys.stdin.read()\n")


def _other_grader(container: bool) -> tuple[subprocess.Popen, list[Path]]:
    """A grader that made its groups and is still running; ``container``: in a pid namespace of
    its own (``unshare``), where our pids mean nothing, as a grader in a container."""
    argv = [sys.executable, "-c", OTHER_GRADER]
    if container:
        argv = ["unshare", "--pid", "--fork", "--mount-proc"] + argv
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=str(sandbox.ROOT))
    line = proc.stdout.readline().strip()
    assert line, "the other grader made no groups"
    return proc, [Path(p) for p in line.split(",")]


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL, as the OOM killer or a lost container: it removes nothing of its own."""
    import signal

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for _ in range(3000):  # and the grader under unshare, which may end after unshare itself
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError("the other grader outlived SIGKILL")


def test_groups_of_a_grader_that_died_are_removed_and_others_kept(monkeypatch):
    """Each group's folder is locked while its sandbox lives, and a sweep removes those whose lock it
    can take: a killed grader's, in this pid namespace or another (a container's, whose pids mean
    nothing here; they were kept for ever before), never a live grader's, in either."""
    import shutil

    probe = _groups_or_skip(Limits())
    base = probe.paths[0].parent
    probe.remove()
    container = os.geteuid() == 0 and shutil.which("unshare") is not None
    ns = sandbox._pid_namespace()
    unlocked = base / f"attn-course-{ns}-{os.getpid()}-slot9-99"  # our pid and namespace, but nobody's lock
    others = [_other_grader(False)] + ([_other_grader(True)] if container else [])
    try:
        unlocked.mkdir()
        monkeypatch.setattr(sandbox, "_swept", set())
        ours = SlotGroups(1, Limits())
        for _, paths in others:  # alive: kept, in either namespace
            assert all(p.exists() for p in paths), paths
        assert not unlocked.exists()
        for proc, _ in others:
            _kill(proc)
        for _, paths in others:  # their groups outlived them, empty
            assert all(p.exists() for p in paths), paths
        assert all(p.exists() for p in ours.paths)
        monkeypatch.setattr(sandbox, "_swept", set())
        fresh = SlotGroups(2, Limits())
        for _, paths in others:
            assert not any(p.exists() for p in paths), paths
        assert all(p.exists() for p in ours.paths)  # a live grader's (ours) kept
        fresh.remove()
        ours.remove()
    finally:
        for proc, paths in others:
            if proc.poll() is None:
                _kill(proc)
            for p in paths:
                if p.exists():
                    p.rmdir()
        if unlocked.exists():
            unlocked.rmdir()


def test_a_group_a_sweep_takes_while_it_is_made_is_made_again(monkeypatch):
    """Between ``mkdir`` and the lock a new group is empty and unlocked: another grader's sweep may
    lock and remove it then, and the maker's lock is then on a folder that is gone.  The maker sees
    that and makes the group again, rather than writing its limits to nothing."""
    import fcntl

    probe = _groups_or_skip(Limits())
    probe.remove()
    real, raced = fcntl.flock, []

    def swept_first(fd, how):
        if not raced:  # another grader's sweep takes the folder our descriptor is of, first
            raced.append(os.readlink(f"/proc/self/fd/{fd}"))
            theirs = os.open(raced[0], os.O_RDONLY | os.O_DIRECTORY)
            real(theirs, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rmdir(raced[0])
            os.close(theirs)
        return real(fd, how)

    monkeypatch.setattr(fcntl, "flock", swept_first)
    groups = SlotGroups(3, Limits())
    monkeypatch.undo()
    try:
        assert raced and groups.paths and str(groups.paths[0]) == raced[0]
        assert (groups.paths[0] / "pids.max").read_text().strip() == str(Limits().processes)
    finally:
        groups.remove()


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
