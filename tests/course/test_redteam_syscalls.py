"""A job reaching the calls its seccomp filter refuses by other roads (:mod:`attn_course.seccomp`).

test_redteam_kernel tries the refused calls head-on (``unshare``, ``io_uring_setup``, ``keyctl``,
...), ``int 0x80`` and x32.  These are the side doors:

* ``clone`` / ``clone3`` with namespace flags: what ``unshare`` does, by a call the filter lets by;
* a call number with bits above the 32 the filter reads (``syscall(323 | 1 << 32)``);
* ``personality`` (a 32-bit personality, READ_IMPLIES_EXEC) before a refused call;
* the job's own seccomp filter (``SECCOMP_RET_TRACE`` or ``SECCOMP_RET_USER_NOTIF``, which would
  let a refused call through to a tracer or a supervisor if the newest filter won);
* ``prctl`` undoing no-new-privileges or the filter;
* ``execve``: a static binary with no libc, run from a ``memfd``, making the raw call itself,
  and ``/bin/sh`` reading its own status (a filter ends with neither);
* the 32-bit ``syscall`` instruction from a 32-bit code segment (AMD's compat entry, which
  ``int 0x80`` does not take), seen by its side effect (a ``mkdir``);
* every thread of the job (XLA's, started after the filter) filtered, and no descriptor of
  io_uring, BPF, perf, userfaultfd or a socket inherited;
* ``/dev`` nodes that reach the kernel's drivers (userfaultfd, KVM, FUSE, TUN, the controlling
  terminal for ``TIOCSTI``), and ``NS_GET_USERNS`` on the job's network namespace (a handle on
  a user namespace above the job's).

A refused call must fail with the filter's EPERM; anything else (a descriptor, another errno)
means it reached the kernel's code.  The same probe in the Plain sandbox (no filter, no
bubblewrap) shows that each finds what it looks for.
"""

from __future__ import annotations

import pytest

from attn_course.sandbox import Limited, Limits, Plain
from server_jobs import PROBE_HELPERS, fresh_server, package, spy, started

pytestmark = pytest.mark.slow

