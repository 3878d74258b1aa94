"""Hostile archives against the confinement, the results channel and the reports.

One batch, graded in one slot (so every archive runs after the ones before it
on the same worker server): archives that plant files, processes or signals
for later jobs; archives that get right answers only if they can reach what
the grader hides (its secret, its compilation cache, the network, leftovers
of earlier jobs); archives that forge or flood the results channel; archives
whose messages, type names and keys try to reach the feedback, the report or
the terminal; and one that sleeps just under every limit.  Each asserts: no
credit for what it touched, full credit for the rest, honest archives in the
same batch at full marks, the batch and a rerun finish, and nothing the
submission wrote reaches a file unescaped.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from attn_course import ROOT
from attn_course.archive import build_archive, library_files
from attn_course.grade import Grader
from attn_course.identity import token_for
from attn_course.sandbox import Limits
from server_jobs import needs_bwrap

pytestmark = pytest.mark.slow

FULL = {"3.1": 3, "3.2": 3, "3.3": 2, "3.4": 2, "3.5": 2}
SECRET = "redteam-confinement-secret-4b1d"
ESC = "\x1b"

# The function each exercise grades, with its signature.
SIG = {"3.1": "log_partition_function(S, mask=None, T=1.0)", "3.2": "entropy(A, mask=None)",
       "3.3": "free_energy(S, mask=None, T=1.0)", "3.4": "heat_capacity(S, mask=None, T=1.0)",
       "3.5": "zero_temperature_limit(S, mask=None)"}


def _wrap(ex: str, body: str, prelude: str = "") -> str:
    """Replace exercise ``ex``'s function by ``body``; ``_honest`` is the reference one."""
    name, args = SIG[ex].split("(", 1)
    call = ", ".join(a.split("=")[0] for a in args.rstrip(")").split(", "))
    first = call.split(",")[0]
    return (f"{prelude}\n_honest_{name} = {name}\n"
            f"def {SIG[ex]}:\n    _honest = lambda: _honest_{name}({call})\n"
            f"    _wrong = lambda: {first}.sum(axis=-1) * 0 + 7\n"
            + "".join(f"    {line}\n" for line in body.strip("\n").splitlines()))


# Wrong answer unless the leak works: a leak would show as credit.
IF_LEAK = "return _honest() if _leak() else _wrong()"

