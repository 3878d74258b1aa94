"""Part VIII, Hopfield networks: classical memory, modern memory = attention.

Every expected value comes from a loop spec written here (plain Python
loops), autodiff, finite differences or a closed form.  Shapes in property
tests are fixed (N = 12 neurons; M = 6 patterns in d = 4) so JAX compiles once.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, to_backend, to_np
from hypothesis import given
from hypothesis import strategies as st

from attn_tensors import AttentionInputError
from attn_tensors.attention import scaled_dot_product_attention
from attn_tensors.hopfield import (
    _crossing,
    classical_async_sweep,
    classical_capacity_curve,
    classical_energy,
    classical_retrieve,
    classical_update,
    hebbian_weights,
    hopfield_attention,
    modern_capacity_curve,
    modern_energy,
    modern_retrieve,
    modern_update,
)

# -- loop specs (the oracles) -----------------------------------------------------


def hebbian_loop(P):
    """W_ij = (1/N) sum_mu P[mu, i] P[mu, j] for i != j, W_ii = 0."""
    M, N = P.shape
    W = np.zeros((N, N))
    for i in range(N):
        for j in range(N):
            if i != j:
                W[i, j] = sum(P[mu, i] * P[mu, j] for mu in range(M)) / N
    return W


def energy_loop(W, s):
    N = len(s)
    return -0.5 * sum(s[i] * W[i, j] * s[j] for i in range(N) for j in range(N))


def sign_loop(h):
    return 1.0 if h >= 0 else -1.0


def sync_loop(W, s):
    N = len(s)
    return np.array([sign_loop(sum(W[i, j] * s[j] for j in range(N))) for i in range(N)])


def async_loop(W, s, order):
    s = np.array(s, dtype=float)
    for i in order:
        s[i] = sign_loop(sum(W[i, j] * s[j] for j in range(len(s))))
    return s


def softmax_loop(z):
    m = max(z)
    e = [math.exp(v - m) for v in z]
    total = sum(e)
    return [v / total for v in e]


def hopfield_loop(xi, K, V, beta):
    """xi_new[b] = sum_mu p[mu] V[mu, b], p = softmax(beta K xi)."""
    M, d = K.shape
    z = [beta * sum(K[mu, a] * xi[a] for a in range(d)) for mu in range(M)]
    p = softmax_loop(z)
    return np.array([sum(p[mu] * V[mu, b] for mu in range(M)) for b in range(V.shape[1])])


def lse_loop(z):
    m = max(z)
    return m + math.log(sum(math.exp(v - m) for v in z))


def modern_energy_loop(xi, X, beta, constants=False):
    M, d = X.shape
    z = [beta * sum(X[mu, a] * xi[a] for a in range(d)) for mu in range(M)]
    E = -lse_loop(z) / beta + 0.5 * sum(v * v for v in xi)
    if constants:
        R2 = max(sum(X[mu, a] ** 2 for a in range(d)) for mu in range(M))
        E += math.log(M) / beta + 0.5 * R2
    return E


def wrong_energy_loop(xi, X, beta):
    """The course notes' E = -lse(beta X xi) + 1/2 |xi|^2 (no 1/beta): NOT a Lyapunov function."""
    z = [beta * float(X[mu] @ xi) for mu in range(X.shape[0])]
    return -lse_loop(z) + 0.5 * float(xi @ xi)


def pm1(rng, shape):
    return rng.choice(np.array([-1.0, 1.0]), size=shape)


def unit_rows(rng, shape):
    X = rng.standard_normal(shape)
    return X / np.linalg.norm(X, axis=-1, keepdims=True)


# -- classical network ---------------------------------------------------------------


def test_hebbian_weights_match_loop_spec(xp_name, rng):
    P = pm1(rng, (2, 3, 8))  # (batch, M, N)
    W = hebbian_weights(to_backend(P, xp_name))
    assert W.shape == (2, 8, 8)
    for b in range(2):
        assert_close(W[b], hebbian_loop(P[b]), xp_name)


def test_classical_energy_matches_loop_spec(xp_name, rng):
    W = hebbian_loop(pm1(rng, (3, 8)))
    s = pm1(rng, (4, 8))
    E = classical_energy(to_backend(W, xp_name), to_backend(s, xp_name))
    assert_close(E, [energy_loop(W, s[k]) for k in range(4)], xp_name)


