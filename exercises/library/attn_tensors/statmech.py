"""Part III, Statistical Mechanics: the softmax over keys is a Gibbs distribution.

Each query ``i`` is a small physical system whose states are the keys ``j``.
A score is a negative energy and the softmax temperature is the temperature:

    E^{ij} = -S^{ij},     beta = 1/T
    A^{ij} = exp(S^{ij}/T) / Z^i,        Z^i = sum_j exp(S^{ij}/T)
    log Z^i                               (log-partition, by log-sum-exp)
    F^i    = -T log Z^i                   (free energy)
    <E>^i  = sum_j A^{ij} E^{ij} = -sum_j A^{ij} S^{ij}
    H^i    = -sum_j A^{ij} log A^{ij} = log Z^i - <S>^i / T
    C^i    = Var_A(E)^i / T^2            (heat capacity)

and the identities every test of this module checks:

    F = <E> - T H              H = -dF/dT              <E> = d(beta F)/d beta
    C = d<E>/dT = T dH/dT = -T d^2F/dT^2 = beta^2 d^2(log Z)/d beta^2

Shapes: scores ``S (..., n_q, n_k)`` or ``(..., n_k)``; the key index ``j``
is the last axis and every leading axis is carried along.  Per-row
quantities (``log Z``, ``F``, ``H``, ``<E>``, ``C``) drop the key axis.
``T`` is a positive number (or an array broadcasting against
``S[..., :1]``); ``T <= 0`` raises :class:`AttentionInputError`, whose message
names :func:`zero_temperature_limit` and :func:`infinite_temperature_limit`.

Masks are boolean "may attend" arrays broadcasting against ``S`` (see
:mod:`attn_tensors.softmax`).  A score of ``-inf`` is a masked key; NaN or
``+inf`` scores, and NaN, infinite or negative weights ``A``/``p``, raise
:class:`AttentionInputError`.  A **fully masked row** (a system with no states) has

    A = 0,  log Z = -inf,  F = +inf,  H = 0,  <E> = 0,  Var(E) = C = 0,
    exp(H) -> 0 states,  normalized entropy 0,  both limits 0,

with no NaN in values or gradients.  ``F = <E> - T H`` holds on every row
with at least one allowed key; on a fully masked row the two sides are
``(+inf, 0)``.

Stability: each row is shifted by its largest allowed score ``S_max^i`` (a
constant for autodiff) before the softmax, so with ``S' = S - S_max`` the
pieces are small and of one sign:

    log Z = log Z' + S_max/T,   log Z' >= 0
    H     = log Z' + sum_j A^{ij} (S_max^i - S^{ij}) / T     (a sum of two terms >= 0)
    <E>   = -S_max - sum_j A^{ij} (S^{ij} - S_max^i)

so ``H`` never suffers the cancellation of ``log Z - <S>/T`` at low ``T``,
and scores of +-1e4 in float32 give finite results.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ._checks import (
    AttentionInputError,
    check_scores,
    check_temperature,
    check_weights,
    require_ndim,
)
from .backend import Backend, namespace
from .softmax import _mask_array, softmax_and_log_partition

__all__ = [
    "gibbs_distribution",
    "boltzmann_from_energies",
    "log_partition_function",
    "free_energy",
    "entropy",
    "entropy_from_scores",
    "normalized_entropy",
    "effective_number_of_states",
    "expected_energy",
    "energy_variance",
    "heat_capacity",
    "TemperatureSweep",
    "temperature_sweep",
    "zero_temperature_limit",
    "infinite_temperature_limit",
    "free_energy_identity",
    "variational_free_energy",
]

_INF = float("inf")


# -- shared pieces -------------------------------------------------------------


def _scores(xp: Backend, S: Any, name: str = "S") -> Any:
    (S,) = xp.floating(xp.asarray(S))
    require_ndim(S, name, "j")
    if name == "E":  # an energy of +inf is a score of -inf
        check_scores(xp, **{"-E": -S})
    else:
        check_scores(xp, **{name: S})
    return S


def _fold_neg_inf(xp: Backend, m: Any, S: Any) -> tuple[Any, Any]:
    """A score of -inf is a masked key: (mask and S > -inf, S with those entries 0).

    Afterwards every allowed score is finite, so no 0 * inf appears in the
    weighted sums (nor in their gradients).
    """
    finite = S > -_INF
    m = finite if m is None else xp.logical_and(m, finite)
    return m, xp.where(finite, S, xp.zeros_like(S))


def _allowed(xp: Backend, mask: Any, X: Any) -> Any:
    """Boolean "may attend" array of the broadcast shape of ``mask`` and ``X``."""
    if mask is None:
        return xp.ones(X.shape, dtype=xp.module.bool_)
    shape = tuple(np.broadcast_shapes(tuple(mask.shape), tuple(X.shape)))
    return xp.broadcast_to(mask, shape)


class _Gibbs(NamedTuple):
    """One Gibbs computation, shifted by the row maximum (keys axis kept)."""

    xp: Backend
    A: Any  # A^{ij}
    log_Zs: Any  # log Z'^i = log Z^i - S_max^i/T (>= 0; 0 on dead rows), keepdims
    M: Any  # S_max^i = max_j S^{ij} over allowed keys (0 on dead rows), keepdims
    D: Any  # S^{ij} - S_max^i (<= 0 on allowed keys)
    mean_D: Any  # sum_j A^{ij} (S^{ij} - S_max^i), keepdims
    alive: Any  # True where the row has at least one allowed key, keepdims
    T: Any


def _gibbs(S: Any, mask: Any, T: Any) -> _Gibbs:
    xp = namespace(S, mask, T)
    S = _scores(xp, S)
    check_temperature(T, xp, S)
    m, S = _fold_neg_inf(xp, _mask_array(xp, mask, S), S)
    S_allowed = S if m is None else xp.where(m, S, xp.scalar(-_INF, S))
    # S_max^i = max_j S^{ij} over allowed keys; T > 0, so max_j S^{ij}/T = S_max^i/T.
    # A constant for autodiff: every formula below holds for any shift M.
    M = xp.stop_gradient(xp.max(S_allowed, axis=-1, keepdims=True))
    M = xp.where(xp.isfinite(M), M, xp.zeros_like(M))
    D = S - M
    A, log_Zs = softmax_and_log_partition(D, m, T, xp)
    log_Zs = log_Zs[..., None]
    alive = xp.isfinite(log_Zs)
    # double where: dead rows get a harmless 0 here and their value later
    log_Zs = xp.where(alive, log_Zs, xp.zeros_like(log_Zs))
    # sum_j A^{ij} D^{ij} over the keys of positive weight only: a key of
    # weight 0 may have D/T = -inf, and 0 * inf is NaN in the gradient
    D_seen = xp.where(A > 0, D, xp.zeros_like(D))
    mean_D = xp.sum(A * D_seen, axis=-1, keepdims=True)
    return _Gibbs(xp, A, log_Zs, M, D, mean_D, alive, T)


def _row(T: Any) -> Any:
    """T without its key axis, for per-row quantities (numbers pass through)."""
    if getattr(T, "ndim", 0) == 0:
        return T
    return T[..., 0]


def _entropy(g: _Gibbs) -> Any:
    # H^i = log Z'^i - sum_j A^{ij} (S^{ij} - S_max^i) / T   (both terms >= 0)
    xp = g.xp
    H = g.log_Zs - g.mean_D / g.T
    return xp.where(g.alive, H, xp.zeros_like(H))[..., 0]


def _free_energy(g: _Gibbs) -> Any:
    raise NotImplementedError('Exercise 3.3: implement free_energy (Free energy); run `attn-course check 3.3`')


def _expected_energy(g: _Gibbs) -> Any:
    # <E>^i = -sum_j A^{ij} S^{ij} = -S_max^i - sum_j A^{ij} (S^{ij} - S_max^i)
    # (dead rows: M = 0 and A = 0, so <E> = 0)
    return -(g.M + g.mean_D)[..., 0]


def _energy_variance(g: _Gibbs, T: Any = 1.0) -> Any:
    raise NotImplementedError('Exercise 3.4: implement heat_capacity (Heat capacity); run `attn-course check 3.4`')


def _weight_entropy(xp: Backend, A: Any, m: Any) -> tuple[Any, Any]:
    """-sum_j A^{ij} log A^{ij} with 0 log 0 = 0, and the kept entries."""
    raise NotImplementedError('Exercise 3.2: implement entropy (Entropy that is exact at zero weights); run `attn-course check 3.2`')


# -- distributions ---------------------------------------------------------------


def gibbs_distribution(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """A^{ij} = exp(S^{ij}/T) / Z^i,  Z^i = sum_j exp(S^{ij}/T).

    The softmax read as a Gibbs distribution with energies
    ``E^{ij} = -S^{ij}``: identical to :func:`attn_tensors.softmax.softmax`.
    Masked keys get 0; a fully masked row is all 0.
    """
    xp = namespace(S, mask, T)
    S = _scores(xp, S)
    raise NotImplementedError('Exercise 10.2: implement gibbs_distribution (The Gibbs distribution at temperature T); run `attn-course check 10.2`')


def boltzmann_from_energies(E: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """p^{ij} = exp(-E^{ij}/T) / Z^i,  Z^i = sum_j exp(-E^{ij}/T).

    Boltzmann weights from energies: ``gibbs_distribution(-E, mask, T)``.
    """
    xp = namespace(E, mask, T)
    E = _scores(xp, E, "E")
    return softmax_and_log_partition(-E, mask, T, xp)[0]


def zero_temperature_limit(S: Any, mask: Any = None) -> Any:
    """A_0^{ij} = [S^{ij} = max_k S^{ik}] / #{k : S^{ik} = max_k S^{ik}}.

    The limit of the Gibbs distribution as ``T -> 0``: uniform over the
    allowed keys that reach the row's maximum score (one-hot when the maximum
    is unique; tied keys share the weight equally, which is what the softmax
    tends to).  Masked keys get 0; a fully masked row is all 0.
    """
    xp = namespace(S, mask)
    S = _scores(xp, S)
    m = _mask_array(xp, mask, S)
    raise NotImplementedError('Exercise 3.5: implement zero_temperature_limit (Zero-temperature limit with ties); run `attn-course check 3.5`')


def infinite_temperature_limit(S: Any, mask: Any = None) -> Any:
    """A_inf^{ij} = M^{ij} / sum_k M^{ik}  (the T -> inf softmax).

    Uniform over the allowed keys: ``M^{ij}`` is the mask (all True without
    one), so every allowed key gets ``1/n_allowed``.  A fully masked row is
    all 0.
    """
    xp = namespace(S, mask)
    S = _scores(xp, S)
    m, S = _fold_neg_inf(xp, _mask_array(xp, mask, S), S)
    allowed = _allowed(xp, m, S).astype(S.dtype)
    n = xp.sum(allowed, axis=-1, keepdims=True)
    return allowed / xp.where(n > 0, n, xp.ones_like(n))


# -- thermodynamic potentials ----------------------------------------------------


def log_partition_function(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """log Z^i = log sum_j exp(S^{ij}/T), by log-sum-exp (Z itself is never formed).

    ``-inf`` for a fully masked row.
    """
    xp = namespace(S, mask, T)
    S = _scores(xp, S)
    raise NotImplementedError('Exercise 3.1: implement log_partition_function (Stable, masked log-partition function); run `attn-course check 3.1`')


def free_energy(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """F^i = -T log Z^i = -T log sum_j exp(S^{ij}/T).

    ``+inf`` for a fully masked row (no states: ``Z = 0``); the gradient there
    is 0, not NaN.  ``F -> -max_j S^{ij}`` as ``T -> 0``.
    """
    return _free_energy(_gibbs(S, mask, T))


def expected_energy(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """<E>^i = sum_j A^{ij} E^{ij} = -sum_j A^{ij} S^{ij}  (0 on a dead row)."""
    return _expected_energy(_gibbs(S, mask, T))


def energy_variance(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """Var(E)^i = sum_j A^{ij} (E^{ij} - <E>^i)^2 = sum_j A^{ij} (S^{ij} - <S>^i)^2.

    Computed centred (two passes), so it is never negative by cancellation.
    0 for a fully masked row.
    """
    return _energy_variance(_gibbs(S, mask, T))


def heat_capacity(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """C^i = Var(E)^i / T^2 = d<E>^i/dT = -T d^2F^i/dT^2  (0 for a fully masked row)."""
    g = _gibbs(S, mask, T)
    raise NotImplementedError('Exercise 3.4: implement heat_capacity (Heat capacity); run `attn-course check 3.4`')


# -- entropy ----------------------------------------------------------------------


def entropy(A: Any, mask: Any = None) -> Any:
    """H^i = -sum_j A^{ij} log A^{ij}, with 0 log 0 = 0 (exact at zero weights).

    Takes attention weights ``A`` (any distribution over the last axis).  With
    a mask, only allowed keys count.  Zero weights contribute exactly 0 and
    ``jax.grad``/``mx.grad`` give 0 (not NaN) at them: a one-hot row has
    ``H = 0`` exactly.  A fully masked (all-zero) row has ``H = 0``.  For the
    entropy of a Gibbs distribution from its scores prefer
    :func:`entropy_from_scores`, which never forms ``log A``.
    """
    xp = namespace(A, mask)
    (A,) = xp.floating(xp.asarray(A))
    require_ndim(A, "A", "j")
    check_weights(xp, A=A)
    m = _mask_array(xp, mask, A)
    return _weight_entropy(xp, A, m)[0]


def entropy_from_scores(S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """H^i = log Z^i - <S>^i / T = log Z^i - sum_j A^{ij} S^{ij} / T.

    The Gibbs entropy straight from scores, computed as
    ``log Z'^i + sum_j A^{ij} (S_max^i - S^{ij}) / T`` with ``S_max^i`` the row
    maximum: two non-negative terms, so no cancellation at low ``T`` and no
    ``log`` of a tiny weight.  0 for a fully masked row.
    """
    return _entropy(_gibbs(S, mask, T))


def _n_allowed(xp: Backend, A: Any, m: Any) -> Any:
    """n^i = sum_j M^{ij}: how many keys query i may attend."""
    return xp.sum(_allowed(xp, m, A).astype(A.dtype), axis=-1)


def normalized_entropy(A: Any, mask: Any = None) -> Any:
    """h^i = H^i / log n^i,  n^i = sum_j M^{ij}: entropy over its maximum, in [0, 1].

    ``n^i`` counts the keys query ``i`` may attend (``n_k`` without a mask).
    A row with one allowed key, or none, has nothing to spread over and gives
    0 (``log 1 = 0`` would otherwise divide 0 by 0).
    """
    xp = namespace(A, mask)
    (A,) = xp.floating(xp.asarray(A))
    require_ndim(A, "A", "j")
    check_weights(xp, A=A)
    m = _mask_array(xp, mask, A)
    raise NotImplementedError('Exercise 10.4: implement normalized_entropy (Normalized entropy under a mask); run `attn-course check 10.4`')


def effective_number_of_states(A: Any, mask: Any = None) -> Any:
    """N^i = exp(H^i) = exp(-sum_j A^{ij} log A^{ij}): the perplexity of row i.

    1 for a one-hot row, ``n`` for a uniform row over ``n`` keys.  A row with
    no weight at all (fully masked) occupies no state and gives 0.
    """
    xp = namespace(A, mask)
    (A,) = xp.floating(xp.asarray(A))
    require_ndim(A, "A", "j")
    check_weights(xp, A=A)
    m = _mask_array(xp, mask, A)
    H, keep = _weight_entropy(xp, A, m)
    occupied = xp.any(keep, axis=-1)
    return xp.where(occupied, xp.exp(H), xp.zeros_like(H))


# -- identities and the variational principle --------------------------------------


def free_energy_identity(S: Any, mask: Any = None, T: Any = 1.0) -> tuple[Any, Any]:
    """(F^i, <E>^i - T H^i): both sides of F = <E> - T H, from separate routes.

    ``F`` comes from the log-partition (``-T log Z``); ``<E>`` from the
    weighted scores and ``H`` from the weights (``-sum_j A log A``), so the
    two sides agree only if the softmax really is the Gibbs distribution.
    On a fully masked row they are ``(+inf, 0)``: the identity needs a state.
    """
    g = _gibbs(S, mask, T)
    xp = g.xp
    m = _mask_array(xp, mask, g.A)
    H_w, _ = _weight_entropy(xp, g.A, m)
    T_row = _row(g.T)
    return _free_energy(g), _expected_energy(g) - T_row * H_w


def variational_free_energy(p: Any, S: Any, mask: Any = None, T: Any = 1.0) -> Any:
    """F[p]^i = -sum_j p^{ij} S^{ij} + T sum_j p^{ij} log p^{ij} = <E>_p - T H(p).

    For any distribution ``p`` over the keys (``p^{ij} >= 0``,
    ``sum_j p^{ij} = 1``).  The Gibbs distribution minimises it, and the
    minimum is the free energy: ``F[p] = F + T KL(p || A) >= F``.  A masked
    key has infinite energy, so weight on one gives ``+inf``; so does a fully
    masked row (no distribution exists, and ``F = +inf`` there).
    """
    xp = namespace(p, S, mask, T)
    p, S = xp.floating(xp.asarray(p), xp.asarray(S))
    require_ndim(S, "S", "j")
    require_ndim(p, "p", "j")
    if p.shape[-1] != S.shape[-1]:
        raise AttentionInputError(
            f"p has n_k={p.shape[-1]} but S has n_k={S.shape[-1]} (index j must match)"
        )
    check_scores(xp, S=S)
    check_weights(xp, p=p)
    check_temperature(T, xp, S)
    m, S = _fold_neg_inf(xp, _mask_array(xp, mask, S), S)
    allowed = _allowed(xp, m, S)
    support = p > 0
    keep = xp.logical_and(support, allowed)
    # double where on p and S: no 0 * inf, no log 0, clean gradients
    p_keep = xp.where(keep, p, xp.zeros_like(p))
    S_keep = xp.where(keep, S, xp.zeros_like(S))
    U = -xp.sum(p_keep * S_keep, axis=-1)  # <E>_p^i = -sum_j p^{ij} S^{ij}
    H, _ = _weight_entropy(xp, p_keep, None)
    T_row = _row(T)
    F_p = U - T_row * H
    leak = xp.any(xp.logical_and(support, xp.logical_not(allowed)), axis=-1)
    dead = xp.logical_not(xp.any(allowed, axis=-1))
    bad = xp.logical_or(leak, dead)
    return xp.where(bad, xp.full(F_p.shape, _INF, dtype=F_p.dtype), F_p)


# -- temperature sweep ---------------------------------------------------------------


class TemperatureSweep(NamedTuple):
    """Gibbs quantities on a leading temperature axis ``t``."""

    temperatures: Any  # T_t, shape (n_T,)
    weights: Any  # A^{ij}(T_t), shape (n_T, ..., n_q, n_k)
    entropy: Any  # H^i(T_t), shape (n_T, ..., n_q)
    free_energy: Any  # F^i(T_t)
    expected_energy: Any  # <E>^i(T_t)
    heat_capacity: Any  # C^i(T_t)


def temperature_sweep(S: Any, temperatures: Any, mask: Any = None) -> TemperatureSweep:
    """X[t, ..., i] = X^i(T_t): A, H, F, <E> and C at every T_t, on a leading axis t.

    One vectorised evaluation: the temperatures broadcast as an array of
    shape ``(n_T, 1, ..., 1)`` against the scores, no Python loop.  Every
    temperature must be positive (``T <= 0`` raises; use the limit
    functions for ``T -> 0`` and ``T -> inf``).
    """
    xp = namespace(S, mask, temperatures)
    S = _scores(xp, S)
    temps = xp.asarray(temperatures, dtype=S.dtype)
    if temps.ndim != 1 or temps.shape[0] == 0:
        raise AttentionInputError(
            f"temperatures must be a non-empty 1-D list; got shape {tuple(temps.shape)}"
        )
    check_temperature(temps, xp, S)
    m = _mask_array(xp, mask, S)
    out_ndim = len(_allowed(xp, m, S).shape)
    # T_t broadcast as (n_T, 1, ..., 1): a new leading axis t
    T = xp.reshape(temps, (temps.shape[0],) + (1,) * out_ndim)
    g = _gibbs(S, m, T)
    C = _energy_variance(g, g.T)
    return TemperatureSweep(
        temps, g.A, _entropy(g), _free_energy(g), _expected_energy(g), C
    )
