"""Part IX: online softmax, flash attention and the fused kernels.

Every expected value comes from an independent computation: a literal
log-sum-exp loop, the reference ``attention_decomposition`` (which forms the
full n x n matrices), or JAX autodiff of that reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conftest import assert_close, random_qkv, requires_mlx, to_backend, to_np
from attn_tensors import (
    AttentionInputError,
    attention_decomposition,
    scaled_dot_product_attention,
)
from attn_tensors.flash import (
    fast_attention,
    flash_attention,
    online_logsumexp,
    online_softmax_update,
)


# -- independent specs ---------------------------------------------------------


def lse_spec(x: np.ndarray) -> np.ndarray:
    """log sum_j exp(x^j) by a literal loop over rows (-inf for an all -inf row)."""
    out = np.empty(x.shape[:-1])
    for idx in np.ndindex(*x.shape[:-1]):
        finite = [v for v in x[idx] if v > -np.inf]
        if not finite:
            out[idx] = -np.inf
            continue
        m = max(finite)
        out[idx] = m + np.log(sum(np.exp(v - m) for v in finite))
    return out


def full_mask(pad_mask, n_q, n_k, causal):
    """The (..., n_q, n_k) may-attend mask equal to a padding mask plus causality.

    Causal: query i sits at key position i + (n_k - n_q), the library's
    convention (masking.causal_mask): the last query lines up with the last key.
    """
    m = np.ones((n_q, n_k), bool)
    if causal:
        m = np.array([[j <= i + n_k - n_q for j in range(n_k)] for i in range(n_q)])
    if pad_mask is not None:
        m = m & np.asarray(pad_mask)[..., None, :]
    return m


# -- online softmax -----------------------------------------------------------------

# XLA flushes subnormals to zero on CPU, so hypothesis draws normal floats only.
row_values = st.floats(-50, 50, allow_nan=False, allow_subnormal=False)


@given(
    hnp.arrays(np.float64, (3, 23), elements=row_values),
    hnp.arrays(np.bool_, (3, 23)),
)
def test_online_logsumexp_equals_logsumexp(x, drop):
    """Streaming blocks of 5 through (m, l) gives log-sum-exp; -inf entries add nothing."""
    x = np.where(drop, -np.inf, x)
    got = online_logsumexp(jnp.asarray(x), 5)
    np.testing.assert_allclose(to_np(got), lse_spec(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("block", [1, 4, 23, 40])
def test_online_logsumexp_any_block(block, rng):
    """Any block size (dividing n or not, larger than n) gives the same log-sum-exp."""
    x = rng.standard_normal((2, 4, 23)) * 10
    x[0, 1] = -np.inf  # fully masked row
    x[1, 2, ::3] = -np.inf
    got = online_logsumexp(jnp.asarray(x), block)
    np.testing.assert_allclose(to_np(got), lse_spec(x), rtol=1e-12, atol=1e-12)


@given(hnp.arrays(np.float64, (2, 12), elements=row_values))
def test_online_update_streams_blocks(x):
    """Three updates from (m, l) = (-inf, 0) give m = max x and m + log l = log-sum-exp."""
    m = jnp.full((2,), -jnp.inf)
    l = jnp.zeros(2)
    for t in range(3):
        m, l = online_softmax_update(m, l, jnp.asarray(x[:, 4 * t : 4 * t + 4]))
    np.testing.assert_allclose(to_np(m), x.max(axis=-1), rtol=0, atol=0)
    np.testing.assert_allclose(to_np(m + jnp.log(l)), lse_spec(x), rtol=1e-12)


def test_online_update_all_masked_block_is_exact():
    """An all -inf block leaves (m, l) unchanged: (-inf, 0) stays, no NaN appears."""
    m0, l0 = jnp.array([-jnp.inf, 1.5]), jnp.array([0.0, 2.0])
    m, l = online_softmax_update(m0, l0, jnp.full((2, 3), -jnp.inf))
    assert np.array_equal(to_np(m), to_np(m0))
    assert np.array_equal(to_np(l), to_np(l0))
    m, l = online_softmax_update(m, l, jnp.array([[-jnp.inf, 0.0, 1.0], [-jnp.inf] * 3]))
    np.testing.assert_allclose(to_np(m), [1.0, 1.5])
    np.testing.assert_allclose(to_np(l), [np.exp(-1.0) + 1.0, 2.0])


def test_online_logsumexp_gradient_is_softmax(rng):
    """d logsumexp / dx^j = softmax^j (autodiff through the loop), 0 for -inf entries."""
    x = rng.standard_normal((2, 11))
    x[1, ::2] = -np.inf
    g = jax.grad(lambda x: jnp.sum(online_logsumexp(x, 4)))(jnp.asarray(x))
    e = np.where(np.isfinite(x), np.exp(x - np.max(x, axis=-1, keepdims=True)), 0.0)
    np.testing.assert_allclose(to_np(g), e / e.sum(-1, keepdims=True), atol=1e-12)


def test_online_update_shape_error():
    with pytest.raises(AttentionInputError, match="shape of x_new"):
        online_softmax_update(jnp.zeros(3), jnp.zeros(3), jnp.zeros((2, 4)))


# -- flash attention: forward --------------------------------------------------------

# (name, batch Q, batch K/V, n_q, n_k, padding mask?, causal, T): sizes are not
# multiples of the blocks (8 x 16) and one batch element has every key padded.
CASES = [
    ("plain", (), (), 13, 29, False, False, 1.0),
    ("causal", (), (), 29, 29, False, True, 1.0),
    ("causal-wide", (), (), 13, 45, False, True, 1.0),
    ("batch-heads-padding-T", (2, 3), (3,), 21, 37, True, False, 0.6),
    ("causal-padding-rect", (2, 1), (2, 1), 37, 21, True, True, 1.7),
]
# gradients and MLX: the two cases that combine every feature
FULL_CASES = CASES[2:]


def _case(rng, batch_q, batch_k, n_q, n_k, padding):
    Q = rng.standard_normal(batch_q + (n_q, 6))
    K = rng.standard_normal(batch_k + (n_k, 6))
    V = rng.standard_normal(batch_k + (n_k, 3))
    pad = None
    if padding:
        pad = rng.random((2, 1, n_k)) > 0.3
        pad[0, 0, :] = False  # a fully masked batch element
        pad[1, 0, 0] = False  # with causal: query 0 of element 1 sees nothing
    return Q, K, V, pad


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_flash_forward_matches_reference(case, rng):
    """O and L equal the reference O and log Z (float64), masked rows give 0 and -inf."""
    _, bq_shape, bk_shape, n_q, n_k, padding, causal, T = case
    Q, K, V, pad = _case(rng, bq_shape, bk_shape, n_q, n_k, padding)
    ref = attention_decomposition(Q, K, V, full_mask(pad, n_q, n_k, causal), T)
    O, L = flash_attention(
        Q, K, V, pad, causal=causal, T=T, block_q=8, block_k=16, return_lse=True
    )
    assert_close(O, ref.O)
    want_L = to_np(ref.log_Z)
    assert np.array_equal(np.isneginf(to_np(L)), np.isneginf(want_L))
    finite = np.isfinite(want_L)
    np.testing.assert_allclose(to_np(L)[finite], want_L[finite], rtol=1e-12)
    if padding:
        assert np.all(to_np(O)[0] == 0.0)  # fully masked rows: exactly zero


def test_flash_forward_float32(rng):
    """In float32 the tiles agree with the float64 reference to float32 accuracy."""
    Q, K, V = random_qkv(rng, batch=(2,), n_q=50, n_k=70, d_k=16, d_v=8)
    want = scaled_dot_product_attention(Q, K, V, full_mask(None, 50, 70, True))
    f32 = [jnp.asarray(x, jnp.float32) for x in (Q, K, V)]
    got = flash_attention(*f32, causal=True, block_q=16, block_k=32)
    assert got.dtype == jnp.float32
    assert_close(got, want, rtol=2e-5, atol=2e-6)


def test_flash_default_blocks_and_jit(rng):
    """Default blocks (larger than n) and an outer jax.jit give the reference output."""
    Q, K, V = random_qkv(rng, n_q=9, n_k=11)
    got = jax.jit(lambda q, k, v: flash_attention(q, k, v, T=2.0))(Q, K, V)
    assert_close(got, scaled_dot_product_attention(Q, K, V, T=2.0))


# -- flash attention: gradients ---------------------------------------------------------


@pytest.mark.parametrize("case", FULL_CASES, ids=[c[0] for c in FULL_CASES])
def test_flash_gradients_match_autodiff(case, rng):
    """jax.grad through the custom VJP equals autodiff of the reference (random dO, dL)."""
    _, bq_shape, bk_shape, n_q, n_k, padding, causal, T = case
    Q, K, V, pad = _case(rng, bq_shape, bk_shape, n_q, n_k, padding)
    mask = full_mask(pad, n_q, n_k, causal)
    ref = attention_decomposition(Q, K, V, mask, T)
    G = rng.standard_normal(ref.O.shape)  # upstream dL/dO
    H = rng.standard_normal(ref.log_Z.shape)  # upstream dL/dL (log-sum-exp)
    H = np.where(np.isfinite(to_np(ref.log_Z)), H, 0.0)

    def loss_flash(Q, K, V, T):
        O, L = flash_attention(
            Q, K, V, pad, causal=causal, T=T, block_q=8, block_k=16, return_lse=True
        )
        L = jnp.where(jnp.isfinite(L), L, 0.0)
        return jnp.sum(O * G) + jnp.sum(L * H)

    def loss_ref(Q, K, V, T):
        parts = attention_decomposition(Q, K, V, mask, T)
        L = jnp.where(jnp.isfinite(parts.log_Z), parts.log_Z, 0.0)
        return jnp.sum(parts.O * G) + jnp.sum(L * H)

    args = (Q, K, V, jnp.asarray(T))
    got = jax.jit(jax.grad(loss_flash, argnums=(0, 1, 2, 3)))(*args)
    want = jax.grad(loss_ref, argnums=(0, 1, 2, 3))(*args)
    for g, w, name in zip(got, want, ["dQ", "dK", "dV", "dT"]):
        assert np.all(np.isfinite(to_np(g))), name
        assert_close(g, w, rtol=1e-9, atol=1e-10)
    if padding:
        assert np.all(to_np(got[0])[0] == 0.0)  # fully masked rows: zero dQ


def test_flash_memory_is_linear():
    """XLA's compiled temporaries of flash (forward + backward) stay far below n^2."""
    n, d = 2048, 32
    s = jax.ShapeDtypeStruct((n, d), jnp.float32)

    def temp_bytes(attn):
        loss = jax.grad(lambda q, k, v: jnp.sum(attn(q, k, v)), argnums=(0, 1, 2))
        return jax.jit(loss).lower(s, s, s).compile().memory_analysis().temp_size_in_bytes

    flash = temp_bytes(lambda q, k, v: flash_attention(q, k, v))
    naive = temp_bytes(lambda q, k, v: scaled_dot_product_attention(q, k, v))
    assert naive >= n * n * 4  # the reference holds at least one n x n float32 matrix
    assert flash < naive / 10


