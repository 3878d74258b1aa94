"""The worker server's warm-up: shapes only, no backend started, the same results."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from attn_course import values
from attn_course.warm import case_avals


def _job(*inputs):
    return {"exercises": [{"id": "3.1", "cases": [{"name": f"c{k}", "inputs": values.encode(x)}
                                                  for k, x in enumerate(inputs)]}]}


def test_case_avals_are_the_float_arrays_shapes_only():
    job = _job({"S": np.zeros((3, 5)), "mask": np.ones((3, 5), bool), "T": 0.5},
               {"S": np.zeros((2, 4, 4), np.float32), "n": np.arange(3), "x": None})
    assert case_avals(job) == {((3, 5), "float64"), ((2, 4, 4), "float32")}
    # nothing of the values, and nothing absurd (a huge or empty shape is not traced)
    assert case_avals(_job({"S": np.zeros((0, 3))})) == set()
    bogus = {"exercises": [{"cases": [{"inputs": {"S": {"__array__": "float64", "shape": [10 ** 9]}}}]}]}
    assert case_avals(bogus) == set()
    assert case_avals({"exercises": "not a list"}) == set()


def test_warming_traces_without_starting_a_backend():
    """A server forks after warming: an XLA backend started there would hang every child."""
    code = (
        "import jax; jax.config.update('jax_enable_x64', True)\n"
        "from attn_course.warm import backend_started, prime, warm\n"
        "done = set()\n"
        "assert not backend_started()\n"
        "prime()\n"
        "assert not backend_started(), 'priming started an XLA backend'\n"
        "n = warm({((3, 5), 'float64'), ((2, 4, 4), 'float32'), ((7,), 'float64')}, done)\n"
        "assert n == 3, n\n"
        "assert warm({((3, 5), 'float64')}, done) == 0  # each shape once\n"
        "assert not backend_started(), 'the warm-up started an XLA backend'\n"
        "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()\n"
        "assert backend_started()  # and the check can see one\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr[-3000:]


def test_workers_start_once_before_the_first_archive(tmp_path):
    """Grader.start_workers starts (and warms) every slot's server once; a second call starts none."""
    from attn_course.grade import Grader

    g = Grader(tmp_path / "grading", "3.5", jobs=2, log=lambda *a: None, ci_secret=True)
    try:
        g.prepare()
        g.start_workers()
        servers = [g._server(slot) for slot in range(2)]
        assert all(s.proc is not None and s.proc.poll() is None for s in servers)
        assert [s.starts for s in servers] == [1, 1]
        g.start_workers()
        assert [s.starts for s in servers] == [1, 1]
    finally:
        g.close()


