"""Every way an archive can be malformed becomes one named rejection.

``read_submission`` must turn each failure (in the file, the zip, the
manifest) into :class:`Rejected` with a short printable reason, never any
other exception, and keep accepting what `attn-course submit` and
``build_archive`` make.  Hostile archives are written byte by byte here
(:func:`raw_zip`), so each field a grader trusts can be set to a lie.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import lzma
import os
import random
import stat
import struct
import threading
import zipfile
import zlib
from pathlib import Path

import pytest

from attn_course import archive, identity
from attn_course.archive import MAX_FILE, MAX_MANIFEST, Rejected, Submission, build_archive, read_submission

PY = b"def f(x):\n    return x\n" * 20
FILES = {"attn_tensors/__init__.py": b'__version__ = "0.1.0"\n', "attn_tensors/statmech.py": PY}


def manifest_for(contents: dict[str, bytes], /, **fields) -> dict:
    m = {"format": 1, "student_id": "s1234567", "assignment": "attn-tensors-library",
         "library_version": "0.1.0", "submitted": "2026-11-21T00:00:00+00:00",
         "files": {n: hashlib.sha256(d).hexdigest() for n, d in contents.items()}}
    m.update(fields)
    return {k: v for k, v in m.items() if v is not DROP}


DROP = object()


def member(name: str | bytes, content: bytes, method: int = zipfile.ZIP_DEFLATED, **lie) -> dict:
    """One zip entry; ``lie`` overrides what the headers declare (crc, csize, usize, flags, attr, data)."""
    if method == zipfile.ZIP_DEFLATED:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        data = c.compress(content) + c.flush()
    elif method == zipfile.ZIP_BZIP2:
        data = bz2.compress(content)
    elif method == zipfile.ZIP_LZMA:
        data = lzma.compress(content, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA1}])
        data = struct.pack("<BBH", 9, 4, 5) + lzma._encode_filter_properties({"id": lzma.FILTER_LZMA1}) + data
    else:
        data = content
    raw_name = name.encode() if isinstance(name, str) else name
    e = {"name": raw_name, "data": data, "method": method, "crc": zlib.crc32(content), "csize": len(data),
         "usize": len(content), "flags": 0x800 if not raw_name.isascii() else 0, "attr": 0o100644 << 16}
    e.update(lie)
    return e


def raw_zip(entries: list[dict], *, local_names: dict[int, bytes] | None = None,
            offsets: dict[int, int] | None = None, total: int | None = None) -> bytes:
    """A zip file written field by field from ``entries`` (local headers, central directory, end record)."""
    local, central = bytearray(), bytearray()
    for k, e in enumerate(entries):
        off = len(local)
        lname = (local_names or {}).get(k, e["name"])
        local += struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, e["flags"], e["method"], 0, 0x21,
                             e["crc"], e["csize"] & 0xFFFFFFFF, e["usize"] & 0xFFFFFFFF, len(lname), 0)
        local += lname + e["data"]
        central += struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, e["flags"], e["method"], 0, 0x21,
                               e["crc"], e["csize"] & 0xFFFFFFFF, e["usize"] & 0xFFFFFFFF, len(e["name"]),
                               0, 0, 0, 0, e["attr"], (offsets or {}).get(k, off))
        central += e["name"]
    n = len(entries) if total is None else total
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, n, n, len(central), len(local), 0)
    return bytes(local + central + end)


def honest_entries(files=FILES, manifest: dict | bytes | None = None, method=zipfile.ZIP_DEFLATED) -> list[dict]:
    m = manifest if manifest is not None else manifest_for(files)
    raw = m if isinstance(m, bytes) else json.dumps(m, indent=1).encode()
    return [member("manifest.json", raw, method)] + [member(n, d, method) for n, d in files.items()]


def write(tmp_path: Path, data: bytes, name: str = "a.zip") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def outcome(path: Path) -> Submission | Rejected:
    """What the grader gets: a submission or a rejection; anything else fails the test."""
    try:
        return read_submission(path)
    except Rejected as err:
        msg = str(err)
        assert msg and len(msg) <= 300 and msg.isascii() and msg.isprintable(), repr(msg)
        return err


def rejected(path: Path, *words: str) -> str:
    r = outcome(path)
    assert isinstance(r, Rejected), f"accepted: {path.name}"
    for w in words:
        assert w in str(r), f"{w!r} not in {str(r)!r}"
    return str(r)


# -- what honest tools make is accepted ----------------------------------------------------

def test_raw_writer_makes_what_zipfile_reads():
    """The test's own writer agrees with zipfile on an honest archive (so its lies are the only difference)."""
    data = raw_zip(honest_entries())
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert z.testzip() is None
        assert z.read("attn_tensors/statmech.py") == PY


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED])
def test_honest_archives_are_accepted(tmp_path, method):
    sub = outcome(write(tmp_path, raw_zip(honest_entries(method=method))))
    assert isinstance(sub, Submission)
    assert sub.student_id == "s1234567" and sub.files == FILES and sub.seal is None
    assert sub.sha256 == hashlib.sha256((tmp_path / "a.zip").read_bytes()).hexdigest()


