"""Serve MathJax from the book itself, so the HTML shows mathematics offline.

It also leaves out sphinx-thebe's scripts, which Jupyter Book always adds:
thebe runs code on a remote Binder (impossible offline), its configuration
script is added twice (a JavaScript error on every page), and this book has
no launch buttons.

MathJax 3 comes from the PyPI package ``django-static-mathjax`` (plain static
files; nothing of Django is imported).  At the end of an HTML build the
``tex-chtml`` bundle, its fonts and its TeX extensions are copied into
``_static/mathjax`` and ``mathjax_path`` points there.
"""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

BUNDLE = "tex-chtml.js"
# What tex-chtml.js loads on demand: fonts, TeX extensions, menu, a11y.
FOLDERS = ("output", "input", "a11y", "ui", "adaptors", "core")


def mathjax_es5() -> pathlib.Path:
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "MathJax for offline use is missing: pip install django-static-mathjax "
            "(it is in the book's dependencies; run `make book`)"
        )
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    es5 = root / "static" / "mathjax" / "es5"
    if not (es5 / BUNDLE).is_file():
        raise RuntimeError(f"no {BUNDLE} under {es5}")
    return es5


def _copy(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    src = mathjax_es5()
    dest = pathlib.Path(app.outdir) / "_static" / "mathjax"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / BUNDLE, dest / BUNDLE)
    for folder in FOLDERS:
        if (src / folder).is_dir():
            shutil.copytree(src / folder, dest / folder, dirs_exist_ok=True)


def _drop_thebe(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return

    def is_thebe(js) -> bool:
        name = str(getattr(js, "filename", js) or "")
        body = str(getattr(js, "attributes", {}).get("body", ""))
        return "thebe" in name or "THEBE" in body or "thebe" in body

    context["script_files"] = [js for js in scripts if not is_thebe(js)]


def setup(app):
    mathjax_es5()  # fail early with a clear message
    app.config.mathjax_path = f"mathjax/{BUNDLE}"
    app.connect("build-finished", _copy)
    app.connect("html-page-context", _drop_thebe)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
