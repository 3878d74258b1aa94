"""Red team of grading on a Dask cluster: what an archive or the instructor's input does to a batch.

Each test is small: a ``LocalCluster`` (one worker process,
one thread), chapter 3's exercise 3.5 only, at most two archives graded.

* an archive whose file name is not UTF-8 broke the client's connection to the scheduler (a
  Dask key is a strict UTF-8 msgpack string): every other archive of the batch failed with it;
* a ``--scheduler`` that is no scheduler's address, or one nobody answers at, gave a traceback
  (and, for a bad scheme or port, a two-minute hang at exit) instead of an error naming it;
* a cluster whose workers lack this package gave a traceback of a bare ``Exception``;
* ``--notebooks`` on workers without a working bubblewrap ran notebook code with limits only,
  silently (the local grader refuses it), and a library batch there had no warning; a worker
  that joins after the grader's check refuses such a task itself; nor did a batch on workers
  whose jobs would run without their filter of kernel calls;
* ``--jobs 0`` was taken as 1, and ``--scheduler ''`` graded on this machine, silently.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from attn_course import ROOT, cli  # noqa: E402
from attn_course.archive import build_archive, library_files  # noqa: E402
from attn_course.dask_pool import ClusterError, DaskPool  # noqa: E402
from attn_course.grade import Grader  # noqa: E402
from attn_course.identity import token_for  # noqa: E402
from attn_course.sandbox import Limits  # noqa: E402

pytestmark = pytest.mark.slow

SECRET = "dask-redteam-secret"  # the module's secret_env (tests/conftest.py) sets it
LIMITS = Limits(per_exercise_s=20, per_archive_s=120, cpu_s=60, memory_mb=3072, processes=64, file_mb=16)
NOT_UTF8 = os.fsdecode(b"late\xff\xfe-copy.zip")  # a name as an LMS download or an unzip can leave it

# a worker process where this package cannot be imported (a node where it was never installed)
BLOCK_PACKAGE = '''
import sys

class _NoCourse:
    def find_spec(self, name, path=None, target=None):
        if name == "attn_course" or name.startswith("attn_course."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoCourse())
for _m in [m for m in sys.modules if m == "attn_course" or m.startswith("attn_course.")]:
    del sys.modules[_m]
'''


def _cluster(**kwargs):
    return distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                    silence_logs=40, **kwargs)


@pytest.fixture(scope="module")
def cluster(secret_env):
    with _cluster() as c:
        yield c


def _honest(folder: Path, name: str, sid: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    build_archive(folder / name, sid, library_files(ROOT), token=token_for(sid, SECRET))
    return folder


def _main(argv: list[str], capsys) -> tuple[int, str]:
    rc = cli.main(argv)
    err = capsys.readouterr().err
    return rc, err


def test_an_archive_name_that_is_not_utf8_costs_no_other_archive(cluster, tmp_path):
    subs = _honest(tmp_path / "submitted", NOT_UTF8, "late-one")
    _honest(subs, "ok.zip", "on-time")
    lines: list[str] = []
    g = Grader(tmp_path / "out", "3.5", jobs=1, limits=LIMITS, log=lines.append, scheduler=cluster.scheduler_address)
    results = {r.archive: r for r in g.run(subs)}
    assert set(results) == {NOT_UTF8, "ok.zip"}
    for name, r in results.items():
        assert not r.error and not r.rejected, (name, r.rejected)
        assert r.scores == {"3.5": 2.0}, (name, r.scores)
    assert results[NOT_UTF8].student_id == "late-one"
    assert all("\udcff" not in line for line in lines)  # the progress lines show no lone surrogate


@pytest.mark.parametrize("address", ["nonsense://host:8786", "tcp://127.0.0.1:notaport", "tcp://127.0.0.1", " "])
def test_a_scheduler_address_that_is_none_is_refused_by_name(secret_env, tmp_path, capsys, address):
    subs = _honest(tmp_path / "submitted", "ok.zip", "on-time")
    rc, err = _main(["grade", str(subs), "--out", str(tmp_path / "out"), "--exercises", "3.5",
                     "--scheduler", address], capsys)
    assert rc == 2, err
    assert "--scheduler" in err and address in err and "Traceback" not in err, err


def test_a_scheduler_that_never_answers_is_refused_by_name(secret_env, tmp_path):
    g = Grader(tmp_path / "out", "3.5", jobs=1, limits=LIMITS, log=lambda *a: None)
    with socket.socket() as s:  # bound, never listening: every connection is refused until the timeout
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(ClusterError, match="cannot connect to the Dask scheduler at " + address):
            DaskPool(address, g, connect_timeout_s=1)


def test_workers_without_the_package_are_refused_by_name(secret_env, tmp_path, capsys):
    subs = _honest(tmp_path / "submitted", "ok.zip", "on-time")
    (tmp_path / "no_course.py").write_text(BLOCK_PACKAGE)
    with _cluster(preload=[str(tmp_path / "no_course.py")]) as c:
        rc, err = _main(["grade", str(subs), "--out", str(tmp_path / "out"), "--exercises", "3.5",
                         "--scheduler", c.scheduler_address], capsys)
    assert rc == 2, err
    assert "1 of 1 Dask workers cannot run the grader" in err and "Traceback" not in err, err
    assert not list((tmp_path / "out").glob("results/*.json"))


# a worker node whose jobs would run without their filter of kernel calls (another processor, a
# kernel without seccomp filters: here, its probe's answer), and as root (a root worker whose
# bubblewrap cannot start as another user: here, its probe's answer), loaded before the worker starts
NO_FILTER = '''
import attn_course.seccomp as _seccomp
_seccomp.filter_problem = lambda timeout_s=20.0: "no filter for this processor (riscv64)"
import attn_course.sandbox as _sandbox
_sandbox.host_user_problem = lambda use_bwrap=None: "bubblewrap did not start as uid 2100000000: exit status 1"
'''


def test_notebooks_need_bubblewrap_on_the_workers_too(secret_env, tmp_path):
    """A worker node without bubblewrap (here: none on its PATH) never runs notebook code with
    limits only, as the local grader never does; a library batch there is warned about.  So is
    a node whose jobs would run without their filter of kernel calls, or as root (the same node,
    here)."""
    subs = _honest(tmp_path / "submitted", "ok.zip", "on-time")
    (tmp_path / "no_filter.py").write_text(NO_FILTER)
    with _cluster(env={"PATH": str(tmp_path / "no-bin")}, preload=[str(tmp_path / "no_filter.py")]) as c:
        g = Grader(tmp_path / "out", "3.5", jobs=1, limits=LIMITS, log=lambda *a: None, notebooks=True,
                   scheduler=c.scheduler_address)
        with pytest.raises(ClusterError, match="--notebooks needs bubblewrap: 1 of 1 Dask workers"):
            g.run(subs)
        assert not list((tmp_path / "out").glob("results/*.json"))
        lines: list[str] = []
        library = Grader(tmp_path / "lib", "3.5", jobs=1, limits=LIMITS, log=lines.append)
        pool = DaskPool(c.scheduler_address, library)
        try:
            assert pool.check_workers() == 1
        finally:
            pool.shutdown()
    assert any(line.startswith("warning: 1 of 1 Dask workers") and "bubblewrap" in line for line in lines), lines
    if os.geteuid() == 0:  # in the worker's own words: its jobs run as users of their own (root here)
        assert any(line.startswith("warning: 1 of 1 Dask workers") and "users of their own, not root" in line
                   for line in lines), lines
    assert any(line.startswith("warning: on 1 of 1 Dask workers") and "without their filter of kernel calls "
               "(no filter for this processor (riscv64))" in line for line in lines), lines
    assert any(line.startswith("warning: on 1 of 1 Dask workers") and "jobs run as root on this machine" in line
               and "(bubblewrap did not start as uid 2100000000: exit status 1)" in line for line in lines), lines


# a worker node whose jobs would run with limits only as the worker's own user (not root, no
# bubblewrap): in its own words
REACHES_OWN_FILES = '''
import attn_course.sandbox as _sandbox
_sandbox.unconfined_reach = lambda use_bwrap: "and can read, write and signal what this user can (as a test)"
'''


def test_workers_whose_jobs_would_reach_their_own_files_are_refused_unless_trusted(secret_env, tmp_path):
    """A library batch on such workers was graded with a warning: a job could rewrite what the
    worker's user owns and signal the worker.  Refused now, as locally, unless the archives are
    trusted (``unconfined``); nothing is graded."""
    subs = _honest(tmp_path / "submitted", "ok.zip", "on-time")
    (tmp_path / "reach.py").write_text(REACHES_OWN_FILES)
    with _cluster(env={"PATH": str(tmp_path / "no-bin")}, preload=[str(tmp_path / "reach.py")]) as c:
        g = Grader(tmp_path / "out", "3.5", jobs=1, limits=LIMITS, log=lambda *a: None,
                   scheduler=c.scheduler_address)
        with pytest.raises(ClusterError, match=r"1 of 1 Dask workers \(e.g. .*\) would run the archives' code "
                                               r"with limits only and can read, write and signal .*--unconfined"):
            g.run(subs)
        assert not list((tmp_path / "out").glob("results/*.json"))
        lines: list[str] = []
        trusted = Grader(tmp_path / "trusted", "3.5", jobs=1, limits=LIMITS, log=lines.append, unconfined=True)
        pool = DaskPool(c.scheduler_address, trusted)
        try:
            assert pool.check_workers() == 1
        finally:
            pool.shutdown()
    assert any(line.startswith("warning: 1 of 1 Dask workers") and "limits only" in line for line in lines), lines


def test_a_worker_whose_jobs_would_reach_its_own_files_refuses_a_task(secret_env, tmp_path, monkeypatch):
    """The same rule on the worker itself, for one that joins after the grader's check."""
    from attn_course import dask_pool, sandbox

    subs = _honest(tmp_path / "submitted", "ok.zip", "on-time")
    g = Grader(tmp_path / "out", "3.5", jobs=1, limits=LIMITS, log=lambda *a: None)
    monkeypatch.setattr(sandbox, "unconfined_reach", lambda use_bwrap: "and can read, write and signal (a test)")
    config = dask_pool.TaskConfig.of(g)
    with pytest.raises(ClusterError, match="would run the archives' code with limits only and can read"):
        dask_pool.grade_task(config, "ok.zip", (subs / "ok.zip").read_bytes(), 0.0)
    assert config.key() not in dask_pool._GRADERS


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_jobs_below_one_is_refused(secret_env, tmp_path, capsys, jobs):
    subs = _honest(tmp_path / "submitted", "ok.zip", "on-time")
    rc, err = _main(["grade", str(subs), "--out", str(tmp_path / "out"), "--exercises", "3.5", "--jobs", jobs],
                    capsys)
    assert rc == 2 and f"--jobs must be a number of workers of at least 1, got {jobs}" in err, err
    assert not (tmp_path / "out").exists()


