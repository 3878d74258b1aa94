"""Mistakes of chapter 2, The Attention Mechanism: exercises 2.1-2.5."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from attn_tensors import attention, bilinear
from attn_tensors.attention import AttentionParts

from . import mistake
from ._softmax import softmax

MISTAKES: list = []

# -- 2.1 attention_scores ------------------------------------------------------------


def _scores(Q, K, g=None, *, scale=None, default=None, metric_scale=1.0):
    """S = Q g K^T, or Q K^T times scale (``default`` when scale is None)."""
    if g is not None:
        return bilinear.bilinear_form_batch(Q, K, g) * metric_scale
    c = default(Q.shape[-1]) if scale is None else scale
    return jnp.einsum("...ia,...ja->...ij", Q, K) * c


@mistake("2.1", "missing-scale", "eq-attention-scores",
         "Your scores are √d_k times too large: the factor 1/√d_k is missing "
         "(S = Q K^T / √d_k when no scale is given).")
def _scores_unscaled(Q, K, g=None, *, scale=None):
    return _scores(Q, K, g, scale=scale, default=lambda d: 1.0)


@mistake("2.1", "K-not-transposed", "eq-attention-scores",
         "You multiplied Q by K without transposing it (Q K instead of Q K^T): the scores pair "
         "query i with key j through their common feature index a, S^{ij} = Q^{ia} K^{ja} / √d_k.")
def _scores_k_untransposed(Q, K, g=None, *, scale=None):
    if g is not None:
        return bilinear.bilinear_form_batch(Q, jnp.swapaxes(K, -1, -2), g)
    c = 1.0 / np.sqrt(Q.shape[-1]) if scale is None else scale
    return jnp.matmul(Q, K) * c


@mistake("2.1", "divided-by-d", "eq-attention-scores",
         "You divided the scores by d_k instead of √d_k: they are √d_k times too small.")
def _scores_by_d(Q, K, g=None, *, scale=None):
    return _scores(Q, K, g, scale=scale, default=lambda d: 1.0 / d)


@mistake("2.1", "metric-scaled-again", "eq-foundations-scores",
         "With a metric you still divided by √d_k: a metric g carries its own scale "
         "(the default one is g = δ/√d_k), so S = Q g K^T with no further factor.")
def _scores_metric_scaled(Q, K, g=None, *, scale=None):
    return _scores(Q, K, g, scale=scale, default=lambda d: 1.0 / np.sqrt(d),
                   metric_scale=1.0 / np.sqrt(Q.shape[-1]))


# -- 2.2 softmax_and_log_partition ---------------------------------------------------------


def _softmax_mistake(key, message, label, **switch):
    @mistake("2.2", key, label, message)
    def wrong(S, mask=None, T=1.0, xp=None):
        return softmax(S, mask, T, **switch)

    wrong.__name__ = f"softmax_{key.replace('-', '_')}"
    return wrong


_softmax_mistake("max-not-subtracted",
                 "You took exp of the scores without subtracting the row maximum: for large "
                 "scores exp overflows to inf and the weights become nan. Subtract the maximum "
                 "first (it cancels in A) and add it back to log Z.",
                 "lem-attention-stable", shift=False)
_softmax_mistake("temperature-ignored",
                 "You left out the temperature: the softmax is of S/T, so at T ≠ 1 your weights "
                 "are too sharp or too flat, and log Z is that of S/T.",
                 "eq-statmech-gibbs", temperature="ignore")
_softmax_mistake("temperature-multiplied",
                 "You multiplied the scores by T instead of dividing: the softmax is of S/T "
                 "(a high temperature flattens the weights).",
                 "eq-statmech-gibbs", temperature="multiply")
_softmax_mistake("temperature-twice",
                 "You divided by T twice (S / T²), e.g. once in the scores and again in the "
                 "softmax: the weights are softmax(S / T), with T applied once.",
                 "eq-statmech-gibbs", temperature="twice")
_softmax_mistake("wrong-axis",
                 "You normalised over the wrong axis (the queries): each query's weights over "
                 "the keys j, the last axis, must sum to one.",
                 "eq-attention-softmax", axis=-2)
_softmax_mistake("mask-ignored",
                 "You ignored the mask: masked keys must get score -inf before the softmax, so "
                 "that they get exactly zero weight.",
                 "eq-attention-masked", use_mask=False)
_softmax_mistake("dead-row-nan",
                 "A fully masked row gives nan: its exps are all zero and you divided 0 by 0. "
                 "Divide by a safe denominator (1 where the row is dead), so its weights are 0.",
                 "rem-attention-fully-masked", dead_rows="none")
_softmax_mistake("single-where",
                 "Your values are right, but the gradient of a fully masked row is nan: a "
                 "'where' after the division or the log does not stop the nan of 0/0 or log 0 "
                 "in the branch it discards. Make the denominator safe before dividing "
                 "(a 'double where').",
                 "rem-attention-fully-masked", dead_rows="single-where", additive_mask=True)


# -- 2.3 attention_output --------------------------------------------------------------------


@mistake("2.3", "divided-by-n_k", "eq-attention-output",
         "You averaged over the keys (divided by n_k): the weights already sum to one, so "
         "O = A V is a weighted sum with no further division.")
def _output_mean(A, V):
    return attention.attention_output(A, V) / A.shape[-1]


@mistake("2.3", "renormalised", "rem-attention-fully-masked",
         "You renormalised the weights: a fully masked row of A is all zero and 0/0 gives nan. "
         "A's rows already sum to one (or are zero), so use A as it is.")
def _output_renormalised(A, V):
    return attention.attention_output(A / jnp.sum(A, axis=-1, keepdims=True), V)


@mistake("2.3", "tensordot-batch", "eq-attention-output",
         "Your result has V's batch axis in the wrong place (a tensordot or a reshape puts it "
         "after A's axes): contract only j and keep the leading axes first, as '...ij,...jb->...ib'.")
def _output_tensordot(A, V):
    return jnp.tensordot(A, V, axes=([-1], [-2]))


# -- 2.4 attention_decomposition ----------------------------------------------------------------


def _decomposition(Q, K, V, mask=None, T=1.0, g=None, *, scale=None, unscaled=False,
                   scores_over_T=False, **switch):
    if unscaled and g is None and scale is None:
        scale = 1.0
    S = attention.attention_scores(Q, K, g, scale=scale)
    A, log_Z = softmax(S, mask, T, **switch)
    O = attention.attention_output(A, V)
    return AttentionParts(S / T if scores_over_T else S, A, log_Z, O)


def _decomposition_mistake(ex, key, label, message, **switch):
    @mistake(ex, key, label, message)
    def wrong(Q, K, V, mask=None, T=1.0, g=None, *, scale=None):
        return _decomposition(Q, K, V, mask, T, g, scale=scale, **switch)

    wrong.__name__ = f"decomposition_{key.replace('-', '_')}"
    return wrong


DECOMPOSITION = [
    ("missing-scale", "eq-attention-scores",
     "Your scores are √d_k times too large: the factor 1/√d_k is missing (S = Q K^T / √d_k when "
     "neither a metric nor a scale is given), so the weights are too sharp.", {"unscaled": True}),
    ("temperature-ignored", "eq-attention-full",
     "You left out the temperature: A = softmax(S / T), so at T ≠ 1 your weights, log Z and "
     "output are those of T = 1.", {"temperature": "ignore"}),
    ("mask-ignored", "eq-attention-masked",
     "You ignored the mask: masked keys must get zero weight (score -inf), and a fully masked "
     "query gets A = 0, O = 0 and log Z = -inf.", {"use_mask": False}),
    ("scores-over-T", "eq-attention-full",
     "You returned S / T as the scores: S is Q g K^T before the temperature; T enters only the "
     "softmax.", {"scores_over_T": True}),
    ("dead-row-nan", "rem-attention-fully-masked",
     "A fully masked query gives nan: its exps are all zero and you divided 0 by 0. A dead row "
     "has A = 0, O = 0 and log Z = -inf.", {"dead_rows": "none"}),
]

for _key, _label, _message, _switch in DECOMPOSITION:
    _decomposition_mistake("2.4", _key, _label, _message, **_switch)


# -- 2.5 low_rank_metric ---------------------------------------------------------------------------


@mistake("2.5", "missing-scale", "prop-attention-lowrank",
         "Your metric is √d_k times too large: M = W_Q W_K^T / √d_k carries the attention scale.")
def _low_rank_unscaled(W_Q, W_K):
    return jnp.einsum("...da,...ea->...de", W_Q, W_K)


@mistake("2.5", "transposed", "eq-attention-lowrank",
         "Your metric is transposed (W_K W_Q^T): its first index d belongs to the query "
         "projection, M_{de} = W_Q^{da} W_K^{ea} / √d_k, which matters since M is not symmetric.")
def _low_rank_transposed(W_Q, W_K):
    return jnp.einsum("...da,...ea->...de", W_K, W_Q) / np.sqrt(W_Q.shape[-1])
