"""Part VI: multi-head attention against loop specs, single heads and autodiff.

Expected values come from (1) a literal loop spec of the Part VI formulas
written below with Python loops over h, i, j, a, c, d; (2) H separate calls of
the single-head :func:`scaled_dot_product_attention`, concatenated and
multiplied by the stacked W_O; (3) ``jax.grad`` of the forward pass in
float64; (4) closed forms for the head-diversity properties.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attn_tensors import AttentionInputError
from attn_tensors.attention import scaled_dot_product_attention
from attn_tensors.masking import causal_mask, padding_mask
from attn_tensors.multihead import (
    MultiHeadGrads,
    MultiHeadParts,
    head_diversity,
    head_entropy,
    head_similarity_matrix,
    multihead_attention,
    multihead_backward,
    multihead_decomposition,
    project_heads,
)
from attn_tensors.softmax import softmax
from conftest import assert_close, requires_mlx, to_backend, to_np

N_Q, N_K, D, D_K, D_V = 3, 4, 5, 3, 2


# -- the loop spec -------------------------------------------------------------------------
def loop_project(X, W):
    """P^{hia} = sum_d X^{id} W^{hda}, for one sequence X (n, d)."""
    H, d_model, e = W.shape
    P = np.zeros((H, X.shape[0], e))
    for h in range(H):
        for i in range(X.shape[0]):
            for a in range(e):
                for d in range(d_model):
                    P[h, i, a] += X[i, d] * W[h, d, a]
    return P


def loop_multihead(X_q, W_Q, W_K, W_V, W_O, X_kv=None, mask=None, T=1.0):
    """Part VI read as loops; query head h uses key/value head h // (H / H_kv)."""
    X_kv = X_q if X_kv is None else X_kv
    H, H_kv, d_k = W_Q.shape[0], W_K.shape[0], W_Q.shape[2]
    G = H // H_kv
    n_q, n_k = X_q.shape[0], X_kv.shape[0]
    Q, K, V = loop_project(X_q, W_Q), loop_project(X_kv, W_K), loop_project(X_kv, W_V)
    M = np.ones((H, n_q, n_k), bool) if mask is None else np.broadcast_to(mask, (H, n_q, n_k))
    S = np.zeros((H, n_q, n_k))
    A = np.zeros((H, n_q, n_k))
    log_Z = np.full((H, n_q), -np.inf)
    O = np.zeros((H, n_q, V.shape[2]))
    for h in range(H):
        g = h // G
        for i in range(n_q):
            for j in range(n_k):
                for a in range(d_k):
                    S[h, i, j] += Q[h, i, a] * K[g, j, a] / np.sqrt(d_k)
            allowed = [j for j in range(n_k) if M[h, i, j]]
            if allowed:
                top = max(S[h, i, j] / T for j in allowed)
                z = sum(np.exp(S[h, i, j] / T - top) for j in allowed)
                log_Z[h, i] = np.log(z) + top
                for j in allowed:
                    A[h, i, j] = np.exp(S[h, i, j] / T - top) / z
            for c in range(V.shape[2]):
                for j in range(n_k):
                    O[h, i, c] += A[h, i, j] * V[g, j, c]
    Y = np.zeros((n_q, W_O.shape[2]))
    for i in range(n_q):
        for d in range(W_O.shape[2]):
            for h in range(H):
                for c in range(W_O.shape[1]):
                    Y[i, d] += O[h, i, c] * W_O[h, c, d]
    return dict(Q=Q, K=K, V=V, S=S, A=A, log_Z=log_Z, O=O, Y=Y)


def weights(rng, H, H_kv, d=D, d_k=D_K, d_v=D_V, d_kv=None):
    d_kv = d if d_kv is None else d_kv
    return (
        rng.standard_normal((H, d, d_k)),
        rng.standard_normal((H_kv, d_kv, d_k)),
        rng.standard_normal((H_kv, d_kv, d_v)),
        rng.standard_normal((H, d_v, d)),
    )


def check_parts(parts, want):
    for name in MultiHeadParts._fields:
        assert_close(getattr(parts, name), want[name], err_msg=name)


