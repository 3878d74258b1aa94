"""The scoring policy: error cases count only as far as the value cases do."""

from __future__ import annotations

import numpy as np
import pytest

from attn_course.registry import Case, all_exercises
from attn_course.scoring import ExerciseResult, Outcome, Status, grade

EX = all_exercises()["2.1"]


def _cases(n_values: int, n_errors: int) -> tuple[list[Case], list[Outcome]]:
    cases, expected = [], []
    for k in range(n_values):
        cases.append(Case(f"value{k}", {}))
        expected.append(Outcome("ok", {"value": np.full((2, 2), float(k + 1))}))  # (zeros pass none)
    for k in range(n_errors):
        cases.append(Case(f"error{k}", {}))
        expected.append(Outcome("raised", type="AttentionInputError"))
    return cases, expected


def _answers(expected: list[Outcome], right_values: int, right_errors: int) -> list[Outcome]:
    """The first ``right_values`` value cases and ``right_errors`` error cases right."""
    got, v, e = [], 0, 0
    for exp in expected:
        if exp.status == "ok":
            ok, v = v < right_values, v + 1
            got.append(Outcome("ok", {"value": exp.value["value"] + (0.0 if ok else 1.0)}))
        else:
            ok, e = e < right_errors, e + 1
            got.append(Outcome("raised", type="AttentionInputError") if ok
                       else Outcome("ok", {"value": np.zeros((2, 2))}))
    return got


def _score(n_values, n_errors, right_values, right_errors, hidden=True) -> float:
    cases, expected = _cases(n_values, n_errors)
    got = _answers(expected, right_values, right_errors)
    return ExerciseResult(EX, grade(EX, cases, expected, got, hidden)).score


def test_wrong_formula_with_right_checks_scores_nothing():
    """Every value wrong, every error raised: 0, not the error cases' share."""
    assert _score(4, 4, 0, 4) == 0.0


def test_right_formula_with_every_check_scores_full():
    assert _score(4, 2, 4, 2) == pytest.approx(EX.points)


def test_a_forgotten_check_costs_its_share():
    """Values right, one of two checks missing: that case's share (1/6) is lost."""
    assert _score(4, 2, 4, 1) == pytest.approx(EX.points * 5 / 6)


def test_error_cases_count_as_far_as_the_values():
    """Half the values right: each passed error case earns half a case."""
    assert _score(4, 2, 2, 2) == pytest.approx(EX.points * (2 + 0.5 * 2) / 6)


def test_only_value_cases_is_the_plain_fraction():
    assert _score(4, 0, 3, 0) == pytest.approx(EX.points * 3 / 4)


def test_cases_know_whether_they_check_an_error():
    cases, expected = _cases(2, 1)
    results = grade(EX, cases, expected, _answers(expected, 2, 1), hidden=False)
    assert [r.checks_error for r in results] == [False, False, True]
    assert all(r.status is Status.PASS for r in results)


def test_public_cases_are_scored_only_without_hidden_ones():
    """Hidden cases decide the score; public ones only when there are no hidden ones."""
    cases, expected = _cases(2, 0)
    public = grade(EX, cases, expected, _answers(expected, 0, 0), hidden=False)
    hidden = grade(EX, cases, expected, _answers(expected, 2, 0), hidden=True)
    assert ExerciseResult(EX, public + hidden).score == pytest.approx(EX.points)
    assert ExerciseResult(EX, public).score == 0.0


def test_a_case_that_zeros_pass_counts_only_as_far_as_the_others():
    """A limit whose value and gradient are 0 (huge scores, a constant metric) is passed by an
    answer of zeros: it earns a wrong answer nothing, and a right one its full share."""
    cases = [Case("limit", {}), Case("plain", {}), Case("other", {})]
    expected = [Outcome("ok", {"value": np.zeros((2, 2)), "grad_S": np.zeros((2, 2))}),
                Outcome("ok", {"value": np.full((2, 2), 2.0), "grad_S": np.ones((2, 2))}),
                Outcome("ok", {"value": np.full((2, 2), 3.0), "grad_S": np.ones((2, 2))})]
    zeros = [Outcome("ok", {k: np.zeros_like(v) for k, v in e.value.items()}) for e in expected]
    results = grade(EX, cases, expected, zeros, hidden=True)
    assert [(r.passed, r.trivial) for r in results] == [(True, True), (False, False), (False, False)]
    assert ExerciseResult(EX, results).score == 0.0
    assert ExerciseResult(EX, grade(EX, cases, expected, expected, hidden=True)).score == EX.points
    half = expected[:2] + zeros[2:]  # the limit and one of the two others right: 1 + 1/2 of 3 cases
    assert ExerciseResult(EX, grade(EX, cases, expected, half, hidden=True)).score == pytest.approx(EX.points * 1.5 / 3)


@pytest.mark.slow
def test_an_answer_of_zeros_earns_nothing_anywhere():
    """Every exercise, on its hidden cases: an answer that returns zeros of the reference's shapes
    (or zeros where the reference raises) scores 0; the reference's own answer scores full marks."""
    from attn_course.runner import reference_results

    for ex in all_exercises().values():
        cases = ex.make_cases(True, "zeros-earn-nothing")
        expected = reference_results(ex, cases)
        zeros = [Outcome("ok", {k: np.zeros_like(np.asarray(v)) for k, v in e.value.items()}) if e.status == "ok"
                 else Outcome("ok", {"value": np.zeros(1)}) for e in expected]
        assert ExerciseResult(ex, grade(ex, cases, expected, zeros, hidden=True)).score == 0.0, ex.id
        assert ExerciseResult(ex, grade(ex, cases, expected, expected, hidden=True)).score == ex.points, ex.id
