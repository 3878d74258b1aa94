"""Mistakes of chapter 3, Statistical Mechanics: exercises 3.1-3.5."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attn_tensors import statmech

from . import mistake
from ._softmax import softmax

MISTAKES: list = []

# -- 3.1 log_partition_function ---------------------------------------------------------


def _log_z_mistake(key, label, message, **switch):
    @mistake("3.1", key, label, message)
    def wrong(S, mask=None, T=1.0):
        return softmax(S, mask, T, **switch)[1]

    wrong.__name__ = f"log_z_{key.replace('-', '_')}"
    return wrong


_log_z_mistake("max-not-subtracted", "prop-statmech-lse",
               "You summed exp(S/T) directly: for large scores exp overflows and log Z is inf. "
               "Use log-sum-exp: log Z = M + log Σ_j exp(S/T − M) with M the row maximum.",
               shift=False)
_log_z_mistake("max-not-added-back", "prop-statmech-lse",
               "You subtracted the row maximum but did not add it back: log Z = M + log Σ_j "
               "exp(S/T − M), so your log Z is short by M.", add_back_max=False)
_log_z_mistake("temperature-ignored", "def-statmech-log-partition",
               "You left out the temperature: log Z = log Σ_j exp(S^{ij}/T), so at T ≠ 1 "
               "your log Z is that of T = 1.", temperature="ignore")
_log_z_mistake("mask-ignored", "def-statmech-log-partition",
               "You ignored the mask: only the allowed keys are states of the sum, and a fully "
               "masked row has Z = 0, log Z = -inf.", use_mask=False)
_log_z_mistake("nan-gradient-dead-row", "rem-attention-fully-masked",
               "Your values are right, but the gradient of a fully masked row is nan: "
               "where(alive, log z, -inf) still differentiates log 0 in the branch it drops. "
               "Take the log of a safe z (1 on dead rows) as well: a 'double where'.",
               dead_rows="single-where", additive_mask=True)


# -- 3.2 entropy (and 10.3) -------------------------------------------------------------------


def _entropy(A, mask=None, *, guard="double", sign=-1.0, log=jnp.log):
    keep = A > 0 if mask is None else jnp.logical_and(mask, A > 0)
    if guard == "double":
        terms = jnp.where(keep, A * log(jnp.where(keep, A, jnp.ones_like(A))), 0.0)
    elif guard == "single":
        terms = jnp.where(keep, A * log(A), 0.0)
    else:
        terms = A * log(A)
    return sign * jnp.sum(terms, axis=-1)


ENTROPY = [
    ("0-log-0-nan", "def-statmech-entropy",
     "Your entropy is nan at zero weights: A log A at A = 0 is 0 · (−inf) = nan in floating "
     "point. Use the limit 0 log 0 = 0 (keep only A > 0).", {"guard": "none"}),
    ("single-where", "def-statmech-entropy",
     "Your values are right, but the gradient at a zero weight is nan: where(A > 0, A log A, 0) "
     "still differentiates log 0 in the branch it drops. Mask the input of the log too "
     "(a 'double where').", {"guard": "single"}),
    ("sign-flipped", "def-statmech-entropy",
     "Your entropy has the wrong sign: H = −Σ_j A log A is ≥ 0 (log A ≤ 0).", {"sign": 1.0}),
    ("log2", "def-statmech-entropy",
     "You used log base 2: the book's entropy is in nats, H = −Σ_j A ln A, so yours is "
     "1/ln 2 times too large.", {"log": jnp.log2}),
]


def entropy_mistake(ex, key, label, message, switch):
    @mistake(ex, key, label, message)
    def wrong(A, mask=None):
        return _entropy(A, mask, **switch)

    wrong.__name__ = f"entropy_{key.replace('-', '_')}"
    return wrong


for _key, _label, _message, _switch in ENTROPY:
    entropy_mistake("3.2", _key, _label, _message, _switch)


# -- 3.3 free_energy -----------------------------------------------------------------------


@mistake("3.3", "missing-T", "def-statmech-free-energy",
         "You left out the factor T: F = −T log Z, so at T ≠ 1 your free energy is off by the "
         "factor T.")
def _free_energy_no_T(S, mask=None, T=1.0):
    return -statmech.log_partition_function(S, mask, T)


@mistake("3.3", "sign-flipped", "def-statmech-free-energy",
         "Your free energy has the wrong sign: F = −T log Z (a fully masked row has F = +inf).")
def _free_energy_sign(S, mask=None, T=1.0):
    return T * statmech.log_partition_function(S, mask, T)


@mistake("3.3", "max-not-subtracted", "prop-statmech-lse",
         "You computed log Z by summing exp(S/T) directly: for large scores exp overflows and "
         "F is -inf. Subtract the row maximum first (log-sum-exp).")
def _free_energy_overflow(S, mask=None, T=1.0):
    return -T * softmax(S, mask, T, shift=False)[1]


# -- 3.4 heat_capacity ------------------------------------------------------------------------


def _moments(S, mask, T):
    A = statmech.gibbs_distribution(S, mask, T)
    S0 = jnp.where(A > 0, S, 0.0) if mask is None else jnp.where(mask, S, 0.0)
    return A, S0


@mistake("3.4", "one-pass-variance", "thm-statmech-heat-capacity",
         "You computed the variance in one pass, <S²> − <S>²: for large scores both terms are "
         "huge and nearly equal, and the difference is rounding noise. Centre first: "
         "Σ_j A (S − <S>)².")
def _heat_one_pass(S, mask=None, T=1.0):
    A, S0 = _moments(S, mask, T)
    mean = jnp.sum(A * S0, axis=-1)
    return (jnp.sum(A * S0 * S0, axis=-1) - mean * mean) / (T * T)


@mistake("3.4", "missing-T-squared", "def-statmech-heat-capacity",
         "You returned the variance of the energy without dividing by T²: C = Var(E) / T².")
def _heat_no_T(S, mask=None, T=1.0):
    return statmech.energy_variance(S, mask, T)


@mistake("3.4", "divided-by-T", "def-statmech-heat-capacity",
         "You divided the variance by T instead of T²: C = Var(E) / T².")
def _heat_by_T(S, mask=None, T=1.0):
    return statmech.energy_variance(S, mask, T) / T


# -- 3.5 zero_temperature_limit -------------------------------------------------------------


@mistake("3.5", "argmax", "thm-statmech-limits",
         "You put all the weight on the first maximum (argmax): at T → 0 the weight is shared "
         "equally among all the keys that tie for the maximum.")
def _zero_t_argmax(S, mask=None):
    s = S if mask is None else jnp.where(mask, S, -jnp.inf)
    hot = jax.nn.one_hot(jnp.argmax(s, axis=-1), S.shape[-1], dtype=S.dtype)
    alive = jnp.any(jnp.isfinite(s), axis=-1, keepdims=True)
    return jnp.where(alive, hot, 0.0)


@mistake("3.5", "mask-ignored", "thm-statmech-limits",
         "You took the maximum over all keys, masked ones included: the ground states are the "
         "allowed keys at the maximum of the allowed scores, and a fully masked row has none.")
def _zero_t_unmasked(S, mask=None):
    return statmech.zero_temperature_limit(S, None)


@mistake("3.5", "ties-not-shared", "thm-statmech-limits",
         "You gave every key at the maximum the full weight 1: tied ground states share the "
         "weight equally, 1/n each, so that the row still sums to one.")
def _zero_t_unshared(S, mask=None):
    A = statmech.zero_temperature_limit(S, mask)
    return (A > 0).astype(S.dtype)
