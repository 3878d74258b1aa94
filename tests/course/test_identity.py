"""Identity a classmate cannot forge: roster, tokens, workspace and CLI.

A token is HMAC-SHA256 of the student id under the course secret; the
expected tokens here are computed with :mod:`hmac` directly from that
definition, not by calling the function under test.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import hmac
import json
import re
import stat
import zipfile
from pathlib import Path

import pytest

from attn_course import cli, identity, workspace
from attn_course.archive import read_submission
from attn_course.identity import (CI_SECRET, IdentityError, IdentityVerdict, Roster, RosterError, SecretMissing,
                                  check_archive, course_secret, load_roster, token_for)

SECRET = "course-secret-for-tests"
TOKEN_FORM = re.compile(r"[A-Z2-7]{5}(-[A-Z2-7]{5}){3}")


def expected_token(student_id: str, secret: str) -> str:
    """The definition: 100 bits of HMAC-SHA256(secret, label || id), base32, in groups of five."""
    mac = hmac.new(secret.encode(), b"attn-course student token v1\x00" + student_id.encode(), hashlib.sha256)
    raw = base64.b32encode(mac.digest()).decode()[:20]
    return "-".join(raw[i:i + 5] for i in range(0, 20, 5))


# -- tokens --------------------------------------------------------------------------------

@pytest.mark.parametrize("sid", ["s1234567", "a", "Z9", "x.y_z-1", "A" * 64])
def test_token_is_the_hmac_of_the_id(sid):
    t = token_for(sid, SECRET)
    assert t == expected_token(sid, SECRET)
    assert TOKEN_FORM.fullmatch(t)
    assert token_for(sid, SECRET) == t  # re-issuing gives the same token


def test_tokens_differ_between_students_and_between_secrets():
    ids = [f"s{k:07d}" for k in range(2000)]
    tokens = {token_for(s, SECRET) for s in ids}
    assert len(tokens) == len(ids)
    assert all(token_for(s, SECRET) != token_for(s, SECRET + "x") for s in ids[:50])


def seals_as(student_id, token, secret: str = SECRET) -> bool:
    """Whether an archive that ``token`` sealed passes as ``student_id``'s under ``secret``."""
    manifest = {"format": 1, "student_id": student_id, "assignment": "a", "submitted": "t", "files": {}}
    try:
        manifest["seal"] = identity.seal_for(token, manifest)
    except IdentityError:
        return False
    return identity.verify_seal(manifest, secret)


def test_a_classmates_token_does_not_verify_for_another_id():
    mine = token_for("alice", SECRET)
    assert seals_as("alice", mine)
    assert not seals_as("bob", mine)
    assert not seals_as("alice", mine, "another-course")
    assert not seals_as("alice", token_for("alice", CI_SECRET))


def test_a_token_seals_as_a_student_types_it():
    t = token_for("s1234567", SECRET)
    raw = t.replace("-", "")
    for typed in (t.lower(), raw, raw.lower(), f"  {t}  ", " ".join(t.split("-")), raw[:10] + "-" + raw[10:]):
        assert seals_as("s1234567", typed), typed
    # base32 has no 0, 1 or 8: a student who types them for O, I or B still gets in
    sid = next(s for s in (f"s{k}" for k in range(1000)) if set("OIB") & set(token_for(s, SECRET)))
    typed = token_for(sid, SECRET).replace("O", "0").replace("I", "1").replace("B", "8")
    assert seals_as(sid, typed)


@pytest.mark.parametrize("token", [None, "", 12345, ["AAAAA"], b"AAAAA-AAAAA-AAAAA-AAAAA", "A" * 19, "A" * 21,
                                   "AAAAA-AAAAA-AAAAA-AAAA9", "ÀAAAA-AAAAA-AAAAA-AAAAA", "\ud800" * 20,
                                   "AAAAAAAAAAAAAAAAAA\u00df", "\uff21" * 20,
                                   "A" * 10_000, "AAAAA-AAAAA-AAAAA-AAAAA\n" * 3])
def test_malformed_tokens_are_refused_without_an_exception(token):
    assert seals_as("s1", token) is False
    with pytest.raises(IdentityError):
        identity.seal_for(token, {"student_id": "s1"})


