"""Part VII: attention variants against loop specs, reductions and properties.

Every score formula has a literal loop-spec twin here (plain Python/NumPy
loops read off the index notation); reductions to standard attention,
rotary shift invariance, the ALiBi closed form, masks, errors, autodiff and
MLX parity follow.  The Match3 experiment is checked on its labels, its
hand-built layer and a short training run.
"""

from __future__ import annotations

import itertools
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
from attn_tensors import variants as va
from attn_tensors.bilinear import check_metric
from conftest import assert_close, random_qkv, requires_mlx, to_backend, to_np


# -- loop specs: the index notation read literally ----------------------------
def loop_softmax(s: list[float], allowed: list[bool] | None = None, T: float = 1.0):
    """Weights over one row: exp(s/T - max) on allowed entries, normalised; zeros if none."""
    allowed = [True] * len(s) if allowed is None else allowed
    alive = [x / T for x, a in zip(s, allowed) if a]
    if not alive:
        return [0.0] * len(s)
    m = max(alive)
    e = [math.exp(x / T - m) if a else 0.0 for x, a in zip(s, allowed)]
    z = sum(e)
    return [w / z for w in e]


def loop_bilinear(Q, K, M):
    """S^{ij} = sum_a sum_b Q^{ia} M_{ab} K^{jb}."""
    n_q, n_k = Q.shape[0], K.shape[0]
    S = np.zeros((n_q, n_k))
    for i in range(n_q):
        for j in range(n_k):
            S[i, j] = sum(
                Q[i, a] * M[a, b] * K[j, b]
                for a in range(M.shape[0])
                for b in range(M.shape[1])
            )
    return S


def loop_relative(Q, K, R, max_distance=None):
    """S^{ij} = sum_a Q^{ia} (K^{ja} + R^{r a}) / sqrt(d), r = (i-j) + (n_k-1) or clipped."""
    n_q, d = Q.shape
    n_k = K.shape[0]
    S = np.zeros((n_q, n_k))
    for i in range(n_q):
        for j in range(n_k):
            if max_distance is None:
                r = (i - j) + (n_k - 1)
            else:
                r = min(max(i - j, -max_distance), max_distance) + max_distance
            S[i, j] = sum(Q[i, a] * (K[j, a] + R[r, a]) for a in range(d)) / math.sqrt(d)
    return S


def loop_attention(S, V, allowed=None, T=1.0):
    """O^{ic} = sum_j A^{ij} V^{jc}, A from loop_softmax row by row."""
    n_q, n_k = S.shape
    O = np.zeros((n_q, V.shape[-1]))
    for i in range(n_q):
        row_allowed = None if allowed is None else list(allowed[i])
        w = loop_softmax(list(S[i]), row_allowed, T)
        for c in range(V.shape[-1]):
            O[i, c] = sum(w[j] * V[j, c] for j in range(n_k))
    return O


