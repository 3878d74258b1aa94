"""Part VII masks: every mask against a loop-built twin, operations, errors, MLX.

The expected masks are built here with plain Python loops over (i, j) from the
definitions in words ("query i sits at key position i + offset and sees keys
up to it"), never from the library.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_tensors import AttentionInputError
from attn_tensors.masking import (
    causal_mask,
    combine_masks,
    fully_masked_rows,
    mask_to_bias,
    padding_mask,
    sliding_window_mask,
)
from attn_tensors.softmax import softmax
from conftest import assert_close, requires_mlx, to_backend, to_np


# -- loop specs ------------------------------------------------------------------
def loop_causal(n_q, n_k, offset):
    M = np.zeros((n_q, n_k), dtype=bool)
    for i in range(n_q):
        for j in range(n_k):
            M[i, j] = j <= i + offset
    return M


def loop_window(n_q, n_k, offset, w, causal):
    M = np.zeros((n_q, n_k), dtype=bool)
    for i in range(n_q):
        p = i + offset
        for j in range(n_k):
            M[i, j] = (p - w < j <= p) if causal else abs(p - j) <= w
    return M


def loop_padding(lengths, n_k):
    lengths = np.asarray(lengths)
    M = np.zeros(lengths.shape + (1, n_k), dtype=bool)
    for b in np.ndindex(*lengths.shape):
        for j in range(n_k):
            M[b + (0, j)] = j < lengths[b]
    return M


def is_bool_mask(m, name="jax"):
    if name == "mlx":
        import mlx.core as mx

        return isinstance(m, mx.array) and m.dtype == mx.bool_
    return isinstance(m, jax.Array) and m.dtype == jnp.bool_


# -- causal ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "n_q, n_k, offset, want_offset",
    [
        (4, None, None, 0),  # square: lower triangular
        (2, 5, None, 3),  # decoding block: last query on last key
        (5, 3, None, -2),  # more queries than keys: first two see nothing
        (3, 5, 0, 0),  # explicit offset: top-left alignment
        (3, 4, 1, 1),
    ],
)
def test_causal_mask_matches_loop(n_q, n_k, offset, want_offset):
    """M^{ij} = [j <= i + offset], with offset = n_k - n_q by default."""
    got = causal_mask(n_q, n_k, offset=offset)
    assert is_bool_mask(got)
    want = loop_causal(n_q, n_q if n_k is None else n_k, want_offset)
    np.testing.assert_array_equal(to_np(got), want)


def test_causal_square_is_lower_triangle():
    """The square causal mask is the lower triangle, diagonal included."""
    np.testing.assert_array_equal(to_np(causal_mask(6)), np.tril(np.ones((6, 6), bool)))


def test_causal_default_offset_last_query_sees_all_keys():
    """With the default offset the last query sees every key, the first n_k - n_q + 1."""
    M = to_np(causal_mask(3, 7))
    assert M[-1].all()
    assert M[0].sum() == 7 - 3 + 1


# -- sliding window -----------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_q, n_k", [(6, None), (3, 7), (7, 4)])
@pytest.mark.parametrize("w", [1, 2, 3])
def test_sliding_window_matches_loop(n_q, n_k, w, causal):
    """causal: p - w < j <= p; symmetric: |p - j| <= w, with p = i + n_k - n_q."""
    got = sliding_window_mask(n_q, n_k, window=w, causal=causal)
    nk = n_q if n_k is None else n_k
    np.testing.assert_array_equal(to_np(got), loop_window(n_q, nk, nk - n_q, w, causal))


def test_sliding_window_counts():
    """Away from the start, a causal window w sees w keys and a symmetric one 2w + 1."""
    n, w = 10, 3
    causal = to_np(sliding_window_mask(n, window=w)).sum(-1)
    sym = to_np(sliding_window_mask(n, window=w, causal=False)).sum(-1)
    assert (causal[w - 1 :] == w).all()
    assert (sym[w : n - w] == 2 * w + 1).all()
    np.testing.assert_array_equal(
        to_np(sliding_window_mask(n, window=0, causal=False)), np.eye(n, dtype=bool)
    )


def test_wide_window_equals_causal():
    """A causal window at least as long as the keys is the causal mask."""
    for n_q, n_k in [(5, 5), (2, 6), (6, 3)]:
        np.testing.assert_array_equal(
            to_np(sliding_window_mask(n_q, n_k, window=n_k + n_q)),
            to_np(causal_mask(n_q, n_k)),
        )


@given(
    w=st.integers(1, 8),
    offset=st.integers(-3, 6),
    causal=st.booleans(),
)
def test_sliding_window_property(w, offset, causal):
    """For any window and offset the mask is exactly the window rule read as loops."""
    got = sliding_window_mask(4, 6, window=w, causal=causal, offset=offset)
    np.testing.assert_array_equal(to_np(got), loop_window(4, 6, offset, w, causal))


# -- padding --------------------------------------------------------------------------
def test_padding_from_lengths_matches_loop():
    """M^{bij} = [j < length^b], shaped (..., 1, n_k)."""
    lengths = np.array([[3, 0], [5, 1]])
    got = padding_mask(lengths, 5)
    assert got.shape == (2, 2, 1, 5)
    np.testing.assert_array_equal(to_np(got), loop_padding(lengths, 5))


def test_padding_scalar_and_with_queries():
    """A Python int gives (1, n_k); n_q broadcasts the row over the queries."""
    np.testing.assert_array_equal(to_np(padding_mask(2, 4)), [[True, True, False, False]])
    got = to_np(padding_mask([1, 3], 4, n_q=3))
    assert got.shape == (2, 3, 4)
    for b, L in enumerate([1, 3]):
        for i in range(3):
            np.testing.assert_array_equal(got[b, i], np.arange(4) < L)


def test_padding_from_valid_vector():
    """A boolean key-valid array (any pattern) becomes valid[..., None, :]."""
    valid = np.array([[True, False, True, True], [False, False, False, False]])
    got = padding_mask(valid)
    assert got.shape == (2, 1, 4)
    np.testing.assert_array_equal(to_np(got)[:, 0], valid)
    np.testing.assert_array_equal(to_np(padding_mask(valid, 4, n_q=2))[:, 1], valid)


@given(lengths=st.lists(st.integers(0, 6), min_size=3, max_size=3))
def test_padding_counts(lengths):
    """Each sequence's row allows exactly its length keys, a prefix."""
    M = to_np(padding_mask(np.array(lengths), 6))[:, 0]
    np.testing.assert_array_equal(M.sum(-1), lengths)
    np.testing.assert_array_equal(M, loop_padding(lengths, 6)[:, 0])


