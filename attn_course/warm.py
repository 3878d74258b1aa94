"""Warm JAX's tracing caches in a worker server, so that each job's fork starts warm.

Most of a job's time is JAX tracing, and most of that is not the student's
code but ``jax.numpy``'s own jitted helpers (``where``, reductions, the
arithmetic ufuncs, their linearisation rules), traced afresh for each shape
in every forked child.  The server traces a battery of such operations on
the abstract shapes of the cases it has served (``jax.make_jaxpr`` on
``ShapeDtypeStruct`` s: nothing runs, no data is read, no XLA backend
starts, so forking stays safe), and every later child inherits the traces.

Nothing here comes from a submission or from the reference: only shapes of
the case inputs, which every job receives anyway.  The battery also covers
the shapes that attention code derives from the cases' (a row reduced or
kept) and its uses of Python numbers: a chapter-3 child of the reference's
code then traces none of ``jax.numpy``'s helpers afresh.  Measured on
chapter 3 (the reference's code, 60 children each): a child's job took
0.63-0.69 CPU-s cold (median), 0.48 after the battery without the derived
shapes and 0.45 with them; warming its 8 shapes takes 1.9 CPU-s (1.25 without).
"""

from __future__ import annotations

from typing import Any, Iterable

Aval = tuple[tuple[int, ...], str]

# the dtypes the battery is traced for (the cases' arrays; masks are bool)
FLOATS = ("float64", "float32")


def case_avals(job: dict) -> set[Aval]:
    """(shape, dtype) of every floating-point array among a job's case inputs (encoded, not decoded)."""
    found: set[Aval] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            if "__array__" in obj:
                shape = obj.get("shape")
                if (obj["__array__"] in FLOATS and isinstance(shape, list) and 0 < len(shape) <= 6
                        and all(isinstance(n, int) and 0 < n <= 4096 for n in shape)):
                    found.add((tuple(shape), obj["__array__"]))
                return
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    items = job.get("exercises") if isinstance(job, dict) else None
    for item in items if isinstance(items, list) else []:
        cases = item.get("cases") if isinstance(item, dict) else None
        for case in cases if isinstance(cases, list) else []:
            if isinstance(case, dict):
                walk(case.get("inputs"))
    return found


def _battery(x, mask):
    """Operations a student's attention code uses on an array of this shape (and its gradient)."""
    import jax
    import jax.numpy as jnp

    out = []
    for ax in (-1, -2) if x.ndim >= 2 else (-1,):
        for keep in (True, False):
            out += [jnp.max(x, axis=ax, keepdims=keep), jnp.sum(x, axis=ax, keepdims=keep),
                    jnp.min(x, axis=ax, keepdims=keep)]
    m = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m))
    e = jnp.exp(x / 2.0 - m)
    z = jnp.sum(e, axis=-1, keepdims=True)
    alive = z > 0
    z_safe = jnp.where(alive, z, jnp.ones_like(z))
    out += [e / z_safe, jnp.where(alive, jnp.log(z_safe) + m, -jnp.inf), x * 2.0, x - 1.0, x * x,
            x / x, -x, jnp.abs(x), jnp.log(x), jnp.exp(x), jnp.sqrt(jnp.abs(x)),
            jnp.where(mask, x, -jnp.inf), jnp.where(mask, x, jnp.zeros_like(x))]
    if x.ndim >= 2:
        out.append(jnp.swapaxes(x, -1, -2))
    out += _derived(x, mask, m)
    return sum(jnp.sum(o) for o in out)


def _derived(x, mask, m):
    """The operations that attention code applies to shapes it derives from ``x`` -- a row
    reduced (``r``, no key axis) or kept (``m``, keepdims) -- and with Python numbers (weakly
    typed scalars) or 0-d arrays, as masks, maxima and dead-row guards use them."""
    import jax.numpy as jnp

    r = jnp.sum(x, axis=-1)
    zero = jnp.asarray(0.0, dtype=x.dtype)  # a 0-d array, not a Python number (xp.scalar)
    out = [jnp.where(x > 0, x, 0.0), jnp.where(mask, x, zero), x > 0.0, jnp.logical_and(mask, x > 0),
           jnp.logical_and(mask, mask[..., :1]), x == m, x - m, (x == m).astype(x.dtype)]
    for y in (m, r):
        live = jnp.isfinite(y)
        out += [jnp.where(live, y, 0.0), jnp.where(live, y, zero), jnp.where(y > 0, y, jnp.ones_like(y)),
                y > 0.0, y * y, 2.0 * y, y * 2.0, y + 1.0, y - y, -y]
    return out


def warm(avals: Iterable[Aval], done: set[Aval]) -> int:
    """Trace the battery (value and gradient) for each shape not in ``done``; returns how many.

    Never raises: a warm-up is an optimisation only.
    """
    import jax

    n = 0
    for shape, dtype in sorted(set(avals) - done):
        done.add((shape, dtype))
        try:
            x = jax.ShapeDtypeStruct(shape, dtype)
            mask = jax.ShapeDtypeStruct(shape, "bool")
            jax.make_jaxpr(_battery)(x, mask)
            jax.make_jaxpr(jax.grad(_battery))(x, mask)
            n += 1
        except Exception:  # noqa: BLE001 - e.g. a shape the battery cannot take
            continue
    return n


def prime() -> None:
    """Once, in the server: the start-up work every child would otherwise repeat.

    JAX's search for PJRT plugins (it reads every installed package's entry
    points: about 25 ms when a backend first starts) and the MLIR modules it
    imports at its first lowering.  Neither starts a backend, so forking
    stays safe.  Never raises: an optimisation only (another JAX layout).
    """
    try:
        import jaxlib.mlir.dialects.builtin  # noqa: F401
        import jaxlib.mlir.dialects.mhlo  # noqa: F401
        import jaxlib.mlir.extras.meta  # noqa: F401
        from jax._src import xla_bridge
        from jax._src.interpreters import mlir

        mlir.make_ir_context()
        xla_bridge._discover_and_register_pjrt_plugins()
    except Exception:  # noqa: BLE001
        pass


def backend_started() -> bool:
    """True once an XLA backend exists in this process (a server must then not fork again)."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - another JAX layout: assume the worst
        return True
    backends = getattr(xla_bridge, "_backends", None)
    return backends is None or bool(backends)  # unknown counts as started
