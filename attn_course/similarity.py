"""Similar code across a class's submissions: normalised code, winnowing, pairs above a threshold.

``attn-course similarity SUBMISSIONS --out GRADING [--threshold 0.6]`` (after
``attn-course grade``) reads, for every student, the archive that counts
(received last; the results in ``GRADING/results``), verified again on this
side without running anything (:func:`attn_course.archive.read_submission`).

Only what a student wrote counts: for each library module, the lines that
differ from the released stub (:data:`attn_course.RELEASE_LIBRARY`: the
signatures, docstrings and given code are identical for everyone), and the
stub's own fingerprints are removed as boilerplate; the whole library is
compared too (:data:`WHOLE`: every module's code and every file the release
does not have, together), so that code moved to another module or file is
found.  A notebook's answer cells are compared as a module of their own
(against the release notebook's answer cells) and belong to the whole too:
a copied notebook, or library code pasted into one, is found.  A student's
code is its statements as Python's tokenizer reads them (:func:`code_lines`:
comments, blank lines and statements that do nothing left out, each statement
whole on a line of its own: padding, stray quotes and ``;`` once hid a
word-for-word copy) and is capped (:data:`MAX_SOURCE` read a file and
:data:`MAX_ARCHIVE_SOURCE` an archive, :data:`MAX_LINES` and :data:`MAX_CODE` a
module, :data:`MAX_WHOLE` the whole: six to forty times the reference's),
which bounds what one archive costs: under 0.85 M characters to tokenise past
the stubs and a bounded diff, however many files it holds.
Code that a cap cut is listed in the report ("not compared in full"): a copy
placed after enough code of another kind is not found, but the padding is
seen.  That code is normalised
(tokenised; names become ``V``/``F``/``O``, strings ``S``: copydetect's
``filter_code``), cut into k-grams and winnowed (Schleimer, Wilkerson and
Aiken 2003; ``copydetect``).  A pair's similarity in a module is, for each of
the two, the share of its fingerprinted tokens found in the other's; the
pair is listed when the larger of the two reaches the threshold.  Pairs are
also found statement by statement, in order (:mod:`attn_course.statements`):
a copy interleaved with statements of its own shares no k-gram across them.  A
fingerprint that more than ``common`` of the class share (default: 10% of
the students, at least 10) is common knowledge and ignored, and candidate
pairs come from an index of fingerprints, so a class of thousands costs about
the number of pairs that share code, not the square of the class.

Writes ``GRADING/similarity/report.md`` (the pairs, most similar first) and
``GRADING/similarity/index.html`` (each pair's two codes side by side, the
shared parts highlighted).  Every text a submission controls (ids, archive
names, code) is escaped and length-capped.
"""

from __future__ import annotations

import difflib
import functools
import html
import io
import tokenize
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from . import EXERCISES, RELEASE_LIBRARY
from .archive import Rejected, library_files, read_submission
from .notebook_cells import answer_cells
from .outputs import Outputs, beside
from .results import ArchiveResult, latest_by_student
from .statements import statement_matches
from .text import CUT, md_inline, plain, python_source, terminal
from .workspace import ASSIGNMENT

K = 25  # k-gram length in normalised characters (copydetect's default noise threshold)
WINDOW = 4  # winnowing window (copydetect's default guarantee threshold is K + WINDOW - 1)
MAX_CODE = 25_000  # characters of one module's student code considered (the reference's largest: 3.4 k)
MAX_WHOLE = 100_000  # characters of a student's whole library considered (the reference's: 24 k)
MAX_SOURCE = 200_000  # characters of a file read past the stub's length (bounds the tokenizer's cost)
# characters of an archive's files read past their stubs' lengths, all files together: one archive of
# 78 extra modules of 200 k each held the class's comparison 80 s (red team, round 12)
MAX_ARCHIVE_SOURCE = 850_000
MAX_LINES = 2_000  # lines of code of one module beyond the stub's considered (bounds difflib's cost; the reference's largest: 47)
MAX_SHOWN = 200  # pairs in the report
SHOW_CHARS = 20_000  # characters of the HTML view per side, as escaped (what a pair adds to the page: twice that)
ANSWERS = " (answer cells)"  # a notebook's pseudo-module: ``notebooks/ch03.ipynb (answer cells)``
WHOLE = "attn_tensors (all modules)"
"""The pseudo-module of a student's whole library: the code of every module, every file the
release does not have and the notebooks' answer cells, together.  Code moved to another module, or to a file of the student's own
(imported from where the stub is), is compared there; a pair is listed under it only when no single
module lists the two students already."""


