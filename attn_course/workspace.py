"""A student's workspace, and the submission archive made from it.

``attn-course workspace DIR --student ID`` creates::

    DIR/attn_tensors/        the library with the exercises stubbed: your work
    DIR/notebooks/chNN.ipynb the exercise notebooks (nbgrader's student version)
    DIR/tests/               public tests: `pytest -m ex3_1` in DIR
    DIR/.course/cases/       the public cases (inputs and expected values)
    DIR/.course/progress.json  which exercises passed their public cases
    DIR/course.json          student id, token, assignment, versions

and never writes into a folder that already has files.  ``attn-course
submit`` packs ``attn_tensors/`` and ``notebooks/`` with a manifest (student
id, assignment, SHA-256 of every file, library version) into a new archive
under ``DIR/submissions/``; an existing archive is never overwritten.

The student's token (issued by the instructor from the roster, see
:mod:`attn_course.identity`) is kept in ``course.json``: given when the
workspace is made (``--token``) or later (``attn-course workspace
--set-token TOKEN``).  Every manifest is sealed with it (an HMAC of the
manifest under the token, which the grader checks against the student id);
the token itself never goes into an archive, and a file that holds it (a
notebook cell that set it, and printed it) is refused by ``submit``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import EXERCISES, RELEASE_LIBRARY
from .identity import STUDENT_ID, IdentityError, format_token, seal_for, valid_student_id  # noqa: F401 (STUDENT_ID re-exported)
from .registry import CHAPTERS, all_exercises
from .results import atomic_write
from .source_tree import walk

ASSIGNMENT = "attn-tensors-library"
FORMAT = 1


class WorkspaceError(RuntimeError):
    """A workspace problem the user can fix (the message says how)."""


def library_version() -> str:
    text = (RELEASE_LIBRARY / "attn_tensors" / "__init__.py").read_text()
    m = re.search(r'__version__ = "([^"]+)"', text)
    return m.group(1) if m else "unknown"


def check_student_id(student: str) -> str:
    if not valid_student_id(student):
        raise WorkspaceError(
            f"student id {student!r:.80} must be 1-64 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit)"
        )
    return student


PUBLIC_CONFTEST = '''"""Public tests of the exercises: `pytest` here, or `pytest -m ex3_1` / `-m ch03`."""
import pytest

from attn_course.registry import all_exercises


def pytest_configure(config):
    for e in all_exercises().values():
        config.addinivalue_line("markers", f"{e.marker}: exercise {e.id}, {e.title}")
        config.addinivalue_line("markers", f"ch{e.chapter:02d}: chapter {e.chapter}")
'''

PUBLIC_TESTS = '''"""One test per exercise: the public cases from .course/cases, run on ../attn_tensors."""
from pathlib import Path

import pytest

from attn_course.check import check_public, report
from attn_course.registry import all_exercises

HERE = Path(__file__).resolve().parents[1]
EXERCISES = list(all_exercises().values())
_results = {}


@pytest.fixture(scope="session")
def results(request):
    chosen = {item.callspec.params["exercise"] for item in request.session.items
              if hasattr(item, "callspec") and "exercise" in item.callspec.params}
    todo = [e for e in EXERCISES if e.id in chosen and e.id not in _results]
    for r in check_public(HERE, todo):
        _results[r.exercise.id] = r
    return _results


@pytest.mark.parametrize("exercise", [
    pytest.param(e.id, marks=[getattr(pytest.mark, e.marker), getattr(pytest.mark, f"ch{e.chapter:02d}")], id=e.id)
    for e in EXERCISES
])
def test_exercise(exercise, results):
    r = results[exercise]
    assert r.passed, "\\n" + report([r])
'''

README = """# Your attn_tensors workspace

Student: {student}

* Implement the exercises in `attn_tensors/` (each stub raises
  `NotImplementedError("Exercise N.k: ...")`) and in `notebooks/`.
* Check your work:  `attn-course check 3.1`, `attn-course check 3` (a chapter)
  or `attn-course check all`; or `pytest -m ex3_1` here.
