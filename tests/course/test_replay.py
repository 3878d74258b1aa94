"""A job traces; a process that never ran the submission differentiates (attn_course.replay).

Red team, round 18: a derivative rule of JAX's swapped only while the
submission's function ran (or an entry of JAX's caches made with it, and the
rule put back before any check looked) gave exercise 3.2's classic mistake 3/3.
No check in the job's process can see a change undone before it looks.  Now the
job only traces the function (its primal program), and a process forked from
the template, which never ran any of the submission's code, differentiates,
compiles and runs the program from plain data (:mod:`attn_course.jaxpr_wire`).

Expected values here are the direct evaluation's (:func:`attn_course.worker.evaluate_job`,
the path the trusted side computes reference values with), never typed in.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_course import jaxpr_wire, replay, values, worker
from attn_course.registry import all_exercises
from attn_course.runner import Staged, _parse, _staged
from attn_course.scoring import Outcome


def _items(exercises, hidden=False):
    out = []
    for e in exercises:
        cases = e.make_cases(hidden, secret="replay-secret") if hidden else e.make_cases(False)
        out.append(worker.JobItem(e.id, e.probe, [values.decode(values.encode(c.inputs)) for c in cases],
                                  [c.eager for c in cases], e.traced))
    return out


def _through_json(staged: dict) -> dict:
    """What a job's lines carry: written as the worker writes them, read as the runner reads them."""
    out = {}
    for k, v in staged.items():
        if "results" in v:
            out[k] = {"results": values.decode(json.loads(worker._dumps(values.encode(v["results"]))))}
        else:
            out[k] = json.loads(worker._dumps(v))
    return out


def _replayed(items, staged: dict) -> dict[str, list[dict]]:
    """Each exercise's results: the recorded failures as they are, the recorded cases evaluated."""
    sub, picked = [], {}
    for it in items:
        data = staged[it.id]
        if "results" in data:
            continue
        idx = [i for i, c in enumerate(data["cases"]) if c.get("status") == "staged"]
        picked[it.id] = idx
        sub.append(worker.JobItem(it.id, it.probe, [it.inputs[i] for i in idx], [False] * len(idx)))
    evaluated = worker.evaluate_staged(sub, {k: {"programs": staged[k]["programs"],
                                                 "cases": [staged[k]["cases"][i] for i in idx]}
                                             for k, idx in picked.items()})
    out = {}
    for it in items:
        data = staged[it.id]
        if "results" in data:
            out[it.id] = data["results"]
            continue
        full = list(data["cases"])
        for j, i in enumerate(picked[it.id]):
            full[i] = evaluated[it.id][j]
        out[it.id] = full
    return out


def _same(a: dict, b: dict, where: str) -> None:
    assert a["status"] == b["status"], (where, a, b)
    if a["status"] != "ok":
        assert a.get("message") == b.get("message"), (where, a, b)
        return
    assert a["value"].keys() == b["value"].keys(), where
    for k in a["value"]:
        x, y = np.asarray(a["value"][k]), np.asarray(b["value"][k])
        assert x.dtype == y.dtype and x.shape == y.shape, (where, k)
        if x.dtype.kind == "f":  # the same program up to XLA's fusion: a rounding at most
            np.testing.assert_allclose(y, x, rtol=1e-13, atol=1e-300, equal_nan=True, err_msg=f"{where} {k}")
        else:
            np.testing.assert_array_equal(y, x, err_msg=f"{where} {k}")


@pytest.mark.slow
def test_every_exercise_traced_then_replayed_gives_what_it_gives_run_directly():
    """The reference library, every exercise's public cases: recorded, carried as JSON, evaluated."""
    exercises = list(all_exercises().values())
    items = _items(exercises)
    fns = {e.id: worker.as_graded(worker.resolve(e.function)) for e in exercises}
    direct = worker.evaluate_job(items, lambda ex_id: (fns[ex_id], None))
    staged = _through_json(worker.record_job(items, lambda ex_id: (fns[ex_id], None)))
    assert sum("cases" in v for v in staged.values()) >= len(exercises) - 1  # all traced but 5.5 (NumPy)
    assert all(c.get("status") != "ok" for v in staged.values() for c in v.get("cases", []))
    got = _replayed(items, staged)
    for it in items:
        assert len(got[it.id]) == len(direct[it.id])
        for i, (a, b) in enumerate(zip(direct[it.id], got[it.id])):
            _same(a, b, f"{it.id} case {i}")
    assert sum(r["status"] == "ok" for res in got.values() for r in res) > 100


