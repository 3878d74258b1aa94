"""Red team: the worker server's template process (the one every job is forked from) and its socket.

Each test runs a real server in bubblewrap: an ATTACK job (another student's archive: its
code runs at import, in the job's child, whose parent is the template), then an honest job
or a SPY on the same WorkerServer (a new one only where the attack left the sandbox unclean),
which must get full credit and see nothing of the attacker.  The tests share one server
(slot 40; a new one wherever an attack leaves it unclean).

Seven of them were holes (the honest job after the attack lost its credit, or ran changed):
a job lowered the template's or the server's resource limits or changed the template's
scheduling (``prlimit``, ``setpriority``, ``sched_set*`` need only the same uid), or left a
descriptor in flight that signalled the template when the next job touched a folder.  The
server now compares the limits and scheduling of both after each job, and finds any unix
socket besides its own pair: either makes the sandbox unclean, and a new one serves the next job.
"""

from __future__ import annotations

import ctypes
import os
import platform

import pytest
from server_jobs import attacked_then_spied, bwrap_server, needs_bwrap, package, spy, unfiltered_server


pytestmark = pytest.mark.slow

X86 = platform.machine() == "x86_64"


@pytest.fixture(autouse=True)
def _needs_bwrap():
    needs_bwrap()


@pytest.fixture(scope="module")
def shared():
    """One server for the file's attacks (started again by the next job where an attack breaks it)."""
    yield from bwrap_server(40)


# ---------------------------------------------------------------------------------------------
# 1. resource limits of the template, set from the job (prlimit needs only the same uid, not
#    ptrace access: a non-dumpable template is no protection); the next child inherits them
TEMPLATE_LIMIT = """
import os as _os, resource as _r
_r.prlimit(_os.getppid(), _r.{RES}, {VALUE})   # the job's parent: the template
"""


@pytest.mark.parametrize("res, value", [
    ("RLIMIT_CPU", "(100, 100)"),        # the next child's setrlimit(CPU, (120, 121)) is refused: it exits 1
    ("RLIMIT_NOFILE", "(3, 3)"),         # the template cannot receive the next results pipe: it dies
    ("RLIMIT_AS", "(1 << 28, 1 << 28)"),  # 256 MB: the next child cannot start JAX
])
def test_a_job_cannot_lower_its_templates_resource_limits(tmp_path, shared, res, value):
    """prlimit() on the template: the next (honest) job must still get full credit."""
    _, failed = attacked_then_spied(tmp_path, shared, TEMPLATE_LIMIT.replace("{RES}", res).replace("{VALUE}", value))
    assert not failed, failed


# 2. the same on the server (pid 1 of the sandbox, same uid): a file size limit of 0 makes it
#    fail to write the NEXT job's package (it exits 2 there): the next student's job "crashed"
SERVER_LIMIT = """
import resource as _r
_r.prlimit(1, _r.{RES}, {VALUE})   # the sandbox's pid 1: the server
"""


@pytest.mark.parametrize("res, value", [
    ("RLIMIT_FSIZE", "(0, 0)"),  # the next job's package cannot be written
])
def test_a_job_cannot_lower_its_servers_resource_limits(tmp_path, shared, res, value):
    """prlimit() on pid 1 (the server): the next (honest) job must still get full credit."""
    _, failed = attacked_then_spied(tmp_path, shared, SERVER_LIMIT.replace("{RES}", res).replace("{VALUE}", value))
    assert not failed, failed


# 3. the template's scheduling (nice, policy, CPUs): every later child inherits it (no crash, but
#    another student's job runs at nice 19 / SCHED_IDLE on one CPU, and times out under load)
SCHEDULER = """
import os as _os
_t = _os.getppid()
_os.setpriority(_os.PRIO_PROCESS, _t, 19)
_os.sched_setscheduler(_t, _os.SCHED_IDLE, _os.sched_param(0))
_os.sched_setaffinity(_t, {min(_os.sched_getaffinity(0))})
"""

