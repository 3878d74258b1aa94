"""Tests for attn_tensors.geometry (Part IV, Differential Geometry).

Oracles: closed forms derived below (polar coordinates, the 2-sphere, flat
space seen in curvilinear coordinates, straight lines as geodesics), NumPy
loop specs, central finite differences in float64, and JAX autodiff of
independently written log-probabilities.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attn_tensors import geometry as G
from attn_tensors._checks import AttentionInputError
from attn_tensors.backend import namespace
from conftest import assert_close, to_backend, to_np

# ---------------------------------------------------------------------------
# Metric fields used throughout.  Each is written once against the array
# namespace of its argument, so the same field runs on NumPy (finite
# differences), JAX and MLX.
# ---------------------------------------------------------------------------


def _ops(x):
    return np if isinstance(x, np.ndarray) else namespace(x)


def _diag2(x, a, b):
    """[[a, 0], [0, b]] from two scalars built from x (traceable)."""
    xp = _ops(x)
    zero = x[0] * 0
    return xp.stack([xp.stack([a, zero]), xp.stack([zero, b])])


def polar_metric(x):
    """Flat R^2 in polar coordinates x = (r, th): g = diag(1, r^2)."""
    return _diag2(x, x[0] * 0 + 1, x[0] ** 2)


def sphere_metric(x):
    """Unit 2-sphere in coordinates x = (th, ph): g = diag(1, sin^2 th)."""
    xp = _ops(x)
    return _diag2(x, x[0] * 0 + 1, xp.sin(x[0]) ** 2)


class SmoothField:
    """g_{ab}(x) = W_{ac}(x) W_{bc}(x) + delta_{ab}/2, W(x) = W0 + W1_{..c} sin(x^c).

    Positive definite everywhere; its constants live in NumPy, JAX or MLX
    according to the backend the field is evaluated on.
    """

    def __init__(self, rng, d=3):
        self.d = d
        self.W0 = rng.standard_normal((d, d)) / 2
        self.W1 = rng.standard_normal((d, d, d)) / 2

    def on(self, name):
        W0 = to_backend(self.W0, name)
        W1 = to_backend(self.W1, name)
        eye = to_backend(np.eye(self.d) / 2, name)

        def metric(x):
            xp = namespace(x)
            W = W0 + xp.einsum("abc,c->ab", W1, xp.sin(x))
            return xp.einsum("ac,bc->ab", W, W) + eye

        return metric

    def numpy(self, x):
        W = self.W0 + np.einsum("abc,c->ab", self.W1, np.sin(x))
        return W @ W.T + np.eye(self.d) / 2


def fd_metric_derivatives(metric, x, h=1e-5):
    """dg[c, a, b] = d_c g_{ab} by central differences (float64 NumPy)."""
    d = x.shape[0]
    out = np.zeros((d, d, d))
    for c in range(d):
        e = np.zeros(d)
        e[c] = h
        out[c] = (metric(x + e) - metric(x - e)) / (2 * h)
    return out


def christoffel_loop_spec(g, dg):
    """Gamma^c_{ab} = 1/2 g^{cd} (d_a g_{bd} + d_b g_{ad} - d_d g_{ab}), as loops."""
    d = g.shape[0]
    ginv = np.linalg.inv(g)
    out = np.zeros((d, d, d))
    for c in range(d):
        for a in range(d):
            for b in range(d):
                for e in range(d):
                    out[c, a, b] += 0.5 * ginv[c, e] * (
                        dg[a, b, e] + dg[b, a, e] - dg[e, a, b]
                    )
    return out


def random_pd(rng, d, batch=()):
    B = rng.standard_normal(batch + (d, d))
    return B @ np.swapaxes(B, -1, -2) + 0.5 * np.eye(d)


# ---------------------------------------------------------------------------
# Christoffel symbols
# ---------------------------------------------------------------------------


def test_christoffel_polar_closed_form(xp_name):
    """Polar coordinates: Gamma^r_{th th} = -r, Gamma^th_{r th} = Gamma^th_{th r} = 1/r.

    With g = diag(1, r^2) the only non-zero derivative is d_r g_{th th} = 2r, so
    Gamma^r_{th th} = 1/2 g^{rr} (0 + 0 - 2r) = -r and
    Gamma^th_{r th} = 1/2 g^{th th} (d_r g_{th th}) = 1/2 r^-2 2r = 1/r.
    """
    r, th = 1.7, 0.4
    want = np.zeros((2, 2, 2))
    want[0, 1, 1] = -r
    want[1, 0, 1] = want[1, 1, 0] = 1 / r
    got = G.christoffel_symbols(polar_metric, to_backend([r, th], xp_name))
    assert_close(got, want, xp_name)


def test_christoffel_sphere_closed_form(xp_name):
    """2-sphere: Gamma^th_{ph ph} = -sin th cos th, Gamma^ph_{th ph} = cot th.

    With g = diag(1, sin^2 th): d_th g_{ph ph} = 2 sin th cos th, hence
    Gamma^th_{ph ph} = -1/2 (2 sin th cos th) and
    Gamma^ph_{th ph} = 1/2 (sin th)^-2 2 sin th cos th = cos th / sin th.
    """
    th, ph = 0.9, 2.1
    want = np.zeros((2, 2, 2))
    want[0, 1, 1] = -np.sin(th) * np.cos(th)
    want[1, 0, 1] = want[1, 1, 0] = np.cos(th) / np.sin(th)
    got = G.christoffel_symbols(sphere_metric, to_backend([th, ph], xp_name))
    assert_close(got, want, xp_name)


def test_christoffel_constant_metric_is_exactly_zero(rng, xp_name):
    """A constant metric (e.g. the attention metric) has Gamma^c_{ab} = 0 exactly."""
    g = to_backend(random_pd(rng, 4), xp_name)
    x = to_backend(rng.standard_normal(4), xp_name)
    got = to_np(G.christoffel_symbols(lambda y: g, x))
    assert np.array_equal(got, np.zeros((4, 4, 4)))
    att = to_backend(np.eye(4) / 2.0, xp_name)
    assert np.array_equal(to_np(G.christoffel_symbols(lambda y: att, x)), 0 * got)


def test_christoffel_smooth_field_vs_finite_differences(rng):
    """Random smooth metric field: autodiff Gamma = loop spec on central differences."""
    field = SmoothField(rng)
    for _ in range(3):
        x = rng.standard_normal(3)
        dg_fd = fd_metric_derivatives(field.numpy, x)
        want = christoffel_loop_spec(field.numpy(x), dg_fd)
        got = G.christoffel_symbols(field.on("jax"), jnp.asarray(x))
        np.testing.assert_allclose(to_np(got), want, rtol=1e-7, atol=1e-8)
        dg = G.metric_derivatives(field.on("jax"), jnp.asarray(x))
        np.testing.assert_allclose(to_np(dg), dg_fd, rtol=1e-7, atol=1e-8)
        # first kind: Gamma_{dab} = g_{dc} Gamma^c_{ab}
        first = G.christoffel_first_kind(field.on("jax"), jnp.asarray(x))
        np.testing.assert_allclose(
            to_np(first), np.einsum("dc,cab->dab", field.numpy(x), want), rtol=1e-7, atol=1e-8
        )


_FIELD = SmoothField(np.random.default_rng(1))
_point = arrays(np.float64, (3,), elements=st.floats(-2.0, 2.0, allow_subnormal=False))


@given(_point)
def test_christoffel_symmetric_in_lower_indices(x):
    """Gamma^c_{ab} = Gamma^c_{ba} (the Levi-Civita connection is torsion-free)."""
    Gam = to_np(G.christoffel_symbols(_FIELD.on("jax"), jnp.asarray(x)))
    np.testing.assert_allclose(Gam, np.swapaxes(Gam, 1, 2), rtol=0, atol=1e-12)


@given(_point)
def test_metric_compatibility(x):
    """nabla_c g_{ab} = d_c g_{ab} - Gamma^d_{ca} g_{db} - Gamma^d_{cb} g_{ad} = 0.

    d_c g_{ab} comes from finite differences, independent of the library.
    """
    Gam = to_np(G.christoffel_symbols(_FIELD.on("jax"), jnp.asarray(x)))
    g = _FIELD.numpy(x)
    dg = fd_metric_derivatives(_FIELD.numpy, x)
    nabla_g = (
        dg
        - np.einsum("dca,db->cab", Gam, g)
        - np.einsum("dcb,ad->cab", Gam, g)
    )
    np.testing.assert_allclose(nabla_g, 0, atol=1e-7)


# ---------------------------------------------------------------------------
# Covariant derivatives
# ---------------------------------------------------------------------------


def _cartesian_field(p):
    """V^j(x, y) = (x^2 y, sin x) and its Cartesian derivatives dV[i, j] = d_i V^j."""
    x, y = p
    V = np.array([x * x * y, np.sin(x)])
    dV = np.array([[2 * x * y, np.cos(x)], [x * x, 0.0]])
    return V, dV


def _polar_components(y):
    """The field V above in polar components v^r, v^th at y = (r, th) (traceable)."""
    xp = _ops(y)
    r, th = y[0], y[1]
    X, Y = r * xp.cos(th), r * xp.sin(th)
    Vx, Vy = X * X * Y, xp.sin(X)
    vr = xp.cos(th) * Vx + xp.sin(th) * Vy
    vth = (-xp.sin(th) * Vx + xp.cos(th) * Vy) / r
    return xp.stack([vr, vth])


def test_covariant_derivative_is_a_tensor_polar(xp_name):
    """nabla_a v^b in polar coordinates = the Cartesian d_i V^j transformed as a (1,1) tensor.

    In Cartesian coordinates the connection vanishes, so nabla_i V^j = d_i V^j.
    A tensor transforms as nabla_a v^b = (dx^i/dy^a) (dy^b/dx^j) d_i V^j with
    dx/dy the Jacobian of (r, th) -> (r cos th, r sin th).
    """
    r, th = 1.3, 0.7
    P = np.array([[np.cos(th), -r * np.sin(th)], [np.sin(th), r * np.cos(th)]])  # P[i, a]
    X, Y = r * np.cos(th), r * np.sin(th)
    _, dV = _cartesian_field(np.array([X, Y]))
    want = np.einsum("ia,bj,ij->ab", P, np.linalg.inv(P), dV)
    got = G.covariant_derivative_vector(
        polar_metric, _polar_components, to_backend([r, th], xp_name)
    )
    loose = dict(rtol=5e-5, atol=5e-5) if xp_name == "mlx" else {}
    assert_close(got, want, xp_name, **loose)
    # its trace, the divergence, is the Cartesian d_x V^x + d_y V^y = 2 x y
    assert_close(np.trace(to_np(got)), 2 * X * Y, xp_name, rtol=5e-5, atol=5e-5)


def test_covariant_derivative_of_coordinate_vector_polar():
    """v = d_r (components (1, 0)): nabla_a v^b = Gamma^b_{a r}, so nabla_th v^th = 1/r."""
    r = 2.5
    got = to_np(G.covariant_derivative_vector(
        polar_metric, lambda y: jnp.stack([y[0] * 0 + 1, y[0] * 0]), jnp.array([r, 0.3])
    ))
    np.testing.assert_allclose(got, np.array([[0, 0], [0, 1 / r]]), atol=1e-14)


def _vector_field(y):
    xp = _ops(y)
    return xp.stack([xp.sin(y[1]) * y[0], y[2] ** 2 - y[0], xp.cos(y[0] + y[2])])


@given(_point)
def test_lowering_commutes_with_nabla(x):
    """nabla_a (g_{bc} v^c) = g_{bc} nabla_a v^c (metric compatibility, on fields)."""
    metric = _FIELD.on("jax")

    def u_fn(y):
        # u_b = g_{bc}(y) v^c(y)
        return jnp.einsum("bc,c->b", metric(y), _vector_field(y))

    xj = jnp.asarray(x)
    nab_u = to_np(G.covariant_derivative_covector(metric, u_fn, xj))
    nab_v = to_np(G.covariant_derivative_vector(metric, _vector_field, xj))
    want = np.einsum("bc,ac->ab", _FIELD.numpy(x), nab_v)
    np.testing.assert_allclose(nab_u, want, rtol=1e-9, atol=1e-9)


def test_hessian_of_scalar_is_symmetric(rng):
    """nabla_a d_b f = d_a d_b f - Gamma^c_{ab} d_c f: symmetric, and not the plain Hessian."""
    metric = _FIELD.on("jax")

    def f(y):
        return jnp.sin(y[0] * y[1]) + y[2] ** 3 * y[0]

    x = jnp.asarray(rng.standard_normal(3))
    H = to_np(G.covariant_derivative_covector(metric, jax.grad(f), x))
    np.testing.assert_allclose(H, H.T, atol=1e-12)
    # and it is not just the plain Hessian: the connection term is present
    plain = np.asarray(jax.hessian(f)(x))
    Gam = to_np(G.christoffel_symbols(metric, x))
    np.testing.assert_allclose(
        H, plain - np.einsum("cab,c->ab", Gam, np.asarray(jax.grad(f)(x))), atol=1e-12
    )
    assert not np.allclose(H, plain)


def test_geodesic_acceleration_straight_lines_in_polar(rng):
    """Straight lines in polar coordinates solve y''^c = -Gamma^c_{ab} y'^a y'^b.

    The line is p + t w in Cartesian coordinates.

    y(t) = (|p + t w|, atan2) is differentiated twice by autodiff (no Christoffels).
    """
    p, w = rng.standard_normal(2), rng.standard_normal(2)

    def curve(t):
        z = jnp.asarray(p) + t * jnp.asarray(w)
        return jnp.stack([jnp.sqrt(z @ z), jnp.arctan2(z[1], z[0])])

    t0 = 0.3
    y = curve(t0)
    v = jax.jacfwd(curve)(t0)
    acc = jax.jacfwd(jax.jacfwd(curve))(t0)
    got = G.geodesic_acceleration(polar_metric, y, v)
    np.testing.assert_allclose(to_np(got), np.asarray(acc), rtol=1e-10, atol=1e-12)


def test_geodesic_acceleration_sphere_batch():
    """Sphere: the equator is a geodesic; a latitude circle has th'' = sin th cos th (ph')^2."""
    th = 0.6
    v = jnp.array([[0.0, 1.0], [0.0, 2.0], [1.0, 0.0]])
    got = to_np(G.geodesic_acceleration(sphere_metric, jnp.array([th, 0.2]), v))
    s, c = np.sin(th), np.cos(th)
    want = np.array([[s * c, 0.0], [4 * s * c, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(got, want, atol=1e-14)
    eq = to_np(G.geodesic_acceleration(sphere_metric, jnp.array([np.pi / 2, 0.2]), v[0]))
    np.testing.assert_allclose(eq, 0, atol=1e-15)


# ---------------------------------------------------------------------------
# Lengths, angles, volume
# ---------------------------------------------------------------------------


def _norm_loop(v, g):
    q = 0.0
    for a in range(len(v)):
        for b in range(len(v)):
            q += v[a] * g[a, b] * v[b]
    return np.sqrt(q)


def _bil_loop(u, v, g):
    return sum(u[a] * g[a, b] * v[b] for a in range(len(u)) for b in range(len(v)))


def test_norm_distance_angle_vs_loop_spec(rng, xp_name):
    """Batch v (4, 3, d) with metrics g (4, 1, d, d): every entry matches the loop spec."""
    d = 5
    g = random_pd(rng, d, (4, 1))
    u, v = rng.standard_normal((4, 3, d)), rng.standard_normal((4, 3, d))
    n_want = np.zeros((4, 3))
    dist_want = np.zeros((4, 3))
    cos_want = np.zeros((4, 3))
    for i, k in np.ndindex(4, 3):
        gg = g[i, 0]
        n_want[i, k] = _norm_loop(v[i, k], gg)
        dist_want[i, k] = _norm_loop(u[i, k] - v[i, k], gg)
        cos_want[i, k] = _bil_loop(u[i, k], v[i, k], gg) / (
            _norm_loop(u[i, k], gg) * _norm_loop(v[i, k], gg)
        )
    U, V, Gm = (to_backend(a, xp_name) for a in (u, v, g))
    assert_close(G.norm(V, Gm), n_want, xp_name)
    assert_close(G.distance(U, V, Gm), dist_want, xp_name)
    assert_close(G.cosine_similarity(U, V, Gm), cos_want, xp_name)
    loose = dict(atol=1e-4) if xp_name == "mlx" else {}
    assert_close(G.angle(U, V, Gm), np.arccos(cos_want), xp_name, **loose)


def test_angle_of_parallel_vectors_is_not_nan(rng):
    """Parallel vectors: angle 0, antiparallel: pi, even where the cosine rounds past +-1."""
    g = jnp.asarray(random_pd(rng, 6))
    U = jnp.asarray(rng.standard_normal((200, 6)))
    cos = np.asarray(G.cosine_similarity(U, 3 * U, g))
    assert np.any(np.abs(cos) > 1)  # rounding does push some past 1: the case to guard
    np.testing.assert_allclose(np.asarray(G.angle(U, 3 * U, g)), 0, atol=1e-7)
    np.testing.assert_allclose(np.asarray(G.angle(U, -U, g)), np.pi, atol=1e-7)


_vec = arrays(np.float64, (2, 4), elements=st.floats(-3.0, 3.0, allow_subnormal=False))
_RNG_ISO = np.random.default_rng(2)
_B = _RNG_ISO.standard_normal((4, 4)) + 3 * np.eye(4)
_G_ISO = _B.T @ _B
_O, _ = np.linalg.qr(_RNG_ISO.standard_normal((4, 4)))
_R = np.linalg.inv(_B) @ _O @ _B  # R^T g R = g: an isometry of g
_P = _RNG_ISO.standard_normal((4, 4)) + 3 * np.eye(4)  # a change of basis


def test_isometry_is_not_euclidean():
    """The isometry R of g is not orthogonal, so the invariance test below has teeth."""
    np.testing.assert_allclose(_R.T @ _G_ISO @ _R, _G_ISO, atol=1e-10)
    assert not np.allclose(_R.T @ _R, np.eye(4), atol=1e-3)


@given(_vec)
def test_lengths_and_angles_invariant_under_isometry(uv):
    """An isometry R (R^T g R = g) preserves lengths, distances and angles."""
    u, v = uv
    if np.linalg.norm(u) < 1e-3 or np.linalg.norm(v) < 1e-3:
        return
    g = jnp.asarray(_G_ISO)
    Ru, Rv = _R @ u, _R @ v
    for f, args, rargs in [
        (G.norm, (u, g), (Ru, g)),
        (G.distance, (u, v, g), (Ru, Rv, g)),
        (G.cosine_similarity, (u, v, g), (Ru, Rv, g)),
    ]:
        np.testing.assert_allclose(
            to_np(f(*rargs)), to_np(f(*args)), rtol=1e-9, atol=1e-9
        )


@given(_vec)
def test_lengths_invariant_under_change_of_basis(uv):
    """Components v -> P^{-1} v and metric g -> P^T g P: the same length and angle."""
    u, v = uv
    if np.linalg.norm(u) < 1e-3 or np.linalg.norm(v) < 1e-3:
        return
    Pinv = np.linalg.inv(_P)
    g2 = jnp.asarray(_P.T @ _G_ISO @ _P)
    g = jnp.asarray(_G_ISO)
    np.testing.assert_allclose(
        to_np(G.norm(Pinv @ u, g2)), to_np(G.norm(u, g)), rtol=1e-9
    )
    np.testing.assert_allclose(
        to_np(G.cosine_similarity(Pinv @ u, Pinv @ v, g2)),
        to_np(G.cosine_similarity(u, v, g)),
        rtol=1e-8,
        atol=1e-9,
    )


def test_volume_element(rng, xp_name):
    """sqrt(det g) against NumPy's determinant; delta/sqrt(d) gives d^(-d/4)."""
    g = random_pd(rng, 4, (3,))
    want = np.sqrt(np.linalg.det(g))
    loose = dict(rtol=1e-4) if xp_name == "mlx" else {}
    assert_close(G.volume_element(to_backend(g, xp_name)), want, xp_name, **loose)
    d = 8
    att = to_backend(np.eye(d) / np.sqrt(d), xp_name)
    assert_close(G.volume_element(att), d ** (-d / 4), xp_name)


def test_norm_jits_and_differentiates(rng):
    """jax.jit skips the value checks, same result; d||v||_g / dv^a = v_a / ||v||_g."""
    g = jnp.asarray(random_pd(rng, 3))
    v = jnp.asarray(rng.standard_normal(3))
    np.testing.assert_allclose(jax.jit(G.norm)(v, g), G.norm(v, g), rtol=1e-14)
    grad = jax.grad(G.norm)(v, g)
    want = (g @ v) / _norm_loop(np.asarray(v), np.asarray(g))
    np.testing.assert_allclose(grad, want, rtol=1e-12)
    Gam = jax.jit(lambda x: G.christoffel_symbols(polar_metric, x))(jnp.array([2.0, 0.1]))
    np.testing.assert_allclose(Gam[0, 1, 1], -2.0)


# ---------------------------------------------------------------------------
# Fisher information and the natural gradient
# ---------------------------------------------------------------------------


def test_fisher_logits_vs_score_outer_product_and_hessian(rng, xp_name):
    """F_{jk} = E_p[d_j log p  d_k log p] (jax.jacobian of log-softmax) = Hessian of log Z."""
    s = rng.standard_normal((2, 3, 5)) * 2
    A = np.asarray(jax.nn.softmax(jnp.asarray(s), axis=-1))
    got = to_np(G.fisher_information_logits(to_backend(A, xp_name)))
    for idx in np.ndindex(2, 3):
        si = jnp.asarray(s[idx])
        score = np.asarray(jax.jacobian(jax.nn.log_softmax)(si))  # [j, k] = d_k log p_j
        p = A[idx]
        want = np.einsum("j,jk,jl->kl", p, score, score)
        assert_close(got[idx], want, xp_name)
        hess = np.asarray(jax.hessian(jax.scipy.special.logsumexp)(si))
        assert_close(got[idx], hess, xp_name)
    # the null vector: shifting all logits changes nothing
    assert_close(got @ np.ones(5), np.zeros((2, 3, 5)), xp_name)


def _fisher_query_autodiff(q, K, g, T, keep=None):
    """F_{ab} = sum_j A_j d_a log A_j d_b log A_j, from jax.jacobian of log-softmax."""
    if keep is not None:
        K = K[keep]

    def logA(qq):
        return jax.nn.log_softmax(jnp.einsum("a,ab,jb->j", qq, g, K) / T)

    score = np.asarray(jax.jacobian(logA)(jnp.asarray(q)))  # [j, a]
    A = np.exp(np.asarray(logA(jnp.asarray(q))))
    return np.einsum("j,ja,jb->ab", A, score, score)


def test_fisher_query_vs_autodiff(rng, xp_name):
    """Fisher wrt the query = E_A[grad log A_j grad log A_j^T], batch over q's leading axes."""
    d, n_k = 4, 6
    q = rng.standard_normal((2, 3, d))
    K = rng.standard_normal((2, 1, n_k, d))
    g = random_pd(rng, d) / 3
    T = 0.7
    got = to_np(G.fisher_information_query(
        to_backend(q, xp_name), to_backend(K, xp_name), T=T, g=to_backend(g, xp_name)
    ))
    got_default = to_np(
        G.fisher_information_query(to_backend(q, xp_name), to_backend(K, xp_name))
    )
    assert got.shape == (2, 3, d, d)
    for i, k in np.ndindex(2, 3):
        want = _fisher_query_autodiff(q[i, k], K[i, 0], g, T)
        assert_close(got[i, k], want, xp_name)
        want_default = _fisher_query_autodiff(q[i, k], K[i, 0], np.eye(d) / np.sqrt(d), 1.0)
        assert_close(got_default[i, k], want_default, xp_name)


def test_fisher_query_mask(rng):
    """Masked keys drop out of the covariance; a fully masked row gives F = 0, no NaN."""
    d, n_k = 3, 5
    q, K = rng.standard_normal((2, d)), rng.standard_normal((n_k, d))
    mask = np.array([[True, False, True, True, False], [False] * n_k])
    got = np.asarray(
        G.fisher_information_query(jnp.asarray(q), jnp.asarray(K), mask=jnp.asarray(mask))
    )
    want = _fisher_query_autodiff(q[0], K, np.eye(d) / np.sqrt(d), 1.0, keep=mask[0])
    np.testing.assert_allclose(got[0], want, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(got[1], 0)


def test_natural_gradient_identity_fisher_is_plain_gradient(rng, xp_name):
    """With F = delta and no damping the natural gradient is the gradient."""
    grad = rng.standard_normal((3, 5))
    F = np.broadcast_to(np.eye(5), (3, 5, 5))
    got = G.natural_gradient(to_backend(grad, xp_name), to_backend(F, xp_name), damping=0.0)
    assert_close(got, grad, xp_name)
    theta = rng.standard_normal((3, 5))
    step = G.natural_gradient_step(to_backend(theta, xp_name), to_backend(grad, xp_name),
                                   to_backend(F, xp_name), 0.1, damping=0.0)
    assert_close(step, theta - 0.1 * grad, xp_name)


def test_natural_gradient_damped_vs_inverse(rng):
    """nat^i = [(F + lambda delta)^{-1}]^{ij} grad_j, against an explicit NumPy inverse."""
    A = np.asarray(jax.nn.softmax(jnp.asarray(rng.standard_normal(6))))
    F = np.diag(A) - np.outer(A, A)  # the singular logit Fisher
    grad = rng.standard_normal(6)
    got = np.asarray(G.natural_gradient(jnp.asarray(grad), jnp.asarray(F), damping=1e-2))
    want = np.linalg.inv(F + 1e-2 * np.eye(6)) @ grad
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_natural_gradient_step_is_reparameterisation_invariant(rng):
    """theta = L phi: the natural step in phi, mapped by L, is the natural step in theta.

    The Fisher in phi is computed by autodiff of log A(L phi) (no transformation
    rule used); the gradient by jax.grad.  The plain gradient step is not invariant.
    """
    d, n_k = 3, 6
    K = jnp.asarray(rng.standard_normal((n_k, d)))
    Vv = jnp.asarray(rng.standard_normal((n_k, 2)))
    y = jnp.asarray(rng.standard_normal(2))
    L = rng.standard_normal((d, d)) + 2 * np.eye(d)
    Lj = jnp.asarray(L)
    g = jnp.eye(d) / np.sqrt(d)

    def loss_theta(q):
        A = jax.nn.softmax(jnp.einsum("a,ab,jb->j", q, g, K))
        return jnp.sum((A @ Vv - y) ** 2)

    phi = rng.standard_normal(d)
    theta = L @ phi
    F_theta = G.fisher_information_query(jnp.asarray(theta), K)
    step_theta = G.natural_gradient_step(theta, jax.grad(loss_theta)(jnp.asarray(theta)),
                                         F_theta, 0.5, damping=0.0)

    def logA_phi(p):
        return jax.nn.log_softmax(jnp.einsum("a,ab,jb->j", Lj @ p, g, K))

    score = jax.jacobian(logA_phi)(jnp.asarray(phi))
    F_phi = jnp.einsum("j,ja,jb->ab", jnp.exp(logA_phi(jnp.asarray(phi))), score, score)
    grad_phi = jax.grad(lambda p: loss_theta(Lj @ p))(jnp.asarray(phi))
    step_phi = G.natural_gradient_step(phi, grad_phi, F_phi, 0.5, damping=0.0)
    np.testing.assert_allclose(
        L @ np.asarray(step_phi), np.asarray(step_theta), rtol=1e-8, atol=1e-10
    )
    # the plain gradient step is not invariant
    eye = jnp.eye(d)
    grad_theta = jax.grad(loss_theta)(jnp.asarray(theta))
    plain_theta = G.natural_gradient_step(theta, grad_theta, eye, 0.5, 0.0)
    plain_phi = G.natural_gradient_step(phi, grad_phi, eye, 0.5, 0.0)
    assert not np.allclose(L @ np.asarray(plain_phi), np.asarray(plain_theta), rtol=1e-4)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_zero_vector_raises_under_jit_with_constant_inputs():
    """Exercise 4.1's zero-vector case: a jit that closes over the inputs (how the course runs
    a case) still raises, instead of returning NaN from the traced length."""
    u = jnp.array([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]])
    v = jnp.ones((2, 3))
    g3 = jnp.eye(3) + 0.1
    with pytest.raises(AttentionInputError, match="u has zero length"):
        jax.jit(lambda: G.angle(u, v, g3))()
    with pytest.raises(AttentionInputError, match="v has zero length"):
        jax.jit(lambda: G.cosine_similarity(v, u, g3))()
    # an indefinite metric is still called indefinite, not "zero length"
    with pytest.raises(AttentionInputError, match="not positive"):
        G.cosine_similarity(jnp.array([0.0, 1.0]), jnp.array([2.0, 1.0]), jnp.diag(jnp.array([1.0, -1.0])))
    # traced inputs: no value check, and no error
    assert jax.jit(G.angle)(u[:1], v[:1], g3).shape == (1,)


def test_errors_name_index_and_sizes(rng):
    """Mismatched d, wrong metric_fn shape, zero vectors, bad metrics, bad damping."""
    g3 = jnp.eye(3)
    msg = r"v has d=2 but g has d=3 \(index a must match\)"
    with pytest.raises(AttentionInputError, match=msg):
        G.norm(jnp.ones(2), g3)
    with pytest.raises(AttentionInputError, match="index a must match"):
        G.distance(jnp.ones(3), jnp.ones(2), g3)
    with pytest.raises(AttentionInputError, match="u has zero length"):
        G.angle(jnp.zeros(3), jnp.ones(3), g3)
    with pytest.raises(AttentionInputError, match="v has zero length"):
        G.cosine_similarity(jnp.ones(3), jnp.zeros(3), g3)
    with pytest.raises(AttentionInputError, match="not positive"):
        G.norm(jnp.array([0.0, 1.0]), jnp.diag(jnp.array([1.0, -1.0])))
    with pytest.raises(AttentionInputError, match="positive-definite"):
        G.volume_element(jnp.diag(jnp.array([1.0, -1.0])))
    msg = r"metric_fn\(x\) has shape \(3, 3\) but x has d=2"
    with pytest.raises(AttentionInputError, match=msg):
        G.christoffel_symbols(lambda x: g3, jnp.ones(2))
    with pytest.raises(AttentionInputError, match="one point of shape"):
        G.christoffel_symbols(polar_metric, jnp.ones((4, 2)))
    with pytest.raises(AttentionInputError, match=r"v_fn\(x\) has shape \(3,\) but x has d=2"):
        G.covariant_derivative_vector(polar_metric, lambda x: jnp.ones(3), jnp.ones(2))
    with pytest.raises(AttentionInputError, match=r"q has d_k=3 but K has d_k=4"):
        G.fisher_information_query(jnp.ones(3), jnp.ones((5, 4)))
    msg = r"grad has p=4 but fisher has p=3 \(index j"
    with pytest.raises(AttentionInputError, match=msg):
        G.natural_gradient(jnp.ones(4), g3)
    with pytest.raises(AttentionInputError, match="damping"):
        G.natural_gradient(jnp.ones(3), g3, damping=-1.0)
    with pytest.raises(AttentionInputError, match="temperature"):
        G.fisher_information_query(jnp.ones(3), jnp.ones((5, 3)), T=0.0)
    # a semi-definite metric: a null direction has length 0, not NaN
    W = jnp.asarray(rng.standard_normal((2, 3)))
    null = jnp.asarray(np.linalg.svd(np.asarray(W))[2][-1])
    assert float(G.norm(null, W.T @ W)) == pytest.approx(0.0, abs=1e-7)


# ---------------------------------------------------------------------------
# MLX parity: every public function, MLX (float32) vs JAX (float64)
# ---------------------------------------------------------------------------

_R0 = np.random.default_rng(7)
_g = random_pd(_R0, 3)
_u, _v = _R0.standard_normal((2, 3)), _R0.standard_normal((2, 3))
_x = np.array([0.3, -0.5, 0.8])
_q, _K = _R0.standard_normal((2, 3)), _R0.standard_normal((5, 3))
_A = np.asarray(jax.nn.softmax(jnp.asarray(_R0.standard_normal((2, 5)))))
_F = random_pd(_R0, 3)


def _parity_cases():
    # Each case: (name, function of backend name -> result).  Arrays and
    # fields are built on the requested backend.
    def b(a, n):
        return to_backend(a, n)

    return {
        "norm": lambda n: G.norm(b(_u, n), b(_g, n)),
        "distance": lambda n: G.distance(b(_u, n), b(_v, n), b(_g, n)),
        "cosine_similarity": lambda n: G.cosine_similarity(b(_u, n), b(_v, n), b(_g, n)),
        "angle": lambda n: G.angle(b(_u, n), b(_v, n), b(_g, n)),
        "volume_element": lambda n: G.volume_element(b(_g, n)),
        "metric_derivatives": lambda n: G.metric_derivatives(_FIELD.on(n), b(_x, n)),
        "christoffel_first_kind": lambda n: G.christoffel_first_kind(_FIELD.on(n), b(_x, n)),
        "christoffel_symbols": lambda n: G.christoffel_symbols(_FIELD.on(n), b(_x, n)),
        "covariant_derivative_vector": lambda n: G.covariant_derivative_vector(
            _FIELD.on(n), _vector_field, b(_x, n)
        ),
        "covariant_derivative_covector": lambda n: G.covariant_derivative_covector(
            _FIELD.on(n), _vector_field, b(_x, n)
        ),
        "geodesic_acceleration": lambda n: G.geodesic_acceleration(
            _FIELD.on(n), b(_x, n), b(_u, n)
        ),
        "fisher_information_logits": lambda n: G.fisher_information_logits(b(_A, n)),
        "fisher_information_query": lambda n: G.fisher_information_query(
            b(_q, n), b(_K, n), mask=b(np.array([True, True, False, True, True]), n),
            T=0.8, g=b(_g, n)
        ),
        "natural_gradient": lambda n: G.natural_gradient(b(_u, n), b(_F, n)),
        "natural_gradient_step": lambda n: G.natural_gradient_step(
            b(_v, n), b(_u, n), b(_F, n), 0.3
        ),
    }


def test_parity_table_covers_public_api():
    """Every name in geometry.__all__ has an MLX parity case."""
    assert set(_parity_cases()) == set(G.__all__)


@pytest.mark.mlx
@pytest.mark.parametrize("fname", sorted(_parity_cases()))
def test_mlx_parity(fname):
    """MLX float32 result = JAX float64 result (float32 tolerance)."""
    pytest.importorskip("mlx.core")
    import mlx.core as mx

    case = _parity_cases()[fname]
    got = case("mlx")
    assert isinstance(got, mx.array)
    want = case("jax")
    assert_close(got, want, "mlx", rtol=1e-4, atol=1e-4)
