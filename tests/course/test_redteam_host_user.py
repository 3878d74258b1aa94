"""Each grading sandbox is a host user of its own where the grader is root.

Bubblewrap maps its sandbox's uid 1000 to the user that starts it, and the
kernel counts some resources per host user, whatever the namespace.  Started
by a root grader, every job was root on the host: a job that took the 128
inotify instances a user may hold (``fs.inotify.max_user_instances``) left
none to any root process of the machine, the grader and the other slot's
jobs included, for as long as it ran.  Measured with the sandboxes' users
turned off (``ATTN_COURSE_SLOT_UIDS=off``, by hand: the attack would starve
every root process of the machine, so it is no test): the other slot's job
could open no inotify instance (``EMFILE``) while the attacker held them.

Now each sandbox's processes are a uid of their own (:mod:`attn_course.slot_user`),
claimed for as long as the sandbox lives: the attacker takes its own 128,
and the other slot and the grader keep theirs.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time

import pytest

from attn_course import slot_user
from attn_course.runner import run_and_grade
from attn_course.sandbox import Limits

from server_jobs import _expected, fresh_server, package

pytestmark = pytest.mark.slow

HOLD_S = 120  # how long the attacker holds its instances at most: the test ends it sooner
HOLD = f"""
import ctypes as _ct, time as _time
_honest_entropy = entropy
_held = []


def entropy(A, mask=None):
    if not _held:
        libc = _ct.CDLL(None, use_errno=True)
        while True:
            fd = libc.inotify_init1(0)
            if fd < 0:
                break
            _held.append(fd)
        _time.sleep({HOLD_S})
    return _honest_entropy(A, mask)
"""
# the other slot's job: fails unless it can open an inotify instance
NEEDS_ONE = """
import ctypes as _ct, os as _os
_honest_entropy = entropy


def entropy(A, mask=None):
    libc = _ct.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    if fd < 0:
        raise RuntimeError(f"no inotify instance left (errno {_ct.get_errno()})")
    _os.close(fd)
    return _honest_entropy(A, mask)
