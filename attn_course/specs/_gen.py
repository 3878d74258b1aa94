"""Input generators and probes shared by the chapter specs.

Generators take a ``numpy.random.Generator`` and return NumPy arrays (float64
unless a case asks for float32).  Probes run inside the worker on the
student's function and return named arrays; the trusted side runs the same
probe on the reference.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


def normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return scale * rng.standard_normal(shape)


def mask(rng: np.random.Generator, *shape: int, p: float = 0.7, dead_row: bool = True) -> np.ndarray:
    """A boolean "may attend" mask; with ``dead_row`` the first row is fully masked."""
    m = rng.random(shape) < p
    m[..., :, 0] |= ~m.any(axis=-1)  # every row but the dead one keeps a key
    if dead_row:
        m[(0,) * (len(shape) - 1)] = False
    return m


def spd(rng: np.random.Generator, d: int) -> np.ndarray:
    """A well-conditioned symmetric positive-definite d x d matrix."""
    B = rng.standard_normal((d, d))
    return B @ B.T / d + np.eye(d)


def sizes(rng: np.random.Generator, hidden: bool, public: tuple, low: int = 2, high: int = 7) -> tuple:
    """The public sizes, or (fixed) other sizes for hidden cases: each one larger.

    Fixed, not random: every new shape costs XLA compilations in every
    worker, and the hidden values (drawn from the secret) are what a
    submission cannot know.
    """
    if not hidden:
        return public
    return tuple(int(p) + 1 for p in public)


def np_softmax(S: np.ndarray, m: np.ndarray | None = None, T: float = 1.0) -> np.ndarray:
    """NumPy softmax over the last axis, for building inputs (weights A); dead rows give 0."""
    s = S / T
    if m is not None:
        s = np.where(m, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    z = e.sum(axis=-1, keepdims=True)
    return e / np.where(z > 0, z, 1.0)


def finite_sum(x):
    """L = sum_n w_n x_n over the finite entries, with fixed weights w_n = cos(n + 1).

    Weighted, so that a softmax output (whose rows sum to one) still has a
    non-zero gradient; infinite entries (dead rows) are left out.
    """
    import jax.numpy as jnp

    w = jnp.cos(1.0 + jnp.arange(x.size, dtype=x.dtype)).reshape(x.shape)
    return jnp.sum(jnp.where(jnp.isfinite(x), x, 0.0) * w)


def with_grad(arg: str, loss: Callable[[Any], Any] = finite_sum, name: str = "value") -> Callable:
    """A probe returning the value and ``jax.grad`` of ``loss(value)`` wrt input ``arg``.

    The gradient checks what the exercises ask of autodiff: no nan at dead
    rows or zero weights, and the right derivative elsewhere.
    """

    def probe(fn, **inputs):
        import jax

        def f(x):
            return fn(**{**inputs, arg: x})

        value = f(inputs[arg])
        grad = jax.grad(lambda x: loss(f(x)))(inputs[arg])
        return {name: value, f"d/d{arg}": grad}

    return probe
