"""A JAX job runs as one program (worker.evaluate_job) with the results of one program per exercise.

The worker traces every case of every exercise of a job into one XLA
program; each exercise computed on its own (worker.evaluate_all, as the
expected values are) must give the same outcome on every case: the same
status, the same error type, and values equal to the last bits.  Checked on
the reference, the stub release and catalogued mistakes, over chapter 3 and
over chapter 4 (whose cases include one that runs op by op).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from attn_course.mistakes import for_exercise
from attn_course.registry import all_exercises
from attn_course.worker import JobItem, evaluate_all, evaluate_job, resolve


def _same(a: dict, b: dict, where: str) -> None:
    assert a["status"] == b["status"], (where, a, b)
    assert a.get("type") == b.get("type"), (where, a, b)
    if a["status"] == "ok":
        assert set(a["value"]) == set(b["value"]), where
        for k in a["value"]:
            x, y = np.asarray(a["value"][k]), np.asarray(b["value"][k])
            assert x.shape == y.shape and x.dtype == y.dtype, (where, k)
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12, equal_nan=True, err_msg=f"{where} {k}")


def _check(exercises, functions):
    items = [JobItem(e.id, e.probe, [c.inputs for c in e.make_cases(True, "job-secret")],
                     [c.eager for c in e.make_cases(True, "job-secret")]) for e in exercises]
    order: list[tuple[str, str]] = []
    got = evaluate_job(items, lambda ex_id: (functions[ex_id], None),
                       start=lambda ex_id: order.append(("start", ex_id)),
                       phase=lambda name: order.append(("phase", name)),
                       report=lambda ex_id, res: order.append(("report", ex_id)))
    for it in items:
        alone = evaluate_all(functions[it.id], it.probe, it.inputs, "jax", it.id, it.eager)
        assert len(got[it.id]) == len(alone)
        for i, (a, b) in enumerate(zip(got[it.id], alone)):
            _same(a, b, f"{it.id} case {i}")
    # each exercise starts before it is reported; the program runs after every exercise is traced
    starts = [x for k, x in order if k == "start"]
    assert starts[:len(items)] == [it.id for it in items]
    assert sorted(x for k, x in order if k == "report") == sorted(it.id for it in items)
    return got, order


@pytest.mark.parametrize("chapter", [3, 4])
def test_reference_as_one_program(chapter):
    exercises = [e for e in all_exercises().values() if e.chapter == chapter]
    got, order = _check(exercises, {e.id: resolve(e.function) for e in exercises})
    assert ("phase", "compile") in order
    assert any(r["status"] == "ok" for res in got.values() for r in res)


def test_stub_and_mistakes_as_one_program():
    exercises = [e for e in all_exercises().values() if e.chapter == 3]

    def stub_of(ex_id):
        def stub(*args, **kwargs):
            raise NotImplementedError(f"Exercise {ex_id}: not done yet")
        return stub

    got, _ = _check(exercises, {e.id: stub_of(e.id) for e in exercises})
    assert all(r["status"] == "not_implemented" for res in got.values() for r in res)
    wrong = {e.id: for_exercise(e.id)[0].wrong for e in exercises if for_exercise(e.id)}
    assert len(wrong) >= 3
    _check([e for e in exercises if e.id in wrong], wrong)


def test_an_exercise_that_cannot_be_imported_is_reported_and_the_others_run():
    exercises = [e for e in all_exercises().values() if e.chapter == 3][:3]
    items = [JobItem(e.id, e.probe, [c.inputs for c in e.make_cases(False)], [c.eager for c in e.make_cases(False)])
             for e in exercises]
    broken = exercises[1].id

    def function(ex_id):
        if ex_id == broken:
            return None, "cannot import attn_tensors.statmech.entropy: NameError: boom"
        return resolve(next(e.function for e in exercises if e.id == ex_id)), None

    got = evaluate_job(items, function)
    assert all(r["status"] == "raised" and r["type"] == "ImportError" and "boom" in r["message"] for r in got[broken])
    for e in exercises:
        if e.id != broken:
            assert any(r["status"] == "ok" for r in got[e.id]), e.id


def test_a_program_that_cannot_be_built_falls_back_exercise_by_exercise():
    """A probe output that is not an array (a string) cannot leave a program: that case runs alone,
    and says so, while the other cases keep their values."""
    ex = all_exercises()["3.1"]
    fn = resolve(ex.function)
    cases = ex.make_cases(False)

    def odd(S, mask=None, T=1.0):
        if S.shape[-1] == cases[0].inputs["S"].shape[-1] and S.ndim == 2:
            return "not an array"
        return fn(S, mask=mask, T=T)

    items = [JobItem(ex.id, ex.probe, [c.inputs for c in cases], [c.eager for c in cases])]
    got = evaluate_job(items, lambda ex_id: (odd, None))
    alone = evaluate_all(odd, ex.probe, items[0].inputs, "jax", ex.id)
    for i, (a, b) in enumerate(zip(got[ex.id], alone)):
        _same(a, b, f"case {i}")
    assert any(r["status"] != "ok" for r in got[ex.id]) and any(r["status"] == "ok" for r in got[ex.id])


def test_functions_are_made_outside_the_program():
    """A notebook's answer cells run when the job asks for the function: as in the notebook, their
    own jax.numpy code computes values (a cell that reads a number back with float() works)."""
    import jax
    import jax.numpy as jnp

    exercises = [e for e in all_exercises().values() if e.chapter == 3][:2]
    seen = []

    def function(ex_id):
        total = jax.jit(jnp.sum)(jnp.ones(3))  # a cell's own jitted computation: a value, not a tracer
        seen.append(total if isinstance(total, jax.core.Tracer) else float(total))
        return resolve(next(e.function for e in exercises if e.id == ex_id)), None

    items = [JobItem(e.id, e.probe, [c.inputs for c in e.make_cases(False)], [c.eager for c in e.make_cases(False)])
             for e in exercises]
    got = evaluate_job(items, function)
    assert seen == [3.0, 3.0]
    for e in exercises:
        assert any(r["status"] == "ok" for r in got[e.id]), (e.id, got[e.id])


FORKS_ONCE = '''
import os as _os
_entropy_of_the_reference = entropy
_copies = []


def entropy(A, mask=None):
    if not _copies:
        _copies.append(_os.fork())  # one copy of the whole job, which goes on from here
    return _entropy_of_the_reference(A, mask)
'''

RUN_JOB = '''
import json, os, sys
from attn_course.worker import run_job, _setup_jax
_setup_jax()
job = json.load(open(sys.argv[1]))
with open(sys.argv[3], "a") as out:
    run_job(job, sys.argv[2], out)
try:
    while True:
        os.wait()
except ChildProcessError:
    pass
'''


def test_a_copy_forked_by_the_submission_reports_nothing(tmp_path):
    """An answer that forks: the copy goes on through the job's code, and would report every
    exercise after it a second time (a fork bomb's copies, reporting after the original, were
    seen to make an honest exercise look timed out).  It ends instead, and each exercise is
    reported once."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from attn_course import values
    from attn_course.runner import package_files
    from attn_course.worker import _write_package

    root = Path(__file__).resolve().parents[2]
    files = package_files(root)
    files["attn_tensors/statmech.py"] += FORKS_ONCE
    _write_package(files, tmp_path / "pkg")
    exercises = [e for e in all_exercises().values() if e.chapter == 3][:3]
    assert exercises[1].id == "3.2" and exercises[1].function.endswith(".entropy")
    job = {"files": {}, "exercises": [{"id": e.id, "cases": [{"name": c.name, "inputs": values.encode(c.inputs)}
                                                              for c in e.make_cases(False)]} for e in exercises]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", RUN_JOB, str(tmp_path / "job.json"), str(tmp_path / "pkg"),
                             str(out)], stderr=subprocess.PIPE, text=True, cwd=root, start_new_session=True)
    try:  # (a copy that goes on compiles after a fork: XLA's threads are gone, and it may hang)
        err = proc.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:
        err = "the job or its copy did not end within 120 s"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, err[-2000:]
    reported = [json.loads(x)["id"] for x in out.read_text().splitlines() if '"results"' in x or '"staged"' in x]
    assert sorted(reported) == sorted(e.id for e in exercises), reported


