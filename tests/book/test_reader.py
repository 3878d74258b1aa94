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


@pytest.mark.book
def test_pdf_has_every_chapter(html_book):
    _need(shutil.which("latexmk") and shutil.which("pdflatex"), "TeX Live (latexmk, pdflatex)")
    _need(shutil.which("pdftotext"), "poppler-utils (pdftotext)")
    build_book("--builder", "pdflatex")
    pdf = ROOT / "_build" / "latex" / "book.pdf"
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    flat = re.sub(r"\s+", " ", text)
    missing = [t for t in chapter_titles() if re.sub(r"^\d+\.\s*", "", t) not in flat]
    assert not missing, f"chapter titles missing from the PDF: {missing}"
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    pages = int(re.search(r"Pages:\s+(\d+)", info).group(1))
    n_chapters = len(chapter_titles())
    assert 3 * n_chapters <= pages <= 60 * n_chapters, f"{pages} pages for {n_chapters} chapters"
    # the student PDF carries no solutions
    assert "Solution to" not in flat
