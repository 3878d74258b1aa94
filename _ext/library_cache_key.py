"""Re-execute a chapter when the attn_tensors code it uses changes.

Jupyter Book 1 caches executed notebooks by their code cells alone, and
Sphinx re-reads a page only when its own file changes.  So an edit to
``attn_tensors`` would leave every chapter showing outputs of the old library.

This extension closes that gap for each page:

1. It finds which ``attn_tensors`` modules the page imports, and follows the
   library's own imports to the full set of modules the page depends on.
2. It hashes their sources (the *library key*).
3. ``env-get-outdated``: a page whose library key changed is read again.
4. ``source-read``: the key is appended to the page as a hidden code cell, so
   jupyter-cache sees changed code and executes the notebook again.

A page that imports nothing from ``attn_tensors`` is untouched, and a change to
one module re-executes only the pages that depend on it.
"""

from __future__ import annotations

import ast
import hashlib
import pathlib
import re

PACKAGE = "attn_tensors"
IMPORT_RE = re.compile(rf"\b({PACKAGE}(?:\.\w+)*)")
MARK = "attn_tensors library key"


def _module_path(root: pathlib.Path, dotted: str) -> pathlib.Path | None:
    parts = dotted.split(".")
    base = root.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _imports_of(path: pathlib.Path, dotted: str) -> set[str]:
    """Dotted names of attn_tensors modules that this module imports."""
    tree = ast.parse(path.read_text())
    package = dotted if path.name == "__init__.py" else dotted.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != PACKAGE:
                continue
            found.add(mod)
            for alias in node.names:  # `from . import statmech`
                found.add(f"{mod}.{alias.name}")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
    return found


def dependencies(root: pathlib.Path, text: str) -> dict[str, pathlib.Path]:
    """Every attn_tensors module the page's imports reach, by dotted name."""
    todo = set()
    for match in IMPORT_RE.findall(text):  # attn_tensors.statmech.entropy ->
        parts = match.split(".")  # every prefix that is a module counts
        todo.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    if todo:
        todo.add(PACKAGE)  # importing a submodule runs the package's __init__
    seen: dict[str, pathlib.Path] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_path(root, name)
        if path is None:  # a name imported from a module, not a module
            continue
        seen[name] = path
        todo |= _imports_of(path, name) - set(seen)
    return seen


def library_key(root: pathlib.Path, text: str) -> str:
    deps = dependencies(root, text)
    if not deps:
        return ""
    h = hashlib.sha256()
    for name in sorted(deps):
        h.update(name.encode())
        h.update(deps[name].read_bytes())
    return h.hexdigest()[:16]


def _key_for(app, docname: str) -> str:
    path = pathlib.Path(app.env.doc2path(docname))
    if not path.is_file() or path.suffix not in (".md", ".ipynb"):
        return ""
    return library_key(pathlib.Path(app.srcdir), path.read_text())


def _outdated(app, env, added, changed, removed):
    stored = getattr(env, "attn_library_keys", {})
    stale = []
    for docname in env.found_docs - added - changed:
        if stored.get(docname, "") != _key_for(app, docname):
            stale.append(docname)
    return stale


def _source_read(app, docname, source):
    key = _key_for(app, docname)
    if not hasattr(app.env, "attn_library_keys"):
        app.env.attn_library_keys = {}
    app.env.attn_library_keys[docname] = key
    text = source[0]
    if key and "{code-cell}" in text:
        source[0] = (
            text.rstrip("\n")
            + "\n\n```{code-cell} ipython3\n:tags: [remove-cell]\n\n"
            + f"# {MARK}: {key}\n```\n"
        )


def _merge(app, env, docnames, other):
    env.attn_library_keys = getattr(env, "attn_library_keys", {})
    env.attn_library_keys.update(
        {d: k for d, k in getattr(other, "attn_library_keys", {}).items() if d in docnames}
    )


def _purge(app, env, docname):
    getattr(env, "attn_library_keys", {}).pop(docname, None)


def setup(app):
    app.connect("env-get-outdated", _outdated)
    app.connect("source-read", _source_read)
    app.connect("env-merge-info", _merge)
    app.connect("env-purge-doc", _purge)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