# the spy: right only where its own scheduling and limits are those its server started with
SCHED_SPY = """
import os as _os, resource as _r
_honest_entropy = entropy
def entropy(A, mask=None):
    found = []
    if _os.getpriority(_os.PRIO_PROCESS, 0) != _os.getpriority(_os.PRIO_PROCESS, 1):
        found.append(('nice', _os.getpriority(_os.PRIO_PROCESS, 0)))
    if _os.getpriority(_os.PRIO_PROCESS, 1) != {NICE}:
        found.append(('server nice', _os.getpriority(_os.PRIO_PROCESS, 1)))
    if _os.sched_getscheduler(0) != _os.sched_getscheduler(1):
        found.append(('policy', _os.sched_getscheduler(0)))
    if _os.sched_getaffinity(0) != _os.sched_getaffinity(1):
        found.append(('cpus', sorted(_os.sched_getaffinity(0))))
    for name in dir(_r):
        if name.startswith('RLIMIT_') and name not in ('RLIMIT_CPU', 'RLIMIT_MSGQUEUE'):
            res = getattr(_r, name)
            if _r.getrlimit(res) != _r.prlimit(1, res):
                found.append((name, _r.getrlimit(res), _r.prlimit(1, res)))
    if found:
        raise RuntimeError(f'changed by an earlier job: {found}')
    return _honest_entropy(A, mask)
"""


def test_a_job_cannot_change_the_scheduling_of_later_jobs(tmp_path, shared):
    """nice/policy/affinity of the template: the next child must run as its server started."""
    spy_code = SCHED_SPY.replace("{NICE}", str(os.getpriority(os.PRIO_PROCESS, 0)))
    _, failed = attacked_then_spied(tmp_path, shared, SCHEDULER, spy_code)
    assert not failed, failed


def test_the_sched_spy_passes_on_a_clean_server(tmp_path, shared):
    """Control: the spy of test 3 gets full credit after an honest job (it is not itself the failure)."""
    spy_code = SCHED_SPY.replace("{NICE}", str(os.getpriority(os.PRIO_PROCESS, 0)))
    _, failed = attacked_then_spied(tmp_path, shared, "", spy_code)
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# 4. a signal for LATER: an inotify descriptor on /tmp (IN_CREATE only: the server's cleanup
#    removes and chmods, and creates nothing), owned (F_SETOWN) by the template, with F_SETSIG =
#    SIGKILL and O_ASYNC; held by no process (in flight in a cycle of unix sockets), so it
#    outlives the job.  The server's mkdir of /tmp/job for the NEXT job fires it: the template
#    dies before it can fork the next student's child
DELAYED_KILL = """
import array as _array, ctypes as _ct, fcntl as _fcntl, os as _os, signal as _signal, socket as _socket
_libc = _ct.CDLL(None, use_errno=True)
_fd = _libc.inotify_init1(0)
_libc.inotify_add_watch(_fd, b'/tmp', 0x100)          # IN_CREATE
_fcntl.fcntl(_fd, _fcntl.F_SETOWN, _os.getppid())     # its signals go to the template
_fcntl.fcntl(_fd, 10, _signal.{SIG})                  # F_SETSIG
_fcntl.fcntl(_fd, _fcntl.F_SETFL, _fcntl.fcntl(_fd, _fcntl.F_GETFL) | _os.O_ASYNC)
_a, _b = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_DGRAM)
_rights = lambda fds: [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _array.array('i', fds))]
_a.sendmsg([b'x'], _rights([_fd, _a.fileno(), _b.fileno()]))
_b.sendmsg([b'x'], _rights([_a.fileno(), _b.fileno()]))
_os.close(_fd)
_a.close()
_b.close()
"""


