"""Grade 100 synthetic submissions of chapter 3 with 2 workers; compare with nbgrader.

Prints, for `attn-course grade` on 100 archives (half honest, a quarter
untouched stubs, a quarter with one wrong function), the wall time and the
cost per submission in core-seconds, and the same for `nbgrader autograde`
on the equivalent chapter-3 notebooks (the same mix: the solutions' answers,
the release as it is, or the solutions with the same wrong function added
to its answer cell), which grades one submission at a time.  Targets (issue
14): the 100 within 30 s on 2 cores, and at least 10x cheaper per
submission than nbgrader autograde.

Core-seconds are measured as the CPU time the kernel charged to the
benchmark and every process it started (a cgroup, :mod:`_cpu`), so other
work on the machine does not inflate them; where no cgroup can be made they
are estimated as wall x workers (and nbgrader's as its wall time).  The
ratio is taken on the measured figures where both have them.  The 100
archives' wall time is printed with the machine's pace just before them
(``_cpu.pace``: the CPU time of a fixed piece of JAX work), a rough guide to
which kind of hour of a shared machine the run fell in.

The class's set-up is timed apart from the archives, and printed: the
reference's expected values on the class's cases and the worker servers
started and warmed on the cases' shapes -- once per class, whatever its
size.  (The catalogue of mistakes runs on an exercise's cases when the
first answer to it fails: inside the timed run.)

The ratio compares what one more submission costs each grader, the only
cost that grows with a class of thousands.  Each side grades twice as many
submissions as its half-way mark (``--n`` archives, ``--nb`` notebooks for
nbgrader, which grades one at a time), and the CPU time read when the
half-way submission is finished is subtracted from the run's total: the
second half's cost, once all set-up and start-up is paid, divided by its
size.  Everything after the mark counts, the run's end included (our
report and gradebook of the whole class, nbgrader's last database writes).
One run on each side is a round; the machine's speed drifts between runs
of a shared machine, so the rounds alternate the two sides and the median
of the rounds' ratios is the figure (``--rounds``, 3 by default).

With ``--dask`` it also grades the same class on a ``distributed.LocalCluster``
of 1 and then 2 worker processes (one thread each) through ``--scheduler``,
workers warmed first (their expected values computed), and prints the
throughput and the cost per submission in core-seconds.

The class is copies: half the archives are the same honest library, a quarter the
same stubs, a quarter one of three wrong functions.  An archive's job only traces
its functions; what they trace to is evaluated in an evaluation job, and two
archives whose functions trace to the same programs are evaluated once
(:class:`attn_course.runner.Evaluated`).  ``--distinct`` evaluates every archive's
programs, as for a class in which no two answers trace alike: the bound from
above for a class of thousands.

    python benchmarks/bench_grading.py [--n 100] [--nb 8] [--rounds 3] [--jobs 2] [--dask] [--no-nbgrader]
                                       [--distinct]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# One BLAS thread for both sides, as the grader's workers have (attn_course.sandbox.worker_env):
# nbgrader, its kernels and this grader's own process are given it too, so that the ratio is
# not won by a setting nbgrader could have as well (before anything imports NumPy)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from _cpu import CpuMeter, pace  # noqa: E402

from attn_course import diagnose  # noqa: E402
from attn_course.archive import build_archive, library_files  # noqa: E402
from attn_course.grade import Grader  # noqa: E402
from attn_course.identity import token_for  # noqa: E402

os.environ.setdefault("ATTN_COURSE_SECRET", "bench-secret")
SECRET = os.environ["ATTN_COURSE_SECRET"]

WRONG = {
    "3.1": "def log_partition_function(S, mask=None, T=1.0):\n    return S.max(axis=-1)\n",
    "3.2": "def entropy(A, mask=None):\n    return -(A * A).sum(axis=-1)\n",
    "3.5": "def zero_temperature_limit(S, mask=None):\n    return S * 0\n",
}


def make_class(folder: Path, n: int) -> None:
    ref = library_files(ROOT)
    stub = library_files(ROOT / "exercises" / "library")
    for k in range(n):
        files = dict(ref)
        if k % 4 == 1:
            files = dict(stub)
        elif k % 4 == 3:
            code = list(WRONG.values())[k % len(WRONG)]
            files["attn_tensors/statmech.py"] = ref["attn_tensors/statmech.py"] + b"\n\n" + code.encode()
        build_archive(folder / f"s{k:03d}.zip", f"s{k:03d}", files, token=token_for(f"s{k:03d}", SECRET))


def bench_ours(n: int, jobs: int, meter: CpuMeter) -> tuple[float, float, bool]:
    """Wall time and core-seconds per submission (measured: True, or estimated as wall x jobs)."""
    wall, cpu, measured, _ = grade_class(n, jobs, meter)
    return wall, cpu / n, measured


def ours_per_further_submission(n: int, jobs: int, meter: CpuMeter) -> float:
    """What one more archive costs: a class of 2n, less the CPU time read at its n-th result, / n.

    Set-up and whatever the run pays once (the catalogue of mistakes run
    on an exercise's cases at its first failure) fall in the first half;
    the report and gradebook of the whole class are paid after the mark, so
    they count.  Without a cgroup, the two halves' wall times x workers.
    """
    _, total, measured, half = grade_class(2 * n, jobs, meter, mark=n)
    per = (total - half) / n
    print(f"  per further submission: {per:.2f} core-s (results {n + 1} to {2 * n} and the run's end, / {n}; "
          f"{'CPU time measured' if measured else 'estimated as wall x workers'})")
    return per


def grade_class(n: int, jobs: int, meter: CpuMeter, mark: int | None = None) -> tuple[float, float, bool, float]:
    """Grade a class of n: wall time, core-seconds, measured (True) or estimated as wall x jobs, and
    the core-seconds spent when the ``mark``-th result was written (0 without ``mark``)."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "subs").mkdir()
        make_class(tmp / "subs", n)
        diagnose._CACHE.clear()  # each class runs the catalogue afresh (a class of its own)
        g = Grader(tmp / "grading", "3", jobs=jobs, log=lambda *a: None)
        t = time.perf_counter()
        g.prepare()  # the reference's expected values: once per class
        g.start_workers()  # the worker servers, started and warmed on the class's case shapes
        print(f"set-up, once per class (expected values, {jobs} workers started and warmed): "
              f"{time.perf_counter() - t:.1f} s")
        at_mark: list[float] = []
        line = g.progress_line

        def progress(i, total, res):  # called as each result is written, i counting from 1
            if i == mark:
                c = meter.seconds()
                at_mark.append(c if c is not None else (time.perf_counter() - t) * jobs)
            return line(i, total, res)

        g.progress_line = progress
        meter.start()
        t = time.perf_counter()
        results = g.run(tmp / "subs")
        wall = time.perf_counter() - t
        cpu = meter.seconds()
        full = sum(1 for r in results if r.total == 12)
        print(f"attn-course grade: {n} submissions, {jobs} workers ({results[0].sandbox}): "
              f"wall {wall:.1f} s; {full} with full marks")
        total = cpu if cpu is not None else wall * jobs
        how = "CPU time measured" if cpu is not None else "estimated as wall x workers"
        print(f"  per submission: {total / n:.2f} core-s ({how}; wall x workers / n = {wall * jobs / n:.2f})")
        return wall, total, cpu is not None, at_mark[0] if at_mark else 0.0


def bench_dask(n: int, workers: int, spec: str = "3") -> float:
    """Wall time of grading n archives on a LocalCluster of ``workers`` processes (workers warmed)."""
    from distributed import Client, LocalCluster, wait

    from attn_course.dask_pool import TaskConfig, warm_worker

    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                         silence_logs=40) as cluster, Client(cluster) as client:
        tmp = Path(tmp)
        (tmp / "subs").mkdir()
        make_class(tmp / "subs", n)
        g = Grader(tmp / "grading", spec, log=lambda *a: None, scheduler=cluster.scheduler_address)
        cfg = TaskConfig.of(g)
        wait([client.submit(warm_worker, cfg, workers=[w], pure=False) for w in client.scheduler_info()["workers"]])
        t = time.perf_counter()
        results = g.run(tmp / "subs")
        wall = time.perf_counter() - t
        full = sum(1 for r in results if r.total == 12)
        print(f"dask LocalCluster: {n} submissions, {workers} worker(s): wall {wall:.1f} s "
              f"({n / wall:.2f} submissions/s); {full} with full marks; "
              f"per submission {wall * workers / n:.2f} core-s")
        # a worker's heartbeat that meets the closing scheduler is logged as an error, with its
        # traceback (dask/distributed#7105, seen here now and then): the measurement is over, and
        # the cluster's shutdown is not part of it
        client.run(_quiet_distributed)
        _quiet_distributed()
        return wall * workers / n