def loop_rotate(X, positions, base=10000.0):
    """Rotate pair (2m, 2m+1) of row i by p_i * base^(-2m/d)."""
    n, d = X.shape
    Y = np.zeros_like(X)
    for i in range(n):
        for m in range(d // 2):
            phi = positions[i] * base ** (-2.0 * m / d)
            x0, x1 = X[i, 2 * m], X[i, 2 * m + 1]
            Y[i, 2 * m] = x0 * math.cos(phi) - x1 * math.sin(phi)
            Y[i, 2 * m + 1] = x0 * math.sin(phi) + x1 * math.cos(phi)
    return Y


def loop_trilinear(Q, K1, K2):
    """S^{ijk} = sum_a Q^{ia} K1^{ja} K2^{ka} / sqrt(d)."""
    n_q, d = Q.shape
    S = np.zeros((n_q, K1.shape[0], K2.shape[0]))
    for i, j, k in itertools.product(range(n_q), range(K1.shape[0]), range(K2.shape[0])):
        S[i, j, k] = sum(Q[i, a] * K1[j, a] * K2[k, a] for a in range(d)) / math.sqrt(d)
    return S


def loop_pair_softmax(S, allowed=None, T=1.0):
    """A^{ijk}: one softmax per query over all pairs (j, k) together."""
    n_q, n_j, n_k = S.shape
    A = np.zeros_like(S)
    pairs = list(itertools.product(range(n_j), range(n_k)))
    for i in range(n_q):
        s = [S[i, j, k] for j, k in pairs]
        ok = None if allowed is None else [bool(allowed[i, j, k]) for j, k in pairs]
        for (j, k), w in zip(pairs, loop_softmax(s, ok, T)):
            A[i, j, k] = w
    return A


def loop_pair_output(A, V1, V2):
    """O^{ic} = sum_j sum_k A^{ijk} V1^{jc} V2^{kc}."""
    n_q, n_j, n_k = A.shape
    O = np.zeros((n_q, V1.shape[1]))
    for i in range(n_q):
        for c in range(V1.shape[1]):
            O[i, c] = sum(
                A[i, j, k] * V1[j, c] * V2[k, c] for j in range(n_j) for k in range(n_k)
            )
    return O


def press_slopes(n):
    """Press et al.'s slopes, written from the closed form (not the recursion).

    n = 2^p: m_h = 2^(-8h/n).  Otherwise n0 = 2^floor(log2 n): the n0 slopes
    2^(-8h/n0), then the odd-numbered slopes of 2 n0 heads, 2^(-8(2h-1)/(2 n0)).
    """
    n0 = 2 ** int(math.floor(math.log2(n)))
    first = [2.0 ** (-8.0 * h / n0) for h in range(1, n0 + 1)]
    rest = [2.0 ** (-8.0 * (2 * h - 1) / (2 * n0)) for h in range(1, n - n0 + 1)]
    return first + rest


# -- learned bilinear forms ---------------------------------------------------
def test_learned_bilinear_scores_loop_spec_rectangular_and_batched(rng):
    Q = rng.standard_normal((2, 3, 4))
    K = rng.standard_normal((2, 5, 6))
    M = rng.standard_normal((4, 6))  # rectangular, shared by the batch
    S = va.learned_bilinear_scores(jnp.asarray(Q), jnp.asarray(K), jnp.asarray(M))
    for b in range(2):
        assert_close(S[b], loop_bilinear(Q[b], K[b], M))


def test_asymmetric_metric_gives_lopsided_self_attention(rng):
    """x M x^T is not symmetric for an asymmetric M; the antisymmetric part is the whole gap."""
    x = rng.standard_normal((5, 4))
    M = rng.standard_normal((4, 4))
    S = np.asarray(va.learned_bilinear_scores(jnp.asarray(x), jnp.asarray(x), jnp.asarray(M)))
    assert np.max(np.abs(S - S.T)) > 0.1
    M_sym, M_anti = (np.asarray(t) for t in va.metric_parts(jnp.asarray(M)))
    assert_close(M_sym + M_anti, M)
    assert_close(M_sym, M_sym.T)
    assert_close(M_anti, -M_anti.T)
    # S^{ij} - S^{ji} = 2 x^{ia} M_[ab] x^{jb}
    assert_close(S - S.T, 2 * loop_bilinear(x, x, M_anti))


def test_wtw_metric_gives_symmetric_kernel_scores(rng):
    x = rng.standard_normal((5, 4))
    W = rng.standard_normal((6, 4))
    M = np.asarray(va.symmetric_pd_metric(jnp.asarray(W)))
    assert_close(M, W.T @ W)
    S = np.asarray(va.learned_bilinear_scores(jnp.asarray(x), jnp.asarray(x), jnp.asarray(M)))
    assert_close(S, S.T)
    assert check_metric(jnp.asarray(M)).positive_definite


def test_symmetric_pd_metric_rank_deficient_and_ridge(rng):
    W = rng.standard_normal((2, 4))  # rank 2 < d = 4
    report = check_metric(va.symmetric_pd_metric(jnp.asarray(W)))
    assert not report.positive_definite and report.rank == 2
    M = np.asarray(va.symmetric_pd_metric(jnp.asarray(W), eps=0.5))
    assert_close(M, W.T @ W + 0.5 * np.eye(4))
    assert check_metric(jnp.asarray(M)).positive_definite
    with pytest.raises(AttentionInputError, match="eps"):
        va.symmetric_pd_metric(jnp.asarray(W), eps=-1.0)


def test_bilinear_attention_loop_spec_and_reduction(rng):
    Q, K, V = random_qkv(rng, n_q=3, n_k=4, d_k=3, d_v=2)
    M = rng.standard_normal((3, 3))
    mask = np.array([[True, False, True, True], [False] * 4, [True, True, False, False]])
    O = va.bilinear_attention(*map(jnp.asarray, (Q, K, V, M)), mask=jnp.asarray(mask), T=0.7)
    assert_close(O, loop_attention(loop_bilinear(Q, K, M), V, mask, T=0.7))
    # M = delta / sqrt(d) is scaled dot-product attention
    O_sdpa = at.scaled_dot_product_attention(*map(jnp.asarray, (Q, K, V)))
    O_eye = va.bilinear_attention(*map(jnp.asarray, (Q, K, V, np.eye(3) / math.sqrt(3))))
    assert_close(O_eye, O_sdpa)


# -- relative positions -------------------------------------------------------
@pytest.mark.parametrize("n_q,n_k,D", [(3, 5, None), (5, 3, None), (6, 6, 2), (4, 7, 1)])
def test_relative_position_index_loop_spec(n_q, n_k, D):
    idx = va.relative_position_index(n_q, n_k, max_distance=D)
    assert idx.shape == (n_q, n_k)
    for i in range(n_q):
        for j in range(n_k):
            want = (i - j) + (n_k - 1) if D is None else min(max(i - j, -D), D) + D
            assert idx[i, j] == want
    n_rel = n_q + n_k - 1 if D is None else 2 * D + 1
    assert idx.min() >= 0 and idx.max() <= n_rel - 1
    if D is None:  # every row of R is read by some (i, j): no row is wasted
        assert set(idx.ravel()) == set(range(n_rel))


@pytest.mark.parametrize("n_q,n_k,D", [(3, 5, None), (4, 4, None), (6, 5, 2)])
def test_relative_position_scores_loop_spec(rng, n_q, n_k, D):
    d = 3
    n_rel = n_q + n_k - 1 if D is None else 2 * D + 1
    Q = rng.standard_normal((2, n_q, d))
    K = rng.standard_normal((2, n_k, d))
    R = rng.standard_normal((n_rel, d))  # one table shared by the batch
    S = va.relative_position_scores(*map(jnp.asarray, (Q, K, R)), max_distance=D)
    for b in range(2):
        assert_close(S[b], loop_relative(Q[b], K[b], R, D))


def test_relative_position_scores_per_head_tables(rng):
    """A table per head (leading axis on R) gathers per head."""
    Q = rng.standard_normal((2, 3, 4))
    K = rng.standard_normal((2, 3, 4))
    R = rng.standard_normal((2, 5, 4))
    S = va.relative_position_scores(*map(jnp.asarray, (Q, K, R)))
    for h in range(2):
        assert_close(S[h], loop_relative(Q[h], K[h], R[h]))


def test_relative_position_attention_loop_spec_with_value_table(rng):
    n_q, n_k, d, d_v, D = 4, 5, 3, 2, 2
    Q, K, V = random_qkv(rng, n_q=n_q, n_k=n_k, d_k=d, d_v=d_v)
    R = rng.standard_normal((2 * D + 1, d))
    R_V = rng.standard_normal((2 * D + 1, d_v))
    mask = rng.random((n_q, n_k)) > 0.3
    mask[1] = False  # a fully masked query
    O = va.relative_position_attention(
        *map(jnp.asarray, (Q, K, V, R)), jnp.asarray(mask), 1.3, max_distance=D,
        R_V=jnp.asarray(R_V),
    )
    S = loop_relative(Q, K, R, D)
    want = np.zeros((n_q, d_v))
    for i in range(n_q):
        w = loop_softmax(list(S[i]), list(mask[i]), 1.3)
        for c in range(d_v):
            for j in range(n_k):
                r = min(max(i - j, -D), D) + D
                want[i, c] += w[j] * (V[j, c] + R_V[r, c])
    assert_close(O, want)
    assert np.all(np.asarray(O)[1] == 0)


def test_relative_position_zero_table_is_standard_attention(rng):
    Q, K, V = random_qkv(rng, batch=(2,), n_q=3, n_k=4)
    R = np.zeros((6, Q.shape[-1]))
    O = va.relative_position_attention(*map(jnp.asarray, (Q, K, V, R)))
    assert_close(O, at.scaled_dot_product_attention(*map(jnp.asarray, (Q, K, V))))


def test_relative_position_table_size_error_names_the_sizes(rng):
    Q, K, _ = random_qkv(rng, n_q=3, n_k=4, d_k=2)
    with pytest.raises(AttentionInputError, match=r"R has 5 rows .* n_q \+ n_k - 1 = 6"):
        va.relative_position_scores(jnp.asarray(Q), jnp.asarray(K), jnp.zeros((5, 2)))
    with pytest.raises(AttentionInputError, match=r"2 \* max_distance \+ 1 = 5"):
        va.relative_position_scores(
            jnp.asarray(Q), jnp.asarray(K), jnp.zeros((6, 2)), max_distance=2
        )
    with pytest.raises(AttentionInputError, match=r"R has d_k=3 but Q has d_k=2"):
        va.relative_position_scores(jnp.asarray(Q), jnp.asarray(K), jnp.zeros((6, 3)))
    with pytest.raises(AttentionInputError, match="max_distance"):
        va.relative_position_index(3, 3, max_distance=-1)


# -- rotary ------------------------------------------------------------------
def test_rotary_frequencies_closed_form():
    theta = np.asarray(va.rotary_frequencies(8, base=100.0))
    assert_close(theta, [100.0 ** (-2 * m / 8) for m in range(4)])


@pytest.mark.parametrize("positions", [None, [0.5, -2.0, 7.0, 3.25]])
def test_rotary_embedding_loop_spec(rng, positions):
    X = rng.standard_normal((2, 4, 6))
    Y = va.rotary_embedding(jnp.asarray(X), positions, base=50.0)
    p = list(range(4)) if positions is None else positions
    for b in range(2):
        assert_close(Y[b], loop_rotate(X[b], p, base=50.0))


xs = arrays(np.float64, (4, 6), elements=st.floats(-3, 3, allow_subnormal=False))
ps = arrays(np.float64, (4,), elements=st.floats(-50, 50, allow_subnormal=False))
_rotate = jax.jit(lambda X, p: va.rotary_embedding(X, p))


@given(xs, ps)
def test_rotary_embedding_preserves_norms(X, p):
    """Rotating feature pairs keeps every row's length (and every pair's length)."""
    Y = np.asarray(_rotate(jnp.asarray(X), jnp.asarray(p)))
    np.testing.assert_allclose(np.linalg.norm(Y, axis=-1), np.linalg.norm(X, axis=-1),
                               rtol=1e-10, atol=1e-10)
    pair_norm = lambda Z: np.hypot(Z[:, 0::2], Z[:, 1::2])  # noqa: E731
    np.testing.assert_allclose(pair_norm(Y), pair_norm(X), rtol=1e-10, atol=1e-10)


_rscores = jax.jit(
    lambda Q, K, pq, pk: va.rotary_scores(Q, K, q_positions=pq, k_positions=pk)
)


@given(xs, xs, ps, ps, st.floats(-1000, 1000, allow_subnormal=False))
def test_rotary_scores_depend_only_on_position_differences(Q, K, pq, pk, c):
    """Shifting every query and key position by the same c leaves all scores unchanged."""
    S0 = np.asarray(_rscores(*map(jnp.asarray, (Q, K, pq, pk))))
    S1 = np.asarray(_rscores(*map(jnp.asarray, (Q, K, pq + c, pk + c))))
    np.testing.assert_allclose(S1, S0, rtol=1e-8, atol=1e-8)


def test_rotary_scores_are_a_relative_bilinear_form(rng):
    """S^{ij} = Q^{ia} G_{ab}(p_i - p_j) K^{jb} / sqrt(d) with the block rotation G."""
    Q = rng.standard_normal((3, 4))
    K = rng.standard_normal((5, 4))
    pq, pk = np.array([0.0, 3.0, 7.5]), np.array([1.0, 2.0, -4.0, 0.0, 9.0])
    S = np.asarray(va.rotary_scores(*map(jnp.asarray, (Q, K)), q_positions=pq, k_positions=pk,
                                    base=10.0))
    G_all = np.asarray(va.rotary_form(jnp.asarray(pq[:, None] - pk[None, :]), 4, base=10.0))
    for i in range(3):
        for j in range(5):
            G = G_all[i, j]
            want = sum(Q[i, a] * G[a, b] * K[j, b] for a in range(4) for b in range(4)) / 2.0
            assert_close(S[i, j], want)
            # the scores are the dot product of the rotated rows (the definition)
            qi = loop_rotate(Q[i:i + 1], [pq[i]], base=10.0)[0]
            kj = loop_rotate(K[j:j + 1], [pk[j]], base=10.0)[0]
            assert_close(S[i, j], qi @ kj / 2.0)


def test_rotary_form_is_orthogonal_and_identity_at_zero():
    deltas = jnp.asarray([0.0, 1.0, -3.5])
    G = np.asarray(va.rotary_form(deltas, 6))
    assert G.shape == (3, 6, 6)
    assert_close(G[0], np.eye(6))
    for g in G:
        assert_close(g @ g.T, np.eye(6), atol=1e-12)
    assert np.max(np.abs(G[1] - G[1].T)) > 0.1  # a rotation, not a metric
    assert_close(G[2], np.asarray(va.rotary_form(3.5, 6)).T)  # G(-delta) = G(delta)^T


def test_rotary_attention_loop_spec(rng):
    Q, K, V = random_qkv(rng, n_q=4, n_k=4, d_k=4, d_v=3)
    mask = np.tril(np.ones((4, 4), bool))
    O = va.rotary_attention(*map(jnp.asarray, (Q, K, V)), jnp.asarray(mask), 0.8)
    p = list(range(4))
    S = loop_rotate(Q, p) @ loop_rotate(K, p).T / 2.0
    assert_close(O, loop_attention(S, V, mask, T=0.8))


def test_rotary_errors():
    with pytest.raises(AttentionInputError, match="d must be even"):
        va.rotary_embedding(jnp.ones((3, 5)))
    with pytest.raises(AttentionInputError, match="n=3"):
        va.rotary_embedding(jnp.ones((3, 4)), positions=jnp.arange(4.0))
    with pytest.raises(AttentionInputError, match="base"):
        va.rotary_frequencies(4, base=-1.0)


# -- ALiBi ----------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20])
def test_alibi_slopes_closed_form(n):
    m = np.asarray(va.alibi_slopes(n))
    assert_close(m, press_slopes(n))
    assert len(set(m.tolist())) == n and np.all((m > 0) & (m < 1))


def test_alibi_slopes_paper_values_for_eight_heads():
    """Press et al.: for 8 heads the slopes are 1/2, 1/4, ..., 1/256 (start 2^(-8/n), ratio 2^(-8/n))."""
    assert_close(va.alibi_slopes(8), [2.0 ** -(h + 1) for h in range(8)])
    m16 = np.asarray(va.alibi_slopes(16))
    assert_close(m16[1:] / m16[:-1], np.full(15, 2.0 ** -0.5))


@pytest.mark.parametrize("offset", [None, 0, 1])
def test_alibi_bias_loop_spec(offset):
    """Query i sits at key position p = i + offset (default n_k - n_q, as causal_mask)."""
    n_h, n_q, n_k = 3, 4, 6
    B = np.asarray(va.alibi_bias(n_h, n_q, n_k, offset=offset))
    m = press_slopes(n_h)
    shift = n_k - n_q if offset is None else offset
    for h in range(n_h):
        for i in range(n_q):
            p = i + shift
            for j in range(n_k):
                want = -m[h] * (p - j) if j <= p else -m[h] * (j - p)
                assert B[h, i, j] == pytest.approx(want, rel=1e-14, abs=0)


def test_alibi_attention_loop_spec(rng):
    n_b, n_h, n, d, d_v = 2, 3, 5, 4, 2
    Q = rng.standard_normal((n_b, n_h, n, d))
    K = rng.standard_normal((n_b, n_h, n, d))
    V = rng.standard_normal((n_b, n_h, n, d_v))
    pad = np.ones((n_b, 1, 1, n), bool)
    pad[1, ..., 3:] = False  # the second sequence has 3 real tokens
    O = np.asarray(va.alibi_attention(*map(jnp.asarray, (Q, K, V)), jnp.asarray(pad), 0.9))
    O_free = np.asarray(va.alibi_attention(*map(jnp.asarray, (Q, K, V)), causal=False))
    m = press_slopes(n_h)
    for b in range(n_b):
        for h in range(n_h):
            S = np.array([[Q[b, h, i] @ K[b, h, j] / 2.0 - m[h] * abs(i - j)
                           for j in range(n)] for i in range(n)])
            causal = np.array([[j <= i and pad[b, 0, 0, j] for j in range(n)]
                               for i in range(n)])
            assert_close(O[b, h], loop_attention(S, V[b, h], causal, T=0.9))
            assert_close(O_free[b, h], loop_attention(S, V[b, h]))


def test_alibi_errors(rng):
    Q, K, V = random_qkv(rng, n_q=3, n_k=3)
    with pytest.raises(AttentionInputError, match="at least 3 axes"):
        va.alibi_attention(*map(jnp.asarray, (Q, K, V)))
    with pytest.raises(AttentionInputError, match="n_heads=2 but Q has n_heads=3"):
        va.alibi_attention(jnp.ones((3, 4, 2)), jnp.ones((2, 4, 2)), jnp.ones((2, 4, 1)))
    with pytest.raises(AttentionInputError, match="n_heads"):
        va.alibi_slopes(0)
    with pytest.raises(AttentionInputError, match="boolean"):
        va.alibi_attention(jnp.ones((2, 3, 2)), jnp.ones((2, 3, 2)), jnp.ones((2, 3, 1)),
                           mask=jnp.ones((3, 3)))


# -- third-order (2-simplicial) attention --------------------------------------
def test_trilinear_scores_loop_spec(rng):
    Q = rng.standard_normal((2, 3, 4))
    K1 = rng.standard_normal((2, 4, 4))
    K2 = rng.standard_normal((2, 5, 4))
    S = va.trilinear_scores(*map(jnp.asarray, (Q, K1, K2)))
    assert S.shape == (2, 3, 4, 5)
    for b in range(2):
        assert_close(S[b], loop_trilinear(Q[b], K1[b], K2[b]))


def test_trilinear_scores_are_bilinear_with_a_diagonal_metric_per_key(rng):
    """S^{ijk} = Q^{ia} g^{(k)}_{ab} K1^{jb} with g^{(k)} = diag(K2^k) / sqrt(d)."""
    Q, K1, K2 = (rng.standard_normal((n, 3)) for n in (2, 3, 4))
    S = np.asarray(va.trilinear_scores(*map(jnp.asarray, (Q, K1, K2))))
    for k in range(4):
        g = np.diag(K2[k]) / math.sqrt(3)
        assert_close(S[:, :, k], loop_bilinear(Q, K1, g))


def test_pair_softmax_loop_spec_with_mask(rng):
    S = rng.standard_normal((3, 4, 2)) * 3
    mask = rng.random((3, 4, 2)) > 0.4
    mask[2] = False  # a query that may attend no pair
    A, log_Z = va.pair_softmax_and_log_partition(jnp.asarray(S), jnp.asarray(mask), 0.6)
    assert_close(A, loop_pair_softmax(S, mask, 0.6))
    assert_close(np.asarray(A)[:2].sum(axis=(-1, -2)), [1.0, 1.0])
    for i in range(2):
        want = math.log(sum(math.exp(S[i, j, k] / 0.6) for j in range(4) for k in range(2)
                            if mask[i, j, k]))
        assert_close(log_Z[i], want)
    assert np.asarray(log_Z)[2] == -np.inf
    assert_close(va.pair_softmax(jnp.asarray(S)), loop_pair_softmax(S))


def test_pair_softmax_broadcasts_masks_over_pairs(rng):
    """A mask on j alone (shape (n_j, 1)) forbids every pair containing that j."""
    S = rng.standard_normal((2, 3, 3))
    key_mask = np.array([[True], [False], [True]])
    A = np.asarray(va.pair_softmax(jnp.asarray(S), jnp.asarray(key_mask)))
    full = np.broadcast_to(key_mask, S.shape)
    assert_close(A, loop_pair_softmax(S, full))
    assert np.all(A[:, 1, :] == 0)
    # a batch of masks against one set of scores: the scores broadcast too
    masks = rng.random((3, 2, 3, 3)) > 0.5
    A_b = np.asarray(va.pair_softmax(jnp.asarray(S), jnp.asarray(masks)))
    assert A_b.shape == (3, 2, 3, 3)
    for b in range(3):
        assert_close(A_b[b], loop_pair_softmax(S, masks[b]))


def test_two_simplicial_output_loop_spec(rng):
    A = rng.random((3, 4, 5))
    V1 = rng.standard_normal((4, 2))
    V2 = rng.standard_normal((5, 2))
    assert_close(va.two_simplicial_output(*map(jnp.asarray, (A, V1, V2))),
                 loop_pair_output(A, V1, V2))


def test_two_simplicial_attention_loop_spec(rng):
    Q = rng.standard_normal((2, 3, 4))
    K1, K2 = rng.standard_normal((2, 4, 4)), rng.standard_normal((2, 5, 4))
    V1, V2 = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5, 3))
    mask = rng.random((3, 4, 5)) > 0.3
    parts = va.two_simplicial_decomposition(
        *map(jnp.asarray, (Q, K1, K2, V1, V2)), jnp.asarray(mask), 1.4
    )
    O = va.two_simplicial_attention(*map(jnp.asarray, (Q, K1, K2, V1, V2)), jnp.asarray(mask),
                                    1.4)
    assert_close(O, parts.O)
    for b in range(2):
        S = loop_trilinear(Q[b], K1[b], K2[b])
        A = loop_pair_softmax(S, mask, 1.4)
        assert_close(parts.S[b], S)
        assert_close(parts.A[b], A)
        assert_close(O[b], loop_pair_output(A, V1[b], V2[b]))


