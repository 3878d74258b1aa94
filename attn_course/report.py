"""What grading writes for people: gradebook, feedback, class report, histograms.

Everything a submission controls (ids, archive names, exception messages on
public cases) is escaped here for its destination (:mod:`attn_course.text`):
CSV cells a spreadsheet would run as formulas, Markdown, control characters.
Hidden cases' messages are fixed sentences already (:mod:`attn_course.scoring`).
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections import Counter
from pathlib import Path
from typing import Callable

from .exports import GradeRow, grade_rows, write_exports
from .late import LatePolicy
from .outputs import Outputs
from .registry import Exercise
from .results import atomic_write, latest_by_student, result_name
from .text import csv_cell, md_code_block, md_inline


def write_outputs(out: Path, results: list, exercises: list[Exercise], roster=None, notebooks: bool = False,
                  late: LatePolicy | None = None, assignment: str = "attn-tensors-library") -> list[str]:
    """Gradebook (with ``late``: days late and the total after the penalty; with ``roster``, a row
    for each of its students, blank for one with no accepted archive), exports, feedback, report;
    the files the instructor edited since they were written, kept (:class:`attn_course.outputs.Outputs`:
    this run's version of each is beside it)."""
    outputs = Outputs(out)
    write = outputs.write
    best = latest_by_student(results)
    ids = [e.id for e in exercises]
    maxp = float(sum(e.points for e in exercises))
    rows = {g.student_id: g for g in grade_rows(best, exercises, roster, late)}
    buf = io.StringIO()
    w = csv.writer(buf)
    head = ["student_id", *ids, "total", "max", "archive"]
    if late:
        head += ["days_late", "final"]
    if notebooks:
        head += [f"notebook {i}" for i in ids] + ["notebook total"] + (["notebook final"] if late else [])
    w.writerow(head)
    lines: dict[str, list[str]] = {}
    for sid in best:
        r = best[sid]
        scores = [r.scores.get(i, 0.0) for i in ids]
        row = [csv_cell(sid), *[f"{s:g}" for s in scores], f"{sum(scores):g}", f"{maxp:g}", csv_cell(r.archive)]
        if late:
            row += [str(rows[sid].late_days), f"{rows[sid].total:g}"]
        if notebooks:
            nb = [r.notebook_scores.get(i, 0.0) for i in ids]
            nb_total = round(sum(nb), 4)
            row += [f"{s:g}" for s in nb] + [f"{nb_total:g}"]
            if late:  # the same policy as the library's total
                row.append(f"{late.lateness(r.received).apply(nb_total):g}")
        lines[sid] = row
    if roster is not None:  # the whole class: a student with no archive that counts is a row too, its
        for sid in set(roster.ids) - set(best):  # scores blank (no submission, which is not a zero)
            lines[sid] = [csv_cell(sid), *[""] * len(ids), "", f"{maxp:g}", ""] + [""] * (len(head) - len(ids) - 4)
    w.writerows(lines[sid] for sid in sorted(lines))
    write(out / "gradebook.csv", buf.getvalue())
    write_exports(out, list(rows.values()), exercises, assignment, write)
    names = feedback_names(best)
    for sid, r in best.items():
        write(out / "feedback" / names[sid], feedback_text(r, exercises, rows[sid] if late else None, late))
    rejected = [r for r in results if r.rejected]
    for r in rejected:
        name = result_name(Path(r.archive)).removesuffix(".json")
        write(out / "feedback" / "rejected" / f"{name}.md",
              f"# Not graded: {md_inline(r.archive, 120)}\n\n{md_inline(r.rejected, 600)}\n")
    write_report(out, results, best, exercises, roster, write, late)
    outputs.close()
    return outputs.kept


def feedback_names(students) -> dict[str, str]:
    """Each student's ``feedback/<id>.md``, distinct even where the file system ignores case.

    Where two ids differ only in case (``s1`` and ``S1``, two students without a roster), both take
    a digest of the id after a ``+``: on macOS's and Windows's file systems the two files were one,
    and the second student's feedback replaced the first's.  No id holds a ``+``
    (:data:`attn_course.identity.STUDENT_ID`), so no student's own name is another's digest name (a
    student whose id was ``s1-`` and ``s1``'s digest had the file of ``s1``'s feedback, and one of
    the two feedbacks was lost); the digest grows until the names are apart.
    """
    students = list(students)
    folded = Counter(s.lower() for s in students)
    for digits in (8, 16, 64):
        names = {s: f"{s}+{hashlib.sha256(s.encode()).hexdigest()[:digits]}.md" if folded[s.lower()] > 1 else f"{s}.md"
                 for s in students}
        if len({n.lower() for n in names.values()}) == len(students):
            return names
    raise ValueError("two students' feedback files have the same name")  # (sha256 itself would collide)


def _case_lines(fb: dict) -> list[str]:
    out = []
    for c in fb.get("cases", []):
        if c["passed"]:
            continue
        msg = c["message"]
        first, _, rest = msg.partition("\n")
        out.append(f"* {md_inline(c['case'], 120)}: {md_inline(first, 600)}")
        if rest.strip():
            out.append("")
            out.append(md_code_block(rest, 2000))
            out.append("")
    return out


def _section(out: list[str], title: str, scores: dict, feedback: dict, exercises: list[Exercise]) -> None:
    for e in exercises:
        fb = feedback.get(e.id, {})
        out.append(f"## {title}{e.id}: {e.title} ({scores.get(e.id, 0.0):g}/{e.points})")
        status = fb.get("status", "")
        if status == "pass":
            out.append("All cases pass.")
        elif status == "not_implemented":
            out.append("Not implemented.")
        else:
            out += _case_lines(fb)
            if e.hint:
                out.append(f"\nHint: {e.hint}")
        for backend, other in sorted(fb.get("other", {}).items()):  # grade --backend both
            verdict = "all cases pass" if other.get("status") == "pass" else "not implemented" if other.get(
                "status") == "not_implemented" else "some cases fail"
            out.append(f"\nOn {backend.upper()} (for information, not scored): {verdict} "
                       f"({other.get('score', 0.0):g}/{e.points}).")
            if other.get("status") not in ("pass", "not_implemented"):
                out += _case_lines(other)
        out.append("")


def feedback_text(r, exercises: list[Exercise], row: GradeRow | None = None,
                  late: LatePolicy | None = None) -> str:
    maxp = sum(e.points for e in exercises)
    out = [f"# Feedback for {md_inline(r.student_id, 64)}", "", f"Archive: {md_inline(r.archive, 120)}  ",
           f"Total: {r.total:g} / {maxp:g} points", ""]
    if row is not None and late is not None and row.late_days:
        out += [f"Received {row.late_days} day(s) late ({late.describe()}): "
                f"{row.total:g} / {maxp:g} points count.", ""]
    out += [
           "Each exercise is scored on hidden cases; the public cases (the ones "
           "`attn-course check` runs) are shown with expected and obtained values.", ""]
    if r.budget_spent:
        out += ["**This archive used its whole time budget; what had not run by then scores 0.**", ""]
    _section(out, "Exercise ", r.scores, r.feedback, exercises)
    if r.notebook_feedback:
        out += ["# Notebooks", ""]
        chosen = [e for e in exercises if e.id in r.notebook_feedback]
        _section(out, "Notebook exercise ", r.notebook_scores, r.notebook_feedback, chosen)
    return "\n".join(out)


def write_histograms(out: Path, best: dict, exercises: list[Exercise], n: int, maxp: float,
                     write: Callable[[Path, str | bytes], None] = atomic_write) -> bool:
    """``out/histograms.svg`` (:mod:`attn_course.histograms`); True when the file was (re)written.

    A rerun that changes nothing shown (a resume, a late archive with the
    same scores) leaves the file as it was.  The PNG an earlier version drew
    (``histograms.png`` with its ``.histograms.key``) is removed where the key
    shows it is still the file that version wrote.
    """
    from .histograms import class_histograms

    totals = [sum(r.scores.get(e.id, 0.0) for e in exercises) for r in best.values()]
    svg = class_histograms(totals, maxp, [(e.id, e.title, e.points, [r.scores.get(e.id, 0.0) for r in best.values()])
                                          for e in exercises]).encode()
    _remove_old_png(out)
    path = out / "histograms.svg"
    try:
        if path.read_bytes() == svg:
            return False
    except OSError:
        pass
    write(path, svg)
    return True


def _remove_old_png(out: Path) -> None:
    png, keyfile = out / "histograms.png", out / ".histograms.key"
    try:
        _, digest = keyfile.read_text().split()
        if hashlib.sha256(png.read_bytes()).hexdigest() == digest:
            png.unlink()
        keyfile.unlink()
    except (OSError, ValueError):
        pass


MAX_REVIEW_ROWS = 200  # rows of the report's "Code to review" (each archive keeps review.MAX_FLAGS)


def _review_lines(best: dict) -> list[str]:
    """The report's "Code to review": the counted archives' lines that :mod:`attn_course.review` flags."""
    from .review import MAX_FLAGS, WHY, Flag

    flagged = [(sid, r) for sid, r in sorted(best.items()) if r.review_count]
    if not flagged:
        return []
    lines = ["", "## Code to review", "",
             f"{len(flagged)} students' counted archives use what no exercise needs and what can reach the code that "
             "checks them (`attn_course/review.py`; the checks that run say `tampered` where they see a change). "
             "Read in the archive, or seen as the job ran (\"as it ran\": its own code did it, however it was "
             "spelt). A place to look, not a verdict: no score depends on it.", "",
             "| student | where | what | the line |", "|---|---|---|---|"]
    rows, more, seen = 0, 0, set()
    for sid, r in flagged:
        flags = [Flag.from_dict(f) for f in r.review if isinstance(f, dict)]
        for f in flags:
            if rows >= MAX_REVIEW_ROWS:
                more += 1
                continue
            lines.append(f"| {md_inline(sid, 64)} | {md_inline(f.where, 120)} | {md_inline(f.rule, 40)} "
                         f"| {md_inline(f.line, 160)} |")
            seen.add(f.rule)
            rows += 1
        more += max(0, r.review_count - len(flags))
    if more:
        lines += ["", f"and {more} more lines (the report lists {MAX_REVIEW_ROWS}, each archive's result its "
                  f"first {MAX_FLAGS}: the archives hold the rest)."]
    lines += [""] + [f"* {md_inline(rule, 40)}: {md_inline(WHY[rule], 200)}" for rule in WHY if rule in seen]
    return lines


def _late_over_on_time(results: list, best: dict, late: LatePolicy | None) -> list[str]:
    """The report's list of students whose counted archive came after the deadline though an earlier
    archive of theirs was on time: for a person to look at.  The archive made last counts, late or not
    (a student may improve on her work after the deadline and take the penalty); but one she sealed
    and never handed in, handed in late by someone who had the file, counts so too (red team, round
    17: the grader cannot tell the two apart; the platform's record of who uploaded it can)."""
    if late is None:
        return []
    on_time: dict[str, list[str]] = {}  # each student's accepted archives received on time
    for r in results:
        if r.student_id and not r.rejected and late.lateness(r.received).days == 0:
            on_time.setdefault(r.student_id, []).append(r.archive)
    out = []
    for sid in sorted(best):
        counted = best[sid]
        days = late.lateness(counted.received).days
        early = sorted(on_time.get(sid, []))
        if days and early:
            out.append(f"* {md_inline(sid, 64)}: counted {md_inline(counted.archive, 120)}, {days} day(s) late; "
                       f"on time: " + ", ".join(md_inline(a, 120) for a in early[:5])
                       + (f" and {len(early) - 5} more" if len(early) > 5 else ""))
    if not out:
        return []
    return ["", "## Counted late though an earlier archive was on time (check who handed it in)", "",
            "The archive made last counts.  Check on the learning platform that the student handed the late "
            "one in herself: anyone who has a copy of an archive she sealed can hand it in.", ""] + out


def write_report(out: Path, results: list, best: dict, exercises: list[Exercise], roster=None,
                 write: Callable[[Path, str | bytes], None] = atomic_write, late: LatePolicy | None = None) -> None:
    from .class_stats import mistake_counts, totals

    rejected = [r for r in results if r.rejected]
    maxp = sum(e.points for e in exercises)
    tot = totals(best, exercises)
    write_histograms(out, best, exercises, tot.n, maxp, write)
    lines = [f"# Class report ({len(best)} students, {len(rejected)} rejected archives)", "",
             f"Totals out of {maxp:g}: mean {tot.mean:.2f}, median {tot.median:g}, {tot.full} with full marks, "
             f"{tot.zero} with none.", "",
             "| exercise | points | mean | full marks | zero |", "|---|---|---|---|---|"]
    for e in exercises:
        s = [r.scores.get(e.id, 0.0) for r in best.values()]
        mean = sum(s) / len(s) if s else 0.0
        lines.append(f"| {e.id} | {e.points} | {mean:.2f} | {sum(x == e.points for x in s)} | {sum(x == 0 for x in s)} |")
    mistakes = mistake_counts(best, exercises)
    if mistakes:
        lines += ["", "## Catalogued mistakes, most frequent first", "",
                  "Students whose counted archive reproduces a known mistake (`attn_course/mistakes/`).", "",
                  "| students | exercise | mistake | what it does |", "|---|---|---|---|"]
        lines += [f"| {m.students} | {m.exercise} | {md_inline(m.key, 60)} | {md_inline(m.message, 300)} |"
                  for m in mistakes]
    lines += _review_lines(best)
    if rejected:
        lines += ["", "## Rejected archives", ""]
        lines += [f"* {md_inline(r.archive, 120)}: {md_inline(r.rejected, 300)}" for r in rejected]
    spent = [r for r in results if r.budget_spent]
    if spent:
        lines += ["", "## Archives that used their whole time budget", ""]
        lines += [f"* {md_inline(r.archive, 120)} ({md_inline(r.student_id or '', 64)}, {r.seconds:.0f} s)" for r in spent]
    accepted = Counter(r.student_id for r in results if r.student_id and not r.rejected)
    dup = sorted(s for s, k in accepted.items() if k > 1)
    if dup:
        lines += ["", "## Students with several archives (the one made last counts: sealed by attn-course submit)", ""]
        for sid in dup:
            names = sorted((r.received, r.archive) for r in results if r.student_id == sid and not r.rejected)
            lines.append(f"* {md_inline(sid, 64)}: " + ", ".join(md_inline(a, 120) for _, a in names)
                         + f" — counted: {md_inline(best[sid].archive, 120)}")
    lines += _late_over_on_time(results, best, late)
    if roster is not None:
        missing = [s for s in roster.ids if s not in best]
        if missing:
            lines += ["", "## On the roster, no accepted archive", ""] + [f"* {md_inline(s, 64)}" for s in missing]
    lines += ["", "![totals and per-exercise scores](histograms.svg)", ""]
    write(out / "report.md", "\n".join(lines))
