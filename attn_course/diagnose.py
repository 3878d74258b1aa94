"""Name the mistake behind a wrong answer.

:func:`diagnose` takes an exercise, one case, the student's probe output on
it and the reference output, and says what went wrong:

1. a catalogue entry (:mod:`attn_course.mistakes`) whose wrong
   implementation, run through the exercise's probe on the same inputs,
   reproduces the answer: all of it, or its forward values (a mistake in
   the value explains the gradient that follows from it); where only the
   gradients are wrong, an entry that reproduces those;
2. otherwise a generic diagnosis of the first wrong output, forward values
   before gradients: wrong shape, wrong dtype, nan or inf where the answer
   is finite, transposed, off by a constant factor (sign flipped), rows
   that do not sum to one; for a gradient with right values, that only
   the gradient differs.

A message is fixed text (the catalogue's, or one written here) with at most
the names of the probe's outputs, shapes, dtypes and a factor rounded to a
small integer or its square root, or to a class ("between 2 and 10 times");
it never shows a value of the case, so diagnoses of hidden cases reveal no
hidden number.

The catalogue (:mod:`attn_course.mistakes`) is trusted-side code: it runs the
reference library, and it never goes to students.  A student's check names
mistakes all the same, from data the release ships with each public case:
the entries' fixed words (:class:`Known`) and their outputs on that case
(:func:`known_mistakes`, :func:`wrong_outputs`); given those, this module
never imports the catalogue.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

import numpy as np

from . import values
from .book import anchor
from .registry import Case, Exercise


__all__ = ["Diagnosis", "Kind", "Known", "diagnose", "known_mistakes", "wrong_outputs"]


class Kind(str, Enum):
    """Where a diagnosis comes from."""

    CATALOGUE = "catalogue"  # a known mistake of this exercise, reproduced on the case
    GENERIC = "generic"  # a symptom that holds for any exercise (factor, transpose, nan...)


@dataclass(frozen=True)
class Diagnosis:
    """What is wrong with one answer, and where the book explains it."""

    kind: Kind
    """Catalogue entry or generic symptom."""
    key: str
    """The catalogue entry's key, or the symptom: "shape", "dtype", "nan", "inf",
    "transposed", "factor", "sign", "rows", "gradient"."""
    message: str
    """Fixed text for the student (no value of the case in it)."""
    section: str
    """The book anchor that explains it: ``chapters/02_attention.html#...``."""
    field: str = ""
    """The probe output it is about ("A", "d/dS"): the first that differs."""
    fixed: str = ""
    """The message in words that hold nothing the answer chose (no shape, dtype or factor of
    it), for a hidden case: a submission that sees a hidden case's inputs could otherwise write
    them into its answer's shape or scale and read them back in its feedback.  Empty: the
    message itself is such words (the catalogue's, and most symptoms')."""

    def text(self, book: str = "", hidden: bool = False) -> str:
        """The message (``hidden``: its fixed words) and where to read more: ``book`` is the
        book's base address, if any."""
        where = f"{book.rstrip('/')}/{self.section}" if book else self.section
        return f"{(self.fixed or self.message) if hidden else self.message} (see {where})"


# -- reading outputs --------------------------------------------------------------


def _fields(result: Any) -> dict[str, np.ndarray] | None:
    """Named arrays from a probe output: a worker result, or its ``value`` dict."""
    if isinstance(result, Mapping) and "status" in result:
        if result.get("status") != "ok":
            return None
        result = result.get("value")
    if not isinstance(result, Mapping):
        return None
    return {str(k): np.asarray(v) for k, v in result.items()}


def is_gradient(field: str) -> bool:
    """Outputs that the probe computes by autodiff ("d/dS", "dE/dxi"), after the values."""
    return field.startswith("d/d") or field.startswith("dE/d")