@given(st.floats(0.2, 3.0, allow_subnormal=False), st.floats(0.5, 2.0, allow_subnormal=False))
def test_two_simplicial_with_constant_second_key_is_standard_attention(c, T):
    """K2^{ka} = c and V2 = 1: S^{ijk} = c Q.K1^j / sqrt(d) does not depend on k, the pair
    softmax is A^{ij}/n_k with A = softmax_j(c Q.K1 / (sqrt(d) T)), and the output is
    standard attention at temperature T / c."""
    rng = np.random.default_rng(1)
    Q, K1, V1 = random_qkv(rng, n_q=3, n_k=4, d_k=5, d_v=2)
    K2 = np.full((6, 5), c)
    V2 = np.ones((6, 2))
    O = va.two_simplicial_attention(*map(jnp.asarray, (Q, K1, K2, V1, V2)), T=T)
    want = at.scaled_dot_product_attention(*map(jnp.asarray, (Q, K1, V1)), T=T / c)
    assert_close(O, want, rtol=1e-9, atol=1e-11)


def test_two_simplicial_restricted_to_one_second_key_is_standard_attention(rng):
    """Allowing only pairs (j, k0): standard attention with query Q * K2^{k0} and values
    V1 * V2^{k0} (elementwise), i.e. the metric diag(K2^{k0}) / sqrt(d)."""
    Q, K1, V1 = random_qkv(rng, n_q=3, n_k=4, d_k=5, d_v=2)
    K2, V2 = rng.standard_normal((3, 5)), rng.standard_normal((3, 2))
    k0 = 1
    mask = np.zeros((4, 3), bool)
    mask[:, k0] = True
    O = va.two_simplicial_attention(*map(jnp.asarray, (Q, K1, K2, V1, V2)), jnp.asarray(mask))
    want = at.scaled_dot_product_attention(
        jnp.asarray(Q * K2[k0]), jnp.asarray(K1), jnp.asarray(V1 * V2[k0])
    )
    assert_close(O, want)


