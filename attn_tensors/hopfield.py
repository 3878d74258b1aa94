"""Part VIII, Hopfield Networks: classical associative memory and attention.

Classical network (Hopfield 1982): ``N`` binary neurons ``s_i = +-1`` store
``M`` patterns ``xi^{mu i}`` (array ``patterns`` of shape ``(..., M, N)``)::

    W_{ij} = (1/N) sum_mu xi^{mu i} xi^{mu j}   for i != j,   W_{ii} = 0
    E(s)   = -1/2 s^i W_{ij} s^j
    s_i   <- sign(W_{ij} s^j)                    with sign(0) = +1

Self-connections are excluded (``W_{ii} = 0``).  With a symmetric ``W`` and
zero diagonal an asynchronous update (one neuron at a time) never raises
``E``: flipping ``s_i`` changes the energy by ``-(s_i^new - s_i^old) h_i <= 0``
with ``h_i = W_{ij} s^j``.  (A synchronous update of all neurons at once
may end in a 2-cycle instead of a fixed point.)  The tie rule
``sign(0) = +1`` is fixed; a tie only occurs when ``h_i`` is exactly zero,
which for +-1 patterns and ``N`` a power of two is exact arithmetic.

Modern (continuous) network, Ramsauer et al. 2020, "Hopfield Networks is All
You Need".  ``M`` stored patterns are the rows ``X^{mu a}`` of ``X (..., M, d)``;
the state is ``xi^a`` of shape ``(..., d)``.  With
``lse_beta(z) = (1/beta) log sum_mu exp(beta z_mu)`` their energy is::

    E(xi) = -(1/beta) log sum_mu exp(beta X^{mu a} xi_a) + 1/2 xi^a xi_a
            [+ (1/beta) log M + 1/2 R^2,   R = max_mu |X^mu|]

The bracket holds Ramsauer's constants (they make ``0 <= E <= 2 R^2``); pass
``constants=True`` to include them.  Note the ``1/beta`` in front of the
log-sum-exp: the course notes' ``E = -lse(beta X xi) + 1/2 |xi|^2`` omits it,
and for that function the update below is *not* a descent step.  Splitting
``E = E_convex + E_concave`` with ``E_convex = 1/2 |xi|^2`` and
``E_concave = -lse_beta(X xi)``, the concave-convex procedure (CCCP) solves
``grad E_convex(xi_new) = -grad E_concave(xi)``, i.e.::

    xi_new^b = X^{mu b} softmax_mu(beta X^{mu a} xi_a)

so ``E(xi_new) <= E(xi)`` for every ``X``, ``beta > 0`` and ``xi`` (and
``grad E = xi - xi_new``).  This is attention with query ``xi``, keys ``X``,
values ``X`` and temperature ``T = 1/beta`` (raw dot products, no
``1/sqrt(d)``); :func:`modern_update` is implemented by calling
:func:`attn_tensors.attention.attention_decomposition`, so the identity is
structural.  Capacity: Ramsauer et al. (Theorem 3) show that the number of
random patterns on a sphere that can be stored and retrieved grows
exponentially in ``d`` (a bound of the form ``sqrt(p) c^{(d-1)/4}``); the
course notes' ``M ~ exp(d/2)`` is not their statement.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from ._checks import (
    AttentionInputError,
    check_finite,
    require_match,
    require_ndim,
    require_square,
)
from .attention import attention_decomposition
from .backend import Backend, is_concrete, namespace

__all__ = [
    "HopfieldTrajectory",
    "hebbian_weights",
    "classical_energy",
    "classical_update",
    "classical_async_sweep",
    "classical_retrieve",
    "classical_capacity_curve",
    "modern_energy",
    "hopfield_attention",
    "modern_update",
    "modern_retrieve",
    "modern_capacity_curve",
]


class HopfieldTrajectory(NamedTuple):
    """States and energies along a retrieval; axis 0 is the step t = 0..steps."""

    states: Any  # (steps + 1, ..., N or d): states[0] is the initial state
    energies: Any  # (steps + 1, ...): energies[t] = E(states[t])

    @property
    def final(self) -> Any:
        """The state after the last step."""
        return self.states[-1]


# -- adapter: the one place where JAX and MLX differ in this module ------------


def _scan(
    xp: Backend,
    step: Callable[[Any, Any], tuple[Any, Any]],
    carry: Any,
    xs: Any = None,
    length: int | None = None,
) -> tuple[Any, Any]:
    """ADAPTER (JAX/MLX): ``carry, ys = scan(step, carry, xs)``.

    JAX uses ``jax.lax.scan`` (traced once, jittable, differentiable); MLX
    has no scan primitive, so it runs a Python loop over the leading axis of
    ``xs`` (or ``length`` times) and stacks the outputs.  ``ys`` may be None
    or a tuple of arrays.  Candidate for ``backend.py``.
    """
    if xp.name == "jax":
        return jax.lax.scan(step, carry, xs, length=length)
    n = xs.shape[0] if xs is not None else int(length)
    outs = []
    for k in range(n):
        carry, y = step(carry, None if xs is None else xs[k])
        outs.append(y)
    if not outs or outs[0] is None:
        return carry, None
    if isinstance(outs[0], tuple):
        return carry, tuple(xp.stack(list(col)) for col in zip(*outs))
    return carry, xp.stack(outs)


# -- classical network ----------------------------------------------------------


def _sign(xp: Backend, h: Any) -> Any:
    """sign(h) with the tie rule sign(0) = +1, in the dtype of h."""
    return xp.where(h >= 0, xp.ones_like(h), -xp.ones_like(h))


def _check_ws(W: Any, s: Any) -> None:
    require_square(W, "W", "ij")
    require_ndim(s, "s", "j")
    require_match("j", ("W", "N", W.shape[-1]), ("s", "N", s.shape[-1]))


def hebbian_weights(patterns: Any) -> Any:
    """W_{ij} = (1/N) xi^{mu i} xi^{mu j} for i != j, and W_{ii} = 0.

    ``patterns`` has shape ``(..., M, N)`` (pattern index mu, neuron i);
    ``W`` has shape ``(..., N, N)``, symmetric with a zero diagonal (no
    self-connections).
    """
    xp = namespace(patterns)
    ### BEGIN SOLUTION 8.1
    (P,) = xp.floating(xp.asarray(patterns))
    require_ndim(P, "patterns", ("mu", "i"))
    check_finite(xp, patterns=P)
    N = P.shape[-1]
    # W_{ij} = (1/N) xi^{mu i} xi^{mu j}   (m = mu)
    W = xp.einsum("...mi,...mj->...ij", P, P) / N
    off_diagonal = 1 - xp.eye(N, dtype=W.dtype)
    return W * off_diagonal
    ### END SOLUTION


def classical_energy(W: Any, s: Any) -> Any:
    """E = -1/2 s^i W_{ij} s^j for states s of shape (..., N)."""
    xp = namespace(W, s)
    W, s = xp.floating(xp.asarray(W), xp.asarray(s))
    _check_ws(W, s)
    # E = -1/2 s^i W_{ij} s^j
    return -0.5 * xp.einsum("...i,...ij,...j->...", s, W, s)


def classical_async_sweep(W: Any, s: Any, order: Any) -> Any:
    """s_i <- sign(W_{ij} s^j), one neuron i at a time, for i in ``order``.

    ``order`` is a 1-D integer array of neuron indices (repeats allowed),
    processed left to right; each update sees the states already updated.
    Ties follow sign(0) = +1.  On JAX the loop is a ``lax.scan`` (jittable);
    on MLX the adapter :func:`_scan` runs a Python loop.
    """
    xp = namespace(W, s)
    W, s = xp.floating(xp.asarray(W), xp.asarray(s))
    _check_ws(W, s)
    ### BEGIN SOLUTION 8.2
    order = xp.asarray(order)
    N = s.shape[-1]
    if order.ndim != 1:
        raise AttentionInputError(
            f"order must be a 1-D array of neuron indices i; got shape {tuple(order.shape)}"
        )
    if is_concrete(order) and order.shape[0] > 0:
        if xp.any_true((order < 0) | (order >= N)):
            raise AttentionInputError(
                f"order holds neuron indices outside 0..{N - 1} (index i has N={N})"
            )
    return _async_sweep(xp, W, s, order)
    ### END SOLUTION


def _async_sweep(xp: Backend, W: Any, s: Any, order: Any) -> Any:
    """s_i <- sign(W_{ij} s^j) for i in ``order`` (checked inputs); also used by
    :func:`classical_update` in asynchronous mode."""
    ### BEGIN SOLUTION 8.2
    neurons = xp.arange(s.shape[-1])

    def step(state, i):
        # h_i = W_{ij} s^j for the one neuron i
        h = xp.einsum("...j,...j->...", W[..., i, :], state)
        new = _sign(xp, h)[..., None]
        return xp.where(neurons == i, new, state), None

    s, _ = _scan(xp, step, s, order)
    return s
    ### END SOLUTION


def classical_update(W: Any, s: Any, *, mode: str = "synchronous") -> Any:
    """s_i <- sign(W_{ij} s^j) with sign(0) = +1 (all i at once, or one sweep).

    ``mode="synchronous"`` updates every neuron from the same old state;
    ``mode="asynchronous"`` runs one sweep ``i = 0, 1, ..., N-1``
    (:func:`classical_async_sweep`).
    """
    xp = namespace(W, s)
    W, s = xp.floating(xp.asarray(W), xp.asarray(s))
    _check_ws(W, s)
    if mode == "asynchronous":
        return _async_sweep(xp, W, s, xp.arange(s.shape[-1]))
    if mode != "synchronous":
        raise ValueError(f"mode must be 'synchronous' or 'asynchronous'; got {mode!r}")
    # h_i = W_{ij} s^j
    h = xp.einsum("...ij,...j->...i", W, s)
    return _sign(xp, h)


def classical_retrieve(
    W: Any, s: Any, steps: int, *, mode: str = "synchronous"
) -> HopfieldTrajectory:
    """s_{t+1} = sign(W s_t) for t = 0..steps-1; returns states and E(s_t).

    Each step is one :func:`classical_update` (synchronous, or one
    asynchronous sweep in the order 0..N-1).  ``states`` has shape
    ``(steps + 1, ..., N)`` and ``energies`` ``(steps + 1, ...)``.
    """
    xp = namespace(W, s)
    W, s = xp.floating(xp.asarray(W), xp.asarray(s))
    _check_ws(W, s)

    def step(state, _):
        return classical_update(W, state, mode=mode), state

    final, states = _scan(xp, step, s, None, length=int(steps))
    states = _append(xp, states, final, int(steps))
    return HopfieldTrajectory(states, classical_energy(W, states))


def _append(xp: Backend, states: Any, final: Any, steps: int) -> Any:
    if steps == 0:
        return final[None]
    return xp.concatenate([states, final[None]], axis=0)


def _crossing(loads: np.ndarray, fractions: np.ndarray, level: float = 0.5) -> float:
    """The load where ``fractions`` first falls below ``level`` (linear interpolation).

    NaN when the curve never crosses ``level`` inside the loads given.
    """
    loads = np.asarray(loads, dtype=float)
    fractions = np.asarray(fractions, dtype=float)
    for k in range(1, len(loads)):
        f0, f1 = fractions[k - 1], fractions[k]
        if f0 >= level > f1:
            return float(loads[k - 1] + (f0 - level) * (loads[k] - loads[k - 1]) / (f0 - f1))
    return float("nan")


def _backend_named(name: str) -> Backend:
    if name == "jax":
        return namespace()
    if name == "mlx":
        from .backend import _mlx

        mx = _mlx()
        if mx is None:  # pragma: no cover - only without MLX
            raise RuntimeError("backend='mlx' but mlx cannot be imported")
        return namespace(mx.zeros(1))
    raise ValueError(f"backend must be 'jax' or 'mlx'; got {name!r}")


def classical_capacity_curve(
    N: int,
    loads: Sequence[float],
    trials: int,
    seed: int = 0,
    *,
    steps: int = 5,
    max_error: float = 0.01,
    backend: str = "jax",
) -> dict:
    """alpha = M/N  ->  P(xi^mu is a fixed point of s_i <- sign(W_{ij} s^j)).

    Report-style (returns NumPy arrays and Python floats).  For each load
    ``alpha`` it stores ``M = round(alpha N)`` random +-1 patterns in
    ``trials`` independent networks (all trials and patterns at once, as
    leading batch axes) and measures, over all ``trials * M`` patterns:

    * ``fixed``: the fraction that are exact fixed points of the
      synchronous update (every neuron stable);
    * ``retrieved``: the fraction whose retrieval, started at the pattern
      and run for ``steps`` asynchronous sweeps (order 0..N-1), ends with
      fewer than ``max_error * N`` wrong bits;
    * ``overlap``: the mean final overlap ``m = xi^{mu i} s_i / N``;
    * ``alpha_50_fixed`` / ``alpha_50_retrieved``: the load where each
      fraction crosses 1/2 (linear interpolation between the loads given;
      NaN if it does not cross).

    Patterns come from ``numpy.random.default_rng(seed)``, so the JAX and
    MLX runs (``backend``) see the same networks.  The mean-field limit
    (Amit, Gutfreund and Sompolinsky 1985) is ``alpha_c ~ 0.138``; the
    exact-fixed-point fraction has a finite-N threshold that slowly drifts
    to 0 (like 1/(2 ln N)), so the ``retrieved`` column is the one to
    compare with 0.138.
    """
    xp = _backend_named(backend)
    rng = np.random.default_rng(seed)
    loads = np.asarray(loads, dtype=float)
    Ms, fixed, retrieved, overlap = [], [], [], []
    for alpha in loads:
        M = max(1, int(round(alpha * N)))
        P_np = rng.choice(np.array([-1.0, 1.0]), size=(trials, M, N))
        P = xp.asarray(P_np)  # (trials, M, N)
        W = hebbian_weights(P)[:, None]  # (trials, 1, N, N): shared by the M states
        stable = xp.all(classical_update(W, P) == P, axis=-1)
        final = classical_retrieve(W, P, steps, mode="asynchronous").final
        wrong = xp.sum(final != P, axis=-1)
        m = xp.mean(final * P, axis=-1)
        Ms.append(M)
        fixed.append(float(xp.mean(stable.astype(P.dtype)).item()))
        retrieved.append(float(xp.mean((wrong < max_error * N).astype(P.dtype)).item()))
        overlap.append(float(xp.mean(m).item()))
    fixed_a, retrieved_a = np.array(fixed), np.array(retrieved)
    return {
        "N": int(N),
        "loads": loads,
        "M": np.array(Ms),
        "fixed": fixed_a,
        "retrieved": retrieved_a,
        "overlap": np.array(overlap),
        "alpha_50_fixed": _crossing(loads, fixed_a),
        "alpha_50_retrieved": _crossing(loads, retrieved_a),
    }


# -- modern (continuous) network ------------------------------------------------


def _check_beta(beta: Any, xp: Backend) -> None:
    if isinstance(beta, (int, float)):
        bad = not (beta > 0) or math.isinf(beta)
    elif is_concrete(beta):
        arr = xp.asarray(beta)
        bad = xp.any_true(~(arr > 0)) or xp.any_true(~xp.isfinite(arr))
    else:
        return
    if bad:
        raise AttentionInputError(
            f"inverse temperature beta must be positive and finite; got beta={beta} "
            "(the temperature of the attention step is T = 1/beta)"
        )


def _modern_inputs(xi: Any, K: Any, V: Any, beta: Any):
    """(xp, xi, K, V) as floating arrays, after the checks on indices a, mu and on beta."""
    xp = namespace(xi, K, V, beta if hasattr(beta, "shape") else None)
    xi, K, V = xp.floating(xp.asarray(xi), xp.asarray(K), xp.asarray(V))
    require_ndim(xi, "xi", "a")
    require_ndim(K, "X", ("mu", "a"))
    require_ndim(V, "V", ("mu", "b"))
    require_match("a", ("X", "d", K.shape[-1]), ("xi", "d", xi.shape[-1]))
    require_match("mu", ("X", "M", K.shape[-2]), ("V", "M", V.shape[-2]))
    _check_beta(beta, xp)
    return xp, xi, K, V


def _modern_parts(xp: Backend, xi: Any, K: Any, V: Any, beta: Any):
    """One attention call: (log Z, new state) for query xi, keys K, values V, T = 1/beta.

    The inputs are already checked (:func:`_modern_inputs`); used by
    :func:`hopfield_attention`, :func:`modern_update` and :func:`modern_retrieve`.
    """
    ### BEGIN SOLUTION 8.4
    # The query axis i of attention holds the single state: Q^{ia} = xi^a, n_q = 1.
    # S^{i mu} = xi^a X^{mu a},  A^{i mu} = softmax_mu(beta S),  O^{ib} = A^{i mu} V^{mu b}
    parts = attention_decomposition(xi[..., None, :], K, V, T=1.0 / beta, scale=1.0)
    return parts.log_Z[..., 0], parts.O[..., 0, :]
    ### END SOLUTION


def _energy_from(xp: Backend, xi: Any, X: Any, log_Z: Any, beta: Any, constants: bool) -> Any:
    """E = -(1/beta) log_Z + 1/2 xi^a xi_a (+ constants), from log_Z = lse(beta X^{mu a} xi_a)."""
    ### BEGIN SOLUTION 8.3
    # E = -(1/beta) lse(beta X^{mu a} xi_a) + 1/2 xi^a xi_a
    E = -log_Z / beta + 0.5 * xp.einsum("...a,...a->...", xi, xi)
    if constants:
        M = X.shape[-2]
        R2 = xp.max(xp.einsum("...ma,...ma->...m", X, X), axis=-1)  # R^2 = max_mu |X^mu|^2
        E = E + math.log(M) / beta + 0.5 * R2
    return E
    ### END SOLUTION


def modern_energy(xi: Any, X: Any, beta: Any, *, constants: bool = False) -> Any:
    """E = -(1/beta) log sum_mu exp(beta X^{mu a} xi_a) + 1/2 xi^a xi_a (+ constants).

    ``xi (..., d)``, ``X (..., M, d)``, ``beta > 0`` a scalar (Python number
    or 0-d array; it may be traced by ``jax.grad``).  The log-sum-exp is the
    log-partition of attention at temperature ``1/beta`` (no ``Z`` is
    formed).  ``constants=True`` adds Ramsauer's ``(1/beta) log M + 1/2 R^2``
    with ``R = max_mu |X^mu|``; they do not change the dynamics.
    """
    xp, xi, X, _ = _modern_inputs(xi, X, X, beta)
    ### BEGIN SOLUTION 8.3
    # log Z = log sum_mu exp(beta X^{mu a} xi_a): attention's log-partition at T = 1/beta
    parts = attention_decomposition(xi[..., None, :], X, X, T=1.0 / beta, scale=1.0)
    return _energy_from(xp, xi, X, parts.log_Z[..., 0], beta, constants)
    ### END SOLUTION


def hopfield_attention(xi: Any, K: Any, V: Any, beta: Any) -> Any:
    """xi_new^b = V^{mu b} softmax_mu(beta K^{mu a} xi_a): attention with T = 1/beta.

    Query ``xi (..., d)``, keys ``K (..., M, d)``, values ``V (..., M, d_v)``;
    computed by :func:`attn_tensors.attention.attention_decomposition` with
    raw dot products (``scale=1``) and temperature ``T = 1/beta``.
    """
    xp, xi, K, V = _modern_inputs(xi, K, V, beta)
    return _modern_parts(xp, xi, K, V, beta)[1]


def modern_update(xi: Any, X: Any, beta: Any) -> Any:
    """xi_new^b = X^{mu b} softmax_mu(beta X^{mu a} xi_a): attention with Q = xi, K = V = X.

    One CCCP step of :func:`modern_energy`; it never raises the energy, and
    ``xi - modern_update(xi)`` is the gradient of the energy.
    """
    xp, xi, X, _ = _modern_inputs(xi, X, X, beta)
    ### BEGIN SOLUTION 8.4
    return _modern_parts(xp, xi, X, X, beta)[1]
    ### END SOLUTION


def modern_retrieve(
    xi: Any, X: Any, beta: Any, steps: int, *, constants: bool = False
) -> HopfieldTrajectory:
    """xi_{t+1}^b = X^{mu b} softmax_mu(beta X^{mu a} xi_t^a), t = 0..steps-1, with E(xi_t).

    ``states`` has shape ``(steps + 1, ..., d)``, ``energies``
    ``(steps + 1, ...)``.  On JAX the loop is a ``lax.scan``: the whole
    retrieval is jittable (``steps`` static) and differentiable in ``xi``,
    ``X`` and ``beta``.  Each step is one attention call, which yields both
    the energy of the current state (from log Z) and the next state.
    """
    xp, xi, X, _ = _modern_inputs(xi, X, X, beta)
    b = xp.asarray(beta, dtype=xi.dtype)

    def step(carry, _):
        # X and beta ride in the carry (the loop body sees them as tracers).
        state, X_c, b_c = carry
        log_Z, new = _modern_parts(xp, state, X_c, X_c, b_c)
        E = _energy_from(xp, state, X_c, log_Z, b_c, constants)
        return (new, X_c, b_c), (state, E)

    (final, _, _), (states, energies) = _scan(
        xp, step, (xi, X, b), None, length=int(steps)
    )
    states = _append(xp, states, final, int(steps))
    E_final = modern_energy(final, X, beta, constants=constants)
    energies = _append(xp, energies, E_final, int(steps))
    return HopfieldTrajectory(states, energies)


def modern_capacity_curve(
    d: int,
    n_patterns_list: Sequence[int],
    beta: float,
    noise: float,
    trials: int,
    seed: int = 0,
    *,
    queries: int = 64,
    steps: int = 3,
    tol: float = 0.1,
    backend: str = "jax",
) -> dict:
    """M -> P(xi_T = X^{mu*}) after xi_{t+1} = X^T softmax(beta X xi_t), from a noisy X^{mu*}.

    Report-style (returns NumPy arrays and Python floats).  For each number
    of patterns ``M`` it draws ``trials`` memories of ``M`` random patterns
    on the unit sphere in ``R^d`` and, per memory, ``min(queries, M)``
    distinct target patterns ``mu*``.  A query is the target plus Gaussian
    noise of norm about ``noise`` (per component ``noise / sqrt(d)``).
    After ``steps`` updates (:func:`modern_retrieve`) a retrieval succeeds
    when the stored pattern nearest to the final state is the target and the
    final state lies within distance ``tol`` of it.  Returned per ``M``:
    ``success`` (that fraction), ``query_nearest`` (the fraction of queries
    whose nearest stored pattern already is the target: the best any
    retrieval could do) and ``error`` (mean distance of the final state to
    the target).  ``load`` is ``M / d``, to compare with the classical
    ``alpha_c ~ 0.14``.
    """
    xp = _backend_named(backend)
    rng = np.random.default_rng(seed)
    success, nearest_q, error = [], [], []
    for M in n_patterns_list:
        M = int(M)
        Q = min(int(queries), M)
        X_np = rng.standard_normal((trials, M, d))
        X_np /= np.linalg.norm(X_np, axis=-1, keepdims=True)
        idx = np.stack([rng.choice(M, size=Q, replace=False) for _ in range(trials)])
        target_np = np.take_along_axis(X_np, idx[..., None], axis=1)  # (trials, Q, d)
        query_np = target_np + noise / np.sqrt(d) * rng.standard_normal(target_np.shape)
        X, target, query = xp.asarray(X_np), xp.asarray(target_np), xp.asarray(query_np)
        X_b = X[:, None]  # (trials, 1, M, d): each memory serves its Q queries
        final = modern_retrieve(query, X_b, beta, steps).final  # (trials, Q, d)
        idx_b = xp.asarray(idx)

        def nearest(state):
            # argmin_mu |X^mu - state|^2 = argmax_mu (X^{mu a} state_a - 1/2 |X^mu|^2)
            score = xp.einsum("...ma,...a->...m", X_b, state)
            score = score - 0.5 * xp.einsum("...ma,...ma->...m", X_b, X_b)
            return xp.argmax(score, axis=-1)

        dist = xp.sqrt(xp.sum((final - target) ** 2, axis=-1))
        ok = (nearest(final) == idx_b) & (dist < tol)
        success.append(float(xp.mean(ok.astype(X.dtype)).item()))
        nearest_q.append(float(xp.mean((nearest(query) == idx_b).astype(X.dtype)).item()))
        error.append(float(xp.mean(dist).item()))
    n = np.array([int(M) for M in n_patterns_list])
    return {
        "d": int(d),
        "beta": float(beta),
        "noise": float(noise),
        "M": n,
        "load": n / d,
        "success": np.array(success),
        "query_nearest": np.array(nearest_q),
        "error": np.array(error),
    }
