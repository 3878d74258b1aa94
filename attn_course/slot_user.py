"""A host user of its own for each grading sandbox, where the grader is root.

Bubblewrap maps its sandbox's uid 1000 to the user that started it: a
grader run as root ran every job as root on the host, without capabilities
but counted as root.  The kernel counts some resources per user, whatever
the namespace: inotify instances (128 for all of a user's processes),
pipe buffer pages, queued signals, POSIX message queue bytes, processes.
A job that held 128 inotify instances left none to any root process of the
machine (the grader, the other slots, the system's own services) for as
long as it ran.  With a user of its own, what a job takes of such a count
it takes from itself.

A sandbox claims a uid of the range ``ATTN_COURSE_SLOT_UIDS`` (its first
uid; by default a range of the grader's pid namespace's own, from
:data:`DEFAULT_BASE` on, :func:`default_base`; ``off``: every sandbox runs as the
grader's user, as before) for as long as it lives: the claim is a ``flock``
on a file named by the uid in a folder only root can use (in ``/run``), which
the kernel releases however the grader ends.  A uid that a named user or
group of this machine has, or that a process still runs as (what a killed
grader left), is passed over.  Group id and uid are the same number; the sandbox
has no supplementary groups.
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ENV = "ATTN_COURSE_SLOT_UIDS"
DEFAULT_BASE = 2_100_000_000  # far above the ranges that systems give their users and containers
COUNT = 4096  # sandboxes that can live at once in one pid namespace
BLOCKS = (2**32 - 2 - DEFAULT_BASE) // COUNT  # the default ranges, one a pid namespace
_NS_FIRST = 0xF0000000  # the kernel numbers its namespaces from here (PROC_DYNAMIC_FIRST), lowest free first


@dataclass
class SlotUser:
    """A claimed uid; :meth:`release` when no process of the sandbox is left."""

    uid: int
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _base() -> int | None:
    value = os.environ.get(ENV, "").strip()
    if value.lower() == "off":
        return None
    if not value:
        return default_base()
    try:
        base = int(value)
    except ValueError:
        raise ValueError(f"{ENV}={value!r}: the first uid of the sandboxes' range (a number), or off") from None
    if not 1000 <= base <= 2**32 - 2 - COUNT:
        raise ValueError(f"{ENV}={base}: the range {base}..{base + COUNT - 1} must lie within 1000..{2**32 - 2}")
    return base


def default_base() -> int:
    """The first uid of this pid namespace's own range of :data:`COUNT`, from :data:`DEFAULT_BASE` on.

    Graders in containers of one kernel (Kubernetes pods run as root, Docker
    containers) share its uids but see neither each other's claims (their own
    ``/run``) nor each other's processes (their own pid namespace): with one
    range for all, two of them gave their sandboxes the same uid, and a job in
    one took the inotify instances of an honest job in the other.  The kernel
    numbers each living namespace apart (the inode of ``/proc/self/ns/pid``,
    from :data:`_NS_FIRST` on, lowest free first; the machine's own has a fixed
    number below), so the graders of two pid namespaces get two ranges.
    Processes of one pid namespace see each other, and coordinate through the
    claims' folder.
    """
    try:
        ino = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ino = 0
    # the machine's own pid namespace (a fixed number below the others): the first range
    block = 1 + (ino - _NS_FIRST) % (BLOCKS - 1) if ino >= _NS_FIRST else 0
    return DEFAULT_BASE + block * COUNT


def setting_problem() -> str | None:
    """What is wrong with ``ATTN_COURSE_SLOT_UIDS``, for a command to say before it grades."""
    try:
        _base()
    except ValueError as err:
        return str(err)
    return None


def _folder_path() -> Path:
    try:
        run = os.lstat("/run")
        private = stat.S_ISDIR(run.st_mode) and run.st_uid == 0 and not run.st_mode & 0o022
    except OSError:
        private = False
    return Path("/run" if private else tempfile.gettempdir()) / "attn-course-uids"


def _folder() -> Path | None:
    """The claims' folder: made by root, mode 0700; None if what is there is anything else.

    In ``/run`` where only root may write there: in a shared ``/tmp`` any user could make
    the folder first, and so turn the sandboxes' own users off.
    """
    path = _folder_path()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
        return None  # not ours (a link, another user's folder): no claim can be trusted there
    return path


def _in_use(uid: int) -> bool:
    """Whether a named user has this uid, a named group this gid (its members' files would be the
    sandbox's too), or a process of this pid namespace runs as it."""
    for named in (pwd.getpwuid, grp.getgrgid):
        try:
            named(uid)
            return True
        except KeyError:
            pass
    from .worker import processes_of

    return bool(processes_of(uid))


def wanted() -> bool:
    """Whether sandboxes should run as users of their own here: root on Linux, and not ``off``."""
    return sys.platform.startswith("linux") and os.geteuid() == 0 and _base() is not None


def unclaimed_reason() -> str:
    """Why :func:`claim` found no uid where one is :func:`wanted` (for the grader's warning)."""
    if _folder() is None:
        return f"{_folder_path()}, the folder of the uids' claims, is not a folder of root's own with mode 0700"
    base = _base()
    return f"every uid of {base}..{base + COUNT - 1} is claimed, or a named user's or a process's"


def claim() -> SlotUser | None:
    """A uid of the range for one sandbox, or None: not root, not Linux, ``off``, or all taken."""
    if not wanted():
        return None
    base = _base()
    folder = _folder()
    if folder is None:
        return None
    for uid in range(base, base + COUNT):
        try:
            fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if _in_use(uid):
            os.close(fd)
            continue
        return SlotUser(uid, fd)
    return None
