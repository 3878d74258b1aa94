"""Red team: per-process and kernel state that a job can leave behind, which the server's checks
after each job (``_marks``, ``_unix_sockets``, ``_no_keys``, ``_sysv_ipc``, ``_as_before``) must see.

Each test runs a real server in bubblewrap (slot 50, shared by the file; a new one wherever an
attack leaves the sandbox unclean): an ATTACK job (module-level code in the package, run at
import in the job's child, whose parent is the template), then a SPY or honest job on the same
WorkerServer, which must get full credit and see nothing of the attacker.

Six of them were holes (the spy saw the attacker's mark, or the honest job ran changed): the
OOM score adjustment, the scheduler slice (``sched_setattr``) and the autogroup nice of the
template or the server; a keyring and a hidden key (no view permission) in the user's persistent
keyring; TCP connections left in TIME_WAIT.  The server now compares those too after each job,
empties the persistent keyring, and counts the network namespace's inet sockets.
"""

from __future__ import annotations

import os
import platform

import pytest
from server_jobs import (attacked_then_spied, bwrap_server, fresh_server, needs_bwrap, package, spy, spy_source,
                         unfiltered_server)


pytestmark = pytest.mark.slow

X86 = platform.machine() == "x86_64"


@pytest.fixture(autouse=True)
def _needs_bwrap():
    needs_bwrap()


@pytest.fixture(scope="module")
def server():
    """One server for the file's attacks (started again by the next job where an attack breaks it)."""
    yield from bwrap_server(50)


def _own_oom_score_adj() -> str:
    with open("/proc/self/oom_score_adj") as f:
        return f.read().strip()


# ---------------------------------------------------------------------------------------------
# 1. oom_score_adj of the template and the server: writable by a job of the same uid (raising
#    it needs no capability, and in the sandbox's user namespace the non-dumpable processes'
#    /proc files are writable), inherited by every later child: the next student's job is the
#    OOM killer's first choice (and the server, pid 1, its second)
OOM = """
import os as _os
for _p in (_os.getppid(), 1):
    try:
        with open(f'/proc/{_p}/oom_score_adj', 'w') as _f:
            _f.write('1000')
    except OSError:
        pass
"""

# (a job's own process ranks first by design: it writes 1000 before any of the job's code runs;
# its template, the parent, and the server, pid 1, must keep the value they started with)
OOM_SPY = """
for p, want in (('self', '1000'), (str(_os.getppid()), '{BASE}'), ('1', '{BASE}')):
    v = open(f'/proc/{p}/oom_score_adj').read().strip()
    if v != want:
        found.append(('oom_score_adj', p, v))
"""


def test_a_job_cannot_make_later_jobs_the_oom_killers_first_victim(tmp_path, server):
    """oom_score_adj=1000 written to the template and server: the next child must not inherit it."""
    spy_code = spy_source(OOM_SPY.replace("{BASE}", _own_oom_score_adj()))
    _, failed = attacked_then_spied(tmp_path, server, OOM, spy_code)
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# 2. the template's EEVDF slice (sched_setattr with SCHED_OTHER and a sched_runtime, Linux
#    6.12+): same uid is enough, sched_getparam/getscheduler do not show it, and every later child
#    inherits it (here the shortest, 0.1 ms: more preemption and switches for the next student)
SLICE = """
import ctypes as _ct, os as _os, struct as _struct
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
_nr = 314 if _os.uname().machine == 'x86_64' else 274        # sched_setattr
_attr = _struct.pack('IIQiIQQQII', 56, 0, 0, 0, 0, 100000, 0, 0, 0, 0)
_libc.syscall(_nr, _os.getppid(), _ct.c_char_p(_attr), 0)
"""