# -- a rule changed where the function is traced does not reach the derivative -------------------------

_POISONED_JOB = textwrap.dedent('''
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax._src.interpreters import ad
    from jax._src.lax import lax as lax_internal
    from attn_course import values, worker
    from attn_course.registry import all_exercises

    ex = all_exercises()["3.2"]
    cases = ex.make_cases(False)
    item = worker.JobItem(ex.id, ex.probe, [values.decode(values.encode(c.inputs)) for c in cases],
                          [c.eager for c in cases])

    def mistake(A, mask=None):  # 3.2's classic mistake: log of an unguarded 0
        keep = A > 0
        return -jnp.sum(jnp.where(keep, A * jnp.log(A), 0.0), axis=-1)

    def rule(primals, tangents, **kw):  # log's rule made safe at 0, as red team 18's linrule_jax
        (x,), (t,) = primals, tangents
        xs = jnp.where(x > 0, x, 1.0)
        return jax.lax.log(xs), (t if type(t).__name__ == "Zero" else t / xs)

    own = ad.primitive_jvps[lax_internal.log_p]

    def wrapped(A, mask=None):  # the rule swapped only while the function runs, and put back
        ad.primitive_jvps[lax_internal.log_p] = rule
        ad._linearize_jaxpr.cache_clear()
        try:
            return mistake(A, mask)
        finally:
            ad.primitive_jvps[lax_internal.log_p] = own
            ad._linearize_jaxpr.cache_clear()

    here = worker.evaluate_job([item], lambda i: (wrapped, None))["3.2"]
    staged = worker.record_job([item], lambda i: (wrapped, None))["3.2"]
    print(json.dumps({"here": values.encode(here), "staged": json.loads(worker._dumps(staged))}))
''')


