"""An honest class, end to end: archives from `attn-course submit`-style
workspaces -> `attn-course grade` -> gradebook, feedback, report, histograms."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attn_course import RELEASE_LIBRARY, ROOT
from attn_course.archive import build_archive, library_files

pytestmark = pytest.mark.slow


def test_honest_class(tmp_path):
    subs = tmp_path / "submitted"
    subs.mkdir()
    ref, stub = library_files(ROOT), library_files(RELEASE_LIBRARY)
    for k in range(4):
        build_archive(subs / f"student{k}.zip", f"student{k}", ref)
    build_archive(subs / "late.zip", "late", stub)
    out = tmp_path / "grading"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
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
    assert (out / "histograms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "| 3.1 | 3 | 2.40 | 4 | 1 |" in report, report
    assert oct(out.stat().st_mode & 0o777) == "0o700"
    # a second run grades nothing; --regrade grades everything again
    r = subprocess.run([sys.executable, "-m", "attn_course.cli", "grade", str(subs), "--out", str(out),
                        "--exercises", "3"], capture_output=True, text=True, env=env, timeout=900)
    assert "5 already graded, 0 to grade" in r.stdout
