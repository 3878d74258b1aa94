"""Mistakes of chapter 10, Worked Examples: exercises 10.1-10.5.

10.1, 10.3 and 10.5 grade functions of chapters 2, 3 and 5 on the worked
examples: their entries are those chapters' entries that the examples can
show (the examples run at T = 1, so the temperature mistakes do not show).
"""

from __future__ import annotations

import jax.numpy as jnp

from . import also, ch02, ch03, ch05, mistake
from ._softmax import softmax

MISTAKES: list = []

MISTAKES += [also("10.1", m) for m in ch02.MISTAKES
             if m.exercise == "2.4" and m.key in ("missing-scale", "mask-ignored", "dead-row-nan")]
MISTAKES += [also("10.3", m) for m in ch03.MISTAKES if m.exercise == "3.2"]
MISTAKES += [also("10.5", m) for m in ch05.MISTAKES
             if m.exercise == "5.1" and m.key != "temperature-missing"]

# -- 10.2 gibbs_distribution ------------------------------------------------------------------------


def _gibbs_mistake(key, label, message, **switch):
    @mistake("10.2", key, label, message)
    def wrong(S, mask=None, T=1.0):
        return softmax(S, mask, T, **switch)[0]

    wrong.__name__ = f"gibbs_{key.replace('-', '_')}"
    return wrong


_gibbs_mistake("temperature-ignored", "eq-statmech-gibbs",
               "You left out the temperature: A^{ij} = exp(S^{ij}/T) / Z^i, so your weights are "
               "those of T = 1 at every temperature.", temperature="ignore")
_gibbs_mistake("temperature-multiplied", "eq-statmech-gibbs",
               "You multiplied the scores by T instead of dividing: a low temperature must sharpen "
               "the weights (towards the maximum), a high one flatten them.", temperature="multiply")
_gibbs_mistake("temperature-twice", "eq-statmech-gibbs",
               "You divided by T twice (S / T²): the weights are exp(S/T) / Z, with T applied once.",
               temperature="twice")
_gibbs_mistake("max-not-subtracted", "lem-statmech-shift",
               "You took exp(S/T) without subtracting the row maximum: at a low temperature S/T is "
               "large, exp overflows to inf and the weights are nan. Divide by T, then subtract "
               "the maximum.", shift=False)
_gibbs_mistake("dead-row-nan", "rem-attention-fully-masked",
               "A fully masked row gives nan: its exps are all zero and you divided 0 by 0. Its "
               "weights are all 0.", dead_rows="none")


# -- 10.4 normalized_entropy -------------------------------------------------------------------------


def _h(A, mask):
    keep = A > 0 if mask is None else jnp.logical_and(mask, A > 0)
    return -jnp.sum(jnp.where(keep, A * jnp.log(jnp.where(keep, A, 1.0)), 0.0), axis=-1)


def _n(A, mask):
    return jnp.sum(jnp.ones_like(A) if mask is None else mask.astype(A.dtype), axis=-1)


@mistake("10.4", "all-keys-counted", "prop-statmech-entropy-range",
         "You divided by the log of the number of all keys: the maximum entropy of a row is "
         "log n with n the keys it may attend, so masked keys do not count.")
def _normalized_all_keys(A, mask=None):
    n = jnp.full(A.shape[:-1], A.shape[-1], dtype=A.dtype)
    return _h(A, mask) / jnp.log(n)


@mistake("10.4", "n-le-1-nan", "prop-statmech-entropy-range",
         "A row with one allowed key (or none) gives nan: H = 0 and log 1 = 0 (or log 0), so you "
         "divided 0 by 0. Such rows have nothing to spread over: give them 0.")
def _normalized_nan(A, mask=None):
    return _h(A, mask) / jnp.log(_n(A, mask))


@mistake("10.4", "not-normalised", "prop-statmech-entropy-range",
         "You returned the entropy H itself: the normalised entropy divides it by its maximum, "
         "h = H / log n, so that it lies in [0, 1].")
def _normalized_plain(A, mask=None):
    return _h(A, mask)