def _quiet_distributed() -> None:
    """Only critical messages of ``distributed`` from now on (in a worker, or here)."""
    import logging

    logging.getLogger("distributed").setLevel(logging.CRITICAL)


def nbgrader_per_submission(k: int, meter: CpuMeter) -> tuple[float, bool]:
    """nbgrader's cost of one more submission: a run on 2k, less the CPU time read as its k-th is written, / k.

    nbgrader starts its application, database and first kernel once per
    run (several core-seconds), as this grader computes its expected values
    and starts its workers once per class: both fall before the mark.
    nbgrader grades one submission at a time and writes each notebook to
    its ``autograded`` folder, sanitised, before it runs it: the first k are
    finished when the (k+1)-th appears (the folder is polled every 20 ms;
    that one's sanitising, a small part, falls before the mark).
    Without a cgroup, wall times (nbgrader uses one core).
    """
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ATTN_UNCONFINED_AUTOGRADE="1")  # our own notebooks
    n = 2 * k
    with tempfile.TemporaryDirectory() as tmp:
        course = Path(tmp)
        shutil.copyfile(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
        shutil.copytree(ROOT / "solutions" / "ch03", course / "solutions" / "ch03")
        subprocess.run([f"{bin_dir}/nbgrader", "generate_assignment", "ch03", "--force"], cwd=course, env=env,
                       check=True, capture_output=True)
        sol = json.loads((course / "solutions/ch03/ch03.ipynb").read_text())
        rel = json.loads((course / "exercises/ch03/ch03.ipynb").read_text())
        by_id = {c["metadata"]["nbgrader"]["grade_id"]: c for c in sol["cells"]}
        honest = json.loads(json.dumps(rel))
        for c in honest["cells"]:
            gid = c["metadata"]["nbgrader"]["grade_id"]
            if gid.endswith("-answer"):
                c["source"] = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION\n", "", "".join(by_id[gid]["source"]), flags=re.M)
        for s in range(n):  # the mix of make_class: one in four untouched, one in four with a mistake
            nb = rel if s % 4 == 1 else json.loads(json.dumps(honest))
            if s % 4 == 3:
                ex, code = list(WRONG.items())[s % len(WRONG)]
                cell = next(c for c in nb["cells"] if c["metadata"]["nbgrader"]["grade_id"] ==
                            f"ex-{ex.replace('.', '-')}-answer")
                cell["source"] = "".join(cell["source"]) + "\n\n" + code
            d = course / "grading" / "submitted" / f"s{s:03d}" / "ch03"
            d.mkdir(parents=True)
            (d / "ch03.ipynb").write_text(json.dumps(nb))
        graded = [course / "grading" / "autograded" / f"s{s:03d}" / "ch03" / "ch03.ipynb" for s in range(n)]
        meter.start()
        t = time.perf_counter()
        half = None
        with open(course / "log.txt", "w") as log:
            proc = subprocess.Popen([f"{bin_dir}/nbgrader", "autograde", "ch03", "--create"], cwd=course, env=env,
                                    stdout=log, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                if half is None and sum(p.exists() for p in graded) > k:
                    c = meter.seconds()
                    half = c if c is not None else time.perf_counter() - t
                time.sleep(0.02)
        wall = time.perf_counter() - t
        cpu = meter.seconds()
        if proc.returncode != 0 or half is None:
            raise RuntimeError(f"nbgrader autograde failed (exit {proc.returncode}):\n"
                               + (course / "log.txt").read_text()[-3000:])
        total = cpu if cpu is not None else wall
        per = (total - half) / k
        how = "CPU time measured" if cpu is not None else "estimated as its wall time"
        # its grades, read after the timed run: that the mix was graded as meant (as our "with full marks")
        subprocess.run([f"{bin_dir}/nbgrader", "export", "--to", "grades.csv"], cwd=course, env=env,
                       check=True, capture_output=True)
        with open(course / "grades.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        full = sum(1 for r in rows if float(r["score"]) == float(r["max_score"]) > 0)
        print(f"nbgrader autograde: {n} submissions of ch03.ipynb, one at a time: wall {wall:.1f} s, "
              f"{total:.1f} core-s ({how}); {full} with full marks")
        print(f"  nbgrader per further submission: {per:.2f} core-s (notebooks {k + 1} to {n} and the run's "
              f"end, / {k}); before them: {half:.1f} core-s")
        return per, cpu is not None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--nb", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (ours, nbgrader); the median ratio is the figure")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--dask", action="store_true", help="also grade on a LocalCluster of 1 and 2 workers")
    ap.add_argument("--no-nbgrader", action="store_true", help="skip nbgrader autograde")
    ap.add_argument("--distinct", action="store_true",
                    help="evaluate every archive's programs, as for a class where no two answers trace alike "
                         "(ATTN_COURSE_EVALUATED=0: the class's copies are otherwise evaluated once)")
    a = ap.parse_args()
    if a.distinct:
        os.environ["ATTN_COURSE_EVALUATED"] = "0"  # (read at each archive, and by Dask's workers as they start)
    meter = CpuMeter()
    ratios: list[float] = []
    try:
        pace_before = pace()  # (before the meter starts: not in any figure)
        wall, _, measured = bench_ours(a.n, a.jobs, meter)
        if a.dask:
            for workers in (1, 2):
                bench_dask(a.n, workers)
        budget = 30.0 * a.n / 100
        print(f"target: {a.n} within {budget:g} s -> {'met' if wall <= budget else 'NOT met'} ({wall:.1f} s;"
              f" machine pace {pace_before:.2f} CPU s just before, benchmarks/_cpu.pace)")
        for r in range(1, max(1, a.rounds) + 1):
            print(f"round {r}:")
            ours = ours_per_further_submission(a.n, a.jobs, meter)
            if a.no_nbgrader:
                continue
            theirs, theirs_measured = nbgrader_per_submission(a.nb, meter)
            measured = measured and theirs_measured
            ratios.append(theirs / ours)
            print(f"  ratio nbgrader/attn-course per further submission: {ratios[-1]:.1f}x")
    finally:
        meter.close()
    if not ratios:
        return
    ratio = statistics.median(ratios)
    basis = "measured CPU time" if measured else "estimates"
    print(f"ratio nbgrader/attn-course per further submission: median {ratio:.1f}x of {len(ratios)} rounds "
          f"({', '.join(f'{x:.1f}x' for x in ratios)}), on {basis} (target >= 10x -> {'met' if ratio >= 10 else 'NOT met'})")


if __name__ == "__main__":
    main()