def test_padding_inside_jit():
    """Traced lengths work (the range check runs only on concrete values)."""
    f = jax.jit(lambda L: padding_mask(L, 5))
    np.testing.assert_array_equal(to_np(f(jnp.array([2, 4]))), loop_padding([2, 4], 5))


# -- combine, bias, fully masked rows -----------------------------------------------------
def test_combine_masks_and_broadcast():
    """combine = elementwise AND after broadcasting: causal (n, n) and padding (b, 1, n)."""
    C = loop_causal(4, 4, 0)
    P = loop_padding([2, 4, 1], 4)
    got = combine_masks(causal_mask(4), padding_mask([2, 4, 1], 4))
    assert got.shape == (3, 4, 4)
    want = np.zeros((3, 4, 4), bool)
    for b in range(3):
        for i in range(4):
            for j in range(4):
                want[b, i, j] = C[i, j] and P[b, 0, j]
    np.testing.assert_array_equal(to_np(got), want)


def test_combine_window_and_causal_and_none():
    """None means no mask; three masks AND together; nothing at all gives None."""
    W = sliding_window_mask(5, window=2, causal=False)
    got = combine_masks(None, W, causal_mask(5), None)
    # |i - j| <= 2 and j <= i is the causal window of 3 keys
    np.testing.assert_array_equal(to_np(got), loop_window(5, 5, 0, 3, True))
    assert combine_masks() is None
    assert combine_masks(None, None) is None
    np.testing.assert_array_equal(to_np(combine_masks(W)), to_np(W))


def test_mask_to_bias_values():
    """B = 0 where allowed, -inf where not, no NaN (no 0 * inf)."""
    M = loop_causal(3, 4, 1)
    B = to_np(mask_to_bias(M))
    assert not np.isnan(B).any()
    np.testing.assert_array_equal(B[M], 0.0)
    assert np.all(np.isneginf(B[~M]))
    assert mask_to_bias(M).dtype == jnp.float64  # x64 enabled in conftest
    assert mask_to_bias(M, jnp.float32).dtype == jnp.float32


def test_bias_and_boolean_mask_give_same_softmax(rng):
    """softmax(S + B) = softmax(S, mask), fully masked rows included; gradients finite."""
    S = rng.standard_normal((2, 4, 5))
    M = np.asarray(combine_masks(causal_mask(4, 5, offset=-1), padding_mask([3, 5], 5)))
    assert to_np(fully_masked_rows(M)).any()  # the first query sees nothing
    B = mask_to_bias(M)
    assert_close(softmax(jnp.asarray(S) + B), softmax(S, M))
    dS = jax.grad(lambda S: jnp.sum(softmax(S + B) ** 2))(jnp.asarray(S))
    assert np.isfinite(to_np(dS)).all()


def test_fully_masked_rows_matches_loop():
    """F^i = no j allowed; shape drops the key axis."""
    M = loop_causal(5, 3, -2)  # first two queries come before every key
    M3 = np.stack([M, np.ones_like(M), np.zeros_like(M)])
    got = to_np(fully_masked_rows(M3))
    want = np.array([[not M3[b, i].any() for i in range(5)] for b in range(3)])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[0], [True, True, False, False, False])


