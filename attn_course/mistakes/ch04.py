"""Mistakes of chapter 4, Differential Geometry: exercises 4.1-4.4."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attn_tensors import geometry

from . import mistake

MISTAKES: list = []

# -- 4.1 angle ----------------------------------------------------------------------------


@mistake("4.1", "no-clip", "def-geometry-measures",
         "Your angle is nan for (anti)parallel vectors: rounding can push the cosine one ulp "
         "past ±1, where arccos is undefined. Clip the cosine into [−1, 1] first.")
def _angle_unclipped(u, v, g):
    return jnp.arccos(geometry.cosine_similarity(u, v, g))


@mistake("4.1", "euclidean", "def-geometry-measures",
         "You measured the angle with the Euclidean dot product: under a metric, "
         "cos θ = g_{ab} u^a v^b / (|u|_g |v|_g), lengths included.")
def _angle_euclidean(u, v, g):
    eye = jnp.broadcast_to(jnp.eye(u.shape[-1], dtype=u.dtype), g.shape)
    c = geometry.cosine_similarity(u, v, eye)
    return jnp.arccos(jnp.clip(c, -1.0, 1.0))


@mistake("4.1", "cosine-returned", "def-geometry-measures",
         "You returned the cosine of the angle: the angle is θ = arccos(cos θ), in radians.")
def _angle_cosine(u, v, g):
    return jnp.clip(geometry.cosine_similarity(u, v, g), -1.0, 1.0)


# -- 4.2 christoffel_symbols -----------------------------------------------------------------


def _christoffel(metric_fn, x, *, raise_it=True, upper_first=True, half=0.5, sign=-1.0):
    g = metric_fn(x)
    dg = jnp.moveaxis(jax.jacfwd(metric_fn)(x), -1, 0)  # dg[c, a, b] = d_c g_ab
    first = half * (jnp.einsum("abd->dab", dg) + jnp.einsum("bad->dab", dg) + sign * dg)
    if not raise_it:
        return first
    up = jnp.linalg.solve(g, first.reshape(first.shape[0], -1)).reshape(first.shape)  # [c, a, b]
    return up if upper_first else jnp.einsum("cab->abc", up)


@mistake("4.2", "index-not-raised", "eq-geometry-christoffel",
         "You returned the Christoffel symbols of the first kind, Γ_{dab}, with every index "
         "down: raise the first index with the inverse metric, Γ^c_{ab} = g^{cd} Γ_{dab} "
         "(solve with g).")
def _christoffel_first_kind(metric_fn, x):
    return _christoffel(metric_fn, x, raise_it=False)


@mistake("4.2", "upper-index-last", "eq-geometry-christoffel",
         "Your axes are in the wrong order: the upper index c comes first, Gamma[c, a, b] "
         "= Γ^c_{ab}.")
def _christoffel_upper_last(metric_fn, x):
    return _christoffel(metric_fn, x, upper_first=False)


@mistake("4.2", "missing-half", "eq-geometry-christoffel",
         "Your symbols are twice too large: Γ^c_{ab} = ½ g^{cd} (∂_a g_{bd} + ∂_b g_{ad} − ∂_d g_{ab}).")
def _christoffel_no_half(metric_fn, x):
    return _christoffel(metric_fn, x, half=1.0)


@mistake("4.2", "sign-of-third-term", "eq-geometry-christoffel",
         "You added the third derivative: it is subtracted, Γ_{dab} = ½ (∂_a g_{bd} + ∂_b g_{ad} "
         "− ∂_d g_{ab}).")
def _christoffel_plus(metric_fn, x):
    return _christoffel(metric_fn, x, sign=1.0)


# -- 4.3 fisher_information_logits ---------------------------------------------------------------


@mistake("4.3", "outer-product-missing", "prop-geometry-fisher-logits",
         "You kept only the diagonal diag(A): the Fisher information of the logits is "
         "F_{jk} = A_j δ_{jk} − A_j A_k, so subtract the outer product of A with itself.")
def _fisher_diag(A):
    return jnp.einsum("...j,jk->...jk", A, jnp.eye(A.shape[-1], dtype=A.dtype))


@mistake("4.3", "sign-flipped", "prop-geometry-fisher-logits",
         "Your Fisher information has the wrong sign: F_{jk} = A_j δ_{jk} − A_j A_k is positive "
         "semi-definite.")
def _fisher_sign(A):
    return -geometry.fisher_information_logits(A)


# -- 4.4 natural_gradient_step --------------------------------------------------------------------


@mistake("4.4", "fisher-not-inverted", "eq-geometry-natural-step",
         "You multiplied the gradient by the Fisher matrix: the natural gradient solves "
         "(F + λ I) x = ∇L, i.e. applies the inverse.")
def _natural_times_F(theta, grad, fisher, lr, damping=1e-3):
    F = fisher + damping * jnp.eye(fisher.shape[-1], dtype=fisher.dtype)
    return theta - lr * jnp.einsum("...ij,...j->...i", F, grad)


@mistake("4.4", "damping-ignored", "def-geometry-natural-gradient",
         "You left out the damping: a singular Fisher (the logit Fisher has F 1 = 0) has no "
         "inverse, so the step blows up. Solve (F + λ I) x = ∇L.")
def _natural_undamped(theta, grad, fisher, lr, damping=1e-3):
    return geometry.natural_gradient_step(theta, grad, fisher, lr, 0.0)


@mistake("4.4", "ascent", "eq-geometry-natural-step",
         "You stepped uphill: the step is θ − lr (F + λ I)^{-1} ∇L.")
def _natural_ascent(theta, grad, fisher, lr, damping=1e-3):
    return 2 * theta - geometry.natural_gradient_step(theta, grad, fisher, lr, damping)


@mistake("4.4", "plain-gradient", "def-geometry-natural-gradient",
         "You took a plain gradient step, θ − lr ∇L: the natural gradient first solves with the "
         "damped Fisher, (F + λ I) x = ∇L.")
def _natural_plain(theta, grad, fisher, lr, damping=1e-3):
    return theta - lr * grad