def _float(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def close(got: np.ndarray, exp: np.ndarray, rtol: float, atol: float) -> bool:
    """Same shape and dtype kind, nan and inf in the same places, finite entries allclose."""
    with np.errstate(all="ignore"):
        return _close(got, exp, rtol, atol)


def _close(got: np.ndarray, exp: np.ndarray, rtol: float, atol: float) -> bool:
    got, exp = np.asarray(got), np.asarray(exp)
    if got.shape != exp.shape:
        return False
    if (got.dtype.kind == "b") != (exp.dtype.kind == "b"):
        return False
    if got.dtype.kind == "b":
        return bool(np.array_equal(got, exp))
    g, e = _float(got), _float(exp)
    if not np.array_equal(np.isnan(g), np.isnan(e)):
        return False
    inf = np.isinf(g) | np.isinf(e)
    if not np.array_equal(g[inf], e[inf]):
        return False
    fin = np.isfinite(g) & np.isfinite(e)
    return bool(np.allclose(g[fin], e[fin], rtol=rtol, atol=atol))


def _match_tolerance(ex: Exercise, exp: np.ndarray) -> tuple[float, float]:
    """Tolerance for "this answer reproduces that mistake": looser than grading's, since the
    student computes the same wrong formula in another order; scaled by the answer's size."""
    e = _float(np.asarray(exp)) if np.asarray(exp).dtype.kind != "b" else np.zeros(1)
    fin = e[np.isfinite(e)]
    size = float(np.max(np.abs(fin))) if fin.size else 0.0
    return max(10 * ex.rtol, 1e-7), max(10 * ex.atol, 1e-9 * size)


# -- the catalogue on one case ------------------------------------------------------

_CACHE: dict[tuple[str, str], dict[str, dict[str, np.ndarray] | None]] = {}
_CACHE_SIZE = 4096


def case_key(case: Case) -> str:
    """A digest of the case's inputs (a hidden and a public case may share a name)."""
    text = case.name + "\0" + values.dumps(case.inputs)
    return hashlib.sha256(text.encode()).hexdigest()


_CLASS_CASES: dict[str, list[Case]] = {}  # an exercise's cases in a grader's class, not yet run
_LOCK = threading.Lock()


def expect_cases(ex: Exercise, cases: list[Case]) -> None:
    """A grader's class will be diagnosed on ``cases``: the first diagnosis of the exercise runs the
    catalogue on all of them at once (:func:`precompute`), and an exercise nobody gets wrong costs
    nothing.  Nothing runs here."""
    with _LOCK:
        _CLASS_CASES.setdefault(ex.id, []).extend(cases)


def wrong_outputs(ex: Exercise, case: Case) -> dict[str, dict[str, np.ndarray] | None]:
    """Each catalogue entry's probe output on the case (None where the wrong code raised).

    Computed once per (exercise, case) on the trusted side and cached (see
    :func:`precompute`), together with the exercise's other cases a grader
    announced (:func:`expect_cases`); the outputs pass through the same JSON
    encoding as a worker's.
    """
    with _LOCK:  # grading threads: one computes, the others find it done
        key = (ex.id, case_key(case))
        if key in _CACHE:
            return _CACHE[key]
        others = [c for c in _CLASS_CASES.pop(ex.id, []) if case_key(c) != key[1]]
        return precompute(ex, [case] + others)[0]


def precompute(ex: Exercise, cases: list[Case]) -> list[dict[str, dict[str, np.ndarray] | None]]:
    """:func:`wrong_outputs` of each case, cached: the entries run as one program each over the
    cases not yet cached.

    One program per entry over many cases costs much less than one per
    case (see :func:`expect_cases`).  The outputs are what :func:`wrong_outputs`
    computes case by case (the worker's :func:`~attn_course.worker.evaluate_all`
    runs each case as :func:`~attn_course.worker.evaluate` does).
    """
    import jax

    jax.config.update("jax_enable_x64", True)
    from .mistakes import for_exercise
    from .worker import evaluate_all

    from . import result_cache

    keys = [(ex.id, case_key(c)) for c in cases]
    found = {k: _CACHE[k] for k in keys if k in _CACHE}
    todo = [(k, c) for k, c in zip(keys, cases) if k not in found]
    if todo:
        entries = for_exercise(ex.id)
        inputs, eager = [c.inputs for _, c in todo], [c.eager for _, c in todo]

        def compute() -> list:  # each entry's outputs, encoded as a worker's
            return [[values.encode(r) for r in evaluate_all(m.wrong, ex.probe, inputs, eager=eager)]
                    for m in entries]

        parts = [ex.id, [m.key for m in entries], result_cache.cases_digest(c for _, c in todo)]
        outputs = result_cache.cached("catalogue", parts, compute)
        for k, _ in todo:
            found[k] = {}
        for m, raw in zip(entries, outputs):
            for (k, _), r in zip(todo, raw):
                found[k][m.key] = _fields(values.decode(r))
        if len(_CACHE) + len(todo) > _CACHE_SIZE:
            _CACHE.clear()
        _CACHE.update((k, found[k]) for k, _ in todo)
    return [found[k] for k in keys]


def catalogue_outputs(ex: Exercise, cases: list[Case], expected: list[Any]) -> list[dict[str, dict[str, np.ndarray]]]:
    """For each case, the catalogue entries' probe outputs that a diagnosis can use, by key.

    What the release ships with the public cases (trusted side: runs the
    catalogue).  Each entry runs as one program over the cases (as a worker
    runs an answer); left out are the cases where the reference raises, the
    entries that raise, and outputs that equal the reference's (they name no
    mistake on that case).
    """
    import jax

    jax.config.update("jax_enable_x64", True)
    from .mistakes import for_exercise
    from .worker import evaluate_all

    from . import result_cache

    exp = [_fields(e) for e in expected]
    live = [i for i, e in enumerate(exp) if e is not None]
    out: list[dict[str, dict[str, np.ndarray]]] = [{} for _ in cases]
    entries = for_exercise(ex.id)

    def compute() -> list:  # each entry's outputs on the live cases, encoded as a worker's
        return [[values.encode(r) for r in evaluate_all(m.wrong, ex.probe, [cases[i].inputs for i in live])]
                for m in entries]

    parts = [ex.id, [m.key for m in entries], result_cache.cases_digest(cases[i] for i in live)]
    for m, raw in zip(entries, result_cache.cached("catalogue-release", parts, compute)):
        for i, r in zip(live, raw):
            w = _fields(values.decode(r))
            if w is None or set(w) != set(exp[i]):
                continue
            if all(close(w[k], exp[i][k], *_match_tolerance(ex, exp[i][k])) for k in w):
                continue
            out[i][m.key] = w
    return out


def _reproduces(ex: Exercise, got: dict, wrong: dict | None, exp: dict, fields: list[str]) -> bool:
    """``got`` equals the entry's output on ``fields``, where that output is not the answer's.

    The second condition keeps an entry that happens to be right on this
    case (or nearly, within the looser matching tolerance) from naming an
    answer that is only slightly off.
    """
    if wrong is None or set(wrong) != set(got):
        return False
    tol = {k: _match_tolerance(ex, exp[k]) for k in fields}
    return (all(close(got[k], wrong[k], *tol[k]) for k in fields)
            and any(not close(wrong[k], exp[k], *tol[k]) for k in fields))


@dataclass(frozen=True)
class Known:
    """A catalogue entry as the release ships it: its words, not its code."""

    key: str
    """The entry's key within its exercise ("missing-scale")."""
    message: str
    """Its fixed text for the student."""
    section: str
    """The book anchor that explains it."""

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "message": self.message, "section": self.section}

    @classmethod
    def from_dict(cls, d: Any) -> "Known":
        if not isinstance(d, Mapping) or not all(isinstance(d.get(k), str) for k in ("key", "message", "section")):
            raise ValueError("a known mistake needs key, message and section (text)")
        return cls(d["key"], d["message"], d["section"])


