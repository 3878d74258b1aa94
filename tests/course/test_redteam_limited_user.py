"""The limits-only sandbox as root: its jobs run as a user of their own, not as root.

Where bubblewrap does not work (a Docker container without user namespaces,
run as root), grading falls back on limits only.  Its jobs ran as root: they
could read the grader's environment (the course secret) and memory, write
into the Python environment (a ``sitecustomize.py`` that outlives the job
and runs in the grader), signal the grader and open ``/dev/kvm``.  Now the
server runs as a host user of the sandbox's own (:mod:`attn_course.slot_user`),
with Python bound where that user reaches it when it lies under ``/root``
(:mod:`attn_course.limit`'s ``restore``).  What a job leaves in the folders
every user may write to ends its server and is removed before the next job
of that user, another student's, starts.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from attn_course import sandbox, slot_user
from attn_course.sandbox import Limited, Limits
from attn_course.worker import PR_SET_CHILD_SUBREAPER, proc_status

from server_jobs import package, spy, spy_source, started

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not slot_user.wanted(),
                                reason="users of their own need a root grader (CI runs as root)")

# what a job reached that a user of its own may not (the spy's findings)
REACH = """
import sys as _sys
if _os.getuid() == 0 or _os.geteuid() == 0:
    found.append('runs as root')
for _path in ({secret!r}, '/proc/{grader}/environ', '/proc/1/environ'):
    try:
        with open(_path, 'rb') as _f:
            _f.read(1)
        found.append('read ' + _path)
    except OSError:
        pass
import ctypes as _ct  # (a process's memory past the watch, which refuses it: the kernel's answer)
_fd = _ct.CDLL(None).open(b'/proc/{grader}/mem', 0)
if _fd >= 0:
    found.append('read /proc/{grader}/mem')
    _os.close(_fd)
try:
    open(_os.path.join(_sys.prefix, 'planted_by_a_job.py'), 'w').close()
    found.append('wrote into the Python environment')
except OSError:
    pass
try:
    _os.kill({grader}, 0)
    found.append('may signal the grader')
except OSError:
    pass
for _dev in ('/dev/kvm', '/dev/net/tun'):
    try:
        _os.close(_os.open(_dev, _os.O_RDWR))
        found.append('opened ' + _dev)
    except OSError:
        pass
"""


@pytest.fixture
def secret_file():
    """A file only root may read, in a folder every user may pass through (so only its own mode
    keeps a job out)."""
    folder = tempfile.mkdtemp(prefix="attn-limited-")
    os.chmod(folder, 0o755)
    path = Path(folder) / "secret.txt"
    path.write_text("only root reads this")
    os.chmod(path, 0o600)
    yield path
    path.unlink()
    os.rmdir(folder)


def test_a_limits_only_job_of_a_root_grader_is_not_root(tmp_path, secret_file):
    planted = Path(sys.prefix) / "planted_by_a_job.py"
    box = Limited(70, Limits())
    try:
        assert box.user is not None, sandbox._LIMITED_PROBLEM  # Python started as that user here
        with started(box) as server:
            failed = spy(server, package(tmp_path, spy_source(REACH.format(secret=str(secret_file),
                                                                             grader=os.getpid()))))
    finally:
        box.close()
        if planted.exists():
            planted.unlink()
    assert failed == [], failed


def test_what_a_job_leaves_where_every_user_writes_never_reaches_the_next(tmp_path):
    """A job of a user of its own leaves files in /tmp, /dev/shm and /run/lock (found by the red
    team: on the root disk, writable by all, and kept) for the next job of that user, another
    student's, which looks for them.  Each of those folders is a private tmpfs of the server's:
    nothing reaches the machine's folders, and the server that saw a file left goes with them."""
    token = os.urandom(4).hex()
    left = [f"{folder}/left-{token}" for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
            if os.path.isdir(folder)]
    leave = "".join(f"try:\n    open({p!r}, 'w').close()\nexcept OSError:\n    raise SystemExit('not left')\n"
                    for p in left)
    look = "".join(f"if _os.path.exists({p!r}):\n    found.append({p!r})\n" for p in left)
    box = Limited(71, Limits())
    try:
        assert box.user is not None, sandbox._LIMITED_PROBLEM
        with started(box) as server:
            assert all("not left" not in m for m in spy(server, package(tmp_path, leave, "leaver")))
            assert not any(os.path.exists(p) for p in left)  # in the server's own folders only
            assert spy(server, package(tmp_path, spy_source(look), "looker")) == []
            assert server.starts == 2  # the leaver's server ended (its files were the reason)
    finally:
        box.close()
        for p in left:
            if os.path.exists(p):
                os.unlink(p)