def test_build_archive_with_and_without_token(tmp_path):
    from attn_course.identity import seal_for

    a = read_submission(build_archive(tmp_path / "a.zip", "s1", FILES))
    b = read_submission(build_archive(tmp_path / "b.zip", "s1", FILES, token="ABCDE-FGHIJ-KLMNO-PQRST"))
    assert a.seal is None and a.files == b.files == FILES
    assert b.seal == seal_for("ABCDE-FGHIJ-KLMNO-PQRST", b.manifest) and "token" not in b.manifest


def test_streamed_archive_with_data_descriptors_is_accepted(tmp_path):
    """Zip tools writing to a pipe put sizes after the data (flag bit 3): still an honest archive."""
    class Pipe(io.RawIOBase):
        def __init__(self):
            self.buf = bytearray()

        def writable(self):
            return True

        def write(self, b):
            self.buf += b
            return len(b)

    pipe = Pipe()
    with zipfile.ZipFile(pipe, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest_for(FILES)))
        for n, d in FILES.items():
            z.writestr(n, d)
    assert any(i.flag_bits & 0x08 for i in zipfile.ZipFile(io.BytesIO(bytes(pipe.buf))).infolist())
    assert isinstance(outcome(write(tmp_path, bytes(pipe.buf))), Submission)


def test_what_attn_course_submit_makes_is_accepted(tmp_path):
    from attn_course import workspace

    ws = workspace.create(tmp_path / "ws", "s1234567", "abcde fghij klmno pqrst")
    sub = read_submission(workspace.submit(ws))
    assert sub.student_id == "s1234567" and "token" not in sub.manifest
    assert sub.seal == identity.seal_for("ABCDE-FGHIJ-KLMNO-PQRST", sub.manifest)
    assert "attn_tensors/statmech.py" in sub.files and any(n.startswith("notebooks/") for n in sub.files)
    assert isinstance(sub.manifest["exercises"], list)


# -- the manifest --------------------------------------------------------------------------

