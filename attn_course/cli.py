"""``attn-course``: the one command of the course.

Students::

    attn-course workspace DIR --student ID   a new workspace (stubbed library, notebooks, tests)
    attn-course check [3.1 | 3 | all]        public cases of an exercise, a chapter or all
    attn-course submit                       a submission archive with its manifest
    attn-course list                         the exercises, their points and book sections

Instructors::

    attn-course release [--check]            write (or verify) exercises/ and solutions/
    attn-course validate [SPEC]              reference passes, stub fails, every exercise
    attn-course grade DIR --out GRADING      grade a folder of submission archives
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _workspace(args) -> Path:
    from . import workspace

    return workspace.find(Path(args.workspace) if args.workspace else None)


def cmd_workspace(args) -> int:
    from . import workspace

    dest = workspace.create(Path(args.dir), args.student)
    print(f"Created workspace {dest} for {args.student}.")
    print(f"Next: cd {dest} && attn-course check all")
    return 0


def cmd_check(args) -> int:
    from . import workspace
    from .check import check_public, progress, report
    from .registry import select

    ws = _workspace(args)
    chosen = select(args.spec)
    results = check_public(ws, chosen)
    print(report(results, verbose=not args.quiet))
    passed = workspace.record_progress(ws, results)
    print()
    print(progress(passed))
    return 0 if all(r.passed for r in results) else 1


def cmd_submit(args) -> int:
    from . import workspace

    ws = _workspace(args)
    out = workspace.submit(ws, Path(args.out) if args.out else None)
    print(f"Wrote {out}")
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

    ok = validate(args.spec)
    return 0 if ok else 1


def cmd_grade(args) -> int:
    from .grade import main_grade

    return main_grade(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-course", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("workspace", help="create a student workspace")
    w.add_argument("dir")
    w.add_argument("--student", required=True, help="your student id")
    w.set_defaults(func=cmd_workspace)
    c = sub.add_parser("check", help="check exercises on their public cases")
    c.add_argument("spec", nargs="?", default="all", help="3.1, a chapter (3 or ch03), or all")
    c.add_argument("--workspace", help="the workspace (default: the one you are in)")
    c.add_argument("-q", "--quiet", action="store_true", help="no hints")
    c.set_defaults(func=cmd_check)
    s = sub.add_parser("submit", help="package a submission archive")
    s.add_argument("--workspace")
    s.add_argument("--out", help="archive path (default: submissions/<id>-...zip)")
    s.set_defaults(func=cmd_submit)
    ls = sub.add_parser("list", help="list the exercises")
    ls.set_defaults(func=cmd_list)
    r = sub.add_parser("release", help="(instructors) write or check exercises/ and solutions/")
    r.add_argument("--check", action="store_true")
    r.add_argument("--no-execute", action="store_true", help="do not execute the solution notebooks")
    r.set_defaults(func=cmd_release)
    v = sub.add_parser("validate", help="(instructors) reference passes and stub fails")
    v.add_argument("spec", nargs="?", default="all")
    v.set_defaults(func=cmd_validate)
    g = sub.add_parser("grade", help="(instructors) grade a folder of submission archives")
    g.add_argument("submissions", help="folder of *.zip archives (from `attn-course submit`)")
    g.add_argument("--out", required=True, help="grading folder (gradebook, feedback, report)")
    g.add_argument("--exercises", default="all", help="exercise, chapter or all (default)")
    g.add_argument("--jobs", type=int, default=2, help="parallel workers (default 2)")
    g.add_argument("--regrade", action="store_true", help="grade finished archives again")
    g.add_argument("--no-bwrap", action="store_true", help="do not use bubblewrap (limits only)")
    g.add_argument("--roster", metavar="CSV",
                   help="the class roster (a student_id column): archives of students not on it are rejected")
    g.add_argument("--trust-manifest-ids", action="store_true",
                   help="UNSAFE: accept archives without a valid token (anyone can submit as anyone)")
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
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .regions import RegionError
    from .registry import SecretMissing
    from .workspace import WorkspaceError

    try:
        return args.func(args)
    except (WorkspaceError, KeyError, FileNotFoundError, RegionError, SecretMissing) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"attn-course: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attn-course: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
