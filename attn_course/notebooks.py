"""The nbgrader source notebooks, one per chapter, made from the library source.

``solutions/chNN/chNN.ipynb`` is the instructor's nbgrader source: for each
exercise of chapter N a statement (markdown), an import cell, the answer cell
(the reference function(s) with nbgrader's ``### BEGIN SOLUTION`` markers,
taken from the library source, so there is one copy of every solution), and
an autograder test cell (public cases, plus hidden ones between nbgrader's
``### BEGIN HIDDEN TESTS`` markers).  ``nbgrader generate_assignment chNN``
turns it into the student version in ``exercises/chNN/``.
"""

from __future__ import annotations

import ast
import builtins
import json
import re
from pathlib import Path

from .quick_imports import skip_iri_parsers

skip_iri_parsers()  # before nbformat: 1.8 s of parsers it never uses

import nbformat  # noqa: E402

from . import LIBRARY, ROOT, SOLUTIONS
from .regions import BEGIN, END, library_regions
from .registry import CHAPTERS, Exercise, all_exercises

KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def _meta(grade_id: str, *, solution=False, grade=False, locked=True, points=None) -> dict:
    m = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
         "solution": solution, "task": False}
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def _functions(module_path: Path) -> dict[str, ast.FunctionDef]:
    """The module-level functions of a library file, by name."""
    tree = ast.parse(module_path.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def answer_source(ex: Exercise) -> tuple[str, list[str], str]:
    """(cell source, names defined, module) for an exercise's answer cell.

    The cell holds the exercise's function and every module-level function
    with one of its solution regions (a helper first), copied from the library.
    """
    owner = ex.owner
    module_path = LIBRARY / (ex.module.replace(".", "/") + ".py")
    funcs = _functions(module_path)
    text = module_path.read_text().splitlines(keepends=True)
    regions = [r for r in library_regions(LIBRARY) if r.path == module_path]
    ends: dict[str, int] = {}  # a region's END marker may follow the function's last statement
    for r in regions:
        ends[r.top] = max(ends.get(r.top, 0), r.end)
    helpers = [r.top for r in regions if r.exercise == owner and r.top != ex.name]
    names = list(dict.fromkeys(helpers + [ex.name]))
    parts = []
    for name in names:
        node = funcs[name]
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        end = max(node.end_lineno, ends.get(name, 0))
        parts.append(_only_regions("".join(text[start - 1 : end]), owner))
    return "\n\n".join(parts), names, ex.module


def _only_regions(src: str, owner: str) -> str:
    """This exercise's regions as nbgrader solution markers; other regions' markers dropped."""
    out, stack = [], []
    for line in src.splitlines(keepends=True):
        b = BEGIN.match(line.rstrip("\n"))
        if b:
            stack.append(b.group("id") == owner)
            if stack[-1]:
                out.append(f"{b.group('indent')}### BEGIN SOLUTION\n")
        elif END.match(line) and stack:
            if stack.pop():
                out.append(line)
        else:
            out.append(line)
    return "".join(out)


def free_names(source: str, defined: list[str]) -> list[str]:
    """Module-level names a cell uses but does not define (to import from the module)."""
    tree = ast.parse(source)
    used, bound = set(), set(defined)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)):
            args = node.args
            for a in args.args + args.kwonlyargs + args.posonlyargs:
                bound.add(a.arg)
            if args.vararg:
                bound.add(args.vararg.arg)
            if args.kwarg:
                bound.add(args.kwarg.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.comprehension):
            for n in ast.walk(node.target):
                if isinstance(n, ast.Name):
                    bound.add(n.id)
    return sorted(n for n in used - set(defined) if not hasattr(builtins, n) and n not in bound)


def module_globals(module: str, names: list[str]) -> list[str]:
    """The names that the library module really defines (locals and builtins drop out)."""
    import importlib

    mod = importlib.import_module(f"attn_tensors.{module}")
    return [n for n in names if hasattr(mod, n)]


