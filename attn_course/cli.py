"""``attn-course``: the one command of the course.

Students::

    attn-course workspace DIR --student ID [--token TOKEN]
                                             a new workspace (stubbed library, notebooks, tests)
    attn-course workspace --set-token TOKEN  store the token your instructor gave you
    attn-course check [3.1 | 3 | all] [--backend mlx]
                                             public cases of an exercise, a chapter or all
    attn-course submit                       a submission archive with its manifest
    attn-course list                         the exercises, their points and book sections

Instructors::

    attn-course release [--check]            write (or verify) exercises/ and solutions/
    attn-course validate [SPEC]              reference passes, stub fails, every exercise
    attn-course grade DIR --out GRADING      grade a folder of submission archives
    attn-course roster ROSTER.csv --out TOKENS.csv
                                             one token per student (ATTN_COURSE_SECRET)
    attn-course token ID                     re-issue one student's token
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _workspace(args) -> Path:
    from . import workspace

    if args.workspace is not None and not args.workspace.strip():
        raise workspace.WorkspaceError("--workspace needs a folder (leave it out to use the current one)")
    if args.workspace and not Path(args.workspace).is_dir():
        raise workspace.WorkspaceError(f"--workspace {args.workspace}: no such folder")
    return workspace.find(Path(args.workspace) if args.workspace else None)


def cmd_workspace(args) -> int:
    from . import workspace
    from .text import terminal

    if args.set_token is not None:
        if args.student or args.token:
            raise workspace.WorkspaceError("--set-token changes an existing workspace: "
                                           "give it alone (with DIR or from inside the workspace)")
        ws = workspace.find(Path(args.dir) if args.dir else None)
        old = workspace.meta(ws).get("token")
        token = workspace.set_token(ws, args.set_token)
        # (shown masked: printed in full in a notebook's output, it went into the archive: red team, round 13)
        print(f"Stored token {_masked(token)} in {ws / 'course.json'}; your next submissions are sealed with it.")
        if isinstance(old, str) and old and old != token:  # a mistyped new token must not lose the old one
            print(f"It replaces the token {terminal(_masked(old), 80)} (its full form is in your instructor's "
                  "list; set it again if the new one is a typo).")
        return 0
    if not args.dir or not args.student:
        raise workspace.WorkspaceError("a new workspace needs DIR and --student ID "
                                       "(or use --set-token TOKEN in an existing one)")
    dest = workspace.create(Path(args.dir), args.student, args.token)
    print(f"Created workspace {dest} for {args.student}.")
    if not args.token:
        print("No token yet: when your instructor gives you one, run `attn-course workspace --set-token TOKEN` here.")
    print(f"Next: cd {dest} && attn-course check all")
    return 0


def cmd_check(args) -> int:
    from . import sandbox
    from .server import check_server

    limits = sandbox.GRADING_LIMITS
    # the worker server starts first: its imports (Python, NumPy, JAX: most of a short check's
    # time) run while this process imports its own and reads the workspace
    server = check_server(limits)
    server.launch()
    try:
        return _check(args, limits, server)
    finally:
        server.close()


def _check(args, limits, server) -> int:
    from .check import progress_line, report, run_check
    from .registry import select

    ws = _workspace(args)
    chosen = select(args.spec)
    said: list[str] = []

    def show(result, library_error: str) -> None:  # one line per exercise as it finishes
        if not (library_error and library_error in said):  # an import error once, not per exercise
            said.append(library_error)
            print(progress_line(result, limits.per_exercise_s, library_error), file=sys.stderr, flush=True)

    on = " on MLX" if args.backend == "mlx" else ""
    print(f"Checking {len(chosen)} exercise{'s' * (len(chosen) != 1)} on their public cases{on} "
          f"(at most {limits.per_exercise_s:g} s each, as in grading)...", file=sys.stderr, flush=True)
    run = run_check(ws, chosen, limits, on_result=show, backend=args.backend, server=server)
    print(report(run.results, verbose=not args.quiet, limit_s=run.limits.per_exercise_s,
                 library_error=run.library_error, errors=run.errors))
    _show_progress(ws, run)
    return 0 if all(r.passed for r in run.results) else 1


def _show_progress(ws: Path, run) -> None:
    """Record and print the course progress; a workspace that cannot be written (read-only, a full
    disk) costs only the record, in one line: the verdicts above still stand."""
    from . import workspace
    from .check import progress

    try:
        done = workspace.record_progress(ws, run.results, run.digest)
    except OSError as err:
        print(f"attn-course: warning: your progress was not saved ({workspace.os_reason(err)})", file=sys.stderr)
        return
    print()
    print(progress(done.passed, done.outdated))


def cmd_submit(args) -> int:
    from . import workspace

    ws = _workspace(args)
    if args.out is not None and not args.out.strip():
        raise workspace.WorkspaceError("--out needs an archive name (leave it out for one in submissions/)")
    out = workspace.submit(ws, Path(args.out) if args.out else None)
    print(f"Wrote {out}")
    if not workspace.meta(ws).get("token"):
        print("attn-course: warning: this archive has no token; a grader with the course roster rejects it. "
              "Store the token your instructor gave you (`attn-course workspace --set-token TOKEN`) "
              "and submit again.", file=sys.stderr)
    return 0


def cmd_list(args) -> int:
    from .registry import all_exercises

    for e in all_exercises().values():
        own = f" (uses the solution of {e.region})" if e.region else ""
        print(f"{e.id:<5} {e.points} pts  {e.function:<40} {e.title}{own}")
    return 0


def cmd_release(args) -> int:
    from .release import release_all, check_release

    if args.check:
        problems = check_release()
        for p in problems:
            print(p)
        if problems:
            print("\nThe committed release differs from the source: run `attn-course release` and commit.")
            return 1
        print("exercises/ and solutions/ match the source.")
        return 0
    release_all(execute=not args.no_execute)
    return 0


def cmd_validate(args) -> int:
    from .validate import validate

    ok = validate(args.spec, backend=args.backend)
    return 0 if ok else 1


def cmd_similarity(args) -> int:
    from .similarity import main_similarity

    return main_similarity(args)


def cmd_grade(args) -> int:
    from .grade import main_grade

    return main_grade(args)


def _identity_errors(cmd):
    """``cmd`` with identity errors (no secret, a bad roster) reported as usage errors."""
    def run(args) -> int:
        from .identity import IdentityError

        try:
            return cmd(args)
        except IdentityError as err:
            print(f"attn-course: {err}", file=sys.stderr)
            return 2
    return run


@_identity_errors
def cmd_roster(args) -> int:
    from .identity import CI_SECRET, course_secret, load_roster, write_tokens

    roster = load_roster(Path(args.roster))
    secret = course_secret(allow_ci=args.ci_secret)
    out = write_tokens(roster, secret, Path(args.out), force=args.force)
    print(f"Wrote {len(roster)} tokens to {out} (readable by you only).")
    print("Give each student their own token; they store it with `attn-course workspace --set-token TOKEN`.")
    print("Grade with the same ATTN_COURSE_SECRET and the roster, so archives without a valid token are refused.")
    if secret == CI_SECRET:
        print("attn-course: warning: these tokens use the public CI secret; anyone can forge them.", file=sys.stderr)
    return 0


@_identity_errors
def cmd_token(args) -> int:
    from .identity import CI_SECRET, IdentityError, course_secret, load_roster, token_for, valid_student_id

    if not valid_student_id(args.student):
        raise IdentityError(f"invalid student id {ascii(args.student):.80}")  # (a look-alike letter shown as such)
    generation = args.generation
    if args.roster:
        roster = load_roster(Path(args.roster))
        if args.student not in roster:
            raise IdentityError(f"{args.student} is not on the roster {args.roster}")
        if generation is None:
            generation = roster.generation(args.student)
        elif generation != roster.generation(args.student):
            raise IdentityError(f"the roster {args.roster} gives {args.student} token generation "
                                f"{roster.generation(args.student)}, not {generation}: set its token_generation "
                                "column first (the grader checks archives against the roster's)")
    secret = course_secret(allow_ci=args.ci_secret)
    print(token_for(args.student, secret, generation or 0))
    if secret == CI_SECRET:
        print("attn-course: warning: this token uses the public CI secret; anyone can forge it.", file=sys.stderr)
    return 0


def cmd_student_dist(args) -> int:
    from .student_dist import StudentDistError, build

    try:
        dist = build(Path(args.out))
    except StudentDistError as err:
        print(f"attn-course: {err}", file=sys.stderr)
        return 2
    print(f"wrote {dist.wheel} ({len(dist.modules)} modules, {dist.release_files} release files)")
    return 0


def _named(text: str) -> str:
    """A file or folder argument: an empty one is refused (``Path("")`` is the current folder, where
    ``--out "$DIR"`` with DIR unset graded, wrote a wheel, or read a roster of nobody)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: name a file or folder (is a shell variable unset?)")
    return text


