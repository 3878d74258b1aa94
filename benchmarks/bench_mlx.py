"""MLX (CPU) vs JAX (CPU) on the core attention, the fused kernels and flash attention.

Run:  .venv/bin/python benchmarks/bench_mlx.py   (about a minute on 2 cores)

Same library functions, same float32 inputs, batch x heads = 1 x 4, d = 64:

* ``scaled_dot_product_attention``: the reference (forms S and A).  JAX runs
  it under ``jax.jit``; MLX runs it eagerly (MLX is lazy and evaluates the
  graph at ``mx.eval``) and under ``mx.compile``.
* ``fast_attention``: ``jax.nn.dot_product_attention`` under ``jax.jit`` vs
  ``mx.fast.scaled_dot_product_attention`` under ``mx.compile``.
* ``flash_attention``: the blockwise algorithm (default blocks); on MLX the
  block loops are unrolled Python loops inside ``mx.compile``.

Times are the best of 3 samples, each the mean of enough calls to last
~50 ms.  MLX on Linux runs on its CPU backend only (no Metal here), so this
compares two CPU backends, not Apple silicon; in this environment MLX's CPU
matmul and exp are one to two orders of magnitude slower than XLA's, which
dominates every row (sizes are kept small so the script ends in ~2 minutes).
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from attn_tensors import scaled_dot_product_attention  # noqa: E402
from attn_tensors.flash import fast_attention, flash_attention  # noqa: E402

H, D = 4, 64
SIZES = [256, 512, 1024]


def best_time(run, repeats: int = 3) -> float:
    """``run()`` must block until its result exists."""
    t0 = time.perf_counter()
    run()
    inner = max(1, int(0.05 / max(time.perf_counter() - t0, 1e-6)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            run()
        times.append((time.perf_counter() - t0) / inner)
    return min(times)


def jax_runner(f, args):
    f = jax.jit(f)
    f(*args).block_until_ready()  # compile
    return lambda: f(*args).block_until_ready()


def mlx_runner(f, args, compile_: bool):
    if compile_:
        f = mx.compile(f)
    mx.eval(f(*args))  # compile / warm up
    return lambda: mx.eval(f(*args))


def main() -> None:
    t_start = time.perf_counter()
    print(f"JAX {jax.__version__} vs MLX {mx.__version__} (device {mx.default_device()}), "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"float32, batch x heads = 1 x {H}, d = {D}; times in ms\n")
    header = (f"{'n':>5}  {'function':<30} {'JAX jit':>9} {'MLX eager':>10} "
              f"{'MLX compile':>12}   MLX/JAX (best MLX)")
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    for n in SIZES:
        x = [rng.standard_normal((1, H, n, D)).astype(np.float32) for _ in range(3)]
        xj = [jnp.asarray(a) for a in x]
        xm = [mx.array(a) for a in x]
        # the reference checks its inputs for NaN eagerly; that is part of its cost
        cases = [
            ("scaled_dot_product_attention", scaled_dot_product_attention, True),
            ("fast_attention", fast_attention, False),
            ("flash_attention", flash_attention, False),
        ]
        for name, f, eager_too in cases:
            tj = best_time(jax_runner(f, xj))
            # fast_attention and flash_attention compile internally already
            tc = best_time(mlx_runner(f, xm, compile_=eager_too))
            te = best_time(mlx_runner(f, xm, compile_=False)) if eager_too else float("nan")
            best_m = np.nanmin([te, tc])
            eager = f"{1e3 * te:10.2f}" if eager_too else f"{'-':>10}"
            print(f"{n:>5}  {name:<30} {1e3 * tj:9.2f} {eager} {1e3 * tc:12.2f}"
                  f"   {best_m / tj:6.2f}")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
