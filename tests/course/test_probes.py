"""The probes' value and gradient: the chain rule taken apart gives what autodiff of the whole gives.

``with_grad`` probes pull ``g``'s linearisation back with the loss's gradient
at ``g(x)`` (:func:`attn_course.specs._gen.value_and_grad_of`) instead of
differentiating ``loss(g(x))`` as one function.  Expected values here come from
``jax.value_and_grad`` of the whole composition, on the chapter-3 cases (dead
rows whose value is infinite, zero weights), for the reference, for the
classic mistakes (whose nan gradient must still come out nan), and for values
that are not floating-point arrays (which take the composition itself).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_course import values
from attn_course.registry import all_exercises
from attn_course.specs._gen import finite_sum, finite_sum_cotangent, value_and_grad_of
from attn_course.worker import resolve, to_backend

EXERCISES = ("3.1", "3.2", "3.3", "3.4")


def _mistaken_entropy(A, mask=None):
    # 0 log 0 guarded in the value only: the gradient at a zero weight is nan
    return -jnp.sum(jnp.where(A > 0, A * jnp.log(A), 0.0), axis=-1)


def _mistaken_free_energy(S, mask=None, T=1.0):
    # a masked row is -inf before the logsumexp: its value is +inf and its gradient nan
    s = S / T if mask is None else jnp.where(mask, S / T, -jnp.inf)
    return -T * jax.nn.logsumexp(s, axis=-1)


FUNCTIONS = {
    "reference": None,
    "mistaken": {"3.2": _mistaken_entropy, "3.3": _mistaken_free_energy},
    "integer": lambda first, **rest: (first > 0).astype(jnp.int32).sum(-1),
    "a list": lambda first, **rest: [first.sum(-1)],
}


def _whole(g, x):
    """``(g(x), d loss(g(x))/dx)`` by autodiff of the composition."""

    def f(x):
        value = g(x)
        return finite_sum(value), value

    (_, value), dx = jax.value_and_grad(f, has_aux=True)(x)
    return value, dx


def _encoded(pair):
    return values.encode(jax.tree_util.tree_map(np.asarray, {"value": pair[0], "grad": pair[1]}))


@pytest.mark.parametrize("ex_id, kind", [(e, k) for e in EXERCISES for k, fn in FUNCTIONS.items()
                                          if not isinstance(fn, dict) or e in fn])
def test_value_and_gradient_are_those_of_the_whole_composition(ex_id, kind):
    ex = all_exercises()[ex_id]
    fn = FUNCTIONS[kind]
    fn = (fn[ex_id] if isinstance(fn, dict) else fn) or resolve(ex.function)
    arg = next(iter(ex.make_cases(False)[0].inputs))  # the differentiated input comes first
    compared = raised = 0
    for case in ex.make_cases(False) + ex.make_cases(True, secret="probe-secret"):
        inputs = to_backend(case.inputs)

        def g(x, inputs=inputs):
            rest = {k: v for k, v in inputs.items() if k != arg}
            return fn(x, **rest) if kind in ("integer", "a list") else fn(**{**inputs, arg: x})

        try:
            want = _whole(g, inputs[arg])
        except Exception as err:  # noqa: BLE001 - a case that must raise raises the same either way
            with pytest.raises(type(err)):
                value_and_grad_of(g, inputs[arg], finite_sum)
            raised += 1
            continue
        got = value_and_grad_of(g, inputs[arg], finite_sum)
        assert _encoded(got) == _encoded(want), (ex_id, kind, case.name)
        compared += 1
    # a list is no value the loss takes: every case raises, as the composition does
    assert (compared, raised > 0) == (0, True) if kind == "a list" else compared >= 2


def test_the_mistakes_nan_gradient_still_shows():
    """The classic entropy mistake: its gradient at a zero weight is nan through either path."""
    A = jnp.asarray([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    value, dA = value_and_grad_of(_mistaken_entropy, A, finite_sum)
    assert np.isfinite(np.asarray(value)).all()
    assert np.isnan(np.asarray(dA)[0, 1])
    ref_value, ref_dA = value_and_grad_of(resolve(all_exercises()["3.2"].function), A, finite_sum)
    assert np.isfinite(np.asarray(ref_dA)).all()
    np.testing.assert_array_equal(np.asarray(value), np.asarray(ref_value))


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_the_closed_form_cotangent_is_autodiffs_gradient_of_the_loss(dtype):
    """finite_sum's gradient, w_n where the entry is finite and 0 elsewhere: bit for bit jax.grad's."""
    x = np.linspace(-3.0, 3.0, 24).reshape(2, 3, 4)
    x[0, 1] = np.inf
    x[1, 2, 1] = -np.inf
    x[1, 0, 3] = np.nan
    x = jnp.asarray(x, dtype=dtype)
    got, want = finite_sum_cotangent(x), jax.grad(finite_sum)(x)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert (np.asarray(got) == 0).sum() == 4 + 1 + 1  # the infinite row, the -inf and the nan
