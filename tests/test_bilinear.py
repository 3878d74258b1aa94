"""Part I: metrics, index gymnastics, bilinear forms, and the metric check."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attn_tensors import AttentionInputError
from attn_tensors import bilinear as bl
from conftest import assert_close, to_backend, to_np

D = 4
vec = arrays(np.float64, (D,), elements=st.floats(-5, 5, allow_subnormal=False))
mat = arrays(np.float64, (D, D), elements=st.floats(-2, 2, allow_subnormal=False))


def random_pd(rng, d=D):
    W = rng.standard_normal((d + 2, d))
    return W.T @ W + 0.1 * np.eye(d)


def test_constructors_closed_forms():
    """Euclidean is the identity; scaled Euclidean is identity / sqrt(d)."""
    np.testing.assert_array_equal(bl.euclidean_metric(3), np.eye(3))
    np.testing.assert_allclose(bl.scaled_euclidean_metric(d=4), np.eye(4) / 2.0)
    np.testing.assert_allclose(bl.diagonal_metric(jnp.array([1.0, 2.0, 3.0])), np.diag([1.0, 2.0, 3.0]))
    M = np.arange(9.0).reshape(3, 3)
    np.testing.assert_allclose(bl.general_metric(jnp.asarray(M)), (M + M.T) / 2)
    with pytest.raises(AttentionInputError, match="d must be >= 1"):
        bl.euclidean_metric(0)


def test_learned_metric_is_W_transpose_W(rng):
    W = rng.standard_normal((2, 3, 5))  # a batch of two (r=3, d=5) factors
    g = bl.learned_metric(jnp.asarray(W))
    np.testing.assert_allclose(g, np.einsum("nca,ncb->nab", W, W), rtol=1e-12)


@given(vec, vec)
def test_bilinear_form_is_linear_in_each_argument(u, v):
    """B(2u + v, w) = 2 B(u, w) + B(v, w) and B(w, 2u + v) = 2 B(w, u) + B(w, v)."""
    M = jnp.asarray(np.arange(16.0).reshape(4, 4) / 7 - 1)
    w = jnp.asarray(np.linspace(-1, 1, 4))
    u, v = jnp.asarray(u), jnp.asarray(v)
    np.testing.assert_allclose(bl.bilinear_form(2 * u + v, w, M), 2 * bl.bilinear_form(u, w, M) + bl.bilinear_form(v, w, M), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(bl.bilinear_form(w, 2 * u + v, M), 2 * bl.bilinear_form(w, u, M) + bl.bilinear_form(w, v, M), rtol=1e-9, atol=1e-9)


@given(vec)
def test_raise_undoes_lower(v):
    """v^a = g^{ab} (g_{bc} v^c): raising a lowered vector gives it back."""
    g = jnp.asarray(random_pd(np.random.default_rng(3)))
    back = bl.raise_index(bl.lower_index(jnp.asarray(v), g), g)
    np.testing.assert_allclose(back, v, rtol=1e-9, atol=1e-9)


def test_inverse_metric(rng):
    """g^{ac} g_{cb} = delta^a_b."""
    g = random_pd(rng)
    np.testing.assert_allclose(bl.inverse_metric(jnp.asarray(g)) @ g, np.eye(D), atol=1e-10)


def test_quadratic_form_is_squared_length_and_uses_symmetric_part(rng):
    """v^a M_{ab} v^b only sees the symmetric part of M."""
    M = rng.standard_normal((D, D))
    v = rng.standard_normal((3, D))
    q = bl.quadratic_form(jnp.asarray(v), jnp.asarray(M))
    q_sym = bl.quadratic_form(jnp.asarray(v), bl.general_metric(jnp.asarray(M)))
    np.testing.assert_allclose(q, q_sym, rtol=1e-12)
    np.testing.assert_allclose(bl.quadratic_form(jnp.asarray(v), jnp.eye(D)), (v**2).sum(-1), rtol=1e-12)


def test_bilinear_form_batch_equals_scaled_dot_product(rng):
    """Q^{ia} (delta_{ab}/sqrt(d)) K^{jb} = Q K^T / sqrt(d)."""
    Q, K = rng.standard_normal((3, D)), rng.standard_normal((5, D))
    S = bl.bilinear_form_batch(jnp.asarray(Q), jnp.asarray(K), bl.scaled_euclidean_metric(D))
    np.testing.assert_allclose(S, Q @ K.T / np.sqrt(D), rtol=1e-12)


def test_check_metric_names_rank_deficient_learned_metric(rng):
    """W^T W with fewer rows than columns is positive SEMI-definite, never called definite."""
    report = bl.check_metric(bl.learned_metric(jnp.asarray(rng.standard_normal((2, 5)))))
    assert not report.positive_definite
    assert report.rank == 2
    assert "positive semi-definite (rank 2 < d=5)" in str(report)
    assert not bl.is_positive_definite(bl.learned_metric(jnp.asarray(rng.standard_normal((2, 5)))))
    # float32 too: rounding must not turn the zero eigenvalues into "definite"
    W32 = jnp.asarray(rng.standard_normal((3, 6)), dtype=jnp.float32)
    assert bl.check_metric(bl.learned_metric(W32)).rank == 3


def test_check_metric_other_kinds(rng):
    assert bl.check_metric(jnp.asarray(random_pd(rng))).kind == "positive definite"
    assert bl.check_metric(jnp.diag(jnp.array([1.0, -1.0, 2.0]))).kind == "indefinite"
    assert bl.check_metric(jnp.array([[1.0, 2.0], [0.0, 1.0]])).kind == "not symmetric"
    with pytest.raises(AttentionInputError, match="one metric"):
        bl.check_metric(jnp.ones((2, 3, 3)))


def test_shape_errors_name_index_and_sizes():
    with pytest.raises(AttentionInputError, match=r"K has d_k=3 but g has columns=4 \(index b must match\)"):
        bl.bilinear_form_batch(jnp.ones((2, 4)), jnp.ones((5, 3)), jnp.eye(4))
    with pytest.raises(AttentionInputError, match=r"v has d=3 but g has d=4 \(index b must match\)"):
        bl.lower_index(jnp.ones(3), jnp.eye(4))
    with pytest.raises(AttentionInputError, match="square"):
        bl.inverse_metric(jnp.ones((2, 3)))
    with pytest.raises(AttentionInputError, match=r"Q must have at least 2 axes \(i, a"):
        bl.bilinear_form_batch(jnp.ones(4), jnp.ones((5, 4)), jnp.eye(4))


PARITY = [
    ("euclidean_metric", lambda xp, a: bl.euclidean_metric(3, like=a["g"])),
    ("scaled_euclidean_metric", lambda xp, a: bl.scaled_euclidean_metric(4, like=a["g"])),
    ("learned_metric", lambda xp, a: bl.learned_metric(a["W"])),
    ("diagonal_metric", lambda xp, a: bl.diagonal_metric(a["w"])),
    ("general_metric", lambda xp, a: bl.general_metric(a["M"])),
    ("inverse_metric", lambda xp, a: bl.inverse_metric(a["g"])),
    ("lower_index", lambda xp, a: bl.lower_index(a["v"], a["g"])),
    ("raise_index", lambda xp, a: bl.raise_index(a["v"], a["g"])),
    ("bilinear_form", lambda xp, a: bl.bilinear_form(a["v"], a["u"], a["M"])),
    ("quadratic_form", lambda xp, a: bl.quadratic_form(a["v"], a["g"])),
    ("bilinear_form_batch", lambda xp, a: bl.bilinear_form_batch(a["Q"], a["K"], a["g"])),
]


@pytest.mark.parametrize("name,call", PARITY, ids=[p[0] for p in PARITY])
def test_mlx_parity(name, call, xp_name):
    """Every public function of bilinear gives the same values on MLX as on JAX float64."""
    rng = np.random.default_rng(7)
    raw = dict(
        g=random_pd(rng),
        W=rng.standard_normal((3, D)),
        w=rng.random(D) + 0.5,
        M=rng.standard_normal((D, D)),
        v=rng.standard_normal((2, D)),
        u=rng.standard_normal((2, D)),
        Q=rng.standard_normal((2, 3, D)),
        K=rng.standard_normal((5, D)),
    )
    got = call(xp_name, {k: to_backend(v, xp_name) for k, v in raw.items()})
    want = call("jax", {k: jnp.asarray(v) for k, v in raw.items()})
    assert_close(got, want, xp_name, rtol=1e-4 if xp_name == "mlx" else 1e-10)
    if xp_name == "mlx":
        assert type(got).__module__.startswith("mlx")


def test_check_metric_on_mlx(xp_name, rng):
    W = to_backend(rng.standard_normal((2, 4)), xp_name)
    assert bl.check_metric(bl.learned_metric(W)).rank == 2
    assert to_np(bl.learned_metric(W)).shape == (4, 4)