PROBE = PROBE_HELPERS + r'''
_honest_entropy = entropy
_X86 = _os.uname().machine == "x86_64"
_NS = {"user": 0x10000000, "user+net": 0x50000000, "mount": 0x00020000, "net": 0x40000000,
       "pid": 0x20000000, "ipc": 0x08000000, "uts": 0x04000000, "cgroup": 0x02000000}
_SIGCHLD = 17
_UFFD = {"x86_64": 323, "aarch64": 282}.get(_os.uname().machine)
_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(_os.uname().machine)
_SECCOMP = {"x86_64": 317, "aarch64": 277}.get(_os.uname().machine)
_CLONE = {"x86_64": 56, "aarch64": 220}.get(_os.uname().machine)


def _refused_reached():
    """userfaultfd(UFFD_USER_MODE_ONLY) or keyctl(GET_KEYRING_ID, session): either reaches the kernel."""
    return _reached(_UFFD, 1) or _reached(_KEYCTL, 0, _ct.c_long(-3), 0)


def _made_child(pid):
    """After a raw clone: the child ends at once, the parent waits for it; True if there was one."""
    if pid == 0:
        _os._exit(0)
    if pid > 0:
        _os.waitpid(pid, 0)
    return pid > 0


def _clone(flags):
    """clone(flags | SIGCHLD) as a raw call (a fork with new namespaces): True if a child was made."""
    # (the flags come first on both architectures)
    return _in_child(lambda: _made_child(_libc.syscall(_CLONE, _ct.c_ulong(flags | _SIGCHLD), None, None, None, None)))


def _clone3(flags):
    """clone3 with ``flags`` (its arguments in memory): True if a child was made."""
    def attempt():
        args = _ct.create_string_buffer(_struct.pack("11Q", flags, 0, 0, 0, _SIGCHLD, 0, 0, 0, 0, 0, 0), 88)
        return _made_child(_libc.syscall(435, args, _ct.c_size_t(88)))
    return _in_child(attempt)


def _own_filter(action, flags=0):
    """The job's own filter, ``action`` for userfaultfd and ALLOW else, then userfaultfd: reached?"""
    def attempt():
        ins = lambda code, jt, jf, k: _struct.pack("HBBI", code, jt, jf, k)
        code = (ins(0x20, 0, 0, 0) + ins(0x15, 0, 1, _UFFD) + ins(0x06, 0, 0, action)
                + ins(0x06, 0, 0, 0x7FFF0000))
        buf = _ct.create_string_buffer(code, len(code))
        prog = _ct.create_string_buffer(_struct.pack("HxxxxxxQ", len(code) // 8, _ct.addressof(buf)), 16)
        if _libc.syscall(_SECCOMP, 1, _ct.c_ulong(flags), prog) < 0:  # SECCOMP_SET_MODE_FILTER
            _os._exit(2)
        _os._exit(0 if _reached(_UFFD, 1) else 1)
    pid = _os.fork()
    if pid == 0:
        try:
            import signal
            signal.setitimer(signal.ITIMER_REAL, 0.5)  # a supervisor's wait (RET_USER_NOTIF, none answers): the call got by
            attempt()
        finally:
            _os._exit(2)
    _, status = _os.waitpid(pid, 0)
    return _os.WIFSIGNALED(status) or (_os.WIFEXITED(status) and _os.WEXITSTATUS(status) == 0)


def _undo_prctl():
    libc = _libc
    ul = _ct.c_ulong
    libc.prctl(38, ul(0), ul(0), ul(0), ul(0))  # PR_SET_NO_NEW_PRIVS 0
    libc.prctl(22, ul(0), ul(0), ul(0), ul(0))  # PR_SET_SECCOMP SECCOMP_MODE_DISABLED
    return _status("NoNewPrivs") != "1" or _status("Seccomp") != "2" or _refused_reached()


def _elf(code):
    """A static x86-64 ELF executable: ``code`` at its entry, nothing else."""
    base, head = 0x400000, 64 + 56
    ehdr = (b"\x7fELF\x02\x01\x01" + bytes(9)
            + _struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, base + head, 64, 0, 0, 64, 56, 1, 0, 0, 0))
    size = head + len(code)
    phdr = _struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    return ehdr + phdr + code


def _memfd_static_binary():
    """userfaultfd(UFFD_USER_MODE_ONLY) from a libc-less binary exec'd from a memfd: exit 0 if refused."""
    import subprocess
    code = bytes([0xB8, 0x43, 0x01, 0, 0,      # mov eax, 323 (userfaultfd)
                  0xBF, 1, 0, 0, 0,            # mov edi, 1 (UFFD_USER_MODE_ONLY)
                  0x0F, 0x05,                  # syscall
                  0x31, 0xFF,                  # xor edi, edi
                  0x48, 0x83, 0xF8, 0xFF,      # cmp rax, -1 (-EPERM)
                  0x40, 0x0F, 0x95, 0xC7,      # setne dil
                  0xB8, 0xE7, 0, 0, 0,         # mov eax, 231 (exit_group)
                  0x0F, 0x05])                 # syscall
    try:
        fd = _os.memfd_create("static", 0)
    except OSError:  # refused by the filter: the binary from a file in the scratch folder instead
        path = f"{_os.environ.get('TMPDIR') or '/tmp'}/static-{_os.getpid()}"
        with open(path, "wb") as f:
            f.write(_elf(code))
        _os.chmod(path, 0o700)
        try:
            return subprocess.run([path], timeout=5).returncode != 0
        finally:
            _os.unlink(path)
    _os.write(fd, _elf(code))
    result = subprocess.run([f"/proc/self/fd/{fd}"], pass_fds=(fd,), timeout=5)
    _os.close(fd)
    return result.returncode != 0  # (1: reached; another code: it could not run, which is no escape)


def _shell_status():
    import subprocess
    out = subprocess.run(["/bin/sh", "-c", "cat /proc/self/status"], capture_output=True, text=True,
                         timeout=5).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return fields.get("Seccomp", "").strip() != "2" or fields.get("NoNewPrivs", "").strip() != "1"


def _compat_syscall_mkdir(path):
    """i386 mkdir(path) by the ``syscall`` instruction in a 32-bit code segment (AMD's compat entry):
    True if the folder appeared.  The kernel returns to the 32-bit vDSO's landing pad, which a
    64-bit process lacks: the child dies after the call, whatever the call did."""
    import mmap
    page = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40,  # MAP_32BIT
                     prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    b = _ct.addressof(_ct.c_char.from_buffer(page))
    if b >= 1 << 31:
        return False
    q, d = lambda v: _struct.pack("<Q", v), lambda v: _struct.pack("<I", v)
    entry = (b"\x53\x55" + b"\x48\xB8" + q(b + 0x400) + b"\x48\x89\x20"  # push rbx, rbp; [save] = rsp
             + b"\xBC" + d(b + 0xFF0)                                   # mov esp, low stack
             + b"\x6A\x23" + b"\x68" + d(b + 0x100) + b"\x48\xCB")       # far return to 0x23:code32
    code32 = (b"\xB8" + d(39) + b"\xBB" + d(b + 0x800) + b"\xBD" + d(0o700)  # mkdir(path, 0700)
              + b"\x0F\x05" + b"\xF4")                                   # syscall; hlt
    page[0:len(entry)] = entry
    page[0x100:0x100 + len(code32)] = code32
    page[0x800:0x800 + len(path) + 1] = path.encode() + b"\0"

    def attempt():
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # (it dies: no core file in "/")
        _ct.CFUNCTYPE(_ct.c_int)(b)()
        return False
    _in_child(attempt, 2)
    made = _os.path.isdir(path)
    if made:
        _os.rmdir(path)
    return made


def _threads_unfiltered():
    out = []
    for tid in _os.listdir("/proc/self/task"):
        try:
            if _status("Seccomp", f"/proc/self/task/{tid}/status") != "2":
                out.append(tid)
        except OSError:
            pass
    return out


def _odd_descriptors():
    out = []
    for fd in _os.listdir("/proc/self/fd"):
        try:
            target = _os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if any(k in target for k in ("io_uring", "bpf", "perf_event", "userfaultfd", "fanotify", "socket:", "pidfd")):
            out.append(f"{fd}->{target}")
    return out


def _devices():
    out = []
    for path in ("/dev/userfaultfd", "/dev/kvm", "/dev/fuse", "/dev/net/tun", "/dev/loop-control",
                 "/dev/vhost-net", "/dev/vhost-vsock", "/dev/kmsg", "/dev/tty", "/dev/nvidiactl",
                 "/dev/dri/card0", "/dev/hpet", "/dev/console", "/dev/ptmx", "/dev/pts/ptmx"):
        try:
            fd = _os.open(path, _os.O_RDONLY | _os.O_NONBLOCK | _os.O_NOCTTY)
        except OSError:
            continue
        _os.close(fd)
        out.append(path)
    import fcntl, termios
    for fd in (0, 1, 2, 3):
        try:
            fcntl.ioctl(fd, termios.TIOCSTI, b" ")
            out.append(f"TIOCSTI on {fd}")
        except OSError:
            pass
    return out


def _ns_handle():
    import fcntl
    fd = _os.open("/proc/self/ns/net", _os.O_RDONLY)
    try:
        owner = fcntl.ioctl(fd, 0xB701)  # NS_GET_USERNS
    except OSError:
        return False
    finally:
        _os.close(fd)
    _os.close(owner)
    return True


def _new_ipc():
    """A socket of each kind a job could queue memory or descriptors in, and System V's queues and
    semaphores (which outlive a job without an IPC namespace of its own): the ones made."""
    made = []
    fd = _libc.socket(2, 1, 0)  # AF_INET, SOCK_STREAM
    if fd >= 0:
        _os.close(fd)
        made.append("socket(AF_INET)")
    pair = (_ct.c_int * 2)()
    if _libc.socketpair(1, 1, 0, pair) == 0:  # AF_UNIX, SOCK_STREAM
        _os.close(pair[0])
        _os.close(pair[1])
        made.append("socketpair(AF_UNIX)")
    qid = _libc.msgget(0, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if qid >= 0:
        _libc.msgctl(qid, 0, None)  # IPC_RMID
        made.append("msgget")
    sid = _libc.semget(0, 1, 0o1600)
    if sid >= 0:
        _libc.semctl(sid, 0, 0)  # IPC_RMID
        made.append("semget")
    return made


def _escapes():
    found = [f"clone({name})" for name, flag in _NS.items() if _CLONE is not None and _clone(flag)]
    found += [f"clone3({name})" for name, flag in _NS.items() if _clone3(flag)]
    if _X86:
        for name, nr in (("userfaultfd", 323), ("keyctl", 250)):
            args = (1,) if name == "userfaultfd" else (0, _ct.c_long(-3), 0)
            if _in_child(lambda nr=nr, args=args: _reached(nr | (1 << 32), *args)):
                found.append(f"{name} | 1<<32")
            if _in_child(lambda nr=nr, args=args: _reached(nr | (0xFFFFFFFF << 32), *args)):
                found.append(f"{name} | 0xffffffff<<32")
    if _in_child(lambda: _libc.personality(0x0008 | 0x0400000 | 0x0040000) != -1 and _refused_reached()):
        found.append("personality(LINUX32|READ_IMPLIES_EXEC)")
    if _own_filter(0x7FF00000):
        found.append("own filter RET_TRACE")
    if _own_filter(0x7FC00000, 8):  # SECCOMP_FILTER_FLAG_NEW_LISTENER
        found.append("own filter RET_USER_NOTIF")
    if _own_filter(0x7FFF0000):
        found.append("own filter RET_ALLOW")
    if _in_child(_undo_prctl):
        found.append("prctl undo")
    if _X86 and _in_child(_memfd_static_binary, 10):
        found.append("memfd static binary")
    if _in_child(_shell_status, 10):
        found.append("/bin/sh unfiltered")
    if _X86:
        scratch = _os.environ.get("TMPDIR") or "/tmp"
        if _compat_syscall_mkdir(f"{scratch}/compat-{_os.getpid()}"):
            found.append("compat syscall")
    unfiltered = _threads_unfiltered()
    if unfiltered:
        found.append(f"threads unfiltered {len(unfiltered)}/{len(_os.listdir('/proc/self/task'))}")
    found += [f"fd {d}" for d in _odd_descriptors()]
    found += [f"open {d}" for d in _devices()]
    if _ns_handle():
        found.append("NS_GET_USERNS")
    found += _new_ipc()
    return found


# one letter a road, first in the message (which the grader may shorten in its middle)
_CODES = {"clone(": "C", "clone3(": "3", "userfaultfd |": "H", "keyctl |": "H", "personality": "P",
          "own filter RET_TRACE": "T", "own filter RET_USER_NOTIF": "N", "own filter RET_ALLOW": "A",
          "prctl undo": "U", "memfd static binary": "M", "/bin/sh": "S", "compat syscall": "X",
          "threads unfiltered": "R", "fd ": "F", "open ": "D", "NS_GET_USERNS": "G",
          "socket(": "K", "socketpair(": "W", "msgget": "Q", "semget": "Z"}
_FOUND = []


def entropy(A, mask=None):
    if not _FOUND:
        _FOUND.append(_escapes())
    if _FOUND[0]:
        codes = "".join(sorted({c for item in _FOUND[0] for k, c in _CODES.items() if item.startswith(k)}))
        raise RuntimeError(f"escaped [{codes}]: {_FOUND[0]}")
    return _honest_entropy(A, mask)
'''