# a job that fills /tmp and its own scratch folder (HOME) with files under the file-size limit
FILL = """
for _d in ('/tmp', _os.environ['HOME']):
    _n = 0
    try:
        for _k in range(20):
            with open(f'{_d}/fill-{_k}', 'wb') as _f:
                _f.write(b'x' * (4 << 20))
            _n += 4
    except OSError:
        pass
    if _n > 16:
        found.append(f'{_n} MB in {_d}')
"""


def test_what_a_job_writes_is_capped_and_off_the_machines_disk(tmp_path):
    """The red team: /tmp lay on the machine's disk with only a per-file limit, so a job could
    fill the disk under the grader (its results, the gradebook).  Now each is a tmpfs of
    ``scratch_mb``, counted in the slot's memory."""
    box = Limited(78, Limits(scratch_mb=16))
    try:
        assert box.user is not None, sandbox._LIMITED_PROBLEM
        with started(box) as server:
            scratch = Path(box._scratch)  # (the host's folder: the job's is a tmpfs over it)
            failed = spy(server, package(tmp_path, spy_source(FILL)))
            assert not list(Path("/tmp").glob("fill-*"))
            assert not scratch.exists() or not list(scratch.glob("fill-*"))
    finally:
        box.close()
    assert failed == [], failed


def test_where_python_cannot_start_as_that_user_jobs_run_as_root_and_the_warning_says_why(monkeypatch):
    """As when the grader's mount namespace cannot be made (a container without CAP_SYS_ADMIN) and
    Python lies under /root: the user is given back, and the warning names root and the reason."""
    monkeypatch.setattr(sandbox, "_LIMITED_AS_SLOT_USER", None)
    monkeypatch.setattr(sandbox, "_LIMITED_PROBLEM", None)
    real = sandbox._launcher

    def cannot_mount(limits, newnet, groups, uid=None, stage=None):
        argv = real(limits, newnet, groups, uid, stage)
        return argv + [sys.executable, "-c", "import sys; sys.exit('OSError: cannot mount tmpfs on /root')", "--"]

    monkeypatch.setattr(sandbox, "_launcher", cannot_mount)
    box = Limited(72, Limits())
    try:
        assert box.user is None
    finally:
        box.close()
    monkeypatch.setattr(sandbox, "_launcher", real)
    text = sandbox.limits_only_reach()
    assert "as root" in text and "every file" in text, text
    assert "Python did not start as uid" in text and "cannot mount tmpfs on /root" in text, text
    box = Limited(73, Limits())  # no second try in this process
    try:
        assert box.user is None
        argv, _ = box.server_command()
        assert "--own-user" not in argv
    finally:
        box.close()


# a job's child that leaves the job's process group (the server ends that group after a job) and
# lives on, named so that a spy finds it
ESCAPE = """
import ctypes as _ct, os as _os, time as _time
if _os.fork() == 0:
    try:
        _os.setpgid(0, 0)
    except OSError:  # refused by the filter: in the job's group still
        pass
    _ct.CDLL(None).prctl(15, b"escapee-{token}", 0, 0, 0)  # PR_SET_NAME
    _time.sleep(300)
    _os._exit(0)
"""
FIND = """
for _pid in [p for p in _os.listdir('/proc') if p.isdigit()]:
    try:
        _stat = open(f'/proc/{{_pid}}/stat').read()
        if '(escapee-{token})' in _stat and _stat.rsplit(')', 1)[1].split()[0] != 'Z':  # (a zombie is dead)
            found.append('alive: ' + _pid)
    except OSError:
        pass
"""


def _escapees(token: str) -> list[int]:
    """The escapees alive (a zombie is dead: this machine's init may never reap it)."""
    return [pid for pid, status in proc_status("Name", "State")
            if status.get("Name") == [f"escapee-{token}"] and status.get("State", ["?"])[0] != "Z"]


def test_a_process_that_left_the_jobs_group_is_gone_before_the_next_job(tmp_path):
    """Without a pid namespace the server ended only the job's process group: a child in a group
    of its own lived on, as the same user as the next job (another student's)."""
    token = os.urandom(3).hex()
    box = Limited(74, Limits())
    try:
        assert box.user is not None, sandbox._LIMITED_PROBLEM
        with started(box) as server:
            spy(server, package(tmp_path, ESCAPE.format(token=token), "escaper"))
            assert spy(server, package(tmp_path, spy_source(FIND.format(token=token[:6])), "finder")) == []
    finally:
        box.close()
        for pid in _escapees(token):
            os.kill(pid, 9)
    assert not _escapees(token)


# the red team's fork chain: out of the job's group, then fork and let the parent end, on and on
# (a list of pids is always out of date), for at most 30 s
CHAIN = """
import ctypes as _ct, os as _os, time as _time
if _os.fork() == 0:
    _os.setpgid(0, 0)
    _ct.CDLL(None).prctl(15, b"escapee-{token}", 0, 0, 0)  # PR_SET_NAME
    _end = _time.monotonic() + 30
    while _time.monotonic() < _end:
        if _os.fork() > 0:
            _os._exit(0)
    _os._exit(0)
"""


