"""Who submitted an archive: a roster, and tokens a classmate cannot forge.

The manifest's ``student_id`` is whatever the archive says.  What binds it
to a person is a *token*: an HMAC-SHA256 of the id under the course secret
(``ATTN_COURSE_SECRET``), which the instructor issues from a roster::

    attn-course roster roster.csv --out tokens.csv   # one token per student
    attn-course token s1234567                       # re-issue one (lost token)

A student stores theirs once (``attn-course workspace DIR --student ID
--token TOKEN``, or ``attn-course workspace --set-token TOKEN`` later) and
every archive they submit is *sealed* with it: the manifest carries an
HMAC of its own text (the id, the time, every file's digest) under the
token, never the token itself (:func:`seal_for`).  The grader recomputes the
token from the id and checks the seal: without the secret, a token for
another id cannot be made, and an archive a classmate has seen gives them
no token to seal archives of their own with (red team, round 12: the token
travelled in plain text, and any copy of a classmate's archive let one
submit as them).

:func:`check_archive` is the grader's verdict on one archive; with a
roster, an archive whose id is not on it, or whose seal is missing or
wrong, is not graded (:class:`IdentityVerdict` names which).
"""

from __future__ import annotations

import base64
import csv
import enum
import hashlib
import hmac
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SECRET_ENV = "ATTN_COURSE_SECRET"
CI_SECRET = "ci-default-secret"
"""The public secret used in CI and tests; tokens made with it are forgeable."""

STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
"""A student id: 1-64 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit
(match with ``fullmatch``; ``\\Z``, unlike ``$``, refuses a trailing newline)."""

TOKEN_CHARS = 20
"""Characters of a token: 20 base32 characters carry 100 bits of the HMAC."""
_GROUP = 5
_TOKEN_MESSAGE = b"attn-course student token v1\x00"
_BASE32 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
# Typing slips a student makes when copying a token (base32 has no 0, 1 or 8).
_SLIPS = str.maketrans({"0": "O", "1": "I", "8": "B"})
MAX_TOKEN_INPUT = 64
"""Longest token text accepted anywhere (the manifest's limit too)."""


class IdentityError(ValueError):
    """An identity problem the user can fix (the message says how)."""


class RosterError(IdentityError):
    """A roster file that cannot be used; the message names the line."""


class SecretMissing(IdentityError):
    """No course secret was given (``ATTN_COURSE_SECRET``)."""


def valid_student_id(student_id: object) -> bool:
    """Whether ``student_id`` is a ``str`` that :data:`STUDENT_ID` matches in full."""
    return isinstance(student_id, str) and STUDENT_ID.fullmatch(student_id) is not None


def course_secret(allow_ci: bool = False) -> str:
    """The course secret from ``ATTN_COURSE_SECRET``, or :class:`SecretMissing`.

    The code is public, so the CI default (:data:`CI_SECRET`) is returned
    only when the caller asks for it by name (``allow_ci``, e.g. a
    ``--ci-secret`` option) and the variable is unset.
    """
    value = os.environ.get(SECRET_ENV, "")
    if value and value != value.strip():  # a secret read from a file with its line end, a stray space
        raise SecretMissing(f"{SECRET_ENV} begins or ends with a space or a line end (read from a file "
                            "with its newline?): set it without them")
    if value:
        return value
    if allow_ci:
        return CI_SECRET
    raise SecretMissing(
        f"{SECRET_ENV} is not set: set it to the course's secret (the same one used for grading), "
        "or pass --ci-secret to use the public CI secret (tokens made with it can be forged)"
    )


def secret_fingerprint(secret: str) -> str:
    """A short public fingerprint of ``secret`` (16 hex digits), to tell secrets apart in results."""
    return hashlib.sha256(b"attn-course secret fingerprint v1\x00" + secret.encode()).hexdigest()[:16]


MAX_GENERATION = 999
"""Highest token generation (:func:`token_for`): a student's token re-issued that many times."""


def _digest(student_id: str, secret: str, generation: int = 0) -> str:
    message = _TOKEN_MESSAGE + student_id.encode() + (b"\x00%d" % generation if generation else b"")
    mac = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.b32encode(mac).decode()[:TOKEN_CHARS]