def _plain_failures(tmp_path) -> list[str]:
    with started(Plain(Limits())) as server:
        return spy(server, package(tmp_path, PROBE))


def _codes(failed: list[str]) -> set[str]:
    """The roads that escaped (the letters of the probe's ``_CODES``), from the failed cases' messages."""
    assert all(m.startswith("raised RuntimeError: escaped [") for m in failed), failed  # the probe ran
    return {c for m in failed for c in m.split("[", 1)[1].split("]", 1)[0]}


def test_no_side_door_to_a_refused_call_in_bubblewrap(tmp_path):
    with fresh_server(67) as server:
        failed = spy(server, package(tmp_path, PROBE))
    assert failed == [], failed


# what the filter alone must refuse, bubblewrap or not: every road but the devices (D), which
# are the grader's user's to open, and NS_GET_USERNS (G), which needs a user namespace of the
# sandbox's own
FILTERED = set("HPTNAUMSXRFKWQZ")


@pytest.fixture(scope="module")
def limited_failures(tmp_path_factory):
    """The probe in the Limited sandbox, which has the filter and nothing of bubblewrap."""
    with started(Limited(68, Limits())) as server:
        return spy(server, package(tmp_path_factory.mktemp("limited"), PROBE))


def test_with_limits_only_no_side_door_to_a_refused_call(limited_failures):
    assert not _codes(limited_failures) & FILTERED, limited_failures


