"""The one place where JAX and MLX differ.

Every function of :mod:`attn_tensors` is written once, against the small
namespace returned by :func:`namespace`.  For JAX that namespace is
``jax.numpy`` plus autodiff helpers; for MLX it is ``mlx.core`` with the few
names that differ mapped onto the NumPy spelling.  Nothing else in the library
imports ``mlx``.

Arrays decide the backend: if any argument is an ``mlx.core.array`` the MLX
namespace is used, otherwise JAX (NumPy arrays and Python numbers are
converted to JAX arrays).  Mixing JAX and MLX arrays in one call is an error.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Backend",
    "namespace",
    "namespace_for",
    "is_mlx",
    "mlx_available",
    "to_numpy",
    "is_concrete",
]


@functools.cache
def _mlx():
    try:
        import mlx.core as mx
    except ImportError:  # pragma: no cover - exercised only without MLX
        return None
    return mx


def mlx_available() -> bool:
    """True when ``mlx.core`` can be imported (macOS, or Linux with mlx[cpu])."""
    return _mlx() is not None


def is_mlx(x: Any) -> bool:
    """True for an ``mlx.core.array`` (checked without importing MLX)."""
    return type(x).__module__.startswith("mlx")


def to_numpy(x: Any) -> np.ndarray:
    """Copy a JAX, MLX or NumPy array (or a number) into a NumPy array."""
    return np.asarray(x)


def is_concrete(x: Any) -> bool:
    """True when ``x`` holds values we may inspect (not a JAX tracer).

    Value checks (temperature sign, NaN in the input) run only on concrete
    arrays; inside ``jax.jit`` the shapes are still checked.
    """
    if isinstance(x, jax.core.Tracer):
        return False
    if is_mlx(x):
        mx = _mlx()
        # Inside mx.compile the array is a placeholder; asking for its value
        # raises.  Outside it, evaluation is cheap for the small checks we do.
        try:
            mx.eval(x)
        except (ValueError, RuntimeError):  # pragma: no cover - compile path
            return False
    return True


class Backend:
    """A NumPy-like namespace for one framework.

    Attribute access falls through to the framework module (``jax.numpy`` or
    ``mlx.core``), so ``xp.exp``, ``xp.einsum``, ``xp.where`` ... are the
    framework's own functions.  Methods defined here cover what differs.
    """

    def __init__(self, name: str, module: Any):
        self.name = name
        self.module = module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.module, attr)

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"

    # -- construction -------------------------------------------------------
    def asarray(self, x: Any, dtype: Any = None) -> Any:
        """Convert ``x`` to this backend's array type (keeping its values)."""
        if self.name == "mlx":
            mx = self.module
            if isinstance(x, mx.array):
                return x if dtype is None else x.astype(dtype)
            if isinstance(x, jax.Array):
                x = np.asarray(x)
            if dtype is None and isinstance(x, np.ndarray) and x.dtype == np.float64:
                return mx.array(x, dtype=mx.float64)
            return mx.array(x) if dtype is None else mx.array(x, dtype=dtype)
        if is_mlx(x):
            x = np.asarray(x)
        return jnp.asarray(x, dtype=dtype)

    def scalar(self, value: float, like: Any) -> Any:
        """A 0-d array of ``value`` with the dtype of ``like``."""
        return self.asarray(value, dtype=like.dtype)

    def result_float(self, *arrays: Any) -> Any:
        """The floating dtype the arrays promote to (float32 at least)."""
        if self.name == "mlx":
            mx = self.module
            dt = mx.float32
            for a in arrays:
                if a.dtype == mx.float64:
                    dt = mx.float64
            return dt
        dt = jnp.result_type(*arrays)
        if not jnp.issubdtype(dt, jnp.floating):
            return jnp.result_type(float)
        # float16 and bfloat16 are computed in float32 (what a CPU does anyway;
        # XLA's CPU kernels reject some half-precision ops outright)
        return jnp.promote_types(dt, jnp.float32)

    def default_float(self, like: Any = None, dtype: Any = None) -> Any:
        """The float dtype for a constructor: ``dtype``, else ``like``'s, else the default."""
        if dtype is not None:
            return dtype
        return self.result_float(self.asarray(0.0 if like is None else like))

    def floating(self, *arrays: Any) -> list[Any]:
        """Cast the arrays to their common floating dtype."""
        dt = self.result_float(*arrays)
        return [a.astype(dt) for a in arrays]

    def is_float64(self, x: Any) -> bool:
        return x.dtype == (self.module.float64)

    # -- reductions and shape helpers with a uniform spelling ----------------
    def max(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """max over ``axis``; an empty axis gives -inf (the identity of max), not an error.

        This is what makes a row with no keys (``n_k = 0``) a fully masked
        row everywhere: its maximum is ``-inf`` like that of a masked row.
        """
        return self._reduce_or(self.module.max, -float("inf"), x, axis, keepdims)

    def min(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """min over ``axis``; an empty axis gives +inf (the identity of min)."""
        return self._reduce_or(self.module.min, float("inf"), x, axis, keepdims)

    def _reduce_or(self, f: Callable, identity: float, x: Any, axis: Any, keepdims: bool) -> Any:
        shape = tuple(x.shape)
        axes = range(len(shape)) if axis is None else (
            (axis,) if isinstance(axis, int) else tuple(axis))
        axes = sorted({a % len(shape) for a in axes}) if shape else []
        if all(shape[a] > 0 for a in axes):
            return f(x, axis=axis, keepdims=keepdims)
        out = [1 if a in axes else n for a, n in enumerate(shape)] if keepdims else [
            n for a, n in enumerate(shape) if a not in axes]
        dt = x.dtype if self.module.issubdtype(x.dtype, self.module.floating) else None
        return self.module.full(tuple(out), identity, dtype=dt or self.result_float(x))

    def swap_last(self, x: Any) -> Any:
        """Transpose the last two axes, leaving leading batch axes alone."""
        return self.module.swapaxes(x, -1, -2)

    def stop_gradient(self, x: Any) -> Any:
        if self.name == "mlx":
            return self.module.stop_gradient(x)
        return jax.lax.stop_gradient(x)

    def any_true(self, x: Any) -> bool:
        """Python bool: is any element true (forces evaluation)."""
        return bool(self.module.any(x).item())

    # -- linear algebra (MLX runs these on the CPU stream) -------------------
    def _linalg(self, fname: str, *args: Any, **kwargs: Any) -> Any:
        if self.name == "mlx":
            mx = self.module
            return getattr(mx.linalg, fname)(*args, stream=mx.cpu, **kwargs)
        return getattr(jnp.linalg, fname)(*args, **kwargs)

    def inv(self, x: Any) -> Any:
        return self._linalg("inv", x)

    def solve(self, a: Any, b: Any) -> Any:
        return self._linalg("solve", a, b)

    def eigvalsh(self, x: Any) -> Any:
        return self._linalg("eigvalsh", x)

    def cholesky(self, x: Any) -> Any:
        return self._linalg("cholesky", x)

    # -- autodiff ------------------------------------------------------------
    def grad(self, f: Callable, argnums: int | tuple[int, ...] = 0) -> Callable:
        if self.name == "mlx":
            return self.module.grad(f, argnums=argnums)
        return jax.grad(f, argnums=argnums)

    def vjp(self, f: Callable, primals: list[Any], cotangents: list[Any]):
        """Outputs and the vector-Jacobian products of ``f`` at ``primals``."""
        if self.name == "mlx":
            outs, grads = self.module.vjp(f, primals, cotangents)
            return outs, grads
        outs, pullback = jax.vjp(lambda *p: tuple(f(*p)), *primals)
        return list(outs), list(pullback(tuple(cotangents)))

    def jacobian(self, f: Callable, x: Any) -> Any:
        """J[..., a] = d f(x)[...] / d x[a] for a function of one vector x."""
        if self.name == "mlx":
            mx = self.module
            n = x.shape[-1]
            basis = mx.eye(n, dtype=x.dtype)

            def column(e):
                return mx.jvp(f, [x], [e])[1][0]

            cols = mx.vmap(column)(basis)  # (a, ...)
            return mx.moveaxis(cols, 0, -1)
        return jax.jacfwd(f)(x)

    # -- added for efficient attention --------------------------------------
    # Loops, custom gradients, compilation and the fused attention kernel are
    # spelled differently by the two frameworks; these adapters give them one
    # spelling.  On MLX the loop indices are Python ints (the loops unroll
    # into MLX's lazy graph); on JAX they are traced and the loops stay loops
    # in XLA, so the blocks of flash attention are never materialised at once.

    def fori_loop(self, lower: Any, upper: Any, body: Callable, init: Any) -> Any:
        """carry <- body(t, carry) for t = lower, ..., upper - 1 (bounds may be traced on JAX)."""
        if self.name == "mlx":
            carry = init
            for t in range(int(lower), int(upper)):
                carry = body(t, carry)
            return carry
        return jax.lax.fori_loop(lower, upper, body, init)

    def scan(self, f: Callable, init: Any, n: int) -> tuple[Any, Any]:
        """(carry, ys): carry, y_t = f(carry, t) for t < n; the ys stacked on a new axis 0.

        ``y_t`` is an array or a tuple of arrays.
        """
        if self.name == "mlx":
            mx = self.module
            carry, ys = init, []
            for t in range(int(n)):
                carry, y = f(carry, t)
                ys.append(y)
            if not ys:
                return carry, None
            if isinstance(ys[0], tuple):
                return carry, tuple(mx.stack(list(col)) for col in zip(*ys))
            return carry, mx.stack(ys)
        return jax.lax.scan(f, init, jnp.arange(int(n)))

    def custom_vjp(self, fun: Callable, bwd: Callable) -> Callable:
        """``fun`` with the gradient ``bwd(primals, outputs, cotangents) -> grads``.

        ``fun(*primals)`` returns a tuple of arrays; ``bwd`` returns one
        gradient per primal (None for a non-differentiable one, e.g. a mask).
        The primals and outputs are the only residuals kept for the backward.
        """
        if self.name == "mlx":
            mx = self.module
            f = mx.custom_function(fun)

            @f.vjp
            def f_vjp(primals, cotangents, outputs):
                grads = bwd(tuple(primals), tuple(outputs), tuple(cotangents))
                return tuple(
                    mx.zeros_like(p) if g is None else g for p, g in zip(primals, grads)
                )

            return f
        f = jax.custom_vjp(fun)

        def f_fwd(*primals):
            outputs = fun(*primals)
            return outputs, (primals, outputs)

        def f_bwd(res, cotangents):
            primals, outputs = res
            return tuple(bwd(primals, outputs, tuple(cotangents)))

        f.defvjp(f_fwd, f_bwd)
        return f

    def compile(self, f: Callable) -> Callable:
        """``jax.jit(f)`` or ``mx.compile(f)``."""
        if self.name == "mlx":
            return self.module.compile(f)
        return jax.jit(f)

    def fused_sdpa(self, Q: Any, K: Any, V: Any, mask: Any, scale: float) -> Any:
        """O^{ib} = softmax_j(scale Q^{ia} K^{ja}, mask) V^{jb} by the framework's fused kernel.

        ``mx.fast.scaled_dot_product_attention`` (layout (B, heads, n, d)) or
        ``jax.nn.dot_product_attention`` (layout (B, n, heads, d), d_v = d_k;
        a zero padding of the feature axes makes them equal).  Q, K, V are
        (B, n, d); ``mask`` is None or boolean broadcasting to (B, n_q, n_k).
        A fully masked row is NOT zero here (both kernels average V): the
        caller fixes that up.
        """
        if self.name == "mlx":
            mx = self.module
            m = None if mask is None else mask[:, None]
            O = mx.fast.scaled_dot_product_attention(
                Q[:, None], K[:, None], V[:, None], scale=scale, mask=m
            )
            return O[:, 0]
        d_k, d_v = Q.shape[-1], V.shape[-1]
        d = max(d_k, d_v)
        if d_k < d:
            pad = [(0, 0), (0, 0), (0, d - d_k)]
            Q, K = jnp.pad(Q, pad), jnp.pad(K, pad)
        if d_v < d:
            V = jnp.pad(V, [(0, 0), (0, 0), (0, d - d_v)])
        m = None if mask is None else mask[:, None]
        O = jax.nn.dot_product_attention(
            Q[:, :, None], K[:, :, None], V[:, :, None], mask=m, scale=scale
        )
        return O[:, :, 0, :d_v]


_JAX = Backend("jax", jnp)


@functools.cache
def _mlx_backend() -> Backend:
    return Backend("mlx", _mlx())


def namespace_for(like: Any = None) -> Backend:
    """The backend of ``like`` (an array), or JAX when there is none: for constructors."""
    return namespace(like) if like is not None else namespace()


def namespace(*arrays: Any) -> Backend:
    """The backend for these arrays; raises if JAX and MLX arrays are mixed."""
    kinds = {is_mlx(a) for a in arrays if a is not None and hasattr(a, "shape")}
    if kinds == {True, False}:
        raise TypeError(
            "got both MLX and JAX/NumPy arrays in one call; convert them to one "
            "framework first (attn_tensors.backend.namespace(x).asarray(y))"
        )
    if True in kinds:
        return _mlx_backend()
    return _JAX
