"""The test cells of the exercise notebooks call these.

``check("3.1", log_partition_function)`` runs the public cases (expected
values from the release's case files) and raises ``AssertionError`` with the
same report as ``attn-course check`` when one fails; ``check("3.1",
log_partition_function, backend="mlx")`` runs them on MLX arrays, as
``attn-course check 3.1 --backend mlx`` does.  ``check_hidden`` (only
in the instructor's notebooks, inside nbgrader's hidden-test markers) draws
the hidden cases from the instructor's secret and compares with the
reference library; its messages never show a hidden value.
"""

from __future__ import annotations

from . import RELEASE_LIBRARY
from .check import load_public, report
from .registry import all_exercises, secret
from .runner import reference_results
from .scoring import ExerciseResult, Outcome, grade
from .worker import evaluate


def _run(ex_id, fn, hidden: bool, backend: str = "jax") -> ExerciseResult:
    import jax

    jax.config.update("jax_enable_x64", True)
    ex = all_exercises()[ex_id]
    if hidden:
        cases = ex.make_cases(True, secret(allow_ci=True))
        expected = reference_results(ex, cases)
    else:
        cases, expected = load_public(RELEASE_LIBRARY / "cases", [ex])[ex.id]
    got = [Outcome.from_dict(evaluate(fn, ex.probe, c.inputs, backend, ex.id)) for c in cases]
    return ExerciseResult(ex, grade(ex, cases, expected, got, hidden=hidden, backend=backend))


def check(ex_id: str, fn, backend: str = "jax") -> None:
    """The public cases of ``ex_id`` on ``fn``, on JAX arrays or (``backend="mlx"``) MLX arrays."""
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