def test_with_limits_only_no_namespace_by_clone(limited_failures):
    """Was a hole: clone and clone3 with CLONE_NEW* do what unshare does, which the filter refused
    by name only: a user namespace (with every capability in it) and a network namespace of its
    own put netfilter, packet sockets and traffic control in the job's reach.  Bubblewrap refuses
    them (--disable-userns, --cap-drop ALL); with limits only, now the filter does (clone's
    namespace flags refused, clone3 answered ENOSYS)."""
    assert not _codes(limited_failures) & set("C3"), limited_failures


def test_the_probe_finds_the_side_doors_outside_the_sandbox(tmp_path):
    """The control: without a filter (Plain), each road the probe tries is open."""
    import os
    import platform

    failed = _plain_failures(tmp_path)
    assert failed, "nothing found outside any sandbox"
    expect = set("PTNAUSRGKWQZ")
    if platform.machine() == "x86_64":
        expect |= set("HMX")  # (tried on x86-64 only; X: where the CPU has 32-bit SYSCALL, AMD's)
        if "AuthenticAMD" not in open("/proc/cpuinfo").read():
            expect.discard("X")
    if os.geteuid() == 0 or open("/proc/sys/user/max_user_namespaces").read().strip() != "0":
        expect |= set("C3")
    missing = expect - _codes(failed)
    assert not missing, (missing, failed)


