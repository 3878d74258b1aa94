"""The test cells of the exercise notebooks call these.

The setup cell calls :func:`use_workspace`: from then on ``attn_tensors`` is
the library of the student's workspace (the folder that holds the notebook's
``notebooks/``), not whatever copy is installed, so the import cells and the
answers run on the student's own code.

``check("3.1", log_partition_function)`` runs the public cases (expected
values from the workspace's case files) and raises ``AssertionError`` with
the same report as ``attn-course check``, mistakes named from the same
shipped data, headed by the answer cell to fix.  On MLX arrays, as
``attn-course check 3.1 --backend mlx`` runs them: ``check(...,
backend="mlx")``, or for every test cell of a notebook (they are locked)
``use_backend("mlx")`` in a cell of your own, or ``ATTN_COURSE_BACKEND=mlx``
in the environment Jupyter starts from.  ``check_hidden`` (only in the
instructor's notebooks, inside nbgrader's hidden-test markers) draws the
hidden cases from the instructor's secret and compares with the reference
library; its messages never show a hidden value.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import RELEASE_LIBRARY
from .check import load_cases, report
from .registry import all_exercises, secret
from .runner import reference_results
from .scoring import ExerciseResult, Outcome, grade
from .worker import evaluate_all

_WORKSPACE: list[Path] = []  # the workspace whose library this kernel uses, once found


def find_workspace(start: Path | None = None) -> Path | None:
    """The workspace holding ``start`` (default: the current folder), or None."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "course.json").is_file() and (folder / "attn_tensors" / "__init__.py").is_file():
            return folder
    return None


def use_workspace(start: Path | None = None) -> Path | None:
    """Import ``attn_tensors`` from the workspace around the notebook (the student's own code).

    Outside a workspace (the instructor's notebooks, a grading sandbox) the
    library already importable is kept; returns the workspace used, or None.
    """
    from .worker import load_package

    ws = find_workspace(start)
    if ws is None:
        return None
    load_package(ws)  # replaces any attn_tensors imported before, whatever is installed
    _WORKSPACE[:] = [ws]
    print(f"attn_tensors: your library in {ws / 'attn_tensors'}")
    return ws


def _cases_dir() -> Path:
    if _WORKSPACE and (_WORKSPACE[0] / ".course" / "cases").is_dir():
        return _WORKSPACE[0] / ".course" / "cases"
    return RELEASE_LIBRARY / "cases"


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
    diagnose = None
    if hidden:
        cases = ex.make_cases(True, secret(allow_ci=True))
        expected = reference_results(ex, cases)
    else:
        public = load_cases(_cases_dir(), [ex])[ex.id]
        cases, expected, diagnose = public.cases, public.expected, public.diagnose()
    raw = evaluate_all(fn, ex.probe, [c.inputs for c in cases], backend, ex.id, [c.eager for c in cases])
    got = [Outcome.from_dict(r) for r in raw]
    return ExerciseResult(ex, grade(ex, cases, expected, got, hidden=hidden, diagnose=diagnose, backend=backend))


def failure_text(r: ExerciseResult, hidden: bool = False) -> str:
    """What a failing test cell says: the answer cell to fix, then ``attn-course check``'s report."""
    e = r.exercise
    bad = sum(not c.passed for c in r.cases)
    which = "hidden" if hidden else "public"
    head = (f"Exercise {e.id}: {bad} of {len(r.cases)} {which} cases fail. Fix the answer cell above "
            f"(`def {e.name}`, grade id {e.label}-answer), run it, then run this cell again.")
    if not hidden:
        head += f" The same report as `attn-course check {e.id}`:"
    return "\n" + head + "\n\n" + report([r], verbose=not hidden)


def check(ex_id: str, fn, backend: str | None = None) -> None:
    """The public cases of ``ex_id`` on ``fn``, on JAX arrays or (``backend="mlx"``) MLX arrays;
    by default on the backend of :func:`use_backend` (JAX unless ATTN_COURSE_BACKEND says otherwise)."""
    backend = backend or _backend
    if backend not in ("jax", "mlx"):
        raise ValueError(f"unknown backend {backend!r}: jax or mlx")
    r = _run(ex_id, fn, hidden=False, backend=backend)
    if not r.passed:
        raise AssertionError(failure_text(r))
    on = " on MLX" if backend == "mlx" else ""
    print(f"Exercise {ex_id}: all {len(r.cases)} public cases pass{on}")


def check_hidden(ex_id: str, fn) -> None:
    r = _run(ex_id, fn, hidden=True)
    if not r.passed:
        raise AssertionError(failure_text(r, hidden=True))
    print(f"Exercise {ex_id}: the hidden cases pass")