def _seen(token: str, tries: int = 500) -> bool:
    """Whether an escapee is seen at all (a chain's pid lives a millisecond: a scan may miss it)."""
    import time

    for _ in range(tries):
        if _escapees(token):
            return True
        time.sleep(0.005)
    return False


@pytest.mark.parametrize("cgroups", [True, False], ids=["in-cgroups", "no-cgroups"])
def test_what_a_job_left_running_is_killed_by_its_user(tmp_path, monkeypatch, cgroups):
    """When the server is gone, what its jobs left running is killed, a fork chain included: by
    ``kill -9 -1`` as the sandbox's user, which no fork can race (the cgroup's list of pids can
    be), and where no cgroup holds them (a container whose /sys/fs/cgroup is read-only)."""
    from attn_course.sandbox import SlotGroups

    if not cgroups:
        monkeypatch.setattr(SlotGroups, "_make", lambda self, *a, **k: False)
    token = os.urandom(3).hex()
    box = Limited(75, Limits())
    assert cgroups or not box.groups.paths
    uid = box.user.uid if box.user is not None else None
    try:
        assert box.user is not None, sandbox._LIMITED_PROBLEM
        argv, env = box.server_command()  # the server's own check and the job's filter off (a server
        monkeypatch.setattr(box, "server_command",  # killed mid-job never runs the check; a kernel without
                            lambda: ([a for a in argv if a not in ("--own-user", "--confined")], env))  # seccomp)
        with started(box) as server:
            spy(server, package(tmp_path, CHAIN.format(token=token), "escaper"))
            assert _seen(token)  # alive while its server is
    finally:
        box.close()
    left = _seen(token, tries=100)  # (half a second of looking)
    if left and uid is not None:
        sandbox._kill_user(uid)
    assert not left


@pytest.fixture
def roots_folder():
    """A folder of root's, with a file, in a folder every user may pass through."""
    top = Path(tempfile.mkdtemp(prefix="attn-victim-"))
    os.chmod(top, 0o755)
    (top / "victim").mkdir()
    (top / "victim" / "important.txt").write_text("root's")
    yield top / "victim"
    import shutil

    shutil.rmtree(top)


def test_what_a_job_left_is_removed_with_its_users_rights_only(monkeypatch, roots_folder):
    """Found by the red team: another slot's job swapped a folder the grader was removing (in a
    folder every user may write to) for a link to a folder of root's, between the grader's check
    and its removal, and root removed that folder.  The removal now runs as the sandbox's own
    user: here it is handed root's folder itself, as the swapped link would hand it, and removes
    nothing of it."""
    from attn_course import worker

    box = Limited(77, Limits())
    try:
        assert box.user is not None, sandbox._LIMITED_PROBLEM
        monkeypatch.setattr(worker, "owned", lambda uid: frozenset({str(roots_folder)}))
        box.cleanup()
    finally:
        monkeypatch.undo()
        box.close()
    assert (roots_folder / "important.txt").read_text() == "root's"


def test_grade_warns_where_every_user_may_read_the_submissions(monkeypatch, capsys):
    """Jobs of users of their own read what every user may: other students' archives too, where
    the submissions folder is open to all (the red team's finding); the grader says so."""
    from attn_course import cli

    monkeypatch.setattr(sandbox, "bwrap_works", lambda: False)
    monkeypatch.setenv("ATTN_COURSE_SECRET", "limited-secret")
    top = Path(tempfile.mkdtemp(prefix="attn-subs-"))
    try:
        (top / "subs").mkdir()
        os.chmod(top, 0o755)
        os.chmod(top / "subs", 0o755)
        assert cli.main(["grade", str(top / "subs"), "--out", str(top / "out"), "--exercises", "3.1"]) == 2  # (an empty folder: the warnings, then 'no archives', nothing graded)
        err = capsys.readouterr().err
        assert f"warning: {top / 'subs'} lets every user of this machine read the submissions" in err, err
        os.chmod(top / "subs", 0o700)
        assert cli.main(["grade", str(top / "subs"), "--out", str(top / "out2"), "--exercises", "3.1"]) == 2
        assert "read the submissions" not in capsys.readouterr().err
    finally:
        import shutil

        shutil.rmtree(top)


def test_the_graders_own_compilation_cache_is_private(tmp_path, monkeypatch):
    """Its programs embed the hidden cases' inputs: a job of a user of its own read it where
    ATTN_COURSE_CACHE (or XDG_CACHE_HOME) lies where every user may read."""
    import stat

    import jax

    from attn_course import xla_cache

    before = jax.config.jax_compilation_cache_dir  # (the suite's own cache: put back after)
    where = tmp_path / "cache" / "xla"
    monkeypatch.setenv("ATTN_COURSE_CACHE", str(where))
    try:
        xla_cache.enable_compile_cache()
        assert stat.S_IMODE(where.stat().st_mode) == 0o700
    finally:
        monkeypatch.undo()
        if before:
            xla_cache.enable_compile_cache(before)


