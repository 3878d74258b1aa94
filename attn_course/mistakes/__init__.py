"""The mistakes students really make, one wrong implementation each.

One module per chapter (``mistakes/ch02.py`` holds the mistakes of
exercises 2.1-2.5).  Each entry is a :class:`Mistake`: the exercise, a
stable key, a fixed message in the second person that names the mistake
and its consequence, the book label that explains it, and ``wrong``, a
wrong implementation with the signature of the exercise's function.  The
diagnosis (:mod:`attn_course.diagnose`) runs ``wrong`` through the
exercise's probe on the same inputs as a failing answer and reports the
entry whose output the answer reproduces.

Trusted side only: a wrong implementation may call the reference library
(``attn_tensors`` with its solutions), and several are the right function
with one switch turned (``_softmax.softmax``, ``ch05._backward``,
``ch06.forward``, ``ch09.online_block``...), i.e. a solution with one line
changed: these modules must never go to students.  A student-side check
can still name mistakes from the catalogue's outputs on the public cases,
computed here and shipped as data (``diagnose(..., wrong=...)``).  Messages
are written here, never built from case data.

Adding an entry: write the wrong implementation with the exercise
function's signature (the same mistake only, everything else right),
decorate it with ``@mistake(exercise, key, label, message)`` where
``label`` is a ``:label:``, ``(label)=`` or ``$$ (label)`` of the book,
and check that ``tests/course/test_mistakes.py -m exN_k`` passes: the
mistake must show on a public case (else propose a case in
``specs/proposed.py``) and be told apart from the exercise's other entries.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Callable

from ..book import anchor  # noqa: F401 - where a label is (re-exported)
from ..registry import CHAPTERS


@dataclass(frozen=True)
class Mistake:
    """One wrong implementation of one exercise, and what to tell its author."""

    exercise: str
    """The exercise id, "2.1"."""
    key: str
    """A stable id, unique within the exercise: "missing-scale"."""
    message: str
    """Fixed text in the second person: the mistake and its consequence."""
    label: str
    """The book label that explains the right formula: "eq-attention-scores"."""
    wrong: Callable
    """The wrong implementation, with the exercise function's signature."""

    @property
    def chapter(self) -> int:
        return int(self.label_chapter or self.exercise.split(".")[0])

    @property
    def label_chapter(self) -> int:
        return _label_chapter(self.label)

    @property
    def section(self) -> str:
        """The book anchor of :attr:`label`: ``chapters/02_attention.html#equation-eq-attention-scores``."""
        return anchor(self.label, self.chapter)


def _label_chapter(label: str) -> int:
    """The chapter a label lives in, from its second word (eq-attention-... is chapter 2); 0 if unknown."""
    parts = label.split("-")
    return _LABEL_CHAPTER.get(parts[1], 0) if len(parts) > 1 else 0


_LABEL_CHAPTER = {"foundations": 1, "attention": 2, "statmech": 3, "geometry": 4, "gradients": 5,
                  "multihead": 6, "variants": 7, "hopfield": 8, "efficient": 9, "wx": 10}


def mistake(exercise: str, key: str, label: str, message: str) -> Callable[[Callable], Callable]:
    """Decorator: record the decorated wrong implementation in its module's ``MISTAKES``."""

    def register(fn: Callable) -> Callable:
        module = importlib.import_module(fn.__module__)
        module.__dict__.setdefault("MISTAKES", []).append(Mistake(exercise, key, message, label, fn))
        return fn

    return register


def also(exercise: str, entry: Mistake) -> Mistake:
    """The same mistake for another exercise that grades the same function (10.1 and 2.4)."""
    return dataclasses.replace(entry, exercise=exercise)


def catalogue() -> list[Mistake]:
    """Every entry, in course order (chapter modules ``ch01`` ... ``ch10``)."""
    out: list[Mistake] = []
    for ch in CHAPTERS:
        try:
            mod = importlib.import_module(f"{__name__}.ch{ch:02d}")
        except ModuleNotFoundError as err:
            if err.name == f"{__name__}.ch{ch:02d}":
                continue
            raise
        out.extend(mod.MISTAKES)
    seen: set[tuple[str, str]] = set()
    for m in out:
        if (m.exercise, m.key) in seen:
            raise ValueError(f"mistake {m.key!r} of exercise {m.exercise} is defined twice")
        seen.add((m.exercise, m.key))
    return out


def for_exercise(ex_id: str) -> list[Mistake]:
    """The entries of one exercise, in catalogue order."""
    return [m for m in catalogue() if m.exercise == ex_id]