def test_the_grader_switches_compilation_caches(tmp_path):
    """JAX opens its cache folder once per process; enable_compile_cache makes a switch take effect."""
    code = (
        "import sys, jax, jax.numpy as jnp\n"
        "from attn_course.xla_cache import enable_compile_cache\n"
        "a, b = sys.argv[1], sys.argv[2]\n"
        "enable_compile_cache(a)\n"
        "jax.jit(lambda x: x * 3.0 + 1.0)(jnp.ones(3)).block_until_ready()\n"
        "enable_compile_cache(b)\n"
        "jax.jit(lambda x: jnp.sin(x) * 5.0)(jnp.ones(4)).block_until_ready()\n"
        "print('ok')\n")
    a, b = tmp_path / "a", tmp_path / "b"
    r = subprocess.run([sys.executable, "-c", code, str(a), str(b)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert list(a.iterdir()) and list(b.iterdir()), "the second program was not cached in the second folder"


def _one_archive_class(tmp_path, spec: str):
    """A class of one archive (the reference library) and a two-slot grader for exercises ``spec``."""
    from attn_course import ROOT
    from attn_course.archive import build_archive, library_files
    from attn_course.grade import Grader

    subs = tmp_path / "submitted"
    subs.mkdir()
    build_archive(subs / "one.zip", "one", library_files(ROOT))
    return subs, Grader(tmp_path / "grading", spec, jobs=2, log=lambda *a: None, ci_secret=True, require_token=False)


def test_a_run_starts_no_more_servers_than_archives(tmp_path):
    """Two slots, one archive to grade: one server is started (regrading one late archive
    does not start and warm a whole pool)."""
    from unittest import mock

    from attn_course.registry import all_exercises
    from attn_course.server import WorkerServer

    subs, g = _one_archive_class(tmp_path, "3.5")
    started = []
    launch = WorkerServer.launch

    def counting(server):
        started.append(server)
        launch(server)

    try:
        with mock.patch.object(WorkerServer, "launch", counting):
            results = g.run(subs)
    finally:
        g.close()
    assert [r.total for r in results] == [all_exercises()["3.5"].points]  # the reference: full marks
    assert len(started) == 1, started


def test_a_run_too_small_to_repay_warming_does_not_warm(tmp_path):
    """One archive on a class with several case shapes: its server is started but not warmed
    (no warm-up jobs before the archive's own, and every job tells the server not to warm after
    it); a class with many archives per server is warmed."""
    from unittest import mock

    from attn_course.registry import all_exercises
    from attn_course.server import WorkerServer

    subs, g = _one_archive_class(tmp_path, "3")
    sent = []
    submit = WorkerServer.submit

    def recording(server, job):
        sent.append((server.warm, job))
        submit(server, job)

    try:
        g.prepare()
        shapes = g.case_shapes()
        assert shapes > 1
        assert not g.worth_warming(shapes - 1, 1) and g.worth_warming(shapes, 1)
        assert not g.worth_warming(shapes, 2) and g.worth_warming(1000, 2)
        with mock.patch.object(WorkerServer, "submit", recording):
            results = g.run(subs)
    finally:
        g.close()
    assert [r.total for r in results] == [sum(e.points for e in all_exercises().values() if e.chapter == 3)]
    # the archive's hidden cases only (the reference passes them all: no public re-run), no warm-up job
    # (and the evaluation job of what it traced: worker.evaluate_job_records, which never warms either)
    jobs = [(w, j) for w, j in sent if not j.get("evaluate")]
    assert len(jobs) == 1 and all(w is False for w, _ in sent), [(w, [e["id"] for e in j["exercises"]]) for w, j in sent]
    assert all(j.get("warm") is False for w, j in sent if j.get("evaluate"))


def test_the_server_is_told_not_to_warm():
    """WorkerServer.submit adds "warm": false to the job's line when the server is not to warm."""
    import io
    import json
    from unittest import mock

    from attn_course.sandbox import Limits, Plain
    from attn_course.server import WorkerServer

    for warm in (True, False):
        server = WorkerServer(Plain(Limits()))
        server.warm = warm
        server.proc = mock.Mock(stdin=io.BytesIO())
        with mock.patch.object(WorkerServer, "ensure", lambda self: None):
            server.submit({"files": {}, "exercises": []})
        line = json.loads(server.proc.stdin.getvalue())
        assert line.get("warm", True) is warm


def test_servers_warm_only_while_the_archives_left_repay_it(tmp_path):
    """Each archive's jobs tell the server to warm only while the archives not yet begun repay
    it (Grader.worth_warming): a server started again near the end of a batch (after a job that
    killed it) does not spend a warm-up on the last few archives."""
    from unittest import mock

    from attn_course import ROOT
    from attn_course.archive import build_archive, library_files
    from attn_course.grade import Grader
    from attn_course.server import WorkerServer

    subs = tmp_path / "submitted"
    subs.mkdir()
    ref = library_files(ROOT)
    for k in range(3):
        build_archive(subs / f"s{k}.zip", f"s{k}", ref)
    g = Grader(tmp_path / "grading", "3.5", jobs=1, log=lambda *a: None, ci_secret=True, require_token=False)
    reference = ref["attn_tensors/statmech.py"].decode()
    sent = []
    submit = WorkerServer.submit

    def recording(server, job):
        if job["files"].get("attn_tensors/statmech.py") == reference:  # an archive's job, not a warm-up
            sent.append(server.warm)
        submit(server, job)

    try:
        g.prepare()
        shapes = g.case_shapes()
        with mock.patch.object(WorkerServer, "submit", recording):
            results = g.run(subs)
    finally:
        g.close()
    assert [r.total for r in results] == [2.0] * 3
    assert sent == [left >= shapes for left in (3, 2, 1)], (sent, shapes)
    assert True in sent and False in sent


def test_a_slot_whose_servers_die_young_stops_warming(tmp_path):
    """A server started again after its predecessor was killed does not warm until the grader says
    so; the grader says so only while the slot's servers last, on average, as many archives as the
    class has shapes (a batch that kills its servers every few archives would pay a warm-up each)."""
    from unittest import mock

    from attn_course.grade import Grader
    from attn_course.sandbox import Limits, Plain
    from attn_course.server import WorkerServer

    g = Grader(tmp_path / "grading", "3.5", jobs=1, log=lambda *a: None, ci_secret=True, require_token=False)
    g._shapes = 4  # as if counted by prepare()
    server = g._server(0)
    server.starts, server.proc = 1, mock.Mock()  # the first server, up
    seen = []
    for left in (100, 99, 98, 97, 96):  # five archives on it
        g.warm_after_job(0, left, 1)
        seen.append(server.warm)
    server.proc = None  # the fifth killed it: the sixth starts the second server
    for left in (95, 94, 93, 92):
        g.warm_after_job(0, left, 1)
        seen.append(server.warm)
        server.starts, server.proc = 2, mock.Mock()
    # archives begun per server killed: 6/1, 7/1, ... against 4 shapes; then a third server
    assert seen == [True] * 9, seen
    server.proc = None
    g.warm_after_job(0, 91, 1)  # 10 begun over 2 kills: 5 a server
    assert server.warm
    server.starts, server.proc = 3, None  # killed again at once: 11 over 3
    g.warm_after_job(0, 90, 1)
    assert not server.warm
    g.worth_warming = lambda archives, slots: False  # too few archives left: never, however long they last
    server.starts, server.proc = 1, mock.Mock()
    g.warm_after_job(0, 3, 1)
    assert not server.warm

    # a server launched again starts off, whatever its predecessor did
    class Sleeper(Plain):
        def server_command(self):
            return ["sleep", "30"], {}

    server = WorkerServer(Sleeper(Limits()))
    server.warm = True
    server.launch()
    assert server.warm  # the first launch keeps what its user set
    server.kill()
    server.launch()
    assert not server.warm
    server.kill()
