"""Part VIII: storage capacity of classical and modern Hopfield networks.

Prints three tables:

1. Classical network, N = 256 neurons, M = alpha N random +-1 patterns
   (Hebbian weights, zero diagonal): the fraction of patterns that are exact
   fixed points, the fraction retrieved with < 1% wrong bits after
   asynchronous sweeps started at the pattern, and the mean final overlap;
   the loads where both fractions cross 1/2 (linear interpolation).
2. Modern network (Ramsauer et al. 2020), d = 32, patterns on the unit
   sphere, noisy queries: the retrieval success for M from d/8 to 512 d.
3. The same memory at M = 4096 for several inverse temperatures beta.

Run:  .venv/bin/python benchmarks/hopfield_capacity.py   (about 20 s of CPU)
"""

from __future__ import annotations

import time

import numpy as np

from attn_tensors.hopfield import classical_capacity_curve, modern_capacity_curve


def classical_table(N: int = 256, trials: int = 20, seed: int = 0) -> None:
    loads = np.round(np.arange(0.04, 0.261, 0.02), 3)
    r = classical_capacity_curve(N, loads, trials, seed, steps=8)
    print(f"Classical Hopfield network: N = {N}, {trials} networks per load, "
          "Hebbian W (W_ii = 0), 8 asynchronous sweeps")
    print(f"{'alpha=M/N':>10} {'M':>4} {'fixed point':>12} {'<1% errors':>11} "
          f"{'overlap m':>10}")
    for a, M, f, rt, m in zip(r["loads"], r["M"], r["fixed"], r["retrieved"], r["overlap"]):
        print(f"{a:10.2f} {M:4d} {f:12.3f} {rt:11.3f} {m:10.3f}")
    print(f"50% crossing, exact fixed points:  alpha = {r['alpha_50_fixed']:.3f}")
    print(f"50% crossing, <1% bit errors:      alpha = {r['alpha_50_retrieved']:.3f}")
    print("(mean-field limit N -> inf: alpha_c = 0.138, Amit-Gutfreund-Sompolinsky)")


def modern_table(d: int = 32, beta: float = 64.0, noise: float = 0.8, seed: int = 0) -> None:
    Ms = [4, 32, 320, 1024, 4096, 16384]
    r = modern_capacity_curve(d, Ms, beta, noise, trials=4, seed=seed, steps=3)
    print(f"Modern Hopfield network: d = {d}, beta = {beta:g}, unit-norm patterns, "
          f"query = pattern + noise of norm ~{noise:g}, 3 updates, 4 memories x 64 queries")
    print(f"{'M':>6} {'M/d':>6} {'success':>8} {'query nearest':>14} {'|xi_T - x|':>11}")
    for M, load, s, q, e in zip(r["M"], r["load"], r["success"], r["query_nearest"], r["error"]):
        print(f"{M:6d} {load:6.1f} {s:8.3f} {q:14.3f} {e:11.2e}")
    print("('query nearest': fraction of noisy queries still closest to their own "
          "pattern, the ceiling for any retrieval)")


def beta_table(d: int = 32, M: int = 4096, noise: float = 0.8, seed: int = 1) -> None:
    print(f"Modern Hopfield network: d = {d}, M = {M} (M/d = {M // d}), inverse temperature sweep")
    print(f"{'beta':>6} {'success':>8} {'query nearest':>14} {'|xi_T - x|':>11}")
    for beta in (4.0, 8.0, 16.0, 32.0, 64.0, 128.0):
        r = modern_capacity_curve(d, [M], beta, noise, trials=2, seed=seed, steps=3)
        print(f"{beta:6g} {r['success'][0]:8.3f} {r['query_nearest'][0]:14.3f} "
              f"{r['error'][0]:11.2e}")


def main() -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    classical_table()
    print()
    modern_table()
    print()
    beta_table()
    print(f"\n[{time.perf_counter() - wall:.1f} s wall, {time.process_time() - cpu:.1f} s CPU]")


if __name__ == "__main__":
    main()
