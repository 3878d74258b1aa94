"""Addresses in the book: where a label of a chapter is, as a page and an anchor."""

from __future__ import annotations

from .registry import CHAPTERS


def anchor(label: str, chapter: int) -> str:
    """The HTML address of a book label (equations get Sphinx's ``equation-`` prefix)."""
    page = CHAPTERS[chapter][0]
    target = f"equation-{label}" if label.startswith("eq-") else label
    return f"chapters/{page}.html#{target}"
