"""The MLX backend of the course tools: `check --backend mlx`, its tolerances, and backend mix-ups.

The two-sided validation on MLX (the reference passes every case, the stub
fails) is in test_two_sided.py.  Here: the worker hands a probe arrays of the
job's framework and gives back NumPy; the tolerance table widens only MLX's;
and code written for one framework but run on the other is reported as a
backend mismatch that names the fix (never ``std::bad_cast``), through a real
worker, on a copy of the library whose exercise 3.1 is written with
``mlx.core`` (and one written with ``jax.numpy``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from attn_course import ROOT
from attn_course.registry import all_exercises
from attn_course.scoring import MLX_TOLERANCE, Outcome, compare_values, grade, tolerance
from attn_course.worker import evaluate, to_backend

mx = pytest.importorskip("mlx.core")
pytestmark = pytest.mark.mlx

EX = all_exercises()

# 3.1, written with mlx.core (right on MLX arrays, a framework mix-up on JAX ones)
BODY_MLX = '''\
    import mlx.core as mx

    check_temperature(T, xp)
    s = S / T
    if mask is not None:
        s = mx.where(mask, s, -mx.inf)
    m = mx.stop_gradient(mx.max(s, axis=-1, keepdims=True))
    m = mx.where(mx.isfinite(m), m, 0.0)
    z = mx.sum(mx.exp(s - m), axis=-1, keepdims=True)
    alive = z > 0
    log_Z = mx.where(alive, mx.log(mx.where(alive, z, 1.0)) + m, -mx.inf)
    return log_Z[..., 0]
'''

# the same with jax.numpy (right on JAX arrays, a mix-up on MLX ones)
BODY_JAX = BODY_MLX.replace("import mlx.core as mx", "import jax\n    import jax.numpy as mx").replace(
    "mx.stop_gradient", "jax.lax.stop_gradient")


def _package_with(dest: Path, ex_id: str, body: str) -> Path:
    """A copy of the reference library whose solution region ``ex_id`` is ``body``."""
    shutil.copytree(ROOT / "attn_tensors", dest / "attn_tensors",
                    ignore=shutil.ignore_patterns("__pycache__", "experiments"))
    module = EX[ex_id].module.replace(".", "/")
    path = dest / "attn_tensors" / f"{module}.py"
    src = path.read_text()
    region = re.compile(rf"^ *### BEGIN SOLUTION {re.escape(ex_id)}\n.*?^ *### END SOLUTION\n", re.M | re.S)
    assert region.search(src), f"the solution region of {ex_id}"
    path.write_text(region.sub(lambda _: body, src, count=1))
    return dest


def _check(package: Path, ex_id: str, backend: str):
    """The public cases of ``ex_id`` on ``package`` through a worker, as `attn-course check` runs them."""
    from attn_course.runner import package_files, reference_results, run_and_grade
    from attn_course.sandbox import Limits, Plain
    from attn_course.server import WorkerServer

    ex = EX[ex_id]
    cases = ex.make_cases(False)
    limits = Limits(per_exercise_s=120, per_archive_s=600)
    server = WorkerServer(Plain(limits))
    try:
        graded = run_and_grade(server, package_files(package), [(ex, cases, reference_results(ex, cases))],
                               False, set(), limits, backend=backend)
    finally:
        server.close()
    return graded[ex_id]


# -- the worker on MLX ------------------------------------------------------------


def test_inputs_become_mlx_arrays_of_the_same_dtype():
    a = np.arange(6.0).reshape(2, 3)[:, ::-1]  # negative strides, which MLX refuses as such
    got = to_backend({"x": a, "m": a > 2, "i": np.arange(3), "h": a.astype(np.float32), "T": 1.5, "n": None},
                     "mlx")
    assert got["x"].dtype == mx.float64 and np.array_equal(np.asarray(got["x"]), a)
    assert got["m"].dtype == mx.bool_ and got["i"].dtype == mx.int64 and got["h"].dtype == mx.float32
    assert got["T"] == 1.5 and got["n"] is None


def test_reference_on_mlx_matches_the_jax_reference_within_the_mlx_tolerance():
    """3.1's probe takes mx.grad on MLX: values and gradients agree with JAX's, not bit for bit."""
    from attn_course.runner import reference_results
    from attn_course.worker import resolve

    ex = EX["3.1"]
    cases = ex.make_cases(False)
    expected = reference_results(ex, cases)
    got = [Outcome.from_dict(evaluate(resolve(ex.function), ex.probe, c.inputs, "mlx", ex.id)) for c in cases]
    results = grade(ex, cases, expected, got, hidden=False, backend="mlx")
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]
    assert any("d/dS" in (o.value or {}) for o in got)
    exact = grade(ex, cases, expected, got, hidden=False, backend="jax")
    assert not all(r.passed for r in exact), "MLX float64 is as exact as JAX here: the wider tolerance is moot"


# -- tolerances -------------------------------------------------------------------


def test_tolerance_table():
    ex = EX["3.1"]
    assert tolerance(ex, "jax", np.float64) == (ex.rtol, ex.atol)
    assert tolerance(ex, "jax", np.float32) == (ex.rtol, ex.atol)
    assert tolerance(ex, "mlx", np.float64) == MLX_TOLERANCE["float64"]
    assert tolerance(ex, "mlx", np.float32) == MLX_TOLERANCE["float32"]
    five = EX["5.5"]  # NumPy differences on either backend: its own tolerance holds
    assert tolerance(five, "mlx", np.float64) == (five.rtol, five.atol)
    with pytest.raises(ValueError, match="unknown backend"):
        tolerance(ex, "torch", np.float64)


@pytest.mark.parametrize("off, jax_ok, mlx_ok", [(0.0, True, True), (1e-7, False, True), (1e-3, False, False)])
def test_compare_uses_the_backends_tolerance(off, jax_ok, mlx_ok):
    ex = EX["3.1"]
    e = {"log_Z": np.array([1.0, -2.0, 3.0])}
    g = {"log_Z": e["log_Z"] * (1 + off)}
    for backend, ok in (("jax", jax_ok), ("mlx", mlx_ok)):
        msg = compare_values(e, g, ex.rtol, ex.atol, True, tol=lambda dt, b=backend: tolerance(ex, b, dt))
        assert (msg == "") == ok, (backend, msg)


# -- diagnoses on MLX ---------------------------------------------------------------


def test_a_diagnosis_is_judged_at_the_backends_tolerance():
    """An answer off by MLX's own rounding is right on MLX: no "times too large" for it there."""
    from attn_course.diagnose import diagnose
    from attn_course.scoring import judged_on

    ex = EX["3.1"]
    case = ex.make_cases(False)[0]
    e = {"log_Z": np.array([1.0, -2.0, 3.0])}
    g = {"log_Z": e["log_Z"] * (1 + 5e-6)}  # within MLX's float64 tolerance, far outside JAX's
    on_jax = diagnose(judged_on(ex, "jax", e), case, g, e, wrong={}, entries=[])
    assert on_jax is not None and on_jax.key == "factor", on_jax
    assert judged_on(ex, "mlx", e).rtol == tolerance(ex, "mlx", np.float64)[0]
    assert diagnose(judged_on(ex, "mlx", e), case, g, e, wrong={}, entries=[]) is None