def test_two_simplicial_errors(rng):
    Q, K1, V1 = (jnp.ones(s) for s in ((3, 4), (5, 4), (5, 2)))
    with pytest.raises(AttentionInputError, match=r"K2 has d_k=3 but Q has d_k=4 \(index a"):
        va.two_simplicial_attention(Q, K1, jnp.ones((6, 3)), V1, jnp.ones((6, 2)))
    with pytest.raises(AttentionInputError, match=r"V2 has n_k=5 but K2 has n_k=6 \(index k"):
        va.two_simplicial_attention(Q, K1, jnp.ones((6, 4)), V1, jnp.ones((5, 2)))
    with pytest.raises(AttentionInputError, match=r"V2 has d_v=3 but V1 has d_v=2 \(index c"):
        va.two_simplicial_attention(Q, K1, jnp.ones((6, 4)), V1, jnp.ones((6, 3)))
    with pytest.raises(AttentionInputError, match=r"pair scores of shape \(3, 5, 6\)"):
        va.two_simplicial_attention(Q, K1, jnp.ones((6, 4)), V1, jnp.ones((6, 2)),
                                    mask=jnp.ones((5, 5), bool))
    with pytest.raises(AttentionInputError, match="temperature"):
        va.two_simplicial_attention(Q, K1, K1, V1, V1, T=0.0)
    with pytest.raises(AttentionInputError, match="NaN"):
        va.trilinear_scores(Q.at[0, 0].set(jnp.nan), K1, K1)
    with pytest.raises(AttentionInputError, match="at least 3 axes"):
        va.pair_softmax(jnp.ones((3, 4)))


