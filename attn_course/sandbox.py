"""How a grading worker is confined.

Submitted code runs in a worker process (:mod:`attn_course.worker`) that

* has resource limits: CPU seconds, address space, file size, open files,
  no core dumps, and a process limit: a pids cgroup per parallel slot where
  the system lets the grader make one (then every process a worker left
  behind is found and killed), else ``RLIMIT_NPROC`` (which the kernel does
  not apply to root);
* under bubblewrap (``bwrap``, the Debian package ``bubblewrap``), when it is
  installed and works, sees only the system's read-only libraries, the Python
  environment, the course tooling (``attn_course``, which holds no expected
  values and no secret), the submission (read-only) and its own empty working
  folder; no network, no other processes, a fresh ``/tmp``;
* without bubblewrap (the fallback), still has the limits, a private working
  folder, a scrubbed environment and no network when the grader is root (a
  new network namespace); it can read what the grader's user can read, so
  the grader warns that the fallback does not hide files.

The trusted parent never unpickles anything: it reads the worker's JSON lines
(:mod:`attn_course.values`) and compares them with expected values that the
worker never had.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import ROOT



@dataclass
class Local:
    """No confinement: a student's check of their own code on their own machine."""

    kind: str = "local"

    def package_path(self, package: Path) -> str:
        return str(package)

    def command(self, job: Path, out: Path, workdir: Path, limits):
        from .runner import default_command

        argv, env = default_command(job, out, workdir, limits)
        return argv, env, None

    def cleanup(self) -> None:
        pass


def bwrap_works() -> bool:
    exe = shutil.which("bwrap")
    if not exe:
        return False
    try:
        r = subprocess.run([exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                           capture_output=True, timeout=20)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _cgroup(slot: int, limits) -> Path | None:
    """A pids (and memory) cgroup for one slot, or None where the system has none for us."""
    for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if not (base / "cgroup.procs").exists():
            continue
        group = base / f"attn-course-slot{slot}"
        try:
            group.mkdir(exist_ok=True)
            (group / "pids.max").write_text(str(limits.processes))
            return group
        except OSError:
            continue
    return None


class Confined:
    """The grading sandbox: bubblewrap when it works, else limits alone."""

    def __init__(self, slot: int = 0, use_bwrap: bool | None = None, cache: Path | None = None,
                 limits=None):
        from .runner import Limits

        # Workers keep the grader's uid (the Python environment may live where another
        # uid cannot read, e.g. under /root); bubblewrap maps it to an unprivileged one.
        self.root = os.geteuid() == 0
        self.bwrap = bwrap_works() if use_bwrap is None else use_bwrap
        self.kind = "bubblewrap" if self.bwrap else "limits"
        self.cache = cache
        self.cgroup = _cgroup(slot, limits or Limits())

    def package_path(self, package: Path) -> str:
        return "/submission" if self.bwrap else str(package)


    def _env(self, home: str) -> dict:
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
               "JAX_PLATFORMS": "cpu", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
               "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
               "PYTHONNOUSERSITE": "1"}
        if self.cache is not None:
            env["ATTN_COURSE_CACHE"] = str(self.cache)
        return env

    def _launcher(self, limits, newnet: bool) -> list[str]:
        """The limits, applied by :mod:`attn_course.limit` just before exec."""
        limit = str(ROOT / "attn_course" / "limit.py")
        return [sys.executable, "-S", "-I", limit, str(limits.cpu_s), str(limits.memory_mb),
                str(limits.file_mb), str(limits.processes), "1" if newnet else "0",
                str(self.cgroup) if self.cgroup else "-", "--"]

    def command(self, job: Path, out: Path, workdir: Path, limits):
        py = sys.executable
        if not self.bwrap:
            argv = self._launcher(limits, self.root) + [py, "-m", "attn_course.worker", str(job), str(out)]
            env = self._env(str(workdir))
            env["PYTHONPATH"] = str(ROOT)
            return argv, env, None
        argv = self.bwrap_argv([("--bind", str(workdir), "/grading-work"),
                                ("--ro-bind", str(self._package), "/submission")], "/grading-work", "/grading-work")
        argv += [py, "-m", "attn_course.worker", "/grading-work/" + job.name, "/grading-work/" + out.name]
        return self._launcher(limits, False) + argv, self._env(str(workdir)), None

    def bwrap_argv(self, extra: list[tuple[str, str, str]], chdir: str, home: str) -> list[str]:
        """bubblewrap: read-only system, Python and attn_course; no network, pids, caps."""
        binds = []
        for path in ("/usr", "/lib", "/lib64", "/bin", "/lib32", "/etc/alternatives", "/etc/ld.so.cache"):
            if os.path.exists(path):
                binds += ["--ro-bind", path, path]
        for path in {sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parents[1])}:
            binds += ["--ro-bind", path, path]
        course = str(ROOT / "attn_course")
        binds += ["--ro-bind", course, course]
        if self.cache is not None and Path(self.cache).is_dir():
            binds += ["--ro-bind", str(self.cache), str(self.cache)]
        for kind, src, dst in extra:
            binds += [kind, src, dst]
        # /tmp first: the Python environment or the course may live under /tmp
        # (a CI clone), and a later tmpfs would hide their binds
        argv = [shutil.which("bwrap"), "--unshare-all", "--die-with-parent", "--new-session",
                "--uid", "1000", "--gid", "1000", "--cap-drop", "ALL", "--tmpfs", "/tmp",
                *binds, "--proc", "/proc", "--dev", "/dev",
                "--chdir", chdir, "--clearenv"]
        for k, v in self._env(home).items():
            argv += ["--setenv", k, v]
        return argv

    def bind_package(self, package: Path) -> None:
        self._package = Path(package)

    def cleanup(self) -> None:
        """Kill every process a worker left running in the slot's cgroup.

        Without a cgroup, bubblewrap's pid namespace (``--die-with-parent``)
        or the worker's session (killed by the runner) ends them.
        """
        if self.cgroup is None:
            return
        for _ in range(20):
            try:
                pids = [int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()]
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)


