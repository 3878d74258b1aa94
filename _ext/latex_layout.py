"""The PDF's layout: the same numbers as the HTML, proofs without title bars,
appendices lettered, no empty chapter.

Jupyter Book 1 builds the PDF through ``sphinx-jupyterbook-latex``, which
turns the table of contents' captions into LaTeX parts.  Left alone, that
gives a PDF which differs from the HTML in four ways this extension undoes:

1. **Numbering.**  With parts, ``sphinx-jupyterbook-latex`` sets
   ``numfig_secnum_depth = 2``, so a theorem numbered per chapter in the HTML
   ("Proposition 5.3") is numbered per section in the PDF ("Proposition
   5.4.2").  The depth is set back to 1 while Sphinx numbers theorems,
   figures and equations, and LaTeX's own counters are reset per chapter, so
   both formats number per chapter.
2. **Proofs.**  ``sphinx-proof`` renders ``{prf:proof}`` as an admonition
   without a title, which LaTeX draws as a box with an empty title bar.  A
   proof is typeset instead as a plain paragraph (its text already starts with
   "Proof.") closed by a square, as in a mathematics book.
3. **Appendices.**  The part captioned ``Appendices`` is preceded by
   ``\\appendix``, so its chapters are lettered (A, B) instead of continuing
   the chapter numbers; their equations are numbered (1), (2), ... as in the
   HTML.
4. **Bibliography.**  ``sphinx-jupyterbook-latex`` moves the bibliography to
   the end of the document, which leaves the page that held it as an empty
   chapter; that chapter is dropped (the bibliography keeps its own unnumbered
   heading and its entry in the table of contents).

It also leaves two invisible marks per figure and table, so that the reader
tests can check the page layout from ``book.aux``.  ``\\booklayoutmark``
(defined in the preamble) typesets nothing and records the absolute page it
lands on (the page number ``pdftotext -f`` takes) and its height there:
``prose-before-figure-K`` where the prose puts figure K, ``figure-at-K``
inside it (where the figure landed), and ``table-before-K`` and
``table-after-K`` around table K.

Everything here acts on the LaTeX builder only; the HTML is unchanged.
"""

from __future__ import annotations

from docutils import nodes
from sphinx import addnodes
from sphinx.builders.latex import LaTeXBuilder
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.writers.latex import LaTeXTranslator

APPENDIX_CAPTION = "Appendices"
# Appendices are lettered; their equations and figures are numbered within
# the appendix without a prefix, as the HTML numbers them (its appendix pages
# are unnumbered): (1), (2), ... rather than (A.1).
APPENDIX_LATEX = (
    "\\appendix\n"
    "\\renewcommand{\\theequation}{\\arabic{equation}}\n"
    "\\renewcommand{\\thefigure}{\\arabic{figure}}\n"
    "\\renewcommand{\\thetable}{\\arabic{table}}\n"
)
BIBLIOGRAPHY_DOC = "chapters/bibliography"

# the environment a proof is typeset in (defined in the preamble; see
# ``sphinx: config: latex_elements: preamble`` in _config.yml)
PROOF_ENV = "bookproof"


def _same_numbers_as_html(app) -> None:
    """Sphinx numbers theorems, figures and equations per chapter (as in the HTML)."""
    if isinstance(app.builder, LaTeXBuilder):
        app.config.numfig_secnum_depth = 1


def _latex_counters_per_chapter(app) -> None:
    """LaTeX resets its figure and equation counters per chapter, too.

    The LaTeX writer counts ``numfig_secnum_depth`` from the top sectioning
    level, which is ``part`` here: depth 1 would mean "per part" (no reset
    at all, so "Fig. 2" instead of "Fig. 2.2"), and depth 2 means "per
    chapter".  Called while the book's single LaTeX document is assembled:
    the environment has numbered everything by then (and has been saved), and
    the writer, created after, alone sees depth 2.
    """
    if app.config.latex_toplevel_sectioning == "part":
        app.config.numfig_secnum_depth = 2


def _is_untitled_proof(node: nodes.Element) -> bool:
    return "proof" in node.get("classes", []) and not any(
        isinstance(child, nodes.title) for child in node.children
    )


def visit_admonition(self, node):
    if isinstance(self, LaTeXTranslator) and _is_untitled_proof(node):
        self.body.append("\n\\begin{%s}" % PROOF_ENV)
    else:
        type(self).visit_admonition(self, node)


def depart_admonition(self, node):
    if isinstance(self, LaTeXTranslator) and _is_untitled_proof(node):
        self.body.append("\\end{%s}\n" % PROOF_ENV)
    else:
        type(self).depart_admonition(self, node)


def _mark(self, kind: str) -> int:
    """The next number of ``kind`` in this document (figures and tables, in order)."""
    marks = self.__dict__.setdefault("_layout_marks", {})
    marks[kind] = marks.get(kind, 0) + 1
    return marks[kind]


def visit_figure(self, node):
    k = _mark(self, "figure")
    self.body.append("\n\\booklayoutmark{prose-before-figure-%d}%%\n" % k)
    LaTeXTranslator.visit_figure(self, node)
    self.body.append("\\booklayoutmark{figure-at-%d}%%\n" % k)


def depart_table(self, node):
    k = _mark(self, "table")
    self.body.append("\n\\booklayoutmark{table-before-%d}%%\n" % k)
    LaTeXTranslator.depart_table(self, node)
    self.body.append("\\booklayoutmark{table-after-%d}%%\n" % k)


class AppendicesAndBibliography(SphinxPostTransform):
    """``\\appendix`` before the appendices' part; no empty bibliography chapter.

    Runs after ``sphinx-jupyterbook-latex``'s root-document transform
    (priority 700), which builds the parts and moves the bibliography.
    """

    default_priority = 800
    builders = ("latex",)

    def run(self, **kwargs) -> None:
        _latex_counters_per_chapter(self.app)
        for start in list(self.document.findall(addnodes.start_of_file)):
            if start.get("docname") == APPENDIX_CAPTION:
                wrapper = start.parent
                holder = wrapper.parent
                holder.insert(holder.index(wrapper), nodes.raw("", APPENDIX_LATEX, format="latex"))
            elif start.get("docname") == BIBLIOGRAPHY_DOC and self._is_empty(start):
                start.parent.remove(start)

    @staticmethod
    def _is_empty(start: nodes.Element) -> bool:
        """Only a title (and labels, and the bibliography's empty placeholder) left."""
        for section in start.findall(nodes.section):
            for child in section.children:
                if isinstance(child, nodes.title):
                    continue
                if child.astext().strip() or next(iter(child.findall(nodes.image)), None):
                    return False
        return True


def setup(app):
    # after sphinx-jupyterbook-latex's builder-inited handler (priority 500)
    app.connect("builder-inited", _same_numbers_as_html, priority=900)
    app.add_node(nodes.admonition, override=True, latex=(visit_admonition, depart_admonition))
    app.add_node(nodes.figure, override=True, latex=(visit_figure, LaTeXTranslator.depart_figure))
    app.add_node(nodes.table, override=True, latex=(LaTeXTranslator.visit_table, depart_table))
    app.add_post_transform(AppendicesAndBibliography)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
