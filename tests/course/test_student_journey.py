"""One student's whole path, end to end, through the `attn-course` command and a notebook.

A fresh workspace; every exercise written, with one mistake of each kind
the catalogue knows made on purpose (a missing 1/sqrt(d_k), K not
transposed, the softmax over the wrong axis, the temperature forgotten and
applied twice, a causal mask off by one, a gradient's sign flipped, the
online softmax's -inf guard left out, the softmax backward's row-sum term
left out) and three generic ones (a constant factor, nan, rows that do not
sum to one); `check` names each mistake by its catalogue words and points to
the book; the fix passes everywhere; the same chapter checks on MLX; the
chapter's notebook names the same mistake in its test cell and passes once
fixed; the submission holds what was fixed.

The wrong code is the reference's solution region with one edit: what a
student who nearly had it would write.  The words expected come from the
catalogue shipped with the public cases (``load_cases``), never typed in here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import zipfile
from pathlib import Path

import pytest

from attn_course import EXERCISES, ROOT
from attn_course.archive import read_submission
from attn_course.check import load_cases
from attn_course.registry import all_exercises

from test_student_path import course

pytestmark = pytest.mark.slow

EX = all_exercises()

# (exercise, text in its solution region, what the student wrote instead (one edit, or a
# tuple of edits), catalogue key or generic symptom, words of a generic symptom's message)
Mistake = tuple[str, "str | tuple[str, ...]", "str | tuple[str, ...]", str, str]

ROUND_1: list[Mistake] = [
    ("3.1", "softmax_and_log_partition(S, mask, T, xp)[1]", "softmax_and_log_partition(S, mask, 1.0, xp)[1]",
     "temperature-ignored", ""),
    ("7.1", "return j <= i", "return j < i", "strict", ""),
    ("5.1", "return A * (dL_dA - c[..., None]) / T", "return -A * (dL_dA - c[..., None]) / T", "sign-flipped", ""),
    ("9.1", "m_safe = xp.where(m_new > neg_inf, m_new, xp.zeros_like(m_new))", "m_safe = m_new",
     "missing-inf-guard", ""),
    ("5.3", "return A * (dL_dA - D[..., None]) / T", "return A * dL_dA / T", "row-sum-missing", ""),
    ("3.3", "F = -g.T * g.log_Zs - g.M", "F = 2 * (-g.T * g.log_Zs - g.M)", "factor", "2 times too large"),
    ("10.2", "softmax_and_log_partition(S, mask, T, xp)[0]", "xp.exp(S / T)", "rows", "do not sum to 1"),
]
ROUND_2: list[Mistake] = [
    ("2.1", 'xp.einsum("...ia,...ja->...ij", Q, K) * scale', 'xp.einsum("...ia,...aj->...ij", Q, K) * scale',
     "K-not-transposed", ""),
    ("2.2", ("axis=-1", "log_Z[..., 0]"), ("axis=-2", "log_Z[..., 0, :]"), "wrong-axis", ""),
    ("8.1", "xp.einsum(\"...mi,...mj->...ij\", P, P) / N", "xp.einsum(\"...mi,...mj->...ij\", P, P) / (N - N)",
     "nan", "contains nan where the answer is a number"),
]
ROUND_3: list[Mistake] = [
    ("2.1", 'xp.einsum("...ia,...ja->...ij", Q, K) * scale', 'xp.einsum("...ia,...ja->...ij", Q, K)',
     "missing-scale", ""),
    ("2.2", "s = S / T", "s = S / T / T", "temperature-twice", ""),
]


def _region_pattern(ex_id: str) -> re.Pattern:
    return re.compile(rf"(^ *### BEGIN SOLUTION {re.escape(ex_id)}\b[^\n]*\n)(.*?)(^ *### END SOLUTION\n)",
                      re.M | re.S)


def _written(mistakes: list[Mistake]) -> dict[str, str]:
    """Every module of the library as the student wrote it: the reference, with these mistakes."""
    files = {p.relative_to(ROOT / "attn_tensors").as_posix(): p.read_text()
             for p in (ROOT / "attn_tensors").rglob("*.py")}
    for ex_id, olds, news, _, _ in mistakes:
        name = EX[ex_id].module.replace(".", "/") + ".py"
        src = files[name]
        edits = list(zip((olds,) if isinstance(olds, str) else olds, (news,) if isinstance(news, str) else news))
        regions = list(_region_pattern(ex_id).finditer(src))
        for old, _ in edits:
            assert regions and sum(m.group(2).count(old) for m in regions), f"{old!r} in the region of {ex_id}"

        def edit(m: re.Match) -> str:
            body = m.group(2)
            for old, new in edits:
                body = body.replace(old, new)
            return m.group(1) + body + m.group(3)

        files[name] = _region_pattern(ex_id).sub(edit, src)
        assert files[name] != src
    return files


def _write_library(ws: Path, mistakes: list[Mistake]) -> None:
    for name, text in _written(mistakes).items():
        (ws / "attn_tensors" / name).write_text(text)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _block(stdout: str, ex_id: str) -> str:
    """The report of one exercise in `check`'s output (up to the next exercise or the progress)."""
    m = re.search(rf"^\[[ A-Z]{{5}}\] Exercise {re.escape(ex_id)}\b.*?(?=^\[[ A-Z]{{5}}\] Exercise |^Progress:|\Z)",
                  stdout, re.M | re.S)
    assert m, f"no report of {ex_id} in:\n{stdout[-3000:]}"
    return m.group(0)


