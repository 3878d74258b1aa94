"""Reading a submission archive safely (trusted side; nothing in it is run here).

An archive is accepted only if it is a readable zip whose members are plain
files under ``attn_tensors/`` (``.py``) or ``notebooks/`` (``.ipynb``) plus
``manifest.json``; no absolute or ``..`` paths, no links, bounded sizes; the
manifest names a valid student id and this assignment, and lists exactly
the files present with their SHA-256.  Anything else rejects the whole
archive with a reason the student can act on.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .workspace import ASSIGNMENT, STUDENT_ID

MAX_MEMBERS = 200
MAX_FILE = 2 * 2**20
MAX_TOTAL = 16 * 2**20
ALLOWED = re.compile(r"^(attn_tensors/([A-Za-z_][A-Za-z0-9_]*/)*[A-Za-z_][A-Za-z0-9_]*\.py|notebooks/[A-Za-z0-9_.-]+\.ipynb)$")


class Rejected(ValueError):
    """The archive cannot be graded; the message says why."""


@dataclass
class Submission:
    path: Path
    sha256: str
    student_id: str = ""
    manifest: dict = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    with z.open(info) as f:
        data = f.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise Rejected(f"{info.filename} is larger than {MAX_FILE // 2**20} MB")
    return data


def read_submission(path: Path, assignment: str = ASSIGNMENT) -> Submission:
    """The verified contents of an archive, or :class:`Rejected`."""
    path = Path(path)
    sub = Submission(path, sha256_file(path))
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise Rejected(f"not a readable zip archive ({err})") from None
    with z:
        infos = z.infolist()
        if len(infos) > MAX_MEMBERS:
            raise Rejected(f"{len(infos)} files in the archive (at most {MAX_MEMBERS})")
        names = set()
        total = 0
        for info in infos:
            name = info.filename
            p = PurePosixPath(name)
            if name.startswith("/") or "\\" in name or ".." in p.parts or ":" in name:
                raise Rejected(f"unsafe path in the archive: {name!r}")
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise Rejected(f"{name} is a link; only plain files are accepted")
            if info.is_dir():
                continue
            if name in names:
                raise Rejected(f"{name} appears twice in the archive")
            names.add(name)
            if name != "manifest.json" and not ALLOWED.match(name):
                raise Rejected(f"unexpected file {name!r} (only attn_tensors/*.py, notebooks/*.ipynb, manifest.json)")
            total += info.file_size
            if total > MAX_TOTAL:
                raise Rejected(f"the archive unpacks to more than {MAX_TOTAL // 2**20} MB")
        if "manifest.json" not in names:
            raise Rejected("no manifest.json (make archives with `attn-course submit`)")
        try:
            files = {i.filename: _read_member(z, i) for i in infos if not i.is_dir()}
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as err:
            raise Rejected(f"a file in the archive cannot be read ({err})") from None
    try:
        manifest = json.loads(files.pop("manifest.json"))
    except (ValueError, UnicodeDecodeError):
        raise Rejected("manifest.json is not valid JSON") from None
    if not isinstance(manifest, dict):
        raise Rejected("manifest.json is not an object")
    student = manifest.get("student_id")
    if not isinstance(student, str) or not STUDENT_ID.match(student):
        raise Rejected(f"manifest: invalid student id {student!r}")
    if manifest.get("assignment") != assignment:
        raise Rejected(f"manifest: this archive is for assignment {manifest.get('assignment')!r}, not {assignment!r}")
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not all(isinstance(v, str) for v in listed.values()):
        raise Rejected("manifest: 'files' must map each path to its SHA-256")
    if set(listed) != set(files):
        extra, missing = sorted(set(files) - set(listed)), sorted(set(listed) - set(files))
        raise Rejected(f"manifest does not match the archive (unlisted: {extra[:3]}, missing: {missing[:3]})")
    for name, data in files.items():
        if hashlib.sha256(data).hexdigest() != listed[name]:
            raise Rejected(f"manifest: the hash of {name} does not match its content (tampered archive)")
    sub.student_id, sub.manifest, sub.files = student, manifest, files
    return sub


def unpack(sub: Submission, stub_library: Path, dest: Path) -> Path:
    """The package to grade: the stub release, overlaid with the submitted modules."""
    import shutil

    dest = Path(dest)
    shutil.copytree(stub_library / "attn_tensors", dest / "attn_tensors",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name, data in sub.files.items():
        if not name.startswith("attn_tensors/"):
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.write_bytes(data)
    for root, dirs, files in os.walk(dest):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return dest / "attn_tensors"


def build_archive(path: Path, student_id: str, files: dict[str, bytes], assignment: str = ASSIGNMENT,
                  submitted: str = "2026-11-21T00:00:00+00:00") -> Path:
    """An archive as `attn-course submit` makes it (for tests and benchmarks)."""
    manifest = {"format": 1, "student_id": student_id, "assignment": assignment,
                "library_version": "0.1.0", "submitted": submitted,
                "files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest, indent=1))
        for n, d in files.items():
            z.writestr(n, d)
    return Path(path)


def library_files(folder: Path) -> dict[str, bytes]:
    """``attn_tensors/**/*.py`` of a folder, as archive members."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted((folder / "attn_tensors").rglob("*.py")) if "__pycache__" not in p.parts}