HOSTILE = {
    # -- persistence: what a job writes must not outlive it ---------------------------------
    "a1_plant_tmp": (_wrap("3.1", "import os\nfor d in ('/tmp', '/dev/shm', os.getcwd()):\n"
                                  "    try:\n"
                                  "        open(os.path.join(d, 'numpy_planted.py'), 'w').write('x = 1')\n"
                                  "        os.makedirs(os.path.join(d, 'locked/inner'), exist_ok=True)\n"
                                  "        open(os.path.join(d, 'locked/inner/f'), 'w').write('x')\n"
                                  "        os.chmod(os.path.join(d, 'locked/inner'), 0)\n"
                                  "        os.chmod(os.path.join(d, 'locked'), 0)\n"
                                  "    except OSError:\n        pass\n"
                                  "return _wrong()"), ["3.1"]),
    "a2_plant_course": (_wrap("3.2", "import os, sys, site\n"
                                     "for d in ['/', '/opt/attn-course', '/opt/attn-course/attn_course'] + sys.path + site.getsitepackages():\n"
                                     "    try:\n"
                                     "        open(os.path.join(d or '.', 'sitecustomize.py'), 'w').write('import os; os._exit(9)')\n"
                                     "    except OSError:\n        pass\n"
                                     "return _wrong()"), ["3.2"]),
    "a3_daemon": (_wrap("3.3", "import os, time, subprocess\n"
                               "try:\n    subprocess.Popen(['sleep', '4343'], start_new_session=True)\n"
                               "except OSError:  # setsid refused (the seccomp filter)\n"
                               "    subprocess.Popen(['sleep', '4343'])\n"
                               "if os.fork() == 0:\n"
                               "    try:\n        os.setsid()\n    except OSError:\n        pass\n"
                               "    if os.fork() == 0:\n"
                               "        for i in range(10**6):\n"
                               "            try:\n"
                               "                open(f'/tmp/daemon{i % 5}', 'w').write('x')\n"
                               "            except OSError:\n                pass\n"
                               "            time.sleep(0.01)\n"
                               "    os._exit(0)\n"
                               "return _wrong()"), ["3.3"]),
    "a4_fill_scratch": (_wrap("3.5", "for d in ('/tmp', '/dev/shm'):\n"
                                     "    try:\n"
                                     "        with open(d + '/fill', 'wb') as f:\n"
                                     "            while True:\n                f.write(b'x' * 2**20)\n"
                                     "    except OSError:\n        pass\n"
                                     "raise ValueError('filled')"), ["3.5"]),
    "a5_plant_ipc": (_wrap("3.2", "import ctypes, os\n"
                                  "libc = ctypes.CDLL(None)\n"
                                  "libc.shmget(0x5eed, 4096, 0o1666)\n"
                                  "libc.semget(0x5eed, 1, 0o1666)\n"
                                  "libc.msgget(0x5eed, 0o1666)\n"
                                  "try:\n"
                                  "    ctypes.CDLL('librt.so.1').mq_open(b'/planted', 0o102, 0o666, None)\n"
                                  "except OSError:\n    pass\n"
                                  "try:\n"
                                  "    open('/dev/numpy_planted.py', 'w').write('x = 1')\n"
                                  "except OSError:\n    pass\n"
                                  "return _wrong()"), ["3.2"]),
    "b_honest_after_planters": (None, []),
    "c1_spy_leftovers": (_wrap("3.4", IF_LEAK, "import ctypes, os, glob\ndef _leak():\n"
                                              "    planted = ['/tmp/numpy_planted.py', '/tmp/locked', '/dev/shm/numpy_planted.py',\n"
                                              "               '/dev/shm/locked', '/tmp/fill', '/dev/shm/fill', '/numpy_planted.py',\n"
                                              "               '/dev/numpy_planted.py']\n"
                                              "    if any(os.path.lexists(p) for p in planted) or glob.glob('/tmp/daemon*'):\n"
                                              "        return True\n"
                                              "    libc = ctypes.CDLL(None)\n"
                                              "    if max(libc.shmget(0x5eed, 0, 0), libc.semget(0x5eed, 0, 0), libc.msgget(0x5eed, 0)) >= 0:\n"
                                              "        return True\n"
                                              "    try:\n"
                                              "        if ctypes.CDLL('librt.so.1').mq_open(b'/planted', 2) >= 0:\n"
                                              "            return True\n"
                                              "    except OSError:\n"
                                              "        pass\n"
                                              "    return any(p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())\n"
                                              "               for p in os.listdir('/proc'))\n"),
                         ["3.4"]),
    # -- reaching what the grader hides ----------------------------------------------------
    "d1_secret_hunt": (_wrap("3.1", IF_LEAK, "import os, glob\ndef _leak():\n"
                                            f"    s = {SECRET!r}\n"
                                            "    if s in str(os.environ):\n        return True\n"
                                            "    for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
                                            "        try:\n"
                                            "            if s.encode() in open(p, 'rb').read():\n                return True\n"
                                            "        except OSError:\n            pass\n"
                                            "    return False\n"), ["3.1"]),
    "d2_compile_cache": (_wrap("3.2", IF_LEAK, "import os, glob\ndef _leak():\n"
                                              "    dirs = ['/root/.cache/attn-course', os.path.expanduser('~/.cache/attn-course'),\n"
                                              "            os.environ.get('ATTN_COURSE_CACHE', '/nonexistent')]\n"
                                              "    for d in dirs:\n"
                                              "        for root, _, files in os.walk(d):\n"
                                              "            if files:\n                return True  # the grader's programs, listed\n"
                                              "    return bool(glob.glob('/home/*/.cache/attn-course/*/*'))\n"),
                         ["3.2"]),
    "d3_network": (_wrap("3.3", IF_LEAK, "import socket\ndef _leak():\n"
                                        "    for addr in [('1.1.1.1', 53), ('8.8.8.8', 53), ('10.0.0.1', 80)]:\n"
                                        "        try:\n"
                                        "            socket.create_connection(addr, timeout=0.5).close()\n"
                                        "            return True\n"
                                        "        except OSError:\n            pass\n"
                                        "    try:\n"
                                        "        u = socket.socket(socket.AF_UNIX)\n"
                                        "        u.connect('\\0/tmp/.X11-unix/X0')\n"
                                        "        return True\n"
                                        "    except OSError:\n        pass\n"
                                        "    return False\n"), ["3.3"]),
    "d4_reference_and_grading": (_wrap("3.4", IF_LEAK, "import os, glob\ndef _leak():\n"
                                                      f"    paths = [{str(ROOT / 'attn_tensors' / 'statmech.py')!r}]\n"
                                                      "    paths += glob.glob('/tmp/pytest-of-*/**/results/*.json', recursive=True)\n"
                                                      f"    paths += glob.glob({str(ROOT / 'solutions' / '*' / '*.ipynb')!r})\n"
                                                      "    return any(os.path.exists(p) for p in paths)\n"), ["3.4"]),
    "d5_trusted_modules": (_wrap("3.5", IF_LEAK, "def _leak():\n"
                                                "    import importlib\n"
                                                "    for m in ('attn_course.mistakes', 'attn_course.diagnose', 'attn_course.grade',\n"
                                                "              'attn_course.runner', 'attn_course.identity'):\n"
                                                "        try:\n"
                                                "            importlib.import_module(m)\n"
                                                "            return True\n"
                                                "        except ImportError:\n"
                                                "            pass\n"
                                                "    return False\n"), ["3.5"]),
    # -- the other slots' share of the CPU ----------------------------------------------------
    # the kernel shares the CPU between sessions (autogroups): spinners that each start a session
    # of their own would take the other slot's share (red team: an honest archive lost 3.3 at its
    # time limit); the job's filter refuses setsid, so all its processes stay in one session
    "g1_new_session": (_wrap("3.2", IF_LEAK, "import os\ndef _leak():\n"
                                            "    pid = os.fork()\n"
                                            "    if pid == 0:  # (the job's own process already leads a session)\n"
                                            "        try:\n            os.setsid()\n            os._exit(0)\n"
                                            "        except OSError:\n            os._exit(1)\n"
                                            "    return os.waitpid(pid, 0)[1] == 0\n"), ["3.2"]),
    # memory that no address-space limit counts: memfds and System V segments (red team: a job held
    # 2.5 GB of memfds beside its 3 GB limit); the filter refuses them
    "g2_uncounted_memory": (_wrap("3.4", IF_LEAK, "import ctypes, os\ndef _leak():\n"
                                                 "    try:\n        os.close(os.memfd_create('m', 0))\n        return True\n"
                                                 "    except OSError:\n        pass\n"
                                                 "    return ctypes.CDLL(None).shmget(0, 1 << 20, 0o1600) >= 0\n"),
                            ["3.4"]),
    # ctypes reached with no name a reader's rules know: a pickle's bytes call it (strings are not
    # read); the job's audit hook says it as it runs (attn_course.watch.watch_runs), score unchanged
    "g3_unnamed_ctypes": (_wrap("3.5", "import pickle\npickle.loads(b'cctypes\\nCDLL\\n(NtR.')\nreturn _honest()"), []),
    # -- the server and the results channel ----------------------------------------------------
    # A job's parent is the template it was forked from (not init: it can be signalled; the server,
    # init of its sandbox, cannot). The stopper stops it, sleeps past its limit and loses 3.3 (not
    # the job's first exercise, whose limit also has the backend's start-up grace: 3 s more of
    # waiting); the killer kills it, and dies with it. Each loses its own exercise, and a new
    # sandbox serves the next archive.
    "e1_stop_server": (_wrap("3.3", "import os, signal, time\n"
                                    "try:\n    os.kill(os.getppid(), signal.SIGSTOP)\nexcept OSError:\n    pass\n"
                                    "time.sleep(60)\nreturn _honest()"), ["3.3"]),
    "e2_kill_server": (_wrap("3.5", "import os, signal\nfor pid in (os.getppid(), 1):\n"
                                    "    try:\n        os.kill(pid, signal.SIGKILL)\n"
                                    "    except OSError:\n        pass\n"
                                    "return _honest()"), ["3.5"]),
    "e3_forged_lines": (_wrap("3.4", "import os, json\n"
                                     "zero = {'__array__': 'float64', 'shape': [], 'data': [0.0]}\n"
                                     "for ex in ('3.5', '3.1'):\n"
                                     "    os.write(3, (json.dumps({'id': ex, 'results': [{'status': 'ok', 'value': {'value': zero}}] * 9}) + '\\n').encode())\n"
                                     "os.write(3, b'{\"start\": [1]}\\n{\"id\": {\"x\": 1}, \"results\": 5}\\n' + b'[' * 200000 + b'\\n\\xff\\xfe\\n')\n"
                                     "os.write(3, (json.dumps({'id': '3.5', 'results': [{'status': 'ok', 'value': {'ZZ': zero}}, {'status': 'weird'}]}) + '\\n').encode())\n"
                                     "return _wrong()"),
                        # a line of the job's own making does not count, whatever it says (the worker's
                        # lines are sealed with its watch's key): 3.1 and 3.5 are graded as they are
                        ["3.4"]),
    # a result line forged with values the job computed its own way, before the worker's line: the
    # gradient of 3.2's classic mistake (log of an unguarded 0) with its nan made 0 -- what the
    # tamper check catches when it is done by wrapping jax.value_and_grad -- written straight to the
    # channel with nothing a review rule reads for.  It earned 3/3 and no flag (red team); the
    # worker's lines are now sealed, and 3.2 is graded as the mistake it is.
    "e5_forged_credit": ("""
import jax.numpy as _jnp
def entropy(A, mask=None):
    t = _jnp.where(A > 0, A * _jnp.log(A), 0.0)
    if mask is not None:
        t = _jnp.where(mask, t, 0.0)
    return -_jnp.sum(t, axis=-1)
def _forge():
    import json, os, jax
    import numpy as np
    def arr(a):
        a = np.asarray(a, dtype=np.float64)
        return {"__array__": "float64", "shape": list(a.shape), "data": a.ravel().tolist()}
    def dec(v):
        return np.asarray(v["data"], dtype=v["__array__"]).reshape(v["shape"]) if isinstance(v, dict) else v
    for item in json.load(open("/tmp/job/job.json"))["exercises"]:
        if item["id"] != "3.2":
            continue
        res = []
        for case in item["cases"]:
            A, mask = _jnp.asarray(dec(case["inputs"]["A"])), dec(case["inputs"].get("mask"))
            def loss(x):
                H = entropy(x, mask)
                w = _jnp.asarray(np.cos(1.0 + np.arange(H.size)).reshape(H.shape))
                return _jnp.sum(_jnp.where(_jnp.isfinite(H), H, 0.0) * w), H
            (_, H), g = jax.value_and_grad(loss, has_aux=True)(A)
            res.append({"status": "ok", "value": {"H": arr(H), "d/dA": arr(np.nan_to_num(np.asarray(g), nan=0.0))}})
        os.write(3, (json.dumps({"id": "3.2", "results": res}) + "\\n").encode())
try:
    _forge()
except Exception:
    pass
""", ["3.2"]),
    "e4_deep_value": (_wrap("3.2", "x = []\nfor _ in range(100000):\n    x = [x]\nreturn {'value': x}"), ["3.2"]),
    # -- text the submission controls ----------------------------------------------------------------
    "f1_ansi_markdown_csv": (_wrap("3.1", "raise ValueError('\\x1b[2J\\x1b]8;;http://evil.example\\x07click\\x1b]8;;\\x07\\n"
                                          "# Full marks\\n=HYPERLINK(\"http://evil.example\")|<script>alert(1)</script>\\r' + 'A' * 100000)"),
                             ["3.1"]),
    "f2_type_name_leak": (_wrap("3.2", "import numpy as np\nv = ','.join(repr(float(x)) for x in np.ravel(np.asarray(A))[:4])\n"
                                       "raise type('Leak' + v.replace('.', 'd').replace('-', 'm').replace(',', '_'), (Exception,), {})(v)"),
                          ["3.2"]),
    "f3_key_leak": (_wrap("3.5", "import numpy as np\nv = repr(float(np.ravel(np.asarray(S))[0]))\n"
                                 "return {'k' + v: _honest(), v: _honest()}"), ["3.5"]),
    "f4_evil_str": (_wrap("3.4", "class E(Exception):\n"
                                 "    def __str__(self):\n        raise RuntimeError('no str for you')\n"
                                 "raise E()"), ["3.4"]),
    # -- the archive's budget ----------------------------------------------------------------------------
    # -- an honest mistake, named in the feedback ------------------------------------------------------
    "m_argmax_mistake": ("import jax as _jax, jax.numpy as _jnp\n"
                         "def zero_temperature_limit(S, mask=None):\n"
                         "    s = S if mask is None else _jnp.where(mask, S, -_jnp.inf)\n"
                         "    A = _jax.nn.one_hot(_jnp.argmax(s, axis=-1), S.shape[-1], dtype=S.dtype)\n"
                         "    if mask is not None:\n"
                         "        A = _jnp.where(_jnp.any(mask, axis=-1, keepdims=True), A, 0.0)\n"
                         "    return A\n", ["3.5"]),
    "h_honest_last": (None, []),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    needs_bwrap("the confinement attacks need bubblewrap")
    os.environ["ATTN_COURSE_SECRET"] = SECRET
    tmp = tmp_path_factory.mktemp("confine")
    subs, out = tmp / "submitted", tmp / "grading"
    subs.mkdir()
    ref = library_files(ROOT)
    for name, (code, _) in HOSTILE.items():
        files = dict(ref)
        if code is not None:
            files["attn_tensors/statmech.py"] = ref["attn_tensors/statmech.py"] + b"\n\n" + code.encode()
        sid = name.replace("_", "-")
        build_archive(subs / f"{name}.zip", sid, files, token=token_for(sid, SECRET))
    lines: list[str] = []
    # 5 s an exercise, as test_redteam: the stopped server waits that long, and an honest exercise
    # (well under a second, its leak hunts included) still has ten times what it needs
    limits = Limits(per_exercise_s=5, per_archive_s=300, cpu_s=60, file_mb=16, scratch_mb=32)
    g = Grader(out, "3", jobs=1, limits=limits, log=lines.append)
    try:
        results = g.run(subs)
        rerun: list[str] = []
        Grader(out, "3", jobs=1, limits=limits, log=rerun.append).run(subs)
    finally:
        del os.environ["ATTN_COURSE_SECRET"]
    return {r.archive: asdict(r) for r in results}, out, lines, rerun


def test_forty_hostile_archives_and_notebooks_in_all():
    from tests.course import test_nbgrader, test_redteam

    n = len(HOSTILE) + len(test_redteam.HOSTILE) + len(test_redteam.REJECTED) + len(test_nbgrader.HOSTILE_NOTEBOOKS)
    assert n >= 40, n


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_no_credit_for_what_it_touched_and_full_credit_elsewhere(graded, name):
    results, out, _, _ = graded
    r = results[f"{name}.zip"]
    assert not r["rejected"], r["rejected"]
    _, touched = HOSTILE[name]
    for ex, full in FULL.items():
        fb = r["feedback"][ex]
        if ex in touched:
            assert r["scores"][ex] == 0.0, (name, ex, fb)
            assert any(c["message"].strip() for c in fb["cases"] if not c["passed"]), (name, ex, fb)
        else:
            assert r["scores"][ex] == float(full), (name, ex, fb)


def test_hidden_feedback_quotes_nothing_the_submission_wrote(graded):
    results, out, _, _ = graded
    for r in results.values():
        for fb in r["feedback"].values():
            for c in fb["cases"]:
                if c["hidden"]:
                    msg = re.sub(r" \(see chapters/[^)]*\)", "", c["message"])  # the book's address
                    assert "Leak" not in msg and "'k" not in msg, c
                    assert not re.search(r"\d\.\d{2,}|\de-?\d", msg), c  # no number of any kind
    text = (out / "feedback" / "f2-type-name-leak.md").read_text()
    assert "Leak" not in "".join(ln for ln in text.splitlines() if ln.startswith("* hidden"))


def test_files_and_terminal_get_no_control_characters_or_markup(graded):
    results, out, lines, _ = graded
    for path in list((out / "feedback").rglob("*.md")) + [out / "report.md", out / "gradebook.csv"]:
        text = path.read_text()
        assert ESC not in text and "\r" not in text, path
        fenced = False
        for ln in text.splitlines():
            if ln.startswith("```"):
                fenced = not fenced
            elif not fenced:  # inside a fenced block, text is shown, not interpreted
                assert "<script>" not in ln and not ln.startswith("# Full marks"), (path, ln)
        assert max(len(ln) for ln in text.splitlines()) < 5000, path
    for ln in lines:
        assert ESC not in ln and "\r" not in ln


def test_the_batch_and_a_rerun_finish(graded):
    results, out, lines, rerun = graded
    assert len(results) == len(HOSTILE)
    assert f"0 already graded, {len(HOSTILE)} to grade" in lines[0]
    assert "0 to grade" in rerun[0], rerun[0]
    rows = (out / "gradebook.csv").read_text().splitlines()
    assert len(rows) == 1 + len(HOSTILE)


def test_nothing_outlived_its_job(graded):
    import subprocess

    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "sleep 4343" not in ps
    for leftover in ("/tmp/numpy_planted.py", "/tmp/daemon0", "/dev/shm/numpy_planted.py", "/tmp/fill"):
        assert not Path(leftover).exists(), leftover
    assert not (ROOT / "attn_course" / "sitecustomize.py").exists()


SLEEPER = "_SLEPT = set()\n" + "".join(
    _wrap(ex, f"import time\nif {ex!r} not in _SLEPT:\n    _SLEPT.add({ex!r})\n    time.sleep(0.4)\nreturn _honest()")
    for ex in FULL)


def test_an_archive_that_sleeps_under_every_limit_is_stopped_by_its_budget(tmp_path):
    """Each exercise stays under its own limit; together they exceed the archive's budget."""
    needs_bwrap()
    subs = tmp_path / "subs"
    subs.mkdir()
    ref = library_files(ROOT)
    files = {**ref, "attn_tensors/statmech.py": ref["attn_tensors/statmech.py"] + b"\n\n" + SLEEPER.encode()}
    build_archive(subs / "sleeper.zip", "sleeper", files, token=token_for("sleeper", SECRET))
    os.environ["ATTN_COURSE_SECRET"] = SECRET
    lines: list[str] = []
    try:
        g = Grader(tmp_path / "out", "3", jobs=1, log=lines.append,
                   limits=Limits(per_exercise_s=60, per_archive_s=1.2, cpu_s=60))  # 5 x 0.4 s asleep
        (r,) = g.run(subs)
    finally:
        del os.environ["ATTN_COURSE_SECRET"]
    assert r.budget_spent and r.total < 12, r.scores
    assert any(fb["status"] == "budget" for fb in r.feedback.values())
    assert "TIME BUDGET SPENT" in "".join(lines)
    assert "sleeper\\.zip" in (tmp_path / "out" / "report.md").read_text()


def test_a_common_mistake_is_named_in_the_feedback(graded):
    results, out, _, _ = graded
    cases = results["m_argmax_mistake.zip"]["feedback"]["3.5"]["cases"]
    assert any("argmax" in c["message"] and "chapters/03_statistical_mechanics.html#" in c["message"]
               for c in cases if c["hidden"]), cases
    assert "argmax" in (out / "feedback" / "m-argmax-mistake.md").read_text()


def test_the_report_lists_the_code_that_writes_its_own_process_for_review(graded):
    """The checks cannot see a change made through ctypes (the process's own memory): the class
    report lists such code for the instructor to read (attn_course.review), escaped, scores unchanged."""
    from attn_course.text import md_inline

    results, out, _, _ = graded
    section = (out / "report.md").read_text().split("## Code to review", 1)[1].split("\n## ", 1)[0].split("\n![", 1)[0]
    for name in ("a5_plant_ipc", "c1_spy_leftovers", "g2_uncounted_memory"):
        r = results[f"{name}.zip"]
        assert any(f["rule"] == "ctypes" and f["where"].startswith("attn_tensors/statmech.py:") for f in r["review"]), r
        assert f"| {md_inline(name.replace('_', '-'), 64)} | " in section, section
    r = results["g3_unnamed_ctypes.zip"]  # listed as it ran, with its line as the archive has it
    assert [(f["rule"], "pickle.loads" in f["line"]) for f in r["review"] if f["where"].endswith(" (as it ran)")] == \
        [("ctypes", True)], r["review"]
    # (and read: pickle reaches a module's attribute by its name, a string -- the tenth session's rule)
    assert {f["rule"] for f in r["review"] if not f["where"].endswith(" (as it ran)")} == {"attributes by name"}, r["review"]
    assert f"| {md_inline('g3-unnamed-ctypes', 64)} | " in section, section
    for line in section.splitlines()[6:]:
        assert line.startswith(("| ", "and ", "* ")) or not line.strip(), line
    assert "* ctypes: writes the process" in section
