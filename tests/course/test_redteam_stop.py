"""Red team: the stop path (a job ended at a limit by its own server) and the pid-1 server.

A server that stops a job goes on serving the next job, which may be another
student's archive; in bubblewrap the server is its pid namespace's init.
Each test here runs a real server in bubblewrap: a job that attacks (most of
them sleep until a time limit of 1 s stops them, with no first-exercise
grace, so that their verdict does not depend on the load), then a SPY job on
the same server (a minute for its one exercise) that gets full credit only if
nothing of the earlier job is left for it to see, and nothing of it reached
the next job.  The tests whose docstring says "was a hole" failed before the worker server's
template process and its checks after each job (commits 27db470 and 8f9fdfa).
The tests share one server (a new one only where an attack leaves it unclean):
each attack then also meets a server that earlier attacks have been through.
"""

from __future__ import annotations

import ctypes
import os
import platform
import secrets
import shutil

import pytest
from server_jobs import Unfiltered, bwrap_server, needs_bwrap, package, spy, stop

from attn_course.sandbox import Limits
from attn_course.server import WorkerServer

pytestmark = pytest.mark.slow

# the syscalls the keyring attacks use (add_key, keyctl), per architecture
_KEY_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}


@pytest.fixture(autouse=True)
def _needs_bwrap():
    needs_bwrap()


@pytest.fixture(scope="module")
def shared():
    """One server for the file's attacks (started again by the next job where an attack breaks it)."""
    yield from bwrap_server(21)


def _stopped_then_spied(tmp_path, monkeypatch, server: WorkerServer, job: str, spy_code: str,
                        stops: tuple[str, ...] = ("timeout",)):
    """``job`` (in 3.1) is stopped at a limit (its time limit, unless ``stops`` says more); ``spy_code``
    (3.2) then runs on the same sandbox (or a new one, where the stop did not leave it clean).
    Returns the spy's failures and how many servers the two jobs started."""
    starts = server.starts
    outcomes = stop(server, monkeypatch, package(tmp_path, job))
    assert len(outcomes) == 1 and outcomes[0].status in stops, outcomes
    failed = spy(server, package(tmp_path, spy_code, "spy"))
    return failed, server.starts - starts


# ---------------------------------------------------------------------------------------------
# 1. processes in odd states: stopped, stopped under ptrace, zombie, a zombie leader with a live
#    thread, a child subreaper; none may outlive the stop
ODD_STATES = """
import ctypes as _ct, os as _os, signal as _signal, subprocess as _sp, threading as _th, time as _time
def log_partition_function(S, mask=None, T=1.0):
    libc = _ct.CDLL(None, use_errno=True)
    try:
        p = _sp.Popen(['sleep', '4242'], start_new_session=True)
    except OSError:  # setsid refused (the seccomp filter): in the job's session
        p = _sp.Popen(['sleep', '4242'])
    _os.kill(p.pid, _signal.SIGSTOP)                      # stopped
    if _os.fork() == 0:                                   # stopped under ptrace (its tracer: the job)
        libc.ptrace(0, 0, 0, 0)
        _os.kill(_os.getpid(), _signal.SIGSTOP)
        _os._exit(0)
    if _os.fork() == 0:                                   # a zombie nobody reaps
        _os._exit(0)
    if _os.fork() == 0:                                   # a zombie thread-group leader, a live thread
        try: _os.setsid()  # (refused by the filter: the job's session then)
        except OSError: pass
        _th.Thread(target=_time.sleep, args=(4242,)).start()
        libc.syscall(60 if _os.uname().machine == 'x86_64' else 93, 0)  # exit this thread only
    if _os.fork() == 0:                                   # a subreaper that ignores what it can
        try: _os.setsid()  # (refused by the filter: the job's session then)
        except OSError: pass
        libc.prctl(36, 1, 0, 0, 0)
        for s in (_signal.SIGTERM, _signal.SIGHUP, _signal.SIGINT):
            _signal.signal(s, _signal.SIG_IGN)
        if _os.fork() == 0:
            _time.sleep(4242)
        _time.sleep(4242)
    while True:
        _time.sleep(1)
"""

