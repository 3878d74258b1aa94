"""The CPU time of one job's child, as a worker server forks it; paired against a variant.

A job's child is nearly all of what an archive costs (issue 14), and the
figures of a whole grading run move by 10-40% from hour to hour on a shared
machine: a change of a few percent in the child is lost in them.  This
measures the child alone, in pairs: a parent that imports JAX and the course,
loads the reference package and warms JAX's caches on the job's shapes (as a
worker server's template does) forks children that each run the chapter's
hidden cases as one job (``worker.evaluate_job``, the reference's program
read from a workers' cache that a trusted child filled first), and reads each
child's CPU time.  With ``--variant CODE``, every other child runs ``CODE``
first (in the child, with ``jax``, ``gc`` and ``worker`` in scope), in
alternating order, and the median of the pairs' ratios is printed: about
+-3% apart on this machine for two identical sides (``--variant pass``).

    python benchmarks/bench_job.py [--chapter 3] [--pairs 30] [--variant "gc.disable()"]

It prints the medians of both sides and, with a variant, the paired ratio;
a child that missed the cache (its program compiled) is an error: the
figure would be another one.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ["JAX_PLATFORMS"] = "cpu"
HIT = "/jax/compilation_cache/cache_hits"


def _child(job, functions, variant: str | None) -> tuple[float, bool]:
    """Fork one child that runs the job; its CPU seconds and whether it read its program from the cache."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            import jax

            from attn_course import worker

            seen: list[str] = []
            jax.monitoring.register_event_listener(lambda name, **kw: seen.append(name))
            start = time.process_time()
            if variant:
                exec(variant, {"jax": jax, "gc": gc, "worker": worker})  # noqa: S102 - the benchmark's own argument
            worker.evaluate_job(job, functions)
            os.write(w, f"{time.process_time() - start:.6f} {int(HIT in seen)}".encode())
        finally:
            os._exit(0)
    os.close(w)
    data = os.read(r, 100)
    os.close(r)
    os.waitpid(pid, 0)
    cpu, hit = data.split()
    return float(cpu), hit == b"1"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapter", default="3")
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--variant", default=None, help="code a variant's child runs first")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-job-"))
    os.environ["XDG_CACHE_HOME"] = str(tmp)  # a workers' cache of this run's own
    try:
        from attn_course import values, warm, worker
        from attn_course.registry import select
        from attn_course.xla_cache import compile_cache, worker_cache_dir, worker_keys

        exercises = select(args.chapter)
        items = [(e, e.make_cases(True, secret="bench-job")) for e in exercises]
        job = [worker.JobItem(e.id, e.probe, [values.decode(values.encode(c.inputs)) for c in cases],
                              [c.eager for c in cases]) for e, cases in items]
        functions = {e.id: e.function for e in exercises}

        def reference(ex_id):
            return worker.as_graded(worker.resolve(functions[ex_id])), None

        pid = os.fork()  # the trusted side fills the workers' cache (its backend must not start here)
        if pid == 0:  # pragma: no cover - the child
            try:
                import jax

                jax.config.update("jax_enable_x64", True)
                from attn_course.inline_where import inline_where

                inline_where()
                with compile_cache(worker_cache_dir()), worker_keys():
                    worker.evaluate_job(job, reference)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

        os.environ["ATTN_COURSE_CACHE"] = str(worker_cache_dir())
        worker._setup_jax()
        package = tmp / "package"
        shutil.copytree(ROOT / "attn_tensors", package / "attn_tensors", ignore=shutil.ignore_patterns("__pycache__"))
        worker.load_package(package)
        warm.warm(warm.case_avals({"exercises": [{"cases": [{"inputs": values.encode(c.inputs)} for c in cases]}
                                                 for _, cases in items]}), set())
        gc.collect()
        gc.freeze()

        sides: dict[str, list[float]] = {"base": [], "variant": []}
        for k in range(args.pairs):
            order = ("base", "variant") if k % 2 == 0 else ("variant", "base")
            for side in order if args.variant is not None else ("base",):
                cpu, hit = _child(job, reference, args.variant if side == "variant" else None)
                if not hit:
                    print(f"a {side} child compiled its program (not in the workers' cache): no figure")
                    return 1
                sides[side].append(cpu)
        base = sides["base"]
        print(f"chapter {args.chapter}: {len(items)} exercises, {sum(len(c) for _, c in items)} hidden cases; "
              f"a job's child, {len(base)} children: median {statistics.median(base):.3f} CPU-s "
              f"(quartiles {statistics.quantiles(base, n=4)[0]:.3f}-{statistics.quantiles(base, n=4)[2]:.3f})")
        if args.variant is not None:
            var = sides["variant"]
            ratios = [v / b for v, b in zip(var, base)]
            print(f"variant {args.variant!r}: median {statistics.median(var):.3f} CPU-s; "
                  f"paired ratio variant/base: median {statistics.median(ratios):.3f} "
                  f"(quartiles {statistics.quantiles(ratios, n=4)[0]:.3f}-{statistics.quantiles(ratios, n=4)[2]:.3f})")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
