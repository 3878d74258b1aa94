"""The seed documents' attn_tensors snippets run as printed, in a fresh interpreter.

Each snippet runs in its own process with JAX's defaults (float32, no x64),
exactly as a reader would paste it (with the suite's compilation cache, which
changes how fast programs are had, not what they compute).  A ``print(...)  # expected`` line must
print what its comment says.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from conftest import compile_cache_env

HERE = pathlib.Path(__file__).parent / "seed_snippets"
SEEDS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "seeds"
SNIPPETS = sorted(HERE.glob("seed*.py"))


def expected_prints(code: str) -> list[str]:
    """The comments after ``print(...)`` lines: what the document says is printed."""
    out = []
    for line in code.splitlines():
        if line.startswith("print(") and "#" in line:
            out.append(line.split("#", 1)[1].strip())
    return out


def test_there_are_snippets():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("path", SNIPPETS, ids=[p.name for p in SNIPPETS])
def test_snippet_runs_as_printed(path):
    code = path.read_text()
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", **compile_cache_env()}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    printed = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    assert printed == expected_prints(code)


@pytest.mark.skipif(not SEEDS.is_dir(), reason="seed documents not beside this checkout")
def test_committed_snippets_match_the_seeds():
    """The copies in tests/seed_snippets are what the seed documents print today."""
    sys.path.insert(0, str(HERE))
    try:
        from extract import snippets
    finally:
        sys.path.pop(0)
    found = snippets(SEEDS)
    assert sorted(found) == [p.name for p in SNIPPETS]
    for name, code in found.items():
        assert (HERE / name).read_text() == code, name
