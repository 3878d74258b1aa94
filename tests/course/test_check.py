"""`attn-course check` respects the student's time and says things once.

Progress while it runs, the grader's time limit, an import error once with
its file and line, a progress summary about the code as it is now, numbers
printed as numbers, `| head` without a traceback, and help on every option.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from attn_course import cli, workspace
from attn_course.registry import all_exercises, select
from attn_course.sandbox import GRADING_LIMITS

from test_student_path import ANSWER_3_1, course


def _replace_stub(ws: Path, module: str, ex_id: str, body: str) -> None:
    path = ws / "attn_tensors" / f"{module}.py"
    src = path.read_text()
    stub = re.search(rf"^    raise NotImplementedError\('Exercise {re.escape(ex_id)}: .*\n", src, re.M)
    assert stub, f"the {ex_id} stub line"
    path.write_text(src[: stub.start()] + body + src[stub.end():])


@pytest.fixture
def ws(tmp_path):
    return workspace.create(tmp_path / "ws", "s1234567")


# -- the command line --------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_every_argument_of_every_subcommand_has_help():
    parser = cli.build_parser()
    subs = dict(_subparsers(parser))
    assert {"check", "workspace", "submit", "grade", "release", "validate"} <= set(subs)
    missing = []
    for name, sub in subs.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"arguments without help: {missing}"
    # and each subcommand says what it is for in the overview
    choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helped = {c.dest for c in choices._choices_actions if (c.help or "").strip()}
    assert helped == set(subs), set(subs) - helped


@pytest.mark.parametrize("argv", [
    ["workspace", "", "--student", "s1"], ["student-dist", ""], ["grade", "", "--out", "g"], ["grade", "subs", "--out", ""],
    ["grade", "subs", "--out", "g", "--roster", ""], ["similarity", "subs", "--out", ""],
    ["roster", "", "--out", "t.csv"], ["roster", "r.csv", "--out", ""], ["token", "s1", "--roster", ""],
])
def test_an_empty_file_or_folder_is_refused_before_anything_runs(argv, tmp_path, monkeypatch, capsys):
    """``--out "$DIR"`` with DIR unset is the current folder to Path(""): the wheel was written there,
    and ``--roster ""`` checked no roster at all.  Refused by name, nothing written.  (check's and
    submit's --workspace and submit's --out say it in their own words: test_redteam_student.)"""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "is empty: name a file or folder" in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_broken_pipe_ends_quietly(ws):
    """`attn-course check | head -1`: no BrokenPipeError traceback when head stops reading."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    r = subprocess.run(["sh", "-c", f"'{sys.executable}' -m attn_course.cli check 2 | head -1"],
                       cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    assert r.stdout.startswith("[ TODO] Exercise 2.1"), r.stdout
    assert len(r.stdout.splitlines()) == 1
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


# -- what a run says --------------------------------------------------------------------------


@pytest.mark.slow
def test_progress_lines_while_it_runs_and_numbers_as_numbers(ws):
    # 2.1 with the 1/sqrt(d_k) forgotten: wrong values on the default-scale case
    _replace_stub(ws, "attention", "2.1",
                  "    if g is not None:\n"
                  "        return xp.einsum('...ia,ab,...jb->...ij', Q, g, K)\n"
                  "    return xp.einsum('...ia,...ja->...ij', Q, K) * (1.0 if scale is None else scale)\n")
    _replace_stub(ws, "statmech", "3.1", ANSWER_3_1)
    r = course("check", "2", cwd=ws)
    assert r.returncode == 1
    progress = [ln for ln in r.stderr.splitlines() if " ... " in ln]
    assert [ln.split()[0] for ln in progress] == ["2.1", "2.2", "2.3", "2.4", "2.5"], r.stderr
    assert re.fullmatch(r"2\.1 +\.\.\. FAIL \(\d/\d pass\)", progress[0]), progress[0]
    assert progress[1].endswith("not implemented yet")
    out = r.stdout
    assert "np.float64" not in out and "array(" not in out, out
    m = re.search(r"expected (\S+), got (\S+) \(largest error", out)
    assert m, out
    float(m.group(1)), float(m.group(2))  # both plain numbers
    r = course("check", "3.1", cwd=ws)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^3\.1 +\.\.\. pass \((\d+)/\1\)$", r.stderr, re.M), r.stderr