def _assert_named(stdout: str, mistakes: list[Mistake], public) -> None:
    for ex_id, _, _, key, words in mistakes:
        block = _block(stdout, ex_id)
        assert block.startswith(f"[ FAIL] Exercise {ex_id}"), block
        if words:  # a generic symptom: its words, and no catalogue entry claimed
            assert words in _flat(block), (ex_id, key, block)
            assert not any(_flat(m.message) in _flat(block) for m in public[ex_id].mistakes), block
        else:
            entry = next(m for m in public[ex_id].mistakes if m.key == key)
            assert _flat(entry.message) in _flat(block), (ex_id, key, block)
            assert entry.section in block, (ex_id, entry.section, block)


def test_a_student_from_workspace_to_submission(tmp_path):
    public = load_cases(EXERCISES / "library" / "cases", list(EX.values()))
    ws = tmp_path / "ws"
    r = course("workspace", str(ws), "--student", "s7654321", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    n = len(EX)
    # (check on the untouched workspace, every exercise "not implemented yet": test_student_path)

    # 1. everything written; six mistakes made, each named by check (the whole library at once)
    _write_library(ws, ROUND_1)
    r = course("check", "all", cwd=ws)
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    _assert_named(r.stdout, ROUND_1, public)
    # the chapters with no mistake in them (nor in what they call) pass whole
    progress = dict(re.findall(r"\b(ch\d\d) (\d+/\d+)", r.stdout.split("Progress:", 1)[1]))
    for ch in ("ch01", "ch04", "ch08"):
        done, total = progress[ch].split("/")
        assert done == total, (ch, progress)

    # 2. and 3. the other kinds, a chapter at a time
    for mistakes in (ROUND_2, ROUND_3):
        _write_library(ws, mistakes)
        out = ""
        for chapter in sorted({ex_id.split(".")[0] for ex_id, *_ in mistakes}):
            r = course("check", chapter, cwd=ws)
            assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr, r.stdout[-3000:]
            out += r.stdout
        _assert_named(out, mistakes, public)

    # the fix: every exercise passes, forward values and gradients, on JAX ...
    _write_library(ws, [])
    r = course("check", "all", cwd=ws)
    assert r.returncode == 0, r.stdout[-3000:]
    assert r.stdout.count("[ PASS]") == n and f"Progress: {n}/{n}" in r.stdout

    # ... and the chapter on MLX (Apple Silicon; mlx[cpu] on Linux)
    if importlib.util.find_spec("mlx") is not None or os.environ.get("ATTN_REQUIRE_MLX") == "1":
        r = course("check", "3", "--backend", "mlx", cwd=ws)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert r.stdout.count("[ PASS]") == len([e for e in EX if e.startswith("3.")])

    # the same chapter's notebook: the same mistake named in its test cell, then fixed
    _notebook_round(ws, public)

    # hand in: the archive passes the grader's checks and holds the fixed code and notebook
    r = course("submit", cwd=ws)
    assert r.returncode == 0, r.stderr
    archive = Path(r.stdout.split("Wrote ", 1)[1].strip())
    sub = read_submission(archive)
    with zipfile.ZipFile(archive) as z:
        statmech = z.read("attn_tensors/statmech.py").decode()
        nb = json.loads(z.read("notebooks/ch03.ipynb"))
    assert "softmax_and_log_partition(S, mask, T, xp)[1]" in statmech
    assert "softmax_and_log_partition(S, mask, 1.0, xp)[1]" not in statmech
    answer = next(c for c in nb["cells"] if c.get("id") == "ex-3-1-answer")
    assert "softmax_and_log_partition(S, mask, T, xp)[1]" in "".join(answer["source"])
    assert sub.student_id == "s7654321"


def _notebook_round(ws: Path, public) -> None:
    import nbformat
    from nbclient import NotebookClient

    path = ws / "notebooks" / "ch03.ipynb"
    solved = nbformat.read(ROOT / "solutions" / "ch03" / "ch03.ipynb", as_version=4)
    answers = {c.id: c.source for c in solved.cells if c.get("id", "").endswith("-answer")}
    assert len(answers) == 5
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.get("id") in answers:
            assert "raise NotImplementedError()" in cell.source, cell.id
            cell.source = answers[cell.id]
    right, wrong = ROUND_1[0][1], ROUND_1[0][2]  # 3.1 without its temperature
    first = next(c for c in nb.cells if c.get("id") == "ex-3-1-answer")
    assert right in first.source
    first.source = first.source.replace(right, wrong)
    nbformat.write(nb, path)  # what the student saves

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))

    def errors(cells) -> dict[str, list]:
        return {c.id: [o for o in c.get("outputs", []) if o.output_type == "error"]
                for c in cells if c.cell_type == "code"}

    # the student runs the whole notebook, reads the failing test, fixes the answer cell, saves,
    # and runs the answer and its test cell again in the same kernel
    done = nbformat.read(path, as_version=4)
    client = NotebookClient(done, timeout=600, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    with client.setup_kernel(env=env):
        for i, cell in enumerate(done.cells):
            client.execute_cell(cell, i)
        failing = {cid: e for cid, e in errors(done.cells).items() if e}
        assert set(failing) == {"ex-3-1-tests"}, {k: [o.evalue[:300] for o in v] for k, v in failing.items()}
        text = failing["ex-3-1-tests"][0].evalue
        entry = next(m for m in public["3.1"].mistakes if m.key == "temperature-ignored")
        assert "Fix the answer cell above" in text and "ex-3-1-answer" in text, text
        assert _flat(entry.message) in _flat(text), text

        fixed = nbformat.read(path, as_version=4)
        cell = next(c for c in fixed.cells if c.get("id") == "ex-3-1-answer")
        cell.source = cell.source.replace(wrong, right)
        nbformat.write(fixed, path)
        again = [i for i, c in enumerate(done.cells) if c.get("id") in ("ex-3-1-answer", "ex-3-1-tests")]
        assert len(again) == 2
        done.cells[again[0]].source = cell.source
        for i in again:
            client.execute_cell(done.cells[i], i)
        assert not any(errors([done.cells[i] for i in again]).values()), errors(done.cells)