@dataclass(frozen=True)
class Pair:
    """Two students whose code in one module is similar."""

    a: str
    b: str
    module: str
    similarity_a: float  # share of a's fingerprinted code found in b's
    similarity_b: float
    tokens: int  # normalised characters in common
    slices_a: tuple[tuple[int, int], ...] = ()  # copied spans in a's code (character offsets)
    slices_b: tuple[tuple[int, int], ...] = ()

    @property
    def similarity(self) -> float:
        return max(self.similarity_a, self.similarity_b)


@dataclass(frozen=True)
class Cut:
    """A student's code that a cap cut (:data:`MAX_LINES`, :data:`MAX_CODE`, :data:`MAX_WHOLE`): only its
    first part was compared."""

    student: str
    module: str


@dataclass(frozen=True)
class Shared:
    """Students whose code in ``module`` is the same, as compared (names and strings normalised),
    more of them than share anything the report calls common knowledge: no pair of them is listed."""

    module: str
    students: tuple[str, ...]


@dataclass
class SimilarityReport:
    students: int
    modules: int  # library modules (a notebook's answer cells, and the whole, are not counted)
    threshold: float
    pairs: list[Pair] = field(default_factory=list)
    code: dict[tuple[str, str], str] = field(default_factory=dict)  # (student, module) -> their code
    skipped: list[str] = field(default_factory=list)  # archives that could not be read (why)
    cut: list[Cut] = field(default_factory=list)  # code not compared in full
    shared: list[Shared] = field(default_factory=list)  # the same code in more archives than ``common``
    kept: list[str] = field(default_factory=list)  # its files the instructor edited, kept (written beside them)


@dataclass(frozen=True)
class OwnCode:
    """What a student wrote in one file, as compared: at most :data:`MAX_CODE` characters."""

    text: str
    cut: bool  # more than the caps allow: only the first part is in ``text``
    read: int = 0  # characters read past the stub's length (what the archive's budget is charged)


@dataclass
class ClassCode:
    """Each student's code per module, the stubs, the archives that could not be read and the code cut."""

    codes: dict[str, dict[str, str]]
    stubs: dict[str, str]
    skipped: list[str] = field(default_factory=list)
    cut: list[Cut] = field(default_factory=list)


NO_OPS = frozenset({"pass", "..."})  # statements that do nothing (besides a string alone)
STRING = "\0"  # a string token among a statement's tokens (no token's text)