def known_mistakes(ex: Exercise) -> list[Known]:
    """The catalogue's entries of an exercise, as words (trusted side: imports the catalogue)."""
    from .mistakes import for_exercise

    return [Known(m.key, m.message, m.section) for m in for_exercise(ex.id)]


def _from_catalogue(m: Known, field: str) -> Diagnosis:
    return Diagnosis(Kind.CATALOGUE, m.key, m.message, m.section, field)


# -- generic symptoms ------------------------------------------------------------------

_SECTIONS = {
    "rows": ("eq-attention-softmax", 2),
    "nan": ("lem-attention-stable", 2),
    "inf": ("lem-attention-stable", 2),
}


def _generic(ex: Exercise, key: str, message: str, field: str, fixed: str = "") -> Diagnosis:
    label = _SECTIONS.get(key)
    section = anchor(*label) if label else ex.book_page
    return Diagnosis(Kind.GENERIC, key, message, section, field, fixed)


def _name(field: str) -> str:
    return "your result" if field == "value" else f"your {field}"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def nice_factor(r: float, rel_tol: float = 1e-6) -> str | None:
    """``r`` (> 0) as ``n`` or ``√n`` for n = 2..64, or None if it is neither."""
    for n in range(2, 65):
        if math.isclose(r, n, rel_tol=rel_tol):
            return str(n)
        root = math.isqrt(n)
        if root * root != n and math.isclose(r, math.sqrt(n), rel_tol=rel_tol):
            return f"√{n}"
    return None


