"""Reading a submission archive safely (trusted side; nothing in it is run here).

An archive is accepted only if it is a regular file (not a link, folder or
FIFO) holding a readable zip whose members are plain files under
``attn_tensors/`` (``.py``) or ``notebooks/`` (``.ipynb``) plus
``manifest.json``: printable ASCII names, no absolute or ``..`` paths, no
links, no encryption, stored or deflated only, sizes and CRC exactly as
declared, bounded sizes and compression ratio; the manifest matches
:data:`MANIFEST_FIELDS` exactly (types, lengths, no other field), names a
valid student id and this assignment, and lists exactly the files present
with their SHA-256; the library's sources are UTF-8 with no other encoding
declared, and no package hides a module (:func:`_check_sources`: what is
read and compared is what runs).  Anything else rejects the whole archive
with a short printable reason (:class:`Rejected`); :func:`read_submission` raises
nothing else, whatever the bytes.

The file is read once into memory; its hash, the zip directory and every
member come from those same bytes, which this module decompresses itself
so that a size or CRC that lies is caught rather than trusted.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import io
import json
import os
import re
import stat
import struct
import tokenize
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Mapping
from pathlib import Path, PurePosixPath

from .identity import HEX64, MAX_TOKEN_INPUT, SEAL_CHARS, seal_for, valid_student_id
from .workspace import ASSIGNMENT, FORMAT

MAX_MEMBERS = 200
"""Members of an archive (and entries of the manifest's ``files``), at most."""
MAX_FILE = 2 * 2**20
"""Unpacked size of one member, at most (bytes)."""
MAX_TOTAL = 16 * 2**20
"""Unpacked size of all members together, at most (bytes)."""
MAX_ARCHIVE = MAX_TOTAL + 4 * 2**20
"""Size of the archive file itself, at most (bytes)."""
MAX_MANIFEST = 64 * 2**10
"""Size of ``manifest.json``, at most (bytes)."""
MAX_RATIO = 200
"""Compression ratio of a member above 64 KiB, at most (deflate reaches ~1000 on a zip bomb)."""
MAX_NAME = 200
"""Length of a member's name, at most."""
ALLOWED = re.compile(r"attn_tensors/([A-Za-z_][A-Za-z0-9_]*/)*[A-Za-z_][A-Za-z0-9_]*\.py"
                     r"|notebooks/[A-Za-z0-9_.-]+\.ipynb")
"""Paths a member may have besides ``manifest.json`` (use ``fullmatch``)."""
SHA256_HEX = HEX64  # (a file's digest, and the seal)
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")

# The manifest's schema: field -> (type, longest str or list, required).  Types are
# exact (a bool is not an int), and no other field is allowed.
MANIFEST_FIELDS: dict[str, tuple[type, int, bool]] = {
    "format": (int, 0, True),
    "student_id": (str, 64, True),
    "assignment": (str, 64, True),
    "library_version": (str, 32, True),
    "submitted": (str, 40, True),  # the student's clock: orders their archives only under a verified seal
    "files": (dict, MAX_MEMBERS, True),
    "seal": (str, SEAL_CHARS, False),  # the manifest's HMAC under the student's token (identity.seal_for)
    "token": (str, MAX_TOKEN_INPUT, False),  # (an older attn-course's token in plain text: proves nothing)
    "exercises": (list, 500, False),
}


class Rejected(ValueError):
    """The archive cannot be graded; the message says why (short, printable ASCII)."""


@dataclass
class Submission:
    path: Path
    sha256: str
    student_id: str = ""
    manifest: dict = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    seal: str | None = None
    """The manifest's seal as written (``None`` if absent); see :func:`attn_course.identity.check_archive`."""


def _show(value: object, limit: int = 80) -> str:
    """``value`` quoted in printable ASCII (``ascii()``), cut to ``limit`` characters."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def _why(err: BaseException) -> str:
    text = " ".join(str(err).split())
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    text = "".join(c for c in text if c.isprintable())
    return text if len(text) <= 100 else text[:97] + "..."


def _regular_fd(path: Path) -> int | None:
    """An open descriptor on ``path`` if it is a regular file (not a link, FIFO, folder...)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def sha256_file(path: Path) -> str:
    """SHA-256 of a regular file; ``""`` for anything else (a link, FIFO or folder is never opened for reading)."""
    fd = _regular_fd(Path(path))
    if fd is None:
        return ""
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _archive_bytes(path: Path) -> bytes:
    try:
        st = os.lstat(path)
    except OSError as err:
        raise Rejected(f"the archive cannot be read ({err.strerror or type(err).__name__})") from None
    if stat.S_ISLNK(st.st_mode):
        raise Rejected("the archive is a symbolic link, not a file (copy the archive itself)")
    if not stat.S_ISREG(st.st_mode):
        kind = "folder" if stat.S_ISDIR(st.st_mode) else "FIFO" if stat.S_ISFIFO(st.st_mode) else "special file"
        raise Rejected(f"the archive is a {kind}, not a zip file")
    if st.st_size > MAX_ARCHIVE:
        raise Rejected(f"the archive is larger than {MAX_ARCHIVE // 2**20} MB")
    fd = _regular_fd(path)
    if fd is None:
        raise Rejected("the archive is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_ARCHIVE + 1)
    if len(data) > MAX_ARCHIVE:
        raise Rejected(f"the archive is larger than {MAX_ARCHIVE // 2**20} MB")
    return data


def _check_member(info: zipfile.ZipInfo) -> None:
    """Rejects a member whose name, kind, flags or sizes are not acceptable (before reading it)."""
    name = info.filename
    raw = info.orig_filename  # zipfile cuts a name at NUL: judge what the archive holds
    if not raw or len(raw) > MAX_NAME or not raw.isascii() or not raw.isprintable() or raw != name:
        raise Rejected(f"unsafe path in the archive: {_show(raw)} (control or non-ASCII characters)")
    parts = PurePosixPath(name).parts
    if name.startswith("/") or "\\" in name or ".." in parts or ":" in name:
        raise Rejected(f"unsafe path in the archive: {_show(name)}")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise Rejected(f"{_show(name)} is a link; only plain files are accepted")
    if info.flag_bits & 0x1:
        raise Rejected(f"{_show(name)} is encrypted; make archives with `attn-course submit`")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise Rejected(f"{_show(name)} uses an unsupported compression (method {int(info.compress_type)}); "
                       "make archives with `attn-course submit`")
    if info.file_size > MAX_FILE:
        raise Rejected(f"{_show(name)} is larger than {MAX_FILE // 2**20} MB")
    if info.file_size > 2**16 and info.file_size > MAX_RATIO * max(info.compress_size, 1):
        raise Rejected(f"{_show(name)} is compressed more than {MAX_RATIO} times (a zip bomb?)")


def _member_bytes(data: bytes, info: zipfile.ZipInfo) -> bytes:
    """The content of one member, read from the local header on; sizes and CRC must be exact."""
    name = _show(info.filename)
    off = info.header_offset
    header = data[off: off + _LOCAL_HEADER.size]
    if off < 0 or len(header) < _LOCAL_HEADER.size:
        raise Rejected(f"{name} cannot be read (truncated archive)")
    fields = _LOCAL_HEADER.unpack(header)
    if fields[0] != b"PK\x03\x04":
        raise Rejected(f"{name} cannot be read (bad local header)")
    name_len, extra_len = fields[-2], fields[-1]
    start = off + _LOCAL_HEADER.size
    local_name = data[start: start + name_len]
    if local_name != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"):
        raise Rejected(f"{name} has a different name in its local header")
    start += name_len + extra_len
    raw = data[start: start + info.compress_size]
    if len(raw) < info.compress_size:
        raise Rejected(f"{name} cannot be read (truncated archive)")
    if info.compress_type == zipfile.ZIP_STORED:
        content = raw
        if len(content) != info.file_size:
            raise Rejected(f"{name}: its real size differs from the size declared in the archive")
    else:
        d = zlib.decompressobj(-15)
        try:
            content = d.decompress(raw, info.file_size + 1)
        except zlib.error:
            raise Rejected(f"{name} cannot be read (corrupt compressed data)") from None
        if len(content) > info.file_size:
            raise Rejected(f"{name}: its real size exceeds the size declared in the archive")
        if not d.eof or len(content) != info.file_size:
            raise Rejected(f"{name} cannot be read (truncated or corrupt compressed data)")
    if zlib.crc32(content) != info.CRC:
        raise Rejected(f"{name} cannot be read (CRC error: the archive is damaged)")
    return content


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise Rejected(f"manifest: the field {_show(k)} appears twice")
        out[k] = v
    return out


def _no_constants(name: str) -> object:
    raise Rejected(f"manifest: {name} is not allowed in JSON")


def parse_manifest(raw: bytes, assignment: str = ASSIGNMENT) -> dict:
    """``manifest.json`` checked against :data:`MANIFEST_FIELDS`, or :class:`Rejected`."""
    if len(raw) > MAX_MANIFEST:
        raise Rejected(f"manifest.json is larger than {MAX_MANIFEST // 2**10} KB")
    try:
        manifest = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys,
                              parse_constant=_no_constants)
    except RecursionError:
        raise Rejected("manifest.json is nested too deeply") from None
    except UnicodeDecodeError:
        raise Rejected("manifest.json is not UTF-8 text") from None
    except ValueError as err:
        if isinstance(err, Rejected):
            raise
        raise Rejected("manifest.json is not valid JSON") from None
    if type(manifest) is not dict:
        raise Rejected(f"manifest.json is not an object (it is a {type(manifest).__name__})")
    for key in manifest:
        if key not in MANIFEST_FIELDS:
            raise Rejected(f"manifest: unexpected field {_show(key)}")
    for key, (kind, longest, required) in MANIFEST_FIELDS.items():
        if key not in manifest:
            if required:
                raise Rejected(f"manifest: missing field {key!r}")
            continue
        value = manifest[key]
        if type(value) is not kind:
            raise Rejected(f"manifest: {key!r} must be {kind.__name__}, not {type(value).__name__}")
        if longest and len(value) > longest:
            raise Rejected(f"manifest: {key!r} is longer than {longest}")
    if manifest["format"] != FORMAT:
        raise Rejected(f"manifest: format {manifest['format']} is not supported (this grader reads {FORMAT})")
    if not valid_student_id(manifest["student_id"]):
        raise Rejected(f"manifest: invalid student id {_show(manifest['student_id'])}")
    if manifest["assignment"] != assignment:
        raise Rejected(f"manifest: this archive is for assignment {_show(manifest['assignment'])}, "
                       f"not {assignment!r}")
    for name, digest in manifest["files"].items():
        if name == "manifest.json" or not ALLOWED.fullmatch(name):
            raise Rejected(f"manifest: 'files' lists an unexpected path {_show(name)}")
        if type(digest) is not str or not SHA256_HEX.fullmatch(digest):
            raise Rejected(f"manifest: 'files' must map each path to its SHA-256 (64 lower-case hex digits), "
                           f"not {_show(digest, 40)}")
    for item in manifest.get("exercises", []):
        if type(item) is not str or len(item) > 32:
            raise Rejected("manifest: 'exercises' must be a list of exercise ids")
    if "seal" in manifest and not SHA256_HEX.fullmatch(manifest["seal"]):
        # (red team, round 13: a seal of lone surrogates failed the grader on the archive, run after run)
        raise Rejected(f"manifest: 'seal' must be 64 lower-case hex digits, not {_show(manifest['seal'], 40)}")
    return manifest


def read_submission(path: Path, assignment: str = ASSIGNMENT) -> Submission:
    """The verified contents of an archive, or :class:`Rejected` (never any other exception)."""
    try:
        return _read_submission(Path(path), assignment)
    except Rejected:
        raise
    except Exception as err:  # anything unforeseen is this archive's problem, not the batch's
        raise Rejected(f"unreadable archive: {type(err).__name__}") from None


def _check_entry_count(data: bytes) -> None:
    """Rejects an archive whose end record announces too many entries, before they are parsed."""
    end_record = getattr(zipfile, "_EndRecData", None)
    total_field = getattr(zipfile, "_ECD_ENTRIES_TOTAL", None)
    if end_record is None or total_field is None:  # zipfile's internals changed: its own parse still bounds it
        return
    try:
        rec = end_record(io.BytesIO(data))
    except (OSError, ValueError, struct.error, EOFError):
        return  # zipfile will say what is wrong
    if rec and int(rec[total_field]) > MAX_MEMBERS + 64:
        raise Rejected(f"{int(rec[total_field])} entries in the archive (at most {MAX_MEMBERS})")


def _read_submission(path: Path, assignment: str) -> Submission:
    data = _archive_bytes(path)
    sub = Submission(path, hashlib.sha256(data).hexdigest())
    _check_entry_count(data)
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as err:
        raise Rejected(f"not a readable zip archive ({_why(err)})") from None
    with z:
        infos = z.infolist()
    if len(infos) > MAX_MEMBERS + 64:
        raise Rejected(f"{len(infos)} entries in the archive (at most {MAX_MEMBERS})")
    names: set[str] = set()
    folded: set[str] = set()
    members = []
    total = 0
    for info in infos:
        _check_member(info)
        if info.is_dir():
            continue
        name = info.filename
        if name in names or name.lower() in folded:
            raise Rejected(f"{_show(name)} appears twice in the archive")
        names.add(name)
        folded.add(name.lower())
        if name != "manifest.json" and not ALLOWED.fullmatch(name):
            raise Rejected(f"unexpected file {_show(name)} (only attn_tensors/*.py, notebooks/*.ipynb, manifest.json)")
        if name == "manifest.json" and info.file_size > MAX_MANIFEST:
            raise Rejected(f"manifest.json is larger than {MAX_MANIFEST // 2**10} KB")
        total += info.file_size
        if total > MAX_TOTAL:
            raise Rejected(f"the archive unpacks to more than {MAX_TOTAL // 2**20} MB")
        members.append(info)
    if len(members) > MAX_MEMBERS:
        raise Rejected(f"{len(members)} files in the archive (at most {MAX_MEMBERS})")
    if "manifest.json" not in names:
        raise Rejected("no manifest.json (make archives with `attn-course submit`)")
    files = {info.filename: _member_bytes(data, info) for info in members}
    manifest = parse_manifest(files.pop("manifest.json"), assignment)
    listed = manifest["files"]
    if set(listed) != set(files):
        extra, missing = sorted(set(files) - set(listed)), sorted(set(listed) - set(files))
        raise Rejected(f"manifest does not match the archive (unlisted: {_show(extra[:3])}, "
                       f"missing: {_show(missing[:3])})")
    for name, content in files.items():
        if hashlib.sha256(content).hexdigest() != listed[name]:
            raise Rejected(f"manifest: the hash of {name} does not match its content (tampered archive)")
    _check_sources(files)
    sub.student_id, sub.manifest, sub.files = manifest["student_id"], manifest, files
    sub.seal = manifest.get("seal")
    return sub


@functools.cache
def _release_modules() -> frozenset[str]:
    """The released library's modules, as paths without ``.py`` (``attn_tensors/statmech``)."""
    from . import RELEASE_LIBRARY

    return frozenset(name[:-3] for name in library_files(RELEASE_LIBRARY))


def _check_sources(files: Mapping[str, bytes]) -> None:
    """The library's sources are read as Python reads them, and run as they are listed.

    What graders, the similarity report and a reviewer read must be what runs:
    a source is UTF-8 text with no encoding declaration but UTF-8's (a
    ``coding: unicode_escape`` line makes Python run code that every other
    reader sees as one comment), and no package hides a module of the same
    name, in the archive or the release (Python imports ``statmech/__init__.py``
    rather than ``statmech.py``).
    """
    sources = {name: data for name, data in files.items() if name.startswith("attn_tensors/")}
    for name, data in sources.items():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise Rejected(f"{name} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None
        try:  # the encoding Python reads the file with (PEP 263's declaration, or a BOM)
            declared = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
            known, what = codecs.lookup(declared).name, f"the encoding {_show(declared, 40)}"
        except (SyntaxError, LookupError) as err:  # an unknown encoding, or a BOM beside another one
            text = str(err)
            known, what = "", (f"the encoding {_show(text.rsplit(': ', 1)[-1], 40)}" if "unknown" in text
                               else "an encoding other than its UTF-8 byte-order mark")
        if known not in ("utf-8", "utf-8-sig"):
            raise Rejected(f"{name} declares {what}: only UTF-8 sources are accepted (remove that line)")
    modules = _release_modules() | {name[:-3] for name in sources}
    for name in sorted(sources):
        if name.endswith("/__init__.py") and name[:-len("/__init__.py")] in modules:
            package = name[:-len("/__init__.py")]
            raise Rejected(f"{package}/ is a package that hides the module {package}.py (Python would run "
                           "the package, not the module): keep each module one file")


def overlay(sub: Submission, release: Mapping[str, str]) -> dict[str, str]:
    """The package to grade, as ``{path: text}``: the stub release's modules (``release``, as
    :func:`attn_course.runner.package_files` reads them) overlaid with the submitted ones."""
    files = dict(release)
    files.update((name, data.decode("utf-8", errors="replace"))
                 for name, data in sub.files.items() if name.startswith("attn_tensors/"))
    return files


def build_archive(path: Path, student_id: str, files: dict[str, bytes], assignment: str = ASSIGNMENT,
                  submitted: str = "2026-11-21T00:00:00+00:00", token: str | None = None) -> Path:
    """An archive as `attn-course submit` makes it (for tests and benchmarks), sealed with ``token`` if given."""
    manifest = {"format": 1, "student_id": student_id, "assignment": assignment,
                "library_version": "0.1.0", "submitted": submitted,
                "files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}
    if token is not None:
        manifest["seal"] = seal_for(token, manifest)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest, indent=1))
        for n, d in files.items():
            z.writestr(n, d)
    return Path(path)


def library_files(folder: Path) -> dict[str, bytes]:
    """``attn_tensors/**/*.py`` of a folder, as archive members."""
    from .source_tree import walk

    folder = Path(folder)
    return {str(p): (folder / p).read_bytes() for p in walk(folder).modules}
