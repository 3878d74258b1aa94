"""Loop specs: index notation read literally, as nested Python for-loops.

Each oracle below is the formula of a library function written out as
``for`` loops over its indices, one multiply-add per step (the
Tensor-Puzzles reading).  Leading batch axes are looped over too, after
broadcasting.  The oracles use neither ``einsum`` nor ``@`` nor
``attn_tensors.einsum.loop_einsum``, so they are independent of the
library.  Every library function runs on JAX and on MLX (``xp_name``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from attn_tensors import AttentionInputError
from attn_tensors.attention import (
    attention_decomposition,
    attention_output,
    attention_scores,
    attention_weights,
    kernel_scores,
    low_rank_metric,
    scaled_dot_product_attention,
)
from attn_tensors.bilinear import (
    bilinear_form,
    bilinear_form_batch,
    diagonal_metric,
    learned_metric,
    lower_index,
    quadratic_form,
    raise_index,
)
from conftest import assert_close, random_qkv, to_backend, to_np

BATCHES = [(), (2,), (2, 3)]  # the fixed leading batch shapes
N_Q, N_K, D_K, D_V = 3, 4, 5, 2


# --------------------------------------------------------------------------
# Batch axes: broadcast, then loop over every batch element
# --------------------------------------------------------------------------


def over_batch(core, n_core, *arrays):
    """Apply ``core`` to the core axes of every element of the broadcast batch.

    ``n_core[k]`` is the number of trailing (named) axes of ``arrays[k]``;
    the leading ones broadcast.  ``core`` returns one array or a tuple.
    """
    arrays = [np.asarray(x, dtype=np.float64) for x in arrays]
    batch = np.broadcast_shapes(*(x.shape[: x.ndim - n] for x, n in zip(arrays, n_core)))
    arrays = [
        np.broadcast_to(x, batch + x.shape[x.ndim - n :]) for x, n in zip(arrays, n_core)
    ]
    results = {}
    for idx in np.ndindex(*batch):
        results[idx] = core(*(x[idx] for x in arrays))
    first = results[next(iter(results))]
    if isinstance(first, tuple):
        return tuple(_stack(batch, {k: r[m] for k, r in results.items()}) for m in range(len(first)))
    return _stack(batch, results)


def _stack(batch, results):
    first = np.asarray(results[next(iter(results))])
    out = np.zeros(batch + first.shape)
    for idx, r in results.items():
        out[idx] = r
    return out


# --------------------------------------------------------------------------
# Core loop specs (no batch axes): each is its formula, loop by loop
# --------------------------------------------------------------------------


def loop_lower(v, g):
    """v_a = g_{ab} v^b"""
    d = g.shape[0]
    out = np.zeros(d)
    for a in range(d):
        for b in range(d):
            out[a] += g[a, b] * v[b]
    return out


def loop_bilinear(u, M, v):
    """B = u^a M_{ab} v^b"""
    s = 0.0
    for a in range(M.shape[0]):
        for b in range(M.shape[1]):
            s += u[a] * M[a, b] * v[b]
    return np.asarray(s)


def loop_bilinear_scores(Q, g, K):
    """S^{ij} = Q^{ia} g_{ab} K^{jb}"""
    n_q, n_k = Q.shape[0], K.shape[0]
    S = np.zeros((n_q, n_k))
    for i in range(n_q):
        for j in range(n_k):
            for a in range(g.shape[0]):
                for b in range(g.shape[1]):
                    S[i, j] += Q[i, a] * g[a, b] * K[j, b]
    return S


def loop_scores(Q, K, scale):
    """S^{ij} = scale * Q^{ia} K^{ja}"""
    n_q, n_k, d_k = Q.shape[0], K.shape[0], Q.shape[1]
    S = np.zeros((n_q, n_k))
    for i in range(n_q):
        for j in range(n_k):
            for a in range(d_k):
                S[i, j] += Q[i, a] * K[j, a]
            S[i, j] *= scale
    return S


def loop_learned_metric(W):
    """g_{ab} = W_{ca} W_{cb}"""
    r, d = W.shape
    g = np.zeros((d, d))
    for a in range(d):
        for b in range(d):
            for c in range(r):
                g[a, b] += W[c, a] * W[c, b]
    return g


def loop_diagonal_metric(w):
    """g_{ab} = w_a delta_{ab}"""
    d = w.shape[0]
    g = np.zeros((d, d))
    for a in range(d):
        for b in range(d):
            g[a, b] = w[a] if a == b else 0.0
    return g


def loop_low_rank_metric(W_Q, W_K):
    """M_{de} = W_Q^{da} W_K^{ea} / sqrt(d_k)"""
    d, d_k = W_Q.shape
    M = np.zeros((d, d))
    for dd in range(d):
        for e in range(d):
            for a in range(d_k):
                M[dd, e] += W_Q[dd, a] * W_K[e, a]
            M[dd, e] /= math.sqrt(d_k)
    return M


def loop_project(X, W):
    """Q^{ia} = X^{id} W^{da}"""
    n, d = X.shape
    d_k = W.shape[1]
    out = np.zeros((n, d_k))
    for i in range(n):
        for a in range(d_k):
            for dd in range(d):
                out[i, a] += X[i, dd] * W[dd, a]
    return out


def loop_softmax(S, mask, T):
    """A^{ij} = exp(S^{ij}/T - m^i) / sum_k exp(S^{ik}/T - m^i), log Z^i = m^i + log(...)

    m^i is the largest allowed S^{ij}/T (subtracted before exp).  A row
    with no allowed key gets A = 0 and log Z = -inf.
    """
    n_q, n_k = S.shape
    A = np.zeros((n_q, n_k))
    log_Z = np.zeros(n_q)
    for i in range(n_q):
        allowed = [j for j in range(n_k) if mask[i, j]]
        if not allowed:
            log_Z[i] = -math.inf
            continue
        m = -math.inf
        for j in allowed:
            m = max(m, S[i, j] / T)
        z = 0.0
        for j in allowed:
            z += math.exp(S[i, j] / T - m)
        for j in allowed:
            A[i, j] = math.exp(S[i, j] / T - m) / z
        log_Z[i] = m + math.log(z)
    return A, log_Z


def loop_output(A, V):
    """O^{ib} = A^{ij} V^{jb}"""
    n_q, n_k = A.shape
    d_v = V.shape[1]
    O = np.zeros((n_q, d_v))
    for i in range(n_q):
        for b in range(d_v):
            for j in range(n_k):
                O[i, b] += A[i, j] * V[j, b]
    return O


def loop_attention(Q, K, V, mask, g, T, scale):
    """S, A, log Z, O of one attention call, every step a loop spec."""
    S = loop_scores(Q, K, scale) if g is None else loop_bilinear_scores(Q, g, K)
    A, log_Z = loop_softmax(S, mask, T)
    return S, A, log_Z, loop_output(A, V)


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------


def spd_metric(rng, d, batch=()):
    """A well-conditioned symmetric positive-definite g_{ab} (W^T W / d + I)."""
    W = rng.standard_normal(batch + (d, d))
    return np.swapaxes(W, -1, -2) @ W / d + np.eye(d)


def as_backend(xp_name, *arrays):
    """The arrays on the backend, and the values that backend actually holds."""
    xs = [to_backend(x, xp_name) for x in arrays]
    return xs, [to_np(x) for x in xs]


def a_mask(rng, batch=()):
    """A 'may attend' mask with one fully masked query row (row 1)."""
    mask = rng.random(batch + (N_Q, N_K)) < 0.6
    mask[..., 0, 0] = True
    mask[..., 1, :] = False
    return mask


# --------------------------------------------------------------------------
# Part I: metrics, index gymnastics and bilinear forms
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "v_batch, g_batch", [((), ()), ((2,), ()), ((2, 3), ()), ((), (2,)), ((2, 3), (3,))]
)
def test_lower_index(v_batch, g_batch, xp_name, rng):
    """lower_index is v_a = g_{ab} v^b, loop by loop, for batched v and g."""
    (v, g), (v_np, g_np) = as_backend(
        xp_name, rng.standard_normal(v_batch + (D_K,)), spd_metric(rng, D_K, g_batch)
    )
    want = over_batch(loop_lower, (1, 2), v_np, g_np)
    assert_close(lower_index(v, g), want, xp_name)


@pytest.mark.parametrize("batch", BATCHES)
def test_raise_index_solves_g_v_equals_u(batch, xp_name, rng):
    """raise_index returns v with g_{ab} v^b = u_a (checked by the loop spec of g v)."""
    (u, g), (u_np, g_np) = as_backend(
        xp_name, rng.standard_normal(batch + (D_K,)), spd_metric(rng, D_K, batch)
    )
    v = raise_index(u, g)
    assert tuple(v.shape) == batch + (D_K,)
    assert_close(over_batch(loop_lower, (1, 2), to_np(v), g_np), u_np, xp_name)
    # and lowering v with the library's own lower_index gives u back
    assert_close(lower_index(v, g), u_np, xp_name)


def test_raise_index_broadcasts_one_metric(xp_name, rng):
    """One metric g serves a batch of covectors u (g broadcasts)."""
    (u, g), (u_np, g_np) = as_backend(
        xp_name, rng.standard_normal((2, 3, D_K)), spd_metric(rng, D_K)
    )
    v = raise_index(u, g)
    assert_close(over_batch(loop_lower, (1, 2), to_np(v), g_np), u_np, xp_name)


@pytest.mark.parametrize("batch", BATCHES)
def test_bilinear_form(batch, xp_name, rng):
    """bilinear_form is u^a M_{ab} v^b with a non-square M, one number per batch element."""
    (u, v, M), (u_np, v_np, M_np) = as_backend(
        xp_name,
        rng.standard_normal(batch + (D_K,)),
        rng.standard_normal(batch + (D_V + 1,)),
        rng.standard_normal((D_K, D_V + 1)),
    )
    got = bilinear_form(u, v, M)
    assert tuple(got.shape) == batch
    assert_close(got, over_batch(loop_bilinear, (1, 2, 1), u_np, M_np, v_np), xp_name)


@pytest.mark.parametrize("batch", BATCHES)
def test_quadratic_form(batch, xp_name, rng):
    """quadratic_form is v^a M_{ab} v^b (M not symmetric: only its symmetric part counts)."""
    (v, M), (v_np, M_np) = as_backend(
        xp_name, rng.standard_normal(batch + (D_K,)), rng.standard_normal((D_K, D_K))
    )
    want = over_batch(loop_bilinear, (1, 2, 1), v_np, M_np, v_np)
    assert_close(quadratic_form(v, M), want, xp_name)
    M_sym = (M_np + M_np.T) / 2
    assert_close(quadratic_form(v, M), over_batch(loop_bilinear, (1, 2, 1), v_np, M_sym, v_np), xp_name)


@pytest.mark.parametrize("batch", BATCHES)
def test_bilinear_form_batch(batch, xp_name, rng):
    """bilinear_form_batch is S^{ij} = Q^{ia} g_{ab} K^{jb} with a non-symmetric g."""
    Q, K, _ = random_qkv(rng, batch, N_Q, N_K, D_K, D_V)
    (Q, K, g), (Q_np, K_np, g_np) = as_backend(xp_name, Q, K, rng.standard_normal((D_K, D_K)))
    want = over_batch(loop_bilinear_scores, (2, 2, 2), Q_np, g_np, K_np)
    assert_close(bilinear_form_batch(Q, K, g), want, xp_name)


@pytest.mark.parametrize("r", [2, 6])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_learned_metric(r, batch, xp_name, rng):
    """learned_metric is g_{ab} = W_{ca} W_{cb} (fewer or more rows than columns)."""
    (W,), (W_np,) = as_backend(xp_name, rng.standard_normal(batch + (r, 4)))
    assert_close(learned_metric(W), over_batch(loop_learned_metric, (2,), W_np), xp_name)


@pytest.mark.parametrize("batch", [(), (2,)])
def test_diagonal_metric(batch, xp_name, rng):
    """diagonal_metric is g_{ab} = w_a delta_{ab}."""
    (w,), (w_np,) = as_backend(xp_name, rng.random(batch + (D_K,)) + 0.5)
    assert_close(diagonal_metric(w), over_batch(loop_diagonal_metric, (1,), w_np), xp_name)


# --------------------------------------------------------------------------
# Part II: scores, weights, output
# --------------------------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("scale", [None, 1.0, 0.3])
def test_attention_scores_without_metric(batch, scale, xp_name, rng):
    """attention_scores is S^{ij} = Q^{ia} K^{ja} / sqrt(d_k) (or times the given scale)."""
    Q, K, _ = random_qkv(rng, batch, N_Q, N_K, D_K, D_V)
    (Q, K), (Q_np, K_np) = as_backend(xp_name, Q, K)
    s = 1.0 / math.sqrt(D_K) if scale is None else scale
    want = over_batch(lambda q, k: loop_scores(q, k, s), (2, 2), Q_np, K_np)
    assert_close(attention_scores(Q, K, scale=scale), want, xp_name)


@pytest.mark.parametrize("batch", BATCHES)
def test_attention_scores_with_metric(batch, xp_name, rng):
    """With a metric g, attention_scores is Q^{ia} g_{ab} K^{jb} (no extra scale)."""
    Q, K, _ = random_qkv(rng, batch, N_Q, N_K, D_K, D_V)
    (Q, K, g), (Q_np, K_np, g_np) = as_backend(xp_name, Q, K, rng.standard_normal((D_K, D_K)))
    want = over_batch(loop_bilinear_scores, (2, 2, 2), Q_np, g_np, K_np)
    assert_close(attention_scores(Q, K, g), want, xp_name)


@pytest.mark.parametrize("batch", [(2,), (2, 3)])
@pytest.mark.parametrize("with_metric", [False, True])
def test_attention_scores_batch_free_keys(batch, with_metric, xp_name, rng):
    """A K without batch axes broadcasts against batched Q: the same keys for every batch element."""
    Q, K, _ = random_qkv(rng, batch, N_Q, N_K, D_K, D_V)
    K = K[(0,) * len(batch)]  # shape (n_k, d_k)
    (Q, K, g), (Q_np, K_np, g_np) = as_backend(xp_name, Q, K, spd_metric(rng, D_K))
    if with_metric:
        got = attention_scores(Q, K, g)
        want = over_batch(loop_bilinear_scores, (2, 2, 2), Q_np, g_np, K_np)
    else:
        got = attention_scores(Q, K)
        want = over_batch(lambda q, k: loop_scores(q, k, 1 / math.sqrt(D_K)), (2, 2), Q_np, K_np)
    assert tuple(got.shape) == batch + (N_Q, N_K)
    assert_close(got, want, xp_name)


@pytest.mark.parametrize("d, d_k", [(6, 2), (4, 4)])
def test_low_rank_metric_and_kernel_scores(d, d_k, xp_name, rng):
    """x^{id} M_{de} x^{je} = (x W_Q)^{ia} (x W_K)^{ja} / sqrt(d_k), with M = W_Q W_K^T / sqrt(d_k).

    The close reading's identity: the scores of self-attention are one
    bilinear form on the model space, of rank at most d_k.
    """
    (X, W_Q, W_K), (X_np, WQ_np, WK_np) = as_backend(
        xp_name,
        rng.standard_normal((N_Q, d)),
        rng.standard_normal((d, d_k)),
        rng.standard_normal((d, d_k)),
    )
    M = low_rank_metric(W_Q, W_K)
    assert_close(M, loop_low_rank_metric(WQ_np, WK_np), xp_name)
    Q_np, K_np = loop_project(X_np, WQ_np), loop_project(X_np, WK_np)
    want = loop_scores(Q_np, K_np, 1 / math.sqrt(d_k))
    assert_close(kernel_scores(X, M), want, xp_name)
    # and the library's own scores of the projected queries and keys agree
    assert_close(attention_scores(to_backend(Q_np, xp_name), to_backend(K_np, xp_name)), want, xp_name)
    # the rank of M is at most d_k
    assert np.linalg.matrix_rank(to_np(M), tol=1e-4) <= d_k


def test_kernel_scores_with_two_inputs(xp_name, rng):
    """kernel_scores(X, M, Y) is X^{id} M_{de} Y^{je}, with the order of M's indices kept."""
    (X, M, Y), (X_np, M_np, Y_np) = as_backend(
        xp_name,
        rng.standard_normal((2, N_Q, 4)),
        rng.standard_normal((4, 4)),
        rng.standard_normal((2, N_K, 4)),
    )
    want = over_batch(loop_bilinear_scores, (2, 2, 2), X_np, M_np, Y_np)
    assert_close(kernel_scores(X, M, Y), want, xp_name)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("T", [1.0, 0.5, 3.0])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_weights(batch, T, masked, xp_name, rng):
    """attention_weights is the softmax loop with the row maximum subtracted first."""
    (S,), (S_np,) = as_backend(xp_name, 3 * rng.standard_normal(batch + (N_Q, N_K)))
    mask_np = a_mask(rng) if masked else np.ones((N_Q, N_K), dtype=bool)
    mask = to_backend(mask_np, xp_name) if masked else None
    got = attention_weights(S, mask, T)
    A_want, _ = over_batch(lambda s: loop_softmax(s, mask_np, T), (2,), S_np)
    assert_close(got, A_want, xp_name)


