"""The graded exercises of the course, one :class:`Exercise` each.

The specifications live in :mod:`attn_course.specs`, one module per chapter
(``specs/ch03.py`` holds exercises 3.1-3.5).  Each names the library function
the student implements, the exercise whose solution region it needs, its
points, and a generator of cases: small public cases (their inputs and the
reference outputs go to students as data) and hidden ones, drawn at grading
time from the instructor's secret seed, which never leave the instructor.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

CHAPTERS = {
    1: ("01_foundations", "Foundations"),
    2: ("02_attention", "The Attention Mechanism"),
    3: ("03_statistical_mechanics", "Statistical Mechanics"),
    4: ("04_differential_geometry", "Differential Geometry"),
    5: ("05_gradients", "Gradient Derivations"),
    6: ("06_multihead", "Multi-Head Attention"),
    7: ("07_variants", "Attention Variants"),
    8: ("08_hopfield", "Hopfield Networks"),
    9: ("09_efficient_attention", "Efficient Attention"),
    10: ("10_worked_examples", "Worked Examples"),
}


@dataclass(frozen=True)
class Case:
    """One call: keyword inputs (NumPy arrays, numbers, bools, None)."""

    name: str
    inputs: dict[str, Any]
    note: str = ""  # what the case checks, shown when it fails
    # Run op by op, never compiled: the check this case tests is on a value computed
    # from the inputs (a zero length), which JAX's jit sees only as a tracer and skips.
    eager: bool = False


Probe = Callable[..., Any]


def call(fn: Callable, **inputs: Any) -> Any:
    """The default probe: the function's value on the inputs."""
    return fn(**inputs)


@dataclass(frozen=True)
class Exercise:
    id: str  # "3.1"
    title: str
    function: str  # "statmech.log_partition_function": what the cases call
    cases: Callable[[np.random.Generator, bool], list[Case]]  # (rng, hidden)
    points: int = 2
    region: str = ""  # the exercise whose solution region this needs ("" = id)
    probe: Probe = call  # probe(fn, **inputs) -> array, tuple or dict of arrays
    rtol: float = 1e-9
    atol: float = 1e-12
    hint: str = ""
    tol_mlx: tuple[float, float] | None = None  # least (rtol, atol) on MLX (default: scoring.MLX_TOLERANCE)
    # On JAX the job only traces the function, and a process that never ran the submission
    # differentiates and runs what it traced (attn_course.replay); False: the probe runs in the job
    # (an exercise whose probe takes no derivative with JAX and watches each call as it is made)
    traced: bool = True

    @property
    def chapter(self) -> int:
        return int(self.id.split(".")[0])

    @property
    def label(self) -> str:
        return "ex-" + self.id.replace(".", "-")

    @property
    def marker(self) -> str:
        return "ex" + self.id.replace(".", "_")

    @property
    def owner(self) -> str:
        return self.region or self.id

    @property
    def module(self) -> str:
        return self.function.rsplit(".", 1)[0]

    @property
    def name(self) -> str:
        return self.function.rsplit(".", 1)[1]

    @property
    def book_page(self) -> str:
        return f"chapters/{CHAPTERS[self.chapter][0]}.html#{self.label}"

    def make_cases(self, hidden: bool = False, secret: str = "") -> list[Case]:
        """The public cases (fixed) or the hidden ones (from the secret)."""
        tag = f"{secret}/hidden/{self.id}" if hidden else f"public/{self.id}"
        seed = int.from_bytes(hashlib.sha256(tag.encode()).digest()[:8], "little")
        return self.cases(np.random.default_rng(seed), hidden)


def _sort_key(ex_id: str) -> tuple[int, int]:
    a, b = ex_id.split(".")
    return int(a), int(b)


def all_exercises() -> dict[str, Exercise]:
    """Every exercise, by id, in course order."""
    found: dict[str, Exercise] = {}
    for ch in CHAPTERS:
        try:
            mod = importlib.import_module(f"attn_course.specs.ch{ch:02d}")
        except ModuleNotFoundError as err:
            if err.name == f"attn_course.specs.ch{ch:02d}":
                continue
            raise
        for ex in mod.EXERCISES:
            if ex.id in found:
                raise ValueError(f"exercise {ex.id} is defined twice")
            if ex.chapter != ch:
                raise ValueError(f"exercise {ex.id} is in specs/ch{ch:02d}.py")
            found[ex.id] = ex
    return dict(sorted(found.items(), key=lambda kv: _sort_key(kv[0])))


def select(spec: str, exercises: dict[str, Exercise] | None = None) -> list[Exercise]:
    """Exercises named by ``3.1``, a chapter ``3`` / ``ch03``, or ``all``.

    An empty name is refused, not taken as ``all``: ``check "$EX"`` with ``EX``
    unset, or ``grade --exercises ""``, would otherwise run every exercise
    without a word.
    """
    exercises = exercises or all_exercises()
    spec = spec.strip().lower()
    if not spec:
        raise KeyError("no exercise named (an empty name): give 3.1, a chapter (3 or ch03), or all")
    if spec in ("all", "*"):
        return list(exercises.values())
    if spec in exercises:
        return [exercises[spec]]
    ch = spec[2:] if spec.startswith("ch") else spec
    if ch.isdigit() and int(ch) in CHAPTERS:
        chosen = [e for e in exercises.values() if e.chapter == int(ch)]
        if chosen:
            return chosen
    known = ", ".join(exercises)
    raise KeyError(f"no exercise or chapter {spec!r}; known exercises: {known}")


def secret(allow_ci: bool = False) -> str:
    """The instructor's secret for hidden cases and tokens (ATTN_COURSE_SECRET).

    The course code is public, so a default secret would let anyone compute
    the hidden cases: without ATTN_COURSE_SECRET this refuses
    (:class:`attn_course.identity.SecretMissing`), unless the caller asks by
    name for the CI default (tests, two-sided validation).
    """
    from .identity import course_secret

    return course_secret(allow_ci)