def test_synchronous_update_matches_loop_spec(xp_name, rng):
    W = hebbian_loop(pm1(rng, (4, 16)))
    s = pm1(rng, (5, 16))
    got = classical_update(to_backend(W, xp_name), to_backend(s, xp_name))
    assert_close(got, [sync_loop(W, s[k]) for k in range(5)], xp_name)


def test_tie_rule_sign_zero_is_plus_one(xp_name):
    """h_i = 0 exactly gives s_i = +1 (synchronous and asynchronous)."""
    N = 4
    s = -np.ones(N)
    W0 = np.zeros((N, N))  # every local field is 0
    for mode in ("synchronous", "asynchronous"):
        got = classical_update(to_backend(W0, xp_name), to_backend(s, xp_name), mode=mode)
        assert_close(got, np.ones(N), xp_name)
    # A tie on one neuron only: h_0 = W_01 s_1 + W_02 s_2 = 1/2 - 1/2 = 0.
    W = np.zeros((N, N))
    W[0, 1] = W[1, 0] = 0.5
    W[0, 2] = W[2, 0] = 0.5
    s = np.array([-1.0, 1.0, -1.0, 1.0])
    got = classical_update(to_backend(W, xp_name), to_backend(s, xp_name))
    assert to_np(got)[0] == 1.0
    assert_close(got, sync_loop(W, s), xp_name)


def test_async_sweep_matches_loop_spec(xp_name, rng):
    W = hebbian_loop(pm1(rng, (5, 16)))
    s = pm1(rng, (3, 16))
    order = np.array([3, 0, 15, 3, 7, 7, 1] + list(range(16)))  # repeats allowed
    idx = jnp.asarray(order) if xp_name == "jax" else _mlx_int(order)
    got = classical_async_sweep(to_backend(W, xp_name), to_backend(s, xp_name), idx)
    assert_close(got, [async_loop(W, s[k], order) for k in range(3)], xp_name)


def _mlx_int(order):
    import mlx.core as mx

    return mx.array(np.asarray(order, dtype=np.int32))


def test_asynchronous_mode_is_one_sweep_in_index_order(rng):
    W = hebbian_loop(pm1(rng, (6, 16)))
    s = pm1(rng, (16,))
    got = classical_update(jnp.asarray(W), jnp.asarray(s), mode="asynchronous")
    assert_close(got, async_loop(W, s, range(16)))


# One single-neuron update, compiled once for the fixed shape (N = 12).
_one_flip = jax.jit(lambda W, s, i: classical_async_sweep(W, s, i[None]))
_energy_jit = jax.jit(classical_energy)
N_PROP = 12


def _assert_energy_never_increases(W, s, order):
    W, s = jnp.asarray(W), jnp.asarray(s)
    E = float(_energy_jit(W, s))
    for i in order:
        s = _one_flip(W, s, jnp.asarray(i))
        E_new = float(_energy_jit(W, s))
        assert E_new <= E + 1e-12, (i, E, E_new)
        E = E_new


@given(
    st.lists(st.sampled_from([-1.0, 1.0]), min_size=3 * N_PROP, max_size=3 * N_PROP),
    st.lists(st.sampled_from([-1.0, 1.0]), min_size=N_PROP, max_size=N_PROP),
    st.permutations(list(range(N_PROP))),
)
def test_async_update_never_raises_energy_hebbian(patterns, s0, order):
    """Each single-neuron update on Hebbian weights leaves E(s) equal or lower."""
    W = np.asarray(hebbian_weights(jnp.asarray(np.reshape(patterns, (3, N_PROP)))))
    _assert_energy_never_increases(W, s0, order + order)


@given(
    st.lists(st.floats(-1.0, 1.0, allow_subnormal=False), min_size=N_PROP * N_PROP, max_size=N_PROP * N_PROP),
    st.lists(st.sampled_from([-1.0, 1.0]), min_size=N_PROP, max_size=N_PROP),
    st.permutations(list(range(N_PROP))),
)
def test_async_update_never_raises_energy_any_symmetric_w(entries, s0, order):
    """For any symmetric W with zero diagonal, single-neuron updates never raise E."""
    A = np.reshape(entries, (N_PROP, N_PROP))
    W = (A + A.T) / 2
    np.fill_diagonal(W, 0.0)
    _assert_energy_never_increases(W, s0, order)


