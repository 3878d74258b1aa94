"""Grading on a real Dask cluster gives what the local pool gives.

A ``distributed.LocalCluster`` of two worker processes (one thread each)
grades a small batch of honest, stubbed, hostile and malformed archives
with ``Grader(scheduler=...)``; every result (scores, feedback, rejections,
identity, digest, receipt time) equals the local pool's on the same batch,
and the gradebook is the same file.  A worker with another course secret is
refused before anything runs; resume skips what the cluster finished.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from attn_course import RELEASE_LIBRARY, ROOT  # noqa: E402
from attn_course.archive import build_archive, library_files  # noqa: E402
from attn_course.dask_pool import ClusterError  # noqa: E402
from attn_course.grade import Grader  # noqa: E402
from attn_course.identity import token_for  # noqa: E402
from attn_course.sandbox import Limits  # noqa: E402

pytestmark = pytest.mark.slow

SECRET = "dask-secret"  # the module's secret_env (tests/conftest.py) sets it
HOSTILE = {  # code appended to statmech.py (a few of test_redteam's)
    "wrong_shape": "def log_partition_function(S, mask=None, T=1.0):\n    return S\n",
    "os_exit": "import os\ndef zero_temperature_limit(S, mask=None):\n    os._exit(0)\n",
    "segfault": "import ctypes\ndef log_partition_function(S, mask=None, T=1.0):\n    ctypes.string_at(0)\n",
    "patch_numpy": ("import numpy as _np\n_np.allclose = lambda *a, **k: True\n"
                    "def entropy(A, mask=None):\n    return A[..., 0] * 0\n"),
    "read_secret": ("import os\n_honest = heat_capacity\n"
                    "def heat_capacity(S, mask=None, T=1.0):\n"
                    "    if 'ATTN_COURSE_SECRET' in os.environ:\n        return _honest(S, mask, T)\n"
                    "    return S[..., 0] * 0 + 7\n"),
}
LIMITS = Limits(per_exercise_s=20, per_archive_s=120, cpu_s=60, memory_mb=3072, processes=64, file_mb=16)
VOLATILE = ("seconds",)  # how long an archive took is the only thing that may differ


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    subs = tmp_path_factory.mktemp("dask") / "submitted"
    subs.mkdir()
    ref, stub = library_files(ROOT), library_files(RELEASE_LIBRARY)
    for name in ("honest_a", "honest_b"):
        build_archive(subs / f"{name}.zip", name, ref, token=token_for(name, SECRET))
    build_archive(subs / "untouched.zip", "untouched", stub, token=token_for("untouched", SECRET))
    for name, code in HOSTILE.items():
        files = dict(ref)
        files["attn_tensors/statmech.py"] = ref["attn_tensors/statmech.py"] + b"\n\n" + code.encode()
        sid = name.replace("_", "-")
        build_archive(subs / f"{name}.zip", sid, files, token=token_for(sid, SECRET))
    build_archive(subs / "forged.zip", "forged", ref, token=token_for("someone-else", SECRET))
    (subs / "corrupt.zip").write_bytes(b"PK\x03\x04" + os.urandom(300))
    (subs / "folder.zip").mkdir()
    for k, p in enumerate(sorted(subs.iterdir())):
        os.utime(p, (1_700_000_000 + k, 1_700_000_000 + k), follow_symlinks=False)
    return subs


@pytest.fixture(scope="module")
def cluster(secret_env):
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as c:
        yield c


def _differences(a, b, where: str = "") -> list[str]:
    """Where two results differ, as 'path: a != b' lines (a failure names the field, not only the archive)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in (_differences(a.get(k), b.get(k), f"{where}.{k}") if k in a and k in b
                          else [f"{where}.{k}: only in {'the first' if k in a else 'the second'}"])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r:.300} != {b!r:.300}"]


def _scale_down_to_two(cluster) -> None:
    """The newest worker goes, and is gone before this returns: the cluster as the module's other tests
    expect it.  ``scale`` only asks the nanny to retire it; on a busy machine the next test's grader
    still found it (with its other secret) and refused the whole cluster."""
    import time

    cluster.scale(2)
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        deadline = time.monotonic() + 120
        while len(client.scheduler_info()["workers"]) > 2:
            assert time.monotonic() < deadline, "the worker that joined was never retired"
            time.sleep(0.2)


def _grade(subs: Path, out: Path, scheduler: str | None, log=None):
    g = Grader(out, "3", jobs=2, limits=LIMITS, log=log or (lambda *a: None), scheduler=scheduler)
    return {r.archive: {k: v for k, v in asdict(r).items() if k not in VOLATILE} for r in g.run(subs)}