def test_an_instructors_private_umask_still_gives_jobs_users_of_their_own():
    """With umask 077 the folders made on the way to Python's mount point were root's alone, the
    user could not pass them, and every job ran as root again (a fresh process: the probe is once
    per process)."""
    import subprocess

    code = ("import os; os.umask(0o077)\n"
            "from attn_course import sandbox\n"
            "box = sandbox.Limited(79, sandbox.Limits()); print(box.user is not None, sandbox._LIMITED_PROBLEM)\n"
            "box.close()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=str(sandbox.ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[0] == "True", r.stdout


# a job's child tries to leave the job's process group
LEAVE_GROUP = """
if _os.fork() == 0:
    try:
        _os.setpgid(0, 0)
        _os._exit(7)
    except OSError:
        _os._exit(0)
_, _status = _os.wait()
if _os.waitstatus_to_exitcode(_status) == 7:
    found.append('left the process group')
"""


def test_a_jobs_processes_cannot_leave_its_process_group(tmp_path):
    """The red team's fork chain: a process that left the job's group and forked on and on outran
    the server's kill by list.  The filter refuses ``setpgid``: all stay in the group the server
    ends at once."""
    box = Limited(80, Limits())
    try:
        with started(box) as server:
            failed = spy(server, package(tmp_path, spy_source(LEAVE_GROUP)))
    finally:
        box.close()
    assert failed == [], failed


# orphans that end at once: each a zombie until the process it was handed to reaps it
# orphans: each a zombie, once it ends, until the process it was handed to reaps it
ORPHANS = """
import os as _os, time as _time
for _ in range({n}):
    if _os.fork() == 0:
        if _os.fork() == 0:
            _time.sleep({sleep})
            _os._exit(0)
        _os._exit(0)
    _os.waitpid(-1, 0)
"""
# ... then the job kills its server (the template's parent, of the same user: with limits only
# it may), whose orphans go up to the grader
KILL_SERVER = """
_server = int(open(f"/proc/{_os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1])
_os.kill(_server, 9)
_time.sleep(5)
"""

# the next job: can it still start the processes (or threads) a job needs?
FORKS = """
_pids = []
try:
    for _ in range(24):
        _pid = _os.fork()
        if _pid == 0:
            _time.sleep(0.2)
            _os._exit(0)
        _pids.append(_pid)
except OSError as _e:
    found.append(f'fork refused after {len(_pids)}: {_e}')
for _pid in _pids:
    _os.waitpid(_pid, 0)
"""


def _zombies_of(uid: int, parent: int | None = None) -> list[int]:
    return [pid for pid, status in proc_status("State", "PPid", "Uid")
            if status.get("State", [])[:1] == ["Z"] and status.get("Uid", [])[:1] == [str(uid)]
            and (parent is None or status.get("PPid") == [str(parent)])]


def test_a_jobs_orphans_are_reaped_before_the_next_job(tmp_path):
    """A job's orphans went to the nearest reaper above it: without a pid namespace, the machine's
    init, or a container's, which may never reap them (this machine's is slow to).  Their zombies
    stayed counted in the slot's pids group and its user's processes, until the next job (another
    student's) could not start a thread.  Here the grader stands for such an init (a subreaper that
    does not reap).  Now the server reaps its jobs' orphans as they end (40 of them, which end at
    once); those still running when their server is killed (40 too) come to the grader, which
    kills and reaps them before the next server starts."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    box = Limited(81, Limits())
    uid = box.user.uid if box.user is not None else None
    left = {}
    try:
        assert box.user is not None, sandbox._LIMITED_PROBLEM
        earlier = set(_zombies_of(uid))  # (another test's, of the same user, that its grader left)
        with started(box) as server:
            spy(server, package(tmp_path, ORPHANS.format(n=40, sleep=0)))
            left["ended"] = len(set(_zombies_of(uid)) - earlier)
            spy(server, package(tmp_path, ORPHANS.format(n=40, sleep=60) + KILL_SERVER))
            failed = spy(server, package(tmp_path, spy_source(FORKS), "forker"))  # on a new server
            left["server killed"] = len(set(_zombies_of(uid)) - earlier)
    finally:
        box.close()
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in _zombies_of(uid, os.getpid()) if uid is not None else ():
            os.waitpid(pid, 0)  # the orphans handed to this process (before the fix)
    assert (left, failed) == ({"ended": 0, "server killed": 0}, []), f"zombies of the job's user {left}; the next job: {failed}"
