"""Two-sided validation: every exercise passes on the reference and fails on the stub.

The reference is the repository's ``attn_tensors``; the stub is the student
release built from it.  Both run in workers exactly as a submission would,
on the public cases and on hidden cases, against expected values computed by
the reference in this process.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from . import ROOT
from .registry import Exercise, all_exercises, secret, select
from .runner import package_files, reference_results, run_worker
from .sandbox import Limits, Plain
from .scoring import ExerciseResult, grade, stubbed_exercises
from .server import WorkerServer


def cases_and_expected(exercises: list[Exercise]):
    out = {}
    for e in exercises:
        public, hidden = e.make_cases(False), e.make_cases(True, secret(allow_ci=True))
        out[e.id] = (public, reference_results(e, public), hidden, reference_results(e, hidden))
    return out


def run_side(package: Path, exercises: list[Exercise], data) -> dict[str, ExerciseResult]:
    items = [(e, data[e.id][0] + data[e.id][2]) for e in exercises]
    limits = Limits(per_exercise_s=300, per_archive_s=7200)
    server = WorkerServer(Plain(limits))
    try:
        raw = run_worker(server, package_files(package), items, limits)
    finally:
        server.close()
    results = {}
    stubbed = stubbed_exercises(package)
    for e in exercises:
        public, exp_p, hidden, exp_h = data[e.id]
        got = raw.get(e.id, [])
        if len(got) == 1:
            got = got * (len(public) + len(hidden))
        cr = grade(e, public, exp_p, got[: len(public)], False, stubbed)
        cr += grade(e, hidden, exp_h, got[len(public):], True, stubbed)
        results[e.id] = ExerciseResult(e, cr)
    return results


def two_sided(exercises: list[Exercise]) -> tuple[dict, dict]:
    """(reference results, stub results) for the exercises."""
    from .release import write_stubs

    data = cases_and_expected(exercises)
    ref = run_side(ROOT, exercises, data)
    with tempfile.TemporaryDirectory() as tmp:
        write_stubs(Path(tmp), all_exercises(), strict=False)
        stub = run_side(Path(tmp), exercises, data)
    return ref, stub


def validate(spec: str = "all") -> bool:
    exercises = select(spec)
    ref, stub = two_sided(exercises)
    ok = True
    for e in exercises:
        r, s = ref[e.id], stub[e.id]
        fails_on_stub = not any(c.passed for c in s.cases)
        good = r.passed and fails_on_stub
        ok &= good
        print(f"{'ok ' if good else 'BAD'} {e.id:<5} reference {'passes' if r.passed else 'FAILS'}"
              f" ({len(r.cases)} cases); stub {'fails' if fails_on_stub else 'PASSES SOME'} ({s.status.value})")
        if not r.passed:
            for c in r.cases:
                if not c.passed:
                    print(f"      reference {c.case}: {c.message}")
        if not fails_on_stub:
            for c in s.cases:
                if c.passed:
                    print(f"      stub passes {c.case}")
    return ok
