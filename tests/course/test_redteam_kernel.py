"""A job reaching for the kernel's privileged calls: namespaces, ids, capabilities, mounts, and
the calls a job's seccomp filter refuses (:mod:`attn_course.seccomp`).

Bubblewrap's options (``--unshare-all --unshare-user --disable-userns
--cap-drop ALL``, and the no-new-privileges bit it sets) are what stand
between a submission and the kernel's larger surface: a user namespace of
its own would give it every capability there (the way into netfilter's and
filesystems' bugs), a capability or a mount would let it change the
sandbox that later jobs run in.  Nothing else tested that these options are
there: a change that dropped one would have passed every other test.

The probe runs each attempt in a forked process (``unshare`` refuses a
process with threads) and reports what succeeded; in bubblewrap nothing
may, and a call the filter refuses must fail with its EPERM (not reach the
kernel's code and fail there), 32-bit calls included.  The same probe in the Plain sandbox (``check``'s, no bubblewrap)
shows that it finds what it looks for.
"""

from __future__ import annotations

import pytest

from attn_course.sandbox import Limited, Limits, Plain
from server_jobs import PROBE_HELPERS, fresh_server, package, spy, started

pytestmark = pytest.mark.slow

PROBE = PROBE_HELPERS + r'''
_honest_entropy = entropy
_NAMESPACES = {"user": 0x10000000, "mount": 0x00020000, "net": 0x40000000, "uts": 0x04000000,
               "ipc": 0x08000000, "pid": 0x20000000, "cgroup": 0x02000000}


def _escapes():
    found = [f"unshare({name})" for name, flag in _NAMESPACES.items()
             if _in_child(lambda flag=flag: _libc.unshare(flag) == 0)]
    if _in_child(lambda: _libc.setuid(0) == 0 and _os.getuid() == 0):
        found.append("setuid(0)")
    if _in_child(lambda: _libc.chroot(b"/tmp") == 0):
        found.append("chroot")
    if _os.getuid() != 0 and _in_child(lambda: _libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0):
        found.append("mount")  # (never tried as root: outside a sandbox it would mount over /tmp)
    for field in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        if _status(field) not in ("0000000000000000", "?"):
            found.append(f"{field} {_status(field)}")
    if _status("NoNewPrivs") != "1":
        found.append("NoNewPrivs " + _status("NoNewPrivs"))
    if _status("Seccomp") != "2":
        found.append("Seccomp " + _status("Seccomp"))  # (2: a filter)
    for name, nr, args in (("io_uring_setup", {"x86_64": 425, "aarch64": 425}, (8, _ct.create_string_buffer(120))),
                           ("keyctl", {"x86_64": 250, "aarch64": 219}, (0, _ct.c_long(-3), 0)),  # GET_KEYRING_ID
                           ("perf_event_open", {"x86_64": 298, "aarch64": 241}, (None, 0, -1, -1, 0)),
                           ("userfaultfd", {"x86_64": 323, "aarch64": 282}, (0,)),
                           ("bpf", {"x86_64": 321, "aarch64": 280}, (0, None, 0)),
                           ("io_setup", {"x86_64": 206, "aarch64": 0}, (1, _ct.byref(_ct.c_ulong(0))))):
        number = nr.get(_os.uname().machine)
        # (a descriptor, or the kernel's own answer to these arguments: the call reached its code)
        if number is not None and _in_child(lambda: _reached(number, *args)):
            found.append(name)
    if _os.uname().machine == "x86_64" and _in_child(_int80_getpid):
        found.append("int 0x80")
    if _os.uname().machine == "x86_64" and _in_child(lambda: _libc.syscall(39 | 0x40000000) == _os.getpid()):
        found.append("x32 getpid")  # (where the kernel has the x32 calls at all)
    return found


def _int80_getpid():
    """i386's getpid (20) through int 0x80: another convention, whose numbers the filter must not let by."""
    import mmap
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20; int 0x80; ret
    address = _ct.addressof(_ct.c_char.from_buffer(page))
    return _ct.CFUNCTYPE(_ct.c_int)(address)() == _os.getpid()


_FOUND = []


def entropy(A, mask=None):
    if not _FOUND:
        _FOUND.append(_escapes())
    if _FOUND[0]:
        raise RuntimeError(f"escaped: {_FOUND[0]}")
    return _honest_entropy(A, mask)
'''


def test_a_job_in_bubblewrap_gets_no_namespace_capability_id_or_mount(tmp_path):
    with fresh_server(64) as server:
        failed = spy(server, package(tmp_path, PROBE))
    assert failed == [], failed


# what the seccomp filter alone refuses (the rest is bubblewrap's: ids, capabilities, a mount)
FILTERED = ("Seccomp", "unshare(", "chroot", "io_uring_setup", "keyctl", "perf_event_open", "userfaultfd", "bpf",
            "io_setup", "int 0x80", "x32")


def test_with_limits_only_a_job_still_gets_the_filter(tmp_path):
    """The Limited sandbox (where bubblewrap does not work) installs the same filter."""
    with started(Limited(65, Limits())) as server:
        failed = spy(server, package(tmp_path, PROBE))
    assert all(m.startswith("raised RuntimeError: escaped:") for m in failed), failed  # the probe ran
    assert not [f for f in FILTERED if any(f in m for m in failed)], failed


def test_the_probe_finds_them_outside_bubblewrap(tmp_path):
    """The control: in the Plain sandbox the same probe reports what it could do."""
    with started(Plain(Limits())) as server:
        failed = spy(server, package(tmp_path, PROBE))
    if not failed:
        pytest.skip("this machine lets a process do none of it even outside bubblewrap")
    assert all("escaped:" in m for m in failed), failed
    assert all("Seccomp 0" in m for m in failed), failed  # check's own sandbox installs no filter
