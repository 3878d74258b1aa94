"""The edges of the input space: every input gets a right answer or a clear error.

One class of inputs per section (issue 11): query rows far below the others
in the Performer's features, valid inputs that used to give NaN, empty and
degenerate axes, half precision, masks of the wrong kind, and the one
validation rule for values.  Each test runs on JAX and on MLX.

Oracles: float64 NumPy computed in log space (the Performer's expected
output), the definitions in float64 NumPy (heat capacity), the library's own
fully-masked-row results (an empty key axis must give exactly those), the
float32 result on the same rounded inputs (half precision), and the masked
call (a score of -inf must give what a False in the mask gives).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from attn_tensors import attention as att
from attn_tensors import flash, kernel, multihead, statmech, variants
from attn_tensors import hopfield
from attn_tensors._checks import AttentionInputError
from attn_tensors.backend import namespace
from attn_tensors.softmax import log_partition, softmax, softmax_and_log_partition
from conftest import assert_close, to_backend, to_np


def f32(x, name):
    """x as a float32 array of the backend ``name``."""
    if name == "mlx":
        return to_backend(x, "mlx")
    import jax.numpy as jnp

    return jnp.asarray(np.asarray(x), dtype=jnp.float32)


def _logsumexp(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.sum(np.exp(x - m), axis=axis))


# -- 1. positive random features: each query row stabilised by its own maximum -----


def favor_oracle(Q, K, V, omega):
    """O^{ib} = sum_j w^{ij} V^{jb} / sum_j w^{ij},  w^{ij} = phi(q_i)^c phi(k_j)^c, in float64 logs."""
    d_k = Q.shape[-1]
    Qs, Ks = Q / d_k**0.25, K / d_k**0.25
    u_q = Qs @ omega.T - 0.5 * np.sum(Qs * Qs, axis=-1, keepdims=True)  # (n_q, m)
    u_k = Ks @ omega.T - 0.5 * np.sum(Ks * Ks, axis=-1, keepdims=True)  # (n_k, m)
    log_w = _logsumexp(u_q[:, None, :] + u_k[None, :, :], axis=-1)  # (n_q, n_k)
    A = np.exp(log_w - _logsumexp(log_w, axis=-1)[:, None])
    return A @ V


def test_performer_query_rows_do_not_underflow(xp_name):
    """Q, K = 30 N(0, 1), d = 4, m = 8 in float32: every output row is the float64 expectation.

    With one maximum over all query rows, rows whose exponents sit far
    below it came back as zeros.
    """
    rng = np.random.default_rng(0)
    Q, K = 30 * rng.standard_normal((6, 4)), 30 * rng.standard_normal((7, 4))
    V = rng.standard_normal((7, 3))
    omega = np.asarray(kernel.draw_random_features(0, 8, 4))
    want = favor_oracle(Q, K, V, omega)
    Qb, Kb, Vb, ob = (f32(x, xp_name) for x in (Q, K, V, omega))
    got = kernel.linear_attention(Qb, Kb, Vb, kernel.performer_feature_maps(ob))
    assert np.all(np.abs(to_np(got)).sum(axis=-1) > 0)
    np.testing.assert_allclose(to_np(got), want, rtol=1e-3, atol=1e-4)


def test_performer_moderate_inputs_agree_with_float64(xp_name):
    """For moderate inputs the per-row stabiliser changes nothing: the float64 expectation again."""
    rng = np.random.default_rng(1)
    Q, K, V = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    omega = np.asarray(kernel.draw_random_features(3, 16, 4))
    want = np.stack([favor_oracle(Q[h], K[h], V[h], omega) for h in range(2)])
    got = kernel.linear_attention(
        *(to_backend(x, xp_name) for x in (Q, K, V)),
        kernel.performer_feature_maps(to_backend(omega, xp_name)),
    )
    assert_close(got, want, xp_name, rtol=2e-4, atol=2e-5)


def test_rows_stabiliser_is_one_factor_per_row(xp_name):
    """stabilize='rows': phi^{ic} = phi_0^{ic} c^i with the largest feature of each row 1/sqrt(m)."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((2, 3, 4)) * 3
    omega = np.asarray(kernel.draw_random_features(1, 6, 4))
    Xs = X / 4**0.25
    plain = np.exp(Xs @ omega.T - 0.5 * np.sum(Xs * Xs, -1, keepdims=True)) / np.sqrt(6)
    got = to_np(kernel.positive_random_features(
        to_backend(X, xp_name), to_backend(omega, xp_name), stabilize="rows"))
    ratio = got / plain
    np.testing.assert_allclose(ratio, ratio[..., :1] * np.ones_like(ratio), rtol=1e-4)
    np.testing.assert_allclose(got.max(axis=-1), 1 / np.sqrt(6), rtol=1e-6)
    with pytest.raises(AttentionInputError, match="stabilize must be"):
        kernel.positive_random_features(to_backend(X, xp_name), to_backend(omega, xp_name),
                                        stabilize="row")