# -- projection and forward pass ------------------------------------------------------------
def test_project_heads_loop_spec(rng):
    """Q^{hia} = X^{id} W^{hda}, with a leading batch axis carried along."""
    X = rng.standard_normal((2, N_Q, D))
    W = rng.standard_normal((3, D, D_K))
    got = project_heads(X, W)
    assert got.shape == (2, 3, N_Q, D_K)
    for b in range(2):
        assert_close(got[b], loop_project(X[b], W))


@pytest.mark.parametrize(
    "H, H_kv, masked", [(4, 4, False), (4, 2, True), (4, 1, True), (1, 1, False)]
)
def test_decomposition_matches_loop_spec(rng, H, H_kv, masked):
    """Every intermediate (Q K V S A log Z O Y) equals the loop spec: MHA, GQA, MQA."""
    X = rng.standard_normal((N_K, D))
    W = weights(rng, H, H_kv)
    mask = np.asarray(causal_mask(N_K)) if masked else None
    parts = multihead_decomposition(X, *W, mask=mask, T=0.7)
    check_parts(parts, loop_multihead(X, *W, mask=mask, T=0.7))
    assert parts.K.shape == (H_kv, N_K, D_K)
    assert_close(multihead_attention(X, *W, mask=mask, T=0.7), parts.Y)


def test_equals_independent_single_heads(rng):
    """H single-head attention calls, concatenated over c and times the stacked W_O."""
    H = 3
    X = rng.standard_normal((N_K, D))
    W_Q, W_K, W_V, W_O = weights(rng, H, H)
    heads = [
        scaled_dot_product_attention(X @ W_Q[h], X @ W_K[h], X @ W_V[h], T=1.3)
        for h in range(H)
    ]
    concat = np.concatenate([to_np(o) for o in heads], axis=-1)  # (n, H d_v)
    want = concat @ W_O.reshape(H * D_V, D)
    assert_close(multihead_attention(X, W_Q, W_K, W_V, W_O, T=1.3), want)


@pytest.mark.parametrize("H, H_kv", [(4, 4), (4, 2), (4, 1)])
def test_gqa_equals_mha_with_repeated_kv(rng, H, H_kv):
    """GQA = MHA whose key/value weights repeat each K/V head G = H / H_kv times."""
    X = rng.standard_normal((2, N_K, D))
    W_Q, W_K, W_V, W_O = weights(rng, H, H_kv)
    G = H // H_kv
    mask = np.asarray(causal_mask(N_K))
    got = multihead_decomposition(X, W_Q, W_K, W_V, W_O, mask=mask, n_kv_heads=H_kv)
    want = multihead_decomposition(
        X, W_Q, np.repeat(W_K, G, axis=0), np.repeat(W_V, G, axis=0), W_O, mask=mask
    )
    for name in ("S", "A", "log_Z", "O", "Y"):
        assert_close(getattr(got, name), getattr(want, name), err_msg=name)


def test_mqa_shares_one_key_value_head(rng):
    """Multi-query: one K/V head; with identical query heads every head attends alike."""
    H = 3
    X = rng.standard_normal((N_K, D))
    W_Q, W_K, W_V, W_O = weights(rng, H, 1)
    parts = multihead_decomposition(X, W_Q, W_K, W_V, W_O)
    assert parts.K.shape == (1, N_K, D_K) and parts.V.shape == (1, N_K, D_V)
    W_Q_same = np.repeat(W_Q[:1], H, axis=0)
    A = multihead_decomposition(X, W_Q_same, W_K, W_V, W_O).A
    for h in range(1, H):
        assert_close(A[h], A[0])
    assert_close(head_diversity(A), 0.0, atol=1e-12)


def test_leading_batch_axes(rng):
    """A batch axis (2,) equals separate calls; cross-attention X_kv broadcasts."""
    W = weights(rng, 4, 2)
    X = rng.standard_normal((2, N_K, D))
    Y = multihead_attention(X, *W, T=0.9)
    assert Y.shape == (2, N_K, D)
    for b in range(2):
        assert_close(Y[b], loop_multihead(X[b], *W, T=0.9)["Y"])
    X_q = rng.standard_normal((2, N_Q, D))
    X_kv = rng.standard_normal((N_K, D))  # shared memory, no batch axis
    Y = multihead_attention(X_q, *W, X_kv=X_kv)
    for b in range(2):
        assert_close(Y[b], loop_multihead(X_q[b], *W, X_kv=X_kv)["Y"])