@pytest.mark.slow
def test_check_on_mlx_names_a_catalogued_mistake(tmp_path):
    """3.1 written with mlx.core, temperature left out: `check --backend mlx` names that mistake
    (from the catalogue's words shipped with the public cases), not a generic symptom."""
    from attn_course.check import load_cases
    from attn_course.runner import package_files, run_and_grade
    from attn_course.sandbox import Limits, Plain
    from attn_course.server import WorkerServer

    ex = EX["3.1"]
    public = load_cases(ROOT / "exercises" / "library" / "cases", [ex])[ex.id]
    entry = next(m for m in public.mistakes if m.key == "temperature-ignored")
    assert "s = S / T" in BODY_MLX
    package = _package_with(tmp_path, "3.1", BODY_MLX.replace("s = S / T", "s = S"))
    limits = Limits(per_exercise_s=120, per_archive_s=600)
    server = WorkerServer(Plain(limits))
    try:
        graded = run_and_grade(server, package_files(package), [(ex, public.cases, public.expected)],
                               False, set(), limits, diagnose=public.diagnose(), backend="mlx")[ex.id]
    finally:
        server.close()
    hot = [c for c, case in zip(graded, public.cases) if case.inputs.get("T", 1.0) != 1.0 and not c.passed]
    assert hot, [c.message for c in graded]
    for c in hot:
        assert entry.message in c.message, c.message