# -- every attention variant: masks, autodiff, jit -----------------------------
def _variant_calls(rng):
    """(name, f(arrays dict) -> O, arrays dict) for every attention function."""
    n, d, d_v = 4, 4, 2
    Q, K, V = random_qkv(rng, n_q=n, n_k=n, d_k=d, d_v=d_v)
    H = lambda x: np.stack([x, x[::-1]])  # noqa: E731  two heads
    arrays_ = {
        "Q": Q, "K": K, "V": V, "M": rng.standard_normal((d, d)),
        "R": rng.standard_normal((2 * n - 1, d)), "R_V": rng.standard_normal((2 * n - 1, d_v)),
        "QH": H(Q), "KH": H(K), "VH": H(V),
        "K2": rng.standard_normal((n, d)), "V2": rng.standard_normal((n, d_v)),
    }
    return [
        ("bilinear", lambda a, m: va.bilinear_attention(a["Q"], a["K"], a["V"], a["M"], m),
         (n, n)),
        ("relative", lambda a, m: va.relative_position_attention(
            a["Q"], a["K"], a["V"], a["R"], m, R_V=a["R_V"]), (n, n)),
        ("rotary", lambda a, m: va.rotary_attention(a["Q"], a["K"], a["V"], m), (n, n)),
        ("alibi", lambda a, m: va.alibi_attention(a["QH"], a["KH"], a["VH"], m), (n, n)),
        ("two_simplicial", lambda a, m: va.two_simplicial_attention(
            a["Q"], a["K"], a["K2"], a["V"], a["V2"], m), (n, n, n)),
    ], arrays_


