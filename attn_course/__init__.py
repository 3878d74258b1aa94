"""attn_course: the course tooling around ``attn_tensors``.

Turns the instructor's source (the reference library with its solution regions
marked, and the exercise specifications in :mod:`attn_course.specs`) into what
students receive, and checks and grades their work:

=====================  =========================================================
module                 what it does
=====================  =========================================================
``regions``            find ``### BEGIN SOLUTION`` regions; write the stubs
``registry``           the graded exercises: id, function, points, cases
``specs``              one module per chapter: each exercise's cases and probe
``values``             arrays <-> JSON (no pickle, inf and nan kept)
``worker``             runs submitted code on inputs; returns plain arrays
``runner``             the trusted side: starts workers, compares, scores
``release``            writes ``exercises/`` and ``solutions/`` (and checks them)
``notebooks``          the nbgrader notebooks, one per chapter
``workspace``          a student's workspace and submission archive
``cli``                the ``attn-course`` command
=====================  =========================================================

The mathematics lives in ``attn_tensors``; nothing here computes attention.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (the course is used from a clone)."""

PACKAGED_RELEASE = Path(__file__).resolve().parent / "release_data"
"""The release inside the students' wheel (``attn-course student-dist``); absent in a clone."""

LIBRARY = ROOT / "attn_tensors"
SOLUTIONS = ROOT / "solutions"
EXERCISES = PACKAGED_RELEASE if PACKAGED_RELEASE.is_dir() else ROOT / "exercises"
RELEASE_LIBRARY = EXERCISES / "library"