@pytest.mark.parametrize("batch", BATCHES)
def test_attention_output(batch, xp_name, rng):
    """attention_output is O^{ib} = A^{ij} V^{jb}."""
    _, _, V = random_qkv(rng, batch, N_Q, N_K, D_K, D_V)
    A = rng.random(batch + (N_Q, N_K))
    A /= A.sum(-1, keepdims=True)
    (A, V), (A_np, V_np) = as_backend(xp_name, A, V)
    assert_close(attention_output(A, V), over_batch(loop_output, (2, 2), A_np, V_np), xp_name)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("T", [1.0, 0.7])
@pytest.mark.parametrize("with_metric", [False, True])
def test_scaled_dot_product_attention(batch, T, with_metric, xp_name, rng):
    """The whole call, with a mask (one fully masked row) and a temperature, equals the loops."""
    Q, K, V = random_qkv(rng, batch, N_Q, N_K, D_K, D_V)
    mask_np = a_mask(rng, batch)
    (Q, K, V, mask, g), (Q_np, K_np, V_np, _, g_np) = as_backend(
        xp_name, Q, K, V, mask_np, spd_metric(rng, D_K) / math.sqrt(D_K)
    )
    g, g_np = (g, g_np) if with_metric else (None, None)
    got = scaled_dot_product_attention(Q, K, V, mask, T, g)
    s = 1 / math.sqrt(D_K)
    if with_metric:
        want = over_batch(
            lambda q, k, v, m, gg: loop_attention(q, k, v, m, gg, T, s)[3],
            (2, 2, 2, 2, 2), Q_np, K_np, V_np, mask_np, g_np,
        )
    else:
        want = over_batch(
            lambda q, k, v, m: loop_attention(q, k, v, m, None, T, s)[3],
            (2, 2, 2, 2), Q_np, K_np, V_np, mask_np,
        )
    assert_close(got, want, xp_name)
    assert np.all(to_np(got)[..., 1, :] == 0.0)  # the fully masked query outputs 0