@pytest.mark.slow
def test_an_import_error_is_reported_once_with_file_and_line(ws):
    path = ws / "attn_tensors" / "attention.py"
    lines = path.read_text().splitlines(keepends=True)
    lines.append("scores_table = undefined_helper(3)\n")
    path.write_text("".join(lines))
    r = course("check", "all", cwd=ws)
    assert r.returncode == 1
    assert "Traceback" not in r.stdout + r.stderr
    assert r.stdout.count("NameError") == 1, r.stdout
    assert f"attn_tensors/attention.py:{len(lines)}" in r.stdout, r.stdout
    assert "does not import" in r.stdout and "[ TODO]" not in r.stdout
    assert r.stderr.count("does not import") == 1, r.stderr
    # a syntax error: the file, the line and the line's text
    lines[-1] = "scores_table = (3,\n"
    path.write_text("".join(lines))
    r = course("check", "2", cwd=ws)
    assert r.stdout.count("SyntaxError") == 1, r.stdout
    assert f"attn_tensors/attention.py:{len(lines)}" in r.stdout and "scores_table = (3," in r.stdout


@pytest.mark.slow
def test_an_error_shared_by_every_case_is_said_once(ws):
    _replace_stub(ws, "statmech", "3.1", "    raise RuntimeError('my own bug')\n")
    r = course("check", "3.1", cwd=ws)
    n = len(all_exercises()["3.1"].make_cases(hidden=False))
    assert r.stdout.count("my own bug") == 1, r.stdout
    assert f"all {n} cases: raised RuntimeError: my own bug" in r.stdout
    assert "attn_tensors/statmech.py:" in r.stdout  # where it was raised


