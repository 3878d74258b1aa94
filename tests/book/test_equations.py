"""Display equations fit the page: on a desktop they are never cut, on a phone never lost.

Opens every page in Chromium (the fixtures of ``test_reader``) at two widths:

* 1280 px, a desktop window: every typeset display equation fits inside its
  box, with nothing hidden and no horizontal scroll bar;
* 390 px, a phone: an equation may be wider than the screen, but then a box
  around it must scroll; none may be cut off by an ancestor that hides its
  overflow (as a proof box once cut eq. 5.12).

Equations inside folded content (closed toggles, hidden cells) have no size
and are skipped.  Needs Debian's chromium; skips without it, like
``test_reader``.
"""

from __future__ import annotations

import pytest

from test_reader import _open, browser, chapter_pages, html_book, server  # noqa: F401

# For every display equation: walk up to the first ancestor that scrolls or
# hides horizontal overflow.  A scrolling box is fine at 390 px and must not
# actually overflow at 1280 px; a hiding box (or the window) must contain the
# equation's typeset width.
OVERFLOWS = """(strict) => {
  const bad = [];
  for (const m of document.querySelectorAll('main mjx-container[display="true"]')) {
    const math = m.querySelector('mjx-math') || m;
    const r = math.getBoundingClientRect();
    if (r.width === 0) continue;
    let el = m, box = null, scrolls = false;
    while (el) {
      const ox = getComputedStyle(el).overflowX;
      if (ox === 'auto' || ox === 'scroll') { scrolls = true; box = el; break; }
      if (ox === 'hidden' || ox === 'clip') { box = el; break; }
      el = el.parentElement;
    }
    const what = (m.closest('div.math') || {}).id || m.textContent.slice(0, 40);
    if (scrolls) {
      if (strict && box.scrollWidth > box.clientWidth + 1)
        bad.push(what + ': scrolls by ' + (box.scrollWidth - box.clientWidth) + ' px');
      continue;
    }
    const b = box ? box.getBoundingClientRect()
                  : {left: 0, right: document.documentElement.clientWidth};
    if (r.left < b.left - 1 || r.right > b.right + 1)
      bad.push(what + ': cut by ' + Math.round(Math.max(b.left - r.left, r.right - b.right)) + ' px');
  }
  return bad;
}"""


@pytest.mark.book
@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("page_path", chapter_pages())
def test_display_equations_fit(browser, server, page_path, width):  # noqa: F811
    context, page, problems = _open(browser, server, page_path)
    try:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(200)  # let the layout settle at the new width
        bad = page.evaluate(OVERFLOWS, width >= 1280)
        assert not bad, f"{page_path} at {width} px: " + "; ".join(bad[:6])
    finally:
        context.close()