def code_lines(text: str) -> list[str]:
    """The statements of ``text`` as Python reads them, one a line, each whole.

    Python's own tokenizer reads the text (its line ends, :func:`attn_course.text.python_source`):
    comments, blank lines and statements that do nothing (``pass``, ``...``, a string alone: a
    docstring) are left out, a string that spans lines is written on one (its line ends as
    ``\\n``), statements that ``;`` joins are put on lines of their own, and a statement that
    continues over lines is one line (indented by its depth).  No line then starts or ends inside
    a string or a comment, whichever lines the diff keeps: a red team's copy hid behind one
    comment line holding ``\x1c`` or ``\u2028`` (a line end to ``str.splitlines``, not to Python)
    and a ``\"""`` after it, which opened a string to the comparison's lexer that swallowed the
    rest of the module; statements that ``;`` ended or ``pass`` lines split broke every k-gram.
    Where the text does not tokenize (it would not import either), the rest is kept as it is,
    line by line.
    """
    text = python_source(text)
    out: list[str] = []
    parts: list[str] = []
    kinds: list[str] = []
    depth, last, done = 0, None, 0

    def end() -> None:
        if parts and "".join(kinds) not in NO_OPS and set(kinds) != {STRING}:
            out.append("    " * depth + "".join(parts))
        parts.clear()
        kinds.clear()

    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            kind = tok.type
            if kind in (tokenize.NEWLINE, tokenize.ENDMARKER) or (kind == tokenize.OP and tok.string == ";"):
                end()
                done = tok.end[0] if kind == tokenize.NEWLINE else done
                last = None
                continue
            if kind == tokenize.INDENT:
                depth += 1
            elif kind == tokenize.DEDENT:
                depth = max(depth - 1, 0)
            if kind in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
                continue
            piece = tok.string.replace("\n", "\\n") if kind == tokenize.STRING else tok.string
            if parts and last is not None and tok.start != last:
                parts.append(" ")
            parts.append(piece)
            kinds.append(STRING if kind == tokenize.STRING else tok.string)
            last = tok.end
        return out
    except (tokenize.TokenError, SyntaxError, RecursionError, MemoryError):
        rest = text.split("\n")[done:]
        return out + [line.rstrip() for line in rest if line.strip() and not line.lstrip().startswith("#")]


@functools.lru_cache(maxsize=128)
def _stub_lines(stub: str) -> tuple[str, ...]:
    """:func:`code_lines` of a stub (the same text for every student: read once)."""
    return tuple(code_lines(stub))


def own_code(source: str, stub: str, limit: int = MAX_SOURCE) -> OwnCode:
    """The lines of code of ``source`` that are not the stub's (what the student wrote), in order.

    Lines are statements, as :func:`code_lines` reads them from the first
    :data:`MAX_SOURCE` characters past the stub's length (Python's tokenizer
    reads 2 MB in a second or two).  Each stub line matches at most one line
    of ``source``, so the student's first :data:`MAX_LINES` lines of code lie
    in its first ``stub lines + MAX_LINES`` (only those are diffed: difflib's
    cost grows with how often a stub line repeats in ``source``), and at most
    :data:`MAX_CODE` characters are kept.  ``cut`` when a cap left any out.  ``limit``: what the
    archive has left to read (:data:`MAX_ARCHIVE_SOURCE`), if less than :data:`MAX_SOURCE`.
    """
    if source == stub:
        return OwnCode("", False)
    a = _stub_lines(stub)
    read = source[: len(stub) + max(0, min(limit, MAX_SOURCE))]
    lines = code_lines(read)
    b = lines[: len(a) + MAX_LINES]
    out = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            out += b[j1:j2]
    text = "\n".join(out)
    return OwnCode(text[:MAX_CODE], len(read) < len(source) or len(lines) > len(b) or len(text) > MAX_CODE,
                   max(0, len(read) - len(stub)))


def student_code(source: str, stub: str) -> str:
    """:func:`own_code`'s text."""
    return own_code(source, stub).text


def _fingerprint(name: str, code: str, boilerplate):
    import io

    import numpy as np
    from copydetect import CodeFingerprint

    return CodeFingerprint(name, K, WINDOW, boilerplate=np.array(sorted(boilerplate), dtype=np.int64)
                           if boilerplate else None, language="python", fp=io.StringIO(code))