# -- errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: sliding_window_mask(4, window=-1), "window must be >= 1"),
        (lambda: sliding_window_mask(4, window=-1, causal=False), "window must be >= 0"),
        (lambda: sliding_window_mask(4, window=0), "window must be >= 1; got window=0"),
        (lambda: sliding_window_mask(4, window=1.5), "window must be an integer"),
        (lambda: causal_mask(0), "n_q must be >= 1"),
        (lambda: causal_mask(3, 2.0), "n_k must be an integer"),
        (lambda: causal_mask(3, offset=0.5), "offset must be an integer"),
        (lambda: padding_mask([2, 6], 5), "lengths must lie in 0..n_k=5.*length of 6"),
        (lambda: padding_mask([-1, 2], 5), "length of -1"),
        (lambda: padding_mask([2.0, 3.0], 5), "lengths must be integers"),
        (lambda: padding_mask([2, 3]), "needs n_k"),
        (lambda: padding_mask(np.ones(4, bool), 5), "valid has n_k=4 but n_k=5"),
        (lambda: combine_masks(np.ones((2, 2)), np.ones((2, 2), bool)), "mask 0 must be boolean"),
        (lambda: combine_masks(np.ones((2, 3), bool), np.ones((4, 3), bool)), "do not broadcast"),
        (lambda: mask_to_bias(np.ones((2, 2), np.int32)), "must be boolean"),
        (lambda: fully_masked_rows(np.ones((2, 2))), "must be boolean"),
        (lambda: fully_masked_rows(np.array(True)), "key axis"),
        (lambda: padding_mask(True), "needs a key axis j"),
    ],
)
def test_errors(call, match):
    """Bad sizes, windows, lengths and non-boolean masks raise clear errors."""
    with pytest.raises(AttentionInputError, match=match):
        call()


# -- MLX parity ---------------------------------------------------------------------------
def _mlx_cases(mx):
    lengths = np.array([2, 0, 4])
    valid = np.array([[True, False, True, True], [True, True, False, False]])
    M = loop_causal(4, 4, 0)
    P = loop_padding([2, 4], 4)
    return {
        "causal_mask": (
            lambda: causal_mask(3, 5, like=mx.array(0.0)),
            lambda: causal_mask(3, 5),
        ),
        "sliding_window_mask": (
            lambda: sliding_window_mask(5, 6, window=2, causal=False, like=mx.array(0)),
            lambda: sliding_window_mask(5, 6, window=2, causal=False),
        ),
        "padding_mask(lengths)": (
            lambda: padding_mask(mx.array(lengths), 4, n_q=2),
            lambda: padding_mask(lengths, 4, n_q=2),
        ),
        "padding_mask(like)": (
            lambda: padding_mask([1, 3], 4, like=mx.array(0)),
            lambda: padding_mask([1, 3], 4),
        ),
        "padding_mask(valid)": (
            lambda: padding_mask(mx.array(valid)),
            lambda: padding_mask(valid),
        ),
        "combine_masks": (
            lambda: combine_masks(mx.array(M), mx.array(P)),
            lambda: combine_masks(M, P),
        ),
        "fully_masked_rows": (
            lambda: fully_masked_rows(mx.array(loop_causal(4, 2, -2))),
            lambda: fully_masked_rows(loop_causal(4, 2, -2)),
        ),
    }


@requires_mlx
@pytest.mark.mlx
@pytest.mark.parametrize(
    "case",
    [
        "causal_mask",
        "sliding_window_mask",
        "padding_mask(lengths)",
        "padding_mask(like)",
        "padding_mask(valid)",
        "combine_masks",
        "fully_masked_rows",
    ],
)
def test_mlx_parity(case):
    """Every mask function returns an MLX boolean array equal to the JAX one."""
    import mlx.core as mx

    got_fn, want_fn = _mlx_cases(mx)[case]
    got = got_fn()
    assert is_bool_mask(got, "mlx")
    np.testing.assert_array_equal(np.asarray(got), to_np(want_fn()))


@requires_mlx
@pytest.mark.mlx
def test_mlx_mask_to_bias():
    """mask_to_bias on MLX: float32 by default, float64 on request, same values."""
    import mlx.core as mx

    M = loop_causal(3, 4, 0)
    got = mask_to_bias(mx.array(M))
    assert got.dtype == mx.float32
    np.testing.assert_array_equal(np.asarray(got), to_np(mask_to_bias(M)))
    assert mask_to_bias(mx.array(M), mx.float64).dtype == mx.float64
    S = np.random.default_rng(1).standard_normal((3, 4))
    assert_close(softmax(to_backend(S, "mlx") + got), softmax(S, M), "mlx")
