"""Similar code found statement by statement, in order: what k-grams miss when statements are interleaved.

:mod:`attn_course.similarity` fingerprints a student's code in k-grams of 25
normalised characters, which span statements.  A copy with a statement of its
own between each of the copied ones (``_k = 0``, ``del _k``) shares no k-gram
across them, and short statements have none of their own: a word-for-word
copy of exercise 3.1 was not found at all, and the reference's whole
``statmech.py`` with twenty such lines dropped from 100% to 47% (red team,
round 17).  Here each statement is one fingerprint, normalised as a copier's
edits leave it unchanged -- a name of the code's own becomes ``V``, a string
``S``; attribute names (``xp.max``), keyword arguments (``axis=``), keywords
and numbers stay, so that two statements match only if they call the same
things the same way -- and a pair's statements are matched in order
(:class:`difflib.SequenceMatcher`): a statement inserted anywhere, on either
side, takes nothing from the other's share.

Statements shorter than :data:`MIN_STATEMENT` normalised characters
(``return V``, ``V=0``: anyone's) and the stub's own are left out; so are
statements that more than ``common`` students wrote (common knowledge, as for
the k-grams).  A pair needs :data:`MIN_STATEMENTS` statements in common, in
order, besides the threshold: a short exercise's two or three lines, which
independent work shares too, make no pair on their own.
"""

from __future__ import annotations

import difflib
import keyword
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import combinations

MIN_STATEMENT = 16  # normalised characters of a statement compared on its own
MIN_STATEMENTS = 5  # statements in common, in order, for a pair


@dataclass(frozen=True)
class Statement:
    """One statement of a student's code, normalised, and where it is in the code (character offsets)."""

    text: str
    start: int
    end: int


@dataclass(frozen=True)
class StatementMatch:
    """Two students' statements in common, in order, in one module."""

    a: str
    b: str
    share_a: float  # share of a's statements (as compared) found in b's, in order
    share_b: float
    characters: int  # normalised characters of the statements in common
    slices_a: tuple[tuple[int, int], ...]  # the statements in common in a's code
    slices_b: tuple[tuple[int, int], ...]


# a statement's tokens, as far as comparing needs them: strings (on one line: code_lines wrote each
# so; one left open runs to the line's end), names, numbers, operators (the longest first), any other
# character alone.  A regular expression, linear in the text (possessive loops, and a string always
# matches, so that no quote starts a scan again: 50,000 escaped quotes held a first draft two minutes),
# where Python's tokenizer, a statement at a time, cost about seven times as much
_TOKEN = re.compile(
    r'(?P<s>[rRbBuUfF]{0,2}(?:"""(?:[^"\\]|\\.?|"(?!""))*+(?:"""|$)' r"|'''(?:[^'\\]|\\.?|'(?!''))*+(?:'''|$)"
    r'|"(?:[^"\\\n]|\\.?)*+(?:"|$)' r"|'(?:[^'\\\n]|\\.?)*+(?:'|$)))"
    r"|(?P<n>[^\W\d]\w*)|(?P<d>\d[\w.]*)"
    r"|(?P<o>\*\*=?|//=?|>>=?|<<=?|->|:=|[-+*/%&|^@<>=!]=|\.\.\.|\S)")
_OPEN, _CLOSE = frozenset("([{"), frozenset(")]}")


def normalised(statement: str) -> str:
    """``statement`` as compared: a name of the code's own ``V``, a string ``S``, no spaces; an
    attribute's name, a keyword argument's, a keyword and a number as written."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(statement)]
    out: list[str] = []
    depth = 0
    for i, (kind, text) in enumerate(tokens):
        if kind == "n":
            after = tokens[i + 1][1] if i + 1 < len(tokens) else ""
            kept = keyword.iskeyword(text) or (out and out[-1] == ".") or (depth > 0 and after == "=")
            out.append(text if kept else "V")
        elif kind == "s":
            out.append("S")
        else:
            depth += text in _OPEN
            depth -= text in _CLOSE and depth > 0
            out.append(text)
    return "".join(out)


def statements(code: str) -> list[Statement]:
    """The statements of ``code`` (one a line: :func:`attn_course.similarity.code_lines`) long enough
    to compare, normalised, with their spans in ``code`` (indentation left out)."""
    out = []
    pos = 0
    for line in code.split("\n"):
        start, end = pos, pos + len(line)
        pos = end + 1
        text = normalised(line)
        if len(text) >= MIN_STATEMENT:
            out.append(Statement(text, start + len(line) - len(line.lstrip()), end))
    return out


def statement_matches(codes: dict[str, str], stub: str, threshold: float, common: int) -> list[StatementMatch]:
    """The pairs of ``codes`` (student -> code, in the students' order) whose statements in common,
    in order, reach ``threshold`` of either one's (and :data:`MIN_STATEMENTS`).  Candidate pairs come
    from an index of statements, as the k-grams' do."""
    boiler = {s.text for s in statements(stub)}
    seqs = {sid: [s for s in statements(code) if s.text not in boiler] for sid, code in codes.items()}
    seqs = {sid: seq for sid, seq in seqs.items() if len(seq) >= MIN_STATEMENTS}
    students = Counter(text for seq in seqs.values() for text in {s.text for s in seq})
    index: dict[str, list[str]] = defaultdict(list)
    for sid, seq in seqs.items():
        for text in sorted({s.text for s in seq}):
            if students[text] <= common:
                index[text].append(sid)
    shared: Counter = Counter()
    for sids in index.values():
        for a, b in combinations(sids, 2):
            shared[(a, b)] += 1
    out = []
    for (a, b), k in sorted(shared.items()):
        if k < MIN_STATEMENTS:
            continue
        sa = [s for s in seqs[a] if students[s.text] <= common]
        sb = [s for s in seqs[b] if students[s.text] <= common]
        blocks = [m for m in difflib.SequenceMatcher(None, [s.text for s in sa], [s.text for s in sb],
                                                      autojunk=False).get_matching_blocks() if m.size]
        matched = sum(m.size for m in blocks)
        if matched < MIN_STATEMENTS or max(matched / len(sa), matched / len(sb)) < threshold:
            continue
        pa = [sa[m.a + i] for m in blocks for i in range(m.size)]
        pb = [sb[m.b + i] for m in blocks for i in range(m.size)]
        out.append(StatementMatch(a, b, matched / len(sa), matched / len(sb), sum(len(s.text) for s in pa),
                                  tuple((s.start, s.end) for s in pa), tuple((s.start, s.end) for s in pb)))
    return out
