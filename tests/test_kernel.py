"""Part IX: attention as kernel regression, feature maps and linear attention.

Expected values come from literal loop specs (plain Python/NumPy loops over
the indices of each formula), from the reference attention, or from
statistics with a fixed seed and wide margins.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conftest import assert_close, random_qkv, requires_mlx, to_backend, to_np
from attn_tensors import AttentionInputError, scaled_dot_product_attention
from attn_tensors.kernel import (
    draw_random_features,
    elu_plus_one,
    exponential_kernel,
    gaussian_kernel,
    linear_attention,
    nadaraya_watson,
    positive_random_features,
    random_feature_error,
)

# -- loop specs ----------------------------------------------------------------------


def kernel_spec(q, k, kappa):
    """kappa^{ij} = kappa(q_i, k_j) by a double loop (2-D inputs)."""
    return np.array([[kappa(qi, kj) for kj in k] for qi in q])


def exp_kappa(qi, kj, g=None):
    d = len(qi)
    if g is None:
        return math.exp(sum(qi[a] * kj[a] for a in range(d)) / math.sqrt(d))
    return math.exp(sum(qi[a] * g[a][b] * kj[b] for a in range(d) for b in range(d)))


def rbf_kappa(qi, kj, sigma):
    return math.exp(-sum((qi[a] - kj[a]) ** 2 for a in range(len(qi))) / (2 * sigma**2))


def nw_spec(q, k, v, kappa, allowed=None):
    """o^{ib} = sum_j kappa_ij v^{jb} / sum_j kappa_ij over admissible j (0 if none)."""
    out = np.zeros((len(q), v.shape[1]))
    for i, qi in enumerate(q):
        w = [kappa(qi, kj) if allowed is None or allowed[i][j] else 0.0 for j, kj in enumerate(k)]
        if sum(w) > 0:
            out[i] = sum(w[j] * v[j] for j in range(len(k))) / sum(w)
    return out


def linear_spec(phi_q, phi_k, v, causal=False, eps=0.0, offset=None):
    """o^{ib} = sum_j (phi_q^i . phi_k^j) v^{jb} / (sum_j phi_q^i . phi_k^j + eps).

    Causal: j <= i + offset, offset = n_k - n_q by default (masking.causal_mask).
    """
    out = np.zeros((phi_q.shape[0], v.shape[1]))
    if offset is None:
        offset = phi_k.shape[0] - phi_q.shape[0]
    for i in range(phi_q.shape[0]):
        num, den = np.zeros(v.shape[1]), 0.0
        for j in range(phi_k.shape[0]):
            if causal and j > i + offset:
                continue
            w = sum(phi_q[i, c] * phi_k[j, c] for c in range(phi_q.shape[1]))
            num, den = num + w * v[j], den + w
        den += eps
        out[i] = num / den if den != 0 else 0.0
    return out


# -- kernels and Nadaraya-Watson ---------------------------------------------------------


def test_exponential_kernel_loop_spec(rng):
    """kappa^{ij} = exp(q_i . k_j / sqrt(d_k)), or exp(q^a g_ab k^b); two vectors give a scalar."""
    q, k = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    assert_close(exponential_kernel(q, k), kernel_spec(q, k, exp_kappa))
    g = rng.standard_normal((4, 4)) * 0.3
    assert_close(exponential_kernel(q, k, g), kernel_spec(q, k, lambda a, b: exp_kappa(a, b, g)))
    assert_close(exponential_kernel(q, k, log=True), np.log(kernel_spec(q, k, exp_kappa)))
    s = exponential_kernel(q[0], k[1])
    assert np.shape(to_np(s)) == ()
    assert_close(s, exp_kappa(q[0], k[1]))


def test_gaussian_kernel_loop_spec(rng):
    """kappa^{ij} = exp(-|q_i - k_j|^2 / (2 sigma^2)), 1 on the diagonal of kappa(x, x)."""
    q, k = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    want = kernel_spec(q, k, lambda a, b: rbf_kappa(a, b, 1.3))
    assert_close(gaussian_kernel(q, k, 1.3), want)
    assert_close(np.diagonal(to_np(gaussian_kernel(q, q))), np.ones(3))
    with pytest.raises(AttentionInputError, match="sigma"):
        gaussian_kernel(q, k, 0.0)


def test_nadaraya_watson_is_attention(rng):
    """With the exponential kernel, kernel regression is softmax attention (batch, mask, metric)."""
    Q, K, V = random_qkv(rng, batch=(2, 3), n_q=4, n_k=6, d_k=5, d_v=2)
    mask = rng.random((2, 1, 4, 6)) > 0.3
    mask[0, 0, 1] = False
    assert_close(nadaraya_watson(Q, K, V, mask=mask), scaled_dot_product_attention(Q, K, V, mask))
    g = np.diag(rng.random(5) + 0.2)
    assert_close(nadaraya_watson(Q, K, V, g=g), scaled_dot_product_attention(Q, K, V, g=g))


def test_nadaraya_watson_loop_spec_and_rbf(rng):
    """NW equals the literal kernel-weighted average for the exponential and the RBF kernel."""
    q, k = rng.standard_normal((4, 3)) * 3, rng.standard_normal((6, 3)) * 3
    v = rng.standard_normal((6, 2))
    allowed = rng.random((4, 6)) > 0.4
    allowed[2] = False
    assert_close(nadaraya_watson(q, k, v, mask=allowed), nw_spec(q, k, v, exp_kappa, allowed))
    rbf = functools.partial(rbf_kappa, sigma=0.8)
    got = nadaraya_watson(q, k, v, kernel=gaussian_kernel, sigma=0.8)
    assert_close(got, nw_spec(q, k, v, rbf), rtol=1e-9)


def test_nadaraya_watson_stable_in_log_space():
    """Far-apart points underflow exp(-d^2/2) to 0 everywhere, yet NW picks the nearest key."""
    k = jnp.array([[0.0], [1000.0]])
    v = jnp.array([[1.0], [2.0]])
    q = jnp.array([[800.0]])  # exp(-800^2/2) and exp(-200^2/2) are both 0 in float64
    assert float(jnp.max(gaussian_kernel(q, k))) == 0.0
    assert_close(nadaraya_watson(q, k, v, kernel=gaussian_kernel), [[2.0]])


# -- feature maps ------------------------------------------------------------------------


@given(hnp.arrays(np.float64, (4, 5), elements=st.floats(-700, 700, allow_subnormal=False)))
def test_elu_plus_one_is_positive_and_exact(x):
    """phi(x) = x + 1 for x > 0, exp(x) otherwise: positive (or exp-underflow 0), finite."""
    got = to_np(elu_plus_one(jnp.asarray(x)))
    want = np.array([[v + 1 if v > 0 else math.exp(v) for v in row] for row in x])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert np.all(got >= 0) and np.all(np.isfinite(got))


def test_elu_plus_one_gradient_finite():
    """The gradient is 1 for x > 0 and exp(x) below, with no overflow from the other branch."""
    x = jnp.array([-1000.0, -1.0, 0.5, 1000.0])
    g = jax.grad(lambda x: jnp.sum(elu_plus_one(x)))(x)
    np.testing.assert_allclose(to_np(g), [0.0, math.exp(-1.0), 1.0, 1.0])


def test_draw_random_features_orthogonal_blocks():
    """Orthogonal draws: rows within each block of d_k are mutually orthogonal; seeds reproduce."""
    d_k, m = 4, 10
    om = to_np(draw_random_features(3, m, d_k))
    assert om.shape == (m, d_k)
    for start in range(0, m, d_k):
        block = om[start : start + d_k]
        gram = block @ block.T
        np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-12)
    assert np.array_equal(om, to_np(draw_random_features(3, m, d_k)))
    assert not np.array_equal(om, to_np(draw_random_features(4, m, d_k)))
    key = jax.random.PRNGKey(7)
    assert np.array_equal(
        to_np(draw_random_features(key, m, d_k)), to_np(draw_random_features(key, m, d_k))
    )


def test_random_features_are_standard_normal():
    """Each row of omega is N(0, I): the empirical second moment is close to the identity."""
    for orthogonal in (True, False):
        om = to_np(draw_random_features(0, 20000, 3, orthogonal))
        np.testing.assert_allclose(om.T @ om / len(om), np.eye(3), atol=0.05)


def test_positive_random_features_unbiased(rng):
    """E[phi(q) . phi(k)] = exp(q . k / sqrt(d_k)) (fixed seed, m = 200000, 3% margin ~ 3 sigma)."""
    d_k = 4
    q, k = rng.standard_normal((3, d_k)) * 0.6, rng.standard_normal((3, d_k)) * 0.6
    om = draw_random_features(0, 200000, d_k, orthogonal=False)
    est = to_np(jnp.einsum(
        "ic,jc->ij",
        positive_random_features(q, om, stabilize=False),
        positive_random_features(k, om, stabilize=False),
    ))
    np.testing.assert_allclose(est, kernel_spec(q, k, exp_kappa), rtol=0.03)
    assert np.all(to_np(positive_random_features(q, om)) > 0)


def test_positive_random_features_loop_spec_and_stabilizer(rng):
    """phi^c = exp(omega^c . x' - |x'|^2/2)/sqrt(m); the stabiliser rescales a batch element."""
    X = rng.standard_normal((2, 3, 4))
    om = to_np(draw_random_features(1, 6, 4))
    xs = X / 4**0.25
    want = np.array([[[math.exp(om[c] @ xs[h, i] - xs[h, i] @ xs[h, i] / 2) / math.sqrt(6)
                       for c in range(6)] for i in range(3)] for h in range(2)])
    assert_close(positive_random_features(X, om, stabilize=False), want)
    ratio = to_np(positive_random_features(X, om)) / want
    for h in range(2):  # one common factor per batch element, the largest feature = 1/sqrt(m)
        np.testing.assert_allclose(ratio[h], ratio[h, 0, 0], rtol=1e-12)
    np.testing.assert_allclose(to_np(positive_random_features(X, om)).max(axis=(1, 2)),
                               1 / math.sqrt(6), rtol=1e-12)


def test_positive_random_features_large_inputs_finite(rng):
    """Inputs with |x| ~ 50 overflow without the stabiliser but not with it."""
    X = rng.standard_normal((5, 8)) * 50
    om = draw_random_features(0, 16, 8)
    assert np.all(np.isfinite(to_np(positive_random_features(X, om))))


# -- linear attention ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["elu", "favor"])
def test_linear_attention_loop_spec(kind, rng):
    """phi(q_i).(sum_j phi(k_j) v_j) / (phi(q_i).(sum_j phi(k_j)) + eps) equals the O(n^2) loop."""
    Q, K, V = random_qkv(rng, batch=(2,), n_q=5, n_k=7, d_k=4, d_v=3)
    if kind == "elu":
        phi = elu_plus_one
    else:
        phi = functools.partial(positive_random_features, omega=draw_random_features(2, 6, 4))
    got = to_np(linear_attention(Q, K, V, phi, eps=1e-3))
    phi_q, phi_k = to_np(phi(Q)), to_np(phi(K))
    for h in range(2):
        want = linear_spec(phi_q[h], phi_k[h], V[h], eps=1e-3)
        np.testing.assert_allclose(got[h], want, rtol=1e-10)


@pytest.mark.parametrize("n_q, chunk, offset", [(7, 3, None), (4, 3, None), (9, 2, None), (4, 3, 0), (9, 2, 1)])
def test_causal_linear_attention_loop_spec(n_q, chunk, offset, rng):
    """The chunked scan equals the masked loop (keys j <= i + offset), for n_q =, <, > n_k, any chunk."""
    Q, K, V = random_qkv(rng, batch=(2,), n_q=n_q, n_k=7, d_k=4, d_v=2)
    got = to_np(linear_attention(Q, K, V, elu_plus_one, causal=True, chunk=chunk, offset=offset))
    for h in range(2):
        want = linear_spec(to_np(elu_plus_one(Q[h])), to_np(elu_plus_one(K[h])), V[h],
                           causal=True, offset=offset)
        assert_close(got[h], want)


def test_linear_attention_padding_drops_keys(rng):
    """Padded keys (mask False) change nothing: same as deleting them; all padded gives 0."""
    Q, K, V = random_qkv(rng, batch=(2,), n_q=4, n_k=6)
    pad = np.array([[True, False, True, True, False, True], [False] * 6])
    got = to_np(linear_attention(Q, K, V, elu_plus_one, pad))
    keep = pad[0]
    assert_close(got[0], linear_attention(Q[0], K[0][keep], V[0][keep], elu_plus_one))
    assert np.all(got[1] == 0.0)
    got_c = to_np(linear_attention(Q, K, V, elu_plus_one, pad, causal=True))
    want_c = linear_spec(to_np(elu_plus_one(Q[0])), to_np(elu_plus_one(K[0])) * keep[:, None],
                         V[0], causal=True)
    assert_close(got_c[0], want_c)


def test_linear_attention_gradient_matches_quadratic_form(rng):
    """Autodiff through the O(n) form equals autodiff of the explicit O(n^2) form."""
    Q, K, V = random_qkv(rng, n_q=5, n_k=5, d_k=3, d_v=2)
    G = rng.standard_normal((5, 2))

    def quadratic(Q, K, V):
        W = jnp.tril(jnp.einsum("ic,jc->ij", elu_plus_one(Q), elu_plus_one(K)))
        return (W @ V) / jnp.sum(W, axis=-1, keepdims=True)

    def loss(f):
        return jax.grad(lambda Q, K, V: jnp.sum(f(Q, K, V) * G), argnums=(0, 1, 2))(Q, K, V)

    got = loss(lambda Q, K, V: linear_attention(Q, K, V, elu_plus_one, causal=True, chunk=2))
    for g, w in zip(got, loss(quadratic)):
        assert_close(g, w)


def test_performer_error_decreases_with_m(rng):
    """FAVOR+ approaches softmax attention: error falls with m, by > 3x from m=8 to m=2048."""
    Q, K, V = random_qkv(rng, n_q=32, n_k=32, d_k=8, d_v=4)
    Q, K = Q * 0.7, K * 0.7
    err = to_np(random_feature_error(Q, K, V, [8, 128, 2048], 0))
    assert err.shape == (3,)
    assert err[0] > err[1] > err[2]
    assert err[2] < err[0] / 3
    assert err[2] < 0.3


def test_linear_attention_errors(rng):
    Q, K, V = random_qkv(rng, n_q=3, n_k=4)
    with pytest.raises(AttentionInputError, match="n_k"):
        linear_attention(Q, K, V[:3])
    with pytest.raises(AttentionInputError, match="n_k"):
        linear_attention(Q, K, V, elu_plus_one, np.ones(5, bool))
    with pytest.raises(AttentionInputError, match="d_k"):
        positive_random_features(Q, np.ones((3, 2)))
    with pytest.raises(AttentionInputError, match="m >= 1"):
        draw_random_features(0, 0, 3)
    with pytest.raises(AttentionInputError, match="chunk"):
        linear_attention(Q, K, V, causal=True, chunk=0)


# -- MLX parity ------------------------------------------------------------------------


def _parity_cases(rng):
    Q, K, V = random_qkv(rng, batch=(2,), n_q=5, n_k=6, d_k=4, d_v=3)
    mask = rng.random((2, 5, 6)) > 0.3
    pad = rng.random((2, 6)) > 0.3
    g = np.diag(rng.random(4) + 0.5)
    om = to_np(draw_random_features(0, 8, 4))
    return [
        ("exponential_kernel", exponential_kernel, (Q, K, g), {}),
        ("gaussian_kernel", gaussian_kernel, (Q, K), dict(sigma=1.5)),
        ("nadaraya_watson", nadaraya_watson, (Q, K, V), dict(mask=mask)),
        ("elu_plus_one", elu_plus_one, (Q,), {}),
        ("positive_random_features", positive_random_features, (Q, om), {}),
        ("linear_attention", linear_attention, (Q, K, V, elu_plus_one, pad), {}),
        ("linear_attention causal", linear_attention, (Q, K, V, elu_plus_one),
         dict(causal=True, chunk=2)),
        ("random_feature_error", random_feature_error, (Q, K, V, [4, 16], 3),
         dict(n_draws=2)),
    ]


@requires_mlx
@pytest.mark.mlx
def test_mlx_parity_every_public_function():
    """Every public function of kernel.py gives the JAX float64 result on MLX arrays."""
    rng = np.random.default_rng(2)
    names = []
    for name, fn, args, kw in _parity_cases(rng):
        want = fn(*args, **kw)
        margs = [to_backend(a, "mlx") if isinstance(a, np.ndarray) else a for a in args]
        mkw = {k: to_backend(v, "mlx") if isinstance(v, np.ndarray) else v for k, v in kw.items()}
        got = fn(*margs, **mkw)
        assert type(got).__module__.startswith("mlx"), name
        assert_close(got, want, "mlx", err_msg=name)
        names.append(name)
    # draw_random_features: same omega on both backends
    om_m = draw_random_features(5, 6, 3, like=to_backend(np.zeros(1), "mlx"))
    assert type(om_m).__module__.startswith("mlx")
    assert_close(om_m, draw_random_features(5, 6, 3), "mlx")
    assert len(names) == 8


def test_random_feature_error_float32_far_apart_queries():
    """random_feature_error in float32 with |q| ~ 30: finite, and the float64 value to 1e-3.

    It stabilises each query row by its own maximum (performer_feature_maps);
    with one maximum over all rows, most query rows underflowed to 0.
    """
    rng = np.random.default_rng(5)
    Q, K, V = 30 * rng.standard_normal((6, 4)), 30 * rng.standard_normal((7, 4)), rng.standard_normal((7, 3))
    want = to_np(random_feature_error(Q, K, V, [8], 0, n_draws=2))
    got = to_np(random_feature_error(*(jnp.asarray(x, jnp.float32) for x in (Q, K, V)), [8], 0, n_draws=2))
    np.testing.assert_allclose(got, want, rtol=1e-3)
