"""Red team: what a job can set on EVERY process of its uid or process group (not one pid), the
per-process state a later child inherits that ``_marks`` does not read, work left pending in the
kernel past the job's end (io_uring), and a job that makes the after-job cleanup slow.

Each test runs a real server in bubblewrap (slot 60, shared by the file; a new one wherever an
attack leaves the sandbox unclean; slots 61-62 for the attacks that the server does not see, so
that their mark cannot reach the file's other tests): an ATTACK job (module-level code appended to
``statmech.py``, run at import in the job's child, whose parent is the template), then a SPY job
on the same WorkerServer, which must get full credit and see nothing of the attacker.

Not holes (the server's ``_marks`` sees the change on its own or its template's main thread, and a
new sandbox serves the next job): ``setpriority(PRIO_USER)`` and ``setpriority(PRIO_PGRP)`` (every
process of the uid / of the server's process group in the pid namespace, server and template
included, reniced to 19 at once), ``ioprio_set(IOPRIO_WHO_USER / IOPRIO_WHO_PGRP)`` to the idle
class, an io_uring with a timeout hard-linked to a ``mkdirat`` left pending when the job ends
(cancelled with its ring when the job's process exits; an io_uring cannot be put in flight in a
unix socket; since, a job's seccomp filter refuses io_uring altogether), and 100 000 files in ``/tmp`` with a directory chain deeper than ``PATH_MAX`` in
``/dev/shm`` (the server removes the files, about 3 s charged to the attacker's job, fails on the
chain, calls the sandbox unclean, and a new one serves the next job, whole).

Two were holes, closed in ``attn_course/worker.py`` since: the template's ``RLIMIT_LOCKS`` (resource 10: Python's ``resource`` module
has no name for it, so ``_RLIMITS``, built from ``dir(resource)``, skips it; ``prlimit`` needs only
the same uid) and the template's ``/proc/<pid>/coredump_filter`` (not read by ``_marks``; written
where the grader runs as the host's root: the non-dumpable template's ``/proc`` files are then owned
by the sandbox's uid).  Both are inherited by every later child, which reads them in itself: a
channel of 64 bits (or 9) from one student's job to the next's.  ``_marks`` now compares
every resource limit up to ``RLIM_NLIMITS`` and the core dump filter too.
"""

from __future__ import annotations

import os
import platform
import resource

import pytest

from attn_course.seccomp import ARCHES
from server_jobs import attacked_then_spied, bwrap_server, fresh_server, needs_bwrap, package, spy, spy_source

pytestmark = pytest.mark.slow

RAW = platform.machine() in ("x86_64", "aarch64")  # the raw system call numbers below
RLIMIT_LOCKS = 10  # linux/resource.h; no name for it in Python's resource module


@pytest.fixture(autouse=True)
def _needs_bwrap():
    needs_bwrap()


@pytest.fixture(scope="module")
def server():
    """One server for the file's attacks (started again by the next job where an attack breaks it)."""
    yield from bwrap_server(60)


# ---------------------------------------------------------------------------------------------
# 1. nice for a whole uid or process group: setpriority(PRIO_USER) reaches every process of the
#    caller's uid that its pid namespace sees (the server, pid 1, and the template), every thread
#    of them; PRIO_PGRP every process of a group (the server's, which the template shares).
#    Raising nice needs no capability.  The next child would run at nice 19 all its life
NICE_SPY = """
for who in (0, 1, _os.getppid()):
    if _os.getpriority(_os.PRIO_PROCESS, who) != {NICE}:
        found.append(('nice', who, _os.getpriority(_os.PRIO_PROCESS, who)))
for task in _os.listdir('/proc/self/task'):
    if _os.getpriority(_os.PRIO_PROCESS, int(task)) != {NICE}:
        found.append(('thread nice', task))
"""

PRIO_USER = """
import os as _os
_os.setpriority(_os.PRIO_USER, _os.getuid(), 19)
"""

PRIO_PGRP = """
import os as _os
for _p in (_os.getppid(), 1):
    try:
        _g = _os.getpgid(_p)
        if _g > 0:
            _os.setpriority(_os.PRIO_PGRP, _g, 19)
    except OSError:
        pass
"""


def _nice_spy() -> str:
    return spy_source(NICE_SPY.replace("{NICE}", str(os.getpriority(os.PRIO_PROCESS, 0))))


@pytest.mark.parametrize("attack", [PRIO_USER, PRIO_PGRP], ids=["PRIO_USER", "PRIO_PGRP"])
def test_a_job_cannot_renice_its_uid_or_process_group(tmp_path, server, attack):
    """setpriority(PRIO_USER / PRIO_PGRP, ..., 19): the next child must run at its server's first nice."""
    _, failed = attacked_then_spied(tmp_path, server, attack, _nice_spy())
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# 2. the idle I/O class for a whole uid and process group (ioprio_set with IOPRIO_WHO_USER and
#    IOPRIO_WHO_PGRP, no capability for the idle class): every later child inherits it from the
#    template and gets the disk only when nothing else on the machine wants it
IOPRIO = """
import ctypes as _ct, os as _os
_libc = _ct.CDLL(None, use_errno=True)
_nr = {'x86_64': 251, 'aarch64': 30}[_os.uname().machine]      # ioprio_set
_idle = (3 << 13) | 7                                           # IOPRIO_CLASS_IDLE, level 7
_libc.syscall(_nr, 3, _os.getuid(), _idle)                      # IOPRIO_WHO_USER
for _p in (_os.getppid(), 1):
    try:
        _g = _os.getpgid(_p)
        if _g > 0:
            _libc.syscall(_nr, 2, _g, _idle)                    # IOPRIO_WHO_PGRP
    except OSError:
        pass
"""