def test_cross_attention_own_width(rng):
    """X_kv may have its own width d_model', matched by W_K and W_V."""
    W = weights(rng, 2, 2, d_kv=7)
    X_q, X_kv = rng.standard_normal((N_Q, D)), rng.standard_normal((N_K, 7))
    got = multihead_decomposition(X_q, *W, X_kv=X_kv)
    check_parts(got, loop_multihead(X_q, *W, X_kv=X_kv))


def test_batched_padding_mask_broadcasts(rng):
    """A per-sequence padding mask (B, 1, 1, n_k) over an unbatched X gives (B, n, d)."""
    W = weights(rng, 4, 2)
    X = rng.standard_normal((N_K, D))
    lengths = np.array([2, 4, 1])
    mask = np.asarray(padding_mask(lengths, N_K))[:, None]  # (B, 1, 1, n_k): head axis
    Y = multihead_attention(X, *W, mask=mask)
    assert Y.shape == (3, N_K, D)
    for b in range(3):
        assert_close(Y[b], loop_multihead(X, *W, mask=mask[b])["Y"])


def test_per_head_masks_with_groups(rng):
    """A different mask per query head (H, n_q, n_k) is split correctly into GQA groups."""
    H, H_kv = 4, 2
    W = weights(rng, H, H_kv)
    X = rng.standard_normal((N_K, D))
    mask = rng.random((H, N_K, N_K)) < 0.6
    mask[2, 1] = False  # head 2, query 1 sees nothing
    got = multihead_decomposition(X, *W, mask=mask, T=0.8)
    check_parts(got, loop_multihead(X, *W, mask=mask, T=0.8))


# -- masks through multi-head attention -----------------------------------------------------------
def test_masked_keys_get_zero_weight(rng):
    """Padded keys get weight exactly 0 and changing them does not change Y."""
    W = weights(rng, 4, 2)
    X_q, X_kv = rng.standard_normal((2, N_Q, D)), rng.standard_normal((2, N_K, D))
    lengths = np.array([2, 3])
    mask = np.asarray(padding_mask(lengths, N_K))[:, None]
    parts = multihead_decomposition(X_q, *W, X_kv=X_kv, mask=mask)
    A = to_np(parts.A)
    for b, L in enumerate(lengths):
        assert np.all(A[b, ..., L:] == 0.0)
        np.testing.assert_allclose(A[b].sum(-1), 1.0, rtol=1e-12)
    X_kv2 = X_kv.copy()
    X_kv2[0, 2:] += 100.0 * rng.standard_normal((N_K - 2, D))
    X_kv2[1, 3:] -= 50.0
    Y2 = multihead_attention(X_q, *W, X_kv=X_kv2, mask=mask)
    assert_close(Y2, parts.Y)


def test_fully_masked_rows_give_zero_output_no_nan(rng):
    """A query that may attend to nothing: A = 0, O = 0, Y = 0, log Z = -inf, finite grads."""
    W = weights(rng, 4, 2)
    X = rng.standard_normal((N_K, D))
    mask = np.asarray(causal_mask(N_K, offset=-1))  # query 0 sees no key
    parts = multihead_decomposition(X, *W, mask=mask)
    for name in ("A", "O"):
        assert np.all(to_np(getattr(parts, name))[:, 0] == 0.0)
    assert np.all(to_np(parts.Y)[0] == 0.0)
    assert np.all(np.isneginf(to_np(parts.log_Z)[:, 0]))
    for name in ("S", "A", "O", "Y"):
        assert np.isfinite(to_np(getattr(parts, name))).all()
    dY = rng.standard_normal((N_K, D))
    grads = multihead_backward(X, *W, dY, mask)
    auto = autodiff(X, W, dY, mask, 1.0)
    for name, g, w in zip(MultiHeadGrads._fields, grads, auto):
        assert np.isfinite(to_np(g)).all() and np.isfinite(to_np(w)).all(), name
        assert_close(g, w, rtol=1e-9, atol=1e-10, err_msg=name)