# -- the workers' compiler options (attn_course.xla_cache) -----------------------------------


def _lowered_job(exercises, monkeypatch, secret="options-secret"):
    """The lowered program of a job of the reference's ``exercises``, as evaluate_job builds it."""
    import attn_course.worker as worker

    seen = []
    real = worker.compile_for_workers

    def keep(lowered):
        seen.append(lowered)
        return real(lowered)

    monkeypatch.setattr(worker, "compile_for_workers", keep)
    cases = {e.id: e.make_cases(True, secret) for e in exercises}
    items = [JobItem(e.id, e.probe, [c.inputs for c in cases[e.id]], [c.eager for c in cases[e.id]])
             for e in exercises]
    functions = {e.id: resolve(e.function) for e in exercises}
    evaluate_job(items, lambda ex_id: (functions[ex_id], None))
    assert len(seen) == 1, "one program for the job"
    return seen[0]


@pytest.mark.parametrize("chapter", [3, 7])
def test_the_options_that_only_compile_faster_give_the_reference_the_same_bits(chapter, monkeypatch):
    """The workers compile with XLA's older emitters for fusions (about half the compile time) and
    their LLVM module unsplit; every output of the reference's job program is the same to the last
    bit as with XLA's defaults for both."""
    from attn_course.xla_cache import CHEAPER_ONLY, WORKER_COMPILER_OPTIONS

    assert WORKER_COMPILER_OPTIONS.get("xla_cpu_use_fusion_emitters") is False
    assert WORKER_COMPILER_OPTIONS.get("xla_cpu_parallel_codegen_split_count") == 1
    lowered = _lowered_job([e for e in all_exercises().values() if e.chapter == chapter], monkeypatch)
    default = {k: v for k, v in WORKER_COMPILER_OPTIONS.items() if k not in CHEAPER_ONLY}
    ours = [np.asarray(x) for x in jax.tree.leaves(lowered.compile(compiler_options=WORKER_COMPILER_OPTIONS)())]
    theirs = [np.asarray(x) for x in jax.tree.leaves(lowered.compile(compiler_options=default)())]
    assert len(ours) == len(theirs) > 10
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert np.array_equal(a, b, equal_nan=True), (i, a, b)