def _statement(ex: Exercise) -> str:
    """The exercise text from the book (the exercise directive's body)."""
    page = ROOT / "chapters" / f"{CHAPTERS[ex.chapter][0]}.md"
    text = page.read_text()
    m = re.search(rf"(`{{3,}}){{exercise}}[^\n]*\n:label: {re.escape(ex.label)}\n(.*?)\n\1\n", text, re.S)
    body = m.group(2).strip() if m else ""
    body = re.sub(r"\n*Graded exercise [^\n]*$", "", body).strip()
    # MyST roles do not render in Jupyter: keep their text
    body = re.sub(r"\{(?:prf:ref|ref|eq|numref)\}`([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", body)
    return body


def chapter_notebook(ch: int, exercises: dict[str, Exercise]) -> nbformat.NotebookNode:
    stem, title = CHAPTERS[ch]
    chosen = [e for e in exercises.values() if e.chapter == ch]
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": KERNEL, "language_info": {"name": "python"}}
    cells = [
        nbformat.v4.new_markdown_cell(
            f"# Chapter {ch}: {title} — graded exercises\n\n"
            f"Write each function in its answer cell (replace `raise NotImplementedError()`), "
            f"then run the test cell below it. The statements are the book's "
            f"(`chapters/{stem}.md`, exercises {', '.join(e.id for e in chosen)}); "
            "the test cells check the public cases, and the grader adds hidden ones.",
            metadata=_meta(f"ch{ch:02d}-intro")),
        nbformat.v4.new_code_cell(
            "import jax\n\njax.config.update(\"jax_enable_x64\", True)  # the cases are float64\n\n"
            "from attn_course.nbcheck import check, use_workspace\n\n"
            "use_workspace()  # attn_tensors from your workspace (the folder above notebooks/), not an installed copy",
            metadata=_meta(f"ch{ch:02d}-setup")),
    ]
    for e in chosen:
        src, names, module = answer_source(e)
        imports = module_globals(module, free_names(src, names))
        gid = e.label
        cells.append(nbformat.v4.new_markdown_cell(
            f"## Exercise {e.id}: {e.title} ({e.points} points)\n\n{_statement(e)}\n\n"
            f"In the book: chapter {ch}, Exercise {e.id} (`{stem}.html#{e.label}`).",
            metadata=_meta(f"{gid}-statement")))
        if imports:
            cells.append(nbformat.v4.new_code_cell(
                f"from attn_tensors.{module} import (\n" + "".join(f"    {n},\n" for n in imports) + ")",
                metadata=_meta(f"{gid}-imports")))
        cells.append(nbformat.v4.new_code_cell(src.rstrip() + "\n", metadata=_meta(f"{gid}-answer", solution=True, locked=False)))
        cells.append(nbformat.v4.new_code_cell(
            f'check("{e.id}", {e.name})\n'
            "### BEGIN HIDDEN TESTS\n"
            "from attn_course.nbcheck import check_hidden\n\n"
            f'check_hidden("{e.id}", {e.name})\n'
            "### END HIDDEN TESTS",
            metadata=_meta(f"{gid}-tests", grade=True, points=e.points)))
    nb.cells = cells
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{cell.metadata['nbgrader']['grade_id']}"
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}},
                   record_timing=False).execute()
    for cell in nb.cells:  # one stream output per name: how prints were chunked is timing, not content
        merged = []
        for out in cell.get("outputs", []):
            if (merged and out.get("output_type") == "stream" and merged[-1].get("output_type") == "stream"
                    and merged[-1].get("name") == out.get("name")):
                merged[-1]["text"] += out["text"]
            else:
                merged.append(out)
        if "outputs" in cell:
            cell["outputs"] = merged
    return nb


def write_solutions(execute_cells: bool = True, dest: Path | None = None, chapters=None) -> list[Path]:
    dest = Path(dest or SOLUTIONS)
    exercises = all_exercises()
    written = []
    for ch in chapters or CHAPTERS:
        if not any(e.chapter == ch for e in exercises.values()):
            continue
        nb = chapter_notebook(ch, exercises)
        folder = dest / f"ch{ch:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        if execute_cells:
            execute(nb, folder)
        path = folder / f"ch{ch:02d}.ipynb"
        nbformat.write(nb, str(path))
        written.append(path)
    return written


def sources(path: Path) -> list[tuple[str, str, str]]:
    """(cell type, id, source) of a notebook: what must match between builds."""
    nb = json.loads(Path(path).read_text())
    return [(c["cell_type"], c.get("id", ""), "".join(c["source"])) for c in nb["cells"]]