# -- gradients -------------------------------------------------------------------------------------
def autodiff(X, W, dY, mask, T, X_kv=None):
    """dL/d(W_Q, W_K, W_V, W_O, X[, X_kv]) of L = sum_id dY^{id} Y^{id}, by jax.grad."""
    dY = jnp.asarray(dY)

    def loss(W_Q, W_K, W_V, W_O, X, X_kv):
        Y = multihead_attention(X, W_Q, W_K, W_V, W_O, X_kv=X_kv, mask=mask, T=T)
        return jnp.sum(jnp.broadcast_to(dY, Y.shape) * Y)

    argnums = (0, 1, 2, 3, 4) + ((5,) if X_kv is not None else ())
    # one compiled program per case is cheaper than eager ops for one-off shapes
    return jax.jit(jax.grad(loss, argnums=argnums))(*W, X, X_kv)


GRAD_CASES = {
    "mha": dict(H=4, H_kv=4, batch=(2,), mask=None, T=1.0),
    "gqa-causal": dict(H=4, H_kv=2, batch=(2,), mask="causal", T=0.6),
    "mqa-padding": dict(H=4, H_kv=1, batch=(2,), mask="padding", T=1.7),
    "broadcast-mask": dict(H=4, H_kv=2, batch=(), mask="padding", T=0.8),
    "per-head-dead-row": dict(H=4, H_kv=2, batch=(), mask="per-head", T=1.0),
}


def make_mask(kind, rng, H):
    if kind is None:
        return None
    if kind == "causal":
        return np.asarray(causal_mask(N_K))
    if kind == "padding":
        return np.asarray(padding_mask([2, 4], N_K))[:, None]  # (2, 1, 1, n_k)
    m = rng.random((H, N_K, N_K)) < 0.6
    m[1, 2] = False
    return m


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_backward_matches_autodiff(rng, case):
    """dL/dW_Q, dL/dW_K, dL/dW_V, dL/dW_O, dL/dX by index notation = jax.grad (float64)."""
    c = GRAD_CASES[case]
    W = weights(rng, c["H"], c["H_kv"])
    X = rng.standard_normal(c["batch"] + (N_K, D))
    mask = make_mask(c["mask"], rng, c["H"])
    Y = multihead_attention(X, *W, mask=mask, T=c["T"])
    dY = rng.standard_normal(Y.shape)
    got = multihead_backward(X, *W, dY, mask, c["T"])
    assert isinstance(got, MultiHeadGrads) and got.dL_dX_kv is None
    want = autodiff(X, W, dY, mask, c["T"])
    for name, w in zip(MultiHeadGrads._fields[:5], want):
        assert getattr(got, name).shape == w.shape, name
        assert_close(getattr(got, name), w, rtol=1e-9, atol=1e-10, err_msg=name)


def test_backward_cross_attention_and_broadcast_upstream(rng):
    """Cross-attention: dL/dX (query path) and dL/dX_kv (key/value paths) = jax.grad;
    an upstream dL/dY without the batch axis broadcasts over it."""
    W = weights(rng, 4, 2, d_kv=6)
    X_q, X_kv = rng.standard_normal((2, N_Q, D)), rng.standard_normal((2, N_K, 6))
    mask = np.asarray(causal_mask(N_Q, N_K))
    dY = rng.standard_normal((N_Q, D))
    got = multihead_backward(X_q, *W, dY, mask, 0.9, X_kv=X_kv)
    want = autodiff(X_q, W, dY, mask, 0.9, X_kv=X_kv)
    for name, w in zip(MultiHeadGrads._fields, want):
        assert_close(getattr(got, name), w, rtol=1e-9, atol=1e-10, err_msg=name)


