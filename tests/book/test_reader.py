"""The book as a reader meets it: the HTML in headless Chromium, the PDF as text.

These tests build the book (``jupyter-book build . -W -n --keep-going``, the
same command as ``make book``; with a warm cache this takes seconds) and then:

* open every chapter in Debian's Chromium, driven by Playwright, with every
  request outside the book's own local server refused: mathematics is
  typeset by the book's own MathJax (no raw TeX left), every image loads,
  solution toggles open, no internal link is broken, and the console shows no
  errors;
* build the PDF with pdflatex and read it with ``pdftotext``: every chapter
  title is there and the page count is sane.

They need ``chromium``, ``pdflatex``/``latexmk`` and ``pdftotext`` from Debian
(``make test`` installs them).  Without them the tests skip, except in CI
(``CI=true``), where a missing tool is a failure.
"""

from __future__ import annotations

import fcntl
import functools
import http.server
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
JB = pathlib.Path(sys.executable).with_name("jupyter-book")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
IN_CI = os.environ.get("CI") == "true"


def _need(tool: str | None, what: str):
    if tool:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing in CI (make test installs it with apt)")
    pytest.skip(f"{what} is not installed (apt-get install it, or run make test)")


def chapter_pages() -> list[str]:
    """Every page of the table of contents, as paths relative to the HTML root."""
    toc = (ROOT / "_toc.yml").read_text()
    pages = ["intro"] + re.findall(r"file:\s*(\S+)", toc)
    return [p + ".html" for p in pages]


def chapter_titles() -> list[str]:
    """The first heading of every page in the table of contents."""
    titles = []
    for page in chapter_pages():
        src = ROOT / page.replace(".html", ".md")
        for line in src.read_text().splitlines():
            if line.startswith("# "):
                titles.append(line[2:].strip())
                break
    return titles


def build_book(*extra: str) -> None:
    """``jupyter-book build . -W -n --keep-going [extra]``, one build at a time.

    Test modules on other pytest-xdist workers build the same ``_build``
    folder (its notebook cache, doctrees and pages): two builds at once would
    execute every notebook twice and write the same files together.  An
    exclusive lock on ``_build/.build.lock`` runs them one after the other;
    the second finds the cache warm.
    """
    (ROOT / "_build").mkdir(exist_ok=True)
    with open(ROOT / "_build" / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(
            [str(JB), "build", str(ROOT), "-W", "-n", "--keep-going", *extra],
            capture_output=True, text=True, timeout=1500,
        )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.fixture(scope="module")
def html_book():
    build_book()
    return HTML


@pytest.fixture(scope="module")
def server(html_book):
    handler = functools.partial(_QuietHandler, directory=str(html_book))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def browser():
    _need(CHROMIUM, "Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield b
        b.close()


def _open(browser, server, page_path):
    """Open one page with only the local server reachable; collect problems."""
    context = browser.new_context()
    page = context.new_page()
    problems: list[str] = []
    origin = urllib.parse.urlparse(server).netloc

    def route(r):
        host = urllib.parse.urlparse(r.request.url).netloc
        if host == origin or r.request.url.startswith("data:"):
            r.continue_()
        else:
            problems.append(f"request outside the book: {r.request.url}")
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url}") if urllib.parse.urlparse(r.url).netloc == origin else None)
    response = page.goto(f"{server}/{page_path}", wait_until="load")
    assert response is not None and response.ok, f"{page_path}: HTTP {response and response.status}"
    # wait for MathJax to finish typesetting (it is served by the book itself;
    # Sphinx loads it only on pages that have mathematics)
    if page.locator("script[src*='mathjax']").count():
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30000)
        page.evaluate("() => MathJax.startup.promise")
    return context, page, problems


@pytest.mark.book
@pytest.mark.parametrize("page_path", chapter_pages())
def test_page_in_chromium(browser, server, page_path):
    context, page, problems = _open(browser, server, page_path)
    try:
        main = page.locator("main")
        text = main.inner_text()
        # mathematics typeset: no raw TeX delimiters or commands left in the text
        leftovers = [t for t in ("$$", "\\begin{", "\\frac", "\\sum", "{prf:", "{glue", "{eq}") if t in text]
        assert not leftovers, f"{page_path}: raw source left on the page: {leftovers}"
        src = (ROOT / page_path.replace(".html", ".md")).read_text()
        if "$" in src:
            assert page.locator("mjx-container").count() > 0, f"{page_path}: no typeset math"
        # every image loads
        broken = page.evaluate(
            "() => [...document.querySelectorAll('main img')]"
            ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"
        )
        assert not broken, f"{page_path}: images that did not load: {broken}"
        # solution toggles open
        toggles = page.locator("main .toggle-button, main details summary")
        for k in range(min(toggles.count(), 3)):
            toggles.nth(k).click()
        hidden = page.evaluate(
            "() => [...document.querySelectorAll('main .solution.dropdown, main details')]"
            ".filter(e => e.classList.contains('toggle-hidden') || (e.tagName === 'DETAILS' && !e.open)).length"
        )
        if toggles.count():
            assert hidden < page.locator("main .solution.dropdown, main details").count() or hidden == 0
        # internal links resolve (file and anchor)
        hrefs = page.evaluate("() => [...document.querySelectorAll('main a[href]')].map(a => a.getAttribute('href'))")
        for href in hrefs:
            _check_internal_link(page_path, href)
        assert not problems, f"{page_path}: " + "; ".join(problems[:5])
    finally:
        context.close()