# 3.2 is right only where no process but the server and itself is left
PROCESS_SPY = """
import os as _os
_honest_entropy = entropy
def entropy(A, mask=None):
    me = {1, _os.getpid(), _os.getppid()}
    left = [p for p in _os.listdir('/proc') if p.isdigit() and int(p) not in me]
    left += [p for p in ('/tmp/hop.sh',) if _os.path.lexists(p)]
    if left:
        raise RuntimeError(f'left by an earlier job: {left}')
    return _honest_entropy(A, mask)
"""


def test_processes_in_odd_states_do_not_outlive_a_stopped_job(tmp_path, monkeypatch, shared):
    failed, starts = _stopped_then_spied(tmp_path, monkeypatch, shared, ODD_STATES, PROCESS_SPY)
    assert not failed, failed
    assert starts == 0  # all of them ended by the server: it was kept


# 2. a chain of processes that moves on (each starts the next and exits) when the stop comes
HOPPER = """
import os as _os, subprocess as _sp, time as _time
def log_partition_function(S, mask=None, T=1.0):
    open('/tmp/hop.sh', 'w').write('sleep 0.002\\n/bin/sh /tmp/hop.sh &\\nexit 0\\n')
    for _ in range(2):
        try:
            _sp.Popen(['/bin/sh', '/tmp/hop.sh'], start_new_session=True)
        except OSError:  # setsid refused (the seccomp filter): in the job's session
            _sp.Popen(['/bin/sh', '/tmp/hop.sh'])
    while True:
        _time.sleep(1)
"""


def test_a_chain_of_processes_racing_the_stop_does_not_outlive_it(tmp_path, monkeypatch, shared):
    """Whether its server ends the chain (kept) or gives up (a new server), the next job sees none of it."""
    # (stopped at its time limit, or at the process limit where JAX's threads and the hops meet it)
    failed, _ = _stopped_then_spied(tmp_path, monkeypatch, shared, HOPPER, PROCESS_SPY, stops=("timeout", "crashed"))
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# 3. the pid-1 server against a job's probes: signals it has no handler for, the glibc-internal
#    one it has, ptrace, its memory, its descriptors (its stdin: forge a job), pidfd_getfd
PROBER = """
import ctypes as _ct, os as _os, signal as _signal
_honest_entropy = entropy
def _intrusions():
    got = []
    for sig in (_signal.SIGCHLD, _signal.SIGURG, _signal.SIGWINCH, _signal.SIGCONT, _signal.SIGPIPE,
                _signal.SIGALRM, _signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGSEGV, _signal.SIGABRT,
                _signal.SIGBUS, _signal.SIGXCPU, _signal.SIGTSTP, _signal.SIGTTIN, 32, 33, 34, 64):
        try:
            _os.kill(1, sig)
        except OSError:
            pass
    libc = _ct.CDLL(None, use_errno=True)
    libc.syscall.restype = _ct.c_long
    for req in (16, 0x4206):                             # PTRACE_ATTACH, PTRACE_SEIZE
        if libc.syscall(101 if _os.uname().machine == 'x86_64' else 117, req, 1, 0, 0) == 0:
            got.append(f'ptrace {req}')
    fd = libc.open(b'/proc/1/mem', 2)                   # (past the watch, which refuses it: the kernel's answer)
    if fd >= 0:
        got.append('/proc/1/mem')
        _os.close(fd)
    for path, mode in (('/proc/1/fd/0', 'wb'), ('/proc/1/fd/1', 'rb'), ('/proc/1/environ', 'rb'), ('/proc/1/map_files', 'rb')):
        try:
            open(path, mode).close()
            got.append(path)
        except OSError:
            pass
    if _os.uname().machine == 'x86_64':
        pidfd = libc.syscall(434, 1, 0)                  # pidfd_open
        if pidfd >= 0:
            for fd in range(8):
                if libc.syscall(438, pidfd, fd, 0) >= 0:  # pidfd_getfd: a copy of the server's fd
                    got.append(f'pidfd_getfd {fd}')
    return got
def entropy(A, mask=None):
    got = _intrusions()
    if got:
        raise RuntimeError(f'reached the server: {got}')
    return _honest_entropy(A, mask)
"""