def test_backward_finite_difference_spot_check(rng):
    """One entry of dL/dW_K and dL/dX against central differences of the loop spec."""
    W = list(weights(rng, 4, 2))
    X = rng.standard_normal((N_K, D))
    mask = np.asarray(causal_mask(N_K))
    dY = rng.standard_normal((N_K, D))
    got = multihead_backward(X, *W, dY, mask, 0.7)

    def L(X, W):
        return float(np.sum(dY * loop_multihead(X, *W, mask=mask, T=0.7)["Y"]))

    eps = 1e-6
    Wp, Wm = [w.copy() for w in W], [w.copy() for w in W]
    Wp[1][1, 2, 0] += eps
    Wm[1][1, 2, 0] -= eps
    fd = (L(X, Wp) - L(X, Wm)) / (2 * eps)
    np.testing.assert_allclose(to_np(got.dL_dW_K)[1, 2, 0], fd, rtol=1e-6, atol=1e-8)
    Xp, Xm = X.copy(), X.copy()
    Xp[2, 3] += eps
    Xm[2, 3] -= eps
    fd = (L(Xp, W) - L(Xm, W)) / (2 * eps)
    np.testing.assert_allclose(to_np(got.dL_dX)[2, 3], fd, rtol=1e-6, atol=1e-8)


def test_jit_matches_eager(rng):
    """multihead_attention traces under jax.jit (shape checks only) and agrees."""
    W = weights(rng, 4, 2)
    X = rng.standard_normal((2, N_K, D))
    mask = np.asarray(causal_mask(N_K))
    f = jax.jit(lambda X: multihead_attention(X, *W, mask=mask, T=0.5))
    assert_close(f(X), multihead_attention(X, *W, mask=mask, T=0.5))


# -- head entropy, similarity, diversity -----------------------------------------------------------
def loop_entropy(A, M=None):
    H, n_q, n_k = A.shape
    M = np.ones_like(A, bool) if M is None else np.broadcast_to(M, A.shape)
    out = np.zeros(H)
    for h in range(H):
        rows = []
        for i in range(n_q):
            if not M[h, i].any():
                continue  # a fully masked query is left out of the mean
            rows.append(-sum(A[h, i, j] * np.log(A[h, i, j]) for j in range(n_k)
                             if M[h, i, j] and A[h, i, j] > 0))
        out[h] = np.mean(rows) if rows else 0.0
    return out


def random_attention(rng, shape, mask=None):
    return to_np(softmax(rng.standard_normal(shape), mask))


def test_head_entropy_loop_spec(rng):
    """H^h = mean over queries of -sum_j A log A; masked queries leave the mean."""
    A = random_attention(rng, (3, 4, 5))
    assert_close(head_entropy(A), loop_entropy(A))
    M = np.asarray(causal_mask(4, 5, offset=-1))  # query 0 fully masked
    A = random_attention(rng, (2, 3, 4, 5), M)
    got = head_entropy(A, M)
    assert got.shape == (2, 3)
    for b in range(2):
        assert_close(got[b], loop_entropy(A[b], M))
    assert_close(head_entropy(A, np.zeros((4, 5), bool)), np.zeros((2, 3)))


def test_head_entropy_exact_at_zero_weights():
    """One-hot heads have entropy exactly 0 and a finite gradient; uniform gives log n_k."""
    A = np.zeros((2, 3, 4))
    A[0, :, 1] = 1.0
    A[1] = 0.25
    got = to_np(head_entropy(A))
    assert got[0] == 0.0
    np.testing.assert_allclose(got[1], np.log(4), rtol=1e-12)
    g = jax.grad(lambda A: jnp.sum(head_entropy(A)))(jnp.asarray(A))
    assert np.isfinite(to_np(g)).all()


def loop_similarity(A):
    H = A.shape[0]
    C = np.zeros((H, H))
    for h in range(H):
        for g in range(H):
            u, v = A[h].ravel(), A[g].ravel()
            nu, nv = np.sqrt(sum(x * x for x in u)), np.sqrt(sum(x * x for x in v))
            C[h, g] = sum(x * y for x, y in zip(u, v)) / (nu * nv) if nu and nv else 0.0
    return C


