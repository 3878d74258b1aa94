"""How a worker is confined: one class per kind of confinement.

Submitted code (a library archive or a notebook's answer cells) runs only in
a worker server (:mod:`attn_course.worker`, ``--serve``), which forks one
fresh child per job.  A :class:`Sandbox` says how that server is started:

``Plain``
    no confinement: a student's check of their own code on their own machine.
``Limited``
    resource limits only (CPU seconds, address space, file size, open files,
    processes, no core dumps), a scrubbed environment, a private scratch
    folder and, when the grader is root, no network and a host user of its
    own.  It can read what the grader's user can read (as root: what every
    user may read; where no user of its own can be had, every file, and
    devices such as ``/dev/kvm``): the grader warns (:func:`limits_only_reach`).
``Bubblewrap``
    the grading sandbox.  Everything is read-only (the system, the Python
    environment, the worker's few course modules bound at a neutral path:
    not the grader, not the mistakes catalogue); the only writable places are a size-capped ``/tmp`` tmpfs and a
    size-capped private ``/dev/shm``, both emptied after every job (a server
    that cannot empty them exits, and the next one starts pristine).  The
    grader's XLA compilation cache is not there: its programs embed the
    hidden cases' inputs (and folded outputs) as constants, and a shared
    writable cache would let one job plant programs for the next; only the
    workers' cache is there, read-only and not listable
    (:func:`attn_course.xla_cache.worker_cache_dir`).  No
    network, its own pid namespace, no capabilities, no new user namespaces,
    uid 1000, and on the host a user of its own where the grader is root
    (:mod:`attn_course.slot_user`).  No folder of the grader is bound writable: jobs come in and
    results go out over the server's pipes.  The reference library, the
    secret, expected values, hidden cases' expected values and the grading
    folder are never there.

In every kind the interpreter runs with ``-I`` (no ``PYTHON*`` variables, no
user site, no current or script folder on ``sys.path``) and the course
tooling is the only thing put on the path, read-only.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import json
import os
import py_compile
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from . import ROOT, slot_user
from .run_dir import run_dir
from .text import terminal

COURSE_IN_SANDBOX = "/opt/attn-course"  # holds attn_course/ (read-only) and nothing else

# What a worker imports of the course: nothing of the trusted side (the
# mistakes catalogue is the reference with one switch turned; the grader,
# its reports and identity code have no business there).
WORKER_MODULES = ("__init__.py", "worker.py", "values.py", "regions.py", "registry.py", "xla_cache.py",
                  "inline_where.py", "warm.py", "seccomp.py", "tamper.py", "watch.py", "jaxpr_wire.py", "replay.py")
_STAGED: dict[str, str] = {}


def _stage_release_bytecode(dest: Path) -> None:
    """The stub release's modules compiled under ``dest`` as the import system lays them out
    (``dest/attn_tensors/__pycache__/backend.cpython-311.pyc``), each checked by its source's hash
    (PEP 552): what :func:`attn_course.worker.place_release_bytecode` gives each job.

    A student's submission changes the modules of their exercises; the others stay the release's,
    byte for byte (a chapter-3 job imports seven modules, three of them the release's), and a job
    compiled them again from source (about 5 ms of a job's child, measured).  The release is public:
    nothing here is the reference's or the grader's."""
    from . import RELEASE_LIBRARY

    for src in sorted(RELEASE_LIBRARY.rglob("*.py")):
        rel = src.relative_to(RELEASE_LIBRARY)
        if "__pycache__" in rel.parts:
            continue
        cfile = Path(importlib.util.cache_from_source(str(dest / rel)))
        py_compile.compile(str(src), cfile=str(cfile), dfile=str(rel), doraise=True, optimize=0,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    for folder, _, names in os.walk(dest, topdown=False):
        for name in names:
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)


def worker_course() -> str:
    """A read-only copy of the modules a worker needs (made once per process), to bind into a sandbox."""
    source = ROOT / "attn_course"
    key = f"{source}:{os.getpid()}"  # a forked child's copy is its own, as its folder is
    if key not in _STAGED:
        dest = Path(tempfile.mkdtemp(prefix="worker-course-", dir=run_dir())) / "attn_course"
        (dest / "specs").mkdir(parents=True)
        for name in WORKER_MODULES:
            shutil.copyfile(source / name, dest / name)
        for spec in sorted((source / "specs").glob("*.py")):
            if spec.name != "proposed.py":
                shutil.copyfile(spec, dest / "specs" / spec.name)
        from .watch import RELEASE_BYTECODE  # (where a job's watch reads them: beside the staged modules)

        _stage_release_bytecode(dest / RELEASE_BYTECODE.name)
        for path in [dest / "specs", dest]:
            for f in path.glob("*.py"):
                # compiled here, beside the copy: a server (``-B``, a read-only folder) would
                # otherwise compile these 300 kB of source at every start, about 0.06 CPU-s
                py_compile.compile(str(f), doraise=True, optimize=0)  # (the server runs without -O)
                os.chmod(f, 0o444)
            for f in (path / "__pycache__").glob("*.pyc"):
                os.chmod(f, 0o444)
            os.chmod(path / "__pycache__", 0o555)
            os.chmod(path, 0o555)
        os.chmod(dest.parent, 0o755)
        _STAGED[key] = str(dest)  # removed with the process's folder
    return _STAGED[key]


@dataclass(frozen=True)
class Limits:
    """What one worker may use."""

    per_exercise_s: float = 60.0  # wall-clock seconds for one exercise's cases
    per_archive_s: float = 300.0  # wall-clock seconds for everything one archive runs
    cpu_s: int = 120  # CPU seconds for one job
    memory_mb: int = 3072  # address space of a worker
    # memory of a sandbox's processes together (resident, and what they write to its tmpfs), where
    # a memory cgroup can be made; beyond it the kernel kills one of them, the job first; 0: no cap
    total_memory_mb: int = 4096
    processes: int = 64  # threads and processes (JAX starts a few)
    file_mb: int = 64  # largest file a worker may write
    scratch_mb: int = 64  # the job's writable /tmp (a tmpfs), and as much again for /dev/shm
    output_mb: int = 16  # most a job may report (its results channel)
    cores: int = 0  # CPU cores a worker may keep busy at once (a cgroup's CPU quota, where one can be made); 0: no cap


GRADING_LIMITS = Limits(per_exercise_s=30, per_archive_s=240, cpu_s=120)
"""What grading allows one exercise and one archive; a student's check allows no more per exercise."""


def worker_env(home: str, cache: Path | None) -> dict[str, str]:
    """The whole environment of a worker: nothing of the grader's."""
    # No PYTHON* variable: a server runs ``python -I``, which reads none (its flags are on its
    # command line, :func:`_server_argv`; its hash seed is random, as a student's own Python's).
    # OPENBLAS_NUM_THREADS:
    # a server runs one job at a time on one of the grader's slots (one per core), so NumPy's
    # BLAS gets one thread; its default pool of one thread per core spins as NumPy is imported
    # (about 0.1 CPU-s in every server) and competes with the other slots' jobs
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
           "JAX_PLATFORMS": "cpu", "OPENBLAS_NUM_THREADS": "1"}
    if cache is not None:
        env["ATTN_COURSE_CACHE"] = str(cache)
    return env


# the distributions a worker server imports (attn_course.worker, the specs, JAX's own imports; MLX
# for --backend mlx), whose folders it must find on its path (worker_site_dirs)
WORKER_PACKAGES = ("numpy", "jax", "jaxlib", "ml_dtypes", "opt_einsum", "scipy", "mlx")
# the course's own packages: where an installation of them (not an editable one) lies in a
# folder that bubblewrap binds, an empty folder hides it (the reference library is one of them)
COURSE_PACKAGES = ("attn_tensors", "attn_course")
SITE_NAMES = ("site-packages", "dist-packages")  # the folders made for packages, which a worker may see


def worker_site_dirs() -> list[str]:
    """The folders of this Python's path, outside its installation, that hold a worker's packages.

    A user site (``pip install --user``) or a folder that a ``.pth`` file
    adds: a server runs ``python -I``, which leaves out the user site and
    ``PYTHONPATH``, and bubblewrap binds only the installation.  Without
    them every server failed to start (``No module named 'numpy'``).  They
    are put back on the server's path (:func:`_server_argv`) and bound
    read-only.  Only a folder made for packages is one (``site-packages``,
    ``dist-packages``): a package in a folder of anything else (a home
    folder on ``PYTHONPATH``, which may hold the grader's cache, the
    submissions or the course's folder) is not found, and the server says
    so as it starts; nor is a folder that holds the course's own folder
    (a worker would see the reference library).
    """
    import importlib.util

    inside = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix)}
    course = ROOT.resolve()
    found: list[str] = []
    for name in WORKER_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        where = list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
        if not where:
            continue
        site = Path(where[0]).resolve().parent
        if (site.name not in SITE_NAMES or course.is_relative_to(site)
                or any(site.is_relative_to(folder) for folder in inside)):
            continue
        if str(site) not in found:
            found.append(str(site))
    return found