"""
LIMITS = Limits(per_exercise_s=HOLD_S + 60)


def _uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


def _inotify_held(uid: int) -> int:
    """How many inotify instances the processes of ``uid`` hold."""
    held = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if _uid(int(pid)) != uid:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                held += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
        except (OSError, StopIteration, ValueError):
            pass
    return held


def _needs_slot_users(server) -> int:
    if os.geteuid() != 0:
        pytest.skip("only a root grader gives each sandbox a user of its own")
    if server.sandbox.user is None:
        pytest.skip("bubblewrap does not start as another user here (no unprivileged user namespaces)")
    return server.sandbox.user.uid


def _grade(server, files):
    return run_and_grade(server, files, [_expected("3.2", False, "")], False, set(), LIMITS)["3.2"]


def test_each_sandbox_runs_as_a_host_user_of_its_own(tmp_path):
    with fresh_server(91) as a, fresh_server(92) as b:
        uid_a, uid_b = _needs_slot_users(a), _needs_slot_users(b)
        assert len({uid_a, uid_b, os.getuid()}) == 3
        for server, uid in ((a, uid_a), (b, uid_b)):
            assert _uid(server.proc.pid) == uid  # bubblewrap, and the server inside it
            inside = subprocess.run(["ps", "-o", "uid=", "--ppid", str(server.proc.pid)], capture_output=True, text=True)
            assert inside.stdout.split() == [str(uid)], inside.stdout
        honest = _grade(a, package(tmp_path, "", "honest"))
    assert honest and all(c.passed for c in honest), [c.message for c in honest if not c.passed]


def test_a_job_that_takes_its_users_inotify_instances_leaves_the_others_theirs(tmp_path):
    libc = ctypes.CDLL(None, use_errno=True)
    limit = int(open("/proc/sys/fs/inotify/max_user_instances").read())
    with fresh_server(93, LIMITS) as a, fresh_server(94, LIMITS) as b:
        uid_a = _needs_slot_users(a)
        _needs_slot_users(b)
        attack: dict = {}
        thread = threading.Thread(target=lambda: attack.update(result=_grade(a, package(tmp_path, HOLD, "hold"))))
        thread.start()
        try:
            deadline = time.monotonic() + 90
            while _inotify_held(uid_a) < limit and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _inotify_held(uid_a) == limit  # every instance its user may hold: none was the grader's
            other = _grade(b, package(tmp_path, NEEDS_ONE, "needs-one"))
            fd = libc.inotify_init1(0)  # the grader's own
            assert fd >= 0, ctypes.get_errno()
            os.close(fd)
            assert _inotify_held(uid_a) == limit  # still held: the other slot was graded meanwhile
        finally:
            a.kill()  # ends the attacker's job
            thread.join(60)
    assert other and all(c.passed for c in other), [c.message for c in other if not c.passed]


def test_a_claimed_uid_is_nobody_elses_while_it_lives(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("only root claims uids")
    base = 2_050_000_000  # a range of this test's own
    monkeypatch.setenv(slot_user.ENV, str(base))
    sleeper = subprocess.Popen(["sleep", "60"], user=base, group=base, extra_groups=[])
    try:
        first, second = slot_user.claim(), slot_user.claim()
        try:
            # base runs a process (what a killed grader may leave): passed over; the claims differ
            assert (first.uid, second.uid) == (base + 1, base + 2)
            first.release()
            again = slot_user.claim()  # a released uid serves again
            assert again.uid == base + 1
            again.release()
        finally:
            second.release()
    finally:
        sleeper.kill()
        sleeper.wait()
    # a gid that a named group has (its members' files would be the sandbox's): passed over too
    real = slot_user.grp.getgrgid

    def getgrgid(gid):
        return ("a-group", "x", gid, []) if gid == base else real(gid)

    monkeypatch.setattr(slot_user.grp, "getgrgid", getgrgid)
    named = slot_user.claim()
    try:
        assert named.uid == base + 1
    finally:
        named.release()
    monkeypatch.setenv(slot_user.ENV, "off")
    assert slot_user.claim() is None
    monkeypatch.setenv(slot_user.ENV, "12")
    with pytest.raises(ValueError, match="ATTN_COURSE_SLOT_UIDS=12"):
        slot_user.claim()


@pytest.mark.parametrize("value", ["12", "many", str(2**32)])
def test_grade_refuses_a_range_of_uids_that_cannot_be(tmp_path, monkeypatch, capsys, value):
    from attn_course import cli

    (tmp_path / "submitted").mkdir()
    monkeypatch.setenv(slot_user.ENV, value)
    rc = cli.main(["grade", str(tmp_path / "submitted"), "--out", str(tmp_path / "out"), "--exercises", "3.5"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("attn-course: ATTN_COURSE_SLOT_UIDS=") and value in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


# -- where bubblewrap cannot start as another user, the root grader says its jobs run as root ----------

SECRET = "host-user-test-secret-" + "7" * 24
REFUSED = "bwrap: setting up uid map: Permission denied"


def _bubblewrap_refuses_other_users(monkeypatch, base: int) -> None:
    """This process as on a host where bubblewrap cannot start as another user (Ubuntu's rule
    against unprivileged user namespaces): its launcher fails as bubblewrap does there, and the
    process has not tried yet."""
    from attn_course import sandbox

    if os.geteuid() != 0:
        pytest.skip("only a root grader gives each sandbox a user of its own")
    if not sandbox.bwrap_works():
        pytest.skip("no working bubblewrap here")
    monkeypatch.setenv(slot_user.ENV, str(base))
    monkeypatch.setattr(sandbox, "_AS_SLOT_USER", None)
    monkeypatch.setattr(sandbox, "_launcher", lambda *a, **k: ["sh", "-c", f"echo '{REFUSED}' >&2; exit 1", "sh"])


def test_grade_warns_where_its_jobs_would_run_as_root(secret_env, tmp_path, monkeypatch, capsys):
    from attn_course import cli, sandbox

    base = 2_060_000_000
    _bubblewrap_refuses_other_users(monkeypatch, base)
    (tmp_path / "submitted").mkdir()
    rc = cli.main(["grade", str(tmp_path / "submitted"), "--out", str(tmp_path / "out"), "--exercises", "3.5"])
    err = capsys.readouterr().err
    assert rc == 2 and "no archives" in err, err  # (an empty folder: the warnings, then nothing graded)
    warned = [line for line in err.splitlines() if line.startswith("warning: jobs run as root")]
    assert len(warned) == 1, err
    assert f"bubblewrap did not start as uid {base}: exit status 1, {REFUSED}" in warned[0]
    # the sandboxes of this process now run as the grader's user, without trying again
    box = sandbox.Bubblewrap(95)
    try:
        assert box.user is None
    finally:
        box.close()
    again = slot_user.claim()  # the probe's uid was released
    try:
        assert again is not None and again.uid == base
    finally:
        again.release()


def test_no_warning_where_sandboxes_are_users_of_their_own_or_need_none(monkeypatch):
    from attn_course import sandbox

    if os.geteuid() != 0 or not sandbox.bwrap_works():
        pytest.skip("a root grader with a working bubblewrap")
    fresh = subprocess.run([sys.executable, "-c",
                            "from attn_course.sandbox import host_user_problem as p; print(p())"],
                           capture_output=True, text=True, timeout=120)
    assert fresh.stdout.strip() == "None", fresh.stderr  # this machine: they run as users of their own
    _bubblewrap_refuses_other_users(monkeypatch, 2_060_000_100)
    assert sandbox.host_user_problem(use_bwrap=False) is None  # limits only: warned about as such
    monkeypatch.setenv(slot_user.ENV, "off")
    assert sandbox.host_user_problem() is None  # the instructor asked for the grader's user
    monkeypatch.setenv(slot_user.ENV, "2060000100")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert sandbox.host_user_problem() is None  # not root: the grader's user is nobody's else
    assert sandbox._AS_SLOT_USER is None  # (and nothing was tried)


def test_no_uid_to_claim_is_named(monkeypatch):
    from attn_course import sandbox

    _bubblewrap_refuses_other_users(monkeypatch, 2_060_000_200)
    monkeypatch.setattr(slot_user, "_folder", lambda: None)  # as where the claims' folder is not root's
    problem = sandbox.host_user_problem()
    assert problem is not None and "attn-course-uids" in problem and "mode 0700" in problem, problem


def test_graders_in_two_containers_give_their_sandboxes_two_uids(monkeypatch):
    """Found by the red team: two graders on one kernel, each in a container of its own (its own
    ``/run`` and pid namespace: Kubernetes pods or Docker containers run as root), claimed the
    same uid, and a job in one took the inotify instances of an honest job in the other.  Each pid
    namespace now has a range of its own (here the other grader is a process in a new pid and
    mount namespace, with a fresh ``/run``, as a container has)."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("root, and unshare(1), to stand in for a container")
    monkeypatch.delenv(slot_user.ENV, raising=False)
    code = "from attn_course import slot_user as s; u = s.claim(); print(u.uid if u else None, s.default_base())"
    ours = slot_user.claim()
    try:
        assert ours is not None and slot_user.default_base() <= ours.uid < slot_user.default_base() + slot_user.COUNT
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount", "--mount-proc", "--propagation", "private",
                            "sh", "-c", 'mount -t tmpfs -o mode=755 tmpfs /run && exec "$0" -c "$1"', sys.executable,
                            code], capture_output=True, text=True, timeout=120, cwd=str(os.getcwd()))
        assert r.returncode == 0, r.stderr
        theirs, their_base = map(int, r.stdout.split())
    finally:
        ours.release()
    assert their_base != slot_user.default_base()
    assert their_base <= theirs < their_base + slot_user.COUNT
    assert theirs + slot_user.COUNT <= 2**32 - 1
    ranges = sorted([slot_user.default_base(), their_base])
    assert ranges[0] + slot_user.COUNT <= ranges[1]  # two ranges apart, not only two uids