def token_for(student_id: str, secret: str, generation: int = 0) -> str:
    """The token of ``student_id``: HMAC-SHA256(secret, id), 20 base32 characters in groups of 5.

    For example ``ABCDE-FGHIJ-KLMNO-PQRST``.  Deterministic: re-issuing a
    lost token gives the same one.  ``generation``: a token that was seen by
    others (an archive of an older ``attn-course`` carried it in plain text)
    is replaced by the next generation's, ``HMAC(secret, id, generation)``,
    which the roster's ``token_generation`` column names for that student:
    the old one then seals nothing the grader accepts (red team, round 13).
    """
    if not valid_student_id(student_id):
        raise IdentityError(f"invalid student id {student_id!r:.80}")
    if not isinstance(secret, str) or not secret:
        raise SecretMissing("the course secret is empty")
    if type(generation) is not int or not 0 <= generation <= MAX_GENERATION:
        raise IdentityError(f"a token generation is a whole number from 0 to {MAX_GENERATION}, not {generation!r:.40}")
    raw = _digest(student_id, secret, generation)
    return "-".join(raw[i:i + _GROUP] for i in range(0, TOKEN_CHARS, _GROUP))


def normalize_token(token: object) -> str | None:
    """``token`` as 20 upper-case base32 characters, or ``None`` if it cannot be one.

    Case, dashes and spaces are ignored, and the digits a student may type
    for a letter (``0``, ``1``, ``8`` for ``O``, ``I``, ``B``) are read as
    the letter.
    """
    if not isinstance(token, str) or len(token) > MAX_TOKEN_INPUT or not token.isascii():
        return None
    raw = re.sub(r"[\s-]", "", token).upper().translate(_SLIPS)
    if len(raw) != TOKEN_CHARS or not set(raw) <= _BASE32:
        return None
    return raw


def format_token(token: str) -> str:
    """A token in its canonical printed form, or :class:`IdentityError` if it is not one."""
    raw = normalize_token(token)
    if raw is None:
        raise IdentityError(
            f"{token!r:.80} is not a course token (expected {TOKEN_CHARS} letters and digits 2-7, "
            "like ABCDE-FGHIJ-KLMNO-PQRST, as issued by your instructor)"
        )
    return "-".join(raw[i:i + _GROUP] for i in range(0, TOKEN_CHARS, _GROUP))


SEAL_CHARS = 64
"""Characters of an archive's seal: the 256-bit HMAC in hex."""
_SEAL_MESSAGE = b"attn-course archive seal v1\x00"
HEX64 = re.compile(r"[0-9a-f]{64}")
"""A SHA-256 or a seal as a manifest writes it: 64 lower-case hex digits (use ``fullmatch``)."""


def _canonical(obj: dict) -> bytes:
    """``obj`` as canonical JSON: keys sorted, no spaces, ASCII (a parsed manifest has one such text)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sealed_text(manifest: dict) -> bytes:
    """What a seal covers: the manifest without its seal, as canonical JSON."""
    return _canonical({k: v for k, v in manifest.items() if k != "seal"})


def seal_for(token: str, manifest: dict) -> str:
    """The seal of ``manifest`` under ``token``: HMAC-SHA256(token, its text), 64 hex digits.

    The manifest names every file of the archive by its SHA-256, so the seal
    covers the whole archive: a changed file, id or time breaks it, and no
    seal tells anything of the token it was made with.
    """
    raw = normalize_token(token)
    if raw is None:
        raise IdentityError(f"{token!r:.80} is not a course token: the archive cannot be sealed with it")
    return hmac.new(raw.encode(), _SEAL_MESSAGE + sealed_text(manifest), hashlib.sha256).hexdigest()


def verify_seal(manifest: dict, secret: str, generation: int = 0) -> bool:
    """Whether ``manifest`` is sealed with the token of its own ``student_id`` under ``secret``
    (of that ``generation``: :func:`token_for`), by a constant-time compare; ``False`` (never an
    exception) for anything malformed."""
    seal, student_id = manifest.get("seal"), manifest.get("student_id")
    if type(seal) is not str or not HEX64.fullmatch(seal) \
            or not valid_student_id(student_id) or not isinstance(secret, str) or not secret:
        return False  # (lone surrogates in a seal could not be encoded: red team, round 13)
    try:
        expected = seal_for(_digest(student_id, secret, generation), manifest)
    except (IdentityError, TypeError, ValueError):  # (a manifest JSON cannot write: never one parsed)
        return False
    return hmac.compare_digest(seal.encode(), expected.encode())


def sealed_time(manifest: dict) -> float | None:
    """The manifest's ``submitted`` time in seconds since the epoch (UTC where it names no zone),
    or None where it is not an ISO 8601 time.  Trusted only under a verified seal: then no one but
    its student wrote it (:func:`attn_course.results.latest_by_student`)."""
    import datetime as _dt

    text = manifest.get("submitted")
    try:
        when = _dt.datetime.fromisoformat(text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=_dt.timezone.utc)
        return when.timestamp()
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def submission_digest(manifest: dict) -> str:
    """One submission, however it was packed again: the SHA-256 of its manifest's text, seal included
    (two archives with the same are the same files, id and time, sealed alike)."""
    return hashlib.sha256(_canonical(manifest)).hexdigest()


@dataclass(frozen=True)
class Roster:
    """The students of a course, in the roster's order."""

    ids: tuple[str, ...]
    """Student ids, each valid and unique (also ignoring case)."""
    names: tuple[str, ...] = ()
    """Display names aligned with ``ids`` (``""`` where none), or empty if the roster has none."""
    generations: tuple[int, ...] = ()
    """Each student's token generation (:func:`token_for`) aligned with ``ids``, or empty: all 0."""

    def __post_init__(self) -> None:
        if self.names and len(self.names) != len(self.ids):
            raise ValueError(f"{len(self.names)} names for {len(self.ids)} ids")
        if self.generations and len(self.generations) != len(self.ids):
            raise ValueError(f"{len(self.generations)} token generations for {len(self.ids)} ids")
        object.__setattr__(self, "_index", {s: k for k, s in enumerate(self.ids)})

    def __contains__(self, student_id: object) -> bool:
        return isinstance(student_id, str) and student_id in self._index  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def name(self, student_id: str) -> str:
        """The display name of ``student_id`` (``""`` if none); ``KeyError`` if not on the roster."""
        k = self._index[student_id]  # type: ignore[attr-defined]
        return self.names[k] if self.names else ""

    def generation(self, student_id: str) -> int:
        """The token generation of ``student_id`` (0 unless the roster says); ``KeyError`` if not on it."""
        k = self._index[student_id]  # type: ignore[attr-defined]
        return self.generations[k] if self.generations else 0