LONG = "x" * 100
MANIFESTS = {
    # name: (manifest fields changed, words in the reason)
    "id_trailing_newline": ({"student_id": "s1234567\n"}, ["invalid student id"]),
    "id_list": ({"student_id": ["s1234567"]}, ["'student_id' must be str, not list"]),
    "id_int": ({"student_id": 1234567}, ["'student_id' must be str, not int"]),
    "id_null": ({"student_id": None}, ["'student_id' must be str"]),
    "id_too_long": ({"student_id": "s" * 65}, ["'student_id' is longer than 64"]),
    "id_path": ({"student_id": "../../etc"}, ["invalid student id"]),
    "id_leading_dash": ({"student_id": "-rf"}, ["invalid student id"]),
    "id_fullwidth": ({"student_id": "\uff53\uff11"}, ["invalid student id"]),
    "id_bidi": ({"student_id": "s1\u202e"}, ["invalid student id", "\\u202e"]),
    "id_ansi": ({"student_id": "s1\x1b[2J"}, ["invalid student id", "\\x1b"]),
    "format_bool": ({"format": True}, ["'format' must be int, not bool"]),
    "format_str": ({"format": "1"}, ["'format' must be int, not str"]),
    "format_float": ({"format": 1.0}, ["'format' must be int, not float"]),
    "format_2": ({"format": 2}, ["format 2 is not supported"]),
    "assignment_dict": ({"assignment": {"name": "attn-tensors-library"}}, ["'assignment' must be str"]),
    "assignment_other": ({"assignment": "homework-7"}, ["assignment 'homework-7'"]),
    "files_list": ({"files": []}, ["'files' must be dict, not list"]),
    "files_str": ({"files": "attn_tensors/statmech.py"}, ["'files' must be dict"]),
    "files_hash_int": ({"files": {"attn_tensors/__init__.py": 1, "attn_tensors/statmech.py": 2}}, ["SHA-256"]),
    "files_hash_upper": ({"files": {n: hashlib.sha256(d).hexdigest().upper() for n, d in FILES.items()}},
                         ["SHA-256", "64 lower-case hex"]),
    "files_hash_short": ({"files": {n: hashlib.sha256(d).hexdigest()[:63] for n, d in FILES.items()}}, ["SHA-256"]),
    "files_too_many": ({"files": {f"attn_tensors/m{k}.py": "0" * 64 for k in range(201)}},
                       ["'files' is longer than 200"]),
    "files_bad_path": ({"files": {"../../x.py": "0" * 64}}, ["unexpected path"]),
    "files_manifest": ({"files": {"manifest.json": "0" * 64}}, ["unexpected path"]),
    "version_long": ({"library_version": "0." + "1" * 31}, ["'library_version' is longer than 32"]),
    "version_list": ({"library_version": [0, 1]}, ["'library_version' must be str"]),
    "submitted_long": ({"submitted": "9999-12-31T23:59:59+00:00" + " " * 16}, ["'submitted' is longer than 40"]),
    "submitted_int": ({"submitted": 99999999999}, ["'submitted' must be str, not int"]),
    "submitted_null": ({"submitted": None}, ["'submitted' must be str"]),
    "token_int": ({"token": 12345}, ["'token' must be str, not int"]),
    "token_long": ({"token": "A" * 65}, ["'token' is longer than 64"]),
    "token_dict": ({"token": {"forge": True}}, ["'token' must be str"]),
    "exercises_ints": ({"exercises": [3, 1]}, ["'exercises' must be a list of exercise ids"]),
    "exercises_dict": ({"exercises": {"3.1": "pass"}}, ["'exercises' must be list"]),
    "extra_field": ({"grade": 100}, ["unexpected field 'grade'"]),
    "extra_field_ansi": ({"\x1b[2Jx": 1}, ["unexpected field", "\\x1b"]),
    "missing_files": ({"files": DROP}, ["missing field 'files'"]),
    "missing_id": ({"student_id": DROP}, ["missing field 'student_id'"]),
    "missing_submitted": ({"submitted": DROP}, ["missing field 'submitted'"]),
}


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_manifest_field_of_the_wrong_type_or_size_is_rejected(tmp_path, name):
    fields, words = MANIFESTS[name]
    m = manifest_for(FILES, **fields)
    rejected(write(tmp_path, raw_zip(honest_entries(manifest=m))), *words)


RAW_MANIFESTS = {
    "duplicate_key": (b'{"student_id": "victim", ' + json.dumps(manifest_for(FILES))[1:].encode(),
                      ["'student_id' appears twice"]),
    "nan": (json.dumps(manifest_for(FILES, format=float("nan"))).encode(), ["NaN is not allowed"]),
    "infinity": (json.dumps(manifest_for(FILES, format=float("inf"))).encode(), ["Infinity is not allowed"]),
    "deep_list": (b'{"student_id": ' + b"[" * 20000 + b"]" * 20000 + b"}", ["nested too deeply"]),
    "deep_dict": (b'{"a":' * 9000 + b"1" + b"}" * 9000, ["nested too deeply"]),
    "list": (b"[1, 2, 3]", ["not an object (it is a list)"]),
    "string": (b'"s1234567"', ["not an object (it is a str)"]),
    "null": (b"null", ["not an object (it is a NoneType)"]),
    "truncated_json": (json.dumps(manifest_for(FILES)).encode()[:-10], ["not valid JSON"]),
    "empty": (b"", ["not valid JSON"]),
    "utf16": (json.dumps(manifest_for(FILES)).encode("utf-16"), ["not UTF-8"]),
    "latin1": (json.dumps(manifest_for(FILES, submitted="caf\xe9")).replace("\\u00e9", "\xe9").encode("latin-1"),
               ["not UTF-8"]),
    "huge": (json.dumps(manifest_for(FILES)).encode() + b" " * MAX_MANIFEST, ["manifest.json is larger than 64 KB"]),
}


@pytest.mark.parametrize("name", sorted(RAW_MANIFESTS))
def test_manifest_that_is_not_the_schema_is_rejected(tmp_path, name):
    raw, words = RAW_MANIFESTS[name]
    rejected(write(tmp_path, raw_zip(honest_entries(manifest=raw))), *words)