def _masked(token: str) -> str:
    """A token as the terminal shows it: its first group only (``ABCDE-*****-*****-*****``)."""
    head, _, rest = token.partition("-")
    return head + "".join("-" + "*" * len(group) for group in rest.split("-")) if rest else token[:5] + "***"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-course", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("workspace", help="create a student workspace, or store your token in one",
                       description="Create a workspace: `attn-course workspace DIR --student ID [--token TOKEN]`. "
                                   "Store the token your instructor gave you in an existing workspace: "
                                   "`attn-course workspace --set-token TOKEN` inside it (or give its DIR).")
    w.add_argument("dir", nargs="?", type=_named, help="the new workspace (or, with --set-token, an existing one)")
    w.add_argument("--student", help="your student id (to create a workspace)")
    w.add_argument("--token", help="the token your instructor gave you (it goes into every submission)")
    w.add_argument("--set-token", metavar="TOKEN",
                   help="store TOKEN in an existing workspace (the one you are in, or DIR)")
    w.set_defaults(func=cmd_workspace)
    c = sub.add_parser("check", help="check exercises on their public cases")
    c.add_argument("spec", nargs="?", default="all", help="3.1, a chapter (3 or ch03), or all")
    c.add_argument("--workspace", help="the workspace (default: the one you are in)")
    c.add_argument("-q", "--quiet", action="store_true", help="no hints under failing exercises")
    c.add_argument("--backend", choices=("jax", "mlx"), default="jax",
                   help="run the cases on JAX arrays (default) or on MLX arrays (Apple Silicon; mlx.core)")
    c.set_defaults(func=cmd_check)
    s = sub.add_parser("submit", help="package a submission archive")
    s.add_argument("--workspace", help="the workspace (default: the one you are in)")
    s.add_argument("--out", help="archive path (default: submissions/<id>-...zip)")
    s.set_defaults(func=cmd_submit)
    ls = sub.add_parser("list", help="list the exercises")
    ls.set_defaults(func=cmd_list)
    r = sub.add_parser("release", help="(instructors) write or check exercises/ and solutions/")
    r.add_argument("--check", action="store_true",
                   help="do not write: fail if the committed release differs from what the source gives")
    r.add_argument("--no-execute", action="store_true", help="do not execute the solution notebooks")
    r.set_defaults(func=cmd_release)
    v = sub.add_parser("validate", help="(instructors) reference passes and stub fails")
    v.add_argument("spec", nargs="?", default="all", help="3.1, a chapter (3 or ch03), or all (default)")
    v.add_argument("--backend", choices=("jax", "mlx", "both"), default="jax",
                   help="run both sides on JAX arrays (default), on MLX arrays, or on both")
    v.set_defaults(func=cmd_validate)
    sd = sub.add_parser("student-dist", help="(instructors) build the students' wheel: tools and release, no reference",
                        description="Write OUT/attn_course_student-VERSION-py3-none-any.whl: the commands a student "
                                    "needs and the release (stubbed library, public cases, notebooks), never the "
                                    "reference library, the solutions, the grader or the mistakes catalogue.")
    sd.add_argument("out", type=_named, help="folder for the wheel (an existing wheel is never overwritten)")
    sd.set_defaults(func=cmd_student_dist)
    g = sub.add_parser("grade", help="(instructors) grade a folder of submission archives")
    g.add_argument("submissions", type=_named, help="folder of *.zip archives (from `attn-course submit`)")
    g.add_argument("--out", required=True, type=_named, help="grading folder (gradebook, feedback, report)")
    g.add_argument("--exercises", default="all", help="exercise, chapter or all (default)")
    g.add_argument("--jobs", type=int, default=None, help="parallel workers on this machine (default 2; "
                                                          "not with --scheduler, where the cluster's workers grade)")
    g.add_argument("--regrade", action="store_true", help="grade finished archives again")
    g.add_argument("--deadline", metavar="ISO_TIME",
                   help="late policy: the deadline, ISO 8601 with its time zone (2026-12-01T23:59+01:00); an "
                        "archive's receipt time is its file's modification time")
    g.add_argument("--grace", type=float, default=0.0, metavar="MINUTES",
                   help="late policy: minutes after the deadline that still count as on time (default 0)")
    g.add_argument("--late-penalty", type=float, default=0.0, metavar="PERCENT",
                   help="late policy: percent of the total taken per started day late (default 0)")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="grade on this Dask cluster (e.g. tcp://host:8786), one task per archive, instead of "
                        "--jobs local workers; each Dask worker needs ATTN_COURSE_SECRET in its environment")
    g.add_argument("--no-bwrap", action="store_true", help="do not use bubblewrap (limits only)")
    g.add_argument("--unconfined", action="store_true",
                   help="grade even where the archives' code could reach this user's files (limits only, "
                        "not as users of their own): only for archives you trust")
    g.add_argument("--roster", metavar="CSV", type=_named,
                   help="the class roster (a student_id column): archives of students not on it are rejected")
    g.add_argument("--trust-manifest-ids", action="store_true",
                   help="UNSAFE: accept archives without a valid token (anyone can submit as anyone)")
    g.add_argument("--backend", choices=("jax", "mlx", "both"), default="jax",
                   help="run the library's cases on JAX arrays (default), MLX arrays, or both: with both "
                        "the score is the JAX one and the feedback also shows each exercise's MLX verdict")
    g.add_argument("--budget", type=float, default=240.0, metavar="SECONDS",
                   help="wall-clock budget of one archive, all exercises together (default 240)")
    g.add_argument("--ci-secret", action="store_true",
                   help="use the public CI secret when ATTN_COURSE_SECRET is unset (tests only: the hidden "
                        "cases are then known to anyone)")
    g.add_argument("--notebooks", action="store_true",
                   help="also grade the archives' notebooks (their answer cells, in the same sandbox) and "
                        "write nbgrader's gradebook and its export GRADING/grades.csv")
    g.add_argument("--nbgrader", metavar="DB_URL",
                   help="the nbgrader gradebook to write (default with --notebooks: "
                        "sqlite:///GRADING/nbgrader/gradebook.db)")
    g.set_defaults(func=cmd_grade)
    sm = sub.add_parser("similarity", help="(instructors) similar code across a graded class",
                        description="After `attn-course grade`: compare what each student wrote (the lines that "
                                    "differ from the released stub, normalised and winnowed) and list the pairs "
                                    "above a threshold in GRADING/similarity/report.md and index.html.")
    sm.add_argument("submissions", type=_named, help="the folder of *.zip archives that was graded")
    sm.add_argument("--out", required=True, type=_named, help="the grading folder of `attn-course grade` (its results/)")
    sm.add_argument("--threshold", type=float, default=0.6,
                    help="list pairs whose similarity (share of one's code found in the other's) reaches this "
                         "(0 to 1, default 0.6)")
    sm.set_defaults(func=cmd_similarity)
    ro = sub.add_parser("roster", help="(instructors) issue one token per student of a roster",
                        description="Write student_id,token for every student of ROSTER.csv (a CSV with a "
                                    "student_id column). Tokens are an HMAC of the id under ATTN_COURSE_SECRET.")
    ro.add_argument("roster", type=_named, help="CSV with a student_id column (and optionally name)")
    ro.add_argument("--out", required=True, type=_named, help="where to write student_id,token (kept if it exists)")
    ro.add_argument("--force", action="store_true", help="replace an existing --out file")
    ro.add_argument("--ci-secret", action="store_true",
                    help="use the public CI secret when ATTN_COURSE_SECRET is unset (tests only: forgeable)")
    ro.set_defaults(func=cmd_roster)
    t = sub.add_parser("token", help="(instructors) re-issue one student's token",
                       description="Print the token of student ID (the same token `roster` issued). A token "
                                   "others have seen is replaced by a new generation's: put the number in the "
                                   "roster's token_generation column (blank is 0) and grade with that roster.")
    t.add_argument("student", metavar="ID", help="the student id, as on the roster")
    t.add_argument("--roster", type=_named, help="refuse an ID that is not on this roster (and use its token_generation)")
    t.add_argument("--generation", type=int, default=None, metavar="N",
                   help="the token of generation N (0 is the first; default: the roster's, else 0)")
    t.add_argument("--ci-secret", action="store_true",
                   help="use the public CI secret when ATTN_COURSE_SECRET is unset (tests only: forgeable)")
    t.set_defaults(func=cmd_token)
    return p


