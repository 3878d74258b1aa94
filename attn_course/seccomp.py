"""A job's own process refuses the kernel's calls that no job needs (a seccomp filter).

Bubblewrap takes away what these calls could change (no capability, no user
namespace of the job's own), but their code is still the kernel's, reached
by any process: io_uring, BPF, ``perf_event_open``, ``userfaultfd``, the
keyrings, ``ptrace`` and reading another process's memory, the mount and
module calls.  Those are where escapes from sandboxes came from; Docker's
default profile refuses most of them too.  It also refuses ``setsid``: the
kernel shares the CPU between sessions (autogroups), and processes of a job
that each led a session of their own would take the other slots' share (the
job's own process leads its session already, before the filter), and
``setpgid``: a job's processes stay in its process group, which the server
ends after the job in one call that no forking process can race (a process
that left it, forking on and on, outran a kill by list; without a pid
namespace, in the limits-only sandbox, it lived on into the next job); and
memory that no address-space limit counts (``memfd_create``, ``memfd_secret``,
System V's ``shmget``: a job held 2.5 GB of memfds beside its 3 GB limit);
System V's message queues and semaphores (``msgget``, ``semget``: with limits
only, no IPC namespace of the job's own, they outlive it: 200 queues were
still there after the sandbox closed); and new sockets (``socket``,
``socketpair``: a job has no network and no use for one, and the red team
queued 1 GB in loopback TCP buffers, which a cgroup v1 memory group does not
count, and held 400 descriptors in flight on a unix socket, which the kernel
counts per user: the other slot's server, the same user, could then pass no
descriptor to its template, and its honest job failed); and asynchronous I/O
contexts (``io_setup``: the kernel counts their events for the whole machine,
``fs.aio-max-nr``; the red team's job took all 65536, and the grader's own
``io_setup`` failed while the job lived).
A job's process (forked by the server's template, :func:`attn_course.worker._child`) installs this filter
before it reads its job, in the grading sandboxes (bubblewrap, and limits
only); ``check``'s Plain sandbox runs the student's own code on their own
machine and installs none.  A refused call fails with ``EPERM``; so does a
``clone`` that asks for a new namespace (``clone3``, whose flags a filter
cannot read, answers ``ENOSYS``, and the C library uses ``clone``); calls
of another architecture's convention (the 32-bit ``int 0x80`` on x86-64,
x32) are refused as a whole, since their numbers differ.

Installed only where the numbers below are known (Linux on x86-64 and
aarch64, from the kernel's ``unistd`` headers); elsewhere
:func:`refuse_kernel_calls` says that it did nothing.  Jobs then run without
the filter; the grader says so before a batch (:func:`filter_problem`, which
a short-lived child of the grader's answers, on each Dask worker too).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
import sys

# the calls refused, by name: number on x86-64, number on aarch64 (asm-generic)
CALLS = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kcmp": (312, 272), "pidfd_getfd": (438, 438),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    "unshare": (272, 97), "setns": (308, 268), "chroot": (161, 51), "pivot_root": (155, 41),
    "mount": (165, 40), "umount2": (166, 39), "mount_setattr": (442, 442), "open_tree": (428, 428),
    "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432),
    "fspick": (433, 433), "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "fanotify_init": (300, 262), "quotactl": (179, 60), "lookup_dcookie": (212, 18),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "reboot": (169, 142),
    "swapon": (167, 224), "swapoff": (168, 225), "acct": (163, 89), "syslog": (103, 116),
    "sethostname": (170, 161), "setdomainname": (171, 162), "setsid": (112, 157), "setpgid": (109, 154),
    "memfd_create": (319, 279), "memfd_secret": (447, 447), "shmget": (29, 194),
    "msgget": (68, 186), "semget": (64, 190), "socket": (41, 198), "socketpair": (53, 199),
    "io_setup": (206, 0),
}
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, column of CALLS
X32_BIT = 0x40000000  # x86-64's x32 calls: the same numbers with this bit
# clone makes new namespaces too (its first argument's flags): refused with any of these, as
# unshare is; clone3 takes its flags in memory, which a filter cannot read: it answers ENOSYS,
# and the C library falls back to clone (Docker's default profile does the same)
CLONE, CLONE3 = (56, 220), (435, 435)
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET

_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, ...
_ARG0 = 16  # seccomp_data.args[0]: its low 32 bits (both architectures are little-endian)
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO (| errno)
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(arch: str) -> bytes:
    """The filter for ``arch`` ("x86_64" or "aarch64"), as ``struct sock_filter`` s."""
    audit, column = ARCHES[arch]
    refuse = _insn(_RET_K, 0, 0, _ERRNO | errno.EPERM)
    numbers = sorted({n[column] for n in CALLS.values()})
    out = [_insn(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
           _insn(_JEQ_K, 1, 0, audit), refuse,  # another convention's numbers: refused as a whole
           _insn(_LD_W_ABS, 0, 0, 0)]  # seccomp_data.nr
    if arch == "x86_64":
        out += [_insn(_JGE_K, 0, 1, X32_BIT), refuse]
    out += [_insn(_JEQ_K, 0, 1, CLONE3[column]), _insn(_RET_K, 0, 0, _ERRNO | errno.ENOSYS),
            _insn(_JEQ_K, 0, 4, CLONE[column]),  # clone: its flags decide; another call: the list
            _insn(_LD_W_ABS, 0, 0, _ARG0), _insn(_JSET_K, 1, 0, NAMESPACE_FLAGS),
            _insn(_RET_K, 0, 0, _ALLOW), refuse]
    for i, nr in enumerate(numbers):  # a match jumps over the numbers left and the allow: to refuse
        out.append(_insn(_JEQ_K, len(numbers) - i, 0, nr))
    return b"".join(out + [_insn(_RET_K, 0, 0, _ALLOW), refuse])


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def refuse_kernel_calls(libc=None) -> bool:
    """Install the filter in this thread (and every thread and process it starts from now on).

    True if it is installed; False where it cannot be (not Linux, another
    architecture, a kernel without seccomp filters).  Sets the
    no-new-privileges bit first, as the kernel asks of a process without
    ``CAP_SYS_ADMIN`` (bubblewrap has already set it there).
    """
    arch = platform.machine()
    if not sys.platform.startswith("linux") or arch not in ARCHES:
        return False
    libc = libc or ctypes.CDLL(None, use_errno=True)
    prctl = getattr(libc, "prctl", None)
    if prctl is None:
        return False
    code = program(arch)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _Prog(len(code) // 8, ctypes.addressof(buf))
    ul = ctypes.c_ulong
    if prctl(PR_SET_NO_NEW_PRIVS, ul(1), ul(0), ul(0), ul(0)) != 0:
        return False
    return prctl(PR_SET_SECCOMP, ul(SECCOMP_MODE_FILTER), ctypes.byref(prog), ul(0), ul(0)) == 0


# what a probe's exit status means (filter_problem; 0: the filter took and refused a listed call;
# 1 and 2 are Python's own, for an exception and for a bad command line)
_PROBE_PROBLEMS = {
    3: "the kernel did not take the filter (a kernel without seccomp filters, or one forbidden here)",
    4: "the kernel took the filter but still answered a call the filter refuses",
}


def filter_problem(timeout_s: float = 20.0) -> str | None:
    """Why a job's process on this machine would run without the filter, or None when it would not.

    Where the filter is known (:func:`refuse_kernel_calls`), a short-lived
    child process installs it and makes a listed call (``unshare`` of
    nothing, which succeeds unfiltered): the grader's own process, which
    could never take the filter off again, is left as it was.
    """
    import subprocess

    arch = platform.machine()
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform}): this system has no seccomp filters"
    if arch not in ARCHES:
        return f"no filter for this processor ({arch}); known: {', '.join(sorted(ARCHES))}"
    try:
        r = subprocess.run([sys.executable, "-S", "-I", __file__, "--probe"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"the probe of the filter did not run ({type(err).__name__})"
    if r.returncode == 0:
        return None
    return _PROBE_PROBLEMS.get(r.returncode, f"the probe of the filter failed (exit status {r.returncode})")


def unfiltered_warning(problem: str) -> str:
    """The grader's warning where jobs run without the filter (``problem``: :func:`filter_problem`'s)."""
    return (f"jobs run without their filter of kernel calls ({problem}): io_uring, BPF, perf_event_open, "
            "ptrace and the keyrings stay within their reach, as in an unfiltered process")


def _probe() -> int:
    """In a child of :func:`filter_problem` (which names another system or processor itself):
    0 if the filter is installed and refuses ``unshare``."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not refuse_kernel_calls(libc):  # (False on another system or processor too)
        return 3
    nr = CALLS["unshare"][ARCHES[platform.machine()][1]]
    answered = libc.syscall(ctypes.c_long(nr), ctypes.c_ulong(0))  # unshare(0): a no-op unfiltered
    return 0 if answered == -1 and ctypes.get_errno() == errno.EPERM else 4


if __name__ == "__main__":  # (run by filter_problem, as a script: it imports nothing of the course)
    sys.exit(_probe() if sys.argv[1:] == ["--probe"] else 2)
