"""Two-sided validation: every exercise passes on the reference and fails on the stub.

The reference is the repository's ``attn_tensors``; the stub is the student
release built from it.  Both run in workers exactly as a submission would,
on the public cases and on hidden cases, against expected values computed by
the reference in this process.  With ``backend="mlx"`` the workers run the
cases on MLX arrays (the expected values stay the JAX reference's; the
tolerances are :func:`attn_course.scoring.tolerance`'s): one worker job per
side holds every exercise, and MLX runs eagerly, so nothing is recompiled.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from . import ROOT, result_cache, values
from .registry import Exercise, all_exercises, secret, select
from .runner import package_files, reference_results, run_worker
from .sandbox import Limits, Plain
from .scoring import ExerciseResult, Outcome, grade, stubbed_exercises
from .server import WorkerServer


def cases_and_expected(exercises: list[Exercise]):
    """Public and hidden cases with their expected values; as in grading, the reference's
    programs also fill the workers' compilation cache (:func:`reference_results`)."""
    out = {}
    for e in exercises:
        public, hidden = e.make_cases(False), e.make_cases(True, secret(allow_ci=True))
        out[e.id] = (public, reference_results(e, public, worker_cache=True),
                     hidden, reference_results(e, hidden, worker_cache=True))
    return out


_SIDE_LIMITS = Limits(per_exercise_s=300, per_archive_s=7200)


def _side_server() -> WorkerServer:
    """A worker server that, as a grading worker's does, reads the workers' compilation cache."""
    from .xla_cache import worker_cache_dir

    server = WorkerServer(Plain(_SIDE_LIMITS, worker_cache_dir()))
    server.warm = False  # a job or two: no later child to warm for
    return server


def _run_job(files: dict[str, str], exercises: list[Exercise], data, backend: str,
             server: WorkerServer | None) -> dict[str, list[Outcome]]:
    items = [(e, data[e.id][0] + data[e.id][2]) for e in exercises]
    own = server is None
    server = server or _side_server()
    try:
        return run_worker(server, files, items, _SIDE_LIMITS, backend=backend)
    finally:
        if own:
            server.close()


def _reference_job(files: dict[str, str], exercises: list[Exercise], data, backend: str,
                   server: WorkerServer | None) -> dict[str, list[Outcome]]:
    """The reference's job, as :func:`_run_job` runs it, computed once per key where results are kept
    (:mod:`attn_course.result_cache`: the test suite's).  The key holds every source of the course
    and the library (a change to the server, the sandbox or the grading runs it again), the cases
    and the backend; the stub's side always runs."""
    def compute() -> dict:
        raw = _run_job(files, exercises, data, backend, server)
        return {ex_id: [values.encode(dataclasses.asdict(o)) for o in outcomes] for ex_id, outcomes in raw.items()}

    parts = [backend, result_cache.source_digest(Path(__file__).parent),
             [[e.id, e.function, result_cache.cases_digest(data[e.id][0] + data[e.id][2])] for e in exercises]]
    cached = result_cache.cached("reference-side", parts, compute)
    return {ex_id: [Outcome.from_dict(values.decode(o)) for o in outcomes] for ex_id, outcomes in cached.items()}


def run_side(package: Path, exercises: list[Exercise], data, backend: str = "jax",
             server: WorkerServer | None = None) -> dict[str, ExerciseResult]:
    """One side, as one job of ``server`` (default: a server of its own, :func:`_side_server`).
    The reference's own side (``package`` is the repository) is kept where results are
    (:func:`_reference_job`)."""
    files = package_files(package)
    job = _reference_job if Path(package).resolve() == ROOT.resolve() else _run_job
    raw = job(files, exercises, data, backend, server)
    results = {}
    stubbed = stubbed_exercises(files)
    for e in exercises:
        public, exp_p, hidden, exp_h = data[e.id]
        got = raw.get(e.id, [])
        if len(got) == 1:
            got = got * (len(public) + len(hidden))
        cr = grade(e, public, exp_p, got[: len(public)], False, stubbed, backend=backend)
        cr += grade(e, hidden, exp_h, got[len(public):], True, stubbed, backend=backend)
        results[e.id] = ExerciseResult(e, cr)
    return results


def two_sided(exercises: list[Exercise], backend: str = "jax", data=None) -> tuple[dict, dict]:
    """(reference results, stub results) for the exercises, run on ``backend``.

    ``data``: :func:`cases_and_expected` of the exercises, when the caller has it already.
    """
    from .release import write_stubs

    data = data or cases_and_expected(exercises)
    server = _side_server()  # both sides' jobs: one server start, not two
    try:
        ref = run_side(ROOT, exercises, data, backend, server)
        with tempfile.TemporaryDirectory() as tmp:
            write_stubs(Path(tmp), all_exercises(), strict=False)
            stub = run_side(Path(tmp), exercises, data, backend, server)
    finally:
        server.close()
    return ref, stub


def validate(spec: str = "all", backend: str = "jax") -> bool:
    """Print one line per exercise (and backend); True when every reference passes and every stub fails.

    ``backend``: "jax", "mlx" or "both".
    """
    exercises = select(spec)
    backends = ("jax", "mlx") if backend == "both" else (backend,)
    data = cases_and_expected(exercises)
    ok = True
    for b in backends:
        ok &= _report(exercises, *two_sided(exercises, b, data), b if backend != "jax" else "")
    return ok


def _report(exercises: list[Exercise], ref: dict, stub: dict, label: str) -> bool:
    ok = True
    for e in exercises:
        r, s = ref[e.id], stub[e.id]
        fails_on_stub = not any(c.passed for c in s.cases)
        good = r.passed and fails_on_stub
        ok &= good
        on = f" [{label}]" if label else ""
        print(f"{'ok ' if good else 'BAD'} {e.id:<5}{on} reference {'passes' if r.passed else 'FAILS'}"
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