# -- backend mix-ups ----------------------------------------------------------------


def _log_z(S, mask=None, T=1.0, body=BODY_MLX):
    """3.1 written with one framework, as a notebook cell would define it."""
    ns: dict = {}
    src = ("from attn_tensors._checks import check_temperature\n"
           "from attn_tensors.backend import namespace\n"
           "def f(S, mask=None, T=1.0):\n    xp = namespace(S, mask)\n" + body)
    exec(src, ns)
    return ns["f"](S, mask, T)


@pytest.mark.parametrize("backend, body, words", [
    ("jax", BODY_MLX, ["mlx.core on JAX arrays", "attn-course check 3.1 --backend mlx", "namespace"]),
    ("mlx", BODY_JAX, ["jax.numpy on MLX arrays", "attn-course check 3.1", "namespace"]),
])
def test_mixed_framework_is_a_clear_error(backend, body, words):
    ex = EX["3.1"]
    for case in ex.make_cases(False):
        if case.inputs["T"] <= 0:
            continue  # its input check raises first, on either framework
        r = evaluate(lambda **kw: _log_z(**kw, body=body), ex.probe, case.inputs, backend, ex.id)
        assert r["status"] == "raised" and r["type"] == "BackendMismatch", (case.name, r)
        assert all(w in r["message"] for w in words), r["message"]
        assert "bad_cast" not in r["message"] and "Traceback" not in r["message"]


@pytest.mark.parametrize("ending", ["jnp.asarray(log_Z[..., 0])", "jnp.asarray(np.array(log_Z[..., 0]))"])
def test_mlx_result_turned_into_jax_is_a_mismatch(ending):
    """Written with mlx.core but returning a JAX array, checked on MLX: mx.grad refuses the JAX
    result ("[grad] ... jaxlib ... was returned"); the student reads the mismatch and its fix."""
    ex = EX["3.1"]
    body = BODY_MLX.replace("    return log_Z[..., 0]\n",
                            f"    import jax.numpy as jnp\n    import numpy as np\n    return {ending}\n")
    assert body != BODY_MLX
    valued = 0
    for case in ex.make_cases(False):
        if case.inputs["T"] <= 0:
            continue  # its input check raises first
        r = evaluate(lambda **kw: _log_z(**kw, body=body), ex.probe, case.inputs, "mlx", ex.id)
        assert r["status"] == "raised" and r["type"] == "BackendMismatch", (case.name, r)
        assert "jax.numpy on MLX arrays" in r["message"] and "namespace" in r["message"], r["message"]
        valued += 1
    assert valued >= 3


def test_bad_cast_is_reported_as_a_mismatch():
    """mx.einsum on JAX arrays raises RuntimeError('std::bad_cast') in MLX 0.32."""
    ex = EX["1.1"]

    def lower(v, g):
        import mlx.core as mx

        return mx.einsum("...b,ab->...a", v, g)

    case = ex.make_cases(False)[0]
    r = evaluate(lower, ex.probe, case.inputs, "jax", ex.id)
    assert r["type"] == "BackendMismatch" and "--backend mlx" in r["message"], r


def test_notebook_check_on_either_backend():
    """A notebook's test cell (locked) follows use_backend; an explicit backend= wins."""
    from attn_course import nbcheck

    def mlx_answer(S, mask=None, T=1.0):
        return _log_z(S, mask, T, body=BODY_MLX)

    nbcheck.check("3.1", mlx_answer, backend="mlx")
    with pytest.raises(AssertionError, match="mlx.core on JAX arrays"):
        nbcheck.check("3.1", mlx_answer, backend="jax")
    before = nbcheck._backend
    try:
        nbcheck.use_backend("mlx")
        nbcheck.check("3.1", mlx_answer)
        nbcheck.use_backend("jax")
        with pytest.raises(AssertionError, match="--backend mlx"):
            nbcheck.check("3.1", mlx_answer)
        with pytest.raises(ValueError, match="unknown backend"):
            nbcheck.use_backend("torch")
    finally:
        nbcheck._backend = before


