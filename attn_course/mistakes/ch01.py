"""Mistakes of chapter 1, Foundations: exercises 1.1-1.5."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from attn_tensors import bilinear

from . import mistake

MISTAKES: list = []

# -- 1.1 lower_index ---------------------------------------------------------------


@mistake("1.1", "inverse-metric", "eq-foundations-lower",
         "You multiplied by the inverse metric g^{ab}, which raises an index: lowering "
         "v^b takes the metric itself, v_a = g_{ab} v^b.")
def _lower_with_inverse(v, g):
    # v^a = g^{ab} v_b: solve g x = v
    return jnp.linalg.solve(g, v[..., None])[..., 0]


@mistake("1.1", "diagonal-only", "eq-foundations-lower",
         "You used only the diagonal of g (v_a = g_{aa} v^a): the sum over b runs over every "
         "component, so the off-diagonal entries of g mix the components of v.")
def _lower_diagonal(v, g):
    # v_a = g_{aa} v^a (no sum)
    return jnp.diagonal(g, axis1=-2, axis2=-1) * v


# -- 1.2 learned_metric ---------------------------------------------------------------


@mistake("1.2", "rows-contracted", "prop-foundations-learned",
         "You contracted the column index of W (W W^T, an r x r matrix): the metric "
         "g_{ab} = W_{ca} W_{cb} sums over the row index c and is d x d.")
def _learned_rows(W):
    # W_{ac} W_{bc}
    return jnp.einsum("...ac,...bc->...ab", W, W)


@mistake("1.2", "batch-summed", "def-foundations-einstein",
         "Your einsum summed over the batch axes too (no '...' in its output): each W of a "
         "batch has its own metric, so keep the leading axes.")
def _learned_batch_summed(W):
    # g_{ab} = sum over the batch and c of W_{ca} W_{cb}
    return jnp.einsum("...ca,...cb->ab", W, W)


# -- 1.3 bilinear_form_batch --------------------------------------------------------------


@mistake("1.3", "metric-transposed", "eq-foundations-bilinear",
         "You used g transposed (Q g^T K^T): in S^{ij} = Q^{ia} g_{ab} K^{jb} the first index "
         "of g meets the query and the second the key, which matters when g is not symmetric.")
def _batch_g_transposed(Q, K, g):
    return bilinear.bilinear_form_batch(Q, K, jnp.swapaxes(g, -1, -2))


@mistake("1.3", "extra-scale", "eq-foundations-scores",
         "You divided by √d_k: the bilinear form is Q^{ia} g_{ab} K^{jb} alone (a metric "
         "carries its own scale), so your scores are √d_k times too small.")
def _batch_scaled(Q, K, g):
    return bilinear.bilinear_form_batch(Q, K, g) / np.sqrt(Q.shape[-1])


# -- 1.4 loop_einsum ------------------------------------------------------------------------


@mistake("1.4", "jax-array", "ex-1-4",
         "Your values are right, but you returned a JAX array (or another dtype): the "
         "exercise asks for loops that fill a float64 NumPy array.")
def _loop_with_jax(subscripts, *arrays):
    return jnp.einsum(subscripts, *arrays)


def _implied_in_order(subscripts: str) -> str:
    """The implied output in order of first appearance (the mistake), not sorted."""
    letters = subscripts.replace("...", "").replace(",", "")
    once = [c for i, c in enumerate(letters) if letters.count(c) == 1 and c not in letters[:i]]
    return ("..." if "..." in subscripts else "") + "".join(once)


@mistake("1.4", "implied-output-unsorted", "def-foundations-einstein",
         "Without '->', you kept the free indices in the order they appear: einsum's implied "
         "output lists the indices used once in alphabetical order, so your axes are swapped.")
def _loop_unsorted(subscripts, *arrays):
    if "->" not in subscripts:
        subscripts = subscripts + "->" + _implied_in_order(subscripts)
    return np.einsum(subscripts, *[np.asarray(a, dtype=np.float64) for a in arrays])


# -- 1.5 check_metric ------------------------------------------------------------------------


@mistake("1.5", "float64-eps", "ex-1-5",
         "You took the default tolerance d·eps from float64 whatever the input: a float32 "
         "metric's zero eigenvalues are float32 rounding noise, far above float64's eps, so "
         "a rank-deficient float32 metric comes out with full rank.")
def _metric_eps64(g, rtol=None):
    d = np.asarray(g).shape[-1]
    eps = float(np.finfo(np.float64).eps)
    return bilinear.check_metric(np.asarray(g), d * eps if rtol is None else rtol)


@mistake("1.5", "signed-rank", "ex-1-5",
         "You counted only the eigenvalues above the cutoff, λ > tol: the rank counts "
         "|λ| > tol, so a negative eigenvalue of an indefinite metric is part of it.")
def _metric_signed_rank(g, rtol=None):
    report = bilinear.check_metric(np.asarray(g), rtol)
    G = np.asarray(g, dtype=np.float64)
    d = G.shape[0]
    eps = float(np.finfo(np.asarray(g).dtype).eps)
    tol = d * eps if rtol is None else float(rtol)
    lam = np.linalg.eigvalsh((G + G.T) / 2)
    cutoff = tol * max(float(np.max(np.abs(lam))), np.finfo(np.float64).tiny)
    rank = int(np.sum(lam > cutoff))
    kind = report.kind
    if kind.startswith("positive semi-definite"):
        kind = f"positive semi-definite (rank {rank} < d={d}), not positive definite"
    return dataclasses.replace(report, rank=rank, kind=kind)
