"""Shared test helpers: backends, conversions and tolerances.

* JAX runs in float64 for the tests (``jax_enable_x64``); float32 tests ask
  for float32 explicitly.
* The ``xp_name`` fixture runs a test once on JAX and once on MLX.  MLX comes
  from ``mlx[cpu]`` on Linux; with ``ATTN_REQUIRE_MLX=1`` (set by ``make
  test``) a missing MLX is an error, so CI cannot silently skip it.
* Shapes in property tests are few and fixed so JAX compiles each once.
"""

from __future__ import annotations

import gc
import os
import sys

# NumPy's BLAS with one thread in every process of the suite (pytest's workers, the commands,
# servers and kernels they start inherit it), as in the grader's workers: pytest runs one
# worker per core, and OpenBLAS's default pool of a thread per core spins as NumPy is imported
# (about 0.1 CPU-s in each of the suite's hundreds of processes) and after each call.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before anything imports NumPy

# The session's imports (JAX's, the test modules') and its collection run without the cyclic
# garbage collector (a quarter of the start's CPU time, in each of pytest's processes);
# pytest_runtestloop freezes what they made and turns it back on before the first test.
gc.disable()

import json  # noqa: E402
from pathlib import Path

from attn_course.quick_imports import skip_iri_parsers

skip_iri_parsers()  # before any test module imports nbformat (1.8 s a process otherwise)

import jax  # noqa: E402
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from attn_course import ROOT

jax.config.update("jax_enable_x64", True)

# One persistent compilation cache for the whole session and the next ones (the
# suite's time is mostly tracing and compiling): ATTN_TEST_XLA_CACHE, default
# ~/.cache/attn-course/xla-tests; ATTN_TEST_XLA_CACHE=off turns it off.
if os.environ.get("ATTN_TEST_XLA_CACHE", "") != "off":
    from attn_course.xla_cache import cache_dir as _cache_dir, enable_compile_cache as _enable_cache

    _enable_cache(os.environ.get("ATTN_TEST_XLA_CACHE") or _cache_dir().parent / "xla-tests")

def compile_cache_env() -> dict[str, str]:
    """Environment variables that give a fresh interpreter (a snippet run as a reader runs it)
    the suite's compilation cache: its programs are loaded instead of compiled (about half of
    a short snippet's 4 s), with the same results; empty when the cache is off."""
    folder = jax.config.jax_compilation_cache_dir
    if not folder:
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": str(folder), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


# JAX makes a new MLIR context for each program it lowers (thousands in eager-mode
# tests, about 3 ms and some memory each): one per thread instead (attn_course.mlir_context).
from attn_course.mlir_context import share_mlir_context as _share  # noqa: E402

_share()

# jnp.where staged inline in every program of every pytest process, from the start (the grader's
# evaluate_job makes it so in the process that calls it: attn_course.inline_where).  It changes a
# program's text, so its key in the persistent cache: a library test file that ran after a course
# test in one session and before any in the next (xdist hands files out as workers come free)
# missed the cache and compiled again (test_gradients and test_flash: 15 s with the cache, 39 s
# after the other staging).
from attn_course.inline_where import inline_where as _inline_where  # noqa: E402

_inline_where()

# The expected values and the mistakes catalogue's outputs, computed once for the
# session and the next ones and shared by every process of the session (pytest's
# workers, the `attn-course` commands the tests run, nbgrader's kernels), keyed by
# everything they depend on (attn_course.result_cache): ATTN_TEST_RESULT_CACHE,
# default ~/.cache/attn-course/results-tests; ATTN_TEST_RESULT_CACHE=off turns it off.
if os.environ.get("ATTN_TEST_RESULT_CACHE", "") != "off":
    from attn_course.xla_cache import cache_dir as _cache_dir

    os.environ["ATTN_COURSE_RESULT_CACHE"] = (os.environ.get("ATTN_TEST_RESULT_CACHE")
                                              or str(_cache_dir().parent / "results-tests"))

from attn_tensors.backend import mlx_available, namespace  # noqa: E402

settings.register_profile(
    "default",
    deadline=None,
    max_examples=25,
    derandomize=True,
    database=None,  # the same examples on every run and machine
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)
settings.load_profile("default")

REQUIRE_MLX = os.environ.get("ATTN_REQUIRE_MLX") == "1"

if REQUIRE_MLX and not mlx_available():  # pragma: no cover
    raise RuntimeError("ATTN_REQUIRE_MLX=1 but mlx cannot be imported")

requires_mlx = pytest.mark.skipif(not mlx_available(), reason="MLX not installed")

BACKENDS = [
    pytest.param("jax", id="jax"),
    pytest.param("mlx", id="mlx", marks=[pytest.mark.mlx, requires_mlx]),
]


@pytest.fixture(params=BACKENDS)
def xp_name(request) -> str:
    """'jax' or 'mlx': run the test once per backend."""
    return request.param


def to_backend(x, name: str, dtype=None):
    """A NumPy array (or number) as a JAX or MLX array.

    MLX arrays are float32 unless ``dtype`` says otherwise; JAX keeps the
    NumPy dtype (float64 in these tests).
    """
    x = np.asarray(x)
    if name == "mlx":
        import mlx.core as mx

        if x.dtype == np.bool_:
            return mx.array(x)
        return mx.array(x.astype(np.float32) if dtype is None else x, dtype=dtype)
    import jax.numpy as jnp

    return jnp.asarray(x, dtype=dtype)


