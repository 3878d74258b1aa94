"""Linear attention scales linearly in n; softmax attention quadratically (JAX CPU).

Run:  .venv/bin/python benchmarks/bench_linear.py   (under a minute on 2 cores)

For each n the forward pass is timed under ``jax.jit`` (best of 15 samples,
each the mean of enough calls to last ~0.1 s; d_k = d_v = 64, float32, one
head) and the ratio t(2n)/t(n) is printed: about 2 for linear attention (elu+1 features, and the Performer's
positive random features with m = 64), about 4 for softmax attention once
the n x n work dominates.  Small n is dominated by fixed per-call costs, so
ratios there are below the asymptotic value; the fitted exponent p of
t ~ n^p over all sizes summarises each sweep.  An elementwise O(n d)
baseline shows the machine's own curve: where inputs outgrow the caches
(each (n, 64) float32 array is 4 MiB at n = 16384, the size of L2 here) even
linear work steps up, more so on a shared, loaded machine.
"""

from __future__ import annotations

import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from attn_tensors import scaled_dot_product_attention  # noqa: E402
from attn_tensors.kernel import (  # noqa: E402
    draw_random_features,
    elu_plus_one,
    linear_attention,
    positive_random_features,
)

D = 64
SIZES = [2048, 4096, 8192, 16384, 32768]
SOFTMAX_SIZES = [1024, 2048, 4096, 8192]


def best_time(f, args, repeats: int = 15) -> float:
    """Best over ``repeats`` samples; each sample averages enough calls to last ~0.1 s."""
    t0 = time.perf_counter()
    f(*args).block_until_ready()
    inner = max(1, int(0.1 / max(time.perf_counter() - t0, 1e-6)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = f(*args)
        out.block_until_ready()
        times.append((time.perf_counter() - t0) / inner)
    return min(times)


def sweep(name: str, f, sizes, repeats: int = 15) -> None:
    rng = np.random.default_rng(0)
    f = jax.jit(f)
    times = []
    for n in sizes:
        args = [jnp.asarray(rng.standard_normal((n, D)), jnp.float32) for _ in range(3)]
        f(*args).block_until_ready()  # compile
        times.append(best_time(f, args, repeats))
    print(f"{name}")
    print("  " + "  ".join(f"n={n:<6} {1e3 * t:7.2f} ms" for n, t in zip(sizes, times)))
    ratios = [b / a for a, b in zip(times, times[1:])]
    print("  t(2n)/t(n): " + ", ".join(f"{r:.2f}" for r in ratios))
    # least-squares slope of log t against log n: 1 linear, 2 quadratic
    slope = np.polyfit(np.log(sizes), np.log(times), 1)[0]
    print(f"  fitted exponent t ~ n^p: p = {slope:.2f}")


def main() -> None:
    t_start = time.perf_counter()
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform.upper()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"d={D}, float32\n")
    omega = draw_random_features(0, 64, D, dtype=jnp.float32)
    favor = functools.partial(positive_random_features, omega=omega)
    sweep("linear attention, elu+1", lambda q, k, v: linear_attention(q, k, v, elu_plus_one),
          SIZES)
    sweep("linear attention, FAVOR+ (m=64)", lambda q, k, v: linear_attention(q, k, v, favor),
          SIZES)
    sweep("causal linear attention, elu+1 (scan over chunks of 64)",
          lambda q, k, v: linear_attention(q, k, v, elu_plus_one, causal=True), SIZES)
    sweep("baseline: elementwise q * k + v (O(n d), memory-bound), for the machine's own curve",
          lambda q, k, v: q * k + v, SIZES)
    sweep("softmax attention (scaled_dot_product_attention), for contrast",
          scaled_dot_product_attention, SOFTMAX_SIZES, repeats=3)
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
