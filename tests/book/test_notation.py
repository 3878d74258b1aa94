"""The notation appendix and the chapters agree, where a machine can tell.

Reads the Markdown sources (no build needed):

* every symbol listed in the appendix's symbol table occurs in the
  mathematics of some chapter, so the table lists nothing the book does not
  use;
* every index letter of the appendix's index table occurs in some chapter's
  mathematics;
* retired spellings, each of which once gave a second symbol to a meaning
  that has one (the mask, a row maximum, the number of ground states, the
  log-sum-exp of flash attention, the loss, the key-value summary of linear
  attention, a reparameterisation matrix), occur in no chapter's mathematics.
  The errata page quotes the sources as printed and is exempt.

Each check can fail: adding a symbol to the table that the chapters never use,
or writing ``$m^{ij}$`` for a mask in any chapter, fails a test.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md"))
NOTATION = ROOT / "chapters" / "notation.md"

CODE_CELL = re.compile(r"```\{code-cell\}.*?\n```", re.S)
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+?\$", re.S)


def math_of(path: pathlib.Path) -> str:
    """The mathematics of a page: its $...$ and $$...$$ spans outside code cells."""
    text = CODE_CELL.sub("", path.read_text())
    return "\n".join(MATH.findall(text))


def squash(tex: str) -> str:
    """TeX without spaces, so `A^{ij} V^{jb}` and `A^{ij}V^{jb}` compare equal."""
    return re.sub(r"\s+", "", tex)


@pytest.fixture(scope="module")
def chapter_math() -> dict[str, str]:
    return {p.name: squash(math_of(p)) for p in CHAPTERS}


def table_rows(heading: str) -> list[list[str]]:
    """The body rows of the first Markdown table after a heading of notation.md."""
    text = NOTATION.read_text()
    start = text.index(heading)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:] if rows and set(rows[1][0]) <= set("-: ") else rows[1:]


def symbols_of(cell: str) -> list[str]:
    """The symbols of a table cell: its math spans, split at top-level commas."""
    out = []
    for span in re.findall(r"\$([^$]+)\$", cell):
        depth, cur = 0, ""
        for ch in span:
            depth += ch == "{"
            depth -= ch == "}"
            if ch == "," and depth == 0:
                out.append(cur.strip())
                cur = ""
            else:
                cur += ch
        out.append(cur.strip())
    return [s for s in out if s and s != "..."]


SYMBOLS = [s for row in table_rows("## Symbols") for s in symbols_of(row[0])]
INDEX_LETTERS = [s for row in table_rows("## Index letters") for s in symbols_of(row[0])]


def test_tables_are_read():
    """The parser finds both tables (guards the tests below against vacuity)."""
    assert len(SYMBOLS) >= 30
    assert {"i", "h", "d", "f"} <= set(INDEX_LETTERS)


@pytest.mark.parametrize("symbol", SYMBOLS)
def test_every_listed_symbol_is_used(symbol, chapter_math):
    """A symbol of the appendix occurs in the mathematics of some chapter."""
    needle = squash(symbol)
    where = [name for name, text in chapter_math.items() if needle in text]
    assert where, f"notation.md lists ${symbol}$ but no chapter's mathematics uses it"


@pytest.mark.parametrize("letter", INDEX_LETTERS)
def test_every_index_letter_is_used(letter, chapter_math):
    """An index letter of the appendix occurs as an index in some chapter."""
    pattern = re.compile(r"[\^_]\{?[^}]*" + re.escape(letter.replace("\\", "")))
    found = any(pattern.search(text) for text in chapter_math.values())
    assert found, f"notation.md lists the index ${letter}$ but no chapter uses it"


RETIRED = {
    r"(?<![\\\w])m\^\{i[jk]\}": "the mask is M^{ij}, not m^{ij}",
    r"(?<![\\\w])M\^i(?![\w{])": "a row maximum is S^i_{\\max}, not M^i",
    r"(?<![\\\w])g=\|G\|": "the number of ground states is n_G",
    r"\\logg(?![\w])": "the number of ground states is n_G (log n_G, not log g)",
    r"(?<![\\\w(])L\^i(?![\w])": "flash attention stores log Z^i, not L^i",
    r"\\partial\\mathcal\{L\}/\\partial[A-Z]": "the loss is L, not \\mathcal{L} (that is the Lagrangian)",
    r"S\^\{cb\}": "the key-value summary of linear attention is U^{cb}",
    r"=L\\varphi": "a reparameterisation matrix is J (L is the loss)",
}


@pytest.mark.parametrize("pattern", list(RETIRED))
def test_retired_spellings_are_gone(pattern, chapter_math):
    """No chapter writes a meaning with a symbol the appendix retired."""
    hits = [name for name, text in chapter_math.items() if re.search(pattern, text)]
    assert not hits, f"{RETIRED[pattern]}; found in {hits}"


def test_the_mask_is_named_in_the_appendix():
    """The appendix's symbol for the mask is the one the retired list enforces."""
    masks = [row for row in table_rows("## Symbols") if "mask" in row[1]]
    assert masks and "M^{ij}" in masks[0][0]


# The library's docstrings and comments write the formulas in plain text
# ("M^{ij}", "S_max^i"); the same retired spellings must not come back there.
LIBRARY = ROOT / "attn_tensors"
LIBRARY_RETIRED = {
    r"(?<![\w\\])m\^\{i[jk]\}": "the mask is M^{ij}, not m^{ij}",
    r"(?<![\w\\])M\^i(?![\w{])": "a row maximum is S_max^i, not M^i",
    r"(?<![\w\\(])L\^i(?![\w])": "flash attention stores log Z^i, not L^i",
    r"(?<![\w\\])S\^\{cb\}": "the key-value summary of linear attention is U^{cb}",
    r"(?<![\w\\])F\^i = not": "F^i is the free energy; fully masked rows are [n^i = 0]",
    r"(?<![\w\\])g = \|G\|": "the number of ground states is n_G",
}


def library_texts() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(LIBRARY.rglob("*.py"))}


def test_library_scan_can_fail():
    """The patterns catch what they are meant to catch."""
    samples = ["A = m^{ij} / n", "shift by M^i first", "saved L^i", "S^{cb} += x", "F^i = not any_j", "g = |G|"]
    for pattern, sample in zip(LIBRARY_RETIRED, samples):
        assert re.search(pattern, sample), pattern
    fine = "M^{ij} mask, S_max^i, log Z^i, U^{cb}, dL^i, m^i running max"
    assert not any(re.search(p, fine) for p in LIBRARY_RETIRED)


@pytest.mark.parametrize("pattern", list(LIBRARY_RETIRED))
def test_library_docstrings_use_the_book_notation(pattern):
    """The library's docstrings and comments use the notation appendix's symbols."""
    hits = [f"{name}:{text[:m.start()].count(chr(10)) + 1}"
            for name, text in library_texts().items()
            for m in re.finditer(pattern, text)]
    assert not hits, f"{LIBRARY_RETIRED[pattern]}; found at {hits[:8]}"