def test_a_rule_swapped_while_the_function_runs_does_not_reach_the_derivative_taken_elsewhere():
    """In the process that ran the swap the mistake's gradient is finite; replayed here it is nan."""
    r = subprocess.run([sys.executable, "-c", _POISONED_JOB], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    here = values.decode(out["here"])
    ex = all_exercises()["3.2"]
    (item,) = _items([ex])
    got = _replayed([item], {"3.2": out["staged"]})["3.2"]
    zero = [i for i, x in enumerate(item.inputs) if (np.asarray(x["A"]) == 0).any()]
    assert zero
    for i in zero:
        assert here[i]["status"] == got[i]["status"] == "ok"
        (gname,) = [k for k in got[i]["value"] if k.startswith("d/d")]
        assert np.isfinite(here[i]["value"][gname]).all()  # what the swap made of it, in its own process
        assert np.isnan(got[i]["value"][gname]).any()  # the mistake's own derivative
        np.testing.assert_array_equal(got[i]["value"]["H"], here[i]["value"]["H"])  # its values are right


# -- the programs' own parts: control flow, custom rules, scatters, solves --------------------------------


def _round_trip(f, x, reverse=True):
    """f's value and gradient (``reverse``) or derivative along a direction, directly, and traced,
    carried as JSON, replayed."""
    def taken(h):
        loss = lambda y: jnp.sum(jnp.cos(1.0 + h(y)))  # noqa: E731
        if reverse:
            return jax.value_and_grad(loss)(x)
        return jax.jvp(loss, (x,), (jnp.linspace(0.5, 1.5, x.size).reshape(x.shape),))

    encoder = jaxpr_wire.Encoder()
    index = encoder.closed(jax.make_jaxpr(f)(x))
    program = jaxpr_wire.Program(json.loads(worker._dumps(encoder.data())))
    return taken(f), jax.jit(lambda: taken(lambda y: program.function(index)(y)[0]))()


@jax.custom_jvp
def _safe_log(x):
    return jnp.log(x)


_safe_log.defjvp(lambda p, t: (_safe_log(p[0]), t[0] / jnp.where(p[0] > 0, p[0], 1.0)))


@jax.custom_vjp
def _clip_grad(x):
    return x * 2.0


_clip_grad.defvjp(lambda x: (x * 2.0, x), lambda x, ct: (jnp.clip(ct * 3.0, -1.0, 1.0),))

PROGRAMS = {
    "scan": lambda x: jax.lax.scan(lambda c, r: (c * r + 1.0, jnp.sin(c)), x[0], x)[1],
    "fori_loop": lambda x: jax.lax.fori_loop(0, 3, lambda i, c: c * x + i, x),
    "while_loop": lambda x: jax.lax.while_loop(lambda c: c[1] < 4, lambda c: (c[0] * 1.5 + x, c[1] + 1), (x, 0))[0],
    "cond": lambda x: jax.lax.cond(x.sum() > 0, lambda y: y * 2.0, lambda y: jnp.exp(y), x),
    "custom_jvp": lambda x: _safe_log(jnp.abs(x)),
    "custom_vjp": lambda x: _clip_grad(x),
    "library custom_jvp": lambda x: jax.nn.relu(x) + jax.nn.softplus(x) + jax.scipy.special.xlogy(x * x, x * x + 1.0),
    "scatter": lambda x: x.at[1].add(x[0] * 3.0).at[2].set(x[1]),
    "solve": lambda x: jnp.linalg.solve(jnp.eye(3) * 2.0 + jnp.outer(x, x), x),
    "nested jit": lambda x: jax.jit(lambda y: jnp.tanh(y) @ jnp.ones((3, 3)))(x) + jax.jit(jnp.sinc)(x),
    "stop_gradient": lambda x: x * jax.lax.stop_gradient(x) + jnp.max(x),
    "integers and sorts": lambda x: jnp.sort(x)[jnp.argsort(x)] * jnp.arange(3) + jnp.cumsum(x),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_program_replayed_has_the_value_and_gradient_of_the_function(name):
    x = jnp.asarray([0.3, -1.2, 0.0]) if name != "custom_jvp" else jnp.asarray([0.3, -1.2, 2.0])
    direct, replayed = _round_trip(PROGRAMS[name], x, reverse=name != "while_loop")  # (forward mode only)
    for a, b in zip(direct, replayed):
        np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-15)


def test_a_custom_rule_the_function_carries_is_its_derivative_there_too():
    """The replay takes the function's own rule (not the rule-less derivative of its primal)."""
    x = jnp.asarray([0.5, 2.0, -3.0])
    (_, g1), (_, g2) = _round_trip(PROGRAMS["custom_vjp"], x)
    plain = jax.grad(lambda y: jnp.sum(jnp.cos(1.0 + y * 2.0)))(x)
    assert not np.allclose(g1, plain)  # the rule differs from the primal's own derivative
    np.testing.assert_allclose(g2, g1, rtol=1e-13)


def test_a_host_callback_cannot_be_carried():
    def f(x):
        return jax.pure_callback(lambda y: np.asarray(y) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    with pytest.raises(jaxpr_wire.Unstageable, match="callback"):
        jaxpr_wire.Encoder().closed(jax.make_jaxpr(f)(jnp.ones(3)))


def test_a_debug_print_is_left_out():
    def f(x):
        jax.debug.print("x = {}", x)
        return x * 2.0

    encoder = jaxpr_wire.Encoder()
    index = encoder.closed(jax.make_jaxpr(f)(jnp.ones(3)))
    program = jaxpr_wire.Program(json.loads(worker._dumps(encoder.data())))
    np.testing.assert_array_equal(program.function(index)(jnp.ones(3))[0], 2.0 * np.ones(3))


# -- data that is not a program: refused with WireError, never run ------------------------------------------


def _valid() -> tuple[dict, int]:
    encoder = jaxpr_wire.Encoder()
    index = encoder.closed(jax.make_jaxpr(lambda x: jnp.log(x) * 2.0 + x[0])(jnp.ones(3)))
    return json.loads(worker._dumps(encoder.data())), index


def _run(data: dict, index: int) -> object:
    return jaxpr_wire.Program(data).function(index)(jnp.ones(3))


@pytest.mark.parametrize("change", [
    "unknown primitive", "a callable's name", "a parameter object", "an undefined variable", "a claimed shape",
    "a constant's bytes", "a circle", "a dtype", "not a program", "a version",
])
def test_data_that_is_not_a_program_is_refused(change):
    data, index = _valid()
    j = data["jaxprs"][index]
    if change == "unknown primitive":
        j["eqns"][0][0] = "os.system"
    elif change == "a callable's name":
        j["eqns"][0][0] = "pure_callback"
    elif change == "a parameter object":
        j["eqns"][0][3]["accuracy"] = {"__class__": "os._wrap_close", "args": []}
    elif change == "an undefined variable":
        j["eqns"][0][1] = [999]
    elif change == "a claimed shape":
        j["eqns"][0][4] = [[[4], "float64", False]]
    elif change == "a constant's bytes":
        data["consts"].append({"dtype": "float64", "shape": [1000], "data": "AAAA"})
        j["consts"].append(len(data["consts"]) - 1)
        j["const_vars"].append(10_000)
    elif change == "a circle":
        j["eqns"].insert(0, ["jit", [j["in"][0]], [5000], {"jaxpr": index}, [[[3], "float64", False]]])
    elif change == "a dtype":
        j["in_avals"][0][1] = "object"
        j["eqns"][0][4] = [[[3], "object", False]]
    elif change == "not a program":
        data["jaxprs"][index] = "print('hello')"
    elif change == "a version":
        data["version"] = 0
    with pytest.raises(jaxpr_wire.WireError):
        _run(data, index)


def test_the_valid_program_runs():
    """(The data the refusals above change runs as it is: each refusal is the change's.)"""
    data, index = _valid()
    np.testing.assert_allclose(_run(data, index)[0], 1.0 + np.zeros(3))


# -- the runner takes no value from a job: only failures, and recorded calls ----------------------------------


def test_a_value_a_job_writes_among_its_recorded_cases_is_not_taken():
    staged = {"programs": {"version": 1, "jaxprs": [], "consts": []},
              "cases": [{"status": "staged", "calls": []},
                        {"status": "ok", "value": values.encode({"H": np.zeros(3)})},
                        {"status": "raised", "type": "ValueError", "message": "no"}]}
    found = _staged({"id": "3.2", "staged": staged}, 3)
    assert isinstance(found, Staged)
    assert found.outcomes[0] is None and found.outcomes[1].status == "bad_value"
    assert found.outcomes[2].status == "raised"
    merged = found.merged([Outcome("ok", {"H": np.ones(3)})])
    assert [o.status for o in merged] == ["ok", "bad_value", "raised"]
    assert _parse(json.dumps({"id": "3.2", "staged": staged}), {"3.2": 3}, None) is None  # (unsealed: no key yet)


# -- end to end: red team 18's archives, graded --------------------------------------------------------------

_SWAP = b'''
from unittest import mock as _m
import jax as _j
import jax.numpy as _jn
def _R(path):
    return _m.patch(path).get_original()[0]
_AD = "jax." "_s" "rc.interp" "reters.ad"
_T = _R(_AD + ".primitive_" "jvps")
_C = _R(_AD + "._linearize_" "jax" "pr")
_P = _R("jax." "_s" "rc.lax.lax.log_p")
_W = _T[_P]
def _rule(primals, tangents, **kw):
    (x,), (t,) = primals, tangents
    xs = _jn.where(x > 0, x, _jn.ones_like(x))
    y = _j.lax.log(xs)
    if type(t).__name__ == "Zero":
        return y, t
    return y, t / xs
'''

# each appended to a statmech.py whose entropy has the mistake; each put everything back before any check
ROUND_18 = {
    # log's rule swapped while the function runs, the linearization cache emptied, both put back
    "linrule": _SWAP + b'''
_entropy0 = entropy
def entropy(A, mask=None):
    _T[_P] = _rule
    _C.cache_clear()
    try:
        return _entropy0(A, mask)
    finally:
        _T[_P] = _W
        _C.cache_clear()
''',
    # swapped and put back before the function's own code runs: only a cache entry made with it remains
    "cachepoison": _SWAP + b'''
_entropy0 = entropy
def entropy(A, mask=None):
    _T[_P] = _rule
    _C.cache_clear()
    try:
        _jn.log(_jn.asarray(A, dtype=_jn.float64))
    finally:
        _T[_P] = _W
    return _entropy0(A, mask)
''',
    # at import: linearized at the public and hidden shapes (public + 1) with the rule swapped, put back
    "importpoison": _SWAP + b'''
_T[_P] = _rule
_C.cache_clear()
try:
    for _s in ((4, 5), (5, 6)):
        _j.vjp(_jn.log, _jn.ones(_s, dtype=_jn.float64))
finally:
    _T[_P] = _W
''',
}


@pytest.mark.slow
def test_a_rule_swapped_and_put_back_in_the_job_earns_nothing(tmp_path):
    import csv
    import os

    from attn_course import ROOT
    from attn_course.archive import build_archive, library_files
    from attn_course.identity import token_for

    secret = "replay-secret"
    guard = b"A_safe = xp.where(keep, A, xp.ones_like(A))"
    ref = library_files(ROOT)
    mistake = ref["attn_tensors/statmech.py"].replace(guard, b"A_safe = A")
    assert mistake != ref["attn_tensors/statmech.py"]
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    subs.mkdir()
    archives = {"honest": ref["attn_tensors/statmech.py"], "mistake": mistake,
                **{f"r18-{name}": mistake + code for name, code in ROUND_18.items()}}
    for sid, statmech in archives.items():
        build_archive(subs / f"{sid}.zip", sid, {**ref, "attn_tensors/statmech.py": statmech},
                      token=token_for(sid, secret))
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", ATTN_COURSE_SECRET=secret)
    r = subprocess.run([sys.executable, "-m", "attn_course.cli", "grade", str(subs), "--out", str(out),
                        "--exercises", "3.2"], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["student_id"]: row for row in csv.DictReader(open(out / "gradebook.csv"))}
    assert rows["honest"]["3.2"] == "3" and rows["mistake"]["3.2"] == "0"
    for name in ROUND_18:  # (each scored 3/3 when the job took the derivatives itself)
        assert rows[f"r18-{name}"]["3.2"] == "0", (name, rows[f"r18-{name}"])
        (result,) = [json.loads(p.read_text()) for p in (out / "results").glob(f"r18-{name}-*.json")]
        assert result["feedback"]["3.2"]["status"] == "fail", (name, result["feedback"]["3.2"])


def test_an_exercise_whose_programs_cannot_be_read_fails_alone():
    exercises = [all_exercises()["3.1"], all_exercises()["3.2"]]
    items = _items(exercises)
    fns = {e.id: worker.resolve(e.function) for e in exercises}
    staged = _through_json(worker.record_job(items, lambda ex_id: (fns[ex_id], None)))
    staged["3.1"]["programs"]["version"] = 99
    got = _replayed(items, staged)
    recorded = [i for i, c in enumerate(staged["3.1"]["cases"]) if c["status"] == "staged"]
    assert recorded
    assert all(got["3.1"][i]["type"] == "WireError" and "cannot be read" in got["3.1"][i]["message"]
               for i in recorded)
    assert all(got["3.1"][i] == c for i, c in enumerate(staged["3.1"]["cases"]) if i not in recorded)
    assert got["3.2"] and all(r["status"] == "ok" for r in got["3.2"])


def test_a_python_decision_on_a_differentiated_value_is_said_as_such():
    """Op by op, jax.grad lets `if x > 0` see numbers; a traced program cannot: the failure says what
    to write instead (the derivative is the traced program's, taken elsewhere)."""
    ex = all_exercises()["3.2"]
    (item,) = _items([ex])

    def branching(A, mask=None):
        if float(jnp.min(A)) < 0:  # a decision in Python on a value of the differentiated input
            raise ValueError("negative weight")
        return -jnp.sum(jnp.where(A > 0, A * jnp.log(jnp.where(A > 0, A, 1.0)), 0.0), axis=-1)

    staged = worker.record_job([item], lambda ex_id: (branching, None))["3.2"]
    assert all(c["status"] == "raised" and c["message"].startswith(worker.TRACED_DERIVATIVE)
               for c in staged["cases"]), staged["cases"][0]


def test_a_job_that_seals_its_own_values_for_a_traced_exercise_gets_no_value():
    """Red team 19: a job that found its seal through frames wrote its own "ok" results (the
    mistake's nan made 0): for an exercise an evaluation job evaluates, a job's results are
    failures only.  (An exercise not traced, 5.5, reports its values from the job.)"""
    from attn_course.watch import sealer

    key = "0" * 32
    seal = sealer(key)
    line = seal(json.dumps({"id": "3.2", "results": [values.encode({"status": "ok", "value": {"H": np.zeros(3)}}),
                                                     {"status": "raised", "type": "ValueError", "message": "no"}]}))
    kind, ex_id, outcomes = _parse(line, {"3.2": 2}, key, frozenset({"3.2"}))
    assert (kind, ex_id) == ("result", "3.2")
    assert [o.status for o in outcomes] == ["bad_value", "raised"]
    kind, _, outcomes = _parse(line, {"3.2": 2}, key, frozenset())  # (not traced: its values are the job's)
    assert [o.status for o in outcomes] == ["ok", "raised"]


def test_data_nested_beyond_the_limit_is_unreadable():
    deep: object = "*"
    for _ in range(600):
        deep = {"t": [deep]}
    staged = {"programs": {"version": 1, "jaxprs": [], "consts": []},
              "cases": [{"status": "staged", "calls": [{"out": deep}]}]}
    found = _staged({"id": "3.2", "staged": staged}, 1)
    assert isinstance(found, list) and found[0].status == "bad_value"


def test_the_evaluation_cache_keeps_neither_a_large_entry_nor_more_than_its_bytes(monkeypatch):
    from attn_course.runner import Evaluated

    cache = Evaluated()
    monkeypatch.setattr(Evaluated, "MAX_BYTES", 3 << 20)
    big = [Outcome("ok", {"x": np.zeros((1 << 20) // 8 + 1)})]
    cache.put("big", big)
    assert cache.get("big") is None
    small = [Outcome("ok", {"x": np.zeros((1 << 20) // 8 - 100)})]
    for k in range(5):
        cache.put(f"k{k}", small)
    assert [cache.get(f"k{k}") is not None for k in range(5)] == [False, False, True, True, True]


def test_staging_is_one_threads_own():
    """The trusted side traces the reference for the workers' cache (staged) while other threads may
    compute expected values (differentiated): staging in one thread leaves the others' derivatives."""
    import threading

    from attn_course.specs import _gen

    seen = []
    inside, done = threading.Event(), threading.Event()

    def staged():
        with _gen.staging():
            inside.set()
            done.wait(10)

    t = threading.Thread(target=staged)
    t.start()
    inside.wait(10)
    try:
        seen.append(_gen.grad(lambda x: jnp.sum(x * x))(jnp.arange(3.0)))
    finally:
        done.set()
        t.join()
    np.testing.assert_array_equal(seen[0], 2 * np.arange(3.0))


def test_the_workers_cache_is_filled_for_a_chapter_with_an_exercise_not_traced(tmp_path, monkeypatch):
    """5.5 reports its values from the job (NumPy arrays): the cache's filling traced the others,
    and took the job's data as its lines carry it -- a JSON copy of 5.5's arrays failed, and
    grading chapter 5 with it."""
    from attn_course.runner import fill_worker_cache

    monkeypatch.setenv("ATTN_COURSE_CACHE", str(tmp_path / "xla"))
    monkeypatch.delenv("ATTN_COURSE_RESULT_CACHE", raising=False)
    ex = all_exercises()
    fill_worker_cache([(ex["5.1"], ex["5.1"].make_cases(False)), (ex["5.5"], ex["5.5"].make_cases(False))])
    filled = tmp_path / "worker-xla"
    filled.chmod(0o755)
    assert any(filled.iterdir())  # (the evaluation of 5.1's program compiled into it)
