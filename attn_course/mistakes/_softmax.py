"""A masked softmax with switches, one per common mistake (shared by the chapters).

``softmax(S, mask, T)`` with every switch at its default is the book's
stable masked softmax (:func:`attn_tensors.softmax.softmax_and_log_partition`);
each switch turns on one mistake, so that a wrong implementation is the
right one with exactly one thing changed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def softmax(S, mask=None, T=1.0, *, temperature="divide", shift=True, axis=-1, use_mask=True,
            dead_rows="guarded", add_back_max=True, additive_mask=False):
    """(A, log_Z) with one mistake switched on.

    temperature: "divide" (S / T), "ignore" (S), "multiply" (S T), "twice" (S / T^2).
    shift: subtract the row maximum before exp (False: exp(S) overflows).
    axis: the axis normalised over (-1: keys, the right one; -2: queries).
    use_mask: False ignores the mask.
    dead_rows: "guarded" (a double where), "single-where" (the value is right
    but the gradient of a fully masked row is nan), "none" (0/0 = nan in A).
    add_back_max: False returns log Z' = log Z - max (the shift not undone).
    additive_mask: the mask as a bias, S/T + (0 or -inf), with no 'where' on
    the exps: right values, but gradients reach the masked scores (through
    exp(-inf) = 0), so a nan made downstream is not stopped.
    """
    neg_inf = -jnp.inf
    s = {"divide": S / T, "ignore": S, "multiply": S * T, "twice": S / T / T}[temperature]
    m_ = mask if use_mask else None
    if m_ is not None:
        s = s + jnp.where(m_, 0.0, neg_inf) if additive_mask else jnp.where(m_, s, neg_inf)
    if shift:
        m = jax.lax.stop_gradient(jnp.max(s, axis=axis, keepdims=True))
        m = jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m))
    else:
        m = jnp.zeros_like(jnp.max(s, axis=axis, keepdims=True))
    e = jnp.exp(s - m)
    if m_ is not None and not additive_mask:
        e = jnp.where(m_, e, jnp.zeros_like(e))
    z = jnp.sum(e, axis=axis, keepdims=True)
    alive = z > 0
    if dead_rows == "guarded":
        z_safe = jnp.where(alive, z, jnp.ones_like(z))
        A = e / z_safe
        log_Z = jnp.where(alive, jnp.log(z_safe) + m, neg_inf)
    elif dead_rows == "single-where":
        A = jnp.where(alive, e / z, jnp.zeros_like(e))
        log_Z = jnp.where(alive, jnp.log(z) + m, neg_inf)
    else:
        A = e / z
        log_Z = jnp.log(z) + m
    if not add_back_max:
        log_Z = jnp.where(alive, log_Z - m, log_Z)
    return A, jnp.squeeze(log_Z, axis=axis)
