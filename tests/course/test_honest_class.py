"""An honest class, end to end: archives from `attn-course submit`-style
workspaces -> `attn-course grade` -> gradebook, feedback, report, histograms."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attn_course import RELEASE_LIBRARY, ROOT
from attn_course.archive import build_archive, library_files
from attn_course.workspace import ASSIGNMENT
from attn_course.identity import token_for

SECRET = "honest-class-secret"

pytestmark = pytest.mark.slow


def test_honest_class(tmp_path):
    subs = tmp_path / "submitted"
    subs.mkdir()
    ref, stub = library_files(ROOT), library_files(RELEASE_LIBRARY)
    for k in range(4):
        build_archive(subs / f"student{k}.zip", f"student{k}", ref, token=token_for(f"student{k}", SECRET))
    build_archive(subs / "late.zip", "late", stub, token=token_for("late", SECRET))
    out = tmp_path / "grading"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", ATTN_COURSE_SECRET=SECRET)
    r = subprocess.run([sys.executable, "-m", "attn_course.cli", "grade", str(subs), "--out", str(out),
                        "--exercises", "3"], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "[5/5]" in r.stdout and "5 archives; 0 already graded, 5 to grade" in r.stdout
    rows = {row["student_id"]: row for row in csv.DictReader(open(out / "gradebook.csv"))}
    assert set(rows) == {"student0", "student1", "student2", "student3", "late"}
    for k in range(4):
        assert rows[f"student{k}"]["total"] == "12" and rows[f"student{k}"]["3.1"] == "3"
    assert rows["late"]["total"] == "0"
    fb = (out / "feedback" / "late.md").read_text()
    assert "Not implemented." in fb and "Total: 0 / 12" in fb
    assert "All cases pass." in (out / "feedback" / "student0.md").read_text()
    assert (out / "histograms.svg").read_text().startswith("<svg")
    report = (out / "report.md").read_text()
    assert "| 3.1 | 3 | 2.40 | 4 | 1 |" in report, report
    assert oct(out.stat().st_mode & 0o777) == "0o700"
    # a second run grades nothing; --regrade grades everything again
    r = subprocess.run([sys.executable, "-m", "attn_course.cli", "grade", str(subs), "--out", str(out),
                        "--exercises", "3"], capture_output=True, text=True, env=env, timeout=900)
    assert "5 already graded, 0 to grade" in r.stdout


def test_identity_secret_and_receipt_policy(tmp_path):
    """No secret: refused.  A classmate's id with one's own token: rejected.  The archive made last
    counts.  A change of secret is refused (a mistyped secret rejected every archive and emptied the
    gradebook) unless --regrade asks to grade again under the new one."""
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    subs.mkdir()
    stub = library_files(RELEASE_LIBRARY)
    ref = library_files(ROOT)
    env = {k: v for k, v in os.environ.items() if k != "ATTN_COURSE_SECRET"}
    env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    # one worker: most archives are refused before running, and what is tested is who counts, not
    # running side by side (a second server would cost a start per run)
    cmd = [sys.executable, "-m", "attn_course.cli", "grade", str(subs), "--out", str(out), "--exercises", "3.5",
           "--jobs", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2 and "ATTN_COURSE_SECRET" in r.stderr and not out.exists()
    # alice hands in a draft (the stub), then her last archive (the reference's code)
    draft = build_archive(subs / "alice-1.zip", "alice", stub, token=token_for("alice", SECRET),
                          submitted="2026-11-20T10:00:00+00:00")
    last = build_archive(subs / "alice-2.zip", "alice", ref, token=token_for("alice", SECRET),
                         submitted="2026-11-20T11:00:00+00:00")
    os.utime(draft, (1_700_000_000, 1_700_000_000))
    os.utime(last, (1_700_000_100, 1_700_000_100))
    # mallory submits as bob with her own token, and once with no token at all
    build_archive(subs / "mallory.zip", "bob", ref, token=token_for("mallory", SECRET))
    build_archive(subs / "anon.zip", "carol", ref)
    # ... then hands in, later, a copy of alice's draft and a draft of alice's that alice never handed
    # in (red team, rounds 12 and 13: each became her last), and an archive as dave with dave's token
    # in plain text, as an older attn-course wrote it
    shutil.copyfile(draft, subs / "mallory-copy.zip")
    os.utime(subs / "mallory-copy.zip", (1_700_000_900, 1_700_000_900))
    unseen = build_archive(subs / "mallory-draft.zip", "alice", stub, token=token_for("alice", SECRET),
                           submitted="2026-11-20T10:30:00+00:00")
    os.utime(unseen, (1_700_000_950, 1_700_000_950))
    with zipfile.ZipFile(subs / "dave.zip", "w") as z:
        z.writestr("manifest.json", json.dumps({
            "format": 1, "student_id": "dave", "assignment": ASSIGNMENT, "library_version": "0.1.0",
            "submitted": "2026-11-21T00:00:00+00:00", "token": token_for("dave", SECRET),
            "files": {n: hashlib.sha256(d).hexdigest() for n, d in ref.items()}}))
        for n, d in ref.items():
            z.writestr(n, d)
    env["ATTN_COURSE_SECRET"] = SECRET
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["student_id"]: row for row in csv.DictReader(open(out / "gradebook.csv"))}
    assert set(rows) == {"alice"}
    assert rows["alice"]["archive"] == "alice-2.zip" and rows["alice"]["total"] == "2"
    report = (out / "report.md").read_text()
    assert "several archives" in report and "bad\\_token" in report or "bad_token" in report
    assert "missing" in report and "plain" in report and "ask your instructor for a new one" in report
    # another secret (a typo, or a secret file's line end): refused, the grading kept as it was
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "run.lock"}
    for other in (SECRET + "-rotated", SECRET + "\n", " "):
        env["ATTN_COURSE_SECRET"] = other
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert ("graded under another course secret" in r.stderr if other.strip() == other
                else "begins or ends with a space or a line end" in r.stderr), r.stderr
        assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "run.lock"} == before
    # ... and graded again under the new one only when asked
    env["ATTN_COURSE_SECRET"] = SECRET + "-rotated"
    r = subprocess.run(cmd + ["--regrade"], capture_output=True, text=True, env=env, timeout=900)
    assert "0 already graded, 7 to grade" in r.stdout, r.stdout[-2000:]


def test_ctrl_c_stops_within_seconds_and_keeps_finished_results(tmp_path):
    """Two archives hang in every exercise; Ctrl-C while they run ends the command promptly."""
    import signal
    import time

    from server_jobs import needs_bwrap

    needs_bwrap()
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    subs.mkdir()
    ref = library_files(ROOT)
    build_archive(subs / "a-honest.zip", "honest", ref, token=token_for("honest", SECRET))
    hang = b"\nimport time\ndef zero_temperature_limit(S, mask=None):\n    time.sleep(10**6)\n"
    for k in range(2):
        files = {**ref, "attn_tensors/statmech.py": ref["attn_tensors/statmech.py"] + hang}
        build_archive(subs / f"hang{k}.zip", f"hang{k}", files, token=token_for(f"hang{k}", SECRET))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", ATTN_COURSE_SECRET=SECRET,
               PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "attn_course.cli", "grade", str(subs), "--out", str(out),
                             "--exercises", "3.5", "--jobs", "2"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            # a shell that starts the suite in the background (`make test &`) ignores
                            # SIGINT, and Python then leaves it ignored: the command gets it as a terminal would
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    for line in proc.stdout:  # wait until the honest archive is done and the hanging ones run
        seen.append(line)
        if "a-honest.zip" in line:
            break
    time.sleep(2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=120)[0]
    stopped = time.monotonic() - t0
    assert proc.returncode == 130, "".join(seen) + rest
    assert stopped < 25, stopped  # the hanging exercises' limit is 30 s: nobody waited for them
    assert "interrupted" in rest
    done = list((out / "results").glob("a-honest-*.json"))
    assert done and not list((out / "results").glob("hang*.json"))


def test_an_untouched_release_is_run_once_per_class(tmp_path, monkeypatch):
    """Archives that change none of the release's modules share one run; any change is run."""
    from attn_course.grade import Grader

    subs = tmp_path / "submitted"
    subs.mkdir()
    stub = library_files(RELEASE_LIBRARY)
    for who in ("ann", "bo"):
        build_archive(subs / f"{who}.zip", who, stub)
    touched = {**stub, "attn_tensors/statmech.py": stub["attn_tensors/statmech.py"] + b"\n# my notes\n"}
    build_archive(subs / "cy.zip", "cy", touched)
    g = Grader(tmp_path / "grading", "3.5", jobs=1, log=lambda *a: None, ci_secret=True, require_token=False)
    runs = []
    real = Grader._run
    monkeypatch.setattr(Grader, "_run", lambda self, *a, **k: runs.append(a[2]) or real(self, *a, **k))
    results = {r.student_id: r for r in g.run(subs)}
    assert len(runs) == 2, "the second untouched archive ran again"
    assert sorted(files == g.release for files in runs) == [False, True]
    assert results["ann"].scores == results["bo"].scores == results["cy"].scores == {"3.5": 0.0}
    assert results["ann"].feedback == results["bo"].feedback == results["cy"].feedback
    assert results["ann"].feedback["3.5"]["status"] == "not_implemented"
