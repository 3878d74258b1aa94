"""Solution regions in the reference library, and the stubs made from them.

A reference body is marked in one place, in the library source itself::

    def log_partition_function(S, mask=None, T=1.0):
        \"\"\"log Z^i = log sum_j exp(S^{ij}/T) ...\"\"\"
        xp = namespace(S, mask, T)
        ### BEGIN SOLUTION 3.1
        S = _scores(xp, S)
        return softmax_and_log_partition(S, mask, T, xp)[1]
        ### END SOLUTION

The marker names the exercise.  The student's copy of the module replaces the
lines between the markers (markers included) by one line at the same
indentation::

        raise NotImplementedError("Exercise 3.1: log_partition_function ...")

A region that shares a function with another exercise's code may name a
placeholder instead (``### BEGIN SOLUTION 5.4 stub: dL_dg = None``): the stub
then assigns it, marked ``# not implemented yet: Exercise 5.4``, so the
other exercise can be checked before this one is done.

so the signature, the index-notation docstring and any given lines outside the
region stay exactly as in the reference.  The same markers (without the
number) are nbgrader's, so the solution notebooks reuse the function source.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION (?P<id>\d+\.\d+)(?: stub: (?P<stub>.+?))?\s*$")
PLACEHOLDER = "# not implemented yet: Exercise "
END = re.compile(r"^[ \t]*### END SOLUTION\s*$")
STUB_PREFIX = "Exercise "


class RegionError(ValueError):
    """A solution region is malformed (unclosed, nested, outside a function)."""


@dataclass(frozen=True)
class Region:
    exercise: str  # "3.1"
    path: Path
    module: str  # "statmech"
    function: str  # the innermost enclosing def, e.g. "_weight_entropy"
    top: str  # the module-level def that contains it
    begin: int  # 1-based line of the BEGIN marker
    end: int  # 1-based line of the END marker
    indent: str
    stub: str = ""  # a placeholder statement instead of the raise


def stub_message(exercise: str, function: str, title: str) -> str:
    """The text of the NotImplementedError a stub raises (also parsed back)."""
    return (
        f"{STUB_PREFIX}{exercise}: implement {function} ({title}); "
        f"run `attn-course check {exercise}`"
    )


def exercise_of_stub(message: str) -> str | None:
    """The exercise id in a stub's NotImplementedError message, if it is one."""
    m = re.match(rf"{STUB_PREFIX}(\d+\.\d+): implement ", str(message))
    return m.group(1) if m else None


def _enclosing_functions(tree: ast.AST) -> list[tuple[int, int, str]]:
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.append((node.lineno, node.end_lineno or node.lineno, node.name))
    return spans


_FOUND: dict[tuple[str, str | None, str], list[Region]] = {}  # (path, module, text) -> its regions


def find_regions(path: Path, module: str | None = None) -> list[Region]:
    """Every solution region of one source file, checked for well-formedness.

    Parsed once per text of the file (building the notebooks asks for the
    library's regions once per exercise)."""
    path = Path(path)
    text = path.read_text()
    key = (str(path), module, text)
    if key not in _FOUND:
        if len(_FOUND) > 512:
            _FOUND.clear()
        _FOUND[key] = _find_regions(path, module, text)
    return list(_FOUND[key])


def _find_regions(path: Path, module: str | None, text: str) -> list[Region]:
    lines = text.splitlines()
    spans = _enclosing_functions(ast.parse(text, filename=str(path)))
    regions: list[Region] = []
    open_: tuple[int, re.Match] | None = None
    for n, line in enumerate(lines, start=1):
        b = BEGIN.match(line)
        if b:
            if open_ is not None:
                raise RegionError(f"{path}:{n}: BEGIN SOLUTION inside the region opened at line {open_[0]}")
            open_ = (n, b)
            continue
        if "BEGIN SOLUTION" in line:
            raise RegionError(f"{path}:{n}: write '### BEGIN SOLUTION <exercise id>', got {line.strip()!r}")
        if END.match(line):
            if open_ is None:
                raise RegionError(f"{path}:{n}: END SOLUTION without a BEGIN")
            start, b = open_
            inside = [s for s in spans if s[0] < start and n - 1 <= s[1]]
            if not inside:
                raise RegionError(f"{path}:{start}: a solution region must sit inside a function")
            func = max(inside, key=lambda s: s[0])[2]
            top = min(inside, key=lambda s: s[0])[2]
            regions.append(Region(b.group("id"), path, module or path.stem, func, top, start, n, b.group("indent"),
                                  b.group("stub") or ""))
            open_ = None
    if open_ is not None:
        raise RegionError(f"{path}:{open_[0]}: BEGIN SOLUTION is never closed")
    return regions


def library_regions(library: Path) -> list[Region]:
    """All regions of the library package, in file and line order."""
    found = []
    for path in sorted(Path(library).rglob("*.py")):
        rel = path.relative_to(library).with_suffix("")
        module = ".".join(rel.parts)
        found.extend(find_regions(path, module))
    return found


def stub_source(path: Path, titles: dict[str, tuple[str, str]]) -> str:
    """The student's version of one module: every region replaced by a raise.

    ``titles`` maps an exercise id to ``(public function, title)`` for the
    message.  A file without regions comes back unchanged.
    """
    path = Path(path)
    lines = path.read_text().splitlines(keepends=True)
    regions = find_regions(path)
    out: list[str] = []
    cursor = 0
    for r in regions:
        if r.exercise not in titles:
            raise RegionError(f"{path}:{r.begin}: exercise {r.exercise} is not in the registry")
        function, title = titles[r.exercise]
        out.extend(lines[cursor : r.begin - 1])
        msg = stub_message(r.exercise, function, title)
        if r.stub:
            out.append(f"{r.indent}# {msg}\n")
            out.append(f"{r.indent}{r.stub}  {PLACEHOLDER}{r.exercise}\n")
        else:
            out.append(f"{r.indent}raise NotImplementedError({msg!r})\n")
        cursor = r.end
    out.extend(lines[cursor:])
    return "".join(out)