def test_a_job_cannot_leave_a_signal_that_kills_the_template_at_the_next_job(tmp_path):
    """A SIGIO-style SIGKILL armed for the next job's mkdir: the next job must still get full credit.
    (The filter refuses socketpair now: on a server without it, the cleanup beneath is tested.)"""
    with unfiltered_server(27) as server:
        _, failed = attacked_then_spied(tmp_path, server, DELAYED_KILL.replace("{SIG}", "SIGKILL"))
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# 5. signals the template cannot ignore, in odd orders
FLICKER = """
import os as _os, signal as _signal, time as _time
_t = _os.getppid()
for _ in range(200):   # stopped and continued again and again, each stop far shorter than 0.25 s
    _os.kill(_t, _signal.SIGSTOP)
    _os.kill(_t, _signal.SIGCONT)
    _time.sleep(0.001)
"""


def test_a_template_stopped_and_continued_quickly_leaves_the_next_job_whole(tmp_path, shared):
    """SIGSTOP/SIGCONT flicker on the template (below the 0.25 s look): the next job gets full credit."""
    _, failed = attacked_then_spied(tmp_path, shared, FLICKER)
    assert not failed, failed


STOP_AND_LEAVE = """
import os as _os, signal as _signal, time as _time
_t = _os.getppid()
if _os.fork() == 0:          # continues the template just before the server's 0.25 s look, for ever
    try: _os.setsid()  # (refused by the filter: the job's session then)
    except OSError: pass
    while True:
        _time.sleep(0.2)
        _os.kill(_t, _signal.SIGCONT)
        _os.kill(_t, _signal.SIGSTOP)
_os.kill(_t, _signal.SIGSTOP)
"""


def test_a_template_kept_stopped_by_a_helper_does_not_reach_the_next_job(tmp_path, shared):
    """A helper keeps the template stopped between looks; the next job is another server's or whole."""
    _, failed = attacked_then_spied(tmp_path, shared, STOP_AND_LEAVE)
    assert not failed, failed


STOP_ALL = """
import os as _os, signal as _signal
_os.kill(-1, _signal.SIGSTOP)   # every process it may signal (not pid 1): the template too
"""


def test_kill_minus_one_sigstop_costs_only_the_attacker(tmp_path, shared):
    """kill(-1, SIGSTOP) stops the template: a new server, the next job whole."""
    _, failed = attacked_then_spied(tmp_path, shared, STOP_ALL)
    assert not failed, failed


KILL_TEMPLATE_LATE = """
import os as _os, signal as _signal, time as _time
_t = _os.getppid()
if _os.fork() == 0:          # outlives the child by a moment: kills the template as the server cleans up
    try: _os.setsid()  # (refused by the filter: the job's session then)
    except OSError: pass
    _time.sleep(0.0)
    while True:
        try:
            _os.kill(_t, _signal.SIGSTOP)
        except OSError:
            pass
"""


def test_a_helper_racing_the_cleanup_to_stop_the_template_costs_only_the_attacker(tmp_path, shared):
    """A helper stops the template in a loop while the server ends the job and cleans up."""
    _, failed = attacked_then_spied(tmp_path, shared, KILL_TEMPLATE_LATE)
    assert not failed, failed