def test_head_similarity_loop_spec(rng):
    """C^{hg} = cosine of the flattened patterns; a dead (all-zero) head gives 0."""
    A = random_attention(rng, (2, 3, 4, 5))
    C = head_similarity_matrix(A)
    assert C.shape == (2, 3, 3)
    for b in range(2):
        assert_close(C[b], loop_similarity(A[b]))
    A[0, 1] = 0.0
    C = to_np(head_similarity_matrix(A))
    assert np.all(C[0, 1] == 0.0) and np.all(C[0, :, 1] == 0.0)
    assert_close(C[0], loop_similarity(A[0]))


patterns = arrays(np.float64, (3, 4, 6), elements=st.floats(-4, 4, allow_subnormal=False))


@given(S=patterns)
def test_similarity_symmetric_unit_diagonal(S):
    """The similarity matrix is symmetric, 1 on the diagonal, within [0, 1]."""
    C = to_np(head_similarity_matrix(to_np(softmax(S))))
    np.testing.assert_allclose(C, C.T, atol=1e-12)
    np.testing.assert_allclose(np.diag(C), 1.0, rtol=1e-12)
    assert np.all(C >= 0) and np.all(C <= 1 + 1e-12)


@given(S=patterns)
def test_identical_heads_have_zero_diversity(S):
    """Three copies of one pattern: diversity 0; a single head: diversity 0."""
    A = to_np(softmax(S))
    same = np.broadcast_to(A[:1], A.shape)
    assert_close(head_diversity(same), 0.0, atol=1e-12)
    assert_close(head_diversity(A[:1]), 0.0, atol=0)


@given(S=patterns)
def test_disjoint_heads_have_diversity_one(S):
    """Heads attending to disjoint key sets ({0,1}, {2,3}, {4,5}): diversity 1."""
    M = np.zeros((3, 1, 6), bool)
    for h in range(3):
        M[h, 0, 2 * h : 2 * h + 2] = True
    A = to_np(softmax(S, M))
    assert_close(head_diversity(A), 1.0, atol=1e-12)


@given(S=patterns)
def test_diversity_is_one_minus_mean_offdiagonal(S):
    """D = 1 - mean_{h != g} C^{hg}, in [0, 1], against the loop-built similarity."""
    A = to_np(softmax(S))
    C = loop_similarity(A)
    want = 1 - (C.sum() - np.trace(C)) / 6
    assert_close(head_diversity(A), want)
    assert 0 <= float(to_np(head_diversity(A))) <= 1


def test_diversity_batch_and_one_head_shape(rng):
    """Batch axes are kept: (2, H, n_q, n_k) gives (2,), also for H = 1."""
    A = random_attention(rng, (2, 3, 4, 5))
    D_ = head_diversity(A)
    assert D_.shape == (2,)
    assert_close(D_[1], head_diversity(A[1]))
    assert head_diversity(A[:, :1]).shape == (2,)


# -- errors ------------------------------------------------------------------------------------------
def _bad(rng, **change):
    W = dict(zip(("W_Q", "W_K", "W_V", "W_O"), weights(rng, 4, 2)))
    W.update(change)
    return W


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(W_K=(3, D, D_K), W_V=(3, D, D_V)), r"H_kv=3 key/value heads but W_Q has H=4"),
        (dict(W_O=(3, D_V, D)), r"W_O has H=3 but W_Q has H=4 \(index h must match\)"),
        (dict(W_V=(3, D, D_V)), r"W_V has H_kv=3 but W_K has H_kv=2 \(index h must match\)"),
        (dict(W_Q=(4, 6, D_K)), r"W_Q has d_model=6 but X_q has d_model=5 \(index d must match\)"),
        (dict(W_O=(4, D_V, 7)), r"W_O has d_model=7 but X_q has d_model=5 \(index d must match\)"),
        (dict(W_K=(2, D, 4)), r"W_K has d_k=4 but W_Q has d_k=3 \(index a must match\)"),
        (dict(W_O=(4, 3, D)), r"W_O has d_v=3 but W_V has d_v=2 \(index c must match\)"),
        (dict(W_Q=(D, D_K)), r"W_Q must have exactly 3 axes"),
    ],
)
def test_weight_shape_errors(rng, change, match):
    """Wrong head counts or feature sizes name the index and both sizes."""
    W = _bad(rng, **{k: rng.standard_normal(v) for k, v in change.items()})
    X = rng.standard_normal((N_K, D))
    with pytest.raises(AttentionInputError, match=match):
        multihead_attention(X, W["W_Q"], W["W_K"], W["W_V"], W["W_O"])


