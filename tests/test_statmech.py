"""Part III, Statistical Mechanics: attn_tensors.statmech against independent oracles.

Oracles: a literal per-row loop spec in plain Python (``math.exp``/``math.log``,
float64), JAX autodiff for the thermodynamic derivative identities, closed forms
derived in the test, and NumPy for the Kullback-Leibler divergence.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attn_tensors import statmech as sm
from attn_tensors._checks import AttentionInputError
from conftest import assert_close, to_backend, to_np

INF = math.inf

# -- the loop spec ---------------------------------------------------------------


def ref_row(s, allowed, T):
    """Gibbs quantities of one row, by the definitions, in plain Python floats."""
    n = len(s)
    idx = [j for j in range(n) if allowed[j]]
    if not idx:
        return dict(A=[0.0] * n, logZ=-INF, F=INF, H=0.0, E=0.0, Var=0.0, C=0.0)
    m = max(s[j] / T for j in idx)
    w = [math.exp(s[j] / T - m) if allowed[j] else 0.0 for j in range(n)]
    z = sum(w)
    A = [x / z for x in w]
    logZ = m + math.log(z)
    H = -sum(a * math.log(a) for a in A if a > 0)  # from the weights
    E = -sum(A[j] * s[j] for j in idx)  # <E> = sum_j A_j E_j, E_j = -s_j
    Var = sum(A[j] * (-s[j] - E) ** 2 for j in idx)
    return dict(A=A, logZ=logZ, F=-T * logZ, H=H, E=E, Var=Var, C=Var / T**2)


def ref(S, mask, T):
    """ref_row over every leading index; returns NumPy arrays."""
    S = np.asarray(S, dtype=np.float64)
    mask = np.ones(S.shape, bool) if mask is None else np.broadcast_to(mask, S.shape)
    lead = S.shape[:-1]
    out = {k: np.zeros(lead) for k in ("logZ", "F", "H", "E", "Var", "C")}
    out["A"] = np.zeros(S.shape)
    for idx in np.ndindex(*lead):
        r = ref_row(list(S[idx]), list(mask[idx]), T)
        for k, v in r.items():
            out[k][idx] = v
    return out


def ref_zero(S, mask):
    """T -> 0 by the definition: uniform over the allowed keys at the maximum."""
    S = np.asarray(S, dtype=np.float64)
    mask = np.ones(S.shape, bool) if mask is None else np.broadcast_to(mask, S.shape)
    out = np.zeros(S.shape)
    for idx in np.ndindex(*S.shape[:-1]):
        allowed = [j for j in range(S.shape[-1]) if mask[idx][j]]
        if not allowed:
            continue
        top = max(S[idx][j] for j in allowed)
        ground = [j for j in allowed if S[idx][j] == top]
        for j in ground:
            out[idx][j] = 1.0 / len(ground)
    return out


def ref_entropy(A):
    """-sum_j A_j log A_j with 0 log 0 = 0, row by row."""
    A = np.asarray(A, dtype=np.float64)
    H = np.zeros(A.shape[:-1])
    for idx in np.ndindex(*A.shape[:-1]):
        H[idx] = -sum(a * math.log(a) for a in A[idx] if a > 0)
    return H


def make_case(rng, shape=(2, 3, 5)):
    """Scores and a mask with a fully masked row and a one-key row."""
    S = rng.standard_normal(shape) * 2.0
    mask = rng.random(shape) < 0.7
    mask[..., 0] = True
    mask[0, 1, :] = False  # fully masked row
    mask[1, 2, :] = False
    mask[1, 2, 3] = True  # exactly one allowed key
    return S, mask


ALIVE_MASK = np.array([[True, False, True, True], [True, True, False, True]])

# -- against the loop spec -------------------------------------------------------


@pytest.mark.parametrize("T", [0.3, 1.0, 2.5])
def test_every_quantity_matches_loop_spec(rng, T):
    S, mask = make_case(rng)
    r = ref(S, mask, T)
    Sj, mj = jnp.asarray(S), jnp.asarray(mask)
    assert_close(sm.gibbs_distribution(Sj, mj, T), r["A"])
    assert_close(sm.boltzmann_from_energies(-Sj, mj, T), r["A"])
    assert_close(sm.log_partition_function(Sj, mj, T), r["logZ"])
    assert_close(sm.free_energy(Sj, mj, T), r["F"])
    assert_close(sm.entropy_from_scores(Sj, mj, T), r["H"])
    assert_close(sm.entropy(sm.gibbs_distribution(Sj, mj, T), mj), r["H"])
    assert_close(sm.expected_energy(Sj, mj, T), r["E"])
    assert_close(sm.energy_variance(Sj, mj, T), r["Var"])
    assert_close(sm.heat_capacity(Sj, mj, T), r["C"])


def test_unmasked_and_one_dimensional_scores(rng):
    S = rng.standard_normal((3, 4))
    r = ref(S, None, 0.8)
    assert_close(sm.entropy_from_scores(jnp.asarray(S), T=0.8), r["H"])
    s = S[0]
    r1 = ref_row(list(s), [True] * 4, 0.8)
    assert_close(sm.free_energy(jnp.asarray(s), T=0.8), r1["F"])
    assert sm.free_energy(jnp.asarray(s), T=0.8).shape == ()
    assert sm.gibbs_distribution(jnp.asarray(s)).shape == (4,)


def test_broadcast_masks_equal_full_masks(rng):
    """A padding mask (n_k,) or (batch, 1, n_k) acts like the full mask."""
    S = jnp.asarray(rng.standard_normal((2, 3, 4)))
    pad = np.array([True, True, False, True])
    per_batch = np.array([[[True, False, True, True]], [[True, True, True, False]]])
    for m in (pad, per_batch):
        full = np.broadcast_to(m, S.shape)
        for f in (sm.free_energy, sm.entropy_from_scores, sm.heat_capacity):
            assert_close(f(S, jnp.asarray(m), 0.7), f(S, jnp.asarray(full), 0.7))
        assert_close(
            sm.infinite_temperature_limit(S, jnp.asarray(m)),
            sm.infinite_temperature_limit(S, jnp.asarray(full)),
        )


def test_temperature_sweep_matches_loop_spec(rng):
    S, mask = make_case(rng, (2, 3, 4))
    temps = [0.2, 0.5, 1.0, 3.0]
    sw = sm.temperature_sweep(jnp.asarray(S), temps, jnp.asarray(mask))
    assert sw.weights.shape == (4, 2, 3, 4)
    assert sw.entropy.shape == (4, 2, 3)
    assert_close(sw.temperatures, temps)
    for t, T in enumerate(temps):
        r = ref(S, mask, T)
        assert_close(sw.weights[t], r["A"])
        assert_close(sw.entropy[t], r["H"])
        assert_close(sw.free_energy[t], r["F"])
        assert_close(sw.expected_energy[t], r["E"])
        assert_close(sw.heat_capacity[t], r["C"])


def test_temperature_table_for_scores_2_1_0():
    """Weights and entropies of S = [2, 1, 0] equal their closed form at four T."""
    # With x = exp(-1/T):  A = [1, x, x^2] / Z',  Z' = 1 + x + x^2, and since
    # -log A_j = j/T + log Z',  H = log Z' + (x + 2 x^2) / (Z' T).
    temps = [0.25, 0.5, 1.0, 2.0]
    S = jnp.asarray([2.0, 1.0, 0.0])
    sw = sm.temperature_sweep(S, temps)
    for t, T in enumerate(temps):
        x = math.exp(-1.0 / T)
        Zp = 1.0 + x + x * x
        weights = [1.0 / Zp, x / Zp, x * x / Zp]
        H = math.log(Zp) + (x + 2.0 * x * x) / (Zp * T)
        assert_close(sm.gibbs_distribution(S, T=T), weights)
        assert_close(sm.entropy_from_scores(S, T=T), H)
        assert_close(sm.entropy(sm.gibbs_distribution(S, T=T)), H)
        assert_close(sw.weights[t], weights)
        assert_close(sw.entropy[t], H)
    # T -> inf: uniform, entropy log 3
    A_inf = sm.infinite_temperature_limit(S)
    assert_close(A_inf, [1 / 3] * 3)
    assert_close(sm.entropy(A_inf), math.log(3.0))


# -- identities -------------------------------------------------------------------

score_arrays = hnp.arrays(np.float64, (2, 3, 5), elements=st.floats(-6, 6, allow_subnormal=False))
mask_arrays = hnp.arrays(np.bool_, (2, 3, 5))
temperatures = st.floats(0.05, 20.0, allow_subnormal=False)


@given(S=score_arrays, mask=mask_arrays, T=temperatures)
def test_free_energy_identity_holds(S, mask, T):
    """F = <E> - T H on every row with an allowed key; (+inf, 0) on dead rows."""
    F, rhs = sm.free_energy_identity(jnp.asarray(S), jnp.asarray(mask), T)
    F, rhs = to_np(F), to_np(rhs)
    alive = mask.any(-1)
    np.testing.assert_allclose(F[alive], rhs[alive], rtol=1e-10, atol=1e-9)
    assert np.all(np.isposinf(F[~alive])) and np.all(rhs[~alive] == 0)
    # and F itself is -T log Z of the loop spec
    np.testing.assert_allclose(F, ref(S, mask, T)["F"], rtol=1e-10, atol=1e-10)


def _grad_T(f, S, mask):
    return jax.grad(lambda T: jnp.sum(f(S, mask, T)))


@pytest.mark.parametrize("T", [0.4, 1.0, 3.0])
def test_thermodynamic_derivatives(rng, T):
    """C = d<E>/dT = T dH/dT = -T d2F/dT2;  H = -dF/dT;  <E> = d(bF)/db;  Var = d2logZ/db2."""
    S = jnp.asarray(rng.standard_normal((2, 2, 4)) * 1.5)
    m = jnp.asarray(np.broadcast_to(ALIVE_MASK, (2, 2, 4)))
    C = to_np(sm.heat_capacity(S, m, T)).sum()
    H = to_np(sm.entropy_from_scores(S, m, T)).sum()
    E = to_np(sm.expected_energy(S, m, T)).sum()
    Var = to_np(sm.energy_variance(S, m, T)).sum()
    T = jnp.asarray(T)
    assert_close(_grad_T(sm.expected_energy, S, m)(T), C)
    assert_close(T * _grad_T(sm.entropy_from_scores, S, m)(T), C, rtol=1e-9)
    d2F = jax.grad(_grad_T(sm.free_energy, S, m))(T)
    assert_close(-T * d2F, C, rtol=1e-9)
    assert_close(-_grad_T(sm.free_energy, S, m)(T), H)
    b = 1.0 / T
    bF = jax.grad(lambda b: b * jnp.sum(sm.free_energy(S, m, 1.0 / b)))(b)
    assert_close(bF, E)
    d2logZ = jax.grad(
        jax.grad(lambda b: jnp.sum(sm.log_partition_function(S, m, 1.0 / b)))
    )(b)
    assert_close(d2logZ, Var, rtol=1e-9)


def test_score_gradients_through_the_shift(rng):
    """dF/dS = -A,  d(log Z)/dS = A/T,  d<E>/dS^{ij} = -A^{ij}(1 + (S^{ij} - <S>^i)/T)."""
    S_np = rng.standard_normal((2, 2, 4)) * 3.0
    m = jnp.asarray(np.broadcast_to(ALIVE_MASK, (2, 2, 4)))
    T = 0.6
    S = jnp.asarray(S_np)
    r = ref(S_np, np.broadcast_to(ALIVE_MASK, S_np.shape), T)
    A = r["A"]
    mean_S = -r["E"][..., None]
    grad = lambda f: jax.grad(lambda S: jnp.sum(f(S, m, T)))(S)  # noqa: E731
    assert_close(grad(sm.free_energy), -A)
    assert_close(grad(sm.log_partition_function), A / T)
    assert_close(grad(sm.expected_energy), -A * (1 + (S_np - mean_S) / T))


def test_heat_capacity_by_autodiff_on_mlx(rng):
    mx = pytest.importorskip("mlx.core")
    S = to_backend(rng.standard_normal((3, 4)), "mlx")
    dE_dT = mx.grad(lambda T: mx.sum(sm.expected_energy(S, None, T)))(mx.array(0.7))
    C = mx.sum(sm.heat_capacity(S, None, 0.7))
    assert_close(dE_dT, C, "mlx", rtol=1e-4)


@given(S=score_arrays, mask=mask_arrays, T=temperatures)
def test_entropy_bounds(S, mask, T):
    """0 <= H <= log n_allowed, and the normalized entropy lies in [0, 1]."""
    Sj, mj = jnp.asarray(S), jnp.asarray(mask)
    H = to_np(sm.entropy_from_scores(Sj, mj, T))
    n = mask.sum(-1)
    log_n = np.log(np.maximum(n, 1))
    assert np.all(H >= -1e-12) and np.all(H <= log_n + 1e-12)
    h = to_np(sm.normalized_entropy(sm.gibbs_distribution(Sj, mj, T), mj))
    assert np.all(h >= -1e-12) and np.all(h <= 1 + 1e-12)
    assert np.all(h[n <= 1] == 0)
    # the two entropy routes agree
    H_w = to_np(sm.entropy(sm.gibbs_distribution(Sj, mj, T), mj))
    np.testing.assert_allclose(H, H_w, rtol=1e-9, atol=1e-9)
    C = to_np(sm.heat_capacity(Sj, mj, T))
    assert np.all(C >= 0)


def test_entropy_exact_at_zero_weights():
    """One-hot rows have H = 0 exactly; no NaN in value or gradient at zeros."""
    A = jnp.asarray([[0.0, 1.0, 0.0, 0.0], [0.5, 0.0, 0.5, 0.0], [0.0] * 4])
    H = sm.entropy(A)
    assert to_np(H)[0] == 0.0 and to_np(H)[2] == 0.0
    assert_close(H[1], math.log(2.0))
    g = to_np(jax.grad(lambda A: jnp.sum(sm.entropy(A)))(A))
    assert np.all(np.isfinite(g))
    # dH/dA_j = -(log A_j + 1) where A_j > 0; 0 at exact zeros (double where)
    A_np = to_np(A)
    want = np.where(A_np > 0, -(np.log(np.where(A_np > 0, A_np, 1)) + 1), 0)
    np.testing.assert_allclose(g, want, rtol=1e-12)
    assert to_np(sm.effective_number_of_states(A)).tolist() == [1.0, 2.0, 0.0]
    assert to_np(sm.normalized_entropy(A))[0] == 0.0
    assert_close(sm.normalized_entropy(jnp.full((4,), 0.25)), 1.0)


def test_masked_entropy_counts_only_allowed_keys():
    A = jnp.asarray([0.5, 0.5, 0.0, 0.0])
    m = jnp.asarray([True, True, False, False])
    assert_close(sm.normalized_entropy(A, m), 1.0)  # uniform over 2 allowed keys
    assert_close(sm.normalized_entropy(A), math.log(2) / math.log(4))
    assert to_np(sm.normalized_entropy(A, jnp.asarray([True, False, False, False]))) == 0
    assert_close(sm.effective_number_of_states(jnp.full((3,), 1 / 3)), 3.0)


# -- limits -------------------------------------------------------------------------


def tied_scores(rng, shape=(2, 3, 6)):
    S = rng.integers(-2, 3, size=shape).astype(np.float64)  # many exact ties
    mask = rng.random(shape) < 0.75
    mask[0, 0, :] = False
    return S, mask


def test_zero_temperature_limit_is_the_small_T_softmax(rng):
    """Uniform over the argmax set (ties share), masked keys excluded."""
    S, mask = tied_scores(rng)
    Sj, mj = jnp.asarray(S), jnp.asarray(mask)
    A0 = sm.zero_temperature_limit(Sj, mj)
    assert_close(A0, ref_zero(S, mask))
    assert_close(sm.gibbs_distribution(Sj, mj, 1e-3), A0)  # gaps >= 1: e^-1000
    assert_close(sm.gibbs_distribution(Sj, mj, 0.05), A0, atol=1e-8)
    assert_close(sm.zero_temperature_limit(Sj), ref_zero(S, None))
    # with g ground states: log Z = max/T + log g + O(e^-1/T), so
    # F -> -max_j S^{ij} - T log g  and  H -> log g
    alive = mask.any(-1)
    n_ground = to_np(A0 > 0).sum(-1)
    F = to_np(sm.free_energy(Sj, mj, 1e-3))
    top = np.where(mask, S, -np.inf).max(-1)
    want_F = -top[alive] - 1e-3 * np.log(n_ground[alive])
    np.testing.assert_allclose(F[alive], want_F, atol=1e-12)
    H = to_np(sm.entropy_from_scores(Sj, mj, 1e-3))
    np.testing.assert_allclose(H[alive], np.log(n_ground[alive]), atol=1e-12)


def test_infinite_temperature_limit_is_the_large_T_softmax(rng):
    S, mask = tied_scores(rng)
    Sj, mj = jnp.asarray(S), jnp.asarray(mask)
    A_inf = to_np(sm.infinite_temperature_limit(Sj, mj))
    n = mask.sum(-1, keepdims=True)
    assert_close(A_inf, np.where(mask, 1.0 / np.maximum(n, 1), 0.0))
    assert_close(sm.gibbs_distribution(Sj, mj, 1e7), A_inf, atol=1e-6)
    sw = sm.temperature_sweep(Sj, [1e-3, 1e7], mj)
    assert_close(sw.weights[0], ref_zero(S, mask))
    assert_close(sw.weights[1], A_inf, atol=1e-6)


# -- the variational principle --------------------------------------------------------

weights = hnp.arrays(np.float64, (2, 3, 5), elements=st.floats(0.0, 1.0, allow_subnormal=False))


@given(S=score_arrays, q=weights, mask=mask_arrays, T=temperatures)
def test_gibbs_minimises_variational_free_energy(S, q, mask, T):
    """F[p] >= F for every distribution p, with F[p] - F = T KL(p || A)."""
    mask = mask.copy()
    mask[..., 0] = True
    q = np.where(mask, q, 0.0)
    q[..., 0] += 0.1
    p = q / q.sum(-1, keepdims=True)
    Sj, mj = jnp.asarray(S), jnp.asarray(mask)
    F = to_np(sm.free_energy(Sj, mj, T))
    F_p = to_np(sm.variational_free_energy(jnp.asarray(p), Sj, mj, T))
    A = ref(S, mask, T)["A"]
    kl = np.zeros(F.shape)
    for idx in np.ndindex(*F.shape):
        kl[idx] = sum(
            p[idx][j] * math.log(p[idx][j] / A[idx][j]) for j in range(5) if p[idx][j] > 0
        )
    assert np.all(F_p >= F - 1e-9 * (1 + np.abs(F)))
    np.testing.assert_allclose(F_p - F, T * kl, rtol=1e-7, atol=1e-8)
    F_A = sm.variational_free_energy(sm.gibbs_distribution(Sj, mj, T), Sj, mj, T)
    np.testing.assert_allclose(to_np(F_A), F, rtol=1e-10, atol=1e-10)


def test_variational_free_energy_infinite_off_support():
    S = jnp.asarray([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    m = jnp.asarray([[True, True, False], [False, False, False]])
    p = jnp.asarray([[0.5, 0.25, 0.25], [0.0, 0.0, 0.0]])
    assert to_np(sm.variational_free_energy(p, S, m, 1.0)).tolist() == [INF, INF]
    g = jax.grad(lambda S: jnp.sum(sm.variational_free_energy(p, S, None, 1.0)))(S)
    assert np.all(np.isfinite(to_np(g)))


# -- stability and the fully masked row ---------------------------------------------------


@pytest.mark.parametrize("backend", ["jax", pytest.param("mlx", marks=pytest.mark.mlx)])
def test_huge_scores_in_float32_are_finite(rng, backend):
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    S = rng.choice([-1e4, 1e4], size=(2, 3, 4)) + rng.standard_normal((2, 3, 4))
    mask = np.ones((2, 3, 4), bool)
    mask[1, 0, 1:] = False
    if backend == "jax":
        Sb, mb = jnp.asarray(S, jnp.float32), jnp.asarray(mask)
    else:
        Sb, mb = to_backend(S, "mlx"), to_backend(mask, "mlx")
    S32 = to_np(Sb)  # the scores actually used
    for T in (0.5, 1.0, 100.0):
        r = ref(S32, mask, T)
        for name in ("free_energy", "entropy_from_scores", "expected_energy",
                     "heat_capacity", "log_partition_function"):
            got = to_np(getattr(sm, name)(Sb, mb, T))
            assert np.all(np.isfinite(got)), name
        np.testing.assert_allclose(to_np(sm.free_energy(Sb, mb, T)), r["F"], rtol=1e-6)
        H = to_np(sm.entropy_from_scores(Sb, mb, T))
        np.testing.assert_allclose(H, r["H"], atol=2e-5)
        assert np.all(H >= 0) and np.all(H <= math.log(4) + 1e-6)
        # float32 rounds S/T ~ 1e2 to ~8e-6, which moves the weights as much
        A = to_np(sm.gibbs_distribution(Sb, mb, T))
        np.testing.assert_allclose(A, r["A"], atol=2e-5)
        F, rhs = (to_np(x) for x in sm.free_energy_identity(Sb, mb, T))
        np.testing.assert_allclose(F, rhs, rtol=1e-6)
    sw = sm.temperature_sweep(Sb, [0.5, 1.0, 100.0], mb)
    for field in sw:
        assert np.all(np.isfinite(to_np(field)))


def test_fully_masked_row_documented_values_without_nan():
    S = jnp.asarray([[1.0, -2.0, 0.5], [3.0, 0.0, 1.0]])
    m = jnp.asarray([[False, False, False], [True, True, False]])
    A = sm.gibbs_distribution(S, m, 0.7)
    assert to_np(A)[0].tolist() == [0.0, 0.0, 0.0]
    assert to_np(sm.log_partition_function(S, m, 0.7))[0] == -INF
    assert to_np(sm.free_energy(S, m, 0.7))[0] == INF
    for f in (sm.entropy_from_scores, sm.expected_energy, sm.energy_variance,
              sm.heat_capacity):
        assert to_np(f(S, m, 0.7))[0] == 0.0
    assert to_np(sm.entropy(A, m))[0] == 0.0
    assert to_np(sm.normalized_entropy(A, m))[0] == 0.0
    assert to_np(sm.effective_number_of_states(A, m))[0] == 0.0
    assert to_np(sm.zero_temperature_limit(S, m))[0].tolist() == [0.0] * 3
    assert to_np(sm.infinite_temperature_limit(S, m))[0].tolist() == [0.0] * 3
    F, rhs = sm.free_energy_identity(S, m, 0.7)
    assert to_np(F)[0] == INF and to_np(rhs)[0] == 0.0
    for f in (sm.free_energy, sm.entropy_from_scores, sm.expected_energy,
              sm.heat_capacity, sm.log_partition_function):
        gS, gT = jax.grad(lambda S, T: jnp.sum(f(S, m, T)), argnums=(0, 1))(S, 0.7)
        assert np.all(np.isfinite(to_np(gS))) and np.isfinite(float(gT)), f.__name__
        assert to_np(gS)[0].tolist() == [0.0] * 3
    sw = sm.temperature_sweep(S, [0.5, 2.0], m)
    assert not any(np.isnan(to_np(x)).any() for x in sw)


# -- errors -----------------------------------------------------------------------------

SCORE_FUNCTIONS = [
    sm.gibbs_distribution, sm.boltzmann_from_energies, sm.log_partition_function,
    sm.free_energy, sm.entropy_from_scores, sm.expected_energy, sm.energy_variance,
    sm.heat_capacity, sm.free_energy_identity,
]


@pytest.mark.parametrize("f", SCORE_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("T", [0.0, -1.0, float("nan"), "array0"])
def test_nonpositive_temperature_raises(f, T):
    S = jnp.asarray([[1.0, 2.0]])
    T = jnp.asarray(0.0) if T == "array0" else T
    with pytest.raises(AttentionInputError, match="zero_temperature_limit"):
        f(S, None, T)


def test_other_errors():
    S = jnp.asarray([[1.0, 2.0, 3.0]])
    with pytest.raises(AttentionInputError, match="infinite_temperature_limit"):
        sm.temperature_sweep(S, [1.0, 0.0])
    with pytest.raises(AttentionInputError, match="1-D"):
        sm.temperature_sweep(S, [[1.0]])
    with pytest.raises(AttentionInputError, match="zero_temperature_limit"):
        sm.variational_free_energy(jnp.asarray([[1.0, 0, 0]]), S, None, -2.0)
    with pytest.raises(AttentionInputError, match="index j must match"):
        sm.variational_free_energy(jnp.asarray([[0.5, 0.5]]), S)
    with pytest.raises(AttentionInputError, match="boolean"):
        sm.free_energy(S, jnp.asarray([[1.0, 0.0, 1.0]]))
    with pytest.raises(AttentionInputError, match="does not broadcast"):
        sm.entropy(S, jnp.asarray([True, False]))
    with pytest.raises(AttentionInputError, match="NaN or \\+inf"):
        sm.free_energy(jnp.asarray([[1.0, INF]]))
    # -inf is a masked key (the one rule for scores), not an error
    assert_close(sm.free_energy(jnp.asarray([[1.0, -INF]])), [-1.0])


# -- MLX parity, float64, jit --------------------------------------------------------------


def _parity_calls(S, mask, A, p):
    """(name, thunk) for every public function, built from one backend's arrays."""
    T = 0.7
    return {
        "gibbs_distribution": lambda: sm.gibbs_distribution(S, mask, T),
        "boltzmann_from_energies": lambda: sm.boltzmann_from_energies(S, mask, T),
        "log_partition_function": lambda: sm.log_partition_function(S, mask, T),
        "free_energy": lambda: sm.free_energy(S, mask, T),
        "entropy": lambda: sm.entropy(A, mask),
        "entropy_from_scores": lambda: sm.entropy_from_scores(S, mask, T),
        "normalized_entropy": lambda: sm.normalized_entropy(A, mask),
        "effective_number_of_states": lambda: sm.effective_number_of_states(A, mask),
        "expected_energy": lambda: sm.expected_energy(S, mask, T),
        "energy_variance": lambda: sm.energy_variance(S, mask, T),
        "heat_capacity": lambda: sm.heat_capacity(S, mask, T),
        "temperature_sweep": lambda: tuple(sm.temperature_sweep(S, [0.3, 1.0, 4.0], mask)),
        "zero_temperature_limit": lambda: sm.zero_temperature_limit(S, mask),
        "infinite_temperature_limit": lambda: sm.infinite_temperature_limit(S, mask),
        "free_energy_identity": lambda: sm.free_energy_identity(S, mask, T),
        "variational_free_energy": lambda: sm.variational_free_energy(p, S, mask, T),
    }


