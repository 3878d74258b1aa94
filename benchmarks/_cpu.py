"""CPU time of this process and everything it starts, measured by the kernel (a cgroup).

A benchmark on a shared machine reads wall time that other work inflates;
the CPU time its own processes used does not depend on what else runs.
:class:`CpuMeter` puts the benchmark's process in a cgroup v1 ``cpuacct``
group of its own, which every process it starts inherits (worker servers
inside bubblewrap included: the sandbox's pids cgroup is another hierarchy),
and reads the group's total between two points.  Where no such group can be
made (no cgroup v1 ``cpuacct``, not root), :meth:`CpuMeter.seconds` is None
and the benchmark falls back on wall time x workers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/cpuacct")


def own_group() -> Path | None:
    """This process's cpuacct group (a folder under :data:`ROOT`); None where there is none."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpuacct" in controllers.split(","):
                return ROOT / path.strip().lstrip("/")
    except (OSError, ValueError):
        pass
    return None


def _sweep(name: str) -> None:
    """Remove the groups of meters whose process is gone (a benchmark killed before :meth:`CpuMeter.close`).

    Only an empty group can be removed: one that a living process (of any
    pid namespace) is in stays.
    """
    for group in ROOT.glob(f"{name}-*"):
        pid = group.name[len(name) + 1:]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                group.rmdir()
            except OSError:
                pass


class CpuMeter:
    def __init__(self, name: str = "attn-bench"):
        self.group: Path | None = None
        self._home: Path | None = None
        try:
            home = own_group()
            if home is None:
                return
            _sweep(name)
            group = ROOT / f"{name}-{os.getpid()}"
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
            self.group, self._home = group, home
        except OSError:
            self.group = None

    def _usage(self) -> float | None:
        if self.group is None:
            return None
        try:
            return int((self.group / "cpuacct.usage").read_text()) / 1e9
        except OSError:
            return None

    def start(self) -> None:
        self._t0 = self._usage()

    def seconds(self) -> float | None:
        """CPU seconds since :meth:`start` (all processes of the group), or None."""
        now = self._usage()
        return None if now is None or self._t0 is None else now - self._t0

    def close(self) -> None:
        """Back to the original group; the empty group is removed."""
        if self.group is None:
            return
        try:
            (self._home / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
        except OSError:
            pass
        self.group = None


# A fixed piece of the work the suite and the grader do most (a fresh interpreter importing JAX,
# then tracing and lowering a few small gradients; nothing is compiled or run): its CPU time says
# how fast this machine is at this hour, apart from the code being measured.
PACE_WORKLOAD = (
    "import jax, jax.numpy as jnp\n"
    "jax.config.update('jax_platforms', 'cpu')\n"
    "f = lambda x: jnp.tanh(x @ x.T).sum()\n"
    "for n in range(4, 24):\n"
    "    jax.jit(jax.grad(f)).lower(jax.ShapeDtypeStruct((n, 8), jnp.float32))\n"
)


def pace(runs: int = 5) -> float:
    """The median CPU seconds (user + system) of :data:`PACE_WORKLOAD` over ``runs`` fresh interpreters.

    The same code has cost 30-60% more CPU time in a slow hour of a shared
    machine than in a quiet one.  The pace is a rough guide to which kind of
    hour a benchmark ran in, not a correction: a short sample, it moved by
    10-20% from minute to minute on the same machine (1.83-2.37 s in six
    samples over one minute)."""
    import resource
    import statistics
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("OPENBLAS_NUM_THREADS", None)  # the same workload in every benchmark (bench_grading sets it)
    times = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-I", "-c", PACE_WORKLOAD], env=env, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times)


class CpuGroups:
    """Each test's CPU time with every process it started (``bench_suite.py``, through ``tests/conftest.py``).

    A test's duration is the wall time of its own pytest process; the worker
    servers, Dask workers, kernels and commands it starts run beside it (a
    red-team batch of 38 s showed 2 core-s of its pytest process's own time).
    Where ``ATTN_BENCH_CPU_DIR`` names a folder, each pytest process moves
    itself, before each test (:meth:`enter`), into a cpuacct group of that
    test's own under the group it was in: what the test starts is born there
    and stays there (a module's fixture's servers count to the test that
    started them).  :meth:`finish` moves the process back, writes ``{node id:
    CPU seconds}`` to ``FOLDER/<xdist worker>-<pid>.json`` and removes the
    empty groups.  Nothing happens where no group can be made (no cgroup v1
    cpuacct, not root); no verdict depends on it.
    """

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.home = own_group()
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
        if not self.groups:
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
