"""Each test's CPU time with every process it started (``benchmarks/bench_suite.py``).

A test's duration is the wall time of its own pytest process; the worker
servers, Dask workers, kernels and commands it starts run beside it and are
not in it (a red-team batch of 38 s showed 2 core-s of its pytest process's
own time).  Where ``ATTN_BENCH_CPU_DIR`` names a folder, each pytest process
moves itself, before each test, into a cgroup v1 ``cpuacct`` group of that
test's own, under the group it was in: what the test starts is born in that
group and stays there, so a group's usage is the test's whole CPU time (a
module's fixture's servers count to the test that started them, through the
module's later tests).  At the end of the session the process goes back, writes
``{node id: CPU seconds}`` to ``FOLDER/<xdist worker>-<pid>.json`` and removes the
groups that are empty.  Nothing happens where no such group can be made (no
cgroup v1 ``cpuacct``, not root), and the verdicts never depend on it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/cpuacct")


def _own_group() -> Path | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpuacct" in controllers.split(","):
                return ROOT / path.strip().lstrip("/")
    except (OSError, ValueError):
        pass
    return None


class CpuGroups:
    """The cpuacct groups of one pytest process's tests."""

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.home = _own_group()
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.groups: list[tuple[str, Path]] = []
        self.off = self.home is None  # (no group can be made here: the session runs as it would without)

    def enter(self, nodeid: str) -> None:
        """Move this process into a new group for the test ``nodeid`` (nothing if none can be made)."""
        if self.off:
            return
        group = self.home / f"test-{self.worker}-{os.getpid()}-{len(self.groups)}"
        try:
            group.mkdir()
        except OSError:
            self.off = True
            return
        try:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            group.rmdir()
            self.off = True
            return
        self.groups.append((nodeid, group))

    def finish(self) -> None:
        """Back to the group this process came from; each test's CPU seconds written; empty groups removed."""
        if not self.groups or self.home is None:
            return
        seconds: dict[str, float] = {}
        try:
            (self.home / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return
        for nodeid, group in self.groups:
            try:
                seconds[nodeid] = seconds.get(nodeid, 0.0) + int((group / "cpuacct.usage").read_text()) / 1e9
                group.rmdir()  # (a process the test left running keeps it: removed by the benchmark)
            except OSError:
                pass
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"{self.worker}-{os.getpid()}.json").write_text(json.dumps(seconds))


def remove_left(group: Path) -> None:
    """Remove the test groups left under ``group`` (their processes ended since)."""
    for sub in group.glob("test-*"):
        try:
            sub.rmdir()
        except OSError:
            pass
