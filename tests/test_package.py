"""Package-level promises: every module loads, every public name is documented,
and only the backend adapter knows about MLX."""

from __future__ import annotations

import importlib
import inspect
import pathlib

import pytest

import attn_tensors

PKG = pathlib.Path(attn_tensors.__file__).parent
MODULES = sorted(m for m in attn_tensors._SUBMODULES if (PKG / f"{m}.py").exists())


def test_every_module_file_is_listed():
    files = {p.stem for p in PKG.glob("*.py") if not p.stem.startswith("_")}
    assert files <= set(attn_tensors._SUBMODULES)


@pytest.mark.parametrize("name", MODULES)
def test_public_names_exist_and_are_documented(name):
    mod = importlib.import_module(f"attn_tensors.{name}")
    top = getattr(attn_tensors, name)
    # `attn_tensors.softmax` is the function (re-exported); the module is attn_tensors.softmax in imports
    assert top is mod or (name == "softmax" and top is mod.softmax)
    for public in getattr(mod, "__all__", []):
        obj = getattr(mod, public)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), f"{name}.{public} has no docstring"


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        attn_tensors.no_such_thing  # noqa: B018


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: p.name)
def test_only_the_backend_imports_mlx(path):
    """One implementation for both frameworks: MLX is imported in backend.py alone."""
    if path.name == "backend.py":
        return
    text = path.read_text()
    assert "import mlx" not in text and "from mlx" not in text