# -- 2. no NaN from valid input -------------------------------------------------------


def heat_capacity_oracle(S, T):
    """C^i = sum_j A^{ij} ((S^{ij} - <S>^i) / T)^2 in float64 NumPy (a stable softmax)."""
    S = np.asarray(S, dtype=np.float64)
    s = S / T
    A = np.exp(s - s.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    mean = np.sum(A * S, -1, keepdims=True)
    dev = np.where(A > 0, (S - mean) / T, 0.0)
    return np.sum(A * dev * dev, -1)


@pytest.mark.parametrize("T", [1e-20, 1e-30])
def test_heat_capacity_tiny_temperature_float32(xp_name, T):
    """float32 T <= 1e-20 (T^2 underflows): C is the float64 value (0 here), not NaN."""
    S = np.array([[1.0, 0.5, -2.0], [3.0, 3.0, 1.0], [0.0, 1e-3, 2e-3]])
    want = heat_capacity_oracle(S, T)
    Sb = f32(S, xp_name)
    # float32 results: float32 tolerances (the "mlx" ones) on both backends
    assert_close(statmech.heat_capacity(Sb, T=T), want, "mlx")
    sweep = statmech.temperature_sweep(Sb, [T, 1.0])
    assert_close(sweep.heat_capacity[0], want, "mlx")
    assert_close(sweep.heat_capacity[1], heat_capacity_oracle(S, 1.0), "mlx")


@pytest.mark.parametrize("T", [1e-160, 1e-200])
def test_heat_capacity_tiny_temperature_float64(T):
    """float64 T <= 1e-160: C is finite and equals the float64 definition."""
    import jax.numpy as jnp

    S = np.array([[1.0, 0.5, -2.0], [3.0, 3.0, 1.0]])
    want = heat_capacity_oracle(S, T)
    assert_close(statmech.heat_capacity(jnp.asarray(S), T=T), want)


def test_subnormal_temperature_is_refused(xp_name):
    """A float32 T of 1e-40 is subnormal (flushed to 0 by the CPU): a clear error, not NaN."""
    S = f32([[1.0, 0.5]], xp_name)
    for f in (statmech.heat_capacity, softmax, statmech.free_energy):
        with pytest.raises(AttentionInputError, match="normal range"):
            f(S, T=1e-40)


def _grad(f, S):
    """d/dS sum_i w_i f(S)_i over the finite outputs (w fixed, not all equal)."""
    xp = namespace(S)

    def loss(S):
        y = f(S)
        w = xp.reshape(xp.arange(1, y.size + 1).astype(y.dtype), y.shape)
        return xp.sum(xp.where(xp.isfinite(y), y, xp.zeros_like(y)) * w)

    return xp.grad(loss)(S)


SCORE_FUNCTIONS = {
    "softmax": softmax,
    "log_partition": log_partition,
    "attention_weights": att.attention_weights,
    "gibbs_distribution": statmech.gibbs_distribution,
    "log_partition_function": statmech.log_partition_function,
    "free_energy": statmech.free_energy,
    "expected_energy": statmech.expected_energy,
    "energy_variance": statmech.energy_variance,
    "heat_capacity": statmech.heat_capacity,
    "entropy_from_scores": statmech.entropy_from_scores,
    "entropy(softmax)": lambda S, mask=None, T=1.0: statmech.entropy(softmax(S, mask, T), mask),
    "zero_temperature_limit": lambda S, mask=None, T=1.0: statmech.zero_temperature_limit(S, mask),
    "infinite_temperature_limit":
        lambda S, mask=None, T=1.0: statmech.infinite_temperature_limit(S, mask),
    "sweep C": lambda S, mask=None, T=1.0: statmech.temperature_sweep(S, [T], mask).heat_capacity,
    "sweep H": lambda S, mask=None, T=1.0: statmech.temperature_sweep(S, [T], mask).entropy,
}

EXTREME = np.array([
    [1e30, -1e30, 0.0],
    [1e30, 1e30, 0.0],
    [-1e30, -1e30, -1e30],
    [1e4, 1e4 - 1.0, -1e4],
    [0.3, -0.2, 0.1],
])
DEAD = np.array([[True, True, True]] * 4 + [[False, False, False]])


@pytest.mark.parametrize("name", sorted(SCORE_FUNCTIONS))
@pytest.mark.parametrize("T", [1e-20, 1.0, 1e20])
def test_no_nan_in_values_or_gradients(xp_name, name, T):
    """float32 scores up to +-1e30, ties, a dead row, T from 1e-20 to 1e20: no NaN anywhere.

    At T = 1e-20 the scores stop at +-1e4 (S/T = 1e24): larger ones overflow
    float32 and are refused (next test).
    """
    f = SCORE_FUNCTIONS[name]
    scores = EXTREME if T >= 1 else np.clip(EXTREME, -1e4, 1e4)
    S, mask = f32(scores, xp_name), to_backend(DEAD, xp_name)
    g = functools.partial(f, mask=mask, T=T)
    assert not np.any(np.isnan(to_np(g(S))))
    assert not np.any(np.isnan(to_np(_grad(g, S))))


def test_overflowing_scores_over_temperature_refused(xp_name):
    """float32 S = 1e30 at T = 1e-20: S/T is not a float32, so a clear error (not NaN)."""
    S = f32(EXTREME, xp_name)
    for f in (softmax, statmech.free_energy, statmech.heat_capacity):
        with pytest.raises(AttentionInputError, match="overflow"):
            f(S, T=1e-20)


def test_heat_capacity_gradient_of_huge_scores(xp_name):
    """jax.grad / mx.grad of C at float32 scores +-1e30 is 0 (C is flat there), not NaN."""
    S = f32([[1e30, -1e30, 0.0]], xp_name)
    for f in (statmech.heat_capacity, statmech.energy_variance):
        assert_close(_grad(f, S), np.zeros((1, 3)), "mlx")


# -- 3. empty and degenerate axes ------------------------------------------------------


def _qkv(xp_name, n_q, n_k, d_k=4, d_v=3, batch=()):
    rng = np.random.default_rng(3)
    return tuple(to_backend(rng.standard_normal(batch + s), xp_name)
                 for s in ((n_q, d_k), (n_k, d_k), (n_k, d_v)))


def _multihead(Q, K, V, **kw):
    xp = namespace(Q)
    d = Q.shape[-1]
    W = xp.asarray(np.eye(d)[None].repeat(2, 0), dtype=Q.dtype)
    W_V = xp.asarray(np.eye(d, V.shape[-1])[None].repeat(2, 0), dtype=Q.dtype)
    W_O = xp.asarray(np.eye(V.shape[-1], d)[None].repeat(2, 0), dtype=Q.dtype)
    return multihead.multihead_attention(Q, W, W, W_V, W_O, X_kv=K, **kw)


QKV_FUNCTIONS = {
    "scaled_dot_product_attention": att.scaled_dot_product_attention,
    "attention_decomposition.O": lambda Q, K, V: att.attention_decomposition(Q, K, V).O,
    "flash_attention": flash.flash_attention,
    "flash_attention causal": functools.partial(flash.flash_attention, causal=True),
    "fast_attention": flash.fast_attention,
    "linear_attention": kernel.linear_attention,
    "linear_attention causal": functools.partial(kernel.linear_attention, causal=True),
    "nadaraya_watson": kernel.nadaraya_watson,
    "bilinear_attention": lambda Q, K, V: variants.bilinear_attention(
        Q, K, V, namespace(Q).eye(Q.shape[-1], dtype=Q.dtype)),
    "rotary_attention": variants.rotary_attention,
    "two_simplicial_attention": lambda Q, K, V: variants.two_simplicial_attention(Q, K, K, V, V),
    "hopfield_attention": lambda Q, K, V: hopfield.hopfield_attention(Q, K, V, 1.0),
    "alibi_attention": lambda Q, K, V: variants.alibi_attention(Q[None], K[None], V[None])[0],
}


@pytest.mark.parametrize("name", sorted(QKV_FUNCTIONS))
def test_no_keys_is_a_fully_masked_row(xp_name, name):
    """n_k = 0: every query is a fully masked row, so its output is 0 (and gradients 0)."""
    f = QKV_FUNCTIONS[name]
    Q, K, V = _qkv(xp_name, 3, 0, d_v=4 if "simplicial" in name else 3)
    O = f(Q, K, V)
    assert tuple(O.shape) == (3, V.shape[-1])
    assert_close(O, np.zeros(O.shape), xp_name)
    dQ = namespace(Q).grad(lambda q: namespace(Q).sum(f(q, K, V)))(Q)
    assert_close(dQ, np.zeros(Q.shape), xp_name)


@pytest.mark.parametrize("name", sorted(QKV_FUNCTIONS))
def test_no_queries_give_empty_outputs(xp_name, name):
    """n_q = 0: an output with no rows, of the right shape."""
    f = QKV_FUNCTIONS[name]
    Q, K, V = _qkv(xp_name, 0, 5, d_v=4 if "simplicial" in name else 3)
    assert tuple(f(Q, K, V).shape) == (0, V.shape[-1])


@pytest.mark.parametrize("name", sorted(QKV_FUNCTIONS) + ["attention_scores", "multihead"])
def test_no_features_is_refused_by_index(xp_name, name):
    """d_k = 0: AttentionInputError naming the index a (not a ZeroDivisionError)."""
    f = {"attention_scores": lambda Q, K, V: att.attention_scores(Q, K)}.get(name)
    Q, K, V = _qkv(xp_name, 3, 5, d_k=0)
    with pytest.raises(AttentionInputError, match="index a"):
        if name == "multihead":  # W_Q, W_K (H, d, d_k = 0)
            X = to_backend(np.ones((3, 4)), xp_name)
            W = to_backend(np.ones((2, 4, 0)), xp_name)
            W_V, W_O = to_backend(np.ones((2, 4, 3)), xp_name), to_backend(np.ones((2, 3, 4)), xp_name)
            multihead.multihead_attention(X, W, W, W_V, W_O)
        else:
            (f or QKV_FUNCTIONS[name])(Q, K, V)


def test_flash_no_keys_log_partition(xp_name):
    """flash_attention(..., return_lse=True) with n_k = 0: O = 0 and L = -inf, batched."""
    Q, K, V = _qkv(xp_name, 3, 0, batch=(2,))
    O, L = flash.flash_attention(Q, K, V, return_lse=True)
    assert tuple(O.shape) == (2, 3, 3) and tuple(L.shape) == (2, 3)
    assert_close(O, np.zeros((2, 3, 3)), xp_name)
    assert np.all(to_np(L) == -np.inf)


def test_multihead_no_keys_and_no_queries(xp_name):
    """multihead_attention: n_k = 0 gives Y = 0 (every head's rows fully masked); n_q = 0 no rows."""
    Q, K, V = _qkv(xp_name, 3, 0, d_k=4, d_v=4)
    Y = _multihead(Q, K, V)
    assert_close(Y, np.zeros((3, 4)), xp_name)
    Q, K, V = _qkv(xp_name, 0, 5, d_k=4, d_v=4)
    assert tuple(_multihead(Q, K, V).shape) == (0, 4)


def test_trilinear_scores_empty_axes(xp_name):
    """trilinear_scores: empty key axes give an empty (n_q, 0, 0) array; d_k = 0 is refused."""
    Q, K, _ = _qkv(xp_name, 3, 0)
    assert tuple(variants.trilinear_scores(Q, K, K).shape) == (3, 0, 0)
    Q, K, _ = _qkv(xp_name, 3, 2, d_k=0)
    with pytest.raises(AttentionInputError, match="index a"):
        variants.trilinear_scores(Q, K, K)


ROW_FUNCTIONS = {
    "log_partition": log_partition,
    "log_partition_function": statmech.log_partition_function,
    "free_energy": statmech.free_energy,
    "expected_energy": statmech.expected_energy,
    "energy_variance": statmech.energy_variance,
    "heat_capacity": statmech.heat_capacity,
    "entropy_from_scores": statmech.entropy_from_scores,
    "entropy": lambda S, mask=None: statmech.entropy(softmax(S, mask), mask),
    "normalized_entropy": lambda S, mask=None: statmech.normalized_entropy(softmax(S, mask), mask),
    "effective_number_of_states":
        lambda S, mask=None: statmech.effective_number_of_states(softmax(S, mask), mask),
    "free_energy_identity[1]": lambda S, mask=None: statmech.free_energy_identity(S, mask)[1],
    "variational_free_energy":
        lambda S, mask=None: statmech.variational_free_energy(softmax(S, mask), S, mask),
    "online_logsumexp": lambda S, mask=None: flash.online_logsumexp(
        S if mask is None else namespace(S).where(mask, S, -float("inf"))),
}

KEY_FUNCTIONS = {
    "softmax": softmax,
    "attention_weights": att.attention_weights,
    "gibbs_distribution": statmech.gibbs_distribution,
    "zero_temperature_limit": statmech.zero_temperature_limit,
    "infinite_temperature_limit": statmech.infinite_temperature_limit,
}


@pytest.mark.parametrize("name", sorted(ROW_FUNCTIONS))
def test_empty_key_axis_equals_fully_masked_row(xp_name, name):
    """A row with no keys gives what a row whose every key is masked gives."""
    f = ROW_FUNCTIONS[name]
    empty = to_backend(np.zeros((2, 3, 0)), xp_name)
    one = to_backend(np.ones((2, 3, 1)), xp_name)
    dead = to_backend(np.zeros((1, 1), bool), xp_name)
    got, want = to_np(f(empty)), to_np(f(one, mask=dead))
    assert got.shape == want.shape == (2, 3)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", sorted(KEY_FUNCTIONS))
def test_empty_key_axis_weights(xp_name, name):
    """Weights over no keys: shape (..., n_q, 0); no queries: shape (0, n_k)."""
    f = KEY_FUNCTIONS[name]
    assert tuple(f(to_backend(np.zeros((2, 3, 0)), xp_name)).shape) == (2, 3, 0)
    assert tuple(f(to_backend(np.zeros((0, 4)), xp_name)).shape) == (0, 4)


def test_softmax_and_log_partition_empty_keys_gradient(xp_name):
    """The gradient through a row with no keys is an empty array, not an error."""
    S = to_backend(np.zeros((3, 0)), xp_name)
    xp = namespace(S)
    g = xp.grad(lambda s: xp.sum(xp.where(xp.isfinite(l := softmax_and_log_partition(s)[1]),
                                         l, xp.zeros_like(l))))(S)
    assert tuple(g.shape) == (3, 0)


# -- 4. half precision ---------------------------------------------------------------


HALF_FUNCTIONS = {
    "scaled_dot_product_attention": lambda Q, K, V: att.scaled_dot_product_attention(Q, K, V),
    "fast_attention": flash.fast_attention,
    "flash_attention": flash.flash_attention,
    "linear_attention": kernel.linear_attention,
    "softmax": lambda Q, K, V: softmax(att.attention_scores(Q, K)),
    "free_energy": lambda Q, K, V: statmech.free_energy(att.attention_scores(Q, K)),
    "heat_capacity": lambda Q, K, V: statmech.heat_capacity(att.attention_scores(Q, K)),
    "entropy": lambda Q, K, V: statmech.entropy(softmax(att.attention_scores(Q, K))),
    "rotary_attention": variants.rotary_attention,
    "positive_random_features": lambda Q, K, V: kernel.positive_random_features(
        Q, namespace(Q).asarray(np.asarray(kernel.draw_random_features(0, 6, 4), np.float32))),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(HALF_FUNCTIONS))
def test_half_precision_is_computed_in_float32(xp_name, name, dtype):
    """float16/bfloat16 inputs: the float32 result on the same (rounded) inputs, in float32."""
    f = HALF_FUNCTIONS[name]
    rng = np.random.default_rng(4)
    raw = [rng.standard_normal(s) for s in ((3, 4), (5, 4), (5, 3))]
    if xp_name == "mlx":
        import mlx.core as mx

        half = [mx.array(x.astype(np.float32)).astype(getattr(mx, dtype)) for x in raw]
        as32 = [x.astype(mx.float32) for x in half]
    else:
        import jax.numpy as jnp

        half = [jnp.asarray(x, dtype=getattr(jnp, dtype)) for x in raw]
        as32 = [x.astype(jnp.float32) for x in half]
    got, want = f(*half), f(*as32)
    assert str(got.dtype).endswith("float32")
    assert_close(got, want, "mlx", rtol=1e-5, atol=1e-6)


# -- 5. masks of the wrong kind ----------------------------------------------------------


@pytest.mark.parametrize("fname", ["flash_attention", "linear_attention"])
def test_per_query_mask_refused_by_name(xp_name, fname):
    """An (n_q, n_k) mask is not read as a batch of padding masks: a clear error instead."""
    f = {"flash_attention": flash.flash_attention, "linear_attention": kernel.linear_attention}[fname]
    Q, K, V = _qkv(xp_name, 3, 5)
    mask = to_backend(np.tril(np.ones((3, 5), bool)), xp_name)
    with pytest.raises(AttentionInputError, match=f"{fname} takes a padding mask"):
        f(Q, K, V, mask=mask)


def test_padding_mask_with_batch_still_accepted(xp_name):
    """A (batch, n_k) padding mask with batched Q, K, V keeps working (the flash equals the reference)."""
    Q, K, V = _qkv(xp_name, 3, 5, batch=(2,))
    pad = np.array([[True] * 5, [True, True, False, False, False]])
    got = flash.flash_attention(Q, K, V, mask=to_backend(pad, xp_name))
    want = att.scaled_dot_product_attention(Q, K, V, mask=to_backend(pad[:, None, :], xp_name))
    assert_close(got, want, xp_name, rtol=1e-5, atol=1e-6)


# -- 6. one validation rule for values -------------------------------------------------------


SCORE_TAKERS = {
    "softmax": softmax,
    "log_partition": log_partition,
    "attention_weights": att.attention_weights,
    "gibbs_distribution": statmech.gibbs_distribution,
    "free_energy": statmech.free_energy,
    "entropy_from_scores": statmech.entropy_from_scores,
    "heat_capacity": statmech.heat_capacity,
    "zero_temperature_limit": statmech.zero_temperature_limit,
    "infinite_temperature_limit": statmech.infinite_temperature_limit,
    "online_logsumexp": flash.online_logsumexp,
}


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("name", sorted(SCORE_TAKERS))
def test_nan_or_plus_inf_scores_refused(xp_name, name, bad):
    """NaN or +inf in concrete scores: AttentionInputError naming S (or x)."""
    S = np.array([[0.1, 0.2, 0.3], [0.0, 1.0, 2.0]])
    S[1, 1] = bad
    with pytest.raises(AttentionInputError, match="NaN or \\+inf"):
        SCORE_TAKERS[name](to_backend(S, xp_name))


@pytest.mark.parametrize("name", sorted(set(SCORE_TAKERS) - {"online_logsumexp"}))
def test_minus_inf_score_is_a_masked_key(xp_name, name):
    """S^{ij} = -inf gives exactly what mask^{ij} = False gives (mask_to_bias's promise)."""
    S = np.array([[0.1, 0.2, 0.3], [0.0, 1.0, 2.0], [0.5, 0.5, 0.5]])
    mask = np.array([[True, True, False], [True, True, True], [False, False, False]])
    S_inf = np.where(mask, S, -np.inf)
    f = SCORE_TAKERS[name]
    np.testing.assert_array_equal(to_np(f(to_backend(S_inf, xp_name))),
                                  to_np(f(to_backend(S, xp_name), to_backend(mask, xp_name))))


WEIGHT_TAKERS = {
    "entropy": statmech.entropy,
    "normalized_entropy": statmech.normalized_entropy,
    "effective_number_of_states": statmech.effective_number_of_states,
    "head_entropy": lambda A: multihead.head_entropy(A[None]),
    "variational_free_energy p": lambda A: statmech.variational_free_energy(
        A, namespace(A).zeros(A.shape, dtype=A.dtype)),
}


@pytest.mark.parametrize("bad", [np.nan, -0.25])
@pytest.mark.parametrize("name", sorted(WEIGHT_TAKERS))
def test_nan_or_negative_weights_refused(xp_name, name, bad):
    """Weights must be finite and non-negative: NaN used to be dropped, negatives accepted."""
    A = np.array([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]])
    A[1, 0] = bad
    with pytest.raises(AttentionInputError, match="NaN|negative"):
        WEIGHT_TAKERS[name](to_backend(A, xp_name))
