"""Part V benchmark: the manual backward pass against the framework's autodiff.

    float32, n_q = n_k = n (1024), d_k = d_v = 64, one head, no mask.

JAX (both jitted, compiled before timing):
  (a) manual    O and dL/dQ, dL/dK, dL/dV from attention_forward_backward:
                one forward pass whose weights A^{ij} the Part V formulas reuse
  (b) autodiff  O and the same gradients from jax.vjp of
                scaled_dot_product_attention, pulled back with the same dL/dO
MLX (CPU stream): the same pair, with mx.vjp for (b), eager and mx.compile'd.

Prints best-of and median times in ms, the ratio manual/autodiff (target
<= 1.1) and the largest absolute difference between the two sets of
gradients.  Run with ``python benchmarks/bench_backward.py`` (about half a
minute on two cores); ``--n``/``--repeats`` change the size and the count.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from attn_tensors.attention import scaled_dot_product_attention
from attn_tensors.backend import mlx_available
from attn_tensors.gradients import attention_forward_backward


def timings(fns, args, repeats, block):
    """Compile/warm up each function, then time them interleaved (one call of
    each per round, so background load hits all alike).

    Returns, per function, (wall-clock ms per call, process CPU ms per call).
    CPU time (summed over threads) counts the work done and is the steadier
    figure on a shared machine; wall time is what a user waits."""
    for f in fns:
        block(f(*args))
    wall = [[] for _ in fns]
    cpu = [[] for _ in fns]
    for _ in range(repeats):
        for f, w, c in zip(fns, wall, cpu):
            c0, t0 = time.process_time(), time.perf_counter()
            block(f(*args))
            w.append((time.perf_counter() - t0) * 1e3)
            c.append((time.process_time() - c0) * 1e3)
    return list(zip(wall, cpu))


def max_abs_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


def line(label, t):
    wall, cpu = t
    return (f"    {label:<36}: wall best {min(wall):7.2f} median "
            f"{statistics.median(wall):7.2f} | cpu median {statistics.median(cpu):7.2f} ms")


def report(label, manual, auto, diff):
    med = statistics.median
    ratios = [m / a for m, a in zip(manual[0], auto[0])]
    print(f"  {label}")
    print(line("manual   (forward + Part V backward)", manual))
    print(line("autodiff (forward + vjp)", auto))
    print(f"    {'ratio manual/autodiff':<36}: wall best {min(manual[0]) / min(auto[0]):.3f}, "
          f"median of rounds {med(ratios):.3f} | cpu medians "
          f"{med(manual[1]) / med(auto[1]):.3f}")
    print(f"    {'max |grad_manual - grad_autodiff|':<36}: {diff:.3e}")


# -- JAX ---------------------------------------------------------------------


def manual_jax(Q, K, V, dO):
    O, g = attention_forward_backward(Q, K, V, dO)
    return O, g.dL_dQ, g.dL_dK, g.dL_dV


def autodiff_jax(Q, K, V, dO):
    O, pull = jax.vjp(scaled_dot_product_attention, Q, K, V)
    return (O, *pull(dO))


def manual_jax_all(Q, K, V, dO):
    """Also returns dL/dA, dL/dS and dL/dg (the n x n arrays leave the kernel)."""
    O, g = attention_forward_backward(Q, K, V, dO)
    return (O, *g)


def xla_cost(fn, args):
    """XLA's own count for the compiled function: (GFLOP, MB accessed).

    Independent of machine load, so it backs up the wall-clock ratio."""
    ca = jax.jit(fn).lower(*args).compile().cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return ca.get("flops", float("nan")) / 1e9, ca.get("bytes accessed", float("nan")) / 1e6


def bench_jax(arrays, repeats):
    args = [jnp.asarray(x) for x in arrays]
    block = jax.block_until_ready
    fm, fa, fall = jax.jit(manual_jax), jax.jit(autodiff_jax), jax.jit(manual_jax_all)
    m, a, full = timings([fm, fa, fall], args, repeats, block)
    diff = max_abs_diff(fm(*args)[1:], fa(*args)[1:])
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform}, jax.jit")
    report("O, dL/dQ, dL/dK, dL/dV", m, a, diff)
    print(line("manual, all six gradients returned", full))
    for label, f in (("manual", manual_jax), ("autodiff", autodiff_jax),
                     ("manual, all six", manual_jax_all)):
        gflop, mb = xla_cost(f, args)
        print(f"    XLA cost analysis, {label:<15}: {gflop:.4f} GFLOP, "
              f"{mb:6.1f} MB accessed")


# -- MLX ---------------------------------------------------------------------


def bench_mlx(arrays, repeats):
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    args = [mx.array(x) for x in arrays]

    def manual(Q, K, V, dO):
        O, g = attention_forward_backward(Q, K, V, dO)
        return [O, g.dL_dQ, g.dL_dK, g.dL_dV]

    def autodiff(Q, K, V, dO):
        f = lambda Q, K, V: [scaled_dot_product_attention(Q, K, V)]  # noqa: E731
        (O,), grads = mx.vjp(f, [Q, K, V], [dO])
        return [O, *grads]

    block = mx.eval
    print(f"MLX {mx.__version__} on {mx.default_device()}")
    for label, wrap in (("eager", lambda f: f), ("mx.compile", mx.compile)):
        fm, fa = wrap(manual), wrap(autodiff)
        m, a = timings([fm, fa], args, repeats, block)
        diff = max_abs_diff(fm(*args)[1:], fa(*args)[1:])
        report(f"{label}: O, dL/dQ, dL/dK, dL/dV", m, a, diff)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024, help="n_q = n_k")
    parser.add_argument("--d", type=int, default=64, help="d_k = d_v")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--mlx-repeats", type=int, default=5,
                        help="MLX on the CPU is slower: fewer repeats")
    parser.add_argument("--no-mlx", action="store_true")
    opts = parser.parse_args()

    rng = np.random.default_rng(0)
    n, d = opts.n, opts.d
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(n, d)] * 4]
    print(f"attention backward, float32, n_q = n_k = {n}, d_k = d_v = {d}; "
          f"timed repeats after a warm-up call: JAX {opts.repeats}, "
          f"MLX {opts.mlx_repeats}")
    bench_jax(arrays, opts.repeats)
    if mlx_available() and not opts.no_mlx:
        bench_mlx(arrays, opts.mlx_repeats)
    else:
        print("MLX not installed: skipped")


if __name__ == "__main__":
    main()