* Hand in:  `attn-course submit` writes an archive into `submissions/`.
"""


def check_token(token: str) -> str:
    """``token`` in its printed form (``ABCDE-FGHIJ-KLMNO-PQRST``), or :class:`WorkspaceError`."""
    try:
        return format_token(token)
    except IdentityError as err:
        raise WorkspaceError(str(err)) from None


def create(dest: Path, student: str, token: str | None = None) -> Path:
    """A new workspace in ``dest`` (which must be missing or empty), with the student's token if given."""
    check_student_id(student)
    token = check_token(token) if token else None
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise WorkspaceError(f"{dest} is a file, not a folder; choose a new folder (nothing was changed)")
    if dest.exists() and any(dest.iterdir()):
        raise WorkspaceError(f"{dest} already has files; choose a new folder (nothing was changed)")
    stub = RELEASE_LIBRARY / "attn_tensors"
    if not stub.is_dir():
        raise WorkspaceError(f"the student release is missing ({stub}); run `attn-course release` first")
    existed = dest.is_dir()
    try:
        _fill(dest, stub, student, token)
    except OSError as err:
        # a half-made workspace (a full disk, a lost permission) would be refused by the next try
        # as a folder that "already has files": what was written is removed (the folder was empty)
        _unfill(dest, existed)
        raise WorkspaceError(f"{dest} cannot be made a workspace ({os_reason(err)}); "
                             "nothing was left in it") from None
    except BaseException:  # Ctrl-C: no half-made workspace either (the next try would refuse it)
        _unfill(dest, existed)
        raise
    return dest


def _unfill(dest: Path, existed: bool) -> None:
    """Remove what :func:`_fill` wrote into ``dest`` (missing or empty before): its contents, and
    the folder itself if it was made here."""
    try:
        if not existed:
            shutil.rmtree(dest, ignore_errors=True)
            return
        for entry in list(dest.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    except OSError:
        pass


def os_reason(err: OSError) -> str:
    """An OS error in a few words and the path it is about, for a one-line message (not a traceback).

    ``shutil.copytree`` gathers its files' errors into one :class:`shutil.Error`
    whose text is a list of (source, destination, message) triples: the first
    is told, as its error and the path that could not be written.
    """
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list) and err.args[0]:
        first, more = err.args[0][0], len(err.args[0]) - 1
        if isinstance(first, tuple) and len(first) == 3:
            _, dst, why = (str(x) for x in first)
            code = re.match(r"\[Errno (\d+)\] ", why)
            what = os.strerror(int(code.group(1))) if code else why[:200]
            return f"{what}: {dst}" + (f" (and {more} more)" if more else "")
    where = f": {err.filename}" if err.filename else ""
    return f"{err.strerror or str(err)[:200] or type(err).__name__}{where}"


def _fill(dest: Path, stub: Path, student: str, token: str | None) -> None:
    """Write the workspace's files into ``dest`` (missing or empty); an OS error (a parent that is a
    file, no permission, a full disk) is the caller's to report in one line."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(stub, dest / "attn_tensors", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(RELEASE_LIBRARY / "cases", dest / ".course" / "cases")
    nb = dest / "notebooks"
    nb.mkdir()
    for ch in CHAPTERS:
        src = EXERCISES / f"ch{ch:02d}" / f"ch{ch:02d}.ipynb"
        if src.exists():
            shutil.copyfile(src, nb / src.name)
    tests = dest / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(PUBLIC_CONFTEST)
    (tests / "test_public.py").write_text(PUBLIC_TESTS)
    (dest / "pytest.ini").write_text("[pytest]\ntestpaths = tests\naddopts = -q --strict-markers\n")
    (dest / "README.md").write_text(README.format(student=student))
    meta = {"format": FORMAT, "student_id": student, "assignment": ASSIGNMENT,
            "library_version": library_version(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if token:
        meta["token"] = token
    (dest / "course.json").write_text(json.dumps(meta, indent=1) + "\n")


def set_token(workspace: Path, token: str) -> str:
    """Store ``token`` in the workspace's ``course.json`` (replacing any); returns it as stored."""
    token = check_token(token)
    path = Path(workspace) / "course.json"
    info = meta(workspace)
    info["token"] = token
    atomic_write(path, json.dumps(info, indent=1) + "\n")  # (a fresh temporary name: never a file of the user's)
    return token


