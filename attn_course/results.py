"""What grading one archive gave, stored one file per archive, and which one counts.

``GRADING/results/<name>.json`` holds an :class:`ArchiveResult`; it is
written atomically (a temporary file, fsync, ``os.replace``) and read back
only if it has this module's format, so a rerun resumes after an interrupt
and never trusts a file it did not write.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

RESULT_FORMAT = 2


def atomic_write(path: Path, data: str | bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


@dataclass
class ArchiveResult:
    """What grading one archive gave (stored as ``results/<archive>.json``)."""

    archive: str
    sha256: str
    secret: str  # the secret's fingerprint
    exercises: list[str]
    received: float = 0.0  # the archive file's modification time (seconds since the epoch)
    student_id: str | None = None
    identity: str = ""  # "ok", or why the archive's claim of identity failed
    rejected: str | None = None
    error: bool = False  # the grader itself failed on this archive: retried on the next run
    scores: dict[str, float] = field(default_factory=dict)
    feedback: dict[str, dict] = field(default_factory=dict)
    notebook_scores: dict[str, float] = field(default_factory=dict)
    notebook_feedback: dict[str, dict] = field(default_factory=dict)
    budget_spent: bool = False
    sandbox: str = ""
    seconds: float = 0.0
    backend: str = "jax"  # what the library ran on: "jax", "mlx" or "both" (scored on JAX)
    identity_policy: str = ""  # the roster and token rule the identity was checked under (Grader.identity_policy)
    review: list[dict] = field(default_factory=list)  # code to review (attn_course.review.Flag, as dicts)
    review_count: int = 0  # how many flags there were (``review`` keeps the first few)
    submission: str = ""  # which submission it is, however packed (identity.submission_digest; "" if unread)
    sealed_at: float | None = None  # when attn-course submit sealed it (its seal verified), seconds; else None
    format: int = RESULT_FORMAT

    @property
    def total(self) -> float:
        return sum(self.scores.values())

    @classmethod
    def load(cls, path: Path) -> "ArchiveResult | None":
        """A stored result, or None if it is not one of ours (a rerun grades again)."""
        try:
            data = json.loads(Path(path).read_text())
            if not isinstance(data, dict) or data.get("format") != RESULT_FORMAT:
                return None
            return cls(**data)
        except (OSError, ValueError, TypeError, RecursionError):
            return None


def result_name(archive: Path, digits: int = 32) -> str:
    """A file name for an archive's result that no archive name can bend, nor share with another.

    The name's first 80 characters, made safe, and ``digits`` hex digits (128 bits) of the
    SHA-256 of the whole name: names that two students choose to agree in their first 80
    characters still find no common file.  (Results written before took 8 digits, 32 bits,
    which two chosen names could share: :func:`own_result` reads them, checked.)
    """
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", archive.stem)[:80]
    digest = hashlib.sha256(archive.name.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{stem}-{digest[:digits]}.json"


def own_result(results: Path, archive: Path) -> ArchiveResult | None:
    """The result in the folder ``results`` of ``archive``: a file of its name's that says it is
    this archive's (a result file names its archive), or one of the 8-digit names of before."""
    for digits in (32, 8):
        r = ArchiveResult.load(results / result_name(archive, digits))
        if r is not None and r.archive == archive.name:
            return r
    return None


def latest_by_student(results: list[ArchiveResult]) -> dict[str, ArchiveResult]:
    """Each student's accepted archive that counts: the one made last, then received last.

    "Made" is when ``attn-course submit`` sealed it (``sealed_at``: the
    manifest's time, which no one but its student can change under the
    seal); an archive without a verified seal (``--trust-manifest-ids``) has
    none, and the file time alone orders.  A submission received again (the
    same sealed manifest, in another archive) was received when it first
    came: the result that counts says so (``received``), and of its copies
    the first is the one named.  So a copy of a student's archive that
    someone else hands in later -- one in the folder or not, a draft she
    shared, an attempt the platform replaced -- neither makes her late nor
    takes the place of her last submission (red team, rounds 12 and 13: the
    file time alone, and then the file time of the copies in the folder,
    let one).
    """
    first: dict[tuple[str, str], float] = {}
    for r in results:
        if r.student_id and not r.rejected and r.submission:
            key = (r.student_id, r.submission)
            first[key] = min(first.get(key, r.received), r.received)
    best: dict[str, tuple[tuple, ArchiveResult]] = {}
    for r in results:
        if not r.student_id or r.rejected:
            continue
        came = first.get((r.student_id, r.submission), r.received) if r.submission else r.received
        made = (0, 0.0) if r.sealed_at is None else (1, r.sealed_at)
        key = (made, came, came == r.received, r.archive)  # (of the same submission, the copy that came first)
        if came != r.received:
            r = replace(r, received=came)
        if r.student_id not in best or key > best[r.student_id][0]:
            best[r.student_id] = (key, r)
    return {sid: r for sid, (_, r) in best.items()}
