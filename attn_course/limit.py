"""``python -m attn_course.limit CPU_S AS_MB FSIZE_MB NPROC NEWNET CGROUPS UID STAGE -- ARGV...``

Apply resource limits to this process, join cgroups (comma-separated, or
``-``), optionally enter a new network namespace, start a new session,
then, as root for a sandbox of its own user (:mod:`attn_course.slot_user`):
bind each folder or file of STAGE (a JSON list of ``[source, mount point]``,
or ``-``) on its mount point in a mount namespace of its own (the user may
not reach the source itself: a Python under ``/root``), and become user and
group UID with no other group (``-``: stay who it is); then ``exec`` ARGV.  A separate tiny
program (it imports nothing heavy) instead of a ``preexec_fn``, because the
grader holds JAX's threads and ``fork`` + Python code in the child is unsafe
there.
"""

import ctypes
import os
import resource
import sys

CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000


def main() -> None:
    cpu, mem, fsize, nproc, newnet, cgroup, uid, stage = sys.argv[1:9]
    assert sys.argv[9] == "--"
    argv = sys.argv[10:]
    try:
        os.setsid()
    except PermissionError:
        pass  # already a session leader
    for group in cgroup.split(",") if cgroup != "-" else []:  # its processes counted, its CPU capped
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if newnet == "1":
        ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET)  # best effort (root only)
    mb = 2**20
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 1))
    resource.setrlimit(resource.RLIMIT_AS, (int(mem) * mb, int(mem) * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(fsize) * mb, int(fsize) * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_NPROC, (int(nproc), int(nproc)))
    if stage != "-":
        import json

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNS) != 0 or libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "cannot make a mount namespace for the sandbox's binds")
        for source, point in json.loads(stage):
            if libc.mount(os.fsencode(source), os.fsencode(point), None, MS_BIND | MS_REC, None) != 0:
                raise OSError(ctypes.get_errno(), f"cannot bind {source} on {point}")
    if uid != "-":  # last: the groups, the network namespace and the binds need root
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