# 6. a sibling of the job's child, made with CLONE_PARENT: a child of the template that the
#    template never waits for (a zombie of it once killed, that no one reaps)
CLONE_PARENT = """
import ctypes as _ct, os as _os, time as _time
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
_pid = _libc.syscall(56 if _os.uname().machine == 'x86_64' else 220, 0x8000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT|SIGCHLD)
if _pid == 0:
    while True:
        _time.sleep(1)
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="raw clone numbers")
def test_a_clone_parent_sibling_of_the_job_does_not_reach_the_next_job(tmp_path, shared):
    """CLONE_PARENT: a second child of the template, killed but never reaped by it."""
    _, failed = attacked_then_spied(tmp_path, shared, CLONE_PARENT)
    assert not failed, failed


# 7. the template's memory, descriptors (the socket to the server) and ptrace, from the job
TEMPLATE_PROBER = """
import ctypes as _ct, os as _os, socket as _socket
_honest_entropy = entropy
def _intrusions():
    t, got = _os.getppid(), []
    libc = _ct.CDLL(None, use_errno=True)
    libc.syscall.restype = _ct.c_long
    x86 = _os.uname().machine == 'x86_64'
    for req in (16, 0x4206):                             # PTRACE_ATTACH, PTRACE_SEIZE
        if libc.syscall(101 if x86 else 117, req, t, 0, 0) == 0:
            got.append(f'ptrace {req}')
    fd = libc.open(f'/proc/{t}/mem'.encode(), 0)         # (past the watch, which refuses it: the kernel's answer)
    if fd >= 0:
        got.append(f'/proc/{t}/mem')
        _os.close(fd)
    for path, mode in ((f'/proc/{t}/environ', 'rb'), (f'/proc/{t}/fd/3', 'rb'),
                       (f'/proc/{t}/fd/0', 'wb'), (f'/proc/{t}/fd/1', 'rb')):
        try:
            open(path, mode).close()
            got.append(path)
        except OSError:
            pass
    try:
        fds = _os.listdir(f'/proc/{t}/fd')   # (the numbers alone are in sight: nothing to use)
    except OSError:
        fds = []
    for n in fds:
        for mode in ('rb', 'wb'):
            try:
                open(f'/proc/{t}/fd/{n}', mode).close()
                got.append(f'open fd {n} {mode}')
            except OSError:
                pass
        for what in ('fd', 'fdinfo'):
            try:
                got.append(f'{what} {n}: ' + (_os.readlink(f'/proc/{t}/fd/{n}') if what == 'fd'
                                              else open(f'/proc/{t}/fdinfo/{n}').read()[:40]))
            except OSError:
                pass
    for fd in (4, 6):        # the template's socket: connect to it as a unix socket path via /proc
        try:
            s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
            s.connect(f'/proc/{t}/fd/{fd}')
            got.append(f'connect fd {fd}')
        except OSError:
            pass
    pidfd = libc.syscall(434 if x86 else 434, t, 0)      # pidfd_open
    if pidfd >= 0:
        for fd in range(16):
            if libc.syscall(438, pidfd, fd, 0) >= 0:     # pidfd_getfd: the template's socket?
                got.append(f'pidfd_getfd {fd}')
    return got
def entropy(A, mask=None):
    got = _intrusions()
    if got:
        raise RuntimeError(f'reached the template: {got}')
    return _honest_entropy(A, mask)
"""


def test_a_job_cannot_reach_its_templates_memory_descriptors_or_ptrace(tmp_path, shared):
    """ptrace, /proc/<template>/{mem,environ,fd,fdinfo}, pidfd_getfd, connect: none reaches the template."""
    shared.ensure()
    assert not spy(shared, package(tmp_path, TEMPLATE_PROBER))


# the same, fired INSIDE the next student's job: IN_OPEN on /dev/null, which only a job's child
# opens (``sys.stdin = open(os.devnull)`` in _child, after its pid is reported), with F_SETSIG =
# SIGSTOP: the template stops during the honest job, the server's 0.25 s look ends that job and
# reports it as "it stopped the process it was started from" (-19): the honest student is blamed
DELAYED_STOP = DELAYED_KILL.replace("b'/tmp', 0x100)          # IN_CREATE", "b'/dev/null', 0x20)     # IN_OPEN")


def test_a_job_cannot_have_the_next_job_blamed_for_stopping_the_template(tmp_path, shared):
    """A SIGSTOP armed for the next child's open of /dev/null: the next job must not be blamed (-19)."""
    assert "0x20" in DELAYED_STOP
    # (3.4, whose job outlasts the server's 0.25 s look at the template; 3.2's can end before it)
    _, failed = attacked_then_spied(tmp_path, shared, DELAYED_STOP.replace("{SIG}", "SIGSTOP"), ex_id="3.4")
    assert not failed, failed
