"""The minimal transformer of attn_tensors.transformer against loop specs.

Expected values come from (1) literal NumPy loops over i, d, f, h, j written
below in float64; (2) the rotary embedding of :mod:`attn_tensors.variants`,
an independent implementation of the same rotations; (3) ``jax.grad`` and
finite differences; (4) properties that hold for any weights (causality, a
shift of the positions).  The training test checks that a short seeded run
lowers the loss; it can fail, and its verdict does not depend on time.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_tensors import AttentionInputError
from attn_tensors import transformer as tf
from attn_tensors.variants import rotary_embedding
from conftest import assert_close, requires_mlx, to_backend, to_np


# -- loop specs ---------------------------------------------------------------------
def loop_sinusoidal(n, d, base=10000.0):
    P = np.zeros((n, d))
    for i in range(n):
        for m in range(d // 2):
            theta = base ** (-2.0 * m / d)
            P[i, 2 * m] = math.sin(i * theta)
            P[i, 2 * m + 1] = math.cos(i * theta)
    return P


def loop_layer_norm(X, gamma, beta, eps=1e-5):
    out = np.zeros_like(X)
    for i in range(X.shape[0]):
        mu = sum(X[i]) / X.shape[1]
        var = sum((x - mu) ** 2 for x in X[i]) / X.shape[1]
        for d in range(X.shape[1]):
            out[i, d] = (X[i, d] - mu) / math.sqrt(var + eps) * gamma[d] + beta[d]
    return out


def loop_ffn(X, W_1, b_1, W_2, b_2):
    n, F, E = X.shape[0], W_1.shape[1], W_2.shape[1]
    out = np.zeros((n, E))
    for i in range(n):
        hidden = [max(0.0, sum(X[i, d] * W_1[d, f] for d in range(X.shape[1])) + b_1[f]) for f in range(F)]
        for e in range(E):
            out[i, e] = sum(hidden[f] * W_2[f, e] for f in range(F)) + b_2[e]
    return out


def loop_causal_mha(X, W_Q, W_K, W_V, W_O):
    """Y^{id} = sum_h sum_c O^{hic} W_O^{hcd}, causal softmax, loops over h, i, j."""
    H, n = W_Q.shape[0], X.shape[0]
    Y = np.zeros((n, W_O.shape[2]))
    A = np.zeros((H, n, n))
    for h in range(H):
        Q, K, V = X @ W_Q[h], X @ W_K[h], X @ W_V[h]
        for i in range(n):
            s = [Q[i] @ K[j] / math.sqrt(Q.shape[1]) for j in range(i + 1)]
            top = max(s)
            w = [math.exp(v - top) for v in s]
            for j in range(i + 1):
                A[h, i, j] = w[j] / sum(w)
            O_i = sum(A[h, i, j] * V[j] for j in range(i + 1))
            Y[i] += O_i @ W_O[h]
    return Y, A


def small_params(rng, d=6, H=2, d_k=3, d_ff=5, vocab=7, n_max=6):
    def r(*s):
        return jnp.asarray(rng.standard_normal(s) / math.sqrt(s[-2] if len(s) > 1 else 1))

    blocks = [
        tf.BlockParams(
            W_Q=r(H, d, d_k), W_K=r(H, d, d_k), W_V=r(H, d, d_k), W_O=r(H, d_k, d),
            ln1=(jnp.asarray(1 + 0.1 * rng.standard_normal(d)), jnp.asarray(0.1 * rng.standard_normal(d))),
            ln2=(jnp.asarray(1 + 0.1 * rng.standard_normal(d)), jnp.asarray(0.1 * rng.standard_normal(d))),
            W_1=r(d, d_ff), b_1=jnp.asarray(0.1 * rng.standard_normal(d_ff)),
            W_2=r(d_ff, d), b_2=jnp.asarray(0.1 * rng.standard_normal(d)),
        )
        for _ in range(2)
    ]
    return {
        "embed": jnp.asarray(rng.standard_normal((vocab, d))),
        "positions": jnp.asarray(0.1 * rng.standard_normal((n_max, d))),
        "blocks": blocks,
        "ln_f": (jnp.ones(d), jnp.zeros(d)),
        "unembed": r(d, vocab),
    }


# -- positions ----------------------------------------------------------------------
@pytest.mark.parametrize("n, d", [(1, 2), (9, 8), (5, 12)])
def test_sinusoidal_loop_spec(n, d):
    assert_close(tf.sinusoidal_positions(n, d), loop_sinusoidal(n, d))


def test_sinusoidal_gram_depends_on_offset_only():
    """P^{id} P^{jd} = sum_m cos((i - j) theta_m): equal along each diagonal."""
    P = to_np(tf.sinusoidal_positions(10, 8))
    G = P @ P.T
    theta = 10000.0 ** (-2.0 * np.arange(4) / 8)
    for i in range(10):
        for j in range(10):
            assert G[i, j] == pytest.approx(np.sum(np.cos((i - j) * theta)), abs=1e-12)


def test_sinusoidal_rows_are_rotations_of_row_zero():
    """Row i is row 0 rotated by -i theta_m in each pair: the rotary embedding."""
    P = tf.sinusoidal_positions(7, 6)
    rotated = rotary_embedding(jnp.tile(P[:1], (7, 1)), positions=-jnp.arange(7))
    assert_close(P, rotated)


@pytest.mark.parametrize("n, d", [(0, 4), (4, 5), (4, 0)])
def test_sinusoidal_bad_sizes_name_the_index(n, d):
    with pytest.raises(AttentionInputError, match="index"):
        tf.sinusoidal_positions(n, d)


# -- the two sublayers ----------------------------------------------------------------
def test_layer_norm_loop_spec(rng):
    X = rng.standard_normal((4, 6)) * 3 + 1
    gamma, beta = rng.standard_normal(6), rng.standard_normal(6)
    got = tf.layer_norm(jnp.asarray(X), jnp.asarray(gamma), jnp.asarray(beta))
    assert_close(got, loop_layer_norm(X, gamma, beta))


def test_layer_norm_rows_have_zero_mean_unit_variance(rng):
    """With gamma = 1 and beta = 0 every row is centred and of variance ~1."""
    X = jnp.asarray(rng.standard_normal((2, 3, 16)) * 5 - 2)
    Y = to_np(tf.layer_norm(X, jnp.ones(16), jnp.zeros(16), eps=0.0))
    assert np.allclose(Y.mean(-1), 0, atol=1e-12)
    assert np.allclose(Y.var(-1), 1, atol=1e-10)


def test_layer_norm_gamma_size_mismatch(rng):
    with pytest.raises(AttentionInputError, match="d=4"):
        tf.layer_norm(jnp.ones((2, 4)), jnp.ones(3), jnp.zeros(4))


def test_feed_forward_loop_spec(rng):
    X, W_1, b_1 = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    W_2, b_2 = rng.standard_normal((5, 4)), rng.standard_normal(4)
    got = tf.feed_forward(*(jnp.asarray(a) for a in (X, W_1, b_1, W_2, b_2)))
    assert_close(got, loop_ffn(X, W_1, b_1, W_2, b_2))


def test_feed_forward_mismatch_names_indices(rng):
    with pytest.raises(AttentionInputError, match="indices d and f"):
        tf.feed_forward(jnp.ones((2, 4)), jnp.ones((3, 5)), jnp.zeros(5), jnp.ones((5, 4)), jnp.zeros(4))


# -- the block and the model -----------------------------------------------------------
def test_block_loop_spec(rng):
    """X'' = X' + FFN(LN2(X')), X' = X + MHA(LN1(X)), with loops for every piece."""
    p = small_params(rng)["blocks"][0]
    X = rng.standard_normal((5, 6))
    got, A = tf.block(p, jnp.asarray(X), mask=jnp.tril(jnp.ones((5, 5), bool)))
    W = [to_np(w) for w in (p.W_Q, p.W_K, p.W_V, p.W_O)]
    Y, A_want = loop_causal_mha(loop_layer_norm(X, *map(to_np, p.ln1)), *W)
    X1 = X + Y
    want = X1 + loop_ffn(loop_layer_norm(X1, *map(to_np, p.ln2)),
                         *map(to_np, (p.W_1, p.b_1, p.W_2, p.b_2)))
    assert_close(got, want)
    assert_close(A, A_want)


