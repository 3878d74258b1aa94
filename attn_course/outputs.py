"""The grading folder's generated files, written so that an instructor's edit is never lost.

Each run writes the gradebook, the exports, the feedback, the report and the
histograms again.  An instructor edits some of them (a comment in a
student's feedback, a corrected row of the Canvas export): a rerun restored
the generated version silently.  :class:`Outputs` records the SHA-256 of what
it wrote (``GRADING/.written.json``); a file that is no longer what was
written is the instructor's, kept as it is, and the run writes its own version
beside it (``gradebook.csv.new``) and says so, unless it is the same as what
was written before (nothing new to show).  So is a file at a path the grader
never wrote (a feedback file written by hand for a student with no archive
yet).  A folder graded before this record existed is written as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .results import atomic_write

LEDGER = ".written.json"
JOURNAL = ".written.journal"  # what a run is about to write, a line a file, until its ledger is written


def beside(path: Path) -> Path:
    """Where a run's version of an edited file goes: ``report.md`` -> ``report.md.new``.  (Not
    ``report.new.md``: student ``s1.new``'s feedback is ``feedback/s1.new.md``; no file the grader
    writes ends in ``.new``.)"""
    return path.with_name(f"{path.name}.new")


def is_beside_name(name: str, names: frozenset[str] | set[str]) -> bool:
    """Whether ``name`` is :func:`beside` one of ``names`` (``report.md.new`` for ``report.md``), or
    beside such a file (``report.md.new.new``: :meth:`Outputs.write`, where ``.new`` was edited too)."""
    if not name.endswith(".new"):
        return False
    while name.endswith(".new"):
        name = name[:-4]
    return name in names


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Outputs:
    """Writes ``out``'s generated files (:meth:`write`), keeping the ones edited since; :meth:`close`
    records what it wrote.  ``kept``: the edited files kept, relative to ``out``.

    A file is the grader's where its content is one the grader wrote there, or was about to (the
    journal, :data:`JOURNAL`, says so before each write: a run stopped half-way leaves no file
    taken for the instructor's).  Any other file, where the ledger exists, is the instructor's,
    also one at a path the grader never wrote (a feedback file written by hand for a student who
    had sent nothing was replaced by the student's feedback when an archive came: red team).
    """

    def __init__(self, out: Path):
        self.out = Path(out)
        self.kept: list[str] = []
        self.known: dict[str, list[str]] = {}  # the digests the grader wrote (or was about to) at each path
        try:
            ledger = json.loads((self.out / LEDGER).read_text())
            self.found = True
        except (OSError, ValueError):
            ledger, self.found = {}, False
        for rel, digests in (ledger.items() if isinstance(ledger, dict) else ()):
            digests = [digests] if isinstance(digests, str) else digests  # (a ledger of one digest a file)
            if isinstance(rel, str) and isinstance(digests, list):
                self.known[rel] = [d for d in digests if isinstance(d, str)][-2:]
        try:
            journal = (self.out / JOURNAL).read_text(errors="replace")
        except OSError:
            journal = ""
        for line in journal.splitlines():  # (a run that stopped before its ledger)
            rel, _, digest = line.rpartition("\t")
            if rel and len(digest) == 64:
                self.found = True
                self.known[rel] = (self.known.get(rel, []) + [digest])[-2:]
        self._journal = None
        self.written: dict[str, str] = {}  # what this run wrote (or found already written)

    def write(self, path: Path, data: str | bytes) -> None:
        path = Path(path)
        rel = path.relative_to(self.out).as_posix()
        data = data.encode() if isinstance(data, str) else data
        new = _digest(data)
        known = self.known.get(rel, [])
        try:
            now = _digest(path.read_bytes()) if path.is_file() else None
        except OSError:
            now = None
        if now == new:  # already what it would write (a rerun that changed nothing here): left as it is
            self.written[rel] = new
            return
        if self._theirs(rel, now):  # the instructor's (edited, or written where the grader had not)
            if new not in known:  # (the same version as the last run's: nothing new to show)
                self.kept.append(self._beside(path, data, new))
            return
        self._note(rel, new)
        atomic_write(path, data)
        self.written[rel] = new

    def _theirs(self, rel: str, now: str | None) -> bool:
        """Whether the file at ``rel``, whose digest is ``now`` (None: no file), is the instructor's."""
        known = self.known.get(rel, [])
        return now is not None and now not in known and (bool(known) or self.found)

    def _beside(self, path: Path, data: bytes, new: str) -> str:
        """This run's version of the kept file ``path``, written :func:`beside` it; the file kept,
        relative to ``out``, whose :func:`beside` holds it.  A ``.new`` the instructor edited too
        (the file the last run pointed her at, where she merged) is kept as well, and the version
        goes beside that one (``report.md.new.new``): rewriting it lost her merge (red team,
        round 17).  The ledger records the ``.new`` files written, so that the next run knows them."""
        while True:
            target = beside(path)
            rel = target.relative_to(self.out).as_posix()
            try:
                now = _digest(target.read_bytes()) if target.is_file() else None
            except OSError:
                now = None
            if now == new:
                self.written[rel] = new
                break
            if now is None or now in self.known.get(rel, []):  # (none, or the grader's: it has a record of it)
                self._note(rel, new)
                atomic_write(target, data)
                self.written[rel] = new
                break
            path = target
        return path.relative_to(self.out).as_posix()

    def _note(self, rel: str, digest: str) -> None:
        if self._journal is None:
            self.out.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.out / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            self._journal = open(fd, "a", encoding="utf-8")
        self._journal.write(f"{rel}\t{digest}\n")
        self._journal.flush()

    def close(self) -> None:
        ledger = dict(self.known)  # (a path not written this run: what it may hold, as before)
        ledger.update({rel: [digest] for rel, digest in self.written.items()})
        atomic_write(self.out / LEDGER, json.dumps(ledger, indent=0, sort_keys=True))
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        try:
            (self.out / JOURNAL).unlink()
        except FileNotFoundError:
            pass
