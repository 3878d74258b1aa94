"""``python -m attn_course.limit CPU_S AS_MB FSIZE_MB NPROC NEWNET CGROUPS -- ARGV...``

Apply resource limits to this process, join cgroups (comma-separated, or
``-``), optionally enter a new network namespace, start a new session, then
``exec`` ARGV.  A separate tiny
program (it imports nothing heavy) instead of a ``preexec_fn``, because the
grader holds JAX's threads and ``fork`` + Python code in the child is unsafe
there.
"""

import ctypes
import os
import resource
import sys

CLONE_NEWNET = 0x40000000


def main() -> None:
    cpu, mem, fsize, nproc, newnet, cgroup = sys.argv[1:7]
    assert sys.argv[7] == "--"
    argv = sys.argv[8:]
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
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
