"""Flash attention vs naive attention on JAX CPU: peak memory and forward time.

Run:  .venv/bin/python benchmarks/bench_flash.py   (about two minutes on 2 cores)

1. Memory, two honest measures (d = 64, float32, one head):
   * XLA's compiled memory analysis, ``temp_size_in_bytes``: the scratch
     buffers the compiled program allocates (inputs and outputs excluded),
     for the forward pass and for forward + backward (``jax.grad``).
     Nothing is run, so the naive n = 16384 case costs only a compile.
   * Peak RSS of a fresh subprocess that runs the forward once: the kernel's
     high-water mark is reset (``/proc/self/clear_refs``) after the inputs
     exist and the program is compiled, so the figure is the first run's
     peak above the resident size just before it.  A first run also pays
     one-off runtime allocations (thread pool, code): the column "trivial"
     (the O(n d) program q * k + v) shows that floor.  (A second run is no
     better a measure: the allocator then reuses memory it kept.)
2. Forward time at n = 4096 of flash (a few block sizes), of
   ``jax.nn.dot_product_attention`` and of the library's reference
   ``scaled_dot_product_attention``, all under ``jax.jit``; the best of
   several repeats is reported (the machine may be shared).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from attn_tensors import scaled_dot_product_attention  # noqa: E402
from attn_tensors.flash import BLOCK_K, BLOCK_Q, flash_attention  # noqa: E402

D = 64
SIZES = [4096, 8192, 16384]
MiB = 2.0**20


def jax_nn(q, k, v):
    # jax.nn.dot_product_attention wants (batch, n, heads, d)
    q, k, v = (x[None, :, None] for x in (q, k, v))
    return jax.nn.dot_product_attention(q, k, v)[0, :, 0]


METHODS = {
    "flash": lambda q, k, v: flash_attention(q, k, v),
    "naive": lambda q, k, v: scaled_dot_product_attention(q, k, v),
    "jax.nn": jax_nn,
}


def temp_mib(f, n: int, grad: bool) -> float:
    s = jax.ShapeDtypeStruct((n, D), jnp.float32)
    if grad:
        f = jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v)), argnums=(0, 1, 2))
    return jax.jit(f).lower(s, s, s).compile().memory_analysis().temp_size_in_bytes / MiB


RSS_CHILD = r"""
import resource, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, {root!r})
from attn_tensors import scaled_dot_product_attention
from attn_tensors.flash import flash_attention
n, d, method = {n}, {d}, {method!r}
f = dict(flash=flash_attention, naive=scaled_dot_product_attention,
         trivial=lambda q, k, v: q * k + v)[method]
rng = np.random.default_rng(0)
q, k, v = (jnp.asarray(rng.standard_normal((n, d)), jnp.float32) for _ in range(3))
c = jax.jit(f).lower(q, k, v).compile()
resident = int(open("/proc/self/statm").read().split()[1]) * 4096
open("/proc/self/clear_refs", "w").write("5")  # reset the peak-RSS mark
c(q, k, v).block_until_ready()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print((peak - resident) / 2**20)
"""


def rss_mib(method: str, n: int) -> float:
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    code = RSS_CHILD.format(root=root, n=n, d=D, method=method)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def best_time(f, args, repeats: int = 7) -> float:
    f(*args).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(*args).block_until_ready()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    t_start = time.perf_counter()
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform.upper()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; d={D}, float32")
    print(f"flash default blocks: block_q={BLOCK_Q}, block_k={BLOCK_K}\n")

    print("1a. XLA compiled temporaries (MiB), forward | forward+backward")
    print(f"{'n':>6} " + " ".join(f"{m:>19}" for m in METHODS) + "   naive/flash")
    fwd = {}
    for n in SIZES:
        row = {m: (temp_mib(f, n, False), temp_mib(f, n, True)) for m, f in METHODS.items()}
        fwd[n] = row
        cells = " ".join(f"{a:8.1f} | {b:8.1f}" for a, b in row.values())
        ratio = row["naive"][0] / row["flash"][0], row["naive"][1] / row["flash"][1]
        print(f"{n:>6} {cells}   {ratio[0]:5.0f}x | {ratio[1]:4.0f}x")
    g = [fwd[n]["flash"][0] for n in SIZES]
    print("flash forward growth per doubling of n: "
          + ", ".join(f"{b / a:.2f}x" for a, b in zip(g, g[1:]))
          + "  (naive: 4x, quadratic)\n")

    print("1b. Peak RSS of one forward run above the resident size (MiB)")
    print(f"{'n':>6} {'trivial':>9} {'flash':>9} {'naive':>9}   naive/flash")
    for n in SIZES:
        t, f, nv = (rss_mib(m, n) for m in ("trivial", "flash", "naive"))
        print(f"{n:>6} {t:9.1f} {f:9.1f} {nv:9.1f}   {nv / max(f, 1e-9):8.0f}x")
    print("flash stays at the first-run floor of the runtime (column 'trivial');")
    print("naive grows 4x per doubling (one n x n float32 matrix: 64, 256, 1024 MiB).\n")

    n = 4096
    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.standard_normal((n, D)), jnp.float32) for _ in range(3)]
    print(f"2. Forward time at n={n} (best of 7, ms)")
    t_ref = best_time(jax.jit(jax_nn), args)
    print(f"   jax.nn.dot_product_attention          {1e3 * t_ref:8.1f}")
    t_naive = best_time(jax.jit(METHODS["naive"]), args)
    print(f"   scaled_dot_product_attention (naive)  {1e3 * t_naive:8.1f}")
    for bq, bk in [(128, 128), (256, 256), (BLOCK_Q, BLOCK_K), (512, 1024), (1024, 1024)]:
        f = jax.jit(lambda q, k, v, bq=bq, bk=bk: flash_attention(q, k, v, block_q=bq, block_k=bk))
        t = best_time(f, args)
        tag = "  (default)" if (bq, bk) == (BLOCK_Q, BLOCK_K) else ""
        print(f"   flash block_q={bq:<4} block_k={bk:<4}      {1e3 * t:8.1f}"
              f"   flash/jax.nn = {t / t_ref:.2f}{tag}")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