SLICE_SPY = """
libc = _ct.CDLL(None, use_errno=True)
libc.syscall.restype = _ct.c_long
nr = 315 if _os.uname().machine == 'x86_64' else 275          # sched_getattr
def runtime(pid):
    buf = _ct.create_string_buffer(56)
    libc.syscall(nr, pid, buf, 56, 0)
    return _struct.unpack('IIQiIQQQII', buf.raw)[5]
if runtime(0) != runtime(1):
    found.append(('slice', runtime(0), 'server', runtime(1)))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="raw syscall numbers")
def test_a_job_cannot_change_the_scheduler_slice_of_later_jobs(tmp_path, server):
    """sched_setattr(template, SCHED_OTHER, runtime=0.1 ms): the next child must run with its server's slice."""
    _, failed = attacked_then_spied(tmp_path, server, SLICE, spy_source(SLICE_SPY))
    assert not failed, failed


# (the server places the release's compiled modules beside those that are the release's, byte for
# byte: attn_course.worker.place_release_bytecode; the modules this package changed have none)
BYTECODE_SPY = """
import os as _os
_honest_entropy = entropy
def entropy(A, mask=None):
    cache = _os.path.join(_os.path.dirname(__file__), '__pycache__')
    own = [n for n in (_os.listdir(cache) if _os.path.exists(cache) else [])
           if n.split('.')[0] in ('statmech', 'attention', 'softmax', 'bilinear')]
    if own:
        raise RuntimeError(f'bytecode written: {sorted(own)}')
    return _honest_entropy(A, mask)
"""


def test_a_jobs_package_is_imported_without_writing_its_bytecode(tmp_path, server):
    """A job's modules are imported once, from a folder removed after it: no ``__pycache__`` is
    written beside them (``python -B``; the workers' PYTHONDONTWRITEBYTECODE did nothing under
    ``-I``, and seven files were marshalled and written into the job's scratch each job)."""
    assert spy(server, package(tmp_path, BYTECODE_SPY)) == []


def test_the_spies_pass_on_a_clean_server(tmp_path):
    """Control: every spy of this file gets full credit after an honest job (on a server of its own)."""
    spies = [OOM_SPY.replace("{BASE}", _own_oom_score_adj()), AUTOGROUP_SPY, KEYS_SPY, TCP_SPY]
    if platform.machine() in ("x86_64", "aarch64"):
        spies.append(SLICE_SPY)
    with fresh_server(51) as fresh:
        _, failed = attacked_then_spied(tmp_path, fresh, "", spy_source("\n".join(spies)))
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# 3. the autogroup nice of the server's session (/proc/<template>/autogroup, writable by the same
#    uid): the server and the template (which warms the next job's shapes) run at nice 19 against
#    every other session of the machine, for every later job; _marks reads only the process's nice
AUTOGROUP = """
import os as _os
try:
    with open(f'/proc/{_os.getppid()}/autogroup', 'w') as _f:
        _f.write('19')
except OSError:
    pass
"""

AUTOGROUP_SPY = """
try:
    for p in ('1', str(_os.getppid())):
        line = open(f'/proc/{p}/autogroup').read().split()
        if line[-1] != '0':
            found.append(('autogroup', p, ' '.join(line)))
except OSError:
    pass
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no autogroup scheduling")
def test_a_job_cannot_renice_its_servers_autogroup(tmp_path, server):
    """/proc/<template>/autogroup = 19: the server's session must be as it started for the next job."""
    _, failed = attacked_then_spied(tmp_path, server, AUTOGROUP, spy_source(AUTOGROUP_SPY))
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# 4. the user's PERSISTENT keyring (keyctl KEYCTL_GET_PERSISTENT): it lives as long as the
#    sandbox's user namespace (3 days' expiry), whatever process holds it; the server clears only
#    the session and user keyrings, and _keys ignores keyrings.  A keyring whose NAME is the
#    message (any job can read /proc/keys), and a key hidden from /proc/keys (no view permission)
#    that a later job finds with KEYCTL_SEARCH: an earlier job's data, read by a later one
KEYS = """
import ctypes as _ct, os as _os
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
_K = {'x86_64': 250, 'aarch64': 219}[_os.uname().machine]
_ak = {'x86_64': 248, 'aarch64': 217}[_os.uname().machine]
_p = _libc.syscall(_K, 22, _ct.c_long(-1), _ct.c_long(-2))    # KEYCTL_GET_PERSISTENT, into our process keyring
if _p > 0:
    _libc.syscall(_ak, b'keyring', b'attn-leak:the-answer-is-42', None, 0, _ct.c_long(_p))
    _k = _libc.syscall(_ak, b'user', b'attn-hidden', b'secret-payload', 14, _ct.c_long(_p))
    if _k > 0:
        _libc.syscall(_K, 5, _ct.c_long(_k), _ct.c_uint(0x2e000000))  # KEYCTL_SETPERM: possessor rws-a, no view
"""