def hidden_course_copies(folders: list[str]) -> list[str]:
    """Installed copies of the course's packages (``pip install .``, not ``-e``) in these folders'
    site folders: what bubblewrap covers with an empty folder, where it binds them."""
    import sysconfig

    sites = {Path(p) for p in folders}
    for scheme_path in ("purelib", "platlib"):
        try:
            sites.add(Path(sysconfig.get_paths()[scheme_path]))
        except KeyError:
            pass
    out = []
    for site in sorted(sites):
        for name in COURSE_PACKAGES:
            copy = site / name
            if copy.is_dir() and any(copy.resolve().is_relative_to(Path(f).resolve()) for f in folders):
                out.append(str(copy))
    return sorted(set(out))


def _server_argv(course_parent: str, scratch: str, confined: bool = True) -> list[str]:
    """``python -I``: attn_course from ``course_parent`` only, never the current folder; the
    folders of :func:`worker_site_dirs` after the installation's own.  Its
    imports (JAX's) run without the cyclic garbage collector, about 15% of a server's start:
    :func:`attn_course.worker.serve` turns it back on.  ``confined``: each job's process refuses
    the kernel calls no job needs (:mod:`attn_course.seccomp`), as the grading sandboxes ask.
    ``-B``: a job's modules are imported once and removed with its folder; writing their bytecode
    there was only more work (seven files a chapter-3 job) and more of its scratch space used
    (``-I`` ignores ``PYTHONDONTWRITEBYTECODE``, which the workers' environment once set for this)."""
    boot = (f"import gc; gc.disable(); import sys; sys.path.insert(0, {course_parent!r}); "
            f"sys.path.extend({worker_site_dirs()!r}); "
            "from attn_course.worker import main; sys.exit(main())")
    return [sys.executable, "-I", "-B", "-c", boot, "--serve", "--scratch", scratch] + (["--confined"] if confined else [])