@pytest.mark.slow
@pytest.mark.parametrize("written_with, wrong_on", [("mlx", "jax"), ("jax", "mlx")])
def test_a_package_written_for_one_framework_through_a_worker(tmp_path, written_with, wrong_on):
    """Checked on its own framework it passes; on the other, every value case names the mismatch and the fix."""
    body = BODY_MLX if written_with == "mlx" else BODY_JAX
    package = _package_with(tmp_path, "3.1", body)
    right = _check(package, "3.1", written_with)
    assert all(c.passed for c in right), [c.message for c in right if not c.passed]
    wrong = _check(package, "3.1", wrong_on)
    # its input check (T <= 0) runs before any array function, on either framework
    assert all(c.checks_error for c in wrong if c.passed)
    wrong = [c for c in wrong if not c.passed]
    assert len(wrong) >= 3
    other = "mlx.core on JAX arrays" if wrong_on == "jax" else "jax.numpy on MLX arrays"
    fix = "attn-course check 3.1 --backend mlx" if wrong_on == "jax" else "attn-course check 3.1`"
    for c in wrong:
        assert other in c.message and fix in c.message, c.message
        assert "bad_cast" not in c.message and "Traceback" not in c.message


# -- grading on both backends ----------------------------------------------------------


@pytest.mark.slow
def test_grade_both_scores_jax_and_shows_mlx(tmp_path):
    """--backend both: the score is the JAX one; the feedback shows the MLX verdict too.
    --backend mlx: the MLX one is the score."""
    import csv
    import os
    import subprocess
    import sys

    from attn_course.archive import build_archive, library_files
    from attn_course.identity import token_for

    secret = "mlx-class-secret"
    subs = tmp_path / "submitted"
    subs.mkdir()
    portable = library_files(ROOT)  # the reference: written with xp = namespace(...)
    mlx_only = dict(portable)
    mlx_only["attn_tensors/statmech.py"] = (
        _package_with(tmp_path / "mlx_only", "3.1", BODY_MLX) / "attn_tensors" / "statmech.py").read_bytes()
    build_archive(subs / "portable.zip", "portable", portable, token=token_for("portable", secret))
    build_archive(subs / "mlxonly.zip", "mlxonly", mlx_only, token=token_for("mlxonly", secret))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", ATTN_COURSE_SECRET=secret)

    def grade(backend: str):
        out = tmp_path / f"grading-{backend}"
        r = subprocess.run([sys.executable, "-m", "attn_course.cli", "grade", str(subs), "--out", str(out),
                            "--exercises", "3.1", "--backend", backend, "--jobs", "1"],  # the policy, not the pool
                           capture_output=True, text=True,
                           env=env, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        rows = {row["student_id"]: row["3.1"] for row in csv.DictReader(open(out / "gradebook.csv"))}
        return rows, out / "feedback"

    rows, fb = grade("both")
    assert rows == {"portable": "3", "mlxonly": "0"}
    mine = (fb / "mlxonly.md").read_text()
    assert "On MLX (for information, not scored): all cases pass (3/3)." in mine, mine
    unescaped = mine.replace("\\", "")  # the feedback escapes Markdown
    assert "mlx.core on JAX arrays" in unescaped and "--backend mlx" in unescaped
    theirs = (fb / "portable.md").read_text()
    assert "All cases pass." in theirs and "On MLX (for information, not scored): all cases pass (3/3)." in theirs
    rows, fb = grade("mlx")
    assert rows == {"portable": "3", "mlxonly": "3"}
    assert "On MLX" not in (fb / "mlxonly.md").read_text()


def test_a_case_marked_eager_sees_a_check_on_a_computed_value():
    """4.1's zero vector raises on every path: eager (the case is marked), compiled (the check
    now reads the inputs, outside the solution region, so jit sees it too) and MLX."""
    from attn_course.worker import evaluate_all, resolve

    ex = EX["4.1"]
    cases = ex.make_cases(False)
    zero = next(c for c in cases if c.name == "zero vector")
    assert zero.eager and not any(c.eager for c in cases if c is not zero)
    fn = resolve(ex.function)
    inputs = [c.inputs for c in cases]
    marked = evaluate_all(fn, ex.probe, inputs, "jax", ex.id, [c.eager for c in cases])
    compiled = evaluate_all(fn, ex.probe, inputs, "jax", ex.id)
    on_mlx = evaluate_all(fn, ex.probe, inputs, "mlx", ex.id)
    i = cases.index(zero)
    assert marked[i]["type"] == on_mlx[i]["type"] == "AttentionInputError"
    assert compiled[i]["type"] == "AttentionInputError"
    assert all(m["status"] == "ok" for j, m in enumerate(marked) if j != i)
