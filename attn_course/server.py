"""The trusted side of a worker server: start it, send jobs, read its messages.

A server (``attn_course.worker --serve``) runs inside a :class:`Sandbox`; it
imports Python, NumPy, JAX and the specs once, then forks one fresh child
per job.  The protocol is one JSON line per message, over the server's
stdin and stdout only (no shared folder):

* to the server: ``{"files": {path: source}, "exercises": [...], "cpu_s": n}``
  (and ``"warm": false`` when it should not warm after the job, :attr:`WorkerServer.warm`);
* to the server, while a job runs: ``{"stop": true}`` (the job reached a
  limit: the server ends it, and answers ``done`` as below);
* from the server: ``{"ready": true}``, then per job ``{"out": LINE}`` for
  each line the job wrote to its results channel (LINE is the job's text,
  carried as a JSON string: it cannot forge a message of the server), and
  ``{"done": status, "tail": LAST_OUTPUT_LINE, "clean": bool}`` when the job
  is gone (``clean``: the sandbox is clean again; if not, the server ends), then, once it has
  warmed up for the jobs to come, ``{"ready": true}`` again (:meth:`WorkerServer.ready_for_job`).

Anything else (a line that is not JSON, a message of another shape, too much
data) means the server is broken: it is killed, and the next job starts a
new one from pristine sources.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from enum import Enum

from . import sandbox as _sandbox
from .run_dir import run_dir
from .sandbox import Limits, Sandbox
from .text import terminal
from .xla_cache import check_cache_dir

MAX_LINE = 32 * 2**20  # one message (a job's line) at most
# messages one poll returns at most: the runner looks at its limits between polls, and a job that
# floods its channel with empty lines held one poll for a minute, and 640 MB (red team)
MAX_POLL = 4096
STOP_WAIT_S = 2.0  # how long a server has to end a stopped job and answer (stop_job)
WARM_WAIT_S = 660.0  # how long a server may warm up after a job (its own wait on its template is 600 s)


class ServerError(RuntimeError):
    """The server broke (started badly, died, spoke out of protocol)."""


class StartError(ServerError):
    """The server did not start: it never said it was ready, so no job ran in it.

    The grader's problem (the Python environment, the sandbox, the machine),
    never a submission's: the grader does not score it (:mod:`attn_course.grade`).
    ``reason`` is the last line the server's start wrote to its standard error
    (bounded and made printable), or "" where it wrote none.
    """

    def __init__(self, message: str, reason: str = ""):
        super().__init__(f"{message}: {reason}" if reason else message)
        self.reason = reason


START_LOG_BYTES = 4096  # what is read back of a server's start (its standard error) when it fails


def _last_line(log) -> str:
    """The last non-empty line of a server's start log (a file), bounded and printable."""
    try:
        size = os.fstat(log.fileno()).st_size
        log.seek(max(0, size - START_LOG_BYTES))
        text = log.read(START_LOG_BYTES).decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return terminal(lines[-1], 300) if lines else ""


class Stopped(Enum):
    """What became of a server whose job was stopped at a limit (:meth:`WorkerServer.stop_job`)."""

    KEPT = "kept"  # it ended the job and its sandbox is clean: it serves the next job
    KILLED = "killed"  # it was killed (its sandbox was not clean, or cannot end a job alone)
    LOST = "lost"  # it did not answer, and was killed: lines it had not yet relayed are lost


@dataclass(frozen=True)
class Line:
    """A line the job wrote to its results channel (untrusted text)."""

    text: str


@dataclass(frozen=True)
class Done:
    """The job is over: its exit status, the last line it printed (untrusted), and
    whether the sandbox is clean again (if not, the server is ending: do not reuse it)."""

    status: int
    tail: str
    clean: bool = True