def _instructor_errors() -> tuple[type[Exception], ...]:
    """The errors of the grading commands (the late policy, the Dask cluster, the output
    folder) that are the user's to fix; the students' wheel has none of these modules."""
    try:
        from .dask_pool import ClusterError
        from .grade import OutputFolderError
        from .late import LatePolicyError
    except ModuleNotFoundError:
        return ()
    return (LatePolicyError, ClusterError, OutputFolderError)


def _user_errors() -> tuple[type[Exception], ...]:
    """The errors a command reports in one line (a bad workspace, region, token, option)."""
    from .identity import IdentityError
    from .regions import RegionError
    from .workspace import WorkspaceError

    return (WorkspaceError, RegionError, IdentityError, *_instructor_errors())


def main(argv: list[str] | None = None) -> int:
    from .quick_imports import skip_iri_parsers

    skip_iri_parsers()  # a command that reads notebooks skips 1.8 s of parsers it never uses
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (KeyError, FileNotFoundError, *_user_errors()) as err:  # (imported only now: `check` launches
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err  # its worker before NumPy)
        print(f"attn-course: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attn-course: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("attn_course."):
            raise
        print(f"attn-course: `{args.command}` is an instructor's command; the student "
              "distribution does not include it", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `attn-course check | head`: the reader has gone, and that is fine
        _silence_stdout()
        return 141  # 128 + SIGPIPE, as a program killed by the broken pipe would end


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no second BrokenPipeError."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