@pytest.mark.parametrize("variant", ["bilinear", "relative", "rotary", "alibi",
                                     "two_simplicial"])
def test_fully_masked_rows_give_zero_output_and_finite_gradients(rng, variant):
    calls, arrays_ = _variant_calls(rng)
    f, mask_shape = {name: (f, s) for name, f, s in calls}[variant]
    mask = np.ones(mask_shape, bool)
    mask[2] = False  # query 2 may attend nothing
    a = {k: jnp.asarray(v) for k, v in arrays_.items()}
    O = np.asarray(f(a, jnp.asarray(mask)))
    assert np.all(np.isfinite(O))
    assert np.all(O[..., 2, :] == 0)

    def loss(a):
        return jnp.sum(f(a, jnp.asarray(mask)) ** 2)

    grads = jax.jit(jax.grad(loss))(a)
    for name, g in grads.items():
        assert np.all(np.isfinite(np.asarray(g))), name
    assert any(np.max(np.abs(np.asarray(g))) > 0 for g in grads.values())


@pytest.mark.parametrize("variant", ["bilinear", "relative", "rotary", "alibi",
                                     "two_simplicial"])
def test_autodiff_matches_finite_differences(rng, variant):
    """d loss / d Q along a random direction: jax.grad against a central difference."""
    calls, arrays_ = _variant_calls(rng)
    f = {name: f for name, f, _ in calls}[variant]
    qname = "QH" if variant == "alibi" else "Q"
    a = {k: jnp.asarray(v) for k, v in arrays_.items()}
    W = rng.standard_normal(np.shape(f(a, None)))

    def loss(q):
        return jnp.sum(f({**a, qname: q}, None) * W)

    q0 = a[qname]
    direction = jnp.asarray(rng.standard_normal(q0.shape))
    g = jax.jit(jax.grad(loss))(q0)
    loss = jax.jit(loss)
    eps = 1e-6
    fd = (loss(q0 + eps * direction) - loss(q0 - eps * direction)) / (2 * eps)
    assert float(jnp.sum(g * direction)) == pytest.approx(float(fd), rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("variant", ["bilinear", "relative", "rotary", "alibi",
                                     "two_simplicial"])
def test_variants_trace_under_jit(rng, variant):
    calls, arrays_ = _variant_calls(rng)
    f = {name: f for name, f, _ in calls}[variant]
    a = {k: jnp.asarray(v) for k, v in arrays_.items()}
    assert_close(jax.jit(lambda a: f(a, None))(a), f(a, None))


# -- MLX parity for every public function ---------------------------------------
def _parity_table(rng):
    n, d, d_v = 3, 4, 2
    x = {
        "Q": rng.standard_normal((2, n, d)), "K": rng.standard_normal((2, n + 1, d)),
        "V": rng.standard_normal((2, n + 1, d_v)), "M": rng.standard_normal((d, d)),
        "W": rng.standard_normal((3, d)), "R": rng.standard_normal((2 * n, d)),
        "R_V": rng.standard_normal((2 * n, d_v)), "Kn": rng.standard_normal((2, n, d)),
        "Vn": rng.standard_normal((2, n, d_v)), "K2": rng.standard_normal((2, n + 2, d)),
        "V2": rng.standard_normal((2, n + 2, d_v)), "S3": rng.standard_normal((2, n, n + 1, n + 2)),
        "A3": rng.random((2, n, n + 1, n + 2)), "p": np.array([0.0, 2.0, 5.0]),
        "delta": np.array([0.0, 1.5]),
        "mask": rng.random((n, n + 1)) > 0.3, "mask3": rng.random((n, n + 1, n + 2)) > 0.3,
    }
    return x, {
        "learned_bilinear_scores": lambda a: va.learned_bilinear_scores(a["Q"], a["K"], a["M"]),
        "symmetric_pd_metric": lambda a: va.symmetric_pd_metric(a["W"], eps=0.1),
        "metric_parts": lambda a: va.metric_parts(a["M"]),
        "bilinear_attention": lambda a: va.bilinear_attention(
            a["Q"], a["K"], a["V"], a["M"], a["mask"], 0.7),
        "relative_position_scores": lambda a: va.relative_position_scores(
            a["Q"], a["K"], a["R"]),
        "relative_position_attention": lambda a: va.relative_position_attention(
            a["Q"], a["K"], a["V"], a["R"], a["mask"], R_V=a["R_V"]),
        "rotary_frequencies": lambda a: va.rotary_frequencies(6, like=a["Q"]),
        "rotary_embedding": lambda a: va.rotary_embedding(a["Q"], a["p"]),
        "rotary_form": lambda a: va.rotary_form(a["delta"], 4),
        "rotary_scores": lambda a: va.rotary_scores(a["Q"], a["Kn"], q_positions=a["p"]),
        "rotary_attention": lambda a: va.rotary_attention(a["Q"], a["Kn"], a["Vn"]),
        "alibi_slopes": lambda a: va.alibi_slopes(6, like=a["Q"]),
        "alibi_bias": lambda a: va.alibi_bias(3, 3, 4, like=a["Q"]),
        "alibi_attention": lambda a: va.alibi_attention(a["Q"], a["Kn"], a["Vn"]),
        "trilinear_scores": lambda a: va.trilinear_scores(a["Q"], a["K"], a["K2"]),
        "pair_softmax_and_log_partition": lambda a: va.pair_softmax_and_log_partition(
            a["S3"], a["mask3"], 0.8),
        "pair_softmax": lambda a: va.pair_softmax(a["S3"]),
        "two_simplicial_output": lambda a: va.two_simplicial_output(a["A3"], a["V"], a["V2"]),
        "two_simplicial_decomposition": lambda a: va.two_simplicial_decomposition(
            a["Q"], a["K"], a["K2"], a["V"], a["V2"], a["mask3"]),
        "two_simplicial_attention": lambda a: va.two_simplicial_attention(
            a["Q"], a["K"], a["K2"], a["V"], a["V2"]),
    }


def test_parity_table_covers_every_array_function():
    """Every public function that takes or returns backend arrays is in the MLX table."""
    _, table = _parity_table(np.random.default_rng(0))
    not_arrays = {"relative_position_index", "TwoSimplicialParts"}  # NumPy index / a type
    assert set(table) == set(va.__all__) - not_arrays


@requires_mlx
@pytest.mark.mlx
@pytest.mark.parametrize("name", sorted(_parity_table(np.random.default_rng(0))[1]))
def test_mlx_parity(name):
    import mlx.core as mx

    x, table = _parity_table(np.random.default_rng(3))
    want = table[name]({k: jnp.asarray(v) for k, v in x.items()})
    got = table[name]({k: to_backend(v, "mlx") for k, v in x.items()})
    want = list(want) if isinstance(want, tuple) else [want]
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert isinstance(g, mx.array)
        gw, ww = to_np(g), to_np(w)
        assert np.array_equal(np.isinf(gw), np.isinf(ww))
        finite = np.isfinite(ww)
        assert_close(gw[finite], ww[finite], "mlx")


@requires_mlx
@pytest.mark.mlx
def test_mlx_float64_and_gradient_two_simplicial(rng):
    """MLX in float64 (CPU) keeps float64 and matches JAX; mx.grad matches jax.grad.

    MLX's float64 ``exp`` is only accurate to about 1e-8 (float32-like), so the
    comparison is at 1e-6, not at float64 round-off.
    """
    import mlx.core as mx

    Q, K1, V1 = random_qkv(rng, n_q=3, n_k=4, d_k=4, d_v=2)
    K2, V2 = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    args = (Q, K1, K2, V1, V2)
    got = va.two_simplicial_attention(*(to_backend(a, "mlx", mx.float64) for a in args))
    assert got.dtype == mx.float64
    want = va.two_simplicial_attention(*map(jnp.asarray, args))
    assert_close(got, want, rtol=1e-6, atol=1e-7)

    g_mx = mx.grad(lambda q: mx.sum(va.two_simplicial_attention(
        q, *(to_backend(a, "mlx") for a in args[1:])) ** 2))(to_backend(Q, "mlx"))
    g_jax = jax.grad(lambda q: jnp.sum(va.two_simplicial_attention(
        q, *map(jnp.asarray, args[1:])) ** 2))(jnp.asarray(Q))
    assert_close(g_mx, g_jax, "mlx")


# -- the Match3 experiment ---------------------------------------------------------
def test_match3_labels_loop_spec():
    from attn_tensors.experiments.match3 import match3_labels

    rng = np.random.default_rng(5)
    M = 11
    x = rng.integers(0, M, (200, 5))
    y = match3_labels(x, M)
    for b in range(200):
        for i in range(5):
            want = any((x[b, i] + x[b, j] + x[b, k]) % M == 0
                       for j in range(5) for k in range(5))
            assert y[b, i] == want


def test_match3_hand_built_two_simplicial_layer_is_exact():
    """The width-16 construction (four harmonics, beta = 10) gets every target right."""
    from attn_tensors.experiments.match3 import best_harmonics, constructed_accuracy, match3_data

    hs, k_max = best_harmonics(29, 4)
    s = np.arange(1, 29)
    assert np.max(np.cos(2 * np.pi * np.outer(s, hs) / 29).sum(1)) == pytest.approx(k_max)
    assert 4 - k_max > 2.5
    x, y = match3_data(500, 6, 29, np.random.default_rng(7))
    assert 0.3 < y.mean() < 0.7
    assert constructed_accuracy(x, y, 29, 16) == 1.0


@pytest.mark.slow
def test_match3_two_simplicial_beats_standard_attention():
    """A short run (600 steps): the 2-simplicial layer is clearly ahead of standard attention."""
    from attn_tensors.experiments.match3 import run_match3

    r = run_match3(steps=600, lr=2e-2, n_train=8000, n_test=1000)
    std, simp = r["standard"]["test_acc"], r["two_simplicial"]["test_acc"]
    assert simp > std + 0.05
    assert simp > r["baseline_acc"] + 0.2