# -- fused kernels -----------------------------------------------------------------------


def test_fast_attention_jax(rng):
    """jax.nn.dot_product_attention with the library's conventions (d_v != d_k, masks, T)."""
    Q, K, V = random_qkv(rng, batch=(2, 3), n_q=7, n_k=9, d_k=5, d_v=3)
    mask = rng.random((2, 1, 7, 9)) > 0.4
    mask[1, 0, 2] = False  # fully masked row -> 0
    want = scaled_dot_product_attention(Q, K, V, mask, T=0.8)
    got = fast_attention(Q, K, V, mask, T=0.8)
    # the kernel's softmax runs in float32 even for float64 input
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert np.all(to_np(got)[1, :, 2] == 0.0)
    G = rng.standard_normal(want.shape)
    g_fast = jax.grad(lambda v: jnp.sum(fast_attention(Q, K, v, mask, 0.8) * G))(V)
    g_ref = jax.grad(lambda v: jnp.sum(scaled_dot_product_attention(Q, K, v, mask, 0.8) * G))(V)
    assert_close(g_fast, g_ref, rtol=1e-5, atol=1e-6)
    Q2, K2, V2 = random_qkv(rng, n_q=4, n_k=6, d_k=3, d_v=5)  # d_v > d_k
    assert_close(fast_attention(Q2, K2, V2), scaled_dot_product_attention(Q2, K2, V2),
                 rtol=1e-5, atol=1e-6)