_NAME_COLUMNS = ("name", "display_name", "full_name")
GENERATION_COLUMN = "token_generation"
"""The roster's optional column of each student's token generation (blank: 0; :func:`token_for`)."""
MAX_ROSTER_BYTES = 8 * 2**20


def load_roster(path: Path | str) -> Roster:
    """The roster in a CSV file with a ``student_id`` column (and optionally ``name``).

    Blank lines are skipped and spaces around an id are ignored; a missing
    column, an invalid id or a duplicate id (also one differing only in
    case) is a :class:`RosterError` naming the file and line.
    """
    path = Path(path)
    try:
        if path.stat().st_size > MAX_ROSTER_BYTES:
            raise RosterError(f"{path}: larger than {MAX_ROSTER_BYTES // 2**20} MB; is this a roster?")
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise RosterError(f"{path}: no such roster file") from None
    except UnicodeDecodeError:
        raise RosterError(f"{path}: not UTF-8 text (save the roster as CSV UTF-8)") from None
    except OSError as err:
        raise RosterError(f"{path}: cannot be read ({err.strerror or err})") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)  # (an unclosed quote is an error)
    try:
        header = next(reader, None)
    except csv.Error as err:
        raise RosterError(f"{path}:1: not CSV ({err})") from None
    columns = [h.strip().lower() for h in header or []]
    if "student_id" not in columns:
        raise RosterError(f"{path}:1: no 'student_id' column in the header (found: {', '.join(columns)[:200]})")
    if columns.count("student_id") > 1:  # (the second column's students were dropped, silently)
        raise RosterError(f"{path}:1: two 'student_id' columns in the header: keep one")
    id_col = columns.index("student_id")
    name_col = next((columns.index(c) for c in _NAME_COLUMNS if c in columns), None)
    gen_col = columns.index(GENERATION_COLUMN) if GENERATION_COLUMN in columns else None
    ids: list[str] = []
    names: list[str] = []
    generations: list[int] = []
    seen: dict[str, int] = {}
    try:
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            sid = row[id_col].strip() if id_col < len(row) else ""
            if not valid_student_id(sid):
                raise RosterError(
                    f"{path}:{line}: invalid student id {ascii(sid):.80} (1-64 letters, digits, '.', '_' or '-', "
                    "starting with a letter or digit)"
                )
            if sid.lower() in seen:
                raise RosterError(f"{path}:{line}: student id {sid!r} is already on line {seen[sid.lower()]}")
            seen[sid.lower()] = line
            ids.append(sid)
            names.append(row[name_col].strip() if name_col is not None and name_col < len(row) else "")
            gen = row[gen_col].strip() if gen_col is not None and gen_col < len(row) else ""
            if gen and not (gen.isascii() and gen.isdigit() and int(gen) <= MAX_GENERATION):
                raise RosterError(f"{path}:{line}: token generation {ascii(gen):.40} of {sid} is not a whole "
                                  f"number from 0 to {MAX_GENERATION}")
            generations.append(int(gen) if gen else 0)
    except csv.Error as err:
        raise RosterError(f"{path}:{reader.line_num}: not CSV ({err})") from None
    if not ids:
        raise RosterError(f"{path}: no students (the roster has a header but no ids)")
    return Roster(tuple(ids), tuple(names) if name_col is not None else (),
                  tuple(generations) if any(generations) else ())


