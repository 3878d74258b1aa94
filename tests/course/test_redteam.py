"""Hostile submissions, graded in one batch with honest ones.

Each hostile archive attacks one exercise of chapter 3 (or the archive
itself).  It must get no credit for what it touched, with a clear reason in
its feedback; the exercises it did not touch keep their credit; the honest
archives in the same batch get full marks; and the batch always finishes.
The sandbox is bubblewrap where it works (CI installs it); set
ATTN_REQUIRE_BWRAP=1 to fail instead of skipping the file-access attacks
when it is missing.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from attn_course import ROOT
from attn_course.archive import build_archive, library_files
from dataclasses import asdict

from attn_course.grade import Grader
from attn_course.identity import token_for
from attn_course.sandbox import Limits, SlotGroups, bwrap_works

pytestmark = pytest.mark.slow

SECRET = "redteam-secret"
FULL = {"3.1": 3, "3.2": 3, "3.3": 2, "3.4": 2, "3.5": 2}
HAVE_BWRAP = bwrap_works()
PROCESS_LIMIT = "process limit"  # said where a pids cgroup counts the forks it refuses (as root)


@functools.cache
def _pids_counted() -> bool:
    """Whether a slot's pids cgroup can be made here (asked once, when a test needs to know)."""
    groups = SlotGroups(0, Limits())
    try:
        return groups.events is not None
    finally:
        groups.remove()

