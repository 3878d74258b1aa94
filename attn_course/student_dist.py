"""The student distribution: the course tools and the release, never the reference.

``attn-course student-dist OUT`` (instructors) writes one wheel,
``OUT/attn_course_student-VERSION-py3-none-any.whl``, that a student installs
with pip instead of cloning the course::

    pip install attn_course_student-0.1.0-py3-none-any.whl
    attn-course workspace ~/attn-work --student ID --token TOKEN

It holds only what a student's commands need:

* the modules that ``attn-course workspace``, ``check``, ``submit`` and ``list``
  import (found by following their imports, lazy ones included), and
* the release (``exercises/``: the stubbed library, the public cases and the
  student notebooks) as package data, ``attn_course/release_data/``.

The reference library ``attn_tensors``, the solution notebooks, the grader
and the mistakes catalogue are never in it; :func:`build` refuses to write a
wheel whose modules would import any of them, and refuses one where a
solution region of the reference survives in the release.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import EXERCISES, PACKAGED_RELEASE, ROOT

DIST = "attn_course_student"

STUDENT_COMMANDS = ("cli", "workspace", "check", "worker")
"""The modules a student's commands start from (the worker runs their code)."""

NEVER_SHIPPED = ("attn_course.mistakes", "attn_course.grade", "attn_course.release",
                 "attn_course.validate", "attn_course.nbgrader_bridge", "attn_course.student_dist",
                 "attn_course.dask_pool", "attn_course.similarity", "attn_course.late", "attn_course.exports",
                 "attn_course.class_stats")
"""Trusted-side modules: the catalogue of wrong implementations, grading, the release builder."""

REQUIRES = ("jax>=0.4.30", "numpy>=1.26", "pytest>=8", "jupyterlab>=4", "nbgrader==0.9.6")


class StudentDistError(RuntimeError):
    """The wheel would ship something a student must not get (the message says what)."""


@dataclass(frozen=True)
class StudentDist:
    wheel: Path
    modules: tuple[str, ...]  # attn_course modules inside, dotted
    release_files: int


def _module_file(name: str) -> Path | None:
    """attn_course.x.y -> its source file in this checkout (None outside attn_course)."""
    if not name.startswith("attn_course"):
        return None
    parts = name.split(".")
    base = ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _imports(name: str, path: Path) -> set[str]:
    """Every attn_course module ``path`` imports, at top level or inside functions."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("attn_course"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("attn_course"):
                continue
            found.add(mod)
            for a in node.names:  # `from . import workspace` names a module
                if _module_file(f"{mod}.{a.name}") is not None:
                    found.add(f"{mod}.{a.name}")
    return found


LAZY_TRUSTED = ("attn_course.cli", "attn_course.diagnose")
"""Student modules that may import trusted-side modules inside functions only: ``cli`` in the
instructors' subcommands, ``diagnose`` where it is called without the shipped outputs (the
grader; ``check`` always passes them, and tests/course/test_check.py runs it with the
catalogue blocked)."""


def _lazy_only(path: Path, module: str) -> bool:
    """True when ``path`` imports ``module`` only inside function bodies."""
    tree = ast.parse(path.read_text(), str(path))
    leaf = module.rsplit(".", 1)[-1]
    for node in tree.body:  # top-level statements (an `if` or `try` at top level counts as top level)
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                break
            if isinstance(sub, ast.ImportFrom) and (leaf == (sub.module or "").rsplit(".", 1)[-1]
                                                    or any(a.name == leaf for a in sub.names)):
                return False
            if isinstance(sub, ast.Import) and any(a.name == module for a in sub.names):
                return False
    return True


def _trusted(name: str) -> bool:
    return any(name == b or name.startswith(b + ".") for b in NEVER_SHIPPED)


def student_modules(roots: tuple[str, ...] = STUDENT_COMMANDS) -> tuple[str, ...]:
    """The import closure of the student's commands (and every spec module, which the worker loads by name)."""
    todo = [f"attn_course.{r}" for r in roots] + ["attn_course", "attn_course.specs"]
    specs = ROOT / "attn_course" / "specs"
    todo += [f"attn_course.specs.{p.stem}" for p in sorted(specs.glob("*.py")) if p.stem != "__init__"]
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        for parent in range(1, name.count(".") + 1):  # a package's __init__ comes with its modules
            todo.append(name.rsplit(".", parent)[0])
        found = _imports(name, path)
        if name in LAZY_TRUSTED:  # imported only inside functions a student never reaches: left out
            found = {m for m in found if not (_trusted(m) and _lazy_only(path, m))}
        todo.extend(found)
    bad = sorted(n for n in seen if _trusted(n))
    if bad:
        raise StudentDistError(
            f"the student's commands import trusted-side modules {bad}: the wheel would ship them "
            "(a student must get their outputs as data, never their source)")
    return tuple(sorted(seen))


def _release_files() -> list[Path]:
    files = sorted(p for p in EXERCISES.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and not p.name.startswith("."))
    for p in files:
        if p.suffix in (".py", ".ipynb") and "### BEGIN SOLUTION" in p.read_text(errors="replace"):
            raise StudentDistError(f"{p.relative_to(ROOT)} still holds a solution region: run `make release`")
    return files


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(out: Path) -> StudentDist:
    """Write the wheel into ``out`` (a new file; an existing one is never overwritten)."""
    from .workspace import library_version

    version = library_version()
    modules = student_modules()
    wheel = Path(out) / f"{DIST}-{version}-py3-none-any.whl"
    if wheel.exists():
        raise StudentDistError(f"{wheel} exists: remove it or give another --out")
    entries: dict[str, bytes] = {}
    for name in modules:
        path = _module_file(name)
        entries[str(path.relative_to(ROOT))] = path.read_bytes()
    release = _release_files()
    for p in release:
        entries[f"attn_course/{PACKAGED_RELEASE.name}/{p.relative_to(EXERCISES)}"] = p.read_bytes()
    info = f"{DIST}-{version}.dist-info"
    entries[f"{info}/METADATA"] = (
        "Metadata-Version: 2.1\n"
        f"Name: {DIST.replace('_', '-')}\n"
        f"Version: {version}\n"
        "Summary: Attention as Bilinear Form: the student's course tools (workspace, check, submit)\n"
        "Requires-Python: >=3.11\n"
        + "".join(f"Requires-Dist: {r}\n" for r in REQUIRES)
    ).encode()
    entries[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: attn-course student-dist\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ).encode()
    entries[f"{info}/entry_points.txt"] = b"[console_scripts]\nattn-course = attn_course.cli:main\n"
    record = [_record_line(n, d) for n, d in entries.items()] + [f"{info}/RECORD,,"]
    entries[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    Path(out).mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data,
                       compress_type=zipfile.ZIP_DEFLATED)
    tmp = wheel.with_suffix(".part")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(wheel)
    return StudentDist(wheel, modules, len(release))