class IdentityVerdict(enum.Enum):
    """The grader's verdict on who submitted an archive (:func:`check_archive`)."""

    OK = "ok"
    """The id is on the roster (if any) and the token, where required or given, is its own."""
    UNKNOWN_STUDENT = "unknown_student"
    """The id is not on the roster."""
    BAD_TOKEN = "bad_token"
    """A token is there but it is not the token of this id."""
    MISSING_TOKEN = "missing_token"
    """A token is required (there is a roster) and the archive has none."""
    PLAIN_TOKEN = "plain_token"
    """The archive carries a token in plain text instead of a seal (an older ``attn-course``, or a
    token copied from someone's archive): it proves nothing."""

    @property
    def ok(self) -> bool:
        return self is IdentityVerdict.OK

    @property
    def reason(self) -> str:
        """A fixed sentence for the student and the instructor (no text from the archive)."""
        return _REASONS[self]


_REASONS = {
    IdentityVerdict.OK: "identity verified",
    IdentityVerdict.UNKNOWN_STUDENT: "the student id in the manifest is not on the course roster",
    IdentityVerdict.BAD_TOKEN: "the token in the manifest is not the token of its student id "
                               "(set yours with `attn-course workspace --set-token TOKEN` and submit again)",
    IdentityVerdict.MISSING_TOKEN: "the archive has no token (set yours with "
                                   "`attn-course workspace --set-token TOKEN` and submit again)",
    IdentityVerdict.PLAIN_TOKEN: "the archive carries its token in plain text (an older attn-course made it): "
                                 "anyone who saw the archive has your token, so ask your instructor for a new "
                                 "one, update attn-course, set the new token and submit again",
}


def check_archive(manifest: dict, roster: Roster | None, secret: str,
                  *, require_token: bool | None = None) -> IdentityVerdict:
    """Whether an archive's manifest can be trusted to say who submitted it.

    Rules, in order: an id not on ``roster`` (or not a valid id) is ``UNKNOWN_STUDENT``; no seal is ``PLAIN_TOKEN``
    where the manifest has a token instead, else ``MISSING_TOKEN`` when
    ``require_token`` (default: when there is a roster) and ``OK`` otherwise; a
    seal that is not the one of the manifest's own id, files and time is ``BAD_TOKEN``.
    """
    if require_token is None:
        require_token = roster is not None
    student_id = manifest.get("student_id")
    if roster is not None and student_id not in roster:
        return IdentityVerdict.UNKNOWN_STUDENT
    if not valid_student_id(student_id):
        return IdentityVerdict.UNKNOWN_STUDENT
    if manifest.get("seal") in (None, ""):
        if manifest.get("token") not in (None, ""):
            return IdentityVerdict.PLAIN_TOKEN if require_token else IdentityVerdict.OK
        return IdentityVerdict.MISSING_TOKEN if require_token else IdentityVerdict.OK
    generation = roster.generation(student_id) if roster is not None else 0
    if not verify_seal(manifest, secret, generation):
        return IdentityVerdict.BAD_TOKEN
    return IdentityVerdict.OK


def write_tokens(roster: Roster, secret: str, out: Path | str, *, force: bool = False) -> Path:
    """``out`` as a CSV of ``student_id,token`` (and ``name`` if the roster has names), mode 0600.

    An existing file is kept (:class:`IdentityError`) unless ``force``.
    """
    from .text import csv_cell

    out = Path(out)
    if (out.exists() or out.is_symlink()) and not force:
        raise IdentityError(f"{out} already exists; it was not overwritten (pass --force to replace it)")
    if out.is_dir():
        raise IdentityError(f"{out} is a folder: name the file to write the tokens to (nothing was written)")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as err:
        raise IdentityError(f"{out} cannot be written ({err.strerror or type(err).__name__})") from None
    try:
        with os.fdopen(fd, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["student_id", "token", "name"] if roster.names else ["student_id", "token"])
            for sid in roster:
                row = [sid, token_for(sid, secret, roster.generation(sid))]
                if roster.names:
                    row.append(csv_cell(roster.name(sid)))
                w.writerow(row)
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise IdentityError(f"{out} cannot be written ({err.strerror or type(err).__name__}); "
                            "nothing was written") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