class WorkerServer:
    def __init__(self, sandbox: Sandbox, start_timeout_s: float = 120.0):
        self.sandbox, self.start_timeout_s = sandbox, start_timeout_s
        self.proc: subprocess.Popen | None = None
        self._buf = bytearray()
        self._scan = 0  # how much of _buf is known to hold no newline (it is never read again)
        self._eof = False  # the server's end of the pipe is closed: nothing more will come
        self.starts = 0
        self.closed = False  # after close() no new server starts (Ctrl-C, the end of a batch)
        # after each job the server may trace JAX's operations on its cases' shapes, so that later
        # children start warm (attn_course.warm).  Off unless its user turns it on: it repays
        # itself only over many jobs (Grader.worth_warming), and costs about 0.24 CPU-s a shape.
        # A server started again (its predecessor was killed) is off until its user says so again
        self.warm = False
        self._lock = threading.Lock()
        self._start_log = None  # the server's standard error: what its start wrote (see launch)
        # a job ended (its Done was read) and the server has not yet said it is ready for the next:
        # after a job it warms up (minutes at most), then says so (see :meth:`submit`)
        self._after_job = False

    # -- life ---------------------------------------------------------------------
    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the server's process, without waiting for it to be ready (:meth:`wait_ready`).

        The sandbox dies with the thread that launched it (bubblewrap's
        ``--die-with-parent`` is a parent-death signal, which the kernel sends
        when that *thread* ends): launch from a thread that outlives the jobs.
        """
        argv, env = self.sandbox.server_command()
        # its standard error goes to a file of the grader's own (unnamed, in its private folder),
        # read back only if it does not start: a server writes there only while it starts (an
        # import that fails), then points it at /dev/null before any job exists
        self._close_start_log()
        self._start_log = tempfile.TemporaryFile(dir=run_dir())
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._start_log, env=env, start_new_session=True,
                                     cwd="/")
        if self.starts:
            self.warm = False  # a new server after one that was killed: its user decides again
        self.starts += 1
        self._after_job = False
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._buf, self._scan, self._eof = bytearray(), 0, False

    def wait_ready(self) -> None:
        """Wait until the launched server has imported what it needs; kills it if it does not start."""
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            msg = self._message()
            if msg == "ready":
                return
            if msg is not None or self.proc.poll() is not None:
                break
            time.sleep(0.01)
        late = time.monotonic() >= deadline
        self.kill()
        reason = _last_line(self._start_log) if self._start_log is not None else ""
        raise StartError("the worker server did not start"
                         + (f" within {self.start_timeout_s:g} s" if late else ""), reason)

    def _close_start_log(self) -> None:
        log, self._start_log = self._start_log, None
        if log is not None:
            log.close()

    def running(self) -> bool:
        """Whether the server's process is there (if not, the next job starts a new one)."""
        proc = self.proc
        return proc is not None and proc.poll() is None

    def ensure(self) -> None:
        if self.closed:
            raise ServerError("the grader is stopping")
        if not self.running():
            self.kill()
            self.start()

    def kill(self) -> None:
        """Stop the server and everything in its sandbox; the next job starts a new one."""
        with self._lock:
            proc, self.proc = self.proc, None
        self._after_job = False
        if proc is not None:
            for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
                try:
                    kill()
                except (ProcessLookupError, PermissionError, OSError):
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        self.sandbox.cleanup()

    def close(self) -> None:
        """Stop for good: a job still waiting on this server fails at once."""
        self.closed = True
        self.kill()
        self._close_start_log()
        self.sandbox.close()

    # -- jobs -----------------------------------------------------------------------
    def submit(self, job: dict) -> None:
        """Send ``job`` to a server ready for it: started if need be, and back from the warm-up
        that follows the previous job (:meth:`ready_for_job`)."""
        self.ready_for_job()
        if not self.warm:
            job = {**job, "warm": False}
        try:
            self.proc.stdin.write((json.dumps(job, separators=(",", ":")) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            self.kill()
            raise ServerError(f"the worker server is gone ({err})") from None

    def ready_for_job(self, timeout_s: float = WARM_WAIT_S) -> None:
        """Return once the server can take a job at once: started (:meth:`ensure`), and, after a
        job, back from the warm-up it does before it reads the next (``{"ready": true}``).

        A runner starts a job's clock only after this (:func:`attn_course.runner.run_worker`): a
        warm-up traces the class's shapes, seconds for a whole course and more on a busy
        machine, and that is the grader's time, not the next archive's.  A server that says
        anything else, ends, or is not back within ``timeout_s`` is replaced by a new one.
        """
        self.ensure()
        if not self._after_job:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._message()
            if msg == "ready":
                self._after_job = False
                return
            if msg is not None or time.monotonic() > deadline or (self._eof and not self._pending()):
                break  # out of protocol (a line or an end after the job's Done), or lost in its warm-up
            self.wait(min(0.1, max(0.0, deadline - time.monotonic())))
        self.kill()
        self.ensure()

    def stop_job(self, late: list[str] | None = None, timeout_s: float = STOP_WAIT_S) -> Stopped:
        """End the running job (it reached a limit), and keep the server if it can be kept.

        Sends ``{"stop": true}``: the server kills the job and everything it
        started, empties its sandbox and answers ``Done``.  If it did so
        within ``timeout_s`` with a clean sandbox, the next job runs on this
        server, without a new start (:attr:`Stopped.KEPT`).  Otherwise, or
        where the sandbox cannot end a job's processes from inside
        (``keeps_stopped_servers``), the server is killed.  The lines the
        job wrote that arrive meanwhile are added to ``late`` (up to
        :data:`MAX_LINE` in all): the job may have moved on before the limit
        was seen.
        """
        if not getattr(self.sandbox, "keeps_stopped_servers", False):
            self.kill()
            return Stopped.KILLED
        deadline, dropped = time.monotonic() + timeout_s, 0
        try:
            if self.proc is None or self.proc.poll() is not None:
                raise ServerError("the worker server is gone")
            self.proc.stdin.write(b'{"stop":true}\n')
            self.proc.stdin.flush()
            while time.monotonic() < deadline and dropped <= MAX_LINE:
                for msg in self.poll():
                    if isinstance(msg, Done):
                        if msg.clean:
                            return Stopped.KEPT
                        self.kill()  # every line came before its Done: none is lost
                        return Stopped.KILLED
                    dropped += len(msg.text)
                    if late is not None and dropped <= MAX_LINE:
                        late.append(msg.text)
                self.wait(max(0.0, min(0.1, deadline - time.monotonic())))
        except (ServerError, BrokenPipeError, OSError, ValueError):
            pass
        self.kill()
        return Stopped.LOST

    def poll(self) -> list[Line | Done]:
        """What arrived since the last poll; raises :class:`ServerError` if the server broke."""
        if self.proc is None:
            raise ServerError("the worker server was stopped")
        out: list[Line | Done] = []
        while len(out) < MAX_POLL:
            msg = self._message()
            if msg is None:
                break
            if msg == "ready" or msg == "bad":
                self.kill()
                raise ServerError("the worker server spoke out of protocol")
            out.append(msg)
            if isinstance(msg, Done):
                self._after_job = True  # the server says when it is ready again (ready_for_job)
                break
        if not out and self.proc is not None and self.proc.poll() is not None and not self._pending():
            self.kill()
            raise ServerError("the worker server died")
        return out

    def _pending(self) -> bool:
        return self._buf.find(b"\n", self._scan) >= 0

    def wait(self, timeout: float) -> None:
        """Return when the server has written something (or closed its end), or after ``timeout`` s.

        What a job's runner does between two :meth:`poll` calls: it wakes
        when a line arrives instead of at a fixed rate, and costs nothing
        while the job runs.
        """
        proc = self.proc
        if proc is None or self._pending():
            return
        if self._eof:  # always readable now: a plain pause until poll sees the server's end
            time.sleep(min(max(0.0, timeout), 0.01))
            return
        try:
            select.select([proc.stdout], [], [], max(0.0, timeout))
        except (OSError, ValueError):  # closed meanwhile (killed by another thread): poll says so
            pass

    def _message(self):
        """The next whole message: 'ready', a Line, a Done, 'bad', or None for nothing yet."""
        proc = self.proc
        if proc is None:
            return None
        # (a line read in many pieces is searched piece by piece, and the buffer grows in place: with
        # the whole buffer copied and searched again at each piece, a job's line of 24 MB cost the
        # grader 3.7 s, four times as much for twice the length: red team)
        end = self._buf.find(b"\n", self._scan)
        if end < 0:
            self._scan = len(self._buf)
            try:
                chunk = os.read(proc.stdout.fileno(), 1 << 20)
            except BlockingIOError:
                chunk = None
            except (OSError, ValueError):
                chunk = b""
            if chunk:
                self._buf += chunk
            elif chunk == b"":
                self._eof = True
            end = self._buf.find(b"\n", self._scan)
            if end < 0:
                self._scan = len(self._buf)
                return "bad" if len(self._buf) > MAX_LINE else None
        line = bytes(self._buf[:end])
        del self._buf[:end + 1]
        self._scan = 0
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return "bad"
        if obj == {"ready": True}:
            return "ready"
        if isinstance(obj, dict) and set(obj) == {"out"} and isinstance(obj["out"], str):
            return Line(obj["out"])
        if (isinstance(obj, dict) and set(obj) == {"done", "tail", "clean"} and type(obj["done"]) is int
                and isinstance(obj["tail"], str) and type(obj["clean"]) is bool):
            return Done(obj["done"], obj["tail"][:400], obj["clean"])
        return "bad"


def check_server(limits: Limits | None = None) -> WorkerServer:
    """``attn-course check``'s worker server, not started: the student's own code, unconfined
    (:class:`attn_course.sandbox.Plain`), with the student's own compilation cache, one program per
    exercise (after an edit, the exercises whose code did not change load their programs instead
    of compiling them).  Its module imports no NumPy: the command launches it before its own imports."""
    return WorkerServer(_sandbox.Plain(limits or _sandbox.GRADING_LIMITS, check_cache_dir()))