def compare_class(codes: dict[str, dict[str, str]], stubs: dict[str, str], threshold: float = 0.6,
                  common: int | None = None) -> SimilarityReport:
    """Pairs above ``threshold`` among ``codes[student][module]`` (student code, stub lines excluded)."""
    import logging

    from copydetect.detector import compare_files

    logging.getLogger().setLevel(max(logging.getLogger().level, logging.ERROR))  # copydetect warns on tiny files
    n = len(codes)
    common = common if common is not None else max(10, n // 10)
    report = SimilarityReport(n, sum(m != WHOLE and not m.endswith(ANSWERS) for m in stubs), threshold)
    for module, stub in sorted(stubs.items()):
        written = {sid: code for sid in sorted(codes) if len((code := codes[sid].get(module, "")).strip()) >= K}
        if not written:
            continue  # (the stub's fingerprints cost a second a chapter's notebook: only where needed)
        boiler = _fingerprint(module, stub, None).hashes
        prints = {}
        for sid, code in written.items():
            fp = _fingerprint(module, code, boiler)
            if fp.hashes:
                prints[sid] = fp
                report.code[(sid, module)] = code
        index: dict[int, list[str]] = defaultdict(list)
        same: dict[frozenset, list[str]] = defaultdict(list)
        for sid, fp in prints.items():
            for h in fp.hashes:
                index[h].append(sid)
            same[frozenset(fp.hashes)].append(sid)
        # a group larger than ``common`` holds only fingerprints the pairs below ignore: a solution
        # copied by eleven of a class of 13 made no pair at all, ten made 45 (red team)
        report.shared += [Shared(module, tuple(sids)) for sids in same.values() if len(sids) > common]
        shared: dict[tuple[str, str], int] = defaultdict(int)
        for h, sids in index.items():
            if 1 < len(sids) <= common:
                for a, b in combinations(sids, 2):
                    shared[(a, b)] += 1
        for (a, b), k in shared.items():
            fa, fb = prints[a], prints[b]
            if k / min(len(fa.hashes), len(fb.hashes)) < threshold / 2:
                continue  # too few shared fingerprints to reach the threshold
            tokens, (sa, sb), (la, lb) = compare_files(fa, fb)
            if max(sa, sb) >= threshold:
                report.pairs.append(Pair(a, b, module, float(sa), float(sb), int(tokens),
                                         tuple(zip(map(int, la[0]), map(int, la[1]))),
                                         tuple(zip(map(int, lb[0]), map(int, lb[1])))))
        # and statement by statement, in order: a copy interleaved with statements of its own shares no
        # k-gram across them (red team, round 17: attn_course.statements)
        # (of the two ways, a pair is listed with the higher figure: the copy's own, the other diluted by its junk)
        listed = {(p.a, p.b): i for i, p in enumerate(report.pairs) if p.module == module}
        for m in statement_matches(written, stub, threshold, common):
            found = Pair(m.a, m.b, module, m.share_a, m.share_b, m.characters, m.slices_a, m.slices_b)
            i = listed.get((m.a, m.b))
            if i is None:
                report.code[(m.a, module)], report.code[(m.b, module)] = written[m.a], written[m.b]
                report.pairs.append(found)
            elif found.similarity > report.pairs[i].similarity:
                report.pairs[i] = found
    by_module = {(p.a, p.b) for p in report.pairs if p.module != WHOLE}
    report.pairs = [p for p in report.pairs if p.module != WHOLE or (p.a, p.b) not in by_module]
    report.pairs.sort(key=lambda p: (-p.similarity, p.module, p.a, p.b))
    report.shared.sort(key=lambda g: (-len(g.students), g.module, g.students))
    return report


def class_codes(submissions: Path, results: list[ArchiveResult], stub_library: Path = RELEASE_LIBRARY,
                release_notebooks: Path = EXERCISES) -> ClassCode:
    """Each student's code per module (the counted archive, verified again), the stubs, the
    archives that could not be read and the code a cap cut.

    A notebook's answer cells are a module of their own (``notebooks/chNN.ipynb (answer cells)``,
    against the release's answer cells), and part of the student's whole code (:data:`WHOLE`)."""
    stubs = {n: d.decode("utf-8", "replace") for n, d in library_files(stub_library).items()}
    notebook_stubs = {f"notebooks/{nb.name}{ANSWERS}": answer_cells(nb.read_bytes())
                      for nb in sorted(Path(release_notebooks).glob("ch*/ch*.ipynb"))}
    found = ClassCode({}, {**stubs, **notebook_stubs, WHOLE: ""})
    for sid, r in sorted(latest_by_student(results).items()):
        try:
            sub = read_submission(Path(submissions) / r.archive, ASSIGNMENT)
        except (Rejected, OSError) as err:
            found.skipped.append(f"{r.archive}: {err}")
            continue
        if sub.student_id != sid:
            found.skipped.append(f"{r.archive}: no longer the archive that was graded")
            continue
        left = [MAX_ARCHIVE_SOURCE]  # (the archive's files read in this order, until it is spent)

        def read(source: str, stub: str) -> OwnCode:
            code = own_code(source, stub, left[0])
            left[0] -= code.read
            return code

        own: dict[str, OwnCode] = {m: read(sub.files[m].decode("utf-8", "replace"), stub)
                                   for m, stub in stubs.items() if m in sub.files}
        for name, stub in notebook_stubs.items():
            if name.removesuffix(ANSWERS) in sub.files:
                try:
                    own[name] = read(answer_cells(sub.files[name.removesuffix(ANSWERS)]), stub)
                except ValueError:
                    found.skipped.append(f"{r.archive}: {name.removesuffix(ANSWERS)} is not a readable notebook")
        extra = {m: read(sub.files[m].decode("utf-8", "replace"), "") for m in sorted(sub.files)
                 if m.startswith("attn_tensors/") and m not in stubs}
        # (the modules with code of the student's own only: an empty one was a leading line end, which
        # copydetect's lexer drops, and every highlight of the whole was that many characters early)
        whole = "\n".join(t for t in [c.text for _, c in sorted(own.items())] + [c.text for c in extra.values()] if t)
        found.codes[sid] = {m: c.text for m, c in own.items()} | {WHOLE: whole[:MAX_WHOLE]}
        found.cut += [Cut(sid, m) for m, c in sorted((own | extra).items()) if c.cut]
        if len(whole) > MAX_WHOLE:
            found.cut.append(Cut(sid, WHOLE))
    return found


CUT_MODULES_SHOWN = 5  # of one student's modules that a cap cut, named in the report (the rest counted)


def cut_by_student(cut: list[Cut]) -> list[tuple[str, list[str]]]:
    """The code a cap cut, a line per student (in the students' order), each with its modules: one
    archive of a couple of hundred files each cut is one line, not :data:`MAX_SHOWN` of them that
    pushed the other students' out of the report (red team, round 17: a classmate's padded module,
    the only lead to a copy hidden past the cap, went unnamed)."""
    by: dict[str, list[str]] = {}
    for c in cut:
        by.setdefault(c.student, []).append(c.module)
    return list(by.items())


CUT_WHY = (f"More code than the report compares (over {MAX_LINES:,} lines or {MAX_CODE:,} characters of "
           f"code beyond the stub in a file, or {MAX_WHOLE:,} in all; comments and blank lines do not "
           "count): only the first part was compared, and a copy after it would not be found.  Look "
           "at what fills these files.")


SHARED_WHY = ("Code that is the same, as compared (names and strings normalised), in more archives than "
              "share anything the pairs above call common knowledge (more than a tenth of the class, at least "
              "ten): no pair of them is listed.  One way to write it, or one source: look at a few.")


def report_markdown(rep: SimilarityReport) -> str:
    lines = [f"# Similar code ({rep.students} students, {rep.modules} modules, threshold {rep.threshold:.0%})", "",
             "Only what students wrote is compared (the lines that differ from the released stub); "
             "names and strings are normalised, so renaming does not hide a copy.  A pair is a lead "
             "to look at (index.html), not a verdict: short exercises have few ways to be right.", ""]
    if not rep.pairs:
        lines.append("No pair reaches the threshold.")
    else:
        lines += ["| similarity | student A | student B | module | A in B | B in A | shared |",
                  "|---|---|---|---|---|---|---|"]
        for k, p in enumerate(rep.pairs[:MAX_SHOWN]):
            lines.append(f"| [{p.similarity:.0%}](index.html#pair-{k}) | {md_inline(p.a, 64)} | {md_inline(p.b, 64)} "
                         f"| {md_inline(p.module, 80)} | {p.similarity_a:.0%} | {p.similarity_b:.0%} | {p.tokens} |")
        if len(rep.pairs) > MAX_SHOWN:
            lines += ["", f"... and {len(rep.pairs) - MAX_SHOWN} more pairs above the threshold."]
    if rep.shared:
        lines += ["", "## The same code in many archives", "", SHARED_WHY, ""]
        for g in rep.shared[:MAX_SHOWN]:
            names = ", ".join(md_inline(sid, 64) for sid in g.students[:50])
            more = f" and {len(g.students) - 50} more" if len(g.students) > 50 else ""
            lines.append(f"* {md_inline(g.module, 80)}: {len(g.students)} students: {names}{more}")
    if rep.cut:
        lines += ["", "## Code not compared in full", "", CUT_WHY, ""]
        cut = cut_by_student(rep.cut)
        lines += [f"* {md_inline(sid, 64)}: " + ", ".join(md_inline(m, 80) for m in modules[:CUT_MODULES_SHOWN])
                  + (f" and {len(modules) - CUT_MODULES_SHOWN} more" if len(modules) > CUT_MODULES_SHOWN else "")
                  for sid, modules in cut[:MAX_SHOWN]]
        if len(cut) > MAX_SHOWN:
            lines.append(f"* ... and {len(cut) - MAX_SHOWN} more students")
    if rep.skipped:
        lines += ["", "## Archives not compared", ""] + [f"* {md_inline(s, 300)}" for s in rep.skipped[:200]]
    return "\n".join(lines) + "\n"


def _shown(text: str) -> str:
    """A piece of a student's code for the HTML view: control and invisible characters removed, escaped.

    A tab is four spaces (an indent), not the one space :func:`plain` makes of
    it: code indented with tabs keeps its shape.
    """
    text = text.replace("\t", "    ")
    return html.escape(plain(text, max(len(text), len(CUT) + 1), newlines=True), quote=False) if text else ""


_WIDE = {"&": 5, "<": 4, ">": 4, "\t": 4}  # what a character becomes in the view (escaped; a tab: an indent)


def _fits(code: str, limit: int) -> int:
    """How many of ``code``'s first characters the view shows in at most ``limit`` characters: a
    red team's code of quotes, escaped six times longer, made a 48 MB page of 200 pairs; the view's
    cap counts what escaping makes of each character."""
    total = 0
    for n, c in enumerate(code):
        total += _WIDE.get(c, 1)
        if total > limit:
            return n
    return len(code)


def _highlighted(code: str, slices: tuple[tuple[int, int], ...]) -> str:
    """``code`` (its first :data:`SHOW_CHARS` characters) with the copied ``slices`` marked.

    The slices are offsets in ``code`` as compared, so the code is cut at them
    first and each piece cleaned afterwards: characters that :func:`plain`
    removes (zero-width, escapes) cannot shift a highlight off the copy.
    """
    shown = code[:_fits(code[:SHOW_CHARS], SHOW_CHARS)]
    out, pos = [], 0
    for start, end in sorted(slices):
        start, end = max(start, pos), min(end, len(shown))
        if start >= end:
            continue
        out += [_shown(shown[pos:start]), "<mark>", _shown(shown[start:end]), "</mark>"]
        pos = end
    out.append(_shown(shown[pos:]))
    if len(code) > len(shown):
        out.append(CUT)
    return "".join(out)


def report_html(rep: SimilarityReport) -> str:
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">",
             "<title>Similar code</title><style>body{font-family:sans-serif;margin:1em}"
             ".pair{display:flex;gap:1em}.pair pre{flex:1;overflow:auto;background:#f6f6f6;padding:.5em;"
             "font-size:12px;white-space:pre-wrap}mark{background:#ffd54f}</style></head><body>",
             f"<h1>Similar code: {rep.students} students, threshold {rep.threshold:.0%}</h1>"]
    if not rep.pairs:
        parts.append("<p>No pair reaches the threshold.</p>")
    for k, p in enumerate(rep.pairs[:MAX_SHOWN]):
        a, b, m = (html.escape(plain(x, 80)) for x in (p.a, p.b, p.module))
        parts.append(f"<h2 id='pair-{k}'>{p.similarity:.0%}: {a} and {b}, {m}</h2>"
                     f"<p>{p.similarity_a:.0%} of {a}'s code is in {b}'s; {p.similarity_b:.0%} of {b}'s in {a}'s.</p>"
                     f"<div class='pair'><pre>{_highlighted(rep.code[(p.a, p.module)], p.slices_a)}</pre>"
                     f"<pre>{_highlighted(rep.code[(p.b, p.module)], p.slices_b)}</pre></div>")
    if rep.shared:
        parts.append(f"<h2 id='shared'>The same code in many archives</h2><p>{html.escape(SHARED_WHY)}</p><ul>")
        parts += [f"<li>{html.escape(plain(g.module, 80))}: {len(g.students)} students: "
                  f"{html.escape(', '.join(plain(sid, 64) for sid in g.students[:50]))}</li>"
                  for g in rep.shared[:MAX_SHOWN]]
        parts.append("</ul>")
    if rep.cut:
        parts.append(f"<h2 id='cut'>Code not compared in full</h2><p>{html.escape(CUT_WHY)}</p><ul>")
        cut = cut_by_student(rep.cut)
        parts += [f"<li>{html.escape(plain(sid, 64))}: "
                  f"{html.escape(', '.join(plain(m, 80) for m in modules[:CUT_MODULES_SHOWN]))}"
                  + (f" and {len(modules) - CUT_MODULES_SHOWN} more" if len(modules) > CUT_MODULES_SHOWN else "")
                  + "</li>" for sid, modules in cut[:MAX_SHOWN]]
        if len(cut) > MAX_SHOWN:
            parts.append(f"<li>... and {len(cut) - MAX_SHOWN} more students</li>")
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_similarity(out: Path, submissions: Path, results: list[ArchiveResult], threshold: float = 0.6,
                     stub_library: Path = RELEASE_LIBRARY) -> SimilarityReport:
    found = class_codes(submissions, results, stub_library)
    rep = compare_class(found.codes, found.stubs, threshold)
    rep.skipped, rep.cut = found.skipped, found.cut
    outputs = Outputs(Path(out))  # a report the instructor annotated is kept (this run's goes beside it)
    outputs.write(Path(out) / "similarity" / "report.md", report_markdown(rep))
    outputs.write(Path(out) / "similarity" / "index.html", report_html(rep))
    outputs.close()
    rep.kept = list(outputs.kept)
    return rep


