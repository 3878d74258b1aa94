"""A student's check: the public cases of some exercises, run on a workspace.

The expected values come from the public case files (data shipped with the
release); the student's code runs in a worker process, so an exception, a
hang or a crash in one exercise is reported for that exercise and the others
still run.  Each exercise has the time that grading gives it
(:data:`attn_course.sandbox.GRADING_LIMITS`, the default): a loop that never ends is
reported after that long, as the grader would stop it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import values
from .diagnose import Diagnosis, Known, explain
from .registry import CHAPTERS, Case, Exercise, all_exercises
from .runner import SETUP_TIMEOUT, Programs, package_files, run_worker
from . import sandbox
from .sandbox import Limits
from .scoring import CaseResult, ExerciseResult, Outcome, Status, grade, stubbed_exercises
from .server import ServerError, WorkerServer, check_server
from .text import plain
from .worker import PACKAGE_DOES_NOT_IMPORT
from .workspace import library_digest


def _read_cases(cases_dir: Path, exercises: list[Exercise]) -> dict:
    """The public cases of ``exercises`` from ``cases_dir/chNN.json``; a file that is missing or
    damaged is named with the way to restore it (the course ships every chapter's file)."""
    import shlex

    from . import RELEASE_LIBRARY

    def missing(ch: int, what: str) -> FileNotFoundError:
        shipped = RELEASE_LIBRARY / "cases" / f"ch{ch:02d}.json"
        return FileNotFoundError(f"{what}; copy the course's own back with `cp {shlex.quote(str(shipped))} "
                                 f"{shlex.quote(str(cases_dir))}/` (mkdir -p it first if it is gone)")

    data = {}
    for ch in sorted({e.chapter for e in exercises}):
        path = Path(cases_dir) / f"ch{ch:02d}.json"
        if path.exists():
            try:
                data.update(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):  # (TypeError: JSON that is not an object)
                raise missing(ch, f"{path} cannot be read as public cases") from None
    for e in exercises:
        if e.id not in data:
            raise missing(e.chapter, f"no public cases for exercise {e.id} in {cases_dir}")
    return data


def load_public(cases_dir: Path, exercises: list[Exercise]) -> dict[str, tuple[list[Case], list[Outcome]]]:
    """exercise id -> (public cases, expected results) from ``cases_dir/chNN.json``."""
    return {k: (p.cases, p.expected) for k, p in load_cases(cases_dir, exercises).items()}


@dataclass
class PublicCases:
    """One exercise's public cases as the release ships them."""

    cases: list[Case]
    expected: list[Outcome]
    mistakes: list[Known] = field(default_factory=list)
    """The catalogue's entries of the exercise, as words."""
    wrong: list[dict] = field(default_factory=list)
    """Per case, the entries' outputs on it by key (only those that differ from the answer)."""

    def diagnose(self) -> Callable[[Exercise, Case, dict, dict], Diagnosis | None]:
        """The scoring's ``diagnose`` callback: names a catalogued mistake from the shipped data
        (never importing the catalogue), else a generic symptom."""
        by_case = {id(c): w for c, w in zip(self.cases, self.wrong)}

        def why(ex: Exercise, case: Case, got: dict, expected: dict) -> Diagnosis | None:
            return explain(ex, case, got, expected, wrong=by_case.get(id(case), {}), entries=self.mistakes)

        return why


def load_cases(cases_dir: Path, exercises: list[Exercise]) -> dict[str, PublicCases]:
    """exercise id -> its :class:`PublicCases`, from ``cases_dir/chNN.json``."""
    data = _read_cases(cases_dir, exercises)
    out = {}
    for e in exercises:
        entry = data[e.id]
        cases = [Case(c["name"], values.decode(c["inputs"]), c.get("note", ""), c.get("eager") is True)
                 for c in entry["cases"]]
        expected = [Outcome.from_dict(values.decode(c["expected"])) for c in entry["cases"]]
        known = [Known.from_dict(m) for m in entry.get("mistakes", [])]
        wrong = [values.decode(c.get("wrong") or {}) for c in entry["cases"]]
        out[e.id] = PublicCases(cases, expected, known, wrong)
    return out


@dataclass
class CheckRun:
    """What one ``attn-course check`` found."""

    results: list[ExerciseResult]
    """One per exercise checked, in the order asked."""
    digest: str
    """:func:`library_digest` of the source that ran (read once, before the run)."""
    limits: Limits
    """The limits it ran under."""
    library_error: str = ""
    """Why the library does not import (file, line, exception), when no exercise could run."""
    errors: dict[str, str] = field(default_factory=dict)
    """Exercise id -> the one failure that all its cases share (said once, not once per case)."""


def import_error(outcomes: list[Outcome]) -> str:
    """Why the package does not import, when that is what every outcome reports; else ''."""
    prefix = PACKAGE_DOES_NOT_IMPORT + ": "
    found = {o.message for o in outcomes
             if o.status == "raised" and o.type == "ImportError" and o.message.startswith(prefix)}
    if len(found) != 1 or len(outcomes) != sum(o.message in found for o in outcomes):
        return ""
    return found.pop()[len(prefix):]


def shared_error(outcomes: list[Outcome]) -> str:
    """The failure that every outcome of an exercise reports (an exception, a crash), or ''."""
    if not outcomes or any(o.status in ("ok", "not_implemented") for o in outcomes):
        return ""
    kinds = {(o.status, o.type, o.message, o.where) for o in outcomes}
    if len(kinds) != 1:
        return ""
    o = outcomes[0]
    if o.status == "raised":
        return f"raised {o.type}: {o.message}" + (f" ({o.where})" if o.where else "")
    return o.message or o.status


def run_check(workspace: Path, exercises: list[Exercise], limits: Limits | None = None,
              on_result: Callable[[ExerciseResult, str], None] | None = None,
              backend: str = "jax", server: WorkerServer | None = None) -> CheckRun:
    """The public cases of ``exercises`` on the workspace's library, run on ``backend`` ("jax" or "mlx").

    ``on_result(result, library error)`` is called with each exercise's
    result as soon as it is known (a progress display); the second argument
    is why the library does not import, or ''.  ``server``: a check's worker
    server (:func:`check_server`) already launched, so that its start overlaps
    this process's own (the command's); closed here, as one made here is.
    """
    workspace = Path(workspace)
    public = load_cases(workspace / ".course" / "cases", exercises)
    limits = limits or sandbox.GRADING_LIMITS
    files = package_files(workspace)
    stubbed = stubbed_exercises(files)
    by_id = {e.id: e for e in exercises}
    graded: dict[str, list[CaseResult]] = {}
    broken: dict[str, str] = {}
    shared: dict[str, str] = {}

    def score(ex_id: str, outcomes: list[Outcome]) -> None:
        e = by_id[ex_id]
        p = public[ex_id]
        graded[ex_id] = grade(e, p.cases, p.expected, outcomes, False, stubbed, p.diagnose(), backend)
        broken[ex_id] = import_error(outcomes)
        if not any(c.passed for c in graded[ex_id]) and shared_error(outcomes):
            shared[ex_id] = shared_error(outcomes)
        if on_result is not None:
            on_result(ExerciseResult(e, graded[ex_id]), broken[ex_id])

    server = server or check_server(limits)
    server.warm = False  # one job (or one per exercise after a crash): no later child to warm for
    try:
        if server.proc is not None:  # launched by the caller: ready once its imports are done
            try:
                server.wait_ready()
            except ServerError:  # (it is killed): the job starts a new one, and says if that fails too
                pass
        run_worker(server, files, [(e, public[e.id].cases) for e in exercises], limits, on_result=score,
                   backend=backend, programs=Programs.EXERCISE)
    finally:
        server.close()
    for e in exercises:
        if e.id not in graded:
            score(e.id, [])
    errors = set(broken.values())
    error = errors.pop() if len(errors) == 1 else ""
    return CheckRun([ExerciseResult(e, graded[e.id]) for e in exercises], library_digest(files), limits,
                    error, shared)


def check_public(workspace: Path, exercises: list[Exercise], limits: Limits | None = None,
                 backend: str = "jax") -> list[ExerciseResult]:
    """Each exercise's result on its public cases (see :func:`run_check`)."""
    return run_check(workspace, exercises, limits, backend=backend).results


# -- what the student reads ------------------------------------------------------------

SYMBOL = {Status.PASS: "PASS", Status.FAIL: "FAIL", Status.NOT_IMPLEMENTED: "TODO", Status.BLOCKED: "WAIT",
          Status.TIMEOUT: "TIME", Status.CRASHED: "CRASH", Status.BUDGET: "TIME", Status.TAMPERED: "FAIL"}


def _indent(text: str, prefix: str) -> str:
    return text.replace("\n", "\n" + prefix)


MAX_SAID = 4000
"""Characters of one message from the student's code (or about it) in the report, at most."""


def _said(text: str) -> str:
    """A message the student's code decides (an exception's text, a source line), printable: an
    escape sequence or control character in it would reach the terminal raw (clear it, retitle it)."""
    return plain(text, MAX_SAID, newlines=True)


def _limit_words(e: Exercise, limit_s: float | None) -> str:
    limit = f"the {limit_s:g} s limit" if limit_s else "its time limit"
    return (f"exercise {e.id} ran past {limit} (a loop that never ends, or far more work than the "
            "cases need?); grading stops it at the same limit")


def progress_line(r: ExerciseResult, limit_s: float | None = None, library_error: str = "") -> str:
    """One line as an exercise finishes: ``3.1   ... pass (4/4)``."""
    e = r.exercise
    n = len(r.cases)
    ok = sum(c.passed for c in r.cases)
    status = r.status
    if library_error:
        what = "cannot run: your library does not import"
    elif status == Status.PASS:
        what = f"pass ({ok}/{n})"
    elif status == Status.NOT_IMPLEMENTED:
        what = "not implemented yet"
    elif status == Status.BLOCKED:
        what = "waits for another exercise"
    elif status == Status.TIMEOUT:
        what = f"ran past the {limit_s:g} s limit" if limit_s else "ran past its time limit"
    elif status == Status.CRASHED:
        what = "crashed"
    elif status == Status.TAMPERED:
        what = "not graded: it changed code it does not own"
    else:
        what = f"FAIL ({ok}/{n} pass)"
    return f"{e.id:<5} ... {what}"


def _case_lines(r: ExerciseResult, limit_s: float | None, shared: str) -> list[str]:
    """The cases of a failing exercise; one line when all fail for the same reason."""
    e = r.exercise
    if r.status == Status.TIMEOUT:
        if r.cases and r.cases[0].message == SETUP_TIMEOUT:  # (the runner's words, never the student's)
            limit = f"the {limit_s:g} s limit" if limit_s else "its time limit"
            return [f"        importing your attn_tensors ran past {limit} before exercise {e.id} could start: "
                    "code at a module's top level (outside any function) never ends; grading stops it the same way"]
        return [f"        {_limit_words(e, limit_s)}"]
    if shared:
        n = len(r.cases)
        what = "its case" if n == 1 else f"all {n} cases"
        return [f"        {what}: {_indent(_said(shared), '            ')}"]
    lines = []
    for c in r.cases:
        if c.passed:
            lines.append(f"        ok    {c.case}")
        else:
            lines.append(f"        wrong {c.case}: {_indent(_said(c.message), '              ')}")
    return lines


def report(results: list[ExerciseResult], verbose: bool = True, limit_s: float | None = None,
           library_error: str = "", errors: dict[str, str] | None = None) -> str:
    """The readable report: one block per exercise, or the library's import error once.

    ``errors``: exercise id -> the failure all its cases share (:attr:`CheckRun.errors`),
    said once for the exercise, and once only where several exercises share it.
    """
    if library_error:
        return ("Your library does not import, so no exercise could run:\n    "
                + _indent(_said(library_error), "    ")
                + "\nFix it, then run `attn-course check` again.")
    errors = errors or {}
    first_with: dict[str, str] = {}
    lines = []
    for r in results:
        e = r.exercise
        head = f"[{SYMBOL[r.status]:>5}] Exercise {e.id:<5} {e.title}  ({e.points} pts)"
        lines.append(head)
        shared = errors.get(e.id, "") if not r.passed else ""
        if r.status == Status.PASS:
            lines.append(f"        all {len(r.cases)} public cases pass")
        elif r.status == Status.NOT_IMPLEMENTED:
            lines.append(f"        not implemented yet: write {e.name} in attn_tensors/{e.module}.py"
                         f"  (book: {e.book_page})")
        elif r.status == Status.BLOCKED:
            lines.append(f"        {_said(r.cases[0].message)}")
        elif shared and shared in first_with:
            lines.append(f"        the same error as exercise {first_with[shared]}")
        else:
            if shared:
                first_with[shared] = e.id
            lines += _case_lines(r, limit_s, shared)
            if e.hint and verbose:
                lines.append(f"        hint: {e.hint}")
    return "\n".join(lines)


def progress(passed: set[str], outdated: set[str] = frozenset()) -> str:
    """Progress across the course, by chapter: the exercises that pass on the code as it is now.

    ``outdated``: exercises that passed on an earlier version of the library
    and were not checked since it changed (not counted).
    """
    exercises = all_exercises()
    total = sum(e.points for e in exercises.values())
    got = sum(e.points for e in exercises.values() if e.id in passed)
    parts = []
    for ch in CHAPTERS:
        ids = [e.id for e in exercises.values() if e.chapter == ch]
        if ids:
            parts.append(f"ch{ch:02d} {sum(i in passed for i in ids)}/{len(ids)}")
    text = (f"Progress: {len(passed & set(exercises))}/{len(exercises)} exercises, "
            f"{got}/{total} points on the public cases\n  " + "  ".join(parts))
    old = sorted(set(outdated) & set(exercises), key=lambda i: tuple(int(x) for x in i.split(".")))
    if old:
        text += (f"\n  Not counted: {', '.join(old)} passed before your library changed; "
                 "`attn-course check all` checks them again.")
    return text