def test_this_xla_accepts_every_worker_option(monkeypatch):
    """If a newer XLA drops one (this fails), grading still works without it (next test), but the
    programs compile more slowly: measure again and update WORKER_COMPILER_OPTIONS."""
    from attn_course import xla_cache

    lowered = _lowered_job([all_exercises()["3.2"]], monkeypatch)
    xla_cache.compile_for_workers(lowered)
    dropped = set(xla_cache.WORKER_COMPILER_OPTIONS) - set(xla_cache.compiler_options())
    assert not dropped, (f"this XLA does not know {sorted(dropped)}: programs compile without it (slower); "
                         "measure the compile time again and update WORKER_COMPILER_OPTIONS")


def test_an_option_this_xla_does_not_know_is_left_out_and_nothing_else(monkeypatch):
    from attn_course import xla_cache

    lowered = _lowered_job([all_exercises()["3.2"]], monkeypatch)
    made_up = "xla_cpu_option_no_xla_has"
    also = "xla_cpu_another_option_no_xla_has"  # (XLA names one unknown option at a time)
    monkeypatch.setattr(xla_cache, "CHEAPER_ONLY", xla_cache.CHEAPER_ONLY + (made_up, also))
    monkeypatch.setattr(xla_cache, "_options", {**xla_cache._options, made_up: True, also: True})
    out = xla_cache.compile_for_workers(lowered)()
    assert jax.tree.leaves(out)
    assert xla_cache.compiler_options() == xla_cache.WORKER_COMPILER_OPTIONS  # only the unknown one went
    # an option that is not merely a cheaper way is never dropped: its error is raised
    monkeypatch.setattr(xla_cache, "_options", {**xla_cache._options, "xla_required_option_no_xla_has": 1})
    with pytest.raises(Exception, match="xla_required_option_no_xla_has"):
        xla_cache.compile_for_workers(lowered)