class Sandbox(Protocol):
    """How a worker server is started, and what is left to clean after it."""

    kind: str
    # whether a job stopped at a limit can be ended by its server alone, which then serves the
    # next job: where the server sees every process of its sandbox (its own pid namespace), or
    # where the code is the student's own (check).  Otherwise the server is killed with it.
    keeps_stopped_servers: bool

    def server_command(self) -> tuple[list[str], dict[str, str]]:
        """The argv and the complete environment of a worker server."""

    def cleanup(self) -> None:
        """After a server is gone: end what it left and remove its scratch."""

    def close(self) -> None:
        """No server will start again: also remove what the sandbox made for its servers."""

    def processes_refused(self) -> int:
        """How often a process or thread of the sandbox could not start for its process limit,
        since the sandbox was made (0 where that is not counted)."""

    def memory_kills(self) -> int:
        """How many of the sandbox's processes the kernel killed at its memory limit, since the
        sandbox was made (0 where that is not counted)."""


class Plain:
    """No confinement: a student's own check on their own machine."""

    kind = "plain"
    keeps_stopped_servers = True  # the student's own code: its session is ended, as after any job

    def __init__(self, limits: Limits | None = None, cache: Path | None = None):
        self.limits, self.cache = limits or Limits(), cache
        self._scratch: str | None = None

    def server_command(self):
        self.cleanup()
        self._scratch = tempfile.mkdtemp(prefix="check-", dir=run_dir())
        env = worker_env(self._scratch, self.cache)
        return _server_argv(str(ROOT), self._scratch, confined=False), env  # the student's own code

    def cleanup(self) -> None:
        if self._scratch:
            _rmtree(self._scratch)
            self._scratch = None

    def close(self) -> None:
        self.cleanup()

    def processes_refused(self) -> int:
        return 0

    def memory_kills(self) -> int:
        return 0


def tasks_of(uid: int) -> int:
    """How many processes and threads run as ``uid`` (real uid), as far as this process sees:
    what the kernel's RLIMIT_NPROC counts, zombies included."""
    from .worker import proc_status

    return sum(int(status["Threads"][0]) for _, status in proc_status("Uid", "Threads")
               if status.get("Uid", [])[:1] == [str(uid)] and status.get("Threads"))


def _launcher(limits: Limits, newnet: bool, groups: "SlotGroups | None", uid: int | None = None,
              stage: list[tuple[str, str]] | dict | None = None) -> list[str]:
    """The limits, applied by :mod:`attn_course.limit` just before exec; as ``uid`` (root only),
    with ``stage`` set up first (its STAGE: bubblewrap's binds, or the limits-only sandbox's)."""
    limit = str(ROOT / "attn_course" / "limit.py")
    # RLIMIT_NPROC counts the processes of the user (of a sandbox's own user: the sandbox's), and
    # refuses a fork before the pids group would: where that group counts them, it is the limit
    # (the runner then reads its refusals and names the process limit), and the rlimit a backstop
    counted = groups is not None and groups.events is not None
    nproc = 2 * limits.processes if counted else limits.processes
    # and it counts ALL of that user's processes and threads: where the sandbox runs as the
    # grader's own user (not root), the ones that user already runs too (a desktop's browser alone
    # has hundreds, and a limit of 64 refused the sandbox its first fork): on top of those
    runs_as = os.getuid() if uid is None else uid
    if runs_as != 0:  # (root's is not enforced)
        nproc += tasks_of(runs_as)
    return [sys.executable, "-S", "-I", limit, str(limits.cpu_s), str(limits.memory_mb),
            str(limits.file_mb), str(nproc), "1" if newnet else "0",
            ",".join(str(g) for g in groups.paths) if groups and groups.paths else "-",
            "-" if uid is None else str(uid), json.dumps(stage) if stage else "-", "--"]


_GROUP_PREFIX = "attn-course-"
_made = 0  # sandboxes made by this process (each has groups of its own)