@pytest.mark.parametrize("batch", BATCHES)
def test_scaled_dot_product_attention_batch_free_keys(batch, xp_name, rng):
    """K and V without batch axes serve every batch element of Q."""
    Q, _, _ = random_qkv(rng, batch, N_Q, N_K, D_K, D_V)
    _, K, V = random_qkv(rng, (), N_Q, N_K, D_K, D_V)
    (Q, K, V), (Q_np, K_np, V_np) = as_backend(xp_name, Q, K, V)
    ones = np.ones((N_Q, N_K), dtype=bool)
    want = over_batch(
        lambda q, k, v: loop_attention(q, k, v, ones, None, 1.0, 1 / math.sqrt(D_K))[3],
        (2, 2, 2), Q_np, K_np, V_np,
    )
    got = scaled_dot_product_attention(Q, K, V)
    assert tuple(got.shape) == batch + (N_Q, D_V)
    assert_close(got, want, xp_name)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("T", [1.0, 2.5])
@pytest.mark.parametrize("with_metric", [False, True])
def test_attention_decomposition_every_field(batch, T, with_metric, xp_name, rng):
    """S, A, log Z and O of attention_decomposition each equal their loop spec."""
    Q, K, V = random_qkv(rng, batch, N_Q, N_K, D_K, D_V)
    mask_np = a_mask(rng)  # one mask for the whole batch (broadcasts)
    (Q, K, V, mask, g), (Q_np, K_np, V_np, _, g_np) = as_backend(
        xp_name, Q, K, V, mask_np, rng.standard_normal((D_K, D_K)) / math.sqrt(D_K)
    )
    parts = attention_decomposition(Q, K, V, mask, T, g if with_metric else None)
    s = 1 / math.sqrt(D_K)
    gg = g_np if with_metric else None
    want = over_batch(
        lambda q, k, v: loop_attention(q, k, v, mask_np, gg, T, s), (2, 2, 2), Q_np, K_np, V_np
    )
    assert parts._fields == ("S", "A", "log_Z", "O")
    for field, got, ref in zip(parts._fields, parts, want):
        assert tuple(got.shape) == ref.shape, field
        assert_close(got, ref, xp_name)
    log_Z = to_np(parts.log_Z)
    assert np.all(np.isneginf(log_Z[..., 1]))  # the fully masked row
    assert np.all(np.isfinite(log_Z[..., [0, 2]]))


