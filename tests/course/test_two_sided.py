"""Two-sided validation: each exercise passes on the reference and fails on the stub.

Both sides run in workers exactly as a submission would, on the public and
the hidden cases; the expected values come from the reference library in this
process.  One test per exercise, marked ``ex3_1`` and ``ch03``, so
``pytest -m ex5_2`` runs one exercise.  The same on MLX arrays (marked
``mlx``), against the same expected values with MLX's tolerances: one more
worker job per side, run eagerly (nothing to compile).
"""

from __future__ import annotations

import pytest

from attn_course.registry import all_exercises
from attn_course.validate import cases_and_expected, two_sided

EXERCISES = list(all_exercises().values())
_data: dict[str, tuple] = {}  # exercise id -> cases and expected values (computed once)
_cache: dict[str, dict[str, tuple]] = {"jax": {}, "mlx": {}}


def _sides(request, backend: str) -> dict[str, tuple]:
    """Reference and stub results on ``backend`` for the exercises this module runs (one worker each)."""
    chosen = {item.callspec.params["exercise"] for item in request.session.items
              if hasattr(item, "callspec") and "exercise" in item.callspec.params
              and item.module is request.module
              and (item.get_closest_marker("mlx") is not None) == (backend == "mlx")}
    cache = _cache[backend]
    todo = [e for e in EXERCISES if e.id in chosen and e.id not in cache]
    if todo:
        missing = [e for e in todo if e.id not in _data]
        if missing:
            _data.update(cases_and_expected(missing))
        ref, stub = two_sided(todo, backend, {e.id: _data[e.id] for e in todo})
        for e in todo:
            cache[e.id] = (ref[e.id], stub[e.id])
    return cache


@pytest.fixture(scope="module")
def sides(request):
    return _sides(request, "jax")


@pytest.fixture(scope="module")
def sides_mlx(request):
    pytest.importorskip("mlx.core")
    return _sides(request, "mlx")


def _params():
    return [pytest.param(e.id, id=e.id, marks=[getattr(pytest.mark, e.marker),
                                               getattr(pytest.mark, f"ch{e.chapter:02d}")])
            for e in EXERCISES]


@pytest.mark.parametrize("exercise", _params())
def test_reference_passes(exercise, sides):
    ref, _ = sides[exercise]
    bad = [f"{c.case}: {c.message}" for c in ref.cases if not c.passed]
    assert ref.passed, f"the reference fails exercise {exercise}:\n" + "\n".join(bad)
    assert any(c.hidden for c in ref.cases) and any(not c.hidden for c in ref.cases)


@pytest.mark.parametrize("exercise", _params())
def test_stub_fails_every_case(exercise, sides):
    _, stub = sides[exercise]
    passing = [c.case for c in stub.cases if c.passed]
    assert not passing, f"the stub of exercise {exercise} passes {passing}"
    assert stub.status in ("not_implemented", "blocked"), stub.status


@pytest.mark.mlx
@pytest.mark.parametrize("exercise", _params())
def test_reference_passes_on_mlx(exercise, sides_mlx):
    ref, _ = sides_mlx[exercise]
    bad = [f"{c.case}: {c.message}" for c in ref.cases if not c.passed]
    assert ref.passed, f"the reference fails exercise {exercise} on MLX:\n" + "\n".join(bad)
    assert any(c.hidden for c in ref.cases) and any(not c.hidden for c in ref.cases)


@pytest.mark.mlx
@pytest.mark.parametrize("exercise", _params())
def test_stub_fails_every_case_on_mlx(exercise, sides_mlx):
    _, stub = sides_mlx[exercise]
    passing = [c.case for c in stub.cases if c.passed]
    assert not passing, f"the stub of exercise {exercise} passes {passing} on MLX"
    assert stub.status in ("not_implemented", "blocked"), stub.status