def main_similarity(args) -> int:
    import sys

    out, subs = Path(args.out), Path(args.submissions)
    if not subs.is_dir():
        raise FileNotFoundError(f"no folder of submissions at {subs}")
    if not (0 < args.threshold <= 1):
        print(f"attn-course: --threshold must be in (0, 1], got {args.threshold}", file=sys.stderr)
        return 2
    results = [r for p in sorted((out / "results").glob("*.json")) if (r := ArchiveResult.load(p)) is not None]
    if not results:
        raise FileNotFoundError(f"no grading results in {out / 'results'}: run `attn-course grade` first")
    graded = {r.archive for r in results}
    if not any(p.name in graded for p in subs.iterdir() if p.name.lower().endswith(".zip")):
        # (a report of 0 pairs among 0 students replaced the folder's real one)
        print(f"attn-course: none of the archives in {terminal(str(subs), 200)} was graded into "
              f"{terminal(str(out), 200)}: name the submissions folder that was graded there "
              "(its similarity report was left as it was)", file=sys.stderr)
        return 2
    rep = write_similarity(out, subs, results, args.threshold)
    for rel in rep.kept:
        print(f"kept {terminal(rel, 200)}, edited since it was written; this run's version is "
              f"{terminal(beside(Path(rel)).as_posix(), 200)}")
    cut = f"; {len(rep.cut)} files' code not compared in full (listed)" if rep.cut else ""
    cut += f"; the same code in {len(rep.shared)} modules of many archives (listed)" if rep.shared else ""
    print(f"{len(rep.pairs)} pairs at or above {args.threshold:.0%} among {rep.students} students{cut}; "
          f"see {terminal(str(out / 'similarity' / 'report.md'), 300)}")
    return 0