def _check_internal_link(page_path: str, href: str) -> None:
    if re.match(r"^[a-z]+:", href) or href.startswith("//"):
        return  # external (http:, mailto:) links are not followed offline
    target, _, anchor = href.partition("#")
    base = (HTML / page_path).parent
    file = (base / target).resolve() if target else (HTML / page_path)
    assert file.is_file(), f"{page_path}: broken link {href}"
    if anchor and file.suffix == ".html":
        html = file.read_text(errors="replace")
        anchor = urllib.parse.unquote(anchor)
        assert f'id="{anchor}"' in html, f"{page_path}: link {href} has no target #{anchor}"


@pytest.mark.book
def test_mathjax_is_served_by_the_book(html_book):
    page = (html_book / "intro.html").read_text()
    assert "_static/mathjax/tex-chtml.js" in page
    assert (html_book / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert not re.search(r"<script[^>]+src=\"https?://[^\"]*mathjax", page, re.I)


@pytest.fixture(scope="module")
def pdf_book(html_book):
    """The PDF (``--builder pdflatex``), its LaTeX auxiliary files and its text."""
    _need(shutil.which("latexmk") and shutil.which("pdflatex"), "TeX Live (latexmk, pdflatex)")
    _need(shutil.which("pdftotext"), "poppler-utils (pdftotext)")
    build_book("--builder", "pdflatex")
    latex = ROOT / "_build" / "latex"
    pdf = latex / "book.pdf"
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    return latex, pdf, text


@pytest.mark.book
def test_pdf_has_every_chapter(pdf_book):
    _, pdf, text = pdf_book
    flat = re.sub(r"\s+", " ", text)
    missing = [t for t in chapter_titles() if re.sub(r"^\d+\.\s*", "", t) not in flat]
    assert not missing, f"chapter titles missing from the PDF: {missing}"
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    pages = int(re.search(r"Pages:\s+(\d+)", info).group(1))
    n_chapters = len(chapter_titles())
    assert 3 * n_chapters <= pages <= 60 * n_chapters, f"{pages} pages for {n_chapters} chapters"
    # the student PDF carries no solutions
    assert "Solution to" not in flat


# -- the same numbers in both formats -------------------------------------------

PROOF_KINDS = ("Definition", "Proposition", "Theorem", "Lemma", "Remark", "Corollary",
               "Algorithm", "Example", "Property", "Assumption", "Observation")


def _html_pages() -> dict[str, str]:
    return {page: (HTML / page).read_text(errors="replace") for page in chapter_pages()}


def _html_theorems() -> list[tuple[str, str]]:
    """(``Proposition 5.3``, title) for every numbered theorem-like box in the HTML."""
    found = []
    pattern = re.compile(r'<span class="caption-number">((?:%s) [\d.]+) </span>\s*\(([^<]*)\)' % "|".join(PROOF_KINDS))
    for html in _html_pages().values():
        found += [(num, _html_text(title)) for num, title in pattern.findall(html)]
    return found


def _html_text(fragment: str) -> str:
    import html as html_lib

    return html_lib.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def _flat(text: str) -> str:
    """Text with line breaks, layout spaces and typographic quotes normalised."""
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    text = re.sub(r"-\s*\n\s*", "-", text)  # a hyphen at a line end (hyphenated word or compound)
    return re.sub(r"\s+", " ", text)


def _latex_labels(latex: pathlib.Path) -> dict[str, str]:
    """label -> the number LaTeX printed for it, from ``book.aux``."""
    aux = (latex / "book.aux").read_text(errors="replace")
    return dict(re.findall(r"\\newlabel\{([^}]*)\}\{\{([^}]*)\}", aux))


@pytest.mark.book
def test_pdf_theorem_numbers_are_the_htmls(pdf_book):
    """Every numbered definition, proposition, ... carries the HTML's number in the PDF.

    The HTML numbers them per chapter ("Proposition 5.3"); the PDF once
    numbered them per section ("Proposition 5.4.2").
    """
    _, _, text = pdf_book
    flat = _flat(text)
    theorems = _html_theorems()
    assert len(theorems) > 50, f"only {len(theorems)} numbered boxes found in the HTML"
    kinds = "|".join(PROOF_KINDS)
    deeper = sorted(set(re.findall(rf"\b(?:{kinds}) \d+\.\d+\.\d+\b", flat)))
    assert not deeper, f"section-level numbers in the PDF, not the HTML's: {deeper[:5]}"
    plain = [(num, title) for num, title in theorems if re.fullmatch(r"[A-Za-z ,'-]{4,}", title)]
    assert len(plain) > 30
    missing = [f"{num} ({title})" for num, title in plain
               if f"{num} ({_flat(title)}" not in flat]
    assert not missing, f"{len(missing)} of {len(plain)} boxes not numbered as in the HTML: {missing[:5]}"


@pytest.mark.book
def test_pdf_equation_and_figure_numbers_are_the_htmls(pdf_book):
    """Each labelled equation and figure has the same number in LaTeX's .aux as in the HTML."""
    latex, _, _ = pdf_book
    labels = _latex_labels(latex)
    compared, wrong = 0, []
    for page, html in _html_pages().items():
        doc = page.removesuffix(".html")
        for name, number in re.findall(
                r'id="equation-([^"]+)">\s*<span class="eqno">\(([\d.]+)\)', html):
            latex_number = labels.get(f"equation:{doc}:{name}")
            if latex_number is not None:
                compared += 1
                if latex_number != number:
                    wrong.append(f"{doc} ({name}): HTML ({number}), PDF ({latex_number})")
        for name, number in re.findall(
                r'<figure[^>]*id="([^"]+)"[^>]*>.*?<span class="caption-number">Fig\. ([\d.]+) </span>', html, re.S):
            latex_number = labels.get(f"{doc}:{name}")
            if latex_number is not None:
                compared += 1
                if latex_number != number:
                    wrong.append(f"{doc} figure {name}: HTML {number}, PDF {latex_number}")
    assert compared > 100, f"only {compared} equations and figures could be compared"
    assert not wrong, f"{len(wrong)} of {compared} numbers differ: {wrong[:5]}"


def _toc_chapters(latex: pathlib.Path) -> list[tuple[str | None, str, int]]:
    """(number or None, title, first page) of each chapter in the PDF's table of contents."""
    toc = (latex / "book.toc").read_text(errors="replace")
    out = []
    for entry, page in re.findall(r"\\contentsline \{chapter\}\{(.*)\}\{(\d+)\}\{[^}]*\}%?$", toc, re.M):
        m = re.match(r"\\numberline \{([^}]*)\}(.*)", entry)
        number, title = (m.group(1), m.group(2)) if m else (None, entry)
        out.append((number, re.sub(r"\\sphinxhyphen \{\}", "-", title), int(page)))
    return out


@pytest.mark.book
def test_pdf_appendices_are_lettered_and_no_chapter_is_empty(pdf_book):
    latex, pdf, _ = pdf_book
    chapters = _toc_chapters(latex)
    numbers = {title: number for number, title, _ in chapters}
    toc = (ROOT / "_toc.yml").read_text()
    appendix_files = re.findall(r"file:\s*(\S+)", toc.split("Appendices", 1)[1])
    appendix_titles = [t for t, p in zip(chapter_titles(), ["intro"] + re.findall(r"file:\s*(\S+)", toc))
                       if p in appendix_files and t in numbers]
    assert appendix_titles, f"no appendix in the PDF's contents: {chapters}"
    for title in appendix_titles:
        assert numbers[title] is None or re.fullmatch(r"[A-Z]", numbers[title]), (
            f"appendix {title!r} is numbered {numbers[title]!r} like a chapter, not lettered")
    assert any(numbers[t] for t in appendix_titles), f"no lettered appendix: {chapters}"
    # the bibliography appears once, and every chapter has a text
    assert [t for _, t, _ in chapters].count("Bibliography") == 1, chapters
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    last = int(re.search(r"Pages:\s+(\d+)", info).group(1))
    starts = [p for _, _, p in chapters] + [last + 1]
    for (number, title, first), nxt in zip(chapters, starts[1:]):
        pages = subprocess.run(
            ["pdftotext", "-f", str(first), "-l", str(max(first, nxt - 1)), str(pdf), "-"],
            capture_output=True, text=True, check=True).stdout
        words = len(pages.split()) - len(title.split())
        assert words > 40, f"chapter {number or ''} {title!r} is (nearly) empty: {words} words"


def _layout_marks(latex: pathlib.Path) -> dict[str, tuple[int, float]]:
    """(absolute page, height in bp from the bottom) of each invisible mark that
    ``_ext/latex_layout.py`` leaves around figures and tables."""
    aux = (latex / "book.aux").read_text(errors="replace")
    return {name: (int(page), int(y) / 65536 * 72 / 72.27) for name, y, page in re.findall(
        r"\\newlabel\{((?:prose-before-figure|figure-at|table-before|table-after)-\d+)\}\{\{(-?\d+)\}\{(\d+)\}", aux)}


def _lines_between(pdf: pathlib.Path, start: tuple[int, float], end: tuple[int, float]) -> str:
    """The PDF's text lines from the mark ``start`` down to the mark ``end`` (``pdftotext -bbox-layout``)."""
    xml = subprocess.run(["pdftotext", "-bbox-layout", "-f", str(start[0]), "-l", str(end[0]), str(pdf), "-"],
                         capture_output=True, text=True, check=True).stdout
    out = []
    for number, page in enumerate(re.findall(r"<page [^>]*>.*?</page>", xml, re.S), start=start[0]):
        height = float(re.search(r'height="([\d.]+)"', page).group(1))
        top = height - start[1] if number == start[0] else 0.0  # from the top of the page, in bp
        bottom = height - end[1] if number == end[0] else height
        for line in re.findall(r"<line [^>]*>.*?</line>", page, re.S):
            y0, y1 = (float(v) for v in re.search(r'<line [^>]*yMin="([\d.]+)"[^>]*yMax="([\d.]+)"', line).groups())
            if top < (y0 + y1) / 2 < bottom:
                out.append(" ".join(re.findall(r"<word [^>]*>(.*?)</word>", line)))
    return "\n".join(out)


@pytest.mark.book
def test_pdf_has_no_index_of_proof_labels(pdf_book):
    """sphinx-proof's domain index lists internal label names: not a page for readers."""
    _, _, text = pdf_book
    assert "Proof Index" not in text
    linking = [p for p, html in _html_pages().items() if "prf-prf.html" in html]
    assert not linking, f"pages link to the proof index: {linking}"


@pytest.mark.book
def test_pdf_figures_sit_by_their_prose(pdf_book):
    """Each figure is on the page of the prose before it, or the next one (never floated further)."""
    latex, _, _ = pdf_book
    marks = _layout_marks(latex)
    figures = sorted(int(k.rsplit("-", 1)[1]) for k in marks if k.startswith("figure-at-"))
    captioned = len(re.findall(r"\\@writefile\{lof\}\{\\contentsline \{figure\}", (latex / "book.aux").read_text(errors="replace")))
    assert figures and len(figures) >= captioned, f"{len(figures)} figure marks for {captioned} captioned figures"
    far = [f"figure {k}: prose on page {marks[f'prose-before-figure-{k}'][0]}, figure on page {marks[f'figure-at-{k}'][0]}"
           for k in figures
           if not 0 <= marks[f"figure-at-{k}"][0] - marks[f"prose-before-figure-{k}"][0] <= 1]
    assert not far, f"{len(far)} of {len(figures)} figures are away from their prose: {far[:5]}"


def _cell_words(latex_table: str) -> set[str]:
    """The words (5 letters or more) a LaTeX table's cells hold, markup and mathematics removed."""
    text = re.sub(r"\\\(.*?\\\)", " ", latex_table, flags=re.S)
    text = re.sub(r"\\[A-Za-z@]+\*?", " ", text)
    return {w.lower() for w in re.findall(r"[A-Za-z]{5,}", text)}


@pytest.mark.book
def test_pdf_table_cells_do_not_hyphenate(pdf_book):
    """No word of a table cell is broken across lines with a hyphen on the table's pages."""
    latex, pdf, _ = pdf_book
    marks = _layout_marks(latex)
    tex = (latex / "book.tex").read_text(errors="replace")
    tables = sorted(int(k.rsplit("-", 1)[1]) for k in marks if k.startswith("table-after-"))
    assert len(tables) == tex.count("\\booklayoutmark{table-after-") and tables, "table marks missing from book.aux"
    broken, checked = [], 0
    for k in tables:
        source = tex.split(f"\\booklayoutmark{{table-before-{k}}}", 1)[1].split(f"\\booklayoutmark{{table-after-{k}}}", 1)[0]
        words = _cell_words(source)
        checked += len(words)
        first, last = marks[f"table-before-{k}"], marks[f"table-after-{k}"]
        lines = _lines_between(pdf, first, last)
        assert len(lines.split()) >= len(words) / 2, f"table {k}: too little text found between its marks"
        # a cell's line ends in "head-" and a later line (that cell's next) starts with the rest
        rows = lines.splitlines()
        starts = [m.group(1) for m in (re.match(r"([a-z]+)", r) for r in rows) if m]
        for head in re.findall(r"([A-Za-z]+)-(?:\s|$)", lines):
            tails = [t for t in starts if (head + t).lower() in words]
            if tails:
                broken.append(f"table {k} (page {first[0]}): {head}-/{tails[0]}")
    assert checked > 50, f"only {checked} table words found: is the table source read right?"
    assert not broken, f"{len(broken)} words hyphenated inside table cells: {broken[:8]}"


# -- the code a reader sees -----------------------------------------------------

# Statements that only set the page up: imports, glue for the prose, plot and
# printing settings.  A visible cell made of nothing else teaches nothing.
_BOOKKEEPING_CALLS = {
    "glue", "matplotlib.use", "jax.config.update", "np.set_printoptions",
    "jnp.set_printoptions", "warnings.filterwarnings", "warnings.simplefilter",
    "plt.style.use", "plt.rcParams.update", "matplotlib.rcParams.update",
    "mpl.rcParams.update", "plt.rc", "print_function",
}


def _dotted(node) -> str:
    import ast

    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def is_bookkeeping(stmt) -> bool:
    """An import, a glue call, or a plot/printing setting."""
    import ast

    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return _dotted(stmt.value.func) in _BOOKKEEPING_CALLS
    if isinstance(stmt, ast.Assign):  # plt.rcParams["font.size"] = 9
        return all(isinstance(t, ast.Subscript) and _dotted(t.value).endswith("rcParams")
                   for t in stmt.targets)
    return False


def visible_code_cells(html: str) -> list[str]:
    """The source of each code cell shown unfolded on a page."""
    cells = []
    for m in re.finditer(r'<div class="cell( [^"]*)?docutils container">(.*?)<div class="cell_input', html, re.S):
        classes, between = m.group(1) or "", m.group(2)
        if "tag_hide-input" in classes or "tag_hide-cell" in classes or "<details" in between:
            continue
        pre = re.search(r"<pre>(.*?)</pre>", html[m.end():], re.S)
        if pre:
            cells.append(_html_text(pre.group(1)))
    return cells


def test_bookkeeping_classifier():
    import ast

    kinds = lambda src: [is_bookkeeping(s) for s in ast.parse(src).body]
    assert kinds('import jax\nfrom x import y\nglue("a", 1, display=False)') == [True] * 3
    assert kinds('matplotlib.use("Agg")\nplt.rcParams["font.size"] = 9') == [True, True]
    assert kinds("S = attention_scores(Q, K)\nprint(S)\nfig, ax = plt.subplots()") == [False] * 3
    page = ('<div class="cell docutils container">\n<div class="cell_input docutils container">'
            '<div class="highlight"><pre><span>import</span> jax</pre></div></div></div>'
            '<div class="cell tag_hide-input docutils container">\n<details class="hide above-input">'
            '<summary>x</summary><div class="cell_input docutils container"><pre>glue()</pre></div></details></div>')
    assert visible_code_cells(page) == ["import jax"]


@pytest.mark.book
def test_no_visible_cell_is_only_bookkeeping(html_book):
    """Imports, glue and plot settings are folded or removed; the cells a reader sees teach."""
    import ast

    offenders, seen = [], 0
    for page in chapter_pages():
        for src in visible_code_cells((html_book / page).read_text(errors="replace")):
            seen += 1
            body = ast.parse(src).body
            if body and all(is_bookkeeping(s) for s in body):
                offenders.append(f"{page}: {src.splitlines()[0][:60]!r}")
            kept = [s for s in body if is_bookkeeping(s)]
            if len(kept) >= 3 and 2 * len(kept) > len(body):
                offenders.append(f"{page}: {len(kept)} of {len(body)} statements are bookkeeping "
                                 f"in a visible cell starting {src.splitlines()[0][:40]!r}")
            glue_calls = [s for s in kept if not isinstance(s, (ast.Import, ast.ImportFrom))]
            if len(glue_calls) > 2:
                offenders.append(f"{page}: {len(glue_calls)} glue/setting lines in a visible cell "
                                 f"starting {src.splitlines()[0][:40]!r}")
    assert seen > 100, f"only {seen} visible code cells found"
    assert not offenders, f"{len(offenders)} visible cells of bookkeeping: {offenders[:6]}"
