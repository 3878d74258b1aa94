"""Mistakes of chapter 9, Efficient Attention: exercises 9.1-9.5."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attn_tensors import kernel as kernel_lib
from attn_tensors.kernel import exponential_kernel

from . import mistake

MISTAKES: list = []

# -- 9.1 online_softmax_update (and the loop of 9.4) -------------------------------------------------


def online_block(m, l, x, *, guard=True, rescale=True, stop=True):
    """(m', l') after one block, with one switch per mistake (defaults: right)."""
    m_new = jnp.maximum(m, jnp.max(x, axis=-1))
    if stop:
        m_new = jax.lax.stop_gradient(m_new)
    m_safe = jnp.where(m_new > -jnp.inf, m_new, jnp.zeros_like(m_new)) if guard else m_new
    alpha = jnp.exp(m - m_safe) if rescale else jnp.ones_like(m)
    l_new = l * alpha + jnp.sum(jnp.exp(x - m_safe[..., None]), axis=-1)
    return m_new, l_new


@mistake("9.1", "missing-inf-guard", "thm-efficient-online",
         "Your update gives nan on a row with no finite entry yet: its m' is -inf and "
         "exp(-inf − (−inf)) = exp(nan). Shift by m' only where it is finite (by 0 otherwise), so that masked "
         "entries and empty rows contribute exp(-inf) = 0.")
def _online_unguarded(m, l, x_new):
    return online_block(m, l, x_new, guard=False)


@mistake("9.1", "not-rescaled", "def-efficient-online",
         "You did not rescale the running sum: when the maximum grows from m to m', the old "
         "terms were relative to m, so l' = l exp(m − m') + Σ_j exp(x^j − m').")
def _online_unrescaled(m, l, x_new):
    return online_block(m, l, x_new, rescale=False)


@mistake("9.1", "max-not-stopped", "thm-efficient-online",
         "Your values are right, but the gradient flows through the running maximum m': it is "
         "a shift chosen for stability, not part of the function, so stop its gradient.")
def _online_no_stop(m, l, x_new):
    return online_block(m, l, x_new, stop=False)


# -- 9.2 nadaraya_watson ----------------------------------------------------------------------------


@mistake("9.2", "kappa-formed", "thm-efficient-nw-attention",
         "You formed the kernel values κ and divided by their sum: when every κ underflows to 0 "
         "(queries far from all keys) that is 0/0 = nan. Normalise in log space: the weights are "
         "the softmax of log κ.")
def _nw_kappa(Q, K, V, kernel=exponential_kernel, mask=None, **kernel_kwargs):
    kappa = kernel(Q, K, log=False, **kernel_kwargs)
    if mask is not None:
        kappa = jnp.where(mask, kappa, 0.0)
    A = kappa / jnp.sum(kappa, axis=-1, keepdims=True)
    return jnp.einsum("...ij,...jb->...ib", A, V)


@mistake("9.2", "mask-ignored", "def-efficient-nw",
         "You ignored the mask: masked keys get zero weight, and a query with no allowed key "
         "gets output 0.")
def _nw_unmasked(Q, K, V, kernel=exponential_kernel, mask=None, **kernel_kwargs):
    return kernel_lib.nadaraya_watson(Q, K, V, kernel, None, **kernel_kwargs)


@mistake("9.2", "kernel-kwargs-dropped", "def-efficient-nw",
         "You did not pass **kernel_kwargs on to the kernel: its parameters (a metric g, a "
         "width sigma) must reach kernel(Q, K, log=True, **kernel_kwargs).")
def _nw_no_kwargs(Q, K, V, kernel=exponential_kernel, mask=None, **kernel_kwargs):
    return kernel_lib.nadaraya_watson(Q, K, V, kernel, mask)


# -- 9.3 positive_random_features ---------------------------------------------------------------------


def _prf(X, omega, stabilize, *, prescale=True, axes="rows", stop=True, norm=True):
    d_k, m = X.shape[-1], omega.shape[0]
    Xs = X / float(d_k) ** 0.25 if prescale else X
    u = jnp.einsum("...a,ca->...c", Xs, omega) - 0.5 * jnp.sum(Xs * Xs, axis=-1, keepdims=True)
    if stabilize:
        ax = (-2, -1) if (u.ndim >= 2 and axes == "rows") else (-1,)
        top = jnp.max(u, axis=ax, keepdims=True)
        u = u - (jax.lax.stop_gradient(top) if stop else top)
    return jnp.exp(u) / (math.sqrt(m) if norm else 1.0)


def _prf_mistake(key, label, message, **switch):
    @mistake("9.3", key, label, message)
    def wrong(X, omega, *, stabilize=True):
        return _prf(X, omega, stabilize, **switch)

    wrong.__name__ = f"prf_{key.replace('-', '_')}"
    return wrong


_prf_mistake("no-prescale", "def-efficient-prf",
             "You left out the factor d_k^(−1/4) on x: the features estimate exp(q·k / √d_k), so x "
             "is scaled by d_k^(−1/4) in both terms of u.", prescale=False)
_prf_mistake("max-over-features-only", "def-efficient-prf",
             "You stabilised each row by its own maximum: one constant per batch element (the "
             "maximum over rows and features) keeps the rows comparable; a vector alone uses its "
             "features.", axes="features")
_prf_mistake("max-not-stopped", "def-efficient-prf",
             "Your values are right, but the gradient flows through the stabilising maximum: it "
             "is a constant shift, so stop its gradient.", stop=False)
_prf_mistake("missing-norm", "def-efficient-prf",
             "You left out the factor 1/√m: φ(x) = exp(u) / √m, so that φ(q)·φ(k) averages over "
             "the m random features.", norm=False)


# -- 9.4 online_logsumexp --------------------------------------------------------------------------------


def _lse(x, block, *, pad_value=-jnp.inf, guard=True, double_where=True):
    n = x.shape[-1]
    n_blocks = max(1, -(-n // block))
    pad = n_blocks * block - n
    if pad:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)], constant_values=pad_value)
    m = jnp.full(x.shape[:-1], -jnp.inf, dtype=x.dtype)
    l = jnp.zeros(x.shape[:-1], dtype=x.dtype)
    for t in range(n_blocks):
        m, l = online_block(m, l, x[..., t * block:(t + 1) * block], guard=guard)
    alive = l > 0
    if double_where:
        return jnp.where(alive, m + jnp.log(jnp.where(alive, l, 1.0)), -jnp.inf)
    return jnp.where(alive, m + jnp.log(l), -jnp.inf)


def _lse_mistake(key, label, message, **switch):
    @mistake("9.4", key, label, message)
    def wrong(x, block=128):
        return _lse(x, int(block), **switch)

    wrong.__name__ = f"lse_{key.replace('-', '_')}"
    return wrong


_lse_mistake("padded-with-zeros", "alg-efficient-flash-forward",
             "You padded the last block with zeros: a padding entry 0 adds exp(0 − m) to the sum. "
             "Pad with -inf, which adds nothing.", pad_value=0.0)
_lse_mistake("missing-inf-guard", "thm-efficient-online",
             "Your result is nan after a block of only -inf (a masked start, a dead row): "
             "exp(-inf − (−inf)). Shift by the running maximum only where it is finite.", guard=False)
_lse_mistake("single-where", "thm-efficient-online",
             "Your values are right, but the gradient of a dead row is nan: where(l > 0, m + log l, "
             "-inf) still differentiates log 0. Take the log of a safe l (a 'double where').",
             double_where=False)


# -- 9.5 linear_attention ---------------------------------------------------------------------------------


def _elu_unclamped(x):
    return jnp.where(x > 0, x + 1, jnp.exp(x))


def _elu_no_plus_one(x):
    return jnp.where(x > 0, x, jnp.exp(jnp.minimum(x, 0.0)))


@mistake("9.5", "elu-unclamped", "def-efficient-feature-map",
         "Your values are right, but the gradient of elu + 1 is nan at large x: where(x > 0, "
         "x + 1, exp(x)) still differentiates exp(x) = inf in the branch it drops. Clamp the "
         "argument first, exp(min(x, 0)).")
def _linear_unclamped(Q, K, V, feature_map=_elu_unclamped, mask=None, *, causal=False, eps=0.0,
                      chunk=64, offset=None):
    return kernel_lib.linear_attention(Q, K, V, feature_map, mask, causal=causal, eps=eps, chunk=chunk,
                                   offset=offset)


@mistake("9.5", "elu-without-plus-one", "def-efficient-feature-map",
         "Your feature map is elu(x) without the + 1 on the positive side: elu(x) + 1 is x + 1 "
         "for x > 0 and exp(x) for x ≤ 0 (continuous at 0 and always positive).")
def _linear_no_plus_one(Q, K, V, feature_map=_elu_no_plus_one, mask=None, *, causal=False,
                        eps=0.0, chunk=64, offset=None):
    return kernel_lib.linear_attention(Q, K, V, feature_map, mask, causal=causal, eps=eps, chunk=chunk,
                                   offset=offset)


@mistake("9.5", "mask-ignored", "thm-efficient-linear",
         "You ignored the padding mask: a padded key must add nothing to either sum, φ(k_j) = 0.")
def _linear_unmasked(Q, K, V, feature_map=kernel_lib.elu_plus_one, mask=None, *, causal=False,
                     eps=0.0, chunk=64, offset=None):
    return kernel_lib.linear_attention(Q, K, V, feature_map, None, causal=causal, eps=eps, chunk=chunk,
                                   offset=offset)


@mistake("9.5", "zero-denominator-nan", "thm-efficient-linear",
         "A query with no admissible key gives nan: its denominator is 0 and you divided 0 by 0. "
         "Its output is 0 (divide by a safe denominator).")
def _linear_nan(Q, K, V, feature_map=kernel_lib.elu_plus_one, mask=None, *, causal=False, eps=0.0,
                chunk=64, offset=None):
    phi_q, phi_k = feature_map(Q), feature_map(K)
    if mask is not None:
        phi_k = jnp.where(mask[..., None], phi_k, 0.0)
    KV = jnp.einsum("...jc,...jb->...cb", phi_k, V)
    z = jnp.sum(phi_k, axis=-2)
    num = jnp.einsum("...ic,...cb->...ib", phi_q, KV)
    den = jnp.einsum("...ic,...c->...i", phi_q, z) + eps
    return num / den[..., None]