def test_forward_is_causal(rng):
    """Changing token n-1 leaves the logits of positions 0..n-2 unchanged."""
    params = small_params(rng)
    toks = jnp.asarray(rng.integers(0, 7, size=(3, 6)))
    changed = toks.at[:, -1].set((toks[:, -1] + 3) % 7)
    a, b = tf.forward(params, toks), tf.forward(params, changed)
    assert_close(a.logits[:, :-1], b.logits[:, :-1])
    assert float(jnp.max(jnp.abs(a.logits[:, -1] - b.logits[:, -1]))) > 1e-6


def test_forward_shapes_and_residual_stream(rng):
    params = small_params(rng)
    out = tf.forward(params, jnp.asarray(rng.integers(0, 7, size=(2, 5))))
    assert out.logits.shape == (2, 5, 7)
    assert [A.shape for A in out.attention] == [(2, 2, 5, 5)] * 2
    assert len(out.residual) == 3
    # rows of A sum to one and respect the causal mask
    for A in out.attention:
        assert_close(jnp.sum(A, -1), np.ones((2, 2, 5)))
        assert float(jnp.max(jnp.abs(jnp.triu(A, 1)))) == 0.0


def test_forward_too_many_positions(rng):
    params = small_params(rng, n_max=4)
    with pytest.raises(AttentionInputError, match="n=5"):
        tf.forward(params, jnp.zeros((1, 5), int))


