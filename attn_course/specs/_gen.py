"""Input generators and probes shared by the chapter specs.

Generators take a ``numpy.random.Generator`` and return NumPy arrays (float64
unless a case asks for float32).  Probes run inside the worker on the
student's function and return named arrays; the trusted side runs the same
probe on the reference.

A probe is written once for both backends of a check (``--backend jax`` or
``mlx``): the worker hands it JAX or MLX arrays, and the probe takes its
array functions from :func:`xp` and its autodiff from :func:`grad`, which
follow the arrays they are given.  These are the course's own (not
:func:`attn_tensors.backend.namespace`): in a worker, ``attn_tensors`` is the
student's package, and a probe must not depend on what it contains.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import numpy as np

from ..values import NotPlainValue


_STAGING = threading.local()  # (this thread's: the trusted side computes reference values in other threads)


def _staging_now() -> bool:
    return getattr(_STAGING, "on", False)


@contextlib.contextmanager
def staging() -> Iterator[None]:
    """The probes' derivatives staged, not taken (in a job's process, :mod:`attn_course.replay`):
    each helper below traces the function with the arguments it would differentiate abstract,
    as ``jax.vjp`` has them, and returns zeros of the value's and the derivative's shapes; the
    derivative is taken where the trace is replayed, by a process that never ran the submission."""
    before = _staging_now()
    _STAGING.on = True
    try:
        yield
    finally:
        _STAGING.on = before


def _staged(f: Callable, args: tuple, argnums: int | tuple[int, ...]) -> tuple[Any, Any]:
    """``f(*args)``'s placeholder (zeros of its shapes, traced as ``f`` is) with ``args[argnums]``
    abstract, and placeholders of those arguments' derivatives."""
    import jax

    from ..replay import placeholder

    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    def inner(*diff: Any) -> Any:
        a = list(args)
        for i, d in zip(nums, diff):
            a[i] = d
        return f(*a)

    shape = jax.eval_shape(inner, *[args[i] for i in nums])
    value = jax.tree_util.tree_map(placeholder, shape)
    grads = tuple(jax.tree_util.tree_map(placeholder, jax.eval_shape(lambda x: x, args[i])) for i in nums)
    return value, grads[0] if isinstance(argnums, int) else grads


