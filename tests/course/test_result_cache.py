"""The trusted side's caches: results kept on disk between processes, and JAX's compilation cache.

A result read back is the very data a computation gives; anything it
depends on (its parts, the sources, the versions) names another file; no
variable, nothing kept; two processes asking at once compute it once.  A
compilation-cache folder chosen after the first compilation is the one used.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from attn_course import result_cache, values
from attn_course.registry import all_exercises
from attn_course.runner import reference_results


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "results"
    monkeypatch.setenv(result_cache.ENV, str(folder))
    return folder


def test_a_result_read_back_is_the_computed_one(cache):
    ex = all_exercises()["3.1"]
    cases = ex.make_cases(False)
    first = reference_results(ex, cases)
    assert len(list(cache.glob("reference-*.json"))) == 1
    calls = []

    def boom():
        calls.append(1)
        raise AssertionError("computed again")

    parts = [ex.id, ex.function, result_cache.cases_digest(cases)]
    assert result_cache.cached("reference", parts, boom) is not None and not calls
    again = reference_results(ex, cases)
    assert len(again) == len(first) == len(cases)
    for a, b in zip(first, again):
        assert a.status == b.status
        assert values.dumps(a.value) == values.dumps(b.value)  # bit for bit, NaN and inf included
    assert any(a.status == "ok" for a in first)


def test_what_a_result_depends_on_names_another_file(cache, tmp_path):
    n = []

    def compute():
        n.append(1)
        return {"x": len(n)}

    assert result_cache.cached("k", ["a"], compute) == {"x": 1}
    assert result_cache.cached("k", ["a"], compute) == {"x": 1}
    assert result_cache.cached("k", ["b"], compute) == {"x": 2}
    assert result_cache.cached("other", ["a"], compute) == {"x": 3}
    ex = all_exercises()["3.1"]
    public, hidden = ex.make_cases(False), ex.make_cases(True, "some secret")
    assert result_cache.cases_digest(public) != result_cache.cases_digest(hidden)
    moved = [type(c)(c.name, {**c.inputs}, c.note, not c.eager) for c in public]
    assert result_cache.cases_digest(moved) != result_cache.cases_digest(public)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("x = 1\n")
    before = result_cache.source_digest(pkg)
    (pkg / "m.py").write_text("x = 2\n")
    assert result_cache.source_digest(pkg) != before
    # a file that is not what it claims to be is not used
    (path,) = [p for p in cache.glob("k-*.json") if json.loads(p.read_text())["value"] == {"x": 1}]
    path.write_text(json.dumps({"key": "another", "value": {"x": 99}}))
    assert result_cache.cached("k", ["a"], compute) == {"x": 4}
    assert oct(cache.stat().st_mode & 0o777) == "0o700"


def test_no_variable_no_files(tmp_path, monkeypatch):
    monkeypatch.delenv(result_cache.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert result_cache.folder() is None
    assert result_cache.cached("k", ["a"], lambda: {"v": [1.5, "nan"]}) == {"v": [1.5, "nan"]}
    assert not list(tmp_path.iterdir())


def test_two_processes_compute_a_result_once(cache, tmp_path):
    log = tmp_path / "computed"
    code = textwrap.dedent(f"""
        import os, time
        from attn_course import result_cache
        def compute():
            with open({str(log)!r}, "a") as f:
                f.write("x")
            time.sleep(1.0)
            return [os.getpid() * 0 + 7]
        print(result_cache.cached("slow", ["same"], compute))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert outs == ["[7]\n", "[7]\n"] and all(p.returncode == 0 for p in procs)
    assert log.read_text() == "x"


def test_a_compilation_cache_chosen_later_is_used(tmp_path):
    """JAX opens its persistent cache once; switching folders (as the grader does to fill the
    workers' cache, then back) takes effect, and the folder before comes back after the block."""
    import jax
    import jax.numpy as jnp

    from attn_course.xla_cache import compile_cache

    before = jax.config.jax_compilation_cache_dir
    jax.jit(lambda x: x * 2.5 + 1)(jnp.ones(3))  # the process's cache is open
    folder = tmp_path / "other"
    salt = float(np.random.default_rng().integers(1, 10**6))
    with compile_cache(folder):
        jax.jit(lambda x: x * salt - 3)(jnp.ones(5)).block_until_ready()
    assert list(folder.iterdir()), "the program went to the folder in use before"
    assert jax.config.jax_compilation_cache_dir == before
    n = len(list(folder.iterdir()))
    jax.jit(lambda x: x / salt + 4)(jnp.ones(6)).block_until_ready()
    assert len(list(folder.iterdir())) == n


def test_every_module_that_computes_a_result_is_in_its_key():
    """The modules that the worker, the specs and the catalogue import from attn_course (what
    evaluates the reference and the catalogue; the callers runner.py and diagnose.py only encode
    its output) are all digested into a result's key: an edit to one computes the results again."""
    import ast
    from pathlib import Path

    import attn_course

    course = Path(attn_course.__file__).parent
    listed = result_cache.computing_sources()
    covered = {p.resolve() for name in listed for p in ([course / name] if name.endswith(".py")
                                                       else (course / name).rglob("*.py"))}
    assert {"worker.py", "values.py", "specs", "mistakes", "runner.py", "diagnose.py"} <= set(listed)
    callers = {(course / name).resolve() for name in ("runner.py", "diagnose.py", "result_cache.py")}
    todo, seen = [p for p in covered - callers], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                names = [node.module] if node.module else [a.name for a in node.names]
                for name in names:
                    target = base.joinpath(*name.split("."))
                    for cand in (target.with_suffix(".py"), target / "__init__.py"):
                        if cand.exists() and course in cand.resolve().parents:
                            todo.append(cand.resolve())
    lazy_trusted = {"identity.py"}  # registry's secret(): it only picks the hidden cases, whose inputs are keyed
    missing = sorted(str(p.relative_to(course)) for p in seen - covered if p.name not in lazy_trusted)
    assert not missing, missing


def test_the_reference_side_of_validation_is_kept_and_read_back_whole(cache):
    """validate's reference job (a worker's run of the repository's library) is run once per
    key; read back, it grades as computed, outcome by outcome."""
    from attn_course import validate

    ex = all_exercises()["3.2"]
    data = validate.cases_and_expected([ex])
    first = validate.run_side(validate.ROOT, [ex], data)
    assert len(list(cache.glob("reference-side-*.json"))) == 1
    server = validate._side_server()
    try:
        again = validate.run_side(validate.ROOT, [ex], data, server=server)
        assert server.starts == 0  # read back: no worker ran
    finally:
        server.close()
    assert again == first and first[ex.id].passed