def test_stored_single_pattern_is_fixed_point(xp_name, rng):
    xi = pm1(rng, (1, 32))
    W = hebbian_weights(to_backend(xi, xp_name))
    for pattern in (xi[0], -xi[0]):  # the mirror image is stored too
        s = to_backend(pattern, xp_name)
        for mode in ("synchronous", "asynchronous"):
            assert_close(classical_update(W, s, mode=mode), pattern, xp_name)


def test_classical_retrieval_from_noisy_state(rng):
    N, M = 256, 6
    P = pm1(rng, (M, N))
    W = hebbian_weights(jnp.asarray(P))
    noisy = P.copy()
    flip = rng.random((M, N)) < 0.1
    noisy[flip] *= -1
    traj = classical_retrieve(W, jnp.asarray(noisy), 4, mode="asynchronous")
    assert traj.states.shape == (5, M, N) and traj.energies.shape == (5, M)
    np.testing.assert_array_equal(to_np(traj.final), P)
    assert np.all(np.diff(to_np(traj.energies), axis=0) <= 1e-12)
    # the energies are E(states[t]) (loop spec)
    W_np = to_np(W)
    assert_close(traj.energies[1], [energy_loop(W_np, to_np(traj.states[1])[k]) for k in range(M)])


def test_classical_capacity_reduced_curve():
    """alpha = 0.05: nearly every pattern is stable; alpha = 0.3: almost none is."""
    r = classical_capacity_curve(100, [0.05, 0.3], trials=8, seed=1)
    assert list(r["M"]) == [5, 30]
    assert r["fixed"][0] >= 0.9 and r["retrieved"][0] >= 0.9
    assert r["fixed"][1] <= 0.2 and r["retrieved"][1] <= 0.2
    assert r["overlap"][0] > r["overlap"][1]
    assert 0.05 < r["alpha_50_fixed"] < 0.3


def test_crossing_interpolates_linearly():
    loads = np.array([0.1, 0.2, 0.3])
    # falls from 0.8 to 0.2 between 0.1 and 0.2: 1/2 is reached halfway
    assert _crossing(loads, [0.8, 0.2, 0.0]) == pytest.approx(0.15)
    assert math.isnan(_crossing(loads, [1.0, 0.9, 0.6]))  # never crosses


# -- modern network ------------------------------------------------------------------


def test_modern_update_matches_loop_spec(xp_name, rng):
    X = rng.standard_normal((5, 4))
    xi = rng.standard_normal((2, 3, 4))  # leading batch axes
    beta = 1.7
    got = modern_update(to_backend(xi, xp_name), to_backend(X, xp_name), beta)
    want = [[hopfield_loop(xi[b, q], X, X, beta) for q in range(3)] for b in range(2)]
    assert_close(got, want, xp_name)


def test_hopfield_attention_separate_keys_values(xp_name, rng):
    K = rng.standard_normal((2, 6, 4))  # batched memories
    V = rng.standard_normal((2, 6, 3))  # d_v = 3 differs from d = 4
    xi = rng.standard_normal((2, 4))
    got = hopfield_attention(
        to_backend(xi, xp_name), to_backend(K, xp_name), to_backend(V, xp_name), 0.6
    )
    assert got.shape == (2, 3)
    assert_close(got, [hopfield_loop(xi[b], K[b], V[b], 0.6) for b in range(2)], xp_name)


def test_modern_update_is_attention_with_temperature_one_over_beta(rng):
    """Query xi, keys = values = X, raw dot products, T = 1/beta."""
    X = rng.standard_normal((7, 5))
    xi = rng.standard_normal((3, 5))
    beta = 2.5
    O = scaled_dot_product_attention(xi, X, X, T=1.0 / beta, scale=1.0)
    assert_close(modern_update(jnp.asarray(xi), jnp.asarray(X), beta), O)
    # ... which is also the default-scaled attention with T = 1/(beta sqrt(d))
    O2 = scaled_dot_product_attention(xi, X, X, T=1.0 / (beta * math.sqrt(5)))
    assert_close(O, O2)