def _is_mlx(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "mlx"


def xp(*arrays: Any) -> Any:
    """The array module of the arrays (``mlx.core`` for MLX arrays, else ``jax.numpy``)."""
    if any(_is_mlx(a) for a in arrays):
        import mlx.core as mx

        return mx
    import jax.numpy as jnp

    return jnp


def asarray(value: Any, like: Any) -> Any:
    """``value`` as an array of ``like``'s backend and dtype."""
    if _is_mlx(like):
        import mlx.core as mx

        return mx.array(value, dtype=like.dtype)
    import jax.numpy as jnp

    return jnp.asarray(value, dtype=like.dtype)


def grad(f: Callable, argnums: int | tuple[int, ...] = 0) -> Callable:
    """``jax.grad(f, argnums)`` or ``mlx.core.grad(f, argnums)``, by the arguments' backend."""

    def g(*args: Any) -> Any:
        if any(_is_mlx(a) for a in args):
            import mlx.core as mx

            return mx.grad(f, argnums=argnums)(*args)
        import jax

        if _staging_now():
            return _staged(f, args, argnums)[1]

        return jax.grad(f, argnums=argnums)(*args)

    return g


def value_and_grad_aux(f: Callable, argnums: int | tuple[int, ...] = 0) -> Callable:
    """``(*args) -> (aux, df/dargs)`` for ``f(*args) = (loss, aux)``: value and gradient from one trace.

    ``jax.value_and_grad(f, argnums, has_aux=True)`` or MLX's ``value_and_grad``
    (which differentiates the first of the outputs), by the arguments'
    backend.  Tracing the function once for both, instead of once for the
    value and once more for the gradient, is most of a worker's time saved
    per case.
    """

    def g(*args: Any) -> Any:
        if any(_is_mlx(a) for a in args):
            import mlx.core as mx

            (_, aux), d = mx.value_and_grad(f, argnums=argnums)(*args)
            return aux, d
        import jax

        if _staging_now():
            (_, aux), d = _staged(f, args, argnums)
            return aux, d

        (_, aux), d = jax.value_and_grad(f, argnums=argnums, has_aux=True)(*args)
        return aux, d

    return g


def value_and_grads(f: Callable, x: Any, losses: list[Callable]) -> tuple[Any, list[Any]]:
    """``f(x)`` and, for each loss, the gradient of ``loss(f(x))`` with respect to ``x``.

    On JAX, ``f`` is linearised once and pulled back once per loss (the
    cotangent is the loss's gradient at ``f(x)``); on MLX (eager), one
    ``mx.grad`` per loss.
    """
    if _is_mlx(x):
        import mlx.core as mx

        return f(x), [mx.grad(lambda x, loss=loss: loss(f(x)))(x) for loss in losses]
    import jax

    if _staging_now():
        out, d = _staged(f, (x,), 0)
        return out, [d] * len(losses)

    out, pull = jax.vjp(f, x)
    return out, [pull(jax.grad(loss)(out))[0] for loss in losses]


def value_and_grad_of(g: Callable, x: Any, loss: Callable) -> tuple[Any, Any]:
    """``g(x)`` and the gradient of ``loss(g(x))`` with respect to ``x``: ``(value, dloss/dx)``.

    On JAX, ``g`` is linearised once and pulled back with the loss's gradient
    at ``g(x)`` (the chain rule, as :func:`value_and_grads`), in closed form
    for :func:`finite_sum` (:func:`finite_sum_cotangent`): the loss is not
    linearised and transposed with ``g`` for every case.  The same bits as
    differentiating ``loss(g(x))`` whole; a chapter-3 job's child costs
    2-6% less (paired runs; the loss's own ``jax.grad`` instead of the
    closed form saved nothing).  A value that is
    not a floating-point array (an integer result, a list) is
    differentiated as part of ``loss(g(x))`` instead, whatever that makes
    of it, as on MLX (:func:`value_and_grad_aux`).
    """
    if not _is_mlx(x) and _staging_now():
        return _staged(g, (x,), 0)
    if not _is_mlx(x):
        import jax
        import jax.numpy as jnp

        value, pull = jax.vjp(g, x)
        if isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jnp.floating):
            cotangent = finite_sum_cotangent(value) if loss is finite_sum else jax.grad(loss)(value)
            return value, pull(cotangent)[0]

    def f(x: Any) -> tuple[Any, Any]:
        value = g(x)
        return loss(value), value

    return value_and_grad_aux(f)(x)


def itemsize(x: Any) -> int:
    """Bytes per element of an array of either backend (or NumPy); a result that has no dtype (a
    list, a number) is not an array, said as such (not as an AttributeError of this probe's)."""
    if not hasattr(x, "dtype"):
        raise NotPlainValue(f"the result is a {type(x).__name__[:60]}, expected an array (with a dtype)")
    if _is_mlx(x):
        return int(x.dtype.size)
    return int(np.dtype(x.dtype).itemsize)


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


def _weights(x: Any) -> Any:
    """w_n = cos(n + 1) over ``x``'s entries, shaped and typed like ``x`` (a constant: nothing to trace)."""
    return asarray(np.cos(1.0 + np.arange(x.size)).reshape(x.shape), like=x)


def finite_sum(x):
    """L = sum_n w_n x_n over the finite entries, with fixed weights w_n = cos(n + 1).

    Weighted, so that a softmax output (whose rows sum to one) still has a
    non-zero gradient; infinite entries (dead rows) are left out.
    """
    m = xp(x)
    w = _weights(x)
    return m.sum(m.where(m.isfinite(x), x, 0.0) * w)


def finite_sum_cotangent(x: Any) -> Any:
    """dL/dx_n = w_n where x_n is finite, else 0: :func:`finite_sum`'s gradient in closed form.

    The same bits as autodiff of :func:`finite_sum` gives (1 * w_n, then the
    where), without tracing that autodiff for every case.
    """
    m = xp(x)
    w = _weights(x)
    return m.where(m.isfinite(x), w, m.zeros_like(w))


def with_grad(arg: str, loss: Callable[[Any], Any] = finite_sum, name: str = "value") -> Callable:
    """A probe returning the value and the gradient of ``loss(value)`` wrt input ``arg``.

    The gradient checks what the exercises ask of autodiff: no nan at dead
    rows or zero weights, and the right derivative elsewhere.
    """

    def probe(fn, **inputs):
        value, dx = value_and_grad_of(lambda x: fn(**{**inputs, arg: x}), inputs[arg], loss)
        return {name: value, f"d/d{arg}": dx}

    return probe