def find(start: Path | None = None) -> Path:
    """The workspace containing ``start`` (default: the current folder)."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "course.json").exists() and (folder / "attn_tensors").is_dir():
            return folder
        if (folder / "course.json").exists():
            raise WorkspaceError(
                f"{folder} has its course.json but no attn_tensors/ folder (your library): put it back, "
                "or make a new workspace with `attn-course workspace DIR --student ID` and copy your work in")
    raise WorkspaceError(
        f"{here} is not inside a workspace (no course.json); create one with "
        "`attn-course workspace DIR --student ID`, or pass --workspace DIR"
    )


def meta(workspace: Path) -> dict:
    try:
        info = json.loads((Path(workspace) / "course.json").read_text())
    except (OSError, ValueError) as err:
        raise WorkspaceError(f"{Path(workspace) / 'course.json'} cannot be read ({err})") from None
    if not isinstance(info, dict):
        raise WorkspaceError(f"{Path(workspace) / 'course.json'} is not a JSON object")
    return info


def library_digest(files: dict[str, str]) -> str:
    """A digest of a package's source files (``runner.package_files``): what a check's verdicts hold for."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode(errors="replace") + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class Progress:
    """Which exercises pass their public cases, as far as the checks so far tell."""

    passed: frozenset[str]
    """Passed on the library exactly as it is now."""
    outdated: frozenset[str]
    """Passed on an earlier version of the library, not checked since it changed."""


def record_progress(workspace: Path, results, digest: str) -> Progress:
    """Remember which exercises pass their public cases on the source with ``digest``
    (:func:`library_digest`), then read the progress back against the source as it is now."""
    from .runner import package_files

    path = Path(workspace) / ".course" / "progress.json"
    try:
        old = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        old = {}
    if isinstance(old, list):  # the first format: ids only, the code they passed on unknown
        old = {"passed": {i: "" for i in old if isinstance(i, str)}}
    passed = old.get("passed", {}) if isinstance(old, dict) else {}
    passed = {k: v for k, v in passed.items() if isinstance(k, str) and isinstance(v, str)}
    for r in results:
        if r.passed:
            passed[r.exercise.id] = digest
        else:
            passed.pop(r.exercise.id, None)
    atomic_write(path, json.dumps({"format": 2, "passed": dict(sorted(passed.items()))}, indent=1) + "\n")
    now = library_digest(package_files(Path(workspace)))  # after the run: the source may have changed
    current = frozenset(i for i, d in passed.items() if d == now)
    return Progress(current, frozenset(passed) - current)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def submission_files(workspace: Path) -> list[Path]:
    """What ``submit`` packs: the modules and the notebooks (:func:`attn_course.source_tree.walk`:
    regular files, links to files in the workspace, and links that lead nowhere, which
    :func:`_check_submittable` names; a folder or a pipe named like a module is no module).
    A link to a folder or out of the workspace is refused by name: the grader would never see
    the files it leads to as the student does, and a file from elsewhere on the student's
    machine is not sent without their knowing."""
    ws = Path(workspace)
    modules, notebooks = walk(ws), walk(ws, "notebooks", ".ipynb", recurse=False)
    for link in modules.links + notebooks.links:
        target = os.path.realpath(ws / link)
        raise WorkspaceError(f"{link.as_posix()!r:.120} is a link to {target!r:.120}, "
                             f"{'a folder' if os.path.isdir(target) else 'outside the workspace'}: "
                             "the grader takes files themselves; copy it in place of the link, or move "
                             "the link out (nothing was submitted)")
    return modules.modules + notebooks.modules