@pytest.mark.parametrize("constants", [False, True])
def test_modern_energy_matches_loop_spec(xp_name, rng, constants):
    X = rng.standard_normal((6, 4))
    xi = rng.standard_normal((3, 4))
    beta = 3.0
    E = modern_energy(to_backend(xi, xp_name), to_backend(X, xp_name), beta, constants=constants)
    assert_close(E, [modern_energy_loop(xi[k], X, beta, constants) for k in range(3)], xp_name)


def test_modern_energy_constants_make_it_nonnegative(rng):
    """Ramsauer et al.: with the constants, 0 <= E <= 2 R^2."""
    X = rng.standard_normal((50, 6, 4))
    xi = 3 * rng.standard_normal((50, 4))
    X_b = jnp.asarray(X)
    for beta in (0.1, 1.0, 10.0):
        # states in the convex hull of the patterns (as after one update)
        xi_h = modern_update(jnp.asarray(xi), X_b, beta)
        E = to_np(modern_energy(xi_h, X_b, beta, constants=True))
        R2 = np.max(np.sum(X**2, axis=-1), axis=-1)
        assert np.all(E >= -1e-12) and np.all(E <= 2 * R2 + 1e-12)


M_PROP, D_PROP = 6, 4
_retrieve_jit = jax.jit(modern_retrieve, static_argnums=3)


def _energies_monotone(E, rtol=1e-10):
    E = np.asarray(E)
    return np.all(np.diff(E, axis=0) <= rtol * (1.0 + np.abs(E[:-1])))


@given(
    st.lists(st.floats(-3.0, 3.0, allow_subnormal=False), min_size=M_PROP * D_PROP, max_size=M_PROP * D_PROP),
    st.lists(st.floats(-5.0, 5.0, allow_subnormal=False), min_size=D_PROP, max_size=D_PROP),
    st.floats(0.05, 20.0, allow_subnormal=False),
)
def test_modern_energy_never_increases_along_updates(x_entries, xi0, beta):
    """E(xi_{t+1}) <= E(xi_t) for every X, xi_0 and beta > 0 (CCCP)."""
    X = jnp.asarray(np.reshape(x_entries, (M_PROP, D_PROP)))
    traj = _retrieve_jit(jnp.asarray(xi0), X, jnp.asarray(beta), 8)
    assert _energies_monotone(traj.energies)


def test_modern_energy_monotone_on_many_random_instances(rng):
    """2000 random memories, states and temperatures: no energy increase, ever."""
    for beta in (0.05, 0.3, 1.0, 4.0, 30.0):
        X = rng.standard_normal((400, 8, 5)) * rng.uniform(0.1, 3.0, (400, 1, 1))
        xi = 4 * rng.standard_normal((400, 5))
        traj = modern_retrieve(jnp.asarray(xi), jnp.asarray(X), beta, 10)
        assert _energies_monotone(traj.energies)


def test_energy_without_one_over_beta_is_not_monotone(rng):
    """The update descends E = -(1/beta) lse + |xi|^2/2, not the notes' -lse + |xi|^2/2.

    Start at the minimiser of the wrong energy (the fixed point of
    xi = beta X softmax(beta X xi)); one true update moves away from it, so
    the wrong energy rises while the correct one falls.  A monotonicity test
    on the wrong energy would fail here.
    """
    X = rng.standard_normal((5, 3))
    beta = 0.3
    xi = np.zeros(3)
    for _ in range(500):
        xi = beta * X.T @ np.array(softmax_loop(list(beta * X @ xi)))
    xi_new = to_np(modern_update(jnp.asarray(xi), jnp.asarray(X), beta))
    assert wrong_energy_loop(xi_new, X, beta) > wrong_energy_loop(xi, X, beta) + 1e-3
    assert modern_energy_loop(xi_new, X, beta) < modern_energy_loop(xi, X, beta)