def test_the_graders_warning_names_what_limits_only_leave_in_reach(limited_failures, tmp_path, monkeypatch, capsys):
    """With limits only, a job opens what its user opens.  Run as root, the jobs run as users of
    their own (test_redteam_limited_user), and the warning says what every user may reach; where
    they cannot, as root, it says every file and the devices the probe reached here (KVM, TUN,
    ...), and to grade as an ordinary user.  Not as root: the user's files."""
    import os

    from attn_course import cli, sandbox

    text = sandbox.limits_only_reach()
    if os.geteuid() == 0 and sandbox._LIMITED_AS_SLOT_USER:
        assert "users of their own, not root" in text and "bubblewrap" in text, text
    elif os.geteuid() == 0:
        assert "every file" in text and "ordinary user" in text, text
        if limited_failures and "D" in _codes(limited_failures):  # the probe opened devices here
            assert "/dev/kvm" in text, (text, limited_failures)
    else:
        assert text == sandbox.limits_only_reach(as_root=False)
    assert "/dev/kvm" in sandbox.limits_only_reach(as_root=True, own_users=False)
    assert "/dev" not in sandbox.limits_only_reach(as_root=False)
    assert "/dev/kvm" not in sandbox.limits_only_reach(as_root=True, own_users=True)

    (tmp_path / "subs").mkdir()
    monkeypatch.setattr(sandbox, "bwrap_works", lambda: False)
    monkeypatch.setenv("ATTN_COURSE_SECRET", "warning-secret")
    assert cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--exercises", "3.1"]) == 2
    err = capsys.readouterr().err
    if os.geteuid() == 0 and sandbox._LIMITED_AS_SLOT_USER:  # warned, then nothing to grade (an empty folder)
        assert f"workers run with limits only {text}" in err and "no archives" in err, err
    else:  # the jobs would reach the grader's files: refused, in the same words (attn_course.sandbox.unconfined_reach)
        assert f"with limits only the archives' code would run {text}" in err and "--unconfined" in err, err


def test_the_grader_warns_where_jobs_would_run_without_their_filter(tmp_path, monkeypatch, capsys):
    """Another processor, a kernel without seccomp filters: jobs run unfiltered (best effort),
    and the grade command says so before its batch, with the reason; silent where the filter
    works (this machine's, seccomp.filter_problem)."""
    from attn_course import cli, seccomp

    (tmp_path / "subs").mkdir()
    monkeypatch.setenv("ATTN_COURSE_SECRET", "warning-secret")
    argv = ["grade", str(tmp_path / "subs"), "--exercises", "3.1"]
    assert cli.main(argv + ["--out", str(tmp_path / "a")]) == 2  # (an empty folder: the warnings, then 'no archives', nothing graded)
    assert "filter of kernel calls" not in capsys.readouterr().err
    monkeypatch.setattr(seccomp, "filter_problem", lambda: "no filter for this processor (riscv64)")
    assert cli.main(argv + ["--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "warning: jobs run without their filter of kernel calls (no filter for this processor (riscv64))" in err
