"""Grade 100 synthetic submissions of chapter 3 with 2 workers; compare with nbgrader.

Prints, for `attn-course grade` on 100 archives (half honest, a quarter
untouched stubs, a quarter with one wrong function), the wall time and the
cost per submission in core-seconds, and the same for `nbgrader autograde`
on the equivalent chapter-3 notebooks (answered with the solutions), which
grades one submission at a time.  Targets (issue 14): the 100 within 30 s on
2 cores, and at least 10x cheaper per submission than nbgrader autograde.

Core-seconds are measured as the CPU time the kernel charged to the
benchmark and every process it started (a cgroup, :mod:`_cpu`), so other
work on the machine does not inflate them; where no cgroup can be made they
are estimated as wall x workers (and nbgrader's as its wall time).  The
ratio is taken on the measured figures where both have them.

The class's set-up is timed apart from the archives, and printed: the
reference's expected values on the class's cases and the worker servers
started and warmed on the cases' shapes -- once per class, whatever its
size.  (The catalogue of mistakes runs on an exercise's cases when the
first answer to it fails: inside the timed run.)  nbgrader's fixed cost
per run (its application, database, first kernel) is left out likewise:
it grades ``--nb`` and then twice as many notebooks, and the difference
gives what one more submission costs it.

With ``--dask`` it also grades the same class on a ``distributed.LocalCluster``
of 1 and then 2 worker processes (one thread each) through ``--scheduler``,
workers warmed first (their expected values computed), and prints the
throughput and the cost per submission in core-seconds.

    python benchmarks/bench_grading.py [--n 100] [--nb 4] [--jobs 2] [--dask] [--no-nbgrader]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu import CpuMeter  # noqa: E402

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
    wall, cpu, measured = grade_class(n, jobs, meter)
    return wall, cpu / n, measured


def ours_per_further_submission(n: int, jobs: int, meter: CpuMeter, first: float) -> float:
    """What one more archive costs: classes of n and 2n, (c(2n) - c(n)) / n, as for nbgrader.

    The timed run of a class also pays once for things that do not grow
    with it (the report and its figures, the catalogue of mistakes run on
    an exercise's cases at its first failure): left out here as nbgrader's
    start-up is.  ``first`` is c(n), from :func:`bench_ours`.
    """
    _, two, _ = grade_class(2 * n, jobs, meter)
    per = (two - first) / n
    print(f"  per further submission: {per:.2f} core-s ((c({2 * n}) - c({n})) / {n}); "
          f"fixed cost of a run: {first - n * per:.1f} core-s")
    return per


def grade_class(n: int, jobs: int, meter: CpuMeter) -> tuple[float, float, bool]:
    """Wall time and core-seconds of grading a class of n (measured: True, or estimated as wall x jobs)."""
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
        return wall, total, cpu is not None


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
        return wall * workers / n


def bench_nbgrader(k: int, meter: CpuMeter) -> tuple[float, bool]:
    """Core-seconds of one ``nbgrader autograde`` run on k submissions (measured: True, or its wall time)."""
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ATTN_UNCONFINED_AUTOGRADE="1")  # our own notebooks
    with tempfile.TemporaryDirectory() as tmp:
        course = Path(tmp)
        shutil.copyfile(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
        shutil.copytree(ROOT / "solutions" / "ch03", course / "solutions" / "ch03")
        subprocess.run([f"{bin_dir}/nbgrader", "generate_assignment", "ch03", "--force"], cwd=course, env=env,
                       check=True, capture_output=True)
        sol = json.loads((course / "solutions/ch03/ch03.ipynb").read_text())
        rel = json.loads((course / "exercises/ch03/ch03.ipynb").read_text())
        by_id = {c["metadata"]["nbgrader"]["grade_id"]: c for c in sol["cells"]}
        for c in rel["cells"]:
            gid = c["metadata"]["nbgrader"]["grade_id"]
            if gid.endswith("-answer"):
                c["source"] = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION\n", "", "".join(by_id[gid]["source"]), flags=re.M)
        for s in range(k):
            d = course / "grading" / "submitted" / f"s{s}" / "ch03"
            d.mkdir(parents=True)
            (d / "ch03.ipynb").write_text(json.dumps(rel))
        meter.start()
        t = time.perf_counter()
        subprocess.run([f"{bin_dir}/nbgrader", "autograde", "ch03", "--create"], cwd=course, env=env,
                       check=True, capture_output=True)
        wall = time.perf_counter() - t
        cpu = meter.seconds()
        total = cpu if cpu is not None else wall
        how = "CPU time measured" if cpu is not None else "estimated as its wall time"
        print(f"nbgrader autograde: {k} submissions of ch03.ipynb, one at a time: wall {wall:.1f} s, "
              f"{total:.1f} core-s ({how}); {total / k:.2f} core-s per submission")
        return total, cpu is not None


def nbgrader_per_submission(k: int, meter: CpuMeter) -> tuple[float, bool]:
    """nbgrader's cost of one more submission: runs on k and 2k submissions, (c(2k) - c(k)) / k.

    nbgrader starts its application, database and first kernel once per
    run (several core-seconds), as this grader computes its expected values
    and starts its workers once per class; both are left out, so the ratio
    compares what each further submission costs (in a class of thousands,
    all there is).
    """
    one, m1 = bench_nbgrader(k, meter)
    two, m2 = bench_nbgrader(2 * k, meter)
    per = (two - one) / k
    print(f"  nbgrader per further submission: {per:.2f} core-s ((c({2 * k}) - c({k})) / {k}); "
          f"its fixed cost per run: {one - k * per:.1f} core-s")
    return per, m1 and m2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--nb", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--dask", action="store_true", help="also grade on a LocalCluster of 1 and 2 workers")
    ap.add_argument("--no-nbgrader", action="store_true", help="skip nbgrader autograde")
    a = ap.parse_args()
    meter = CpuMeter()
    try:
        wall, ours, ours_measured = bench_ours(a.n, a.jobs, meter)
        ours = ours_per_further_submission(a.n, a.jobs, meter, ours * a.n)
        if a.dask:
            for workers in (1, 2):
                bench_dask(a.n, workers)
        budget = 30.0 * a.n / 100
        print(f"target: {a.n} within {budget:g} s -> {'met' if wall <= budget else 'NOT met'} ({wall:.1f} s)")
        if a.no_nbgrader:
            return
        theirs, theirs_measured = nbgrader_per_submission(a.nb, meter)
    finally:
        meter.close()
    ratio = theirs / ours
    basis = "measured CPU time" if ours_measured and theirs_measured else "estimates"
    print(f"ratio nbgrader/attn-course per further submission: {ratio:.1f}x, on {basis} "
          f"(target >= 10x -> {'met' if ratio >= 10 else 'NOT met'})")


if __name__ == "__main__":
    main()