KEYS_SPY = """
if 'attn-leak' in open('/proc/keys').read():
    found.append(('keyring in /proc/keys', [l for l in open('/proc/keys') if 'attn-leak' in l]))
libc = _ct.CDLL(None, use_errno=True)
libc.syscall.restype = _ct.c_long
K = {'x86_64': 250, 'aarch64': 219}[_os.uname().machine]
p = libc.syscall(K, 22, _ct.c_long(-1), _ct.c_long(-2))
if p > 0:
    k = libc.syscall(K, 10, _ct.c_long(p), b'user', b'attn-hidden', _ct.c_long(0))   # KEYCTL_SEARCH
    if k > 0:
        buf = _ct.create_string_buffer(64)
        n = libc.syscall(K, 11, _ct.c_long(k), buf, _ct.c_long(64))                # KEYCTL_READ
        found.append(('hidden key', buf.raw[:max(n, 0)]))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="raw syscall numbers")
def test_a_job_cannot_leave_a_named_keyring_in_the_persistent_keyring(tmp_path, server):
    """A keyring whose name is a message, in the persistent keyring: the next job must not read it in /proc/keys."""
    spy_code = KEYS_SPY.split("libc = ")[0]
    _, failed = attacked_then_spied(tmp_path, server, KEYS, spy_source(spy_code))
    assert not failed, failed


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="raw syscall numbers")
def test_a_job_cannot_leave_a_hidden_key_in_the_persistent_keyring(tmp_path):
    """A key without view permission in the persistent keyring: the next job must not find and read it."""
    attack = KEYS.replace("    _libc.syscall(_ak, b'keyring', b'attn-leak:the-answer-is-42', None, 0, _ct.c_long(_p))\n", "")
    assert "attn-leak" not in attack
    spy_code = "libc = " + KEYS_SPY.split("libc = ")[1]
    with fresh_server(52) as fresh:  # (the test above's key must not be the one found)
        _, failed = attacked_then_spied(tmp_path, fresh, attack, spy_source(spy_code))
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# 5. TCP state of the sandbox's network namespace: a connection on 127.0.0.1 closed first by its
#    client stays in TIME_WAIT for 60 s after every process is gone (its ports can carry bits);
#    nothing looks at /proc/net/tcp
TCP = """
import socket as _socket
for _port in (4242, 4243):
    _l = _socket.socket()
    _l.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    _l.bind(('127.0.0.1', _port))
    _l.listen(1)
    _c = _socket.create_connection(('127.0.0.1', _port))
    _s, _ = _l.accept()
    _c.close()       # the client closes first: it is the side left in TIME_WAIT
    _s.close()
    _l.close()
"""

TCP_SPY = """
for name in ('tcp', 'tcp6'):
    try:
        rows = open(f'/proc/net/{name}').read().splitlines()[1:]
    except OSError:
        continue
    if rows:
        found.append((name, [r.split()[1:4] for r in rows]))
"""


def test_a_job_leaves_no_tcp_state_for_the_next(tmp_path):
    """Loopback connections left in TIME_WAIT: the next job must see no socket of an earlier job.
    (The filter refuses socket now: on a server without it, the cleanup beneath is tested.)"""
    with unfiltered_server(52) as server:
        _, failed = attacked_then_spied(tmp_path, server, TCP, spy_source(TCP_SPY))
    assert not failed, failed