def test_energy_gradient_autodiff_finite_differences_and_closed_form(rng):
    """dE/dxi = xi - modern_update(xi); dE/dxi and dE/dbeta match central differences."""
    X = jnp.asarray(rng.standard_normal((6, 4)))
    xi = jnp.asarray(rng.standard_normal(4))
    beta = jnp.asarray(1.3)
    g = jax.grad(modern_energy)(xi, X, beta)
    assert_close(g, xi - modern_update(xi, X, beta), rtol=1e-9, atol=1e-12)
    h = 1e-6
    E = lambda x, b: float(modern_energy(x, X, b))  # noqa: E731
    fd = [(E(xi + h * e, beta) - E(xi - h * e, beta)) / (2 * h) for e in jnp.eye(4)]
    assert_close(g, fd, rtol=1e-6, atol=1e-8)
    g_beta = jax.grad(modern_energy, argnums=2)(xi, X, beta)
    fd_beta = (E(xi, beta + h) - E(xi, beta - h)) / (2 * h)
    assert_close(g_beta, fd_beta, rtol=1e-6, atol=1e-8)


def test_retrieve_is_jittable_and_differentiable(rng):
    X = jnp.asarray(rng.standard_normal((6, 4)))
    xi = jnp.asarray(rng.standard_normal((2, 4)))
    beta = jnp.asarray(0.9)
    eager = modern_retrieve(xi, X, beta, 5)
    jitted = _retrieve_jit(xi, X, beta, 5)
    assert eager.states.shape == (6, 2, 4) and eager.energies.shape == (6, 2)
    assert_close(jitted.states, eager.states)
    assert_close(jitted.energies, eager.energies)
    # states[t + 1] = update(states[t]) and energies[t] = E(states[t])
    assert_close(eager.states[3], modern_update(eager.states[2], X, beta))
    assert_close(eager.energies[4], modern_energy(eager.states[4], X, beta))

    def final_energy(xi, X, beta):
        return jnp.sum(modern_retrieve(xi, X, beta, 4).energies[-1])

    grads = jax.jit(jax.grad(final_energy, argnums=(0, 1, 2)))(xi, X, beta)
    for g in grads:
        assert np.all(np.isfinite(to_np(g)))
    h = 1e-6
    e = jnp.zeros_like(xi).at[1, 2].set(1.0)
    fd = (final_energy(xi + h * e, X, beta) - final_energy(xi - h * e, X, beta)) / (2 * h)
    assert_close(grads[0][1, 2], fd, rtol=1e-5, atol=1e-8)


def test_noisy_query_retrieves_stored_pattern_at_large_beta(rng):
    d, M = 16, 20
    X = unit_rows(rng, (M, d))
    target = X[7]
    query = target + 0.3 / math.sqrt(d) * rng.standard_normal(d)
    traj = modern_retrieve(jnp.asarray(query), jnp.asarray(X), 50.0, 3)
    assert np.linalg.norm(to_np(traj.final) - target) < 1e-3
    assert _energies_monotone(traj.energies)
    # at small beta the same query falls into the average of the patterns
    traj_hot = modern_retrieve(jnp.asarray(query), jnp.asarray(X), 0.5, 3)
    assert np.linalg.norm(to_np(traj_hot.final) - target) > 0.5


def test_modern_capacity_ten_d_patterns_essentially_perfect():
    r = modern_capacity_curve(16, [160], beta=64.0, noise=0.3, trials=2, seed=0, queries=32)
    assert r["load"][0] == 10.0
    assert r["success"][0] == 1.0 and r["error"][0] < 1e-3
    # a far too hot memory (beta = 1) cannot tell the patterns apart
    hot = modern_capacity_curve(16, [160], beta=1.0, noise=0.3, trials=2, seed=0, queries=32)
    assert hot["success"][0] == 0.0


# -- errors ----------------------------------------------------------------------------