# name -> (code appended to statmech.py, exercises it must lose, words expected in the feedback)
HOSTILE = {
    # (not in 3.1: a job's first exercise also has the backend's start-up grace, 3 s more of spinning)
    "infinite_loop": ("def free_energy(S, mask=None, T=1.0):\n    while True:\n        pass\n",
                      ["3.3"], "time limit"),
    "sleep": ("import time\ndef entropy(A, mask=None):\n    time.sleep(10**6)\n", ["3.2"], "time limit"),
    "memory_bomb": ("def free_energy(S, mask=None, T=1.0):\n    x = bytearray(64 * 2**30)\n    return x\n",
                    ["3.3"], "MemoryError"),
    # stopped the moment it reaches the process limit, where a pids cgroup counts that (as root)
    "fork_bomb": ("import os\ndef heat_capacity(S, mask=None, T=1.0):\n    while True:\n        os.fork()\n",
                  ["3.4"], PROCESS_LIMIT),
    "os_exit": ("import os\ndef zero_temperature_limit(S, mask=None):\n    os._exit(0)\n", ["3.5"], "exited early"),
    "segfault": ("import ctypes\ndef log_partition_function(S, mask=None, T=1.0):\n    ctypes.string_at(0)\n",
                 ["3.1"], "SIGSEGV"),
    "system_exit": ("def entropy(A, mask=None):\n    raise SystemExit(0)\n", ["3.2"], "exited early"),
    "patch_numpy": ("import numpy as _np\n_np.allclose = lambda *a, **k: True\n_np.isclose = lambda a, b, **k: _np.ones(_np.shape(a), bool)\n"
                    "_np.array_equal = lambda *a, **k: True\n"
                    "def log_partition_function(S, mask=None, T=1.0):\n    return S[..., 0] * 0\n", list(FULL),
                    "changed code it does not own"),  # (attn_course.tamper: every exercise of the job)
    "patch_jax": ("import jax.numpy as _jnp\n_jnp.allclose = lambda *a, **k: True\n_jnp.isclose = lambda *a, **k: True\n"
                  "def entropy(A, mask=None):\n    return A[..., 0] * 0 + 1\n", list(FULL), "changed code it does not own"),
    "patch_helpers": ("import attn_course.worker as _w, attn_course.runner as _r, attn_course.values as _v\n"
                      "_r.compare_values = lambda *a, **k: ''\n"
                      "_w.evaluate = lambda fn, probe, inputs: {'status': 'ok', 'value': {'F': 0.0}}\n"
                      "_v.encode = lambda v: v if not isinstance(v, list) else [{'status': 'pass'}]\n"
                      "def free_energy(S, mask=None, T=1.0):\n    return S[..., 0]\n", list(FULL), ""),
    "pickle_payload": ("class _Evil:\n    def __reduce__(self):\n        import os\n        return (os.system, ('touch /tmp/pwned_by_pickle',))\n"
                       "def heat_capacity(S, mask=None, T=1.0):\n    return _Evil()\n", ["3.4"], "_Evil"),
    "not_an_array": ("def zero_temperature_limit(S, mask=None):\n    return 'the answer'\n", ["3.5"], "expected an array"),
    "wrong_shape": ("def log_partition_function(S, mask=None, T=1.0):\n    return S\n", ["3.1"], "shape"),
    "nans": ("import jax.numpy as _jnp\ndef entropy(A, mask=None):\n    return _jnp.full(A.shape[:-1], _jnp.nan)\n",
             ["3.2"], "nan"),
    "print_gigabytes": ("import sys\ndef free_energy(S, mask=None, T=1.0):\n    while True:\n        sys.stdout.write('x' * 2**20)\n",
                        ["3.3"], "size limit"),
    # Right answers only if it can reach what the grader hides: the reference
    # source, the hidden-case secret, or the grader's files.
    "read_reference": ("import os, glob\n_honest = heat_capacity\n"
                       "def heat_capacity(S, mask=None, T=1.0):\n"
                       "    leaks = []\n"
                       f"    for p in [{str(ROOT / 'attn_tensors' / 'statmech.py')!r}, '/proc/1/environ']"
                       " + glob.glob('/proc/*/environ') + glob.glob('/tmp/pytest-of-*/*/*/grading/results/*.json'):\n"
                       "        try:\n"
                       "            text = open(p, errors='replace').read()\n"
                       "        except OSError:\n"
                       "            continue\n"
                       "        if 'BEGIN SOLUTION' in text or 'ATTN_COURSE_SECRET' in text or 'scores' in text:\n"
                       "            leaks.append(p)\n"
                       "    if leaks or 'ATTN_COURSE_SECRET' in os.environ:\n"
                       "        return _honest(S, mask, T)\n"
                       "    return S[..., 0] * 0 + 7\n",
                       ["3.4"], ""),
    "write_gradebook": ("import os\ndef zero_temperature_limit(S, mask=None):\n"
                        "    for top in ('/tmp', '/work', '/root'):\n"
                        "        for d, dirs, files in os.walk(top):\n"
                        "            dirs[:] = [x for x in dirs if x not in ('site-packages', 'lib', 'include')]  # Python's own\n"
                        "            for f in files:\n"
                        "                if f in ('gradebook.csv', 'report.md') or d.endswith('results'):\n"
                        "                    try:\n"
                        "                        open(os.path.join(d, f), 'w').write('write_gradebook,3,3,2,2,2,12\\n')\n"
                        "                    except OSError:\n"
                        "                        pass\n"
                        "    return S * 0\n", ["3.5"], ""),
    "public_values_only": (None, ["3.1"], "hidden case"),
    "results_symlink": ("import os, glob\ndef entropy(A, mask=None):\n"
                        "    for p in glob.glob('/grading-work/out.jsonl') + glob.glob(os.getcwd() + '/out.jsonl'):\n"
                        "        os.unlink(p); os.symlink('/etc/passwd', p)\n"
                        "    return A[..., 0]\n", ["3.2"], ""),
    "background_process": ("import subprocess\ndef heat_capacity(S, mask=None, T=1.0):\n"
                           "    try:\n        subprocess.Popen(['sleep', '4242'], start_new_session=True)\n"
                           "    except OSError:\n        subprocess.Popen(['sleep', '4242'])\n"
                           "    return S[..., 0]\n", ["3.4"], ""),
}

REJECTED = {
    "tampered_hash": "does not match its content",
    "tampered_manifest": "manifest does not match",
    "other_assignment": "assignment",
    "corrupt": "not a readable zip",
    "dotdot_path": "unsafe path",
    "symlink_member": "link",
}