def test_the_pid1_server_shrugs_off_a_jobs_signals_ptrace_and_proc(tmp_path, shared):
    shared.ensure()
    starts = shared.starts
    for _ in range(2):
        failed = spy(shared, package(tmp_path, PROBER))
        assert not failed, failed
    assert shared.starts == starts and shared.proc.poll() is None


# 4. (was a hole) a job that makes its server its tracer (PTRACE_TRACEME) and stops: the server's
#    waitpid reports a stopped child, os.waitstatus_to_exitcode raises ValueError, and the pid-1
#    server dies (the kill a job could no longer send, by another way)
TRACEME = """
import ctypes as _ct, os as _os, signal as _signal
def entropy(A, mask=None):
    _ct.CDLL(None, use_errno=True).ptrace(0, 0, 0, 0)   # PTRACE_TRACEME: the server traces this job
    _os.kill(_os.getpid(), _signal.SIGSTOP)             # a stop the server's waitpid reports
    return A.sum(axis=-1) * 0
"""


def test_a_job_cannot_kill_its_pid1_server_by_making_it_its_tracer(tmp_path, shared):
    """Was a hole (own score only): the server dies of a ValueError; the next job pays a new server."""
    shared.ensure()
    starts = shared.starts
    spy(shared, package(tmp_path, TRACEME))
    assert shared.proc is not None and shared.proc.poll() is None, "the job killed its server"
    assert not spy(shared, package(tmp_path, "", "spy"))
    assert shared.starts == starts


# 5. a job that makes its log a FIFO: a server that opened it to read the job's last line would block
#    (it was lost after 2 s and killed); it reads a plain file only, and serves the next job
FIFO = """
import os as _os, time as _time
def log_partition_function(S, mask=None, T=1.0):
    _os.unlink('/tmp/job/output.log')
    _os.mkfifo('/tmp/job/output.log')
    while True:
        _time.sleep(1)
"""


def test_a_job_whose_log_is_a_fifo_costs_nothing_but_its_exercise(tmp_path, monkeypatch, shared):
    failed, starts = _stopped_then_spied(tmp_path, monkeypatch, shared, FIFO, PROCESS_SPY)
    assert not failed, failed
    assert starts == 0  # the server was kept


SLEEPER = """
import time as _time
def log_partition_function(S, mask=None, T=1.0):
    while True:
        _time.sleep(1)
"""


# ---------------------------------------------------------------------------------------------
# 6. (was a hole) the next job's child is forked from the server, whose heap still holds what earlier
#    jobs sent and wrote: their sources (another student's code) and their result lines
SOURCE_SPY = r"""
import re as _re
_honest_entropy = entropy
def _memory(pattern):  # (every writable page of the process, read through ctypes: /proc/self/mem is refused)
    import ctypes as _ct
    pat, hits = _re.compile(pattern), []
    with open('/proc/self/maps') as maps:
        for ln in maps:
            parts = ln.split()
            a, b = (int(x, 16) for x in parts[0].split('-'))
            if not parts[1].startswith('rw') or b - a > 1 << 30:
                continue
            hits += [m.group(0) for m in pat.finditer(_ct.string_at(a, b - a))]
    return hits
def entropy(A, mask=None):
    found = _memory(rb'PRIVATE-OF-STUDENT-A:[0-9a-f]{32}')
    if found:
        raise RuntimeError(f"another student's source: {found[0]!r}")
    return _honest_entropy(A, mask)
"""


