"""The grading folder's generated files, written so that an instructor's edit is never lost.

Each run writes the gradebook, the exports, the feedback, the report and the
histograms again.  An instructor edits some of them (a comment in a
student's feedback, a corrected row of the Canvas export): a rerun restored
the generated version silently.  :class:`Outputs` records the SHA-256 of what
it wrote (``GRADING/.written.json``); a file that is no longer what was
written is the instructor's, kept as it is, and the run writes its own version
beside it (``gradebook.csv.new``) and says so, unless it is the same as what
was written before (nothing new to show).  A folder graded before this
record existed is written as before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .results import atomic_write

LEDGER = ".written.json"


def beside(path: Path) -> Path:
    """Where a run's version of an edited file goes: ``report.md`` -> ``report.md.new``.  (Not
    ``report.new.md``: student ``s1.new``'s feedback is ``feedback/s1.new.md``; no file the grader
    writes ends in ``.new``.)"""
    return path.with_name(f"{path.name}.new")


def is_beside_name(name: str, names: frozenset[str] | set[str]) -> bool:
    """Whether ``name`` is :func:`beside` one of ``names`` (``report.md.new`` for ``report.md``)."""
    return name.endswith(".new") and name[:-4] in names


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Outputs:
    """Writes ``out``'s generated files (:meth:`write`), keeping the ones edited since; :meth:`close`
    records what it wrote.  ``kept``: the edited files kept, relative to ``out``."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.kept: list[str] = []
        try:
            ledger = json.loads((self.out / LEDGER).read_text())
            self.written: dict[str, str] = ledger if isinstance(ledger, dict) else {}
        except (OSError, ValueError):
            self.written = {}

    def write(self, path: Path, data: str | bytes) -> None:
        path = Path(path)
        rel = path.relative_to(self.out).as_posix()
        data = data.encode() if isinstance(data, str) else data
        new = _digest(data)
        recorded = self.written.get(rel)
        try:
            now = _digest(path.read_bytes()) if path.is_file() else None
        except OSError:
            now = None
        if now == new:  # already what it would write (a rerun that changed nothing here): left as it is
            self.written[rel] = new
            return
        if recorded is not None and now is not None:
            if now != recorded:  # edited since this grader wrote it: the instructor's now
                if new != recorded:
                    atomic_write(beside(path), data)
                    self.kept.append(rel)
                return
        atomic_write(path, data)
        self.written[rel] = new

    def close(self) -> None:
        atomic_write(self.out / LEDGER, json.dumps(self.written, indent=0, sort_keys=True))