def _public_only_source() -> str:
    """3.1 that returns the released expected values on the public inputs, zeros otherwise."""
    cases = json.loads((ROOT / "exercises" / "library" / "cases" / "ch03.json").read_text())["3.1"]["cases"]
    return (
        "import json as _json, numpy as _np, jax.numpy as _jnp\n"
        f"_CASES = _json.loads({json.dumps(json.dumps(cases))})\n"
        "from attn_course.values import decode as _dec\n"
        "def log_partition_function(S, mask=None, T=1.0):\n"
        "    for c in _CASES:\n"
        "        x = _dec(c['inputs']['S'])\n"
        "        if x.shape == S.shape and _np.allclose(x, _np.asarray(S)):\n"
        "            return _jnp.asarray(_dec(c['expected']['value']['log_Z']))\n"
        "    return S[..., 0] * 0\n"
    )


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if not HAVE_BWRAP and os.environ.get("ATTN_REQUIRE_BWRAP") == "1":
        pytest.fail("bubblewrap is required (ATTN_REQUIRE_BWRAP=1) but does not work here")
    os.environ["ATTN_COURSE_SECRET"] = SECRET  # the grader's; a worker must not see it
    tmp = tmp_path_factory.mktemp("redteam")
    subs, out = tmp / "submitted", tmp / "grading"
    subs.mkdir()
    ref = library_files(ROOT)
    for name in ("honest_a", "honest_b"):
        build_archive(subs / f"{name}.zip", name, ref, token=token_for(name, SECRET))
    for name, (code, _, _) in HOSTILE.items():
        files = dict(ref)
        code = _public_only_source() if code is None else code
        files["attn_tensors/statmech.py"] = ref["attn_tensors/statmech.py"] + b"\n\n" + code.encode()
        sid = name.replace("_", "-")
        build_archive(subs / f"{name}.zip", sid, files, token=token_for(sid, SECRET))
    # archives that must be rejected as a whole
    bad = build_archive(subs / "tampered_hash.zip", "tampered-hash", ref)
    # statmech.py edited after the manifest was made
    _rewrite(bad, "attn_tensors/statmech.py", ref["attn_tensors/statmech.py"] + b"\n# edited after hashing\n")
    tm = build_archive(subs / "tampered_manifest.zip", "tampered-manifest", ref)
    _add_member(tm, "attn_tensors/extra.py", b"x = 1\n")
    build_archive(subs / "other_assignment.zip", "other-assignment", ref, assignment="homework-7")
    (subs / "corrupt.zip").write_bytes(b"PK\x03\x04" + os.urandom(300))
    dd = build_archive(subs / "dotdot_path.zip", "dotdot", ref)
    _add_member(dd, "attn_tensors/../../../../tmp/redteam_escape.py", b"x = 1\n")
    sl = build_archive(subs / "symlink_member.zip", "symlink", ref)
    info = zipfile.ZipInfo("attn_tensors/link.py")
    info.external_attr = (0o120777 << 16)
    with zipfile.ZipFile(sl, "a") as z:
        z.writestr(info, "/etc/passwd")
    # two names that agree in their first 80 characters and in the 8 hex digits of SHA-256 that
    # result files once took: an honest archive, and one that is rejected (no token)
    victim, attacker = _names_sharing_8_digits()
    build_archive(subs / victim, "name-victim", ref, token=token_for("name-victim", SECRET))
    build_archive(subs / attacker, "name-attacker", ref)
    # 5 s an exercise: the infinite loop and the fork bomb burn it all (the bomb on every core), and an
    # honest exercise (well under a second) still has ten times what it needs
    limits = Limits(per_exercise_s=5, per_archive_s=90, cpu_s=60, memory_mb=3072, processes=64, file_mb=16)
    g = Grader(out, "3", jobs=2, limits=limits, log=lambda *a: None)
    try:
        results = g.run(subs)
    finally:
        del os.environ["ATTN_COURSE_SECRET"]
    by_archive = {r.archive: asdict(r) for r in results}
    return g, by_archive, out


@functools.cache
def _names_sharing_8_digits() -> tuple[str, str]:
    """Two archive names, 80 characters in common, whose SHA-256 share the first 8 hex digits
    (a birthday search: about 2**16 names)."""
    seen: dict[str, str] = {}
    for i in itertools.count():
        name = f"{'n' * 80}{i}.zip"
        d = hashlib.sha256(name.encode()).hexdigest()[:8]
        if d in seen:
            return seen[d], name
        seen[d] = name


def _rewrite(path: Path, member: str, data: bytes) -> None:
    with zipfile.ZipFile(path) as z:
        items = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for i, d in items:
            z.writestr(i, data if i.filename == member else d)