def test_other_errors(rng):
    """X_kv width, n_kv_heads, masks, temperature, upstream shape, projection, A rank."""
    W = weights(rng, 4, 2)
    X = rng.standard_normal((N_K, D))
    cases = [
        (lambda: multihead_attention(X, *W, X_kv=np.ones((N_K, 4))),
         r"W_K has d_model=5 but X_kv has d_model=4 \(index d must match\)"),
        (lambda: multihead_attention(X, *W, n_kv_heads=4), "n_kv_heads=4 but W_K has H_kv=2"),
        (lambda: multihead_attention(X, *W, mask=np.ones((N_K, N_K))), "must be boolean"),
        (lambda: multihead_attention(X, *W, mask=np.ones((3, N_K, N_K), bool)),
         r"does not broadcast against the multi-head scores.*H=4"),
        (lambda: multihead_attention(X, *W, T=0.0), "temperature"),
        (lambda: multihead_backward(X, *W, np.ones((N_K, 3))),
         r"dL_dY has d_model=3 but Y has d_model=5"),
        (lambda: multihead_backward(X, *W, np.ones((3, N_K, D))), "must broadcast to Y"),
        (lambda: project_heads(X, W[0][:, :4]),
         r"W has d_model=4 but X has d_model=5 \(index d must match\)"),
        (lambda: head_diversity(np.ones((4, 5))), "A must have at least 3 axes"),
    ]
    for call, match in cases:
        with pytest.raises(AttentionInputError, match=match):
            call()


# -- MLX parity -----------------------------------------------------------------------------------
def _mlx_table(rng):
    W = weights(rng, 4, 2)
    X = rng.standard_normal((2, N_K, D))
    mask = np.asarray(causal_mask(N_K, offset=-1))
    dY = rng.standard_normal((2, N_K, D))
    A = random_attention(rng, (2, 3, N_K, N_K), mask)
    return {
        "project_heads": (project_heads, (X, W[0]), {}),
        "multihead_attention": (multihead_attention, (X, *W), dict(mask=mask, T=0.8)),
        "multihead_decomposition": (
            multihead_decomposition, (X, *W), dict(mask=mask, T=0.8)
        ),
        "multihead_backward": (multihead_backward, (X, *W, dY, mask, 0.8), {}),
        "head_entropy": (head_entropy, (A, mask), {}),
        "head_similarity_matrix": (head_similarity_matrix, (A,), {}),
        "head_diversity": (head_diversity, (A,), {}),
    }


MLX_CASES = [
    "project_heads",
    "multihead_attention",
    "multihead_decomposition",
    "multihead_backward",
    "head_entropy",
    "head_similarity_matrix",
    "head_diversity",
]


@requires_mlx
@pytest.mark.mlx
@pytest.mark.parametrize("case", MLX_CASES)
def test_mlx_parity(case):
    """Each public function on MLX float32 arrays agrees with JAX float64."""
    import mlx.core as mx

    fn, args, kw = _mlx_table(np.random.default_rng(3))[case]
    want = fn(*args, **kw)
    m_args = [to_backend(a, "mlx") if isinstance(a, np.ndarray) else a for a in args]
    m_kw = {k: to_backend(v, "mlx") if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    got = fn(*m_args, **m_kw)
    if isinstance(want, tuple):
        for name, g, w in zip(want._fields, got, want):
            if w is None:
                assert g is None
                continue
            assert isinstance(g, mx.array), name
            g_np, w_np = to_np(g), to_np(w)
            np.testing.assert_array_equal(np.isneginf(g_np), np.isneginf(w_np))
            fin = np.isfinite(w_np)
            np.testing.assert_allclose(g_np[fin], w_np[fin], rtol=1e-4, atol=1e-4,
                                       err_msg=name)
    else:
        assert isinstance(got, mx.array)
        assert_close(got, want, "mlx", rtol=1e-4, atol=1e-4)