def test_a_worker_without_bubblewrap_refuses_a_notebook_task(secret_env, tmp_path, monkeypatch):
    """The same rule on the worker itself, for one that joins after the grader's check (here the
    task runs in this process, with no bubblewrap on its PATH)."""
    from attn_course import dask_pool

    subs = _honest(tmp_path / "submitted", "ok.zip", "on-time")
    g = Grader(tmp_path / "out", "3.5", jobs=1, limits=LIMITS, log=lambda *a: None, notebooks=True)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    config = dask_pool.TaskConfig.of(g)
    with pytest.raises(ClusterError, match="no working bubblewrap, which --notebooks needs"):
        dask_pool.grade_task(config, "ok.zip", (subs / "ok.zip").read_bytes(), 0.0)
    assert config.key() not in dask_pool._GRADERS  # nothing was built, nothing graded


def test_a_worker_keeps_its_latest_graders_and_closes_idle_older_ones(monkeypatch):
    """A long-lived worker sees configuration after configuration: its graders (a server per
    thread each) were kept for its lifetime.  It keeps the MAX_GRADERS most recently used,
    closes older idle ones, and never one that a task is using."""
    import threading

    from attn_course import dask_pool

    closed = []

    class FakeGrader:
        def __init__(self, spec):
            self.spec = spec

        def close(self):
            closed.append(self.spec)

    class FakeWorkerGrader:  # the bookkeeping of _WorkerGrader, without a class's set-up or servers
        acquire, release = dask_pool._WorkerGrader.acquire, dask_pool._WorkerGrader.release

        def __init__(self, config):
            self.grader, self.free, self.slots, self.busy, self.lock = FakeGrader(config.spec), [], 0, 0, threading.Lock()

    monkeypatch.setattr(dask_pool, "_WorkerGrader", FakeWorkerGrader)
    monkeypatch.setattr(dask_pool, "_GRADERS", {})
    monkeypatch.setattr(dask_pool, "MAX_GRADERS", 2)
    config = {spec: dask_pool.TaskConfig(spec, LIMITS, False, True, None, False, False, "fp")
              for spec in ("3.1", "3.2", "3.3", "3.4")}
    with dask_pool._slot(config["3.1"]) as (first, slot):
        assert slot == 0
        for spec in ("3.2", "3.3"):
            with dask_pool._slot(config[spec]):
                pass
        assert closed == []  # 3.1 is the oldest, but a task holds it
    with dask_pool._slot(config["3.4"]):
        assert closed == ["3.1", "3.2"]
    with dask_pool._slot(config["3.3"]) as (again, _):  # kept: the same grader, not a new one
        assert again.grader.spec == "3.3" and closed == ["3.1", "3.2"]
    assert list(dask_pool._GRADERS) == [config["3.4"].key(), config["3.3"].key()]
    assert first.busy == again.busy == 0


def test_jobs_with_a_scheduler_is_refused(secret_env, tmp_path, capsys):
    """--jobs sizes the local pool; with --scheduler it was ignored without a word."""
    subs = _honest(tmp_path / "submitted", "ok.zip", "on-time")
    rc, err = _main(["grade", str(subs), "--out", str(tmp_path / "out"), "--exercises", "3.5", "--jobs", "8",
                     "--scheduler", "tcp://127.0.0.1:8786"], capsys)
    assert rc == 2 and "--jobs sets the workers on this machine; with --scheduler" in err, err
    assert not (tmp_path / "out").exists()