def submit(workspace: Path, out: Path | None = None) -> Path:
    """A new submission archive (zip) with ``manifest.json``; returns its path.

    The manifest is sealed with the workspace's token if it has one (see
    :func:`set_token`; the token itself is in no file of the archive: one
    that holds it is refused, red team, round 13); without one the archive
    is still made.
    """
    ws = Path(workspace)
    info = meta(ws)
    student = check_student_id(info.get("student_id", ""))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    if out is None:
        if (ws / "submissions").exists() and not (ws / "submissions").is_dir():
            raise WorkspaceError(f"{ws / 'submissions'} is a file, where submissions are kept; rename it "
                                 "or pass --out ARCHIVE.zip (nothing was submitted)")
        (ws / "submissions").mkdir(exist_ok=True)
        out = ws / "submissions" / f"{student}-{ASSIGNMENT}-{stamp}.zip"
        n = 1
        while out.exists():  # never overwrite an earlier submission
            n += 1
            out = ws / "submissions" / f"{student}-{ASSIGNMENT}-{stamp}-{n}.zip"
    out = Path(out)
    if out.exists():
        raise WorkspaceError(f"{out} already exists; it was not overwritten (choose another name)")
    if out.suffix != ".zip":
        raise WorkspaceError(f"{out}: an archive's name ends in .zip (the grader reads only those); "
                             "nothing was submitted")
    if not out.parent.is_dir():
        raise WorkspaceError(f"{out} cannot be written (there is no folder {out.parent}: make it first, "
                             "or choose another place); nothing was submitted")
    files = submission_files(ws)
    for p in files:
        _check_submittable(ws, p)
    if info.get("token"):
        _no_token_in(ws, files, check_token(info["token"]))
    manifest = {
        "format": FORMAT,
        "student_id": student,
        "assignment": info.get("assignment", ASSIGNMENT),
        "library_version": info.get("library_version", library_version()),
        "exercises": list(all_exercises()),
        "submitted": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "files": {str(p): sha256(ws / p) for p in files},
    }
    token = info.get("token")
    if token:  # sealed with it: the token itself never leaves the workspace (identity.seal_for)
        manifest["seal"] = seal_for(check_token(token), manifest)
    tmp = None
    try:
        # a fresh name beside it (never a file of the student's), renamed into place once checked
        fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
        os.close(fd)
        tmp = Path(name)
        os.chmod(tmp, 0o644)  # as an archive written the usual way (mkstemp makes it 0600)
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1) + "\n")
            for p in files:
                z.write(ws / p, str(p))
        _as_the_grader_reads_it(tmp)
        os.replace(tmp, out)
    except OSError as err:
        raise WorkspaceError(f"{out} cannot be written ({os_reason(err)}); nothing was submitted") from None
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()
    return out


def _no_token_in(ws: Path, files: list[Path], token: str) -> None:
    """Refuse to pack a file that holds the token, however spelt (a notebook cell that ran
    ``attn-course workspace --set-token`` keeps it in its source and its output): an archive
    others see would give it away, and with it archives sealed as the student."""
    raw = token.replace("-", "")
    spellings = re.compile("[-_ ]?".join(re.escape(raw[i:i + 5]) for i in range(0, len(raw), 5)), re.IGNORECASE)
    for p in files:
        try:
            text = (ws / p).read_bytes().decode("utf-8", "replace")
        except OSError as err:
            raise WorkspaceError(f"{p} cannot be read ({os_reason(err)}); nothing was submitted") from None
        if spellings.search(text):
            raise WorkspaceError(f"{p.as_posix()!r:.120} holds your token: anyone who sees the archive could "
                                 "submit as you.  Remove it (in a notebook, the cell and its output) and submit "
                                 "again (nothing was submitted)")


def _check_submittable(ws: Path, path: Path) -> None:
    """Refuse a file the grader would refuse: it rejects a whole archive for one member whose
    name is not a module's (``my-helper.py``) or a notebook's, or that is too large, so the
    student hears it now, not with a zero after the deadline."""
    from .archive import ALLOWED, MAX_FILE

    if not ALLOWED.fullmatch(path.as_posix()):
        raise WorkspaceError(
            f"{path.as_posix()!r:.120} cannot be submitted: the grader takes only modules named with "
            "letters, digits and '_' under attn_tensors/ and notebooks named with letters, digits, "
            "'.', '_' and '-' under notebooks/; rename it or move it out (nothing was submitted)")
    try:
        size = (ws / path).stat().st_size
    except OSError as err:
        raise WorkspaceError(f"{path} cannot be read ({os_reason(err)}); nothing was submitted") from None
    if size > MAX_FILE:
        raise WorkspaceError(f"{path} is larger than {MAX_FILE // 2**20} MB, more than the grader takes; "
                             "nothing was submitted")
    if path.suffix == ".ipynb":
        from .notebook_cells import answer_cells

        try:
            answer_cells((ws / path).read_bytes())
        except (ValueError, OSError):
            raise WorkspaceError(f"{path} is not a notebook Jupyter can open (its answers would score 0): "
                                 "open it in Jupyter and save it, or move it out of notebooks/ to submit "
                                 "without it; nothing was submitted") from None


def _as_the_grader_reads_it(archive: Path) -> None:
    """Read the new archive with the grader's own checks (:func:`attn_course.archive.read_submission`),
    so that one it would reject (too many or too large files, a bad course.json) is never handed in."""
    from .archive import Rejected, read_submission

    try:
        read_submission(archive)
    except Rejected as err:
        raise WorkspaceError(f"the grader would reject this archive ({err}); nothing was submitted") from None