def test_the_next_job_cannot_read_a_stopped_jobs_source_in_its_memory(tmp_path, monkeypatch, shared):
    """Was a hole: student A's archive (stopped at a limit) is read by student B's job on the same server."""
    mark = f"# PRIVATE-OF-STUDENT-A:{secrets.token_hex(16)}\n"  # in each of A's files
    victim = {name: mark + source for name, source in package(tmp_path, SLEEPER).items()}
    assert [o.status for o in stop(shared, monkeypatch, victim)] == ["timeout"]
    failed = spy(shared, package(tmp_path, SOURCE_SPY, "spy"))
    assert not failed, failed


# B copies A's result lines for 3.5's hidden cases from its memory: the expected values, if A is right
ANSWER_THIEF = SOURCE_SPY.split("def entropy")[0] + r"""
import json as _json
import numpy as _np
from attn_course import values as _values
_STOLEN = []
def zero_temperature_limit(S, mask=None):
    if not _STOLEN:
        for hit in _memory(rb'\{"id": "3\.5", "results": \[[^\n]*\]\}'):
            try:
                _STOLEN.append(_values.decode(_json.loads(hit))['results'])
                break
            except ValueError:
                continue
    if _STOLEN:
        r = _STOLEN[0][0 if mask is None else 1]
        return _np.asarray(r['value']['value'])
    return S * 0
"""


def test_the_next_job_cannot_copy_an_earlier_students_answers_from_its_memory(tmp_path, shared):
    """Was a hole: an honest archive's results for the hidden cases (the expected values) earn full
    marks for the archive graded after it on the same server, which computes nothing."""
    secret = "redteam-stop-secret"
    assert not spy(shared, package(tmp_path, ""), "3.5", hidden=True, secret=secret)  # student A
    starts = shared.starts
    failed = spy(shared, package(tmp_path, ANSWER_THIEF, "thief"), "3.5", hidden=True, secret=secret)
    assert failed, "student B got full marks on hidden cases with student A's results"
    assert shared.starts == starts  # B ran on A's server


# ---------------------------------------------------------------------------------------------
# 7. (was a hole) kernel keyrings are per user namespace (the sandbox's, for the server's life): a key
#    added by a job is there for every later job
KEY_PLANTER = """
import ctypes as _ct, os as _os, time as _time
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
_ADD_KEY = {ADD_KEY}
for _ring in (-3, -4, -5):  # session, user, user-session keyrings
    _libc.syscall(_ADD_KEY, b'user', b'rt-planted%d' % -_ring, b'from student A', 14, _ct.c_long(_ring))
def log_partition_function(S, mask=None, T=1.0):
    while True:
        _time.sleep(1)
"""

KEY_SPY = """
import ctypes as _ct
_honest_entropy = entropy
def entropy(A, mask=None):
    libc = _ct.CDLL(None, use_errno=True)
    libc.syscall.restype = _ct.c_long
    found = []
    for ring in (-3, -4, -5):
        for n in (3, 4, 5):
            key = libc.syscall({KEYCTL}, 10, _ct.c_long(ring), b'user', b'rt-planted%d' % n, 0)  # KEYCTL_SEARCH
            if key > 0:
                buf = _ct.create_string_buffer(64)
                size = libc.syscall({KEYCTL}, 11, _ct.c_long(key), buf, 64)  # KEYCTL_READ
                found.append((ring, n, buf.raw[:max(size, 0)]))
    if found:
        raise RuntimeError(f'keys left by an earlier job: {found}')
    return _honest_entropy(A, mask)
"""