class ForkServer:
    """One sandboxed ``attn_course.worker --serve`` per slot (bubblewrap only).

    Python, NumPy, JAX and the exercise specs are imported once per slot
    instead of once per submission; each job runs in a fresh child.  Any
    trouble (a timeout, a dead server) kills the whole sandbox; the next job
    starts a new one.
    """

    def __init__(self, confined: "Confined", slot_dir: Path, limits):
        self.confined, self.slot_dir, self.limits = confined, Path(slot_dir), limits
        self.proc: subprocess.Popen | None = None

    def inside(self, path: Path) -> str:
        return "/slot/" + str(Path(path).relative_to(self.slot_dir))

    def _start(self) -> None:
        c = self.confined
        argv = c.bwrap_argv([("--bind", str(self.slot_dir), "/slot")], "/slot", "/slot")
        argv += [sys.executable, "-m", "attn_course.worker", "--serve"]
        self.log = open(self.slot_dir / "server.log", "ab")
        self.proc = subprocess.Popen(c._launcher(self.limits, False) + argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=c._env("/slot"))
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._buf = b""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            msg = self._read()
            if msg and msg.get("ready"):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        self.kill()

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            self._start()
        return self.proc is not None and self.proc.poll() is None

    def _read(self) -> dict | None:
        import json

        try:
            chunk = os.read(self.proc.stdout.fileno(), 4096)
        except BlockingIOError:
            chunk = None
        except OSError:
            chunk = b""
        if chunk:
            self._buf += chunk
        if b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                return json.loads(line)
            except ValueError:
                return {}
        return None

    def submit(self, job: Path, out: Path, log: Path, work: Path, limits) -> "_Job":
        import json

        os.chmod(log, 0o666)
        req = {"job": self.inside(job), "out": self.inside(out), "log": self.inside(log),
               "cwd": self.inside(work), "cpu_s": limits.cpu_s}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        return _Job(self)

    def kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.kill()
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.proc = None
        self.confined.cleanup()

    def close(self) -> None:
        self.kill()


class _Job:
    """A job on a fork server, with the interface of a Popen the runner needs."""

    def __init__(self, server: ForkServer):
        self.server, self.code = server, None

    def poll(self):
        if self.code is not None:
            return self.code
        srv = self.server
        if srv.proc is None:
            self.code = -9
            return self.code
        msg = srv._read()
        if msg and "done" in msg:
            self.code = int(msg["done"])
        elif srv.proc.poll() is not None:  # the server died (a job killed it)
            srv.kill()
            self.code = -9
        return self.code

    def kill(self) -> None:
        self.server.kill()
        self.code = -9

    def wait(self):
        while self.poll() is None:
            time.sleep(0.01)
        return self.code
