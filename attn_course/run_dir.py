"""One private folder per grader process, and the sweep that removes those of processes that died.

A process that is killed (a Dask worker its nanny restarts, a grader stopped
with SIGKILL, the kernel's OOM killer) runs no ``atexit`` hook: the folders it
made in the temporary directory would stay there until the machine restarts:
its copy of the worker's course modules, the archive a Dask task had written
(a student's submission), a job's scratch folder (what the student's code
wrote).  So every folder the grader makes for a while lives inside one folder
per process (:func:`run_dir`), which holds a lock (``flock``) on a file of its
own for as long as the process lives.  The kernel drops the lock when the
process ends, however it ends.  The first time a process makes its folder, it
removes every such folder of its user whose lock it can take (:func:`sweep`).

A lock, not a process id in the name: a pid is reused, and means nothing in
another pid namespace (a container sharing ``/tmp``); a lock is held exactly
as long as its holder lives, in any namespace.  The lock file is locked under
a temporary name and only then renamed ``.lock``: a sweep never sees a
``.lock`` that is not locked yet.  A folder without one (its process died
between making it and locking it: empty) is left alone.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import tempfile
from pathlib import Path

PREFIX = "attn-run-"
LOCK = ".lock"

_mine: tuple[int, str, int] | None = None  # (pid, folder, the lock's descriptor): a forked child makes its own


def run_dir() -> Path:
    """This process's private folder (mode 0711) in the temporary directory, made on first use.

    Made for this pid: a child forked from this process makes its own.  Its
    first use also sweeps the folders of processes that died.
    """
    global _mine
    pid = os.getpid()
    if _mine is not None and _mine[0] == pid:
        return Path(_mine[1])
    sweep()
    path = tempfile.mkdtemp(prefix=PREFIX)
    staged = os.path.join(path, ".lock-new")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(staged, os.path.join(path, LOCK))
    # others may pass through (a sandbox's bind of a folder in it) but not list it
    os.chmod(path, 0o711)
    _mine = (pid, path, fd)
    atexit.register(_remove_own, pid, path)
    return Path(path)


def sweep(tmp: str | None = None) -> list[str]:
    """Remove the folders of this user's grader processes that no longer run; return their paths.

    A folder counts only if it is a real folder (not a link), this user's,
    and holds a ``.lock`` that nobody holds: its process has ended.
    """
    from .worker import remove_tree

    tmp = tmp or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = [e for e in os.scandir(tmp) if e.name.startswith(PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(entry.path, LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process lives
            os.close(fd)
            continue
        try:
            remove_tree(entry.path)  # while holding its lock: no other sweep removes it at once
        finally:
            os.close(fd)
        removed.append(entry.path)
    return removed


def _remove_own(pid: int, path: str) -> None:
    global _mine
    if os.getpid() != pid:  # a forked child exiting through Python: the folder is its parent's
        return
    from .worker import remove_tree

    remove_tree(path)
    if _mine is not None and _mine[0] == pid:
        os.close(_mine[2])
        _mine = None