def to_np(x) -> np.ndarray:
    """Any array (JAX, MLX, NumPy, tuple of them) as float64 NumPy."""
    if isinstance(x, (tuple, list)):
        return [to_np(v) for v in x]
    return np.asarray(x).astype(np.float64) if np.asarray(x).dtype != np.bool_ else np.asarray(x)


def tol(name: str) -> dict:
    """Tolerances for comparing a backend's result with a float64 reference."""
    return dict(rtol=2e-5, atol=2e-5) if name == "mlx" else dict(rtol=1e-10, atol=1e-12)


def assert_close(got, want, name: str = "jax", **kw):
    opts = tol(name)
    opts.update(kw)
    np.testing.assert_allclose(to_np(got), to_np(want), **opts)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def random_qkv(rng, batch=(), n_q=3, n_k=4, d_k=5, d_v=2):
    Q = rng.standard_normal(batch + (n_q, d_k))
    K = rng.standard_normal(batch + (n_k, d_k))
    V = rng.standard_normal(batch + (n_k, d_v))
    return Q, K, V


__all__ = ["namespace", "to_backend", "to_np", "tol", "assert_close", "random_qkv"]


def pytest_configure(config):
    """Register one marker per graded exercise (``ex3_1``) and per chapter (``ch03``)."""
    from attn_course.registry import all_exercises

    chapters = set()
    for e in all_exercises().values():
        config.addinivalue_line("markers", f"{e.marker}: exercise {e.id}, {e.title}")
        chapters.add(e.chapter)
    for ch in sorted(chapters):
        config.addinivalue_line("markers", f"ch{ch:02d}: the graded exercises of chapter {ch}")
    # pytest-xdist's --dist loadfile hands out files in decreasing number of tests, so the
    # files with few but long tests (a red-team batch, nbgrader) would start last and one
    # worker would finish alone: it keeps the order of pytest_collection_modifyitems instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


DURATIONS = Path(__file__).with_name("durations.json")  # seconds per test file (benchmarks/bench_suite.py --record)
_LONG_S = 10.0


def _rank(module: pytest.Module, items: list, first_book: list, durations: dict) -> tuple[int, float]:
    """Where a test file goes: the long ones first, so that the workers finish together.

    (0,): the first file that builds the book (its build is the long one); (1, -s): a file that
    took at least 10 s in the last recorded run (``tests/durations.json``), the longest first;
    (2,): the other book files (the book is built by then: theirs finds the cache warm); (3, -s):
    the rest, the longest first (the many short files fill in at the end).  A file not recorded
    yet is guessed from its marks: slow as a whole 10 s, some slow tests 5 s, else 0.5 s.  The
    order changes no verdict, only how evenly the workers share the files.
    """
    if any(it.get_closest_marker("book") for it in items):
        if not first_book:
            first_book.append(module)
        return (0, 0.0) if first_book[0] is module else (2, 0.0)
    seconds = durations.get(Path(module.path).relative_to(ROOT).as_posix())
    if seconds is None:
        marks = getattr(module.obj, "pytestmark", [])
        marks = {m.name for m in (marks if isinstance(marks, list) else [marks])}
        seconds = _LONG_S if "slow" in marks else 5.0 if any(it.get_closest_marker("slow") for it in items) else 0.5
    return (1 if seconds >= _LONG_S else 3, -float(seconds))


def pytest_collection_modifyitems(config, items):
    """Long files first (see :func:`_rank`); a file's tests keep their order."""
    by_module: dict = {}
    for it in items:
        by_module.setdefault(it.getparent(pytest.Module), []).append(it)
    try:
        durations = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        durations = {}
    first_book: list = []
    rank = {m: _rank(m, its, first_book, durations) for m, its in by_module.items()}
    items[:] = [it for m in sorted(by_module, key=lambda m: rank[m]) for it in by_module[m]]


@pytest.fixture(scope="module")
def secret_env(request):
    """``ATTN_COURSE_SECRET`` set to the test module's ``SECRET`` for its tests, then restored.

    The processes the tests start inherit it (a Dask cluster's workers are
    trusted, as the grader is, and need the course's secret).
    """
    old = os.environ.get("ATTN_COURSE_SECRET")
    os.environ["ATTN_COURSE_SECRET"] = request.module.SECRET
    yield
    if old is None:
        del os.environ["ATTN_COURSE_SECRET"]
    else:
        os.environ["ATTN_COURSE_SECRET"] = old


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """After collection (and in xdist's controller, which collects nothing): the collector back on,
    with what the imports made out of its sight (gc.freeze: it lives for the session anyway)."""
    gc.freeze()
    gc.enable()


# benchmarks/bench_suite.py: each test's CPU time with every process it starts (_cpu.CpuGroups)
_CPU_GROUPS = None
if os.environ.get("ATTN_BENCH_CPU_DIR"):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _cpu import CpuGroups

    _CPU_GROUPS = CpuGroups(os.environ["ATTN_BENCH_CPU_DIR"])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _CPU_GROUPS is not None:
        _CPU_GROUPS.enter(item.nodeid)
    yield


def pytest_sessionfinish(session):
    if _CPU_GROUPS is not None:
        _CPU_GROUPS.finish()