# -- errors ---------------------------------------------------------------------------


def test_flash_input_errors(rng):
    Q, K, V = random_qkv(rng, n_q=3, n_k=4)
    with pytest.raises(AttentionInputError, match="n_k"):
        flash_attention(Q, K, V, np.ones(5, bool))
    with pytest.raises(AttentionInputError, match="boolean"):
        flash_attention(Q, K, V, np.ones(4))
    with pytest.raises(AttentionInputError, match="d_k"):
        flash_attention(Q, K[:, :2], V)
    with pytest.raises(AttentionInputError, match="temperature"):
        flash_attention(Q, K, V, T=0.0)
    with pytest.raises(AttentionInputError, match="broadcast"):
        fast_attention(Q, K, V, np.ones((3, 5), bool))


# -- MLX -------------------------------------------------------------------------------


@requires_mlx
@pytest.mark.mlx
@pytest.mark.parametrize("case", FULL_CASES, ids=[c[0] for c in FULL_CASES])
def test_flash_mlx_forward_and_gradients(case, rng):
    """MLX flash (Python loops, mx.custom_function) matches the float64 reference."""
    import mlx.core as mx

    _, bq_shape, bk_shape, n_q, n_k, padding, causal, T = case
    Q, K, V, pad = _case(rng, bq_shape, bk_shape, n_q, n_k, padding)
    mask = full_mask(pad, n_q, n_k, causal)
    ref = attention_decomposition(Q, K, V, mask, T)
    G = rng.standard_normal(ref.O.shape)
    want = jax.grad(
        lambda Q, K, V: jnp.sum(scaled_dot_product_attention(Q, K, V, mask, T) * G),
        argnums=(0, 1, 2),
    )(Q, K, V)
    pad_m = None if pad is None else to_backend(pad, "mlx")
    Qm, Km, Vm, Gm = (to_backend(x, "mlx") for x in (Q, K, V, G))

    def run(Q, K, V):
        return flash_attention(Q, K, V, pad_m, causal=causal, T=T, block_q=8, block_k=16)

    assert_close(run(Qm, Km, Vm), ref.O, "mlx")
    got = mx.grad(lambda Q, K, V: mx.sum(run(Q, K, V) * Gm), argnums=(0, 1, 2))(Qm, Km, Vm)
    for g, w in zip(got, want):
        assert_close(g, w, "mlx", rtol=1e-4, atol=1e-5)