def test_manifest_must_list_exactly_the_files(tmp_path):
    rejected(write(tmp_path, raw_zip(honest_entries(manifest=manifest_for({"attn_tensors/__init__.py": b""})))),
             "manifest does not match the archive")
    m = manifest_for(FILES)
    m["files"]["attn_tensors/statmech.py"] = hashlib.sha256(b"other").hexdigest()
    rejected(write(tmp_path, raw_zip(honest_entries(manifest=m))), "does not match its content")


# -- the zip -------------------------------------------------------------------------------

def _with(*extra: dict, files=FILES, manifest=None) -> bytes:
    """An honest archive plus the members ``extra`` (listed in the manifest with their true hash)."""
    listed = dict(files)
    for e in extra:
        listed[e.get("_as", e["name"].decode("utf-8", "replace"))] = e.get("_content", b"")
    m = manifest if manifest is not None else manifest_for(listed)
    return raw_zip(honest_entries(files, m) + list(extra))


def _listed(name: str, content: bytes, method=zipfile.ZIP_DEFLATED, **lie) -> dict:
    e = member(name, content, method, **lie)
    e["_content"] = content
    return e


ZEROS = b"\0" * (MAX_FILE - 1000)


def zip_cases() -> dict[str, tuple[bytes, list[str]]]:
    big = b"x = 1\n" * 2000
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated_big = c.compress(big) + c.flush()
    return {
        "encrypted_member": (_with(_listed("attn_tensors/enc.py", PY, flags=0x1)), ["is encrypted"]),
        "encrypted_manifest": (raw_zip([member("manifest.json", json.dumps(manifest_for(FILES)).encode(), flags=0x1)]
                                       + [member(n, d) for n, d in FILES.items()]), ["is encrypted"]),
        "bzip2": (_with(_listed("attn_tensors/bz.py", PY, zipfile.ZIP_BZIP2)), ["unsupported compression (method 12)"]),
        "lzma": (_with(_listed("attn_tensors/lz.py", PY, zipfile.ZIP_LZMA)), ["unsupported compression (method 14)"]),
        "aes_method_99": (_with(_listed("attn_tensors/aes.py", PY, 99)), ["unsupported compression (method 99)"]),
        # the content is longer than declared, with a CRC of the declared part: a reader that stops at
        # the declared size sees a consistent, shorter file
        "deflate_longer_than_declared": (
            _with(dict(member("attn_tensors/long.py", big, usize=100, crc=zlib.crc32(big[:100])),
                       _content=big[:100])), ["real size exceeds"]),
        "stored_longer_than_declared": (
            _with(dict(member("attn_tensors/long.py", big, zipfile.ZIP_STORED, usize=100, crc=zlib.crc32(big[:100])),
                       _content=big[:100])), ["real size differs"]),
        "deflate_shorter_than_declared": (
            _with(dict(member("attn_tensors/short.py", big, usize=len(big) + 10), _content=big)),
            ["truncated or corrupt"]),
        "deflate_garbage": (_with(dict(member("attn_tensors/g.py", big, data=b"\xff" * len(deflated_big)),
                                       _content=big)), ["corrupt compressed data"]),
        "crc_error": (_with(_listed("attn_tensors/crc.py", PY, crc=zlib.crc32(PY) ^ 1)), ["CRC error"]),
        "zip_bomb_ratio": (_with(_listed("attn_tensors/bomb.py", ZEROS)), ["compressed more than 200 times"]),
        "zip_bomb_total": (_with(*[_listed(f"attn_tensors/b{k}.py", os.urandom(16) * (MAX_FILE // 16 - 64),
                                           zipfile.ZIP_STORED) for k in range(9)]),
                           ["unpacks to more than 16 MB"]),
        "declared_4gb": (_with(_listed("attn_tensors/huge.py", PY, usize=2**32 - 1)), ["larger than 2 MB"]),
        "name_newline": (_with(_listed("attn_tensors/evil.py\n", PY)), ["unsafe path", "\\n"]),
        "name_ansi": (_with(_listed("attn_tensors/\x1b[2Jx.py", PY)), ["unsafe path", "\\x1b"]),
        "name_bidi": (_with(_listed("notebooks/x\u202eknyp.ipynb", b"{}")), ["unsafe path", "\\u202e"]),
        "name_non_ascii": (_with(_listed("notebooks/caf\u00e9.ipynb", b"{}")), ["unsafe path", "\\xe9"]),
        "name_nul": (_with(dict(_listed(b"attn_tensors/x.py\x00.sh", PY), _as="attn_tensors/x.py")),
                     ["unsafe path", "\\x00"]),
        "name_backslash": (_with(_listed("attn_tensors\\..\\x.py", PY)), ["unsafe path"]),
        "name_absolute": (_with(_listed("/etc/cron.d/x", PY)), ["unsafe path"]),
        "name_dotdot": (_with(_listed("attn_tensors/../../x.py", PY)), ["unsafe path"]),
        "name_too_long": (_with(_listed("attn_tensors/" + "x" * 300 + ".py", PY)), ["unsafe path"]),
        "name_case_twin": (_with(_listed("attn_tensors/Statmech.py", PY)), ["appears twice"]),
        "name_twice": (raw_zip(honest_entries() + [member("attn_tensors/statmech.py", b"evil = 1\n")]),
                       ["appears twice"]),
        "unexpected_file": (_with(_listed("attn_tensors/data.so", b"\x7fELF")), ["unexpected file"]),
        "symlink_member": (_with(_listed("attn_tensors/link.py", b"/etc/passwd", attr=0o120777 << 16)), ["link"]),
        "local_name_differs": (raw_zip(honest_entries(), local_names={1: b"attn_tensors/other.py"}),
                               ["different name in its local header"]),
        "offset_past_end": (raw_zip(honest_entries(), offsets={1: 10**6}), ["truncated archive"]),
        "no_manifest": (raw_zip([member(n, d) for n, d in FILES.items()]), ["no manifest.json"]),
        "too_many_entries": (raw_zip(honest_entries() + [member(f"d{k}/", b"") for k in range(300)]),
                             ["entries in the archive"]),
        "not_a_zip": (b"#!/bin/sh\nrm -rf ~\n", ["not a readable zip"]),
        "empty_file": (b"", ["not a readable zip"]),
        "random_after_magic": (b"PK\x03\x04" + random.Random(1).randbytes(300), ["not a readable zip"]),
    }


ZIP_CASES = zip_cases()


def test_at_least_forty_hostile_archives():
    assert len(MANIFESTS) + len(RAW_MANIFESTS) + len(ZIP_CASES) >= 40


@pytest.mark.parametrize("name", sorted(ZIP_CASES))
def test_malformed_zip_is_rejected_with_a_reason(tmp_path, name):
    data, words = ZIP_CASES[name]
    rejected(write(tmp_path, data), *words)


def test_truncated_archive_is_rejected(tmp_path):
    data = raw_zip(honest_entries())
    for cut in (len(data) // 3, len(data) // 2, len(data) - 30, len(data) - 1):
        rejected(write(tmp_path, data[:cut], f"cut{cut}.zip"))


def test_no_corruption_escapes_as_another_exception(tmp_path):
    """Byte flips and cuts anywhere in an honest archive: a submission or a rejection, never a crash."""
    data = raw_zip(honest_entries())
    rng = random.Random(20261123)
    path = tmp_path / "fuzz.zip"
    kinds = set()
    for k in range(600):
        b = bytearray(data)
        if k % 3 == 0:
            b = b[: rng.randrange(len(b))]
        else:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        path.write_bytes(bytes(b))
        r = outcome(path)
        kinds.add(type(r).__name__)
    assert "Rejected" in kinds


# -- what lies in the submissions folder ---------------------------------------------------

def test_folder_named_like_an_archive_is_rejected(tmp_path):
    (tmp_path / "x.zip").mkdir()
    rejected(tmp_path / "x.zip", "folder")
    assert archive.sha256_file(tmp_path / "x.zip") == ""


def test_symlink_to_an_archive_is_rejected(tmp_path):
    real = write(tmp_path, raw_zip(honest_entries()), "real.zip")
    (tmp_path / "link.zip").symlink_to(real)
    rejected(tmp_path / "link.zip", "symbolic link")
    (tmp_path / "dangling.zip").symlink_to(tmp_path / "nowhere.zip")
    rejected(tmp_path / "dangling.zip", "symbolic link")
    assert archive.sha256_file(tmp_path / "link.zip") == ""


def test_missing_and_oversized_archives_are_rejected(tmp_path):
    rejected(tmp_path / "gone.zip", "cannot be read")
    with open(tmp_path / "sparse.zip", "wb") as f:
        f.truncate(archive.MAX_ARCHIVE + 1)
    rejected(tmp_path / "sparse.zip", "larger than")


def test_fifo_is_rejected_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.zip"
    os.mkfifo(fifo)
    box = {}
    t = threading.Thread(target=lambda: box.update(r=outcome(fifo), h=archive.sha256_file(fifo)), daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():  # a grader that opened the FIFO waits for a writer: give it one, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        pytest.fail("reading a FIFO in the submissions folder blocked")
    assert isinstance(box["r"], Rejected) and "FIFO" in str(box["r"]) and box["h"] == ""
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# -- anything unforeseen ---------------------------------------------------------------------

@pytest.mark.parametrize("where, exc", [("_member_bytes", ZeroDivisionError), ("parse_manifest", MemoryError),
                                        ("_check_member", RecursionError), ("_archive_bytes", KeyError)])
def test_an_unexpected_exception_becomes_a_rejection(tmp_path, monkeypatch, where, exc):
    path = write(tmp_path, raw_zip(honest_entries()))

    def boom(*a, **k):
        raise exc("student-controlled text \x1b[2J")

    monkeypatch.setattr(archive, where, boom)
    msg = rejected(path, f"unreadable archive: {exc.__name__}")
    assert "student-controlled" not in msg


def test_rejection_reasons_quote_names_in_printable_ascii(tmp_path):
    evil = "attn_tensors/" + "\u202e\x1b]8;;http://x\x07" * 40 + ".py"
    msg = rejected(write(tmp_path, _with(_listed(evil, PY))), "unsafe path")
    assert len(msg) < 200 and "\x1b" not in msg and "\u202e" not in msg


# -- what is read (graders, the similarity report, a reviewer) is what runs -----------------------

SMUGGLED = b"\\ndef f(x):\\n    return x + 1\\n"  # runs as code under unicode_escape; a comment to any other reader


@pytest.mark.parametrize("head", [b"# -*- coding: unicode_escape -*-\n# ", b"# coding=utf-7\n# ",
                                  b"#!/usr/bin/env python\n# vim: set fileencoding=latin-1 :\n# ",
                                  b"# coding: no-such-codec\n# "])
def test_a_source_that_declares_another_encoding_is_rejected(tmp_path, head):
    source = head + SMUGGLED
    if b"unicode_escape" in head:  # the attack is real: Python runs what reads as a comment
        namespace: dict = {}
        exec(compile(source, "statmech.py", "exec"), namespace)
        assert namespace["f"](1) == 2
        assert all(line.startswith("#") for line in source.decode("utf-8").splitlines())  # as read: comments
    files = {**FILES, "attn_tensors/statmech.py": source}
    with pytest.raises(Rejected, match="declares the encoding .*only UTF-8"):
        read_submission(build_archive(tmp_path / "a.zip", "s1", files))


@pytest.mark.parametrize("cookie", [b"# -*- coding: utf-8 -*-\n", b"# coding: UTF8\n", b"# vim: fileencoding=utf_8\n"])
def test_a_utf8_encoding_declaration_is_accepted(tmp_path, cookie):
    files = {**FILES, "attn_tensors/statmech.py": cookie + PY}
    assert read_submission(build_archive(tmp_path / "a.zip", "s1", files)).files == files


def test_a_source_that_is_not_utf8_is_rejected(tmp_path):
    files = {**FILES, "attn_tensors/statmech.py": b"x = '\xe9t\xe9'\n"}  # Latin-1 bytes
    with pytest.raises(Rejected, match="statmech.py is not UTF-8 text"):
        read_submission(build_archive(tmp_path / "a.zip", "s1", files))


@pytest.mark.parametrize("files", [
    {"attn_tensors/statmech/__init__.py": PY},  # hides the release's statmech.py (left as the stub)
    {"attn_tensors/statmech.py": PY, "attn_tensors/statmech/__init__.py": PY},
    {"attn_tensors/helper.py": PY, "attn_tensors/helper/__init__.py": PY},  # a module of the archive's own
], ids=["release-module", "both-submitted", "own-module"])
def test_a_package_that_hides_a_module_is_rejected(tmp_path, files):
    with pytest.raises(Rejected, match="is a package that hides the module"):
        read_submission(build_archive(tmp_path / "a.zip", "s1", {**FILES, **files}))


def test_a_new_package_that_hides_nothing_is_accepted(tmp_path):
    files = {**FILES, "attn_tensors/helpers/__init__.py": PY, "attn_tensors/helpers/more.py": PY}
    assert read_submission(build_archive(tmp_path / "a.zip", "s1", files)).files == files