@pytest.mark.parametrize("sid", ["s1\n", "", "../x", "-s1", "a" * 65, "s 1", "s1\x00", "é1", None, ["s1"], 7])
def test_invalid_ids_get_no_token_and_never_verify(sid):
    with pytest.raises(IdentityError):
        token_for(sid, SECRET)
    if isinstance(sid, str) and sid.endswith("\n"):
        assert not seals_as(sid, token_for(sid[:-1], SECRET))
    assert seals_as(sid, "AAAAA-AAAAA-AAAAA-AAAAA") is False


def test_only_ascii_base32_normalises_to_a_token():
    """Case folding must not turn other letters into base32 ones ('\u00df'.upper() == 'SS')."""
    assert identity.normalize_token("abcde fghij-klmno pqrst") == "ABCDEFGHIJKLMNOPQRST"
    assert identity.normalize_token("AAAAAAAAAAAAAAAAAA\u00df") is None
    assert identity.normalize_token("\uff21" * 20) is None
    assert identity.normalize_token("A" * 20 + "\n") == "A" * 20  # whitespace around a pasted token is fine


def test_an_empty_secret_is_refused():
    with pytest.raises(SecretMissing):
        token_for("s1", "")
    assert not seals_as("s1", expected_token("s1", "x"), "")


def test_course_secret_needs_the_variable_or_an_explicit_ci_request(monkeypatch):
    monkeypatch.delenv("ATTN_COURSE_SECRET", raising=False)
    with pytest.raises(SecretMissing, match="ATTN_COURSE_SECRET"):
        course_secret()
    assert course_secret(allow_ci=True) == CI_SECRET
    monkeypatch.setenv("ATTN_COURSE_SECRET", "")
    with pytest.raises(SecretMissing):
        course_secret()
    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    assert course_secret() == SECRET and course_secret(allow_ci=True) == SECRET


def test_secret_fingerprint_tells_secrets_apart_without_revealing_them():
    a, b = identity.secret_fingerprint(SECRET), identity.secret_fingerprint(SECRET + "!")
    assert a != b and re.fullmatch(r"[0-9a-f]{16}", a) and SECRET not in a
    assert identity.secret_fingerprint(SECRET) == a


# -- roster --------------------------------------------------------------------------------

def _write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_text(text, encoding=encoding)
    return path


def test_roster_reads_ids_and_names_in_order(tmp_path):
    p = _write(tmp_path / "r.csv", "\ufeffName,Student_ID,email\nAlice, s1 ,a@x\n\n,,\nBob,s2,b@x\nCarol,S3,\n")
    r = load_roster(p)
    assert r.ids == ("s1", "s2", "S3")
    assert r.name("s2") == "Bob" and list(r) == ["s1", "s2", "S3"] and len(r) == 3
    assert "s1" in r and "s3" not in r and ["s1"] not in r and None not in r


def test_roster_without_names(tmp_path):
    r = load_roster(_write(tmp_path / "r.csv", "student_id\ns1\ns2\n"))
    assert r == Roster(("s1", "s2")) and r.name("s1") == ""


@pytest.mark.parametrize("text, where, words", [
    ("id,name\ns1,A\n", ":1:", "no 'student_id' column"),
    ("", ":1:", "no 'student_id' column"),
    ("student_id\ns1\ns 2\n", ":3:", "invalid student id"),
    ("student_id\ns1\n\"s\n2\"\n", ":4:", "invalid student id"),
    ("student_id\ns1\n../etc\n", ":3:", "invalid student id"),
    ("student_id,name\ns1,A\ns2,B\ns1,C\n", ":4:", "already on line 2"),
    ("student_id\nAbc\nabc\n", ":3:", "already on line 2"),
    ("student_id\n\n", "", "no students"),
])
def test_bad_rosters_name_the_line(tmp_path, text, where, words):
    p = _write(tmp_path / "roster.csv", text)
    with pytest.raises(RosterError) as err:
        load_roster(p)
    assert f"{p}{where}" in str(err.value) and words in str(err.value)


def test_unreadable_rosters_are_clear_errors(tmp_path):
    with pytest.raises(RosterError, match="no such roster"):
        load_roster(tmp_path / "missing.csv")
    with pytest.raises(RosterError, match="UTF-8"):
        load_roster(_write(tmp_path / "latin.csv", "student_id,name\ns1,Jos\xe9\n", encoding="latin-1"))
    with pytest.raises(RosterError, match="cannot be read"):
        load_roster(tmp_path)


