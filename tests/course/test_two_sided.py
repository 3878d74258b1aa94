"""Two-sided validation: each exercise passes on the reference and fails on the stub.

Both sides run in workers exactly as a submission would, on the public and
the hidden cases; the expected values come from the reference library in this
process.  One test per exercise, marked ``ex3_1`` and ``ch03``, so
``pytest -m ex5_2`` runs one exercise.
"""

from __future__ import annotations

import pytest

from attn_course.registry import all_exercises
from attn_course.validate import two_sided

EXERCISES = list(all_exercises().values())
_cache: dict[str, tuple] = {}


@pytest.fixture(scope="module")
def sides(request):
    """Reference and stub results for the exercises selected in this session (one worker each)."""
    chosen = {item.callspec.params["exercise"] for item in request.session.items
              if hasattr(item, "callspec") and "exercise" in item.callspec.params
              and item.module is request.module}
    todo = [e for e in EXERCISES if e.id in chosen and e.id not in _cache]
    if todo:
        ref, stub = two_sided(todo)
        for e in todo:
            _cache[e.id] = (ref[e.id], stub[e.id])
    return _cache


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