def describe_factor(r: float, rel_tol: float = 1e-6) -> str:
    """ "3 times too large", "√8 times too small", "between 2 and 10 times too large"."""
    big = abs(r) >= 1
    x = abs(r) if big else 1 / abs(r)
    side = "too large" if big else "too small"
    exact = nice_factor(x, rel_tol)
    if exact:
        return f"{exact} times {side}"
    for lo, hi in ((1, 2), (2, 10), (10, 100)):
        if x < hi:
            return f"between {lo} and {hi} times {side}"
    return f"more than 100 times {side}"


def _loose(ex: Exercise) -> float:
    """Relative slack for the generic symptoms (a factor, a sign, rows summing to 1): tight on
    JAX's float64, as loose as the backend's own tolerance allows on MLX or float32."""
    return max(1e-7, 10 * ex.rtol)


def _factor(g: np.ndarray, e: np.ndarray, rtol: float = 1e-7) -> float | None:
    """c with g = c e on every entry (None if there is no such constant, or c = 1)."""
    if not (np.isfinite(g).all() and np.isfinite(e).all()):
        fin = np.isfinite(e)
        if not np.array_equal(fin, np.isfinite(g)):
            return None
        g, e = g[fin], e[fin]
    ee = float(np.sum(e * e))
    if e.size == 0 or ee == 0.0:
        return None
    c = float(np.sum(g * e)) / ee
    if c == 0.0 or math.isclose(c, 1.0, rel_tol=max(1e-6, rtol)):
        return None
    if not np.allclose(g, c * e, rtol=rtol, atol=max(1e-9, rtol / 100) * float(np.max(np.abs(e)))):
        return None
    return c


def _symptom(ex: Exercise, field: str, g0: np.ndarray, e0: np.ndarray) -> Diagnosis | None:
    """The generic diagnosis of one wrong output, or None."""
    with np.errstate(all="ignore"):
        return _symptom_of(ex, field, g0, e0)


def _symptom_of(ex: Exercise, field: str, g0: np.ndarray, e0: np.ndarray) -> Diagnosis | None:
    name = _name(field)
    if g0.shape != e0.shape:
        if g0.ndim >= 2 and g0.shape == e0.shape[:-2] + e0.shape[-2:][::-1] and g0.dtype.kind == e0.dtype.kind:
            if close(np.swapaxes(g0, -1, -2), e0, *_match_tolerance(ex, e0)):
                return _generic(ex, "transposed", f"{_cap(name)} is transposed: its last two "
                                "axes are swapped (check which index each axis holds)", field)
        return _generic(ex, "shape", f"{_cap(name)} has shape {tuple(g0.shape)}, expected "
                        f"{tuple(e0.shape)}: check which axes you contract and which you keep", field,
                        f"{_cap(name)} has the wrong shape: check which axes you contract and which you keep")
    if g0.dtype != e0.dtype:
        return _generic(ex, "dtype", f"{_cap(name)} has dtype {g0.dtype}, expected {e0.dtype}",
                        field, f"{_cap(name)} has the wrong dtype")
    if g0.dtype.kind == "b":
        return None
    g, e = _float(g0), _float(e0)
    if (np.isnan(g) & ~np.isnan(e)).any():
        return _generic(ex, "nan", f"{_cap(name)} contains nan where the answer is a number: "
                        "look for 0/0, inf - inf or log 0 (a fully masked row, a zero weight) and for "
                        "exp overflowing; guard them with a 'double where'", field)
    if (np.isinf(g) & np.isfinite(e)).any():
        return _generic(ex, "inf", f"{_cap(name)} is infinite where the answer is finite: exp "
                        "overflows (subtract the maximum first) or something is divided by 0", field)
    if g.ndim >= 2 and g.shape[-1] == g.shape[-2] and close(np.swapaxes(g, -1, -2), e, *_match_tolerance(ex, e)):
        return _generic(ex, "transposed", f"{_cap(name)} is transposed: its last two axes are "
                        "swapped (check which index each axis holds)", field)
    c = _factor(g, e, _loose(ex))
    if c is not None:
        if math.isclose(c, -1.0, rel_tol=_loose(ex)):
            return _generic(ex, "sign", f"{_cap(name)} has the wrong sign everywhere: a sign is "
                            "flipped", field)
        flip = " and has the wrong sign" if c < 0 else ""
        why = ("the right values times a constant (a scale, a temperature or a normalisation is missing "
               "or applied twice)")
        return _generic(ex, "factor", f"{_cap(name)} is {describe_factor(c, max(1e-6, _loose(ex)))}{flip}: {why}",
                        field, f"{_cap(name)} is {why}")
    if e.ndim >= 1 and e.shape[-1] > 1 and np.isfinite(e).all() and (e >= 0).all():
        rows = e.sum(axis=-1)
        one = np.isclose(rows, 1.0, rtol=1e-9, atol=1e-12)
        zero = np.isclose(rows, 0.0, atol=1e-12)
        if (one | zero).all() and one.any():
            got_rows = g.sum(axis=-1)
            if not np.allclose(got_rows[one], 1.0, rtol=_loose(ex), atol=1e-9):
                return _generic(ex, "rows", f"The rows of {name} do not sum to 1 (the answer's do): "
                                "normalise over the last axis, the keys j", field)
    return None