# -- verdicts ------------------------------------------------------------------------------

def test_check_archive_verdicts():
    roster = Roster(("alice", "bob"))
    alice, bob = token_for("alice", SECRET), token_for("bob", SECRET)
    V = IdentityVerdict

    def sealed(sid, token):
        m = {"format": 1, "student_id": sid, "assignment": "a", "submitted": "t", "files": {}}
        return {**m, "seal": identity.seal_for(token, m)} if token is not None else m

    assert check_archive(sealed("alice", alice), roster, SECRET) is V.OK
    assert check_archive(sealed("alice", alice.lower().replace("-", "")), roster, SECRET) is V.OK
    assert check_archive(sealed("alice", bob), roster, SECRET) is V.BAD_TOKEN  # submitting as a classmate
    assert check_archive(sealed("alice", None), roster, SECRET) is V.MISSING_TOKEN
    assert check_archive({**sealed("alice", None), "seal": ""}, roster, SECRET) is V.MISSING_TOKEN
    assert check_archive({**sealed("alice", None), "token": alice}, roster, SECRET) is V.PLAIN_TOKEN
    assert check_archive(sealed("carol", token_for("carol", SECRET)), roster, SECRET) is V.UNKNOWN_STUDENT
    assert check_archive({**sealed("alice", alice), "student_id": "alice\n"}, roster, SECRET) is V.UNKNOWN_STUDENT
    assert check_archive({**sealed("alice", alice), "student_id": ["alice"]}, roster, SECRET) is V.UNKNOWN_STUDENT
    assert check_archive(sealed("alice", alice), roster, "another-secret") is V.BAD_TOKEN
    # without a roster: a seal is checked when present, and needed only when asked for
    assert check_archive(sealed("carol", None), None, SECRET) is V.OK
    assert check_archive(sealed("carol", bob), None, SECRET) is V.BAD_TOKEN
    assert check_archive(sealed("carol", None), None, SECRET, require_token=True) is V.MISSING_TOKEN
    assert check_archive(sealed("alice", None), roster, SECRET, require_token=False) is V.OK
    assert check_archive({"student_id": "alice\n"}, None, SECRET) is V.UNKNOWN_STUDENT


def test_verdict_reasons_are_fixed_text():
    for v in IdentityVerdict:
        assert v.reason and v.reason.isascii() and v.reason.isprintable()
        assert v.ok is (v is IdentityVerdict.OK)
        assert IdentityVerdict(v.value) is v
    assert {v.value for v in IdentityVerdict} == {"ok", "unknown_student", "bad_token", "missing_token", "plain_token"}


# -- the instructor's commands -------------------------------------------------------------

@pytest.fixture
def no_secret(monkeypatch):
    monkeypatch.delenv("ATTN_COURSE_SECRET", raising=False)