@pytest.fixture(scope="module")
def local(batch, secret_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    return out, _grade(batch, out, None)


def _worker_servers() -> list[tuple[int, list[int]]]:
    """On a Dask worker: for each of its graders, its slots and each server's number of starts."""
    from attn_course import dask_pool

    return [(wg.grader.jobs, [s.starts for _, s in sorted(wg.grader._servers.items())])
            for wg in dask_pool._GRADERS.values()]


def _warm_flags() -> list[bool]:
    """On a Dask worker: whether each server of its graders warms after its next job."""
    from attn_course import dask_pool

    return [s.warm for wg in dask_pool._GRADERS.values() for s in wg.grader._servers.values()]


def test_a_worker_starts_its_servers_before_its_first_archive(cluster, secret_env, tmp_path):
    """Building a worker's grader (its first task, or warm_worker) also starts and warms one
    worker server per thread, as the local pool does before its first archive (this test runs
    before any archive is graded on the cluster)."""
    from attn_course.dask_pool import TaskConfig, warm_worker

    # the configuration of _grade's grader: the tests below then grade on the graders built here
    g = Grader(tmp_path / "unused", "3", jobs=2, limits=LIMITS, log=lambda *a: None, scheduler=cluster.scheduler_address)
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        workers = list(client.scheduler_info()["workers"])
        client.gather([client.submit(warm_worker, TaskConfig.of(g), workers=[w], pure=False) for w in workers])
        seen = client.run(_worker_servers)
        warm = client.run(_warm_flags)
    for w in workers:
        assert (1, [1]) in seen[w], (w, seen[w])  # one thread: one server, started once
        assert warm[w] and all(warm[w]), (w, warm[w])  # warmed, and warming after its jobs until told


def test_dask_cluster_grades_as_the_local_pool(batch, cluster, local, tmp_path):
    local_out, local = local
    remote = _grade(batch, tmp_path / "dask", cluster.scheduler_address)
    assert set(remote) == set(local) == {p.name for p in batch.iterdir()}
    for name in sorted(local):
        assert not _differences(remote[name], local[name], name), _differences(remote[name], local[name], name)
    # the batch is what the red team expects of it (so the equality above is not of two empty things)
    assert sum(local["honest_a.zip"]["scores"].values()) == 12
    assert sum(local["untouched.zip"]["scores"].values()) == 0
    assert local["wrong_shape.zip"]["scores"]["3.1"] == 0 and local["wrong_shape.zip"]["scores"]["3.2"] == 3
    assert local["read_secret.zip"]["scores"]["3.4"] == 0  # the sandbox never sees the secret
    assert "identity" in local["forged.zip"]["rejected"]
    assert local["corrupt.zip"]["rejected"] and local["folder.zip"]["rejected"]
    assert local["honest_b.zip"]["received"] == os.lstat(batch / "honest_b.zip").st_mtime
    for f in ("gradebook.csv", "report.md"):
        assert (tmp_path / "dask" / f).read_text() == (local_out / f).read_text(), f
    # each task told its server whether the archives left repay warming after it (the local
    # pool's rule): a batch this small never does (11 archives for 2 threads and 8 shapes)
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        warm = client.run(_warm_flags)
    assert all(flags and not any(flags) for flags in warm.values()), warm
    # resume: a second run on the cluster grades nothing
    log = []
    _grade(batch, tmp_path / "dask", cluster.scheduler_address, log.append)
    assert "0 to grade" in log[0], log[0]


def test_workers_with_another_secret_are_refused(batch, cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_SECRET", "not-the-workers-secret")
    with pytest.raises(ClusterError, match="another course secret"):
        _grade(batch, tmp_path / "other", cluster.scheduler_address)
    assert not list((tmp_path / "other").glob("results/*.json"))


# the archives of the worker-loss test: enough for both workers to be busy, none that crashes
# its own server (the retry is what is tested, not the red team again)
LOSS_BATCH = ("honest_a.zip", "honest_b.zip", "untouched.zip", "wrong_shape.zip", "patch_numpy.zip",
              "read_secret.zip")


SLEEPER = "import time\ndef zero_temperature_limit(S, mask=None):\n    time.sleep(900)\n"


def _busy_graders() -> int:
    """On a Dask worker: how many tasks hold a slot of its graders."""
    from attn_course import dask_pool

    return sum(wg.busy for wg in dask_pool._GRADERS.values())


def test_a_stopped_batch_stops_the_archives_running_on_the_workers(cluster, secret_env, tmp_path):
    """Ctrl-C cancels the batch's tasks (DaskPool.cancel); Dask cannot stop a running one, which
    went on grading its archive up to its budget, holding the worker.  Here the archive sleeps
    far past the time this test waits: the worker is free again only if its run was stopped."""
    import time

    from attn_course.dask_pool import DaskPool, grade_task

    ref = library_files(ROOT)
    files = dict(ref)
    files["attn_tensors/statmech.py"] = ref["attn_tensors/statmech.py"] + b"\n\n" + SLEEPER.encode()
    archive = build_archive(tmp_path / "sleeper.zip", "sleeper", files, token=token_for("sleeper", SECRET))
    limits = Limits(per_exercise_s=900, per_archive_s=900, cpu_s=60, memory_mb=3072, processes=64, file_mb=16)
    g = Grader(tmp_path / "out", "3.5", jobs=1, limits=limits, log=lambda *a: None, scheduler=cluster.scheduler_address)
    pool = DaskPool(cluster.scheduler_address, g)
    try:
        slots = pool.check_workers()
        worker = sorted(pool.client.scheduler_info()["workers"])[0]
        fut = pool.client.submit(grade_task, pool.config, archive.name, archive.read_bytes(), 0.0, 0, slots,
                                 pure=False, workers=[worker], allow_other_workers=False)
        pool.futures[fut] = (archive, b"", 0.0)
        deadline = time.monotonic() + 120
        while not pool.client.run(_busy_graders, workers=[worker])[worker]:
            assert time.monotonic() < deadline, "the sleeper never started"
            time.sleep(0.2)
        pool.cancel()
        after = pool.client.submit(os.getpid, pure=False, workers=[worker], allow_other_workers=False)
        assert after.result(timeout=120) > 0  # the worker's one thread is free: the sleeper was stopped
    finally:
        pool.shutdown()
        g.close()


def test_a_worker_that_joins_with_another_secret_costs_no_archive(batch, cluster, local, tmp_path, monkeypatch):
    """A worker with another course secret joins just after the grader asked every worker: it
    refuses the tasks it is given (WorkerRefused), gets no more, and the archives it refused are
    graded elsewhere in the same batch: every result is the local pool's, none an error."""
    import shutil
    import time

    from attn_course.dask_pool import DaskPool

    _, local = local
    subs = tmp_path / "submitted"
    subs.mkdir()
    for name in LOSS_BATCH:
        shutil.copy2(batch / name, subs / name)
    asked = DaskPool.check_workers

    def then_a_worker_joins(pool):
        slots = asked(pool)
        before = len(pool.client.scheduler_info()["workers"])
        with monkeypatch.context() as env:  # the new worker's process starts with this environment
            env.setenv("ATTN_COURSE_SECRET", "not-the-graders-secret")
            cluster.scale(before + 1)
            deadline = time.monotonic() + 120
            while len(pool.client.scheduler_info()["workers"]) <= before:
                assert time.monotonic() < deadline, "the new worker never joined"
                time.sleep(0.2)
        return slots

    monkeypatch.setattr(DaskPool, "check_workers", then_a_worker_joins)
    log: list[str] = []
    try:
        remote = _grade(subs, tmp_path / "dask", cluster.scheduler_address, log.append)
    finally:
        _scale_down_to_two(cluster)
    assert not _differences(remote, {name: local[name] for name in LOSS_BATCH})
    warnings = [line for line in log if "another course secret" in line]
    if not warnings:  # the scheduler gave the new worker no task: nothing was tested
        pytest.skip("the worker that joined was given no archive")
    assert len(warnings) == 1 and "no more archives" in warnings[0], warnings


def test_a_worker_lost_mid_batch_costs_only_a_retry(batch, cluster, local, tmp_path):
    """When an archive finishes, a worker that is grading another one dies: the batch
    still finishes, with every result the local pool's (the lost archive ran again elsewhere).
    The module's last test: no later one waits for the nanny to start the lost worker again."""
    import shutil

    _, local = local
    subs = tmp_path / "submitted"
    subs.mkdir()
    for name in LOSS_BATCH:
        shutil.copy2(batch / name, subs / name)  # with its receipt time (the file's mtime)
    killed = []
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        def log(line):
            if not killed and line.startswith("["):
                busy = [w for w, tasks in client.processing().items() if tasks]
                if busy:
                    killed.append(busy[0])
                    try:
                        client.run(os._exit, 1, workers=busy[:1], on_error="ignore")
                    except Exception:  # noqa: BLE001 - it dies before answering
                        pass

        remote = _grade(subs, tmp_path / "dask", cluster.scheduler_address, log)
    assert not _differences(remote, {name: local[name] for name in LOSS_BATCH})
    if not killed:  # never seen busy at a progress line (a machine so fast or slow): nothing was tested
        pytest.skip("no worker was grading when an archive finished")