def _inputs(rng):
    S, mask = make_case(rng, (2, 3, 4))
    S[1, 1, :] = [1.0, 2.0, 2.0, 0.0]  # a tie for the T -> 0 limit
    mask[1, 1, :] = True
    A = ref(S, mask, 0.9)["A"]
    q = np.where(mask, rng.random(S.shape) + 0.1, 0.0)
    p = q / np.maximum(q.sum(-1, keepdims=True), 1e-300)
    return S, mask, A, p


def test_parity_table_covers_every_public_function(rng):
    names = set(_parity_calls(*_inputs(rng)))
    assert names == set(sm.__all__) - {"TemperatureSweep"}


@pytest.mark.parametrize("name", sorted(set(sm.__all__) - {"TemperatureSweep"}))
def test_mlx_matches_jax_float64(rng, name, xp_name):
    S, mask, A, p = _inputs(rng)
    want = _parity_calls(*(jnp.asarray(x) for x in (S, mask, A, p)))[name]()
    got = _parity_calls(*(to_backend(x, xp_name) for x in (S, mask, A, p)))[name]()
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        assert_close(g, w, xp_name)


def test_float64_on_both_backends(rng):
    S, mask, A, p = _inputs(rng)
    r = ref(S, mask, 0.7)
    S64 = jnp.asarray(S)
    assert sm.free_energy(S64, jnp.asarray(mask), 0.7).dtype == jnp.float64
    assert sm.temperature_sweep(S64, [1.0]).weights.dtype == jnp.float64
    mx = pytest.importorskip("mlx.core")
    Sm = to_backend(S, "mlx", dtype=mx.float64)
    mm = to_backend(mask, "mlx")
    for f, key in ((sm.free_energy, "F"), (sm.entropy_from_scores, "H"),
                   (sm.heat_capacity, "C"), (sm.gibbs_distribution, "A")):
        out = f(Sm, mm, 0.7)
        assert out.dtype == mx.float64
        # MLX's CPU exp in float64 is only accurate to ~6e-8 (relative)
        assert_close(out, r[key], rtol=1e-6, atol=1e-7)


def test_jit_with_traced_temperature(rng):
    S = jnp.asarray(rng.standard_normal((3, 4)))
    f = jax.jit(sm.heat_capacity)
    assert_close(f(S, None, jnp.asarray(0.6)), ref(to_np(S), None, 0.6)["C"])
    sweep = jax.jit(sm.temperature_sweep)
    assert_close(sweep(S, jnp.asarray([0.6, 2.0])).heat_capacity[1], ref(to_np(S), None, 2.0)["C"])


def test_one_hot_entropy_is_plus_zero(xp_name):
    """A one-hot row has entropy +0.0 (not -0.0, which would print as '-0')."""
    H = to_np(sm.entropy(to_backend(np.array([[1.0, 0.0, 0.0]]), xp_name)))
    assert H[0] == 0.0 and not np.signbit(H[0])