def _pid_namespace() -> str:
    """Which pid namespace this process is in: with the pid, a group's name is unique on the machine
    (two graders in two containers may have the same pid)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


class SlotGroups:
    """The cgroups of one sandbox: its processes counted (``pids.max``), its CPU capped
    (``Limits.cores``: a fork bomb or a thread pool in one slot cannot take the cores of the
    others) and its memory capped (``Limits.total_memory_mb``: the address-space limit is per
    process, and 64 processes of 3 GB each would take the machine's memory from every other
    slot and from the grader), each where the system lets the grader make it (root, cgroup
    v1 or v2).

    Every server of the sandbox joins them (:mod:`attn_course.limit`); :meth:`kill` ends what
    is left in them after a server, :meth:`remove` deletes them when the sandbox is closed.
    The grader holds a lock (``flock``) on each group's folder for as long as the sandbox
    lives, and the kernel drops it when the grader dies, however it dies: groups whose lock
    can be taken are left over, and the next grader to make groups removes them
    (:func:`_sweep`), a grader's in another pid namespace (a container's) included.
    """

    def __init__(self, slot: int, limits: Limits):
        global _made
        _made += 1
        name = f"{_GROUP_PREFIX}{_pid_namespace()}-{os.getpid()}-slot{slot}-{_made}"
        self.paths: list[Path] = []
        self._locks: list[int] = []  # a locked descriptor of each group's folder, while the sandbox lives
        self.events: Path | None = None  # where the pids group counts the forks it refused ("max N")
        self.oom_events: Path | None = None  # where the memory group counts the processes it killed ("oom_kill N")
        total = limits.total_memory_mb * 2**20
        v2 = Path("/sys/fs/cgroup")
        if (v2 / "cgroup.controllers").exists() and not (v2 / "pids").is_dir():  # unified hierarchy
            cpu = {"cpu.max": f"{100_000 * limits.cores} 100000"} if limits.cores else {}
            memory = {"memory.max": str(total), "memory.swap.max": "0"} if total else {}
            if self._make(v2, name, {"pids.max": str(limits.processes), **cpu, **memory}, required=("pids.max",)):
                self.events = self.paths[0] / "pids.events"
                if total and (self.paths[0] / "memory.max").exists():
                    self.oom_events = self.paths[0] / "memory.events"
        else:
            if self._make(Path("/sys/fs/cgroup/pids"), name, {"pids.max": str(limits.processes)}):
                self.events = self.paths[0] / "pids.events"
            if limits.cores:
                self._make(Path("/sys/fs/cgroup/cpu"), name, {"cpu.cfs_period_us": "100000",
                                                             "cpu.cfs_quota_us": str(100_000 * limits.cores)})
            # (memsw, memory and swap together, only where swap is accounted: it must not be below
            # the memory limit, so it is written second; kmem.tcp: v1 counts TCP buffers against a
            # group only once they have a limit of their own, and v2 counts them as memory)
            if total and self._make(Path("/sys/fs/cgroup/memory"), name,
                                    {"memory.limit_in_bytes": str(total), "memory.memsw.limit_in_bytes": str(total),
                                     "memory.kmem.tcp.limit_in_bytes": str(total)},
                                    required=("memory.limit_in_bytes",)):
                self.oom_events = self.paths[-1] / "memory.oom_control"

    def _make(self, base: Path, name: str, settings: dict[str, str], required: tuple[str, ...] | None = None) -> bool:
        """Make one group with these settings (those in ``required``, or all, must take); whether it was made."""
        if not (base / "cgroup.procs").exists():
            return False
        _sweep(base)
        group = base / name
        lock = _claim(group)
        if lock is None:
            return False
        for key, value in settings.items():
            try:
                (group / key).write_text(value)
            except OSError:
                if required is None or key in required:  # v2: the CPU controller may not be delegated
                    _rmdir(group)
                    os.close(lock)
                    return False
        self.paths.append(group)
        self._locks.append(lock)
        return True

    def refused(self) -> int:
        """How many forks (processes or threads) the pids group refused, ever; 0 without one."""
        return _count(self.events, "max")

    def memory_kills(self) -> int:
        """How many processes the memory group killed at its limit, ever; 0 without one."""
        return _count(self.oom_events, "oom_kill")

    def kill(self) -> None:
        """SIGKILL every process still in the groups (what a server left behind)."""
        for group in self.paths:
            _kill_cgroup(group)

    def remove(self) -> None:
        self.kill()
        for group in self.paths:
            _rmdir(group)  # while still holding its lock
        for lock in self._locks:
            os.close(lock)
        self.paths, self._locks = [], []
        self.events = self.oom_events = None


def _count(events: Path | None, key: str) -> int:
    """The count on the line ``key N`` of a cgroup's events file; 0 without the file or the line."""
    if events is None:
        return 0
    try:
        for line in events.read_text().splitlines():
            name, _, count = line.partition(" ")
            if name == key:
                return int(count)
    except (OSError, ValueError):
        pass
    return 0


_swept: set[Path] = set()


def _locked(group: Path) -> int | None:
    """A descriptor of ``group``'s folder holding its lock, or None where the lock is someone else's
    or the folder is gone (a sweep took it): the lock is checked to be on the folder the name still
    names, so a folder removed between its ``mkdir`` and its lock is never taken for a live one."""
    try:
        fd = os.open(group, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(fd), os.stat(group)):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _claim(group: Path, tries: int = 5) -> int | None:
    """Make ``group`` and lock it; its locked descriptor, or None where it cannot be made.

    A sweep may take the new folder's lock first, between ``mkdir`` and ``flock`` (it is
    empty and unlocked then), and remove it: then it is made again."""
    for _ in range(tries):
        try:
            group.mkdir(exist_ok=True)
        except OSError:
            return None
        lock = _locked(group)
        if lock is not None:
            return lock
    return None


def _sweep(base: Path) -> None:
    """Remove (once per process and hierarchy) the groups of graders that no longer run.

    A group is left over when its lock can be taken: the grader that made it holds the lock
    until it removes the group, and the kernel releases it when that grader dies.  This holds
    across pid namespaces, where a group's pid would mean nothing.  Only an empty group can be
    removed (bubblewrap and the limits' launcher die with the grader that started them).
    """
    if base in _swept:
        return
    _swept.add(base)
    try:
        groups = [p for p in base.iterdir() if p.name.startswith(_GROUP_PREFIX)]
    except OSError:
        return
    for group in groups:
        lock = _locked(group)
        if lock is not None:
            _rmdir(group)  # holding its lock: no grader is making or using it
            os.close(lock)


def _rmdir(group: Path) -> None:
    try:
        group.rmdir()  # only an empty group can go
    except OSError:
        pass