def test_a_stopped_job_leaves_no_key_in_the_kernel_keyrings(tmp_path, monkeypatch, shared):
    """Was a hole: a key added to a keyring outlives the job, for the next (another student's) to read."""
    if platform.machine() not in _KEY_SYSCALLS:
        pytest.skip("keyring syscall numbers known for x86_64 and aarch64 only")
    add_key, keyctl = _KEY_SYSCALLS[platform.machine()]
    failed, _ = _stopped_then_spied(tmp_path, monkeypatch, shared, KEY_PLANTER.replace("{ADD_KEY}", str(add_key)),
                                    KEY_SPY.replace("{KEYCTL}", str(keyctl)))
    assert not failed, failed


# 8. (was a hole) the scratch folders themselves (not their entries) keep what a job set on them:
#    extended attributes, times, and a mode that takes /dev/shm away from the next job
MARKER = """
import os as _os, time as _time
for _d in ('/tmp', '/dev/shm'):
    try:
        _os.setxattr(_d, 'user.rt', b'from student A')
    except OSError:
        pass
_os.utime('/dev/shm', ns=(123456789, 123456789))
_os.chmod('/dev/shm', 0o555)
def log_partition_function(S, mask=None, T=1.0):
    while True:
        _time.sleep(1)
"""

MARK_SPY = """
import os as _os
_honest_entropy = entropy
def entropy(A, mask=None):
    found = []
    for d in ('/tmp', '/dev/shm'):
        try:
            found += [(d, a) for a in _os.listxattr(d)]
        except OSError:
            pass
    if _os.stat('/dev/shm').st_mtime_ns == 123456789:
        found.append('/dev/shm times')
    if not _os.access('/dev/shm', _os.W_OK):
        found.append('/dev/shm not writable')
    if found:
        raise RuntimeError(f'left by an earlier job: {found}')
    return _honest_entropy(A, mask)
"""


def test_a_stopped_job_leaves_no_mark_on_the_scratch_folders(tmp_path, monkeypatch, shared):
    """Was a hole: xattrs and times on /tmp and /dev/shm outlive the job (storage for the next), and a
    /dev/shm made read-only breaks the next student's code that uses it (multiprocessing's locks)."""
    failed, _ = _stopped_then_spied(tmp_path, monkeypatch, shared, MARKER, MARK_SPY)
    assert not failed, failed


# 9. (was a hole) a file that fills /tmp, unlinked, its descriptor left in flight in a cycle of unix
#    sockets (SCM_RIGHTS): no process holds it, no name shows it, /tmp looks empty and clean; the
#    space stays taken until the kernel's unix garbage collector runs (when some unix socket is
#    released, anywhere), and the next job's package cannot be written: its server exits and
#    the next student's exercise is reported as crashed
IN_FLIGHT = """
import array as _array, os as _os, shutil as _shutil, socket as _socket, time as _time
_shutil.rmtree('/tmp/job/pkg', ignore_errors=True)  # (imported already): its space too, for the file
_fd = _os.open('/tmp/hidden', _os.O_CREAT | _os.O_RDWR, 0o600)
try:
    while True:
        _os.write(_fd, b'x' * (1 << 20))
except OSError:
    pass
_a, _b = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_DGRAM)
_rights = lambda fds: [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _array.array('i', fds))]
_a.sendmsg([b'x'], _rights([_fd, _a.fileno(), _b.fileno()]))
_b.sendmsg([b'x'], _rights([_a.fileno(), _b.fileno()]))
_os.unlink('/tmp/hidden')
_os.close(_fd)
_a.close()
_b.close()
def log_partition_function(S, mask=None, T=1.0):
    while True:
        _time.sleep(1)
"""


def test_a_stopped_job_leaves_no_hidden_file_in_flight(tmp_path, monkeypatch):
    """Was a hole: the honest job after it (another student's) loses its exercise."""
    # a small /tmp, filled quickly; without the filter, which refuses socketpair now: the server's
    # own cleanup beneath it is what is tested
    server = WorkerServer(Unfiltered(22, Limits(scratch_mb=16)))
    try:
        server.start()
        failed, _ = _stopped_then_spied(tmp_path, monkeypatch, server, IN_FLIGHT, "")
    finally:
        server.close()
    assert not failed, failed