def _parity_cases(rng):
    Q, K, V = random_qkv(rng, batch=(2,), n_q=10, n_k=13, d_k=4, d_v=3)
    pad = rng.random((2, 13)) > 0.3
    mask = rng.random((2, 10, 13)) > 0.3
    mask[0, 1] = False
    x = rng.standard_normal((3, 17))
    x[0] = -np.inf
    m0, l0 = rng.standard_normal(3), rng.random(3) + 0.5
    return [
        ("online_softmax_update", online_softmax_update, (m0, l0, x), {}),
        ("online_logsumexp", online_logsumexp, (x,), dict(block=5)),
        ("flash_attention", flash_attention, (Q, K, V, pad),
         dict(causal=True, T=0.9, block_q=4, block_k=8, return_lse=True)),
        ("fast_attention", fast_attention, (Q, K, V, mask, 1.3), {}),
    ]


@requires_mlx
@pytest.mark.mlx
def test_mlx_parity_every_public_function():
    """Every public function of flash.py gives the JAX float64 result on MLX arrays."""
    names = []
    for name, fn, args, kw in _parity_cases(np.random.default_rng(1)):
        want = fn(*args, **kw)
        got = fn(*(to_backend(a, "mlx") for a in args), **kw)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, want):
            assert type(g).__module__.startswith("mlx"), name
            g, w = to_np(g), to_np(w)
            assert np.array_equal(np.isneginf(g), np.isneginf(w)), name
            ok = np.isfinite(w)
            np.testing.assert_allclose(g[ok], w[ok], rtol=2e-5, atol=2e-5, err_msg=name)
        names.append(name)
    assert len(names) == 4


@pytest.mark.parametrize("offset", [0, 5, -3])
def test_flash_causal_offset_matches_causal_mask(offset):
    """causal=True with an explicit offset keeps keys j <= i + offset, as masking.causal_mask."""
    from attn_tensors.masking import causal_mask

    rng = np.random.default_rng(3)
    Q, K, V = (jnp.asarray(rng.standard_normal(s)) for s in [(11, 4), (19, 4), (19, 3)])
    got = flash_attention(Q, K, V, causal=True, offset=offset, block_q=4, block_k=8)
    want = attention_decomposition(Q, K, V, causal_mask(11, 19, offset=offset)).O
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
