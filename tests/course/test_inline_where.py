"""``jnp.where`` staged inline (attn_course.inline_where), and a worker's programs found in its cache.

Staged inline, a program has no nested ``_where`` calls left, and it
computes the same values to the last bit.

A program's cache key covers its text and how it is compiled: a worker must
stage and compile a job as the trusted side did when it filled the workers'
cache, or every reference archive compiles again.  The last test fills a
cache here, in a process whose XLA backend started long before (as the
grader's may have: a test session, a notebook), and runs the job in a fresh
process with a worker's environment: every program is read from the cache.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.numpy import util

from attn_course import ROOT
from attn_course.inline_where import inline_where
from attn_course.registry import all_exercises
from attn_course.sandbox import worker_env
from attn_course.worker import JobItem, as_graded, evaluate_job, resolve
from attn_course.xla_cache import compile_cache, worker_keys
from attn_tensors import statmech
from attn_tensors.softmax import softmax

SECRET = "inline-where-secret"
EXERCISE = "3.1"


def _programs():
    rng = np.random.default_rng(0)
    S = jnp.asarray(rng.standard_normal((2, 3, 5)))
    mask = jnp.asarray(rng.random((2, 3, 5)) < 0.7)
    mask = mask.at[0, 0].set(False)  # a dead row: where's both branches matter
    return [
        (lambda S: softmax(S, mask=mask, T=0.7), S),
        (jax.grad(lambda S: statmech.heat_capacity(S, mask=mask).sum()), S),
        (jax.value_and_grad(lambda S: statmech.free_energy(S, mask=mask, T=0.5).sum()), S),
    ]


def _nested_where(jaxpr) -> int:
    """How many nested calls named _where the program (and its sub-programs) holds."""
    n = 0
    for eqn in jaxpr.eqns:
        if eqn.params.get("name") == "_where":
            n += 1
        for p in eqn.params.values():
            for sub in p if isinstance(p, (list, tuple)) else [p]:
                sub = getattr(sub, "jaxpr", sub)  # a closed jaxpr's own
                if hasattr(sub, "eqns"):
                    n += _nested_where(sub)
    return n


def test_the_same_values_without_nested_calls(monkeypatch):
    assert inline_where()  # idempotent: the grader's evaluate_job made it inline already
    inline = util._where
    monkeypatch.setattr(util, "_where", jax.jit(inline._fun))  # JAX's own: a nested call
    staged = {}
    for mode in ("nested", "inline"):
        if mode == "inline":
            monkeypatch.setattr(util, "_where", inline)
        jax.clear_caches()
        staged[mode] = [(jax.make_jaxpr(f)(x), jax.tree_util.tree_leaves(jax.jit(f)(x))) for f, x in _programs()]
    for (nested, a), (flat, b) in zip(staged["nested"], staged["inline"], strict=True):
        assert _nested_where(nested.jaxpr) > 0  # the test sees JAX's nesting where there is one
        assert _nested_where(flat.jaxpr) == 0
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_without_the_private_function_nothing_changes(monkeypatch):
    monkeypatch.delattr(util, "_where")
    assert inline_where() is False
    assert not hasattr(util, "_where")


def test_a_second_call_does_not_wrap_again():
    assert inline_where() is True
    before = util._where
    assert inline_where() is True and util._where is before


WORKER = """
import json, logging, sys
from attn_course import worker
from attn_course.registry import all_exercises
from attn_course.worker import JobItem, evaluate_job, resolve
worker._setup_jax()
seen = []

class Seen(logging.Handler):
    def emit(self, record):
        words = {"Persistent compilation cache hit": "hit", "PERSISTENT COMPILATION CACHE MISS": "miss"}
        for start, verdict in words.items():
            if record.msg.startswith(start):
                seen.append((verdict, record.args[0]))

log = logging.getLogger("jax._src.compiler")
log.setLevel(logging.DEBUG)
log.addHandler(Seen())
ex = all_exercises()[sys.argv[1]]
cases = ex.make_cases(True, sys.argv[2])
item = JobItem(ex.id, ex.probe, [c.inputs for c in cases], [c.eager for c in cases])
evaluate_job([item], lambda ex_id: (worker.as_graded(resolve(ex.function)), None))
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_a_worker_reads_the_programs_the_trusted_side_compiled(tmp_path):
    cache = tmp_path / "worker-xla"
    ex = all_exercises()[EXERCISE]
    cases = ex.make_cases(True, SECRET)
    item = JobItem(ex.id, ex.probe, [c.inputs for c in cases], [c.eager for c in cases])
    jnp.ones(1).block_until_ready()  # this process's backend has started (and read its XLA_FLAGS)
    with compile_cache(cache), worker_keys():  # as runner.fill_worker_cache fills the workers' cache
        evaluate_job([item], lambda ex_id: (as_graded(resolve(ex.function)), None))
    assert any(p.name.startswith("jit_together-") for p in cache.iterdir())
    env = {**worker_env(str(tmp_path), cache), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", WORKER, EXERCISE, SECRET], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = [tuple(x) for x in json.loads(r.stdout.splitlines()[-1])]
    assert ("hit", "jit_together") in seen and ("miss", "jit_together") not in seen, seen  # the job's program