def _csv_rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_roster_command_writes_each_students_token(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    roster = _write(tmp_path / "roster.csv", 'student_id,name\ns1,Alice\ns2,"=HYPERLINK(""http://x"")"\n')
    out = tmp_path / "tokens.csv"
    assert cli.main(["roster", str(roster), "--out", str(out)]) == 0
    rows = _csv_rows(out)
    assert rows[0] == ["student_id", "token", "name"]
    assert rows[1] == ["s1", expected_token("s1", SECRET), "Alice"]
    assert rows[2][:2] == ["s2", expected_token("s2", SECRET)] and rows[2][2].startswith("'=")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "Wrote 2 tokens" in capsys.readouterr().out


def test_roster_command_keeps_an_existing_file_unless_forced(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    roster = _write(tmp_path / "roster.csv", "student_id\ns1\n")
    out = _write(tmp_path / "tokens.csv", "precious\n")
    assert cli.main(["roster", str(roster), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err and out.read_text() == "precious\n"
    assert cli.main(["roster", str(roster), "--out", str(out), "--force"]) == 0
    assert _csv_rows(out)[1] == ["s1", expected_token("s1", SECRET)]
    capsys.readouterr()
    assert cli.main(["roster", str(roster), "--out", str(tmp_path / "no" / "such" / "t.csv")]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_roster_and_grade_outputs_that_cannot_be_written_are_one_line(tmp_path, monkeypatch, capsys):
    """A folder as the tokens' file (with --force: a traceback of os.replace), and a grading
    folder that cannot be made (a traceback of mkdir): one line each, nothing written."""
    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    roster = _write(tmp_path / "roster.csv", "student_id\ns1\n")
    (tmp_path / "folder").mkdir()
    assert cli.main(["roster", str(roster), "--out", str(tmp_path / "folder"), "--force"]) == 2
    err = capsys.readouterr().err
    assert "is a folder" in err and "Traceback" not in err and not any((tmp_path / "folder").iterdir())
    (tmp_path / "subs").mkdir()
    assert cli.main(["grade", str(tmp_path / "subs"), "--out", "/proc/self/grading"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attn-course: --out /proc/self/grading cannot be made private or written") and \
        len(err.strip().splitlines()) == 1, err


def test_instructor_commands_refuse_to_run_without_a_secret(tmp_path, no_secret, capsys):
    roster = _write(tmp_path / "roster.csv", "student_id\ns1\n")
    out = tmp_path / "tokens.csv"
    assert cli.main(["roster", str(roster), "--out", str(out)]) == 2
    assert "ATTN_COURSE_SECRET is not set" in capsys.readouterr().err and not out.exists()
    assert cli.main(["token", "s1"]) == 2
    err = capsys.readouterr()
    assert "ATTN_COURSE_SECRET is not set" in err.err and err.out == ""
    # the public CI secret only when asked for by name, with a warning
    assert cli.main(["roster", str(roster), "--out", str(out), "--ci-secret"]) == 0
    assert "public CI secret" in capsys.readouterr().err
    assert _csv_rows(out)[1] == ["s1", expected_token("s1", CI_SECRET)]
    assert cli.main(["token", "s1", "--ci-secret"]) == 0
    assert capsys.readouterr().out.strip() == expected_token("s1", CI_SECRET)


def test_token_command_reissues_a_lost_token(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    roster = _write(tmp_path / "roster.csv", "student_id\ns1\ns2\n")
    assert cli.main(["token", "s2", "--roster", str(roster)]) == 0
    assert capsys.readouterr().out.strip() == expected_token("s2", SECRET)
    assert cli.main(["token", "s9", "--roster", str(roster)]) == 2
    assert "not on the roster" in capsys.readouterr().err
    assert cli.main(["token", "s1\n"]) == 2
    assert "invalid student id" in capsys.readouterr().err
    bad = _write(tmp_path / "bad.csv", "student_id\ns1\ns1\n")
    assert cli.main(["roster", str(bad), "--out", str(tmp_path / "t.csv")]) == 2
    assert f"{bad}:3:" in capsys.readouterr().err


# -- the student's side --------------------------------------------------------------------

def _manifest(archive: Path) -> dict:
    with zipfile.ZipFile(archive) as z:
        return json.loads(z.read("manifest.json"))


def test_workspace_token_goes_into_every_submission(tmp_path, monkeypatch, capsys):
    token = expected_token("s1234567", SECRET)
    ws = tmp_path / "ws"
    typed = token.lower().replace("-", " ")
    assert cli.main(["workspace", str(ws), "--student", "s1234567", "--token", typed]) == 0
    assert json.loads((ws / "course.json").read_text())["token"] == token
    capsys.readouterr()
    assert cli.main(["submit", "--workspace", str(ws)]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err
    archive = Path(out.split("Wrote ", 1)[1].split("\n", 1)[0])
    assert "token" not in _manifest(archive) and token.replace("-", "") not in archive.read_bytes().decode("latin-1")
    sub = read_submission(archive)
    assert sub.seal == identity.seal_for(token, sub.manifest) and sub.student_id == "s1234567"
    assert identity.check_archive(sub.manifest, Roster(("s1234567",)), SECRET) is IdentityVerdict.OK


def test_workspace_without_token_submits_with_a_warning_then_sets_one(tmp_path, monkeypatch, capsys):
    ws = tmp_path / "ws"
    assert cli.main(["workspace", str(ws), "--student", "s7"]) == 0
    assert "--set-token" in capsys.readouterr().out
    assert cli.main(["submit", "--workspace", str(ws)]) == 0
    out, err = capsys.readouterr()
    assert "no token" in err and "roster" in err
    first = Path(out.split("Wrote ", 1)[1].split("\n", 1)[0])
    assert "token" not in _manifest(first) and "seal" not in _manifest(first)
    assert identity.check_archive(read_submission(first).manifest, Roster(("s7",)), SECRET) is \
        IdentityVerdict.MISSING_TOKEN

    # later, from inside the workspace
    monkeypatch.chdir(ws / "attn_tensors")
    token = expected_token("s7", SECRET)
    assert cli.main(["workspace", "--set-token", token.replace("-", "")]) == 0
    assert json.loads((ws / "course.json").read_text())["token"] == token
    capsys.readouterr()
    assert cli.main(["submit"]) == 0
    out, err = capsys.readouterr()
    second = Path(out.split("Wrote ", 1)[1].split("\n", 1)[0])
    assert first.exists() and second != first and "warning" not in err
    sub = read_submission(second)
    assert identity.check_archive(sub.manifest, Roster(("s7",)), SECRET) is IdentityVerdict.OK


def test_workspace_refuses_malformed_tokens_and_mixed_options(tmp_path, capsys):
    ws = tmp_path / "ws"
    assert cli.main(["workspace", str(ws), "--student", "s1", "--token", "not-a-token"]) == 2
    assert "not a course token" in capsys.readouterr().err and not ws.exists()
    assert cli.main(["workspace", str(ws)]) == 2
    assert "--student" in capsys.readouterr().err
    assert cli.main(["workspace", str(ws), "--student", "s1"]) == 0
    before = (ws / "course.json").read_text()
    assert cli.main(["workspace", str(ws), "--set-token", "AAAA"]) == 2
    assert cli.main(["workspace", str(ws), "--student", "s1", "--set-token", expected_token("s1", SECRET)]) == 2
    assert (ws / "course.json").read_text() == before
    assert cli.main(["workspace", str(tmp_path / "elsewhere"), "--set-token", expected_token("s1", SECRET)]) == 2
    assert "not inside a workspace" in capsys.readouterr().err


def test_a_forged_archive_is_caught(tmp_path):
    """Bob builds an archive as Alice, with his own token or a made-up one: never OK."""
    from attn_course.archive import build_archive

    roster = Roster(("alice", "bob"))
    files = {"attn_tensors/__init__.py": b""}
    for name, token in [("own", token_for("bob", SECRET)), ("made_up", "ABCDE-FGHIJ-KLMNO-PQRST"),
                        ("ci", token_for("alice", CI_SECRET)), ("none", None)]:
        sub = read_submission(build_archive(tmp_path / f"{name}.zip", "alice", files, token=token))
        assert not identity.check_archive(sub.manifest, roster, SECRET).ok, name
    honest = read_submission(build_archive(tmp_path / "a.zip", "alice", files, token=token_for("alice", SECRET)))
    assert identity.check_archive(honest.manifest, roster, SECRET).ok


def test_an_archive_a_classmate_has_seen_seals_nothing_else(tmp_path):
    """Red team, round 12: the manifest carried the token itself, so Bob, with a copy of one of
    Alice's archives, sealed archives of his own making as hers.  Now it carries a seal of its
    own text: any change to a file, the id or the time breaks it, and the token is nowhere in it."""
    from attn_course.archive import build_archive

    roster = Roster(("alice", "bob"))
    token = token_for("alice", SECRET)
    files = {"attn_tensors/__init__.py": b"", "attn_tensors/statmech.py": b"x = 1\n"}
    seen = read_submission(build_archive(tmp_path / "alice.zip", "alice", files, token=token))
    assert identity.check_archive(seen.manifest, roster, SECRET).ok
    raw = (tmp_path / "alice.zip").read_bytes().decode("latin-1")
    assert identity.normalize_token(token) not in raw and token not in raw
    forged = [
        {**seen.manifest, "files": {**seen.manifest["files"], "attn_tensors/statmech.py": "0" * 64}},
        {**seen.manifest, "submitted": "2026-11-20T00:00:00+00:00"},
        {**seen.manifest, "student_id": "bob"},
        {**seen.manifest, "seal": seen.manifest["seal"].upper()},
        {**seen.manifest, "seal": seen.manifest["seal"][:-1] + ("0" if seen.manifest["seal"][-1] != "0" else "1")},
        {**{k: v for k, v in seen.manifest.items() if k != "seal"}, "token": token},  # the old form, plain
        {**seen.manifest, "extra": 1},
    ]
    verdicts = [identity.check_archive(m, roster, SECRET) for m in forged]
    assert not any(v.ok for v in verdicts), verdicts
    assert verdicts[5] is IdentityVerdict.PLAIN_TOKEN
    assert "older attn-course" in IdentityVerdict.PLAIN_TOKEN.reason
    # (the seal covers the manifest as parsed: key order and spacing do not matter)
    assert identity.verify_seal(dict(reversed(list(seen.manifest.items()))), SECRET)


def test_a_token_others_have_seen_is_replaced_by_its_next_generation(tmp_path, capsys, monkeypatch):
    """Red team, round 13: tokens never changed, so one an older attn-course's archive carried in
    plain text sealed archives as its student for good.  The roster's token_generation column
    names the student's current token; the old one's seal is then refused."""
    from attn_course.archive import build_archive

    roster_csv = tmp_path / "roster.csv"
    roster_csv.write_text("student_id,name,token_generation\nalice,Alice,1\nbob,Bob,\n")
    roster = load_roster(roster_csv)
    assert (roster.generation("alice"), roster.generation("bob")) == (1, 0)
    old, new = token_for("alice", SECRET), token_for("alice", SECRET, 1)
    assert old != new and token_for("alice", SECRET, 0) == old and token_for("alice", SECRET, 2) not in (old, new)
    files = {"attn_tensors/__init__.py": b""}
    seen = read_submission(build_archive(tmp_path / "old.zip", "alice", files, token=old))
    fresh = read_submission(build_archive(tmp_path / "new.zip", "alice", files, token=new))
    assert identity.check_archive(seen.manifest, roster, SECRET) is IdentityVerdict.BAD_TOKEN
    assert identity.check_archive(fresh.manifest, roster, SECRET) is IdentityVerdict.OK
    assert identity.check_archive(seen.manifest, Roster(("alice",)), SECRET) is IdentityVerdict.OK  # (generation 0)
    # the instructor's commands: the roster's generation, or one given that agrees with it
    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    capsys.readouterr()
    assert cli.main(["token", "alice", "--roster", str(roster_csv)]) == 0
    assert capsys.readouterr().out.strip() == new
    assert cli.main(["token", "alice", "--generation", "1"]) == 0 and capsys.readouterr().out.strip() == new
    assert cli.main(["token", "alice", "--roster", str(roster_csv), "--generation", "2"]) == 2
    assert "token_generation" in capsys.readouterr().err
    assert cli.main(["roster", str(roster_csv), "--out", str(tmp_path / "tokens.csv")]) == 0
    assert {r[0]: r[1] for r in _csv_rows(tmp_path / "tokens.csv")[1:]} == {"alice": new, "bob": token_for("bob", SECRET)}
    for bad in ("-1", "x", "1000", "\u0661"):
        roster_csv.write_text(f"student_id,token_generation\nalice,{bad}\n")
        with pytest.raises(RosterError, match="token generation"):
            load_roster(roster_csv)


def test_a_seal_that_is_not_hex_is_refused_as_it_is_read(tmp_path):
    """Red team, round 13: a seal of 64 lone surrogates passed the schema and failed the grader on
    the archive (retried on every run, every run's exit status 1)."""
    from attn_course.archive import Rejected, parse_manifest

    manifest = {"format": 1, "student_id": "alice", "assignment": workspace.ASSIGNMENT, "library_version": "0.1.0",
                "submitted": "2026-11-21T00:00:00+00:00", "files": {}}
    for seal in ("\ud800" * 64, "G" * 64, "A" * 64, "a" * 63 + "\n"):
        raw = json.dumps({**manifest, "seal": seal}).encode()
        with pytest.raises(Rejected, match="'seal' must be 64 lower-case hex digits"):
            parse_manifest(raw)
        assert not identity.verify_seal({**manifest, "seal": seal}, SECRET)
    assert parse_manifest(json.dumps({**manifest, "seal": "a" * 64}).encode())["seal"] == "a" * 64


def test_a_copy_of_a_students_archive_handed_in_later_changes_nothing(tmp_path):
    """Red team, round 12: Bob hands in, later, an exact copy of Alice's last archive (she became
    a day late) or of her earlier draft (it became her last).  A submission received again counts
    from when it first came."""
    from attn_course.results import ArchiveResult, latest_by_student

    def res(name, received, submission, total):
        return ArchiveResult(name, "", "", ["3.1"], received=received, student_id="alice", identity="ok",
                             scores={"3.1": total}, submission=submission)

    draft, final = res("draft.zip", 100.0, "d" * 64, 1.0), res("final.zip", 200.0, "f" * 64, 3.0)
    final_again = res("bob-copy-of-final.zip", 900.0, "f" * 64, 3.0)
    draft_again = res("bob-copy-of-draft.zip", 950.0, "d" * 64, 1.0)
    assert latest_by_student([draft, final])["alice"].archive == "final.zip"
    best = latest_by_student([draft, final, final_again])["alice"]
    assert best.received == 200.0 and best.total == 3.0 and best.archive == "final.zip"  # not late
    best = latest_by_student([draft, final, draft_again])["alice"]
    assert best.archive == "final.zip" and best.received == 200.0  # the draft does not come back
    # a new submission of hers (another digest) still counts from when it came
    later = res("final2.zip", 1000.0, "e" * 64, 2.0)
    assert latest_by_student([draft, final, draft_again, later])["alice"].archive == "final2.zip"
    # results written before the digest existed: the file time, as before
    assert latest_by_student([res("a.zip", 5.0, "", 1.0), res("b.zip", 7.0, "", 2.0)])["alice"].archive == "b.zip"


def test_the_archive_made_last_counts_whoever_hands_in_a_copy_and_when():
    """Red team, round 13: a sealed draft of Alice's that was never handed in (shared, left on a lab
    machine, replaced on the platform), handed in later by Bob, was the last received, so it
    counted, late; and copies with the same file time were ordered by their names, Bob's choice.
    The time the seal covers orders a student's archives; the file time only breaks ties."""
    from attn_course.results import ArchiveResult, latest_by_student

    def res(name, received, sealed_at, total, submission=""):
        return ArchiveResult(name, "", "", ["3.1"], received=received, student_id="alice", identity="ok",
                             scores={"3.1": total}, submission=submission or name, sealed_at=sealed_at)

    final = res("final.zip", 200.0, 2_000.0, 3.0)
    unseen_draft = res("zz-bob.zip", 900.0, 1_500.0, 0.0)
    assert latest_by_student([final, unseen_draft])["alice"].archive == "final.zip"
    same_time = res("zz-bob-copy.zip", 200.0, 1_000.0, 0.0)
    assert latest_by_student([final, same_time])["alice"].archive == "final.zip"
    # a later archive of hers counts, whenever it came
    assert latest_by_student([final, unseen_draft, res("again.zip", 950.0, 2_500.0, 2.0)])["alice"].total == 2.0
    # with no verified seal (--trust-manifest-ids), the file time alone, as before
    a, b = res("a.zip", 5.0, None, 1.0), res("b.zip", 7.0, None, 2.0)
    assert latest_by_student([a, b])["alice"].archive == "b.zip"
    import datetime

    eleven = datetime.datetime(2026, 11, 20, 11, tzinfo=datetime.timezone.utc).timestamp()
    assert identity.sealed_time({"submitted": "2026-11-20T11:00:00+00:00"}) == eleven
    assert identity.sealed_time({"submitted": "2026-11-20T12:00:00+01:00"}) == eleven
    assert identity.sealed_time({"submitted": "2026-11-20T11:00:00"}) == eleven  # (no zone: UTC)
    assert identity.sealed_time({"submitted": "yesterday"}) is None and identity.sealed_time({}) is None


def test_student_id_pattern_refuses_a_trailing_newline():
    """`$` matches before a final newline; the id pattern must not."""
    assert workspace.STUDENT_ID is identity.STUDENT_ID
    assert not identity.valid_student_id("s1\n")
    with pytest.raises(workspace.WorkspaceError):
        workspace.check_student_id("s1\n")
    assert workspace.check_student_id("s1") == "s1"


@pytest.mark.parametrize("text, words", [
    ("student_id,name,student_id\ns1,Alice,s2\n", "two 'student_id' columns"),
    ('student_id\n"s1\n', "not CSV"),
    ("student_id\ns\u04301\n", "'s\\u04301'"),  # a Cyrillic a: shown as what it is
])
def test_ambiguous_or_deceptive_rosters_are_refused(tmp_path, text, words):
    path = tmp_path / "roster.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RosterError, match=re.escape(words)):
        load_roster(path)


def test_token_shows_a_look_alike_id_as_what_it_is(capsys, monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    assert cli.main(["token", "s\u04301"]) == 2
    assert "'s\\u04301'" in capsys.readouterr().err