@pytest.mark.slow
def _processes_mentioning(text: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_the_time_limit_is_grading_s(ws, monkeypatch, capsys):
    """An infinite loop is stopped at grading's per-exercise limit, and check says so;
    the stopped job does not run on after its server is killed (check has no pid namespace).

    The loop is in the chapter's second exercise: the first exercise of a job also gets
    the grace for starting JAX's backend (runner.FIRST_EXERCISE_GRACE_S)."""
    from attn_course import sandbox

    assert sandbox.GRADING_LIMITS.per_exercise_s <= 60
    short = dataclasses.replace(GRADING_LIMITS, per_exercise_s=2.0)
    monkeypatch.setattr(sandbox, "GRADING_LIMITS", short)  # what `check` reads at run time
    scratches = []
    command = sandbox.Plain.server_command

    def recording(self):
        argv_env = command(self)
        scratches.append(self._scratch)
        return argv_env

    monkeypatch.setattr(sandbox.Plain, "server_command", recording)
    _replace_stub(ws, "statmech", "3.2", "    while True:\n        pass\n")
    rc = cli.main(["check", "3", "--workspace", str(ws)])
    out, err = capsys.readouterr()
    # the server that ran the loop was killed; its job (a child in its own session) dies with it,
    # instead of running on, orphaned, until its CPU limit (two minutes)
    assert scratches
    deadline = time.monotonic() + 10
    while any(map(_processes_mentioning, scratches)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for s in scratches for p in _processes_mentioning(s)]
    assert not left, f"processes of a stopped check outlived it: {left}"
    assert "(at most 2 s each, as in grading)" in err
    assert rc == 1
    assert "exercise 3.2 ran past the 2 s limit" in out, out
    assert re.search(r"^3\.2 +\.\.\. ran past the 2 s limit$", err, re.M), err
    assert "[ TODO] Exercise 3.1" in out and "[ TODO] Exercise 3.3" in out  # the others still ran


def test_a_loop_at_import_is_named_and_waited_for_once(ws, monkeypatch, capsys):
    """A loop at a module's top level: each exercise of the chapter ran again alone and waited for
    the limit (about 33 s each, a tester's finding), and check blamed the first exercise.  One job
    waits for it; every exercise says the import never ended."""
    from attn_course import runner, sandbox

    short = dataclasses.replace(GRADING_LIMITS, per_exercise_s=2.0)
    monkeypatch.setattr(sandbox, "GRADING_LIMITS", short)
    jobs = []
    real = runner.WorkerServer.submit

    def counted(self, job, *a, **k):
        jobs.append(len(job.get("exercises", [])))
        return real(self, job, *a, **k)

    monkeypatch.setattr(runner.WorkerServer, "submit", counted)
    _replace_stub(ws, "statmech", "3.1", ANSWER_3_1)
    path = ws / "attn_tensors" / "statmech.py"
    path.write_text(path.read_text() + "\nwhile True:\n    pass\n")
    assert cli.main(["check", "3", "--workspace", str(ws)]) == 1
    out, err = capsys.readouterr()
    assert "importing your attn_tensors ran past the 2 s limit before exercise 3.1 could start" in out, out
    assert "[ TODO] Exercise 3.2" in out  # (its stub is still there: not implemented yet, as before)
    assert jobs == [len(select("3"))], jobs  # one job, of every exercise: none ran again alone


def test_a_syntax_error_in_a_module_of_untouched_exercises_is_said(ws, capsys):
    """A module that does not import, whose exercises are all stubs still: each said "not
    implemented yet", and the syntax error was nowhere (a tester's finding)."""
    path = ws / "attn_tensors" / "statmech.py"
    path.write_text(path.read_text() + "\n\ndef oops(:\n    pass\n")
    assert cli.main(["check", "3.2", "--workspace", str(ws)]) == 1
    out = capsys.readouterr().out
    assert "SyntaxError" in out and "statmech.py" in out, out
    assert "not implemented yet" not in out, out


def test_a_python_list_for_an_array_is_said(ws, capsys):
    """A list returned for an array named a symptom ('the result[0] is a list'); it says it is a list."""
    _replace_stub(ws, "statmech", "3.1", "    return [S[..., 0], S[..., 0]]\n")
    assert cli.main(["check", "3.1", "--workspace", str(ws)]) == 1
    out = capsys.readouterr().out
    assert "is a Python list, expected an array" in out and "result[0]" not in out, out


def test_a_probe_that_needs_a_dtype_says_a_list_has_none():
    """7.4's probe read the result's dtype: a list was the probe's own AttributeError."""
    from attn_course.specs._gen import itemsize
    from attn_course.worker import _failure

    with pytest.raises(TypeError) as err:
        itemsize([0.5, 0.25])
    out = _failure(err.value)
    assert out["status"] == "bad_value" and "the result is a list, expected an array" in out["message"], out


def test_grading_and_check_share_the_limit(tmp_path):
    from attn_course.grade import Grader

    g = Grader(tmp_path / "grading", "3.1", ci_secret=True, use_bwrap=False, log=lambda *a: None)
    assert g.limits == GRADING_LIMITS


@pytest.mark.slow
def test_progress_counts_only_passes_on_the_code_as_it_is(ws):
    _replace_stub(ws, "statmech", "3.1", ANSWER_3_1)
    n = len(all_exercises())
    r = course("check", "3.1", cwd=ws)
    assert r.returncode == 0 and f"Progress: 1/{n} exercises" in r.stdout
    # the student edits the library (here: breaks 3.1) and checks another exercise
    path = ws / "attn_tensors" / "statmech.py"
    path.write_text(path.read_text().replace("    s = S / T\n", "    s = S * T\n"))
    r = course("check", "3.2", cwd=ws)
    assert f"Progress: 0/{n} exercises" in r.stdout, r.stdout
    assert "Not counted: 3.1 passed before your library changed" in r.stdout
    r = course("check", "3.1", cwd=ws)
    assert r.returncode == 1 and f"Progress: 0/{n} exercises" in r.stdout and "Not counted" not in r.stdout
    path.write_text(path.read_text().replace("    s = S * T\n", "    s = S / T\n"))
    r = course("check", "3.1", cwd=ws)
    assert r.returncode == 0 and f"Progress: 1/{n} exercises" in r.stdout


def test_feedback_files_put_arrays_in_code_blocks():
    from attn_course.report import feedback_text
    from attn_course.scoring import compare_values

    e = np.arange(12.0).reshape(3, 4) / 7
    msg = compare_values({"value": e}, {"value": 2 * e}, 1e-9, 1e-12, show=True)
    assert "\n" in msg
    ex = all_exercises()["2.1"]
    r = SimpleNamespace(student_id="s1", archive="a.zip", total=0.0, budget_spent=False,
                        scores={"2.1": 0.0}, notebook_feedback={}, notebook_scores={},
                        feedback={"2.1": {"status": "fail", "cases": [
                            {"case": "default scale", "passed": False, "message": msg}]}})
    text = feedback_text(r, [ex])
    assert "np.float64" not in text
    inside, fenced = False, []
    for ln in text.splitlines():
        if ln.startswith("```"):
            inside = not inside
        elif inside:
            fenced.append(ln)
    assert not inside
    rows = [ln for ln in text.splitlines() if re.match(r"\s*(expected|got)\s+\[\[", ln)]
    assert len(rows) == 2 and all(ln in fenced for ln in rows), text


# -- naming the mistake, without the catalogue ---------------------------------------------

BLOCK_CATALOGUE = ("import sys; sys.modules['attn_course.mistakes'] = None; "  # importing it now fails
                   "from attn_course.cli import main; sys.exit(main())")


# `check` with the moment its worker server is launched recorded: whether NumPy was imported yet
LAUNCH_FIRST = ("import sys\n"
                "from attn_course import server\n"
                "launch = server.WorkerServer.launch\n"
                "def recorded(self):\n"
                "    print('numpy imported at launch:', 'numpy' in sys.modules, file=sys.stderr)\n"
                "    launch(self)\n"
                "server.WorkerServer.launch = recorded\n"
                "from attn_course.cli import main\n"
                "sys.exit(main())\n")


def test_check_launches_its_worker_before_its_own_imports(ws):
    """The worker server's start (Python, NumPy and JAX: most of a short check's time) overlaps
    the command's own imports and reading of the workspace: it is launched before NumPy is
    imported, once, and the check is the same."""
    _replace_stub(ws, "statmech", "3.1", ANSWER_3_1)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    r = subprocess.run([sys.executable, "-c", LAUNCH_FIRST, "check", "3.1"], cwd=ws, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.count("numpy imported at launch:") == 1, r.stderr
    assert "numpy imported at launch: False" in r.stderr, r.stderr
    assert "[ PASS] Exercise 3.1" in r.stdout, r.stdout


@pytest.mark.slow
def test_check_names_a_catalogued_mistake_without_the_catalogue(ws):
    from attn_course.mistakes import for_exercise

    entry = next(m for m in for_exercise("2.1") if m.key == "missing-scale")
    _replace_stub(ws, "attention", "2.1",
                  "    if g is not None:\n"
                  "        return xp.einsum('...ia,ab,...jb->...ij', Q, g, K)\n"
                  "    return xp.einsum('...ia,...ja->...ij', Q, K) * (1.0 if scale is None else scale)\n")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    r = subprocess.run([sys.executable, "-c", BLOCK_CATALOGUE, "check", "2.1"], cwd=ws, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert entry.message in r.stdout, r.stdout
    assert entry.section in r.stdout


def test_the_shipped_outputs_name_each_entry():
    """Each entry's shipped output on a public case, given as an answer, is named as that entry
    (or one with the same output there), from the shipped data alone; every entry is named on
    some public case."""
    from attn_course import RELEASE_LIBRARY
    from attn_course.check import load_cases
    from attn_course.diagnose import Kind, close, diagnose
    from attn_course.mistakes import for_exercise

    exercises = list(all_exercises().values())
    public = load_cases(RELEASE_LIBRARY / "cases", exercises)
    unnamed = []
    for ex in exercises:
        p = public[ex.id]
        assert [m.key for m in p.mistakes] == [m.key for m in for_exercise(ex.id)], ex.id
        named = set()
        for case, exp, wrong in zip(p.cases, p.expected, p.wrong):
            for key, out in wrong.items():
                d = diagnose(ex, case, out, exp.value, wrong=wrong, entries=p.mistakes)
                assert d is not None and d.kind == Kind.CATALOGUE, (ex.id, case.name, key, d)
                same = d.key == key or all(close(out[k], wrong[d.key][k], ex.rtol, ex.atol) for k in out)
                assert same, (ex.id, case.name, key, d.key)
                named.add(d.key)
                # and the reference's own answer is never diagnosed
                assert diagnose(ex, case, exp.value, exp.value, wrong=wrong, entries=p.mistakes) is None
        unnamed += [f"{ex.id} {m.key}" for m in p.mistakes if m.key not in named]
    assert not unnamed, f"entries no public case shows: {unnamed}"


def _texts(folder: Path):
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            yield path, path.read_text(errors="replace")


def test_the_release_and_a_workspace_hold_no_catalogue(tmp_path):
    from attn_course import EXERCISES
    from attn_course.mistakes import catalogue

    ws = workspace.create(tmp_path / "ws", "s1234567")
    entries = catalogue()
    names = {m.wrong.__name__ for m in entries}
    modules = {m.wrong.__module__ for m in entries}
    assert len(names) > 20 and "attn_course.mistakes.ch02" in modules
    found = []
    for folder in (EXERCISES, ws):
        for path, text in _texts(folder):
            rel = path.relative_to(folder)
            if "mistakes" in rel.parts or rel.parts[0] == "attn_course":
                found.append(str(rel))
            hits = [n for n in names if f"def {n}(" in text] + [m for m in modules if m in text]
            if hits:
                found.append(f"{rel}: {hits[:3]}")
    assert not found, found


# -- the notebooks: the student's own code, the same report ------------------------------------


def _cells(nb, ids):
    return [c for c in nb.cells if c.get("id") in ids]


@pytest.mark.slow
def test_notebook_test_cell_checks_the_workspace_library_and_reports_like_check(ws):
    import nbformat
    from nbclient import NotebookClient

    from attn_course.mistakes import for_exercise

    entry = next(m for m in for_exercise("2.1") if m.key == "missing-scale")
    # the workspace's library, not an installed one: a marker only the workspace's copy has
    init = ws / "attn_tensors" / "__init__.py"
    init.write_text(init.read_text() + "\nWORKSPACE_MARKER = 'mine'\n")
    nb = nbformat.read(ws / "notebooks" / "ch02.ipynb", as_version=4)
    answer = _cells(nb, {"ex-2-1-answer"})[0]
    assert "raise NotImplementedError()" in answer.source
    answer.source = answer.source.replace(
        "    # YOUR CODE HERE\n    raise NotImplementedError()",
        "    if g is not None:\n        return xp.einsum('...ia,ab,...jb->...ij', Q, g, K)\n"
        "    return xp.einsum('...ia,...ja->...ij', Q, K) * (1.0 if scale is None else scale)")
    probe = nbformat.v4.new_code_cell("import attn_tensors, attn_tensors.attention as m\n"
                                      "print(attn_tensors.WORKSPACE_MARKER, m.__file__)")
    nb.cells = _cells(nb, {"ch02-setup", "ex-2-1-imports", "ex-2-1-answer", "ex-2-1-tests"}) + [probe]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ws / "notebooks")}}).execute(env=env)
    out = {c.id: c.get("outputs", []) for c in nb.cells if c.cell_type == "code"}
    said = "".join(o.get("text", "") for o in out["ch02-setup"])
    assert f"your library in {ws / 'attn_tensors'}" in said, said
    last = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert last.startswith("mine ") and str(ws / "attn_tensors" / "attention.py") in last, last
    errors = [o for o in out["ex-2-1-tests"] if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "AssertionError", out["ex-2-1-tests"]
    text = errors[0].evalue
    assert "Fix the answer cell above (`def attention_scores`, grade id ex-2-1-answer)" in text, text
    assert entry.message in text, text  # the mistake named, as `attn-course check` names it
    # the same report as `attn-course check 2.1` on the same code in the library
    _replace_stub(ws, "attention", "2.1",
                  "    if g is not None:\n        return xp.einsum('...ia,ab,...jb->...ij', Q, g, K)\n"
                  "    return xp.einsum('...ia,...ja->...ij', Q, K) * (1.0 if scale is None else scale)\n")
    r = course("check", "2.1", "-q", cwd=ws)
    block = r.stdout.split("\n\nProgress:")[0].strip()
    assert block.splitlines()[0].startswith("[ FAIL] Exercise 2.1")
    nb_block = text.split("attn-course check 2.1`:", 1)[1].strip()
    strip_hint = "\n".join(ln for ln in nb_block.splitlines() if not ln.strip().startswith("hint:"))
    assert strip_hint == block, (strip_hint, block)


@pytest.mark.slow
def test_check_keeps_each_exercises_program_in_the_students_own_cache(ws, tmp_path, monkeypatch):
    """check compiles one program per exercise into the student's own cache (check-xla beside the
    course's caches): a second check loads them all, and after an edit only the programs of the
    code that changed are compiled again."""
    from attn_course import ROOT
    from attn_course.check import run_check
    from attn_course.registry import select

    monkeypatch.setenv("ATTN_COURSE_CACHE", str(tmp_path / "cache" / "xla"))
    cache = tmp_path / "cache" / "check-xla"
    for p in (ROOT / "attn_tensors").glob("*.py"):  # the whole library written
        (ws / "attn_tensors" / p.name).write_text(p.read_text())
    chapter = select("3")

    def check() -> set[str]:
        run = run_check(ws, chapter)
        assert all(r.passed for r in run.results), [c.message for r in run.results for c in r.cases if not c.passed]
        return set(os.listdir(cache))

    first = check()
    assert len(first) >= len(chapter), first  # a program per exercise (one for the job would be one)
    assert check() == first  # nothing compiled again
    path = ws / "attn_tensors" / "statmech.py"
    path.write_text(path.read_text() + "\n\n_written_entropy = entropy\n\n\ndef entropy(A, mask=None):\n"
                                       "    return _written_entropy(A, mask) + 0.0 * A[..., 0]\n")
    new = check() - first
    assert 1 <= len(new) < len(chapter), new  # 3.2's program (and those of what calls entropy)
