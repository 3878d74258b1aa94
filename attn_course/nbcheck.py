"""The test cells of the exercise notebooks call these.

``check("3.1", log_partition_function)`` runs the public cases (expected
values from the release's case files) and raises ``AssertionError`` with the
same report as ``attn-course check`` when one fails.  On MLX arrays, as
``attn-course check 3.1 --backend mlx`` runs them: ``check(...,
backend="mlx")``, or for every test cell of a notebook (they are locked)
``use_backend("mlx")`` in a cell of your own, or ``ATTN_COURSE_BACKEND=mlx``
in the environment Jupyter starts from.  ``check_hidden`` (only
in the instructor's notebooks, inside nbgrader's hidden-test markers) draws
the hidden cases from the instructor's secret and compares with the
reference library; its messages never show a hidden value.
"""

from __future__ import annotations

import os

from . import RELEASE_LIBRARY
from .check import load_public, report
from .registry import all_exercises, secret
from .runner import reference_results
from .scoring import ExerciseResult, Outcome, grade
from .worker import evaluate_all


_backend = os.environ.get("ATTN_COURSE_BACKEND", "jax")


def use_backend(name: str) -> None:
    """Run the following checks on "jax" (the default) or "mlx" arrays."""
    global _backend
    if name not in ("jax", "mlx"):
        raise ValueError(f"unknown backend {name!r}: jax or mlx")
    _backend = name


def _run(ex_id, fn, hidden: bool, backend: str = "jax") -> ExerciseResult:
    import jax

    jax.config.update("jax_enable_x64", True)
    ex = all_exercises()[ex_id]
    if hidden:
        cases = ex.make_cases(True, secret(allow_ci=True))
        expected = reference_results(ex, cases)
    else:
        cases, expected = load_public(RELEASE_LIBRARY / "cases", [ex])[ex.id]
    raw = evaluate_all(fn, ex.probe, [c.inputs for c in cases], backend, ex.id, [c.eager for c in cases])
    got = [Outcome.from_dict(r) for r in raw]
    return ExerciseResult(ex, grade(ex, cases, expected, got, hidden=hidden, backend=backend))


def check(ex_id: str, fn, backend: str | None = None) -> None:
    """The public cases of ``ex_id`` on ``fn``, on JAX arrays or (``backend="mlx"``) MLX arrays;
    by default on the backend of :func:`use_backend` (JAX unless ATTN_COURSE_BACKEND says otherwise)."""
    backend = backend or _backend
    if backend not in ("jax", "mlx"):
        raise ValueError(f"unknown backend {backend!r}: jax or mlx")
    r = _run(ex_id, fn, hidden=False, backend=backend)
    if not r.passed:
        raise AssertionError("\n" + report([r]))
    on = " on MLX" if backend == "mlx" else ""
    print(f"Exercise {ex_id}: all {len(r.cases)} public cases pass{on}")


def check_hidden(ex_id: str, fn) -> None:
    r = _run(ex_id, fn, hidden=True)
    if not r.passed:
        raise AssertionError("\n" + report([r], verbose=False))
    print(f"Exercise {ex_id}: the hidden cases pass")