def test_errors_name_index_and_sizes(rng):
    with pytest.raises(AttentionInputError, match="patterns"):
        hebbian_weights(jnp.ones(5))
    with pytest.raises(AttentionInputError, match="square"):
        classical_energy(jnp.ones((4, 5)), jnp.ones(5))
    with pytest.raises(AttentionInputError, match="index j must match"):
        classical_update(jnp.zeros((4, 4)), jnp.ones(5))
    with pytest.raises(AttentionInputError, match="outside 0..3"):
        classical_async_sweep(jnp.zeros((4, 4)), jnp.ones(4), jnp.array([0, 4]))
    with pytest.raises(ValueError, match="mode"):
        classical_update(jnp.zeros((4, 4)), jnp.ones(4), mode="parallel")
    with pytest.raises(AttentionInputError, match="index a must match"):
        modern_update(jnp.ones(3), jnp.ones((5, 4)), 1.0)
    with pytest.raises(AttentionInputError, match="index mu must match"):
        hopfield_attention(jnp.ones(4), jnp.ones((5, 4)), jnp.ones((6, 2)), 1.0)
    for beta in (0.0, -1.0, float("inf")):
        with pytest.raises(AttentionInputError, match="beta"):
            modern_energy(jnp.ones(4), jnp.ones((5, 4)), beta)


# -- MLX parity: every public function, against JAX in float64 -------------------------


def _parity_cases(rng):
    P = pm1(rng, (2, 3, 16))
    W = hebbian_loop(P[0])
    s = pm1(rng, (3, 16))
    order = np.array([5, 1, 1, 15, 0] + list(range(16)))
    X = unit_rows(rng, (2, 7, 4)) * 1.5
    xi = rng.standard_normal((2, 4))
    V = rng.standard_normal((2, 7, 3))
    return [
        ("hebbian_weights", hebbian_weights, (P,), {}),
        ("classical_energy", classical_energy, (W, s), {}),
        ("classical_update", classical_update, (W, s), {}),
        ("classical_update_async", classical_update, (W, s), {"mode": "asynchronous"}),
        ("classical_async_sweep", classical_async_sweep, (W, s, order), {}),
        ("classical_retrieve", lambda W, s: tuple(classical_retrieve(W, s, 3)), (W, s), {}),
        ("modern_energy", modern_energy, (xi, X, 2.0), {}),
        ("modern_energy_const", modern_energy, (xi, X, 2.0), {"constants": True}),
        ("hopfield_attention", hopfield_attention, (xi, X, V, 2.0), {}),
        ("modern_update", modern_update, (xi, X, 2.0), {}),
        ("modern_retrieve", lambda xi, X: tuple(modern_retrieve(xi, X, 2.0, 4)), (xi, X), {}),
    ]


def _to_mlx(x):
    x = np.asarray(x)
    if x.dtype.kind == "i":
        return _mlx_int(x)
    return to_backend(x, "mlx")


@pytest.mark.mlx
@pytest.mark.parametrize("k", range(11))
def test_mlx_parity(k, rng):
    pytest.importorskip("mlx.core")
    name, f, args, kwargs = _parity_cases(rng)[k]
    want = f(*[jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args], **kwargs)
    got = f(*[_to_mlx(a) if isinstance(a, np.ndarray) else a for a in args], **kwargs)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert type(g).__module__.startswith("mlx"), name
        assert_close(g, w, "mlx")


@pytest.mark.mlx
def test_mlx_parity_energy_gradient(rng):
    mx = pytest.importorskip("mlx.core")
    X = rng.standard_normal((6, 4))
    xi = rng.standard_normal(4)
    g_jax = jax.grad(modern_energy)(jnp.asarray(xi), jnp.asarray(X), 1.3)
    g_mlx = mx.grad(lambda x: modern_energy(x, to_backend(X, "mlx"), 1.3))(to_backend(xi, "mlx"))
    assert_close(g_mlx, g_jax, "mlx")


@pytest.mark.mlx
def test_mlx_parity_capacity_curves():
    pytest.importorskip("mlx.core")
    kw = dict(N=32, loads=[0.1, 0.3], trials=2, seed=2, steps=2)
    cj = classical_capacity_curve(**kw)
    cm = classical_capacity_curve(**kw, backend="mlx")
    for key in ("fixed", "retrieved", "overlap"):
        np.testing.assert_allclose(cm[key], cj[key], atol=1e-6)
    kw = dict(d=8, n_patterns_list=[16, 64], beta=16.0, noise=0.3, trials=1, seed=3, queries=8)
    mj = modern_capacity_curve(**kw)
    mm = modern_capacity_curve(**kw, backend="mlx")
    np.testing.assert_allclose(mm["success"], mj["success"])
    np.testing.assert_allclose(mm["error"], mj["error"], atol=1e-4)
