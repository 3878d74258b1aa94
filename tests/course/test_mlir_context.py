"""JAX's lowerings on one MLIR context per thread (attn_course.mlir_context) give the same programs.

The test suite's conftest shares the context; here each program of a few
library functions (values and gradients, masks, batch axes) is lowered once
on the shared context and once on a fresh context of JAX's own, and the two
modules must be the same text, so the same compilation-cache key and the
same executable.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.interpreters import mlir

from attn_course.mlir_context import share_mlir_context
from attn_tensors import statmech
from attn_tensors.softmax import softmax
from attn_tensors.attention import scaled_dot_product_attention


def _programs():
    rng = np.random.default_rng(0)
    S = jnp.asarray(rng.standard_normal((2, 3, 5)))
    mask = jnp.asarray(rng.random((2, 3, 5)) < 0.7)
    Q, K, V = (jnp.asarray(rng.standard_normal(s)) for s in ((3, 4), (5, 4), (5, 2)))
    return [
        (lambda S: softmax(S, mask=mask, T=0.7), (S,)),
        (jax.grad(lambda S: statmech.heat_capacity(S, mask=mask).sum()), (S,)),
        (jax.value_and_grad(lambda Q: scaled_dot_product_attention(Q, K, V).sum()), (Q,)),
    ]


def _values(lowered, args) -> list[np.ndarray]:
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(lowered.compile()(*args))]


def test_the_shared_context_lowers_the_same_modules():
    assert share_mlir_context()  # idempotent: the conftest made it shared already
    shared = mlir.make_ir_context
    assert shared.shared_per_thread and shared() is shared()
    for f, args in _programs():
        jax.clear_caches()  # each lowering below is done again, not read from JAX's in-memory caches
        on_shared = jax.jit(f).lower(*args)
        jax.clear_caches()
        made = []
        mlir.make_ir_context = lambda: made.append(shared.original()) or made[-1]  # JAX's own: one a call
        try:
            on_fresh = jax.jit(f).lower(*args)
        finally:
            mlir.make_ir_context = shared
        assert on_shared.compiler_ir().context is shared()
        assert made and on_fresh.compiler_ir().context is made[0] is not shared()  # lowered again, on its own
        assert on_shared.as_text() == on_fresh.as_text()
        for a, b in zip(_values(on_shared, args), _values(on_fresh, args), strict=True):
            np.testing.assert_array_equal(a, b)


def test_each_thread_has_its_own_context():
    share_mlir_context()
    seen = []
    t = threading.Thread(target=lambda: seen.append(mlir.make_ir_context()))
    t.start()
    t.join()
    assert seen[0] is not mlir.make_ir_context()


def test_without_the_private_function_nothing_changes(monkeypatch):
    monkeypatch.delattr(mlir, "make_ir_context")
    assert share_mlir_context() is False
    assert not hasattr(mlir, "make_ir_context")


def test_a_second_call_does_not_wrap_again():
    before = mlir.make_ir_context
    assert share_mlir_context() is True
    assert mlir.make_ir_context is before