# -- the diagnosis ---------------------------------------------------------------------------


def diagnose(ex: Exercise, case: Case, got: Any, expected: Any,
             wrong: Mapping[str, Any] | None = None,
             entries: list[Known] | None = None) -> Diagnosis | None:
    """What is wrong with ``got`` (the student's probe output on ``case``), or None.

    ``got`` and ``expected`` are decoded probe outputs (dicts of named arrays,
    or worker results ``{"status": "ok", "value": {...}}``).  None when
    ``got`` is right (within the exercise's tolerance), when either is not a
    value (an exception), or when nothing is recognised.  ``wrong``, if
    given, holds the catalogue's outputs on this case by key (precomputed,
    e.g. shipped with public cases); otherwise they are computed here.
    ``entries``, if given, are the exercise's entries as words (shipped with
    the public cases); otherwise they are read from the catalogue.  Given
    both, the catalogue is not imported.
    """
    g, e = _fields(got), _fields(expected)
    if g is None or e is None or set(g) != set(e):
        return None
    order = [k for k in e if not is_gradient(k)] + [k for k in e if is_gradient(k)]
    bad = [k for k in order if not close(g[k], e[k], ex.rtol, ex.atol)]
    if not bad:
        return None
    value_fields = [k for k in order if not is_gradient(k)]
    bad_values = [k for k in bad if not is_gradient(k)]
    if entries is None:
        entries = known_mistakes(ex)
    outs = {k: _fields(v) for k, v in wrong.items()} if wrong is not None else wrong_outputs(ex, case)
    # 1. an entry that reproduces the whole answer
    for m in entries:
        if _reproduces(ex, g, outs.get(m.key), e, order):
            return _from_catalogue(m, bad[0])
    # 2. a wrong value: an entry that reproduces the values (the gradients may differ)
    if bad_values:
        for m in entries:
            if _reproduces(ex, g, outs.get(m.key), e, value_fields):
                return _from_catalogue(m, bad[0])
    # 3. right values, wrong gradients: an entry with right values and these gradients
    else:
        for m in entries:
            w = outs.get(m.key)
            if w is None or set(w) != set(e):
                continue
            values_right = all(close(w[k], e[k], ex.rtol, ex.atol) for k in value_fields)
            if values_right and _reproduces(ex, g, w, e, bad):
                return _from_catalogue(m, bad[0])
    # 4. the generic symptom of the first wrong output (values first)
    field = bad[0]
    found = _symptom(ex, field, g[field], e[field])
    if not bad_values:
        def lower(text: str) -> str:
            return text[0].lower() + text[1:]

        unsafe = ("check the operations that autodiff cannot see through safely (a where with "
                  "nan in its other branch, a max without stop_gradient, a Python branch on a value)")
        what, fixed = (lower(found.message), lower(found.fixed or found.message)) if found else (unsafe, unsafe)
        right = f"Your values are right, but the gradient {field} is not: "
        return _generic(ex, "gradient" if found is None else found.key, right + what, field,
                        right + fixed if fixed != what else "")
    return found


def explain(ex: Exercise, case: Case, got: Any, expected: Any,
            wrong: Mapping[str, Any] | None = None, entries: list[Known] | None = None) -> Diagnosis | None:
    """:func:`diagnose` for the scoring's ``diagnose`` callback: None when nothing is recognised,
    and never raises.

    ``wrong`` and ``entries`` as in :func:`diagnose` (a student's check passes both).  The
    scoring writes the diagnosis's text into the feedback and keeps the key of a catalogue
    entry apart (:attr:`attn_course.scoring.CaseResult.mistake`), so that the class report
    counts mistakes from that key, never from words that a submission could write too.
    """
    try:
        return diagnose(ex, case, got, expected, wrong, entries)
    except Exception:  # noqa: BLE001 - a diagnosis is a bonus: the verdict stands without it
        return None
