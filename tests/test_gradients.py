"""Part V: the manual backward pass against autodiff, finite differences and MLX.

Every expected gradient here comes from ``jax.vjp`` of the library's forward
pass (written out in this file, no Part V formula), from central differences
in float64, or from a closed form.  JAX runs in float64 (conftest).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import attn_tensors.gradients as gr
from attn_tensors import AttentionInputError
from attn_tensors.attention import attention_decomposition, scaled_dot_product_attention
from attn_tensors.gradients import (
    AttentionGrads,
    attention_backward,
    attention_forward_backward,
    autodiff_gradients,
    finite_difference_gradients,
    gradient_errors,
    softmax_backward,
    softmax_jacobian,
    verify_gradients,
)
from attn_tensors.softmax import softmax
from conftest import assert_close, compile_cache_env, requires_mlx, to_backend, to_np

ROOT = Path(__file__).resolve().parents[1]
FIELDS = AttentionGrads._fields  # dL_dQ dL_dK dL_dV dL_dA dL_dS dL_dg


# -- the independent reference: jax.vjp of the forward pass ----------------------


def vjp_reference(Q, K, V, dO, mask=None, T=1.0, g=None, scale=None):
    """All six gradients by jax.vjp of the library forward (float64)."""
    Q, K, V, dO = (jnp.asarray(x) for x in (Q, K, V, dO))
    mask = None if mask is None else jnp.asarray(mask)
    d_k = Q.shape[-1]
    if g is None:
        c = 1 / np.sqrt(d_k) if scale is None else scale
        _, pull = jax.vjp(
            lambda Q, K, V: scaled_dot_product_attention(Q, K, V, mask, T, scale=scale),
            Q, K, V,
        )
        dQ, dK, dV = pull(dO)
        g_eff = c * jnp.eye(d_k)
        _, pull_g = jax.vjp(
            lambda g: scaled_dot_product_attention(Q, K, V, mask, T, g), g_eff
        )
        (dg,) = pull_g(dO)
    else:
        g = jnp.asarray(g)
        _, pull = jax.vjp(
            lambda Q, K, V, g: scaled_dot_product_attention(Q, K, V, mask, T, g),
            Q, K, V, g,
        )
        dQ, dK, dV, dg = pull(dO)
    parts = attention_decomposition(Q, K, V, mask, T, g, scale=scale)
    _, pull_A = jax.vjp(lambda A: jnp.einsum("...ij,...jb->...ib", A, V), parts.A)
    (dA,) = pull_A(dO)
    _, pull_S = jax.vjp(
        lambda S: jnp.einsum("...ij,...jb->...ib", softmax(S, mask, T), V), parts.S
    )
    (dS,) = pull_S(dO)
    return AttentionGrads(dQ, dK, dV, dA, dS, dg)


def make_case(rng, qb=(), kb=None, n_q=3, n_k=4, d_k=5, d_v=2, mask=None,
              T=1.0, g=None, gb=(), scale=None):
    """NumPy float64 inputs and a random upstream gradient dL/dO for one case."""
    kb = qb if kb is None else kb
    Q = rng.standard_normal(qb + (n_q, d_k))
    K = rng.standard_normal(kb + (n_k, d_k))
    V = rng.standard_normal(kb + (n_k, d_v))
    m = None
    if mask == "holes":  # random holes and a fully masked row (query 1)
        m = rng.random((n_q, n_k)) < 0.7
        m[:, 0] = True
        m[1, :] = False
    elif mask == "causal":
        m = np.tril(np.ones((n_q, n_k), dtype=bool))
    elif mask == "padding":  # shape (n_k,): the last key is padding
        m = np.arange(n_k) < n_k - 1
    G = None
    if g == "asym":
        G = rng.standard_normal(gb + (d_k, d_k)) / np.sqrt(d_k)
    elif g == "sym":
        W = rng.standard_normal((d_k + 1, d_k))
        G = W.T @ W / d_k
    batch = np.broadcast_shapes(qb, kb, gb)
    dO = rng.standard_normal(batch + (n_q, d_v))
    return dict(Q=Q, K=K, V=V, dO=dO, mask=m, T=T, g=G, scale=scale)


CASES = {
    "plain": dict(),
    "holes_mask": dict(mask="holes"),
    "causal_T0.6": dict(mask="causal", T=0.6),
    "padding_T2.5": dict(mask="padding", T=2.5),
    "scale_1": dict(scale=1.0),
    "metric_asym": dict(g="asym"),
    "metric_sym_T1.7": dict(g="sym", T=1.7, mask="holes"),
    "batch_2": dict(qb=(2,), mask="causal"),
    "batch_2x3": dict(qb=(2, 3), mask="holes", T=0.8),
    "batch_2x3_metric": dict(qb=(2, 3), g="asym"),
    "batch_2x3_per_head_metric": dict(qb=(2, 3), g="asym", gb=(3, 1, 1)),
    "kv_unbatched": dict(qb=(2, 3), kb=(), mask="padding"),
    "kv_unbatched_metric": dict(qb=(2,), kb=(), g="asym"),
    "kv_broadcast_axis": dict(qb=(2, 3), kb=(1, 3)),
    "q_unbatched": dict(qb=(), kb=(2,)),
    "rect": dict(n_q=2, n_k=6, d_k=3, d_v=4, mask="holes"),
}


def call(fn, case, name="jax", **extra):
    """Call fn(Q, K, V, dO, mask, T, g, scale=...) with the case on one backend."""
    b = lambda x: None if x is None else to_backend(x, name)  # noqa: E731
    return fn(b(case["Q"]), b(case["K"]), b(case["V"]), b(case["dO"]),
              b(case["mask"]), case["T"], b(case["g"]), scale=case["scale"], **extra)


# -- manual backward vs jax.vjp ------------------------------------------------------

# Jitted once per case (a single compile instead of one per eager op per shape).
_STATIC = dict(static_argnames=("T", "scale"))
jit_backward = jax.jit(attention_backward, **_STATIC)
jit_autodiff = jax.jit(autodiff_gradients, **_STATIC)
jit_reference = jax.jit(vjp_reference, **_STATIC)


@pytest.mark.parametrize("spec", CASES.values(), ids=CASES.keys())
def test_manual_and_autodiff_match_jax_vjp(spec, rng):
    """dL/dQ, dL/dK, dL/dV, dL/dA, dL/dS, dL/dg of the derivation (and of the
    library's xp.vjp reference) equal jax.vjp, for a random upstream dL/dO."""
    case = make_case(rng, **spec)
    want = jit_reference(case["Q"], case["K"], case["V"], case["dO"],
                         case["mask"], case["T"], case["g"], case["scale"])
    got = call(jit_backward, case)
    auto = call(jit_autodiff, case)
    for field in FIELDS:
        assert getattr(got, field).shape == getattr(want, field).shape, field
        assert_close(getattr(got, field), getattr(want, field))
        assert_close(getattr(auto, field), getattr(want, field))
    # gradients have the shapes of the inputs, even when those broadcast
    assert got.dL_dQ.shape == case["Q"].shape
    assert got.dL_dK.shape == case["K"].shape
    assert got.dL_dV.shape == case["V"].shape
    d_k = case["Q"].shape[-1]
    assert got.dL_dg.shape == (case["g"].shape if case["g"] is not None else (d_k, d_k))


def test_broadcast_gradients_are_sums_over_the_batch(rng):
    """Unbatched K, V, g get the sum over the batch of their per-batch gradients."""
    case = make_case(rng, qb=(2, 3), kb=(), g="asym")
    grads = call(jit_backward, case)
    total = {f: 0.0 for f in ("dL_dK", "dL_dV", "dL_dg")}
    for b1 in range(2):
        for b2 in range(3):
            one = jit_backward(case["Q"][b1, b2], case["K"], case["V"],
                               case["dO"][b1, b2], g=case["g"])
            for f in total:
                total[f] = total[f] + to_np(getattr(one, f))
    for f, want in total.items():
        assert_close(getattr(grads, f), want)


def test_fully_masked_row_gives_finite_zero_gradients(rng):
    """A query that may attend to nothing: no NaN, and zero dL/dS and dL/dQ in its row."""
    case = make_case(rng, **CASES["metric_sym_T1.7"])  # query 1 is fully masked
    assert not case["mask"][1].any()
    for fn in (attention_backward, jit_backward, jit_autodiff):
        grads = call(fn, case)
        for field in FIELDS:
            assert np.all(np.isfinite(to_np(getattr(grads, field)))), field
        assert np.all(to_np(grads.dL_dS)[..., 1, :] == 0.0)
        assert np.all(to_np(grads.dL_dQ)[..., 1, :] == 0.0)
        # masked keys: exact zero
        assert np.all(to_np(grads.dL_dS)[..., ~case["mask"]] == 0.0)


def test_parts_reuse_and_forward_backward(rng):
    """Passing the forward's parts changes nothing; forward_backward returns O too."""
    case = make_case(rng, qb=(2,), mask="causal", T=1.3, g="asym")
    parts = attention_decomposition(case["Q"], case["K"], case["V"], case["mask"],
                                    case["T"], case["g"])
    a = call(attention_backward, case)
    b = call(attention_backward, case, parts=parts)
    O, c = call(attention_forward_backward, case)
    assert_close(O, parts.O)
    for field in FIELDS:
        np.testing.assert_array_equal(to_np(getattr(a, field)), to_np(getattr(b, field)))
        assert_close(getattr(c, field), getattr(a, field))


def test_jit_traces_and_float32_stays_float32(rng):
    """attention_forward_backward runs under jax.jit; float32 in, float32 out."""
    case = make_case(rng, qb=(2,), mask="causal")
    f = jax.jit(lambda Q, K, V, dO, m: attention_forward_backward(Q, K, V, dO, m, 0.9))
    args = [jnp.asarray(case[k], dtype=jnp.float32) for k in ("Q", "K", "V", "dO")]
    O, grads = f(*args, jnp.asarray(case["mask"]))
    eager = attention_backward(*[case[k] for k in ("Q", "K", "V", "dO")], case["mask"], 0.9)
    assert O.dtype == jnp.float32 and grads.dL_dQ.dtype == jnp.float32
    for field in FIELDS:
        np.testing.assert_allclose(to_np(getattr(grads, field)),
                                   to_np(getattr(eager, field)), rtol=1e-4, atol=1e-5)


# -- the softmax Jacobian and its vjp -----------------------------------------------


@pytest.mark.parametrize("batch,mask,T", [((), None, 1.0), ((), "holes", 0.7),
                                          ((2,), "causal", 2.0)])
def test_softmax_jacobian_matches_jax_jacobian(batch, mask, T, rng):
    """J^{ijk} = dA^{ij}/dS^{ik} equals the diagonal blocks of jax.jacobian; other blocks vanish."""
    n_q, n_k = 3, 5
    S = rng.standard_normal(batch + (n_q, n_k)) * 2
    m = make_case(rng, mask=mask, n_q=n_q, n_k=n_k)["mask"]
    m_j = None if m is None else jnp.asarray(m)
    A = softmax(jnp.asarray(S), m_j, T)
    J = to_np(softmax_jacobian(A, T))
    assert J.shape == batch + (n_q, n_k, n_k)
    full = to_np(jax.jacrev(lambda S: softmax(S, m_j, T))(jnp.asarray(S)))
    # full[..., i, j, ..., i', k]: pick one batch element at a time
    for b in np.ndindex(*batch):
        F = full[b + (slice(None), slice(None)) + b]  # (n_q, n_k, n_q, n_k)
        for i in range(n_q):
            for i2 in range(n_q):
                block = F[i, :, i2, :]
                want = J[b + (i,)] if i == i2 else np.zeros((n_k, n_k))
                np.testing.assert_allclose(block, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("batch,mask,T", [((), None, 1.0), ((), "holes", 0.4),
                                          ((2,), "causal", 3.0)])
def test_softmax_backward_matches_jax_vjp(batch, mask, T, rng):
    """dL/dS^{ij} = (1/T) A^{ij}(dL/dA^{ij} - A^{ik} dL/dA^{ik}) equals jax.vjp of softmax."""
    S = jnp.asarray(rng.standard_normal(batch + (3, 5)))
    dA = jnp.asarray(rng.standard_normal(batch + (3, 5)))
    m = make_case(rng, mask=mask, n_q=3, n_k=5)["mask"]
    m_j = None if m is None else jnp.asarray(m)
    A, pull = jax.vjp(lambda S: softmax(S, m_j, T), S)
    (want,) = pull(dA)
    got = softmax_backward(A, dA, T)
    assert_close(got, want)
    # and it is the Jacobian contracted with dL/dA: dL/dS^{ik} = dL/dA^{ij} J^{ijk}
    assert_close(got, jnp.einsum("...ij,...ijk->...ik", dA, softmax_jacobian(A, T)))


score_arrays = arrays(np.float64, (3, 5), elements=st.floats(-20, 20, allow_subnormal=False))
upstream_arrays = arrays(np.float64, (3, 5), elements=st.floats(-5, 5, allow_subnormal=False))
mask_arrays = arrays(np.bool_, (3, 5))


@given(score_arrays, upstream_arrays, mask_arrays, st.sampled_from([0.5, 1.0, 3.0]))
def test_softmax_backward_rows_sum_to_zero(S, dA, mask, T):
    """Each row of dL/dS sums to zero, and masked keys get exactly zero gradient."""
    A = softmax(jnp.asarray(S), jnp.asarray(mask), T)
    dS = to_np(softmax_backward(A, jnp.asarray(dA), T))
    scale = 1.0 + np.abs(dA).max() / T
    np.testing.assert_allclose(dS.sum(axis=-1), 0.0, atol=1e-13 * scale)
    assert np.all(dS[~mask] == 0.0)


# -- finite differences ---------------------------------------------------------------


def test_finite_difference_gradients_closed_form(rng):
    """Central differences of sum sin(x) x_0 recover cos(x) x_0 + sum sin(x) e_0."""
    x = rng.standard_normal((2, 3))
    f = lambda x: np.sum(np.sin(x)) * x[0, 0]  # noqa: E731
    want = np.cos(x) * x[0, 0]
    want[0, 0] += np.sum(np.sin(x))
    got = finite_difference_gradients(f, x, eps=1e-6)
    assert got.dtype == np.float64 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("spec", [dict(), dict(mask="holes", T=0.7, g="asym"),
                                  dict(qb=(2,), kb=(), mask="causal", T=1.5)],
                         ids=["plain", "mask_T_metric", "broadcast"])
def test_manual_backward_matches_finite_differences(spec, rng):
    """The manual gradients equal central differences of L = dL/dO^{ib} O^{ib}."""
    case = make_case(rng, n_q=2, n_k=3, d_k=2, d_v=2, **spec)
    grads = call(attention_backward, case)
    dO = jnp.asarray(case["dO"])
    m = None if case["mask"] is None else jnp.asarray(case["mask"])
    args = dict(Q=case["Q"], K=case["K"], V=case["V"], g=case["g"])

    def loss(**kw):
        O = scaled_dot_product_attention(kw["Q"], kw["K"], kw["V"], m, case["T"], kw["g"])
        return jnp.sum(dO * O)

    names = ["Q", "K", "V"] + (["g"] if case["g"] is not None else [])
    for n in names:
        fd = finite_difference_gradients(lambda x: loss(**{**args, n: x}), args[n])
        np.testing.assert_allclose(to_np(getattr(grads, "dL_d" + n)), fd,
                                   rtol=1e-7, atol=1e-8)


# -- verify_gradients and gradient_errors ---------------------------------------------

SEED_SNIPPET = """
from attn_tensors.gradients import verify_gradients
import jax.numpy as jnp

Q = jnp.array([[1., 0.], [0., 1.]])
K = jnp.array([[1., 0.], [0., 1.], [1., 1.]])
V = jnp.array([[2., 0.], [0., 2.], [1., 1.]])

results = verify_gradients(Q, K, V)
print(results)
"""
SEED_OUTPUT = {"dL_dQ": True, "dL_dK": True, "dL_dV": True, "all_correct": True}


def seed_qkv():
    Q = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    K = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    V = jnp.array([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    return Q, K, V


@pytest.mark.slow
def test_seed_snippet_prints_the_seed_dict_in_a_fresh_interpreter():
    """The README snippet, run as a user runs it (JAX float32), prints the seed dict."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"} | compile_cache_env()
    out = subprocess.run([sys.executable, "-c", SEED_SNIPPET], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == repr(SEED_OUTPUT)


@pytest.mark.parametrize("method", ["autodiff", "finite_difference", "both"])
def test_seed_snippet_in_float64(method):
    """The same check in float64 with each method: exactly the seed dict, Python bools."""
    results = verify_gradients(*seed_qkv(), method=method)
    assert results == SEED_OUTPUT
    assert list(results) == list(SEED_OUTPUT)
    assert all(type(v) is bool for v in results.values())


def test_verify_with_metric_adds_dL_dg_before_all_correct(rng):
    """With a metric g the dict gains dL_dg, placed just before all_correct."""
    case = make_case(rng, qb=(2,), mask="holes", T=1.4, g="asym")
    res = verify_gradients(case["Q"], case["K"], case["V"], case["dO"], case["mask"],
                           case["T"], case["g"], method="both")
    assert list(res) == ["dL_dQ", "dL_dK", "dL_dV", "dL_dg", "all_correct"]
    assert all(v is True for v in res.values())


def _score_gradient_without_row_sum(A, dL_dA, D, T):
    """The score gradient with the row-sum term D^i dropped (a classic slip)."""
    return A * dL_dA / T


@pytest.mark.parametrize("method", ["autodiff", "finite_difference", "both"])
def test_verify_detects_a_wrong_softmax_backward(method, monkeypatch):
    """With the row-sum term dropped, dL/dQ and dL/dK are flagged; dL/dV stays right."""
    monkeypatch.setattr(gr, "_score_gradient", _score_gradient_without_row_sum)
    res = verify_gradients(*seed_qkv(), method=method)
    assert res == {"dL_dQ": False, "dL_dK": False, "dL_dV": True, "all_correct": False}
    assert all(type(v) is bool for v in res.values())


def test_verify_detects_a_slightly_wrong_value_gradient(rng, monkeypatch):
    """A 1% error in dL/dV or dL/dg alone is caught and blamed on that gradient."""
    real = gr.attention_backward

    def wrong(*args, **kwargs):
        grads = real(*args, **kwargs)
        return grads._replace(dL_dV=grads.dL_dV * 1.01, dL_dg=grads.dL_dg * 0.99)

    monkeypatch.setattr(gr, "attention_backward", wrong)
    case = make_case(rng, g="asym")
    res = verify_gradients(case["Q"], case["K"], case["V"], case["dO"], g=case["g"])
    assert res == {"dL_dQ": True, "dL_dK": True, "dL_dV": False, "dL_dg": False,
                   "all_correct": False}


def test_gradient_errors_are_python_floats_and_small(rng, monkeypatch):
    """Errors are tiny for the derivation and large for a wrong one; Python floats."""
    case = make_case(rng, qb=(2,), mask="holes", T=0.8, g="asym")
    args = (case["Q"], case["K"], case["V"], case["dO"], case["mask"], case["T"], case["g"])
    for method in ("autodiff", "finite_difference"):
        err = gradient_errors(*args, method=method)
        assert list(err) == ["dL_dQ", "dL_dK", "dL_dV", "dL_dg"]
        for e in err.values():
            assert type(e["max_abs"]) is float and type(e["max_rel"]) is float
            assert e["max_rel"] < (1e-12 if method == "autodiff" else 1e-7)
    monkeypatch.setattr(gr, "_score_gradient", _score_gradient_without_row_sum)
    err = gradient_errors(*args)
    assert err["dL_dQ"]["max_rel"] > 1e-2 and err["dL_dV"]["max_abs"] < 1e-12


def test_bad_method_and_bad_shapes_raise(rng):
    """Unknown methods, a mis-shaped dL/dO and T <= 0 are reported, naming the index."""
    Q, K, V = seed_qkv()
    with pytest.raises(ValueError, match="method"):
        verify_gradients(Q, K, V, method="symbolic")
    with pytest.raises(ValueError, match="method"):
        gradient_errors(Q, K, V, method="both")
    with pytest.raises(AttentionInputError, match="index b must match"):
        attention_backward(Q, K, V, jnp.ones((2, 3)))
    with pytest.raises(AttentionInputError, match="batch axes"):
        attention_backward(Q, K, V, jnp.ones((4, 2, 2)))
    with pytest.raises(AttentionInputError, match="index j must match"):
        softmax_backward(jnp.ones((2, 3)) / 3, jnp.ones((2, 4)))
    with pytest.raises(AttentionInputError, match="temperature"):
        softmax_jacobian(jnp.ones((2, 3)) / 3, T=0.0)
    with pytest.raises(AttentionInputError, match="temperature"):
        attention_backward(Q, K, V, jnp.ones((2, 2)), T=-1.0)


# -- MLX: the same code on MLX arrays -------------------------------------------------

MLX_CASES = ["plain", "holes_mask", "metric_sym_T1.7", "batch_2x3_per_head_metric",
             "kv_unbatched_metric", "kv_broadcast_axis"]


@requires_mlx
@pytest.mark.mlx
@pytest.mark.parametrize("key", MLX_CASES)
@pytest.mark.parametrize("fn,jax_fn", [(attention_backward, jit_backward),
                                       (autodiff_gradients, jit_autodiff)],
                         ids=["attention_backward", "autodiff_gradients"])
def test_mlx_matches_jax_float64(fn, jax_fn, key, rng):
    """On MLX (float32) both the manual and the mx.vjp gradients equal the JAX float64 ones."""
    case = make_case(rng, **CASES[key])
    got = call(fn, case, "mlx")
    want = call(jax_fn, case, "jax")
    for field in FIELDS:
        assert type(getattr(got, field)).__module__.startswith("mlx")
        assert_close(getattr(got, field), getattr(want, field), "mlx")


@requires_mlx
@pytest.mark.mlx
@pytest.mark.parametrize("key", MLX_CASES)
def test_mlx_manual_matches_mlx_autodiff(key, rng):
    """On MLX, the derivation equals mx.vjp (through backend.vjp) at float32 tolerance."""
    case = make_case(rng, **CASES[key])
    manual = call(attention_backward, case, "mlx")
    auto = call(autodiff_gradients, case, "mlx")
    for field in FIELDS:
        assert_close(getattr(manual, field), getattr(auto, field), "mlx")


@requires_mlx
@pytest.mark.mlx
def test_mlx_parity_of_the_other_functions(rng):
    """softmax_jacobian, softmax_backward, attention_forward_backward, the reports on MLX."""
    case = make_case(rng, qb=(2,), mask="holes", T=0.7, g="asym")
    S = rng.standard_normal((2, 3, 4))
    dA = rng.standard_normal((2, 3, 4))
    for name in ("jax", "mlx"):
        m = to_backend(case["mask"], name)
        A = softmax(to_backend(S, name), m, 0.7)
        if name == "jax":
            ref = (softmax_jacobian(A, 0.7), softmax_backward(A, to_backend(dA, name), 0.7),
                   call(attention_forward_backward, case, name))
        else:
            assert_close(softmax_jacobian(A, 0.7), ref[0], "mlx")
            assert_close(softmax_backward(A, to_backend(dA, name), 0.7), ref[1], "mlx")
            O, grads = call(attention_forward_backward, case, name)
            assert_close(O, ref[2][0], "mlx")
            for field in FIELDS:
                assert_close(getattr(grads, field), getattr(ref[2][1], field), "mlx")
    mx_args = [to_backend(case[k], "mlx") for k in ("Q", "K", "V", "dO", "mask")]
    g = to_backend(case["g"], "mlx")
    res = verify_gradients(*mx_args, T=0.7, g=g, method="both")
    assert res == {"dL_dQ": True, "dL_dK": True, "dL_dV": True, "dL_dg": True,
                   "all_correct": True}
    err = gradient_errors(*mx_args, T=0.7, g=g)
    assert all(type(e["max_rel"]) is float and e["max_rel"] < 1e-5 for e in err.values())