def _kill_cgroup(group: Path) -> None:
    def procs() -> list[int]:
        try:
            return [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    _kill_listed(procs)


def _kill_listed(listed) -> None:
    """SIGKILL the processes ``listed()`` names until it names none (50 rounds at most)."""
    for _ in range(50):
        pids = listed()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _rmtree(path: str) -> None:
    """Remove a folder a job wrote, even where it took its own permissions away."""
    from .worker import remove_tree

    remove_tree(path)


class Stage:
    """Mount points for :mod:`attn_course.limit` to bind sources on, for a sandbox of its own user,
    who may not reach the sources themselves (a Python under ``/root``): a folder or file each, in a
    folder of the grader's run folder, made as they are asked for."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.points: dict[str, str] = {}  # a bind's source -> its mount point

    def point(self, source: str) -> str:
        """Where ``source`` is bound (made once)."""
        if source not in self.points:
            if self.folder is None:
                self.folder = Path(tempfile.mkdtemp(prefix="stage-", dir=run_dir()))
                os.chmod(self.folder, 0o755)
            point = self.folder / str(len(self.points))
            if os.path.isdir(source):
                point.mkdir()
            else:
                point.touch()
            self.points[source] = str(point)
        return self.points[source]

    def remove(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder, self.points = None, {}


class Limited:
    """Resource limits without file isolation (where bubblewrap does not work).

    Where the grader is root, the server runs as a host user of the sandbox's own
    (:mod:`attn_course.slot_user`), not as root: a job then reads what every user may read
    and signals only its own processes, and in a mount namespace of the server's own
    (:mod:`attn_course.limit`'s STAGE) the folders every user may write to and its scratch
    folder are size-capped tmpfs's of its own; Python and the workers' cache are bound where
    that user reaches them, at their own paths, when they lie under a folder only root may
    pass (``/root``).
    """

    kind = "limits"
    keeps_stopped_servers = False  # no pid namespace: what left the job's session is found by its cgroup only

    def __init__(self, slot: int = 0, limits: Limits | None = None, cache: Path | None = None):
        self.limits, self.cache = limits or Limits(), cache
        self.groups = SlotGroups(slot, self.limits)
        self.stage = Stage()
        self._scratch: str | None = None
        self.user: slot_user.SlotUser | None = None
        self.user = _limited_user(self)
        if self.user is not None:
            _adopt_orphans(True)

    def _sources(self) -> list[str]:
        """What the sandbox's user must see at its own path: Python, its environment, the workers'
        modules and cache (bound again where a cover or a private folder hides them)."""
        sources = {sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parents[1]),
                   str(Path(worker_course()).parent)}
        if self.cache is not None:
            sources.add(str(self.cache))
        return sorted(sources)

    def _launch(self, groups: SlotGroups | None, scratch: str | None = None) -> list[str]:
        """The launcher: as the sandbox's user, with private folders and its sources restored
        (:mod:`attn_course.limit`'s STAGE), or as the grader."""
        if self.user is None:
            return _launcher(self.limits, os.geteuid() == 0, groups)
        from .worker import SHARED_FOLDERS

        size = f"size={self.limits.scratch_mb}m"
        uid = self.user.uid
        private = [[folder, f"mode=1777,{size}"] for folder in SHARED_FOLDERS if folder != "/dev/mqueue"]
        if scratch is not None:
            private.append([scratch, f"mode=700,uid={uid},gid={uid},{size}"])
        stage = {"restore": [[source, self.stage.point(source)] for source in self._sources()], "private": private}
        return _launcher(self.limits, True, groups, uid, stage)

    def _course(self) -> str:
        """Where the server imports attn_course from: the workers' copy for a user of its own
        (who may not reach the course's folder), else the course's folder."""
        return str(Path(worker_course()).parent) if self.user is not None else str(ROOT)

    def server_command(self):
        self.cleanup()
        self._scratch = tempfile.mkdtemp(prefix="job-", dir=run_dir())
        if self.user is not None:
            os.chown(self._scratch, self.user.uid, self.user.uid)
        env = worker_env(self._scratch, self.cache)
        argv = _server_argv(self._course(), self._scratch) + (["--own-user"] if self.user is not None else [])
        return self._launch(self.groups, self._scratch) + argv, env

    def cleanup(self) -> None:
        self.groups.kill()
        if self.user is not None:  # and at once by their user (a cgroup is killed by a list of pids)
            _kill_user(self.user.uid)
            _reap_user(self.user.uid)
        if self._scratch and self.user is not None:  # empty: the job's was a tmpfs over it
            try:
                os.rmdir(self._scratch)
            except OSError:  # no mount namespace: what the job wrote, removed as its user
                _remove_as(self.user.uid, [self._scratch])
                try:
                    os.rmdir(self._scratch)  # (the run folder is root's: the user cannot take it from there)
                except OSError:
                    pass
        elif self._scratch:
            _rmtree(self._scratch)
        self._scratch = None
        if self.user is not None:
            from .worker import owned

            _remove_as(self.user.uid, sorted(owned(self.user.uid)))

    def close(self) -> None:
        self.cleanup()
        self.groups.remove()
        self.stage.remove()
        if self.user is not None:
            _adopt_orphans(False)
            self.user.release()
            self.user = None

    def processes_refused(self) -> int:
        return self.groups.refused()

    def memory_kills(self) -> int:
        return self.groups.memory_kills()


def _as_user(uid: int, script: str, args: list[str] = (), timeout: float = 30) -> None:
    """Run the shell line ``script`` (with ``args`` as ``$@``) as ``uid``, a sandbox's own user,
    with no other group and nothing of the grader's environment; its failure is not the grader's."""
    try:
        subprocess.run(["/bin/sh", "-c", script, "sh", *args], user=uid, group=uid, extra_groups=[], cwd="/",
                       env={"PATH": "/usr/bin:/bin", "LANG": "C"}, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        pass


def _kill_user(uid: int) -> None:
    """SIGKILL every process of ``uid``, a sandbox's own user: what a job left running when its
    server is gone, whether a cgroup holds them or not (a container whose ``/sys/fs/cgroup`` is
    read-only).  ``kill -9 -1`` as that user reaches all of them at once, as the kernel holds off new
    processes while it signals (a list of pids misses one that forks on and on, found by the
    red team); the list after it is the check."""
    from .worker import processes_of

    _as_user(uid, "kill -9 -1")
    _kill_listed(lambda: processes_of(uid))


_adopters = 0  # the sandboxes of this process for which orphans come to it
_adopters_lock = threading.Lock()


def _adopt_orphans(on: bool) -> None:
    """While a limits-only sandbox with a user of its own lives (``on``, then not), the orphans of
    this process's descendants come to it, not to the machine's init (Linux): a container's init
    may never reap them (this machine's is slow to), and the zombie of a job's orphan stays
    counted in its slot's pids group and against its user's processes until it is reaped, until
    no job of that slot (another student's) can start a thread.  A server reaps its jobs'
    orphans itself (:func:`attn_course.worker.serve`); those of a server that was killed come
    here, and :meth:`Limited.cleanup` reaps them.  Only while such a sandbox lives: the orphans
    of anything else this process starts (a command under ``unshare``) are not reaped here."""
    from .worker import PR_SET_CHILD_SUBREAPER, _prctl

    global _adopters
    with _adopters_lock:
        _adopters += 1 if on else -1
        if _adopters == (1 if on else 0):
            _prctl(ctypes.CDLL(None), PR_SET_CHILD_SUBREAPER, int(on))


def _reap_user(uid: int) -> None:
    """Reap the ended children of this process that ran as ``uid``, a sandbox's own user: orphans
    of its jobs (its server, a child too, was waited for before)."""
    from .worker import proc_status

    me = [str(os.getpid())]
    for pid, status in proc_status("State", "PPid", "Uid"):
        if (status.get("State", [])[:1] == ["Z"] and status.get("PPid") == me
                and status.get("Uid", [])[:1] == [str(uid)]):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _remove_as(uid: int, paths: list[str], chunk: int = 512) -> None:
    """Remove ``paths`` (and all under them) as ``uid``, the sandbox's own user who wrote them.

    Never with root's rights: a folder every user may write to holds what another user's
    process may swap for a link between a check and a removal, and root followed one and
    removed a folder of root's (found by the red team).  As the user, a link leads only to
    what that user may remove anyway.  ``rm`` and ``chmod`` (the job may have taken its own
    permissions away) walk without following links."""
    for k in range(0, len(paths), chunk):
        _as_user(uid, 'chmod -R u+rwX -- "$@" 2>/dev/null; exec rm -rf -- "$@"', paths[k:k + chunk], timeout=120)


_LIMITED_AS_SLOT_USER: bool | None = None  # whether the limits-only server runs as a user of its own here
_LIMITED_PROBLEM: str | None = None  # why not, where it was tried and failed


def _limited_user(sandbox: Limited) -> slot_user.SlotUser | None:
    """A user of the sandbox's own, where the grader is root and Python starts and finds what a
    server imports as that user here (tried once per process, with the sandbox's own binds)."""
    global _LIMITED_AS_SLOT_USER, _LIMITED_PROBLEM
    if _LIMITED_AS_SLOT_USER is False or os.geteuid() != 0 or not slot_user.wanted():
        return None
    user = slot_user.claim()
    if user is None or _LIMITED_AS_SLOT_USER:
        return user
    probe = ("import importlib.util as u, sys; sys.path.insert(0, sys.argv[1]); "
             "gone = [m for m in ('numpy', 'jax', 'jaxlib', 'attn_course.worker') if u.find_spec(m) is None]; "
             "sys.exit('cannot import ' + ', '.join(gone) if gone else 0)")
    course = str(Path(worker_course()).parent)  # (the server's, as that user: Limited._course)
    _LIMITED_PROBLEM = _tried_as(sandbox, user, [sys.executable, "-I", "-c", probe, course], "Python")
    _LIMITED_AS_SLOT_USER = _LIMITED_PROBLEM is None
    return user if _LIMITED_AS_SLOT_USER else None


def _tried_as(sandbox: "Limited | Bubblewrap", user: slot_user.SlotUser, command: list[str], what: str) -> str | None:
    """Why ``command`` did not run in ``sandbox`` as ``user`` (``what`` did not start), or None
    where it ran; where it did not, the sandbox's stage is removed and the uid given back."""
    sandbox.user = user
    try:
        r = subprocess.run(sandbox._launch(None) + command, capture_output=True, timeout=60, cwd="/",
                           env=worker_env("/", None))
        said = [line for line in r.stderr.decode(errors="replace").splitlines() if line.strip()]
        problem = None if r.returncode == 0 else (f"{what} did not start as uid {user.uid}: exit status "
                                                  f"{r.returncode}" + (f", {terminal(said[-1], 200)}" if said else ""))
    except (OSError, subprocess.TimeoutExpired) as err:
        problem = f"{what} did not start as uid {user.uid}: {type(err).__name__}"
    finally:
        sandbox.user = None
    if problem is not None:
        sandbox.stage.remove()
        user.release()
    return problem


def limited_as_own_users() -> bool:
    """Whether this process's limits-only sandboxes run as users of their own (found out so far)."""
    return bool(_LIMITED_AS_SLOT_USER)


def readable_by_all(folder: Path) -> Path | None:
    """The folder (``folder`` or one above it) that leaves ``folder``'s files open to every user:
    None where a folder on the way is closed to others (no ``o+x``), else ``folder`` itself."""
    from .limit import closed_above

    try:
        path = str(folder.resolve())
        if closed_above(path + "/x") is None:  # (``folder`` itself included)
            return Path(path)
    except OSError:
        pass
    return None


def limits_only_reach(as_root: bool | None = None, own_users: bool | None = None) -> str:
    """What a job run with limits only (:class:`Limited`) can reach, for the grader's warning.

    Not as root: what the grader's user can read, write and signal (the other slots' scratch
    folders and servers included: they are the same user's).  As root, where the sandboxes run
    as users of their own (``own_users``; None: tried as grading tries it): what every user may
    read and write.  As root otherwise: every file and some devices (creating virtual machines
    through ``/dev/kvm``, network interfaces through ``/dev/net/tun``), and why no user of its own."""
    root = os.geteuid() == 0 if as_root is None else as_root
    if not root:
        return "and can read, write and signal what this user can (the other workers' files and processes too)"
    problem = None
    if own_users is None:
        own_users = False
        if slot_user.wanted() and os.geteuid() == 0:
            if _LIMITED_AS_SLOT_USER is None:
                Limited(0, GRADING_LIMITS).close()
            own_users = bool(_LIMITED_AS_SLOT_USER)
            problem = _LIMITED_PROBLEM if _LIMITED_AS_SLOT_USER is False else slot_user.unclaimed_reason()
    if own_users:
        return ("as users of their own, not root: they can read what every user of this machine may "
                "(the course's folder too, where it is readable by all) and write where every user may "
                "(/tmp, /dev/shm and their scratch folder are their own where a mount namespace can be made); "
                "install bubblewrap to hide the rest")
    return ("as root: they can read every file of this machine and open its devices "
            "(/dev/kvm, /dev/net/tun), and write and signal what root can"
            + (f" (users of their own were tried: {problem})" if problem else "")
            + "; grade as an ordinary user")


def unconfined_reach(use_bwrap: bool | None) -> str | None:
    """Where grading would run archives' code within reach of the grader's own files: what it
    could reach, in :func:`limits_only_reach`'s words; None where it could not.

    Bubblewrap (where it works, or where asked) shows a job nothing of the grader's, and limits
    only as users of their own (a root grader's, :mod:`attn_course.slot_user`) keep it off the
    grader's files and processes.  Limits only otherwise run it as the grader's user (not root:
    it could rewrite the gradebook and signal the grader) or as root: the grader refuses such a
    batch unless told the archives are trusted (``--unconfined``).
    """
    if uses_bwrap(use_bwrap):
        return None
    reach = limits_only_reach()
    return None if os.geteuid() == 0 and limited_as_own_users() else reach


def bwrap_works() -> bool:
    exe = shutil.which("bwrap")
    if not exe:
        return False
    try:
        r = subprocess.run([exe, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                            "--as-pid-1", "--ro-bind", "/", "/", "true"], capture_output=True, timeout=20)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Bubblewrap:
    """The grading sandbox (see the module's docstring)."""

    kind = "bubblewrap"
    keeps_stopped_servers = True  # the server ends every process of its pid namespace

    def __init__(self, slot: int = 0, limits: Limits | None = None, cache: Path | None = None):
        self.limits, self.cache = limits or Limits(), cache
        self.groups = SlotGroups(slot, self.limits)
        self.stage = Stage()
        # a host user of the sandbox's own where the grader is root (attn_course.slot_user), else
        # the grader's: bubblewrap maps the sandbox's uid 1000 to the user that starts it
        self.user: slot_user.SlotUser | None = None
        self.user = _slot_user(self)

    def _binds(self) -> list[tuple[str, str]]:
        """What the sandbox sees of the machine, read-only: (source, path in the sandbox)."""
        binds = [(path, path) for path in ("/usr", "/lib", "/lib64", "/bin", "/lib32", "/etc/alternatives",
                                           "/etc/ld.so.cache") if os.path.exists(path)]
        binds += [(path, path) for path in sorted({sys.base_prefix, sys.prefix,
                                                   str(Path(sys.executable).resolve().parents[1])})]
        binds += [(path, path) for path in worker_site_dirs()]
        binds.append((worker_course(), f"{COURSE_IN_SANDBOX}/attn_course"))
        if self.cache is not None:  # the workers' own cache (see xla_cache.worker_cache_dir)
            binds.append((str(self.cache), str(self.cache)))
        return binds

    def bwrap_argv(self) -> list[str]:
        bound = self._binds()
        binds: list[str] = []
        for source, dest in bound:
            binds += ["--ro-bind", source if self.user is None else self.stage.point(source), dest]
        # an empty read-only folder over each installed copy of the course's packages in what is
        # bound (the reference library: a job must not read it); the server imports attn_course
        # from its own copy (COURSE_IN_SANDBOX) and each job's attn_tensors from the job
        for path in hidden_course_copies([dest for _, dest in bound if not dest.startswith(COURSE_IN_SANDBOX)]):
            binds += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
        size = str(self.limits.scratch_mb * 2**20)
        # /tmp first: the Python environment or the course may live under /tmp
        # (a CI clone), and a later tmpfs would hide their binds
        # --as-pid-1: the server is its pid namespace's init, to which no process of the namespace
        # can send a signal it has no handler for: a job cannot stop or kill its server.  /dev is
        # read-only (a file there would outlive its job); /dev/shm is emptied after each job.  /dev/pts
        # is an empty read-only folder: the kernel counts ptys for the whole machine (kernel.pty.max),
        # and a job that opened /dev/ptmx 3071 times left none to containers or other sandboxes
        argv = [shutil.which("bwrap"), "--unshare-all", "--unshare-user", "--disable-userns",
                "--die-with-parent", "--as-pid-1", "--new-session", "--uid", "1000", "--gid", "1000", "--cap-drop", "ALL",
                "--size", size, "--tmpfs", "/tmp", *binds, "--proc", "/proc", "--dev", "/dev",
                "--size", size, "--tmpfs", "/dev/shm", "--size", "4096", "--tmpfs", "/dev/pts",
                "--remount-ro", "/dev/pts", "--remount-ro", "/dev", "--remount-ro", "/",
                "--chdir", "/", "--clearenv"]
        for k, v in worker_env("/tmp", self.cache).items():
            argv += ["--setenv", k, v]
        return argv

    def _launch(self, groups: SlotGroups | None) -> list[str]:
        """The launcher, as the sandbox's user with its binds staged (or as the grader)."""
        bwrap = self.bwrap_argv()  # (stages what it binds)
        uid = None if self.user is None else self.user.uid
        stage = list(self.stage.points.items()) if self.user is not None else None
        return _launcher(self.limits, False, groups, uid, stage) + bwrap

    def server_command(self):
        argv = self._launch(self.groups) + _server_argv(COURSE_IN_SANDBOX, "/tmp")
        return argv, worker_env("/tmp", self.cache)

    def cleanup(self) -> None:
        self.groups.kill()

    def close(self) -> None:
        self.groups.remove()
        self.stage.remove()
        if self.user is not None:  # (a process of the sandbox left behind keeps its uid from others:
            self.user.release()    # slot_user.claim passes over a uid that a process runs as)

    def processes_refused(self) -> int:
        return self.groups.refused()

    def memory_kills(self) -> int:
        return self.groups.memory_kills()


_AS_SLOT_USER: bool | None = None  # whether bubblewrap runs as a user of the sandbox's own here
_SLOT_USER_PROBLEM: str | None = None  # why not, where it was tried and failed


def _slot_user(sandbox: Bubblewrap) -> slot_user.SlotUser | None:
    """A user of the sandbox's own (:mod:`attn_course.slot_user`), where the grader is root and
    bubblewrap starts as that user here (tried once per process, with the sandbox's own binds)."""
    global _AS_SLOT_USER, _SLOT_USER_PROBLEM
    if _AS_SLOT_USER is False:
        return None
    user = slot_user.claim()
    if user is None or _AS_SLOT_USER:
        return user
    _SLOT_USER_PROBLEM = _tried_as(sandbox, user, [sys.executable, "-I", "-S", "-c", "pass"], "bubblewrap")
    _AS_SLOT_USER = _SLOT_USER_PROBLEM is None
    return user if _AS_SLOT_USER else None


def host_user_problem(use_bwrap: bool | None = None) -> str | None:
    """Why this root grader's bubblewrap sandboxes would run as root on the host rather than as
    users of their own (:mod:`attn_course.slot_user`); None where they would not (the grader is
    not root, ``ATTN_COURSE_SLOT_UIDS=off`` asked for it, no bubblewrap) or they do.

    Tried as grading tries it (:func:`_slot_user`, once per process): a sandbox is made and closed.
    """
    if not slot_user.wanted() or not uses_bwrap(use_bwrap):
        return None
    if _AS_SLOT_USER is None:
        Bubblewrap(0, GRADING_LIMITS).close()
    if _AS_SLOT_USER is None:  # no uid was claimed: the probe never ran
        return slot_user.unclaimed_reason()
    return _SLOT_USER_PROBLEM


def host_user_warning(problem: str) -> str:
    """The grader's warning where jobs run as root (``problem``: :func:`host_user_problem`'s)."""
    return (f"jobs run as root on this machine, the grader's user, not as users of their own ({problem}): "
            "what the kernel counts per user (inotify instances, pipe buffers, processes) is shared with "
            "every root process here. Grade as an ordinary user, or let bubblewrap start as another user "
            "(unprivileged user namespaces); ATTN_COURSE_SLOT_UIDS=off runs them as the grader's user "
            "without this warning")


def uses_bwrap(use_bwrap: bool | None) -> bool:
    """Whether grading confines archives in bubblewrap: as asked, or (None) where it works."""
    return bwrap_works() if use_bwrap is None else use_bwrap


def confinement(slot: int, limits: Limits, cache: Path | None, use_bwrap: bool | None) -> Sandbox:
    """The grading sandbox: bubblewrap where it works (or where asked), else limits alone."""
    return (Bubblewrap if uses_bwrap(use_bwrap) else Limited)(slot, limits, cache)