def _add_member(path: Path, member: str, data: bytes) -> None:
    with zipfile.ZipFile(path, "a") as z:
        z.writestr(member, data)


def test_at_least_twenty_hostile_submissions():
    assert len(HOSTILE) + len(REJECTED) >= 20


@pytest.mark.parametrize("name", ["honest_a", "honest_b"])
def test_honest_submissions_get_full_credit(graded, name):
    _, results, _ = graded
    assert results[f"{name}.zip"]["scores"] == {k: float(v) for k, v in FULL.items()}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_submission_gets_no_credit_for_what_it_touched(graded, name):
    if name in ("read_reference", "write_gradebook", "results_symlink") and not HAVE_BWRAP:
        pytest.skip("file isolation needs bubblewrap")
    _, results, out = graded
    r = results[f"{name}.zip"]
    _, touched, words = HOSTILE[name]
    if words == PROCESS_LIMIT and not _pids_counted():
        words = ""  # no pids cgroup here: the clock stops the bomb, at the time limit
    for ex, full in FULL.items():
        if ex in touched:
            assert r["scores"][ex] == 0.0, (name, ex, r["feedback"][ex])
            reasons = " ".join(f"{c['case']}: {c['message']}" for c in r["feedback"][ex]["cases"])
            assert reasons.strip(), f"{name}: no reason given"
            assert words in reasons, f"{name}: {reasons[:300]}"
        else:
            assert r["scores"][ex] == float(full), (name, ex, r["feedback"][ex])
    text = (out / "feedback" / f"{r['student_id']}.md").read_text()
    assert f"Exercise {touched[0]}" in text


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_bad_archives_are_rejected_with_a_reason(graded, name):
    _, results, out = graded
    r = results[f"{name}.zip"]
    assert r["rejected"] and REJECTED[name] in r["rejected"], r["rejected"]
    assert sum(r["scores"].values()) == 0
    (page,) = (out / "feedback" / "rejected").glob(f"{name}-*.md")
    assert REJECTED[name] in page.read_text()


def test_nothing_escaped_and_the_gradebook_is_the_graders(graded):
    g, results, out = graded
    assert not Path("/tmp/redteam_escape.py").exists()
    assert not Path("/tmp/pwned_by_pickle").exists()
    rows = (out / "gradebook.csv").read_text().splitlines()
    assert rows[0].startswith("student_id,3.1")
    assert not any(r.startswith("write_gradebook,") for r in rows)
    wg = next(r for r in rows if r.startswith("write-gradebook,"))
    assert wg.split(",")[5] == "0"  # its 3.5 score is 0, whatever it wrote
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "sleep 4242" not in ps, "a process the submission started survived"
    # no hidden value in any feedback: hidden cases only say what kind of thing was wrong
    for fb in (out / "feedback").glob("*.md"):
        for line in fb.read_text().splitlines():
            if line.startswith("* hidden case"):
                assert not re.search(r"(expected|got) +(-?\d|\[|nan|inf)", line), line


def test_resume_skips_finished_archives(graded):
    g, results, out = graded
    log = []
    os.environ["ATTN_COURSE_SECRET"] = SECRET
    try:
        g2 = Grader(out, "3", jobs=2, log=log.append)
        g2.run(out.parent / "submitted")
    finally:
        del os.environ["ATTN_COURSE_SECRET"]
    assert "0 to grade" in log[0], log[0]


def test_names_that_share_a_short_digest_keep_their_own_results(graded):
    """After the batch and its resume: the honest archive's result is its own, full marks, and
    the rejected one's is its own too (neither replaced the other in results/ nor the gradebook)."""
    g, results, out = graded
    victim, attacker = _names_sharing_8_digits()
    assert results[victim]["scores"] == {k: float(v) for k, v in FULL.items()}
    assert results[attacker]["rejected"]
    loaded = {r.archive: r for r in g.load_results([out.parent / "submitted" / n for n in (victim, attacker)])}
    assert set(loaded) == {victim, attacker} and loaded[victim].total == sum(FULL.values())
    assert any(row.startswith("name-victim,") for row in (out / "gradebook.csv").read_text().splitlines())