def test_gradient_matches_finite_differences(rng):
    """jax.grad of the loss through the whole model, spot-checked by central differences."""
    params = small_params(rng)
    toks = jnp.asarray(rng.integers(0, 7, size=(2, 6)))
    tgt = jnp.asarray(rng.integers(0, 7, size=(2, 6)))
    w = jnp.ones((2, 6))

    def loss(W_Q):
        blocks = [params["blocks"][0]._replace(W_Q=W_Q)] + params["blocks"][1:]
        return tf.cross_entropy(tf.forward({**params, "blocks": blocks}, toks).logits, tgt, w)

    W_Q = params["blocks"][0].W_Q
    g = to_np(jax.grad(loss)(W_Q))
    eps = 1e-6
    for idx in [(0, 0, 0), (1, 3, 2), (0, 5, 1)]:
        e = jnp.zeros_like(W_Q).at[idx].set(eps)
        fd = (float(loss(W_Q + e)) - float(loss(W_Q - e))) / (2 * eps)
        assert g[idx] == pytest.approx(fd, rel=1e-5, abs=1e-8)


# -- the task and the training -----------------------------------------------------------
def test_copy_task_layout():
    toks, tgt, w = tf.copy_task(jax.random.PRNGKey(3), 4, 5, 9)
    seq = np.concatenate([to_np(toks), to_np(tgt)[:, -1:]], axis=1)
    assert toks.shape == tgt.shape == w.shape == (4, 10)
    assert np.all(seq[:, 5] == 8)  # the separator
    assert np.array_equal(seq[:, :5], seq[:, 6:])  # the copy
    assert np.array_equal(to_np(tgt), seq[:, 1:])
    assert np.array_equal(to_np(w[0]), [0] * 5 + [1] * 5)


def test_cross_entropy_of_uniform_logits_is_log_vocab():
    logits = jnp.zeros((2, 3, 6))
    tgt = jnp.zeros((2, 3), int)
    assert float(tf.cross_entropy(logits, tgt, jnp.ones((2, 3)))) == pytest.approx(math.log(6))


def test_short_training_lowers_the_loss():
    """60 seeded Adam steps: the mean loss of the last 10 steps is below 3/4 of the first."""
    p0 = tf.init_params(jax.random.PRNGKey(0), vocab=6, n_max=8, d_model=16, H=2, d_k=4, d_ff=16)
    p, losses = tf.train(p0, steps=60, m=4, vocab=6, lr=1e-2)
    assert losses.shape == (60,)
    assert np.all(np.isfinite(losses))
    assert losses[-10:].mean() < 0.75 * losses[:3].mean()
    assert jax.tree_util.tree_structure(p) == jax.tree_util.tree_structure(p0)


def test_fixed_positions_stay_fixed():
    p0 = tf.init_params(jax.random.PRNGKey(1), vocab=6, n_max=8, d_model=8, H=1, d_k=4, d_ff=8,
                        positions="sinusoidal")
    p, _ = tf.train(p0, steps=3, m=4, vocab=6, train_positions=False)
    assert np.array_equal(to_np(p["positions"]), to_np(p0["positions"]))
    assert not np.array_equal(to_np(p["embed"]), to_np(p0["embed"]))


def test_init_rejects_unknown_positions():
    with pytest.raises(AttentionInputError, match="positions"):
        tf.init_params(jax.random.PRNGKey(0), vocab=5, n_max=4, positions="rotary")


# -- MLX --------------------------------------------------------------------------------
@requires_mlx
@pytest.mark.mlx
def test_mlx_forward_matches_jax(rng):
    """The forward pieces on MLX float32 arrays agree with JAX float64."""
    params = small_params(rng)
    toks = rng.integers(0, 7, size=(2, 6))
    conv = jax.tree_util.tree_map(lambda a: to_backend(to_np(a), "mlx"), params)
    got = tf.forward(conv, to_backend(toks, "mlx", dtype=None).astype(__import__("mlx.core").core.int32))
    want = tf.forward(params, jnp.asarray(toks))
    assert_close(got.logits, want.logits, "mlx", rtol=1e-4, atol=1e-4)
    assert_close(tf.sinusoidal_positions(5, 4, like=to_backend(np.zeros(1), "mlx")),
                 loop_sinusoidal(5, 4), "mlx")
