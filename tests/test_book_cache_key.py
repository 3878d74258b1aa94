"""The book's cache key follows the attn_tensors modules each page uses."""

from __future__ import annotations

import pathlib
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
from library_cache_key import dependencies, library_key  # noqa: E402

sys.path.pop(0)


@pytest.fixture
def lib(tmp_path):
    """A copy of the library, so the test can edit modules."""
    shutil.copytree(ROOT / "attn_tensors", tmp_path / "attn_tensors", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_dependencies_follow_the_library_imports():
    deps = dependencies(ROOT, "from attn_tensors.attention import attention_weights\n")
    assert {"attn_tensors", "attn_tensors.attention", "attn_tensors.softmax", "attn_tensors.backend", "attn_tensors._checks", "attn_tensors.bilinear"} <= set(deps)
    assert dependencies(ROOT, "import numpy as np\n") == {}


def test_key_changes_only_with_used_modules(lib):
    page = "from attn_tensors.attention import scaled_dot_product_attention\n"
    key = library_key(lib, page)
    assert key and key == library_key(lib, page)
    deps = dependencies(lib, page)
    unused = next(p for p in (lib / "attn_tensors").glob("*.py") if f"attn_tensors.{p.stem}" not in deps)
    unused.write_text(unused.read_text() + "\n# edited\n")
    assert library_key(lib, page) == key
    (lib / "attn_tensors" / "softmax.py").write_text((lib / "attn_tensors" / "softmax.py").read_text() + "\n# edited\n")
    assert library_key(lib, page) != key


def test_attribute_use_counts_as_a_dependency():
    deps = dependencies(ROOT, "import attn_tensors\nattn_tensors.statmech.entropy\n")
    assert "attn_tensors.statmech" in deps