IOPRIO_SPY = """
libc = _ct.CDLL(None, use_errno=True)
nr = {'x86_64': 252, 'aarch64': 31}[_os.uname().machine]       # ioprio_get
for who in (0, 1, _os.getppid()):
    io = libc.syscall(nr, 1, who)                                # IOPRIO_WHO_PROCESS
    if io >= 0 and io >> 13 == 3:
        found.append(('idle I/O class', who, io))
"""


@pytest.mark.skipif(not RAW, reason="raw syscall numbers")
def test_a_job_cannot_give_its_uid_the_idle_io_class(tmp_path, server):
    """ioprio_set(IOPRIO_WHO_USER / _PGRP, idle): the next child must not be in the idle I/O class."""
    _, failed = attacked_then_spied(tmp_path, server, IOPRIO, spy_source(IOPRIO_SPY))
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# 3. io_uring: a 1.5 s timeout hard-linked to mkdirat('/tmp/attn-io-uring'), submitted at import;
#    if the ring outlived the job's process, the directory would appear in the NEXT job's scratch
#    (after the server's cleanup).  The attacker first checks that io_uring works here at all (an
#    immediate mkdirat, waited for): its own case fails, and the test is skipped, where it does not
IO_URING = """
import ctypes as _ct, mmap as _mmap, os as _os, struct as _struct
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
_keep = []

def _ring_ops(ops):
    # ops: (opcode, flags, fd, addr, length, off); submitted at once, not waited for; the ring's fd
    params = _ct.create_string_buffer(120)
    fd = _libc.syscall(425, 8, params)                          # io_uring_setup (same on both machines)
    if fd < 0:
        raise OSError(_ct.get_errno(), 'io_uring_setup')
    sq_entries, = _struct.unpack_from('I', params.raw, 0)
    sq = _struct.unpack_from('IIIIIIII', params.raw, 40)        # offsets: head tail mask entries flags dropped array
    sq_ring = _mmap.mmap(fd, sq[6] + 4 * sq_entries, _mmap.MAP_SHARED, _mmap.PROT_READ | _mmap.PROT_WRITE, offset=0)
    sqes = _mmap.mmap(fd, 64 * sq_entries, _mmap.MAP_SHARED, _mmap.PROT_READ | _mmap.PROT_WRITE, offset=0x10000000)
    tail, mask = _struct.unpack_from('I', sq_ring, sq[1])[0], _struct.unpack_from('I', sq_ring, sq[2])[0]
    for i, (opcode, flags, dfd, addr, length, off) in enumerate(ops):
        slot = (tail + i) & mask
        sqes[64 * slot:64 * slot + 64] = _struct.pack('BBHiQQII', opcode, flags, 0, dfd, off, addr, length, 0).ljust(64, bytes(1))
        _struct.pack_into('I', sq_ring, sq[6] + 4 * slot, slot)
    _struct.pack_into('I', sq_ring, sq[1], tail + len(ops))
    n = _libc.syscall(426, fd, len(ops), 0, 0, None, 0)         # io_uring_enter
    if n != len(ops):
        raise OSError(_ct.get_errno(), f'io_uring_enter submitted {n}')
    _keep.extend([sq_ring, sqes])
    return fd

def _path(text):
    buf = _ct.create_string_buffer(text.encode())
    _keep.append(buf)
    return _ct.addressof(buf)

_ok = None
try:
    _fd = _ring_ops([(37, 0, -100, _path('/tmp/attn-io-uring-now'), 0o755, 0)])   # IORING_OP_MKDIRAT, now
    import time as _time
    for _ in range(200):
        if _os.path.isdir('/tmp/attn-io-uring-now'):
            _ok = True
            break
        _time.sleep(0.005)
    _ts = _ct.create_string_buffer(_struct.pack('qq', 1, 500_000_000))       # 1.5 s
    _keep.append(_ts)
    _ring_ops([(11, 1 << 3, -1, _ct.addressof(_ts), 1, 0),                     # IORING_OP_TIMEOUT, hard link
               (37, 0, -100, _path('/tmp/attn-io-uring'), 0o755, 0)])          # then IORING_OP_MKDIRAT
except OSError as _err:
    _ok = str(_err)
_honest = entropy
def entropy(A, mask=None):
    if _ok is not True:
        raise RuntimeError(f'io_uring unusable: {_ok}')
    return _honest(A, mask)
"""

