"""``python -m attn_course.limit CPU_S AS_MB FSIZE_MB NPROC NEWNET CGROUPS UID STAGE -- ARGV...``

Apply resource limits to this process, join cgroups (comma-separated, or
``-``), optionally enter a new network namespace, start a new session,
then, as root for a sandbox of its own user (:mod:`attn_course.slot_user`),
set up STAGE (``-``: nothing) in a mount namespace of its own, become user
and group UID with no other group (``-``: stay who it is),
and ``exec`` ARGV.  A separate tiny
program (it imports nothing heavy) instead of a ``preexec_fn``, because the
grader holds JAX's threads and ``fork`` + Python code in the child is unsafe
there.

STAGE is JSON, one of two kinds:

* a list of ``[source, mount point]`` (bubblewrap's): each source bound on its
  mount point, which the user reaches where the source itself may not be (a
  Python under ``/root``); bubblewrap then binds the mount points into its root.
* an object ``{"restore": [[source, mount point], ...], "private": [[folder,
  tmpfs options], ...]}`` (the limits-only sandbox's, which has no root of its
  own): each ``private`` folder gets an empty tmpfs of its own (``/tmp``,
  ``/dev/shm``, the job's scratch folder: nothing a job writes there reaches
  the machine's disk or outlives the server, and the size is capped); each
  folder above a ``restore`` source that others may not pass through
  (``/root``) is covered by an empty read-only tmpfs; and each ``restore``
  source under a cover or a private folder is bound there again, at its own
  path, from its mount point.  Where no mount namespace can be made (a
  container without ``CAP_SYS_ADMIN``) and no source needs a cover, the
  private folders are left out: the grader then finds what a job left there.
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


def _under(path: str, folders) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _bind_at(libc, fd: int, source: str, is_dir: bool) -> None:
    """Bind what ``fd`` (an ``O_PATH`` descriptor) is on ``source``, making the mount point first."""
    if is_dir:
        os.makedirs(source, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(source), exist_ok=True)
        open(source, "a").close()
    _mount(libc, f"/proc/self/fd/{fd}", source, None, MS_BIND | MS_REC)


def _own_mount_namespace(libc) -> bool:
    """Enter a mount namespace of this process's own, whose mounts reach no other; whether it could."""
    return libc.unshare(CLONE_NEWNS) == 0 and libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0


def _private(libc, stage: dict) -> None:
    """The limits-only sandbox's STAGE (see the module's docstring)."""
    restore = sorted(stage.get("restore", []))
    private = sorted((folder, options) for folder, options in stage.get("private", [])
                     if os.path.isdir(folder) and not os.path.islink(folder))
    covers = sorted({c for c in (closed_above(source) for source, _ in restore) if c})
    if not _own_mount_namespace(libc):
        if covers:
            raise OSError(ctypes.get_errno(), "cannot make a mount namespace for the sandbox's binds")
        return  # nothing needs one: the private folders are left out
    os.umask(0o022)  # the folders made on the way to a mount point: the user passes through them
    held = []  # each source, through its mount point, before covers hide the points (under /tmp)
    for source, point in restore:
        _mount(libc, source, point, None, MS_BIND | MS_REC)
        held.append((source, os.open(point, os.O_PATH), os.path.isdir(point)))
    for cover in covers:
        _mount(libc, None, cover, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=755,size=64k")
    for folder, options in private:  # (sorted: /tmp before a scratch folder in it)
        os.makedirs(folder, exist_ok=True)
        _mount(libc, None, folder, b"tmpfs", MS_NOSUID | MS_NODEV, os.fsencode(options))
    hidden = covers + [folder for folder, _ in private]
    for source, fd, is_dir in held:
        if _under(source, hidden) and not any(source == folder for folder, _ in private):
            _bind_at(libc, fd, source, is_dir)
        os.close(fd)
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
        staged = json.loads(stage)
        if isinstance(staged, dict):
            _private(libc, staged)
        else:
            if not _own_mount_namespace(libc):
                raise OSError(ctypes.get_errno(), "cannot make a mount namespace for the sandbox's binds")
            for source, point in staged:
                _mount(libc, source, point, None, MS_BIND | MS_REC)
    if uid != "-":  # last: the groups, the network namespace and the binds need root
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
