"""``python -m attn_course.limit CPU_S AS_MB FSIZE_MB NPROC NEWNET CGROUPS UID STAGE -- ARGV...``

Apply resource limits to this process, join cgroups (comma-separated, or
``-``), optionally enter a new network namespace, start a new session,
then, as root for a sandbox of its own user (:mod:`attn_course.slot_user`):
bind each folder or file of STAGE (a JSON list of ``[source, mount point]``
or ``[source, mount point, "restore"]``, or ``-``) on its mount point in a
mount namespace of its own (the user may not reach the source itself: a
Python under ``/root``); a source marked ``restore`` is then seen at its own
path again (for the limits-only sandbox, which has no root of its own to bind
it into): each folder above it that others may not pass through (``/root``)
is covered by an empty read-only tmpfs holding only the sources under it.
Then become user and group UID with no other group (``-``: stay who it is),
and ``exec`` ARGV.  A separate tiny
program (it imports nothing heavy) instead of a ``preexec_fn``, because the
grader holds JAX's threads and ``fork`` + Python code in the child is unsafe
there.
"""

import ctypes
import os
import resource
import stat
import sys

CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 0x1, 0x2, 0x4, 0x20
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000


def closed_above(path: str) -> str | None:
    """The highest folder above ``path`` that others may not pass through (no ``o+x``), or None."""
    parts = path.split("/")[1:-1]
    for k in range(1, len(parts) + 1):
        folder = "/" + "/".join(parts[:k])
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    if libc.mount(source and os.fsencode(source), os.fsencode(target), fstype, flags, data) != 0:
        raise OSError(ctypes.get_errno(), f"cannot mount {source or fstype} on {target}")


def _restore(libc, staged: list) -> None:
    """Each source marked ``restore`` at its own path again, through the covers of the folders above it."""
    restored = sorted((source, point) for source, point, *how in staged if how == ["restore"])
    covers = sorted({c for c in (closed_above(source) for source, _ in restored) if c})
    for _, point in restored:
        if any(point.startswith(cover + "/") for cover in covers):  # a cover would hide it
            raise OSError(f"the stage {point} lies under {[c for c in covers if point.startswith(c + '/')][0]}")
    for cover in covers:
        _mount(libc, None, cover, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=755,size=64k")
    for source, point in restored:
        if any(source.startswith(cover + "/") for cover in covers):
            if os.path.isdir(point):
                os.makedirs(source, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(source), exist_ok=True)
                open(source, "a").close()
            _mount(libc, point, source, None, MS_BIND | MS_REC)
    for cover in covers:  # nothing more is made there
        _mount(libc, None, cover, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


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
        staged = json.loads(stage)
        for source, point, *_ in staged:
            if libc.mount(os.fsencode(source), os.fsencode(point), None, MS_BIND | MS_REC, None) != 0:
                raise OSError(ctypes.get_errno(), f"cannot bind {source} on {point}")
        _restore(libc, staged)
    if uid != "-":  # last: the groups, the network namespace and the binds need root
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