IO_URING_SPY = """
for _ in range(50):                # 2.5 s: past the attacker's 1.5 s timeout, wherever it began
    if _os.path.exists('/tmp/attn-io-uring'):
        found.append('an earlier job\\'s io_uring made /tmp/attn-io-uring')
        break
    _time.sleep(0.05)
"""


@pytest.mark.skipif(not RAW, reason="raw syscall numbers")
def test_io_uring_work_left_pending_does_not_reach_the_next_job(tmp_path, server):
    """A timeout linked to a mkdirat, pending in an io_uring when the job ends: nothing in the next job's /tmp.

    Where the job's seccomp filter is installed (:mod:`attn_course.seccomp`: Linux on x86-64 or
    aarch64) io_uring_setup itself is refused, with EPERM, and nothing can be left pending."""
    own = spy(server, package(tmp_path, IO_URING))
    if platform.machine() in ARCHES:
        assert own and all("io_uring unusable: [Errno 1]" in m and "io_uring_setup" in m for m in own), own
        return
    if any("io_uring unusable" in m for m in own):
        pytest.skip(f"io_uring is not usable in the sandbox: {own[0]}")
    assert not own, own
    assert not spy(server, package(tmp_path, spy_source(IO_URING_SPY), "spy"))


# ---------------------------------------------------------------------------------------------
# 4. a slow cleanup: 100 000 files in /tmp (the server removes them one by one, in Python), and in
#    /dev/shm a chain of directories deeper than PATH_MAX (and Python's recursion limit) that the
#    server's absolute paths cannot reach: it may cost the attacker (and its server), never the next
#    job's credit or a clean scratch
MANY_FILES = """
import os as _os
_os.mkdir('/tmp/many')
for _i in range(100000):
    _os.close(_os.open(f'/tmp/many/{_i}', _os.O_CREAT | _os.O_WRONLY, 0o600))
_os.chdir('/dev/shm')
for _ in range(2500):
    _os.mkdir('d')
    _os.chdir('d')
_os.chdir('/')
"""

MANY_SPY = """
for path in ('/tmp/many', '/dev/shm/d'):
    if _os.path.lexists(path):
        found.append(('left in the scratch', path))
"""


def test_a_slow_cleanup_costs_only_the_attacker(tmp_path, server):
    """100 000 files in /tmp, a directory chain deeper than PATH_MAX in /dev/shm: the next job gets full credit, in a clean scratch."""
    _, failed = attacked_then_spied(tmp_path, server, MANY_FILES, spy_source(MANY_SPY))
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# 5. inherited state that _marks does not read: the template's RLIMIT_LOCKS (any value below its
#    hard limit, 64 bits) and its coredump_filter (9 bits of its mm's flags, copied into each
#    child's new mm at fork).  The next child reads them in itself: data from one job to the next
RLIMIT_LOCKS_ATTACK = """
import os as _os, resource as _r
_r.prlimit(_os.getppid(), 10, (4242424242, 4242424242))       # RLIMIT_LOCKS of the template
"""

RLIMIT_LOCKS_SPY = """
if _r.getrlimit(10) != _r.prlimit(1, 10):
    found.append(('RLIMIT_LOCKS', _r.getrlimit(10), 'server', _r.prlimit(1, 10)))
"""

COREDUMP = """
import os as _os
with open(f'/proc/{_os.getppid()}/coredump_filter', 'w') as _f:
    _f.write('0x15a')                                           # 9 bits of the attacker's choice
"""

COREDUMP_SPY = """
mine, server = (open(f'/proc/{p}/coredump_filter').read().strip() for p in ('self', '1'))
if mine != server:
    found.append(('coredump_filter', mine, 'server', server))
"""


def test_the_spies_pass_on_a_clean_server(tmp_path, server):
    """Control: every spy of this file gets full credit after an honest job (on the shared server)."""
    spies = [NICE_SPY.replace("{NICE}", str(os.getpriority(os.PRIO_PROCESS, 0))), RLIMIT_LOCKS_SPY,
             COREDUMP_SPY, MANY_SPY, IO_URING_SPY.replace("range(50)", "range(1)")]
    if RAW:
        spies.append(IOPRIO_SPY)
    _, failed = attacked_then_spied(tmp_path, server, "", spy_source("\n".join(spies)))
    assert not failed, failed


def test_a_job_cannot_pass_data_in_its_templates_rlimit_locks(tmp_path):
    """RLIMIT_LOCKS of the template (ignored by Linux, read by anyone): the next child must not inherit it."""
    assert RLIMIT_LOCKS not in {getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_")}
    with fresh_server(61) as fresh:  # (the mark would stay on the shared server's template)
        _, failed = attacked_then_spied(tmp_path, fresh, RLIMIT_LOCKS_ATTACK, spy_source(RLIMIT_LOCKS_SPY))
    assert not failed, failed


def test_a_job_cannot_pass_data_in_its_templates_coredump_filter(tmp_path):
    """coredump_filter of the template: the next child must have its server's."""
    with fresh_server(62) as fresh:  # (the mark would stay on the shared server's template)
        _, failed = attacked_then_spied(tmp_path, fresh, COREDUMP, spy_source(COREDUMP_SPY))
    assert not failed, failed
