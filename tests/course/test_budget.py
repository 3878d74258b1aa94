"""An archive's time budget is spent by what it runs, never by the grader's own work.

A diagnosis (:func:`attn_course.diagnose.explain`) runs the mistakes
catalogue the first time a class gets an exercise wrong, in the grader's
process, while that archive is being graded.  Its time was charged to the
archive: on a slow machine the archive's public cases (run after the
diagnoses of its hidden ones), or its notebooks, could be "stopped: the
archive's time budget was spent" by work that was not the archive's.

The worker is replaced by one that answers at once (three times the
expected values: wrong, so every case is diagnosed), and each diagnosis
sleeps: a sleep of 0.3 s moves the clock by at least that much, however
busy the machine, so the verdict does not depend on load.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from attn_course import ROOT, runner
from attn_course.grade import Grader
from attn_course.runner import Budget, package_files
from attn_course.scoring import Outcome

SLEEP_S = 0.3


def test_a_diagnosis_moves_the_deadline_back_by_its_time():
    budget = Budget(100.0)
    slow = budget.not_charged(lambda x: time.sleep(SLEEP_S) or x + 1)
    assert slow(1) == 2
    assert budget.deadline >= 100.0 + SLEEP_S

    def fails():
        time.sleep(SLEEP_S)
        raise ValueError("a diagnosis that fails")

    with pytest.raises(ValueError):
        budget.not_charged(fails)()
    assert budget.deadline >= 100.0 + 2 * SLEEP_S  # its time is the grader's all the same


def test_the_public_cases_run_with_the_time_the_diagnoses_took_given_back(monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_SECRET", "budget-secret")
    g = Grader(None, "3.2", jobs=1, log=lambda *a: None)
    g.prepare()
    public, public_expected, hidden, hidden_expected = g._expected["3.2"]
    runs: list[tuple[str, float]] = []

    def wrong(outcome: Outcome) -> Outcome:
        if outcome.status != "ok":
            return outcome
        return Outcome("ok", {k: 3 * np.asarray(v) for k, v in outcome.value.items()})

    def worker(server, files, items, limits, budget, *args, **kwargs):
        ((ex, cases),) = items
        kind = "hidden" if cases is hidden else "public"
        runs.append((kind, budget.deadline))
        expected = hidden_expected if kind == "hidden" else public_expected
        return {ex.id: [wrong(o) for o in expected]}

    diagnosed: list[float] = []

    def explain(*args, **kwargs) -> None:
        time.sleep(SLEEP_S)
        diagnosed.append(SLEEP_S)
        return None

    monkeypatch.setattr(runner, "run_worker", worker)
    monkeypatch.setattr("attn_course.diagnose.explain", explain)
    start = time.monotonic()
    try:
        scores, feedback, spent = g._library(0, package_files(ROOT), Budget(start + 60.0))
    finally:
        g.close()
    assert [kind for kind, _ in runs] == ["hidden", "public"], runs
    assert scores["3.2"] < 3 and not spent
    n_hidden = sum(1 for c in feedback["3.2"]["cases"] if c["hidden"] and not c["passed"])
    assert n_hidden >= 1 and len(diagnosed) >= n_hidden
    (_, hidden_deadline), (_, public_deadline) = runs
    assert hidden_deadline == start + 60.0
    # the public run's clock was moved back by every diagnosis of the hidden cases
    assert public_deadline >= hidden_deadline + n_hidden * SLEEP_S, (public_deadline - hidden_deadline, n_hidden)
