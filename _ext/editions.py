"""Student and instructor editions of the book.

``ATTN_EDITION=student`` (the default) or ``ATTN_EDITION=instructor`` in the
environment of ``make book`` / ``make pdf`` picks the edition.

* Student edition: the solutions of graded exercises (those whose text says
  "Graded exercise") are left out everywhere; in the PDF every solution is
  left out; in the HTML the other solutions stay, folded in toggles.
* Instructor edition: every solution is shown (folded in the HTML).

The edition is a Sphinx config value, so switching it re-reads every page.
"""

from __future__ import annotations

import os

GRADED_MARK = "Graded exercise"


def _solution_nodes(doctree):
    from sphinx_exercise.nodes import solution_node

    return list(doctree.findall(solution_node))


def _graded_labels(doctree) -> set[str]:
    from sphinx_exercise.nodes import exercise_enumerable_node, exercise_node

    labels = set()
    for cls in (exercise_node, exercise_enumerable_node):
        for node in doctree.findall(cls):
            if GRADED_MARK in node.astext():
                labels.add(node.get("label"))
    return labels


def _strip(app, doctree, docname):
    if app.config.attn_edition == "instructor":
        return
    drop_all = app.builder.format != "html"
    graded = _graded_labels(doctree)
    for node in _solution_nodes(doctree):
        if drop_all or node.get("target_label") in graded:
            node.parent.remove(node)


def _check(app, config):
    if config.attn_edition not in ("student", "instructor"):
        raise ValueError(
            f"ATTN_EDITION must be 'student' or 'instructor'; got {config.attn_edition!r}"
        )


def setup(app):
    app.add_config_value("attn_edition", os.environ.get("ATTN_EDITION", "student"), "env")
    app.connect("config-inited", _check)
    # after sphinx-exercise has resolved its nodes (default priority 500)
    app.connect("doctree-resolved", _strip, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

