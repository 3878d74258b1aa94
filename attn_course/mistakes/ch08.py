"""Mistakes of chapter 8, Hopfield Networks: exercises 8.1-8.4."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attn_tensors import attention

from . import mistake

MISTAKES: list = []

# -- 8.1 hebbian_weights ------------------------------------------------------------------------------


def _hebbian(patterns, *, by="N", zero_diagonal=True):
    P = jnp.asarray(patterns).astype(jnp.float64)
    M, N = P.shape[-2], P.shape[-1]
    W = jnp.einsum("...mi,...mj->...ij", P, P)
    W = W / {"N": N, "M": M, "1": 1}[by]
    return W * (1 - jnp.eye(N, dtype=W.dtype)) if zero_diagonal else W


@mistake("8.1", "divided-by-M", "def-hopfield-classical",
         "You divided by the number of patterns M: the Hebbian weights are "
         "W_{ij} = (1/N) Σ_μ ξ^μ_i ξ^μ_j, with N the number of neurons.")
def _hebbian_by_m(patterns):
    return _hebbian(patterns, by="M")


@mistake("8.1", "diagonal-kept", "def-hopfield-classical",
         "You kept the diagonal: a neuron has no connection to itself, W_{ii} = 0.")
def _hebbian_diag(patterns):
    return _hebbian(patterns, zero_diagonal=False)


@mistake("8.1", "not-divided", "def-hopfield-classical",
         "You left out the factor 1/N: W_{ij} = (1/N) Σ_μ ξ^μ_i ξ^μ_j.")
def _hebbian_sum(patterns):
    return _hebbian(patterns, by="1")


# -- 8.2 classical_async_sweep -----------------------------------------------------------------------


def _sweep(W, s, order, *, tie="plus"):
    neurons = jnp.arange(s.shape[-1])

    def step(state, i):
        h = jnp.einsum("...j,...j->...", W[..., i, :], state)
        if tie == "plus":
            new = jnp.where(h >= 0, 1.0, -1.0)
        elif tie == "zero":
            new = jnp.sign(h)
        else:  # keep the old value at h = 0
            new = jnp.where(h > 0, 1.0, jnp.where(h < 0, -1.0, state[..., i]))
        return jnp.where(neurons == i, new[..., None].astype(state.dtype), state), None

    out, _ = jax.lax.scan(step, s, jnp.asarray(order))
    return out


@mistake("8.2", "synchronous", "rem-hopfield-sync",
         "You updated all neurons at once from the old state: an asynchronous sweep updates one "
         "neuron at a time, in the given order, each from the state the earlier updates left.")
def _sweep_sync(W, s, order):
    h = jnp.einsum("...ij,...j->...i", W, s)
    new = jnp.where(h >= 0, 1.0, -1.0).astype(s.dtype)
    touched = jnp.zeros(s.shape[-1], dtype=bool).at[jnp.asarray(order)].set(True)
    return jnp.where(touched, new, s)


@mistake("8.2", "sign-zero", "def-hopfield-classical",
         "At a tie h_i = 0 your neuron became 0 (jnp.sign(0) = 0): the states are ±1, and the "
         "rule is sgn(0) = +1.")
def _sweep_sign0(W, s, order):
    return _sweep(W, s, order, tie="zero")


@mistake("8.2", "tie-keeps-state", "def-hopfield-classical",
         "At a tie h_i = 0 you kept the old state: the rule is sgn(0) = +1, so a neuron at −1 "
         "with h_i = 0 flips to +1.")
def _sweep_keep(W, s, order):
    return _sweep(W, s, order, tie="keep")


@mistake("8.2", "sorted-order", "def-hopfield-classical",
         "You updated the neurons in index order (or each once): the sweep follows order as "
         "given, repeats included, and the result depends on it.")
def _sweep_sorted(W, s, order):
    return _sweep(W, s, jnp.arange(s.shape[-1]))


# -- 8.3 modern_energy --------------------------------------------------------------------------------


def _energy(xi, X, beta, constants, *, inv_beta=True, shift=True, quadratic=True, const_beta=True):
    s = beta * jnp.einsum("...ma,...a->...m", X, xi)
    if shift:
        m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
        lse = jnp.log(jnp.sum(jnp.exp(s - m), axis=-1)) + m[..., 0]
    else:
        lse = jnp.log(jnp.sum(jnp.exp(s), axis=-1))
    E = -lse / beta if inv_beta else -lse
    if quadratic:
        E = E + 0.5 * jnp.einsum("...a,...a->...", xi, xi)
    if constants:
        M = X.shape[-2]
        R2 = jnp.max(jnp.einsum("...ma,...ma->...m", X, X), axis=-1)
        E = E + (math.log(M) / beta if const_beta else math.log(M)) + 0.5 * R2
    return E


def _energy_mistake(key, label, message, **switch):
    @mistake("8.3", key, label, message)
    def wrong(xi, X, beta, *, constants=False):
        return _energy(xi, X, beta, constants, **switch)

    wrong.__name__ = f"energy_{key.replace('-', '_')}"
    return wrong


_energy_mistake("missing-inverse-beta", "def-hopfield-modern",
                "You left out the 1/β in front of the log-sum-exp: E = −(1/β) log Σ_μ "
                "exp(β X^μ · ξ) + ½ |ξ|².", inv_beta=False)
_energy_mistake("max-not-subtracted", "lem-hopfield-lse-convex",
                "You summed exp(β X ξ) directly: for large β X ξ exp overflows and E is -inf. "
                "Use a stable log-sum-exp (attention's log Z at T = 1/β).", shift=False)
_energy_mistake("quadratic-missing", "def-hopfield-modern",
                "You left out the quadratic term ½ |ξ|²: without it the energy has no minimum "
                "near the stored patterns.", quadratic=False)
_energy_mistake("constant-without-beta", "def-hopfield-modern",
                "With constants=True you added log M instead of (1/β) log M.", const_beta=False)


# -- 8.4 modern_update -------------------------------------------------------------------------------


@mistake("8.4", "attention-scale", "thm-hopfield-attention",
         "You kept attention's default 1/√d scale: the Hopfield update is softmax(β X ξ) with "
         "no 1/√d, i.e. attention at T = 1/β and scale 1.")
def _update_scaled(xi, X, beta):
    parts = attention.attention_decomposition(xi[..., None, :], X, X, T=1.0 / beta)
    return parts.O[..., 0, :]


@mistake("8.4", "beta-as-temperature", "thm-hopfield-attention",
         "You used β as the temperature: β is the inverse temperature, T = 1/β "
         "(a large β sharpens the weights).")
def _update_beta_t(xi, X, beta):
    parts = attention.attention_decomposition(xi[..., None, :], X, X, T=beta, scale=1.0)
    return parts.O[..., 0, :]


@mistake("8.4", "max-not-subtracted", "thm-hopfield-attention",
         "You took exp(β X ξ) without subtracting the maximum: at large β it overflows and the "
         "update is nan. Use the stable softmax.")
def _update_overflow(xi, X, beta):
    e = jnp.exp(beta * jnp.einsum("...ma,...a->...m", X, xi))
    return jnp.einsum("...m,...ma->...a", e / jnp.sum(e, axis=-1, keepdims=True), X)