def test_attention_decomposition_scale(xp_name, rng):
    """With scale=1.0 the scores are raw dot products Q^{ia} K^{ja}."""
    Q, K, V = random_qkv(rng, (), N_Q, N_K, D_K, D_V)
    (Q, K, V), (Q_np, K_np, V_np) = as_backend(xp_name, Q, K, V)
    parts = attention_decomposition(Q, K, V, scale=1.0)
    ones = np.ones((N_Q, N_K), dtype=bool)
    want = loop_attention(Q_np, K_np, V_np, ones, None, 1.0, 1.0)
    for got, ref in zip(parts, want):
        assert_close(got, ref, xp_name)


# --------------------------------------------------------------------------
# Input errors found while writing the loop specs (fixed; kept as regressions)
# --------------------------------------------------------------------------


def test_decomposition_rejects_key_without_key_axis(rng):
    Q, K, V = random_qkv(rng)
    with pytest.raises(AttentionInputError, match="K"):
        attention_decomposition(Q, K[0], V)


def test_scores_reject_metric_and_scale_together(rng):
    Q, K, _ = random_qkv(rng)
    with pytest.raises(AttentionInputError):
        attention_scores(Q, K, np.eye(D_K), scale=1.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: bilinear_form(np.ones((2, 5)), np.ones((3, 5)), np.eye(5)),
        lambda: lower_index(np.ones((2, 5)), np.ones((3, 5, 5))),
        lambda: raise_index(np.ones((2, 5)), np.ones((3, 5, 5)) + np.eye(5)),
    ],
    ids=["bilinear_form", "lower_index", "raise_index"],
)
def test_bilinear_batch_clash_is_named(call):
    with pytest.raises(AttentionInputError, match="batch"):
        call()
