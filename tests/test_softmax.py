"""The masked, stable softmax: properties, numerics and the fully-masked-row convention."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attn_tensors import AttentionInputError
from attn_tensors.softmax import apply_mask, log_partition, softmax, softmax_and_log_partition
from conftest import assert_close, to_backend, to_np

SHAPE = (3, 5)  # the one shape the property tests use: JAX compiles once
# XLA on the CPU flushes subnormal numbers to zero; property tests draw none.
finite = st.floats(-30, 30, allow_nan=False, width=64, allow_subnormal=False)
score_arrays = arrays(np.float64, SHAPE, elements=finite)
mask_arrays = arrays(np.bool_, SHAPE)


def loop_softmax(S, mask=None, T=1.0):
    """Literal loop spec: A^{ij} = exp(S^{ij}/T) / sum_k exp(S^{ik}/T) over allowed k."""
    S = np.asarray(S, dtype=np.float64)
    n_q, n_k = S.shape
    mask = np.ones_like(S, dtype=bool) if mask is None else np.broadcast_to(mask, S.shape)
    A = np.zeros_like(S)
    logZ = np.full(n_q, -np.inf)
    for i in range(n_q):
        allowed = [j for j in range(n_k) if mask[i, j]]
        if not allowed:
            continue
        m = max(S[i, j] / T for j in allowed)
        z = sum(math.exp(S[i, j] / T - m) for j in allowed)
        for j in allowed:
            A[i, j] = math.exp(S[i, j] / T - m) / z
        logZ[i] = m + math.log(z)
    return A, logZ


@given(score_arrays, mask_arrays, st.sampled_from([0.3, 1.0, 4.0]))
def test_matches_loop_spec(S, mask, T):
    """The vectorised softmax equals the literal loop over allowed keys."""
    A, logZ = softmax_and_log_partition(jnp.asarray(S), jnp.asarray(mask), T)
    A_ref, logZ_ref = loop_softmax(S, mask, T)
    np.testing.assert_allclose(A, A_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(np.isinf(logZ), np.isinf(logZ_ref))
    np.testing.assert_allclose(logZ[np.isfinite(logZ_ref)], logZ_ref[np.isfinite(logZ_ref)], rtol=1e-12)


@given(score_arrays, mask_arrays)
def test_rows_sum_to_one_and_masked_keys_get_zero(S, mask):
    """Rows with an allowed key sum to one; masked keys get exactly zero weight."""
    A = np.asarray(softmax(jnp.asarray(S), jnp.asarray(mask)))
    live = mask.any(axis=-1)
    np.testing.assert_allclose(A.sum(-1)[live], 1.0, rtol=1e-12)
    assert np.all(A[~mask] == 0.0)
    assert np.all(A >= 0)


@given(score_arrays, st.floats(-1e3, 1e3, allow_subnormal=False))
def test_shift_invariance(S, c):
    """Adding the same constant to every score of a row leaves the weights unchanged."""
    A1 = softmax(jnp.asarray(S))
    A2 = softmax(jnp.asarray(S + c))
    np.testing.assert_allclose(A1, A2, rtol=1e-9, atol=1e-12)


@given(score_arrays, st.floats(-1e3, 1e3, allow_subnormal=False))
def test_log_partition_shifts_by_the_constant(S, c):
    """log Z(S + c) = log Z(S) + c/T."""
    np.testing.assert_allclose(log_partition(jnp.asarray(S + c), T=2.0), log_partition(jnp.asarray(S), T=2.0) + c / 2.0, rtol=1e-10, atol=1e-9)


def test_extreme_scores_float32_are_finite():
    """Scores of +-1e4 in float32 give finite weights (the max is subtracted first)."""
    S = jnp.array([[1e4, -1e4, 0.0], [1e4, 1e4, -1e4], [-1e4, -1e4, -1e4]], dtype=jnp.float32)
    A, logZ = softmax_and_log_partition(S)
    assert A.dtype == jnp.float32
    assert np.all(np.isfinite(A)) and np.all(np.isfinite(logZ))
    np.testing.assert_allclose(A, [[1, 0, 0], [0.5, 0.5, 0], [1 / 3] * 3], rtol=1e-6)
    np.testing.assert_allclose(logZ[0], 1e4, rtol=1e-7)


def test_fully_masked_row_convention_and_gradient():
    """A query that may attend to nothing: weights 0, log Z = -inf, and no NaN in gradients."""
    S = jnp.array([[0.5, 1.0, -2.0], [3.0, 1.0, 2.0]])
    mask = jnp.array([[True, False, True], [False, False, False]])
    A, logZ = softmax_and_log_partition(S, mask)
    np.testing.assert_array_equal(A[1], 0.0)
    assert logZ[1] == -np.inf
    g = jax.grad(lambda s: jnp.sum(softmax(s, mask) * jnp.arange(3.0)))(S)
    assert np.all(np.isfinite(g)) and np.all(g[1] == 0)
    g2 = jax.grad(lambda s: jnp.sum(jnp.where(jnp.isfinite(log_partition(s, mask)), log_partition(s, mask), 0.0)))(S)
    assert np.all(np.isfinite(g2))
    # the finite row's gradient of log Z is its softmax (d logZ/dS = A)
    np.testing.assert_allclose(g2[0], A[0], rtol=1e-12)


def test_apply_mask():
    """Masked scores become -inf, allowed ones are unchanged."""
    S = jnp.arange(6.0).reshape(2, 3)
    mask = jnp.array([True, False, True])
    out = np.asarray(apply_mask(S, mask))
    assert np.all(out[:, 1] == -np.inf)
    np.testing.assert_array_equal(out[:, [0, 2]], np.asarray(S)[:, [0, 2]])


@pytest.mark.parametrize("T", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_temperature_is_a_clear_error(T):
    with pytest.raises(AttentionInputError, match="temperature T must be positive"):
        softmax(jnp.ones((2, 3)), T=T)


def test_bad_temperature_array_is_a_clear_error():
    with pytest.raises(AttentionInputError, match="zero_temperature_limit"):
        softmax(jnp.ones((2, 3)), T=jnp.array(-0.5))


def test_mask_errors():
    with pytest.raises(AttentionInputError, match="boolean"):
        softmax(jnp.ones((2, 3)), mask=jnp.ones((2, 3)))
    with pytest.raises(AttentionInputError, match="n_k=3"):
        softmax(jnp.ones((2, 3)), mask=jnp.ones((4,), dtype=bool))


def test_jit_and_batch_axes():
    """Works under jit and with leading batch axes (softmax acts on the last axis only)."""
    rng = np.random.default_rng(1)
    S = rng.standard_normal((2, 3, 4, 5))
    A = jax.jit(lambda s: softmax(s, T=0.7))(jnp.asarray(S))
    A_ref = np.stack([np.stack([loop_softmax(S[b, h], T=0.7)[0] for h in range(3)]) for b in range(2)])
    np.testing.assert_allclose(A, A_ref, rtol=1e-12)


def test_float64_is_kept():
    A = softmax(jnp.ones((2, 3), dtype=jnp.float64))
    assert A.dtype == jnp.float64


def test_mlx_matches_jax(xp_name, rng):
    """Same values on both backends, with a mask, a temperature and a fully masked row."""
    S = rng.standard_normal((2, 3, 4)) * 3
    mask = rng.random((2, 3, 4)) > 0.3
    mask[0, 1] = False
    A, logZ = softmax_and_log_partition(to_backend(S, xp_name), to_backend(mask, xp_name), 0.8)
    A_ref, logZ_ref = softmax_and_log_partition(jnp.asarray(S), jnp.asarray(mask), 0.8)
    assert_close(A, A_ref, xp_name)
    lz, lz_ref = to_np(logZ), to_np(logZ_ref)
    np.testing.assert_array_equal(np.isinf(lz), np.isinf(lz_ref))
    assert_close(lz[np.isfinite(lz)], lz_ref[np.isfinite(lz_ref)], xp_name)
    assert_close(apply_mask(to_backend(S, xp_name), to_backend(mask, xp_name)), apply_mask(jnp.asarray(S), jnp.asarray(mask)), xp_name)
