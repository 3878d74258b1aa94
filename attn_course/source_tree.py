"""The library's modules in a folder, found one way for every command that reads them.

``attn_tensors/**/*.py`` under a folder: what ``check`` runs, what ``submit``
packs and what the grader overlays on a submission (the release and the
reference are read the same way).  The walk never follows a link to a
folder (a link to ``/`` would walk the whole machine, and a loop would never
end) and lists, beside the modules, the links that lead out of the folder:
``submit`` refuses them by name rather than send a file from elsewhere on
the student's machine.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "attn_tensors"


@dataclass(frozen=True)
class Tree:
    """``modules``: relative paths of the modules, sorted (regular files, links to files inside
    the folder, and links that lead nowhere, which a reader then reports as unreadable);
    ``links``: relative paths of the links that are not read, sorted: links to folders, and
    links to files outside the folder."""

    modules: list[Path]
    links: list[Path]


def _kind(path: Path, root: Path) -> str:
    """``module``, ``link`` (a link to a folder, or out of ``root``) or ``skip`` (a folder, a pipe...)."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return "module"  # gone or unreadable: the reader names it
    if not stat.S_ISLNK(mode):
        return "module" if stat.S_ISREG(mode) else "skip"
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):  # a link that leads nowhere, or a loop of links
        return "module"
    if target.is_dir():
        return "link"
    if not target.is_relative_to(root.resolve()):
        return "link"
    return "module" if target.is_file() else "skip"


def walk(folder: Path | str, top: str = PACKAGE, suffix: str = ".py", recurse: bool = True) -> Tree:
    """The ``*suffix`` files under ``folder/top`` (``__pycache__`` left out), links not followed into folders."""
    root = Path(folder)
    base = root / top
    modules: list[Path] = []
    links: list[Path] = []
    if not base.is_dir():
        return Tree([], [])
    for here, dirs, files in os.walk(base, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__") if recurse else []
        where = Path(here)
        for name in dirs + files:
            path = where / name
            if name in dirs and not path.is_symlink():
                continue
            if name in files and not name.endswith(suffix):
                continue
            kind = _kind(path, root)
            if kind == "module" and name in files:
                modules.append(path.relative_to(root))
            elif kind == "link":
                links.append(path.relative_to(root))
        if not recurse:
            break
    return Tree(sorted(modules), sorted(links))
