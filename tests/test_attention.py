"""Part II: scores, weights, output, the decomposition, numerics and bad input."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import attn_tensors as at
from attn_tensors import AttentionInputError
from conftest import assert_close, random_qkv, requires_mlx, to_backend, to_np


# -- the tutorial's worked example 1, against a closed form -------------------
def test_worked_example_1_closed_form():
    """2 queries x 3 keys, d_k = 2: every intermediate against exact arithmetic.

    S = Q K^T / sqrt(2) has entries c = 1/sqrt(2) or 0; each row has two entries
    c and one 0, so its weights are e^c/(2e^c+1) and 1/(2e^c+1).
    """
    Q = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    K = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    V = jnp.array([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    parts = at.attention_decomposition(Q, K, V)

    c = 1 / math.sqrt(2)
    np.testing.assert_allclose(parts.S, [[c, 0, c], [0, c, c]], rtol=1e-15)
    big, small = math.exp(c) / (2 * math.exp(c) + 1), 1 / (2 * math.exp(c) + 1)
    np.testing.assert_allclose(parts.A, [[big, small, big], [small, big, big]], rtol=1e-14)
    np.testing.assert_allclose(parts.log_Z, [math.log(2 * math.exp(c) + 1)] * 2, rtol=1e-14)
    O_exact = [[2 * big + big, 2 * small + big], [2 * small + big, 2 * big + big]]
    np.testing.assert_allclose(parts.O, O_exact, rtol=1e-14)
    # the output is symmetric under swapping the two queries and the two value columns
    np.testing.assert_allclose(parts.O[0], parts.O[1][::-1], rtol=1e-14)


# -- properties on one fixed shape ------------------------------------------
N_Q, N_K, D_K, D_V = 3, 4, 5, 2
qs = arrays(np.float64, (N_Q, D_K), elements=st.floats(-3, 3, allow_subnormal=False))
ks = arrays(np.float64, (N_K, D_K), elements=st.floats(-3, 3, allow_subnormal=False))
vs = arrays(np.float64, (N_K, D_V), elements=st.floats(-3, 3, allow_subnormal=False))
_attend = jax.jit(lambda Q, K, V: at.attention_decomposition(Q, K, V))


@given(qs, ks, vs)
def test_output_is_a_convex_combination_of_values(Q, K, V):
    """Each output row lies inside the box spanned by the value rows (weights are convex)."""
    parts = _attend(jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V))
    O = np.asarray(parts.O)
    assert np.all(O <= V.max(0) + 1e-12) and np.all(O >= V.min(0) - 1e-12)
    np.testing.assert_allclose(np.asarray(parts.A).sum(-1), 1.0, rtol=1e-12)


@given(qs, ks, vs)
def test_permuting_keys_and_values_together_changes_nothing(Q, K, V):
    """Attention is a set operation over key/value pairs."""
    perm = np.array([2, 0, 3, 1])
    O1 = _attend(jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V)).O
    O2 = _attend(jnp.asarray(Q), jnp.asarray(K[perm]), jnp.asarray(V[perm])).O
    np.testing.assert_allclose(O1, O2, rtol=1e-10, atol=1e-12)


def test_metric_and_default_scale_agree(rng):
    """g = delta/sqrt(d_k) reproduces the default; a general metric is Q g K^T."""
    Q, K, V = random_qkv(rng)
    g = at.bilinear.scaled_euclidean_metric(D_K)
    O1 = at.scaled_dot_product_attention(jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V))
    O2 = at.scaled_dot_product_attention(jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V), g=g)
    np.testing.assert_allclose(O1, O2, rtol=1e-12)
    M = rng.standard_normal((D_K, D_K))
    np.testing.assert_allclose(at.attention_scores(jnp.asarray(Q), jnp.asarray(K), jnp.asarray(M)), Q @ M @ K.T, rtol=1e-12)
    np.testing.assert_allclose(at.attention_scores(jnp.asarray(Q), jnp.asarray(K), scale=1.0), Q @ K.T, rtol=1e-12)
    with pytest.raises(AttentionInputError, match="either a metric g or a scale"):
        at.attention_scores(jnp.asarray(Q), jnp.asarray(K), jnp.asarray(M), scale=1.0)


def test_low_rank_view_of_the_close_reading(rng):
    """x M x^T with M = W_Q W_K^T / sqrt(d_k) equals Q K^T / sqrt(d_k); M is rank d_k, asymmetric."""
    x = rng.standard_normal((6, 8))
    W_Q, W_K = rng.standard_normal((8, 3)), rng.standard_normal((8, 3))
    M = at.low_rank_metric(jnp.asarray(W_Q), jnp.asarray(W_K))
    np.testing.assert_allclose(at.kernel_scores(jnp.asarray(x), M), (x @ W_Q) @ (x @ W_K).T / np.sqrt(3), rtol=1e-12)
    assert np.linalg.matrix_rank(np.asarray(M)) == 3
    assert not np.allclose(M, np.asarray(M).T)


def test_temperature_divides_scores(rng):
    """softmax(S/T) for T != 1."""
    Q, K, V = random_qkv(rng)
    parts = at.attention_decomposition(jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V), T=0.4)
    S = Q @ K.T / np.sqrt(D_K)
    E = np.exp(S / 0.4 - (S / 0.4).max(-1, keepdims=True))
    np.testing.assert_allclose(parts.A, E / E.sum(-1, keepdims=True), rtol=1e-12)


def test_batch_axes_broadcast(rng):
    """Leading axes: batched Q against unbatched K, V gives one result per batch entry."""
    Q = rng.standard_normal((2, 3, N_Q, D_K))
    _, K, V = random_qkv(rng)
    O = at.scaled_dot_product_attention(jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V))
    assert O.shape == (2, 3, N_Q, D_V)
    for b in range(2):
        for h in range(3):
            np.testing.assert_allclose(O[b, h], at.scaled_dot_product_attention(jnp.asarray(Q[b, h]), jnp.asarray(K), jnp.asarray(V)), rtol=1e-12)


# -- numerics and bad input ---------------------------------------------------
def test_extreme_scores_float32_finite():
    """Scores near +-1e4 in float32 (raw dot products) give finite weights and outputs."""
    Q = jnp.array([[100.0, 0.0], [-100.0, 0.0]], dtype=jnp.float32)
    K = jnp.array([[100.0, 0.0], [-100.0, 0.0], [0.0, 100.0]], dtype=jnp.float32)
    V = jnp.eye(3, 2, dtype=jnp.float32)
    parts = at.attention_decomposition(Q, K, V, scale=1.0)
    assert float(jnp.max(jnp.abs(parts.S))) == 1e4
    for x in parts:
        assert x.dtype == jnp.float32 and np.all(np.isfinite(x))
    np.testing.assert_allclose(parts.A, [[1, 0, 0], [0, 1, 0]])


def test_fully_masked_row_is_zero_everywhere(rng):
    """A query that may attend to nothing: A = 0, O = 0, log Z = -inf, gradients finite."""
    Q, K, V = (jnp.asarray(x) for x in random_qkv(rng))
    mask = jnp.ones((N_Q, N_K), dtype=bool).at[1].set(False)
    parts = at.attention_decomposition(Q, K, V, mask=mask)
    np.testing.assert_array_equal(parts.A[1], 0.0)
    np.testing.assert_array_equal(parts.O[1], 0.0)
    assert parts.log_Z[1] == -np.inf
    grads = jax.grad(lambda q, k, v: jnp.sum(at.scaled_dot_product_attention(q, k, v, mask=mask) ** 2), argnums=(0, 1, 2))(Q, K, V)
    for g in grads:
        assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(grads[0][1], 0.0)


def test_shape_errors_name_the_index_and_both_sizes():
    Q, K, V = jnp.ones((2, 3)), jnp.ones((4, 4)), jnp.ones((4, 2))
    with pytest.raises(AttentionInputError, match=r"K has d_k=4 but Q has d_k=3 \(index a must match\)"):
        at.scaled_dot_product_attention(Q, K, V)
    with pytest.raises(AttentionInputError, match=r"V has n_k=5 but K has n_k=4 \(index j must match\)"):
        at.scaled_dot_product_attention(jnp.ones((2, 4)), K, jnp.ones((5, 2)))
    with pytest.raises(AttentionInputError, match=r"V has n_k=3 but A has n_k=4 \(index j must match\)"):
        at.attention_output(jnp.ones((2, 4)), jnp.ones((3, 2)))
    with pytest.raises(AttentionInputError, match="batch axes do not broadcast"):
        at.attention_scores(jnp.ones((2, 3, 4)), jnp.ones((3, 5, 4)))
    with pytest.raises(AttentionInputError, match=r"S must have at least 2 axes"):
        at.attention_weights(jnp.ones(3))


def test_temperature_errors():
    Q, K, V = jnp.ones((2, 3)), jnp.ones((4, 3)), jnp.ones((4, 2))
    for T in (0, -2.0):
        with pytest.raises(AttentionInputError, match="temperature T must be positive"):
            at.scaled_dot_product_attention(Q, K, V, T=T)


def test_nan_input_is_a_clear_error():
    Q = jnp.array([[1.0, jnp.nan]])
    with pytest.raises(AttentionInputError, match="Q contains 1 NaN or infinite"):
        at.scaled_dot_product_attention(Q, jnp.ones((3, 2)), jnp.ones((3, 2)))
    with pytest.raises(AttentionInputError, match="V contains"):
        at.scaled_dot_product_attention(jnp.ones((1, 2)), jnp.ones((3, 2)), jnp.full((3, 2), jnp.inf))


def test_jit_traces_and_returns_arrays(rng):
    """Everything traces under jit (value checks are skipped on tracers), float64 kept."""
    Q, K, V = (jnp.asarray(x) for x in random_qkv(rng))
    f = jax.jit(lambda q, k, v, T: at.scaled_dot_product_attention(q, k, v, T=T))
    out = f(Q, K, V, 0.5)
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(out, at.scaled_dot_product_attention(Q, K, V, T=0.5), rtol=1e-12)


@pytest.mark.mlx
@requires_mlx
def test_mixing_backends_is_an_error():
    with pytest.raises(TypeError, match="both MLX and JAX"):
        at.attention_scores(to_backend(np.ones((2, 3)), "mlx"), jnp.ones((4, 3)))


# -- MLX parity of every public function --------------------------------------
PARITY = [
    ("attention_scores", lambda a: at.attention_scores(a["Q"], a["K"])),
    ("attention_scores_metric", lambda a: at.attention_scores(a["Q"], a["K"], a["g"])),
    ("low_rank_metric", lambda a: at.low_rank_metric(a["W_Q"], a["W_K"])),
    ("kernel_scores", lambda a: at.kernel_scores(a["X"], a["g"])),
    ("attention_weights", lambda a: at.attention_weights(a["S"], a["mask"], 0.7)),
    ("attention_output", lambda a: at.attention_output(a["A"], a["V"])),
    ("scaled_dot_product_attention", lambda a: at.scaled_dot_product_attention(a["Q"], a["K"], a["V"], a["mask"], 1.3)),
    ("attention_decomposition", lambda a: at.attention_decomposition(a["Q"], a["K"], a["V"], a["mask"], 0.9, a["g"])),
    ("softmax", lambda a: at.softmax(a["S"], a["mask"])),
    ("log_partition", lambda a: at.log_partition(a["S"], None, 2.0)),
]


@pytest.mark.parametrize("name,call", PARITY, ids=[p[0] for p in PARITY])
def test_mlx_parity(name, call, xp_name):
    """Same values on MLX (float32) as on JAX (float64), with batch axes and masks."""
    rng = np.random.default_rng(11)
    mask = rng.random((2, N_Q, N_K)) > 0.25
    mask[:, :, 0] = True
    A = rng.random((2, N_Q, N_K))
    raw = dict(
        Q=rng.standard_normal((2, N_Q, D_K)),
        K=rng.standard_normal((2, N_K, D_K)),
        V=rng.standard_normal((N_K, D_V)),
        g=rng.standard_normal((D_K, D_K)),
        W_Q=rng.standard_normal((D_K, 3)),
        W_K=rng.standard_normal((D_K, 3)),
        X=rng.standard_normal((6, D_K)),
        S=rng.standard_normal((2, N_Q, N_K)),
        A=A / A.sum(-1, keepdims=True),
        mask=mask,
    )
    got = call({k: to_backend(v, xp_name) for k, v in raw.items()})
    want = call({k: jnp.asarray(v) for k, v in raw.items()})
    for g_, w_ in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        if xp_name == "mlx":
            assert type(g_).__module__.startswith("mlx")
        assert_close(g_, w_, xp_name, rtol=1e-4 if xp_name == "mlx" else 1e-10, atol=1e-5 if xp_name == "mlx" else 1e-12)


@pytest.mark.mlx
@requires_mlx
def test_mlx_float64():
    """float64 works on MLX's CPU device too.

    MLX 0.32 computes exp in float64 only to about 1e-7 relative accuracy
    (checked against NumPy), so the comparison uses that tolerance.
    """
    import mlx.core as mx

    Q = mx.array(np.eye(2), dtype=mx.float64)
    K = mx.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=mx.float64)
    O = at.scaled_dot_product_attention(Q, K, K)
    assert O.dtype == mx.float64
    assert_close(O, at.scaled_dot_product_attention(jnp.eye(2), jnp.asarray(to_np(K)), jnp.asarray(to_np(K))), "jax", rtol=1e-6)


def test_closure_captured_arrays_under_jit(rng):
    """A concrete array captured by a jitted function is still checked, not a trace error."""
    Q, K, V = (jnp.asarray(x) for x in random_qkv(rng))
    S = at.attention_scores(Q, K)
    A = jax.jit(lambda T: at.attention_weights(S, T=2.0) * T)(1.0)
    np.testing.assert_allclose(A, at.attention_weights(S, T=2.0), rtol=1e-12)
    O = jax.jit(lambda q: at.scaled_dot_product_attention(q, K, V, T=jnp.array(0.5)))(Q)
    np.testing.assert_allclose(O, at.scaled_dot_product_attention(Q, K, V, T=0.5), rtol=1e-12)
