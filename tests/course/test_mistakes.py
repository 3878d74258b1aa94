"""The mistake catalogue and the diagnosis of wrong answers.

Every exercise has at least two catalogued mistakes; each is seen on the
public cases (its wrong output differs from the reference's) and recognised
by name when an answer reproduces it; the reference is never diagnosed; no
entry passes for another; generic diagnoses hold on made-up answers; and no
diagnosis of a hidden case shows a number drawn from the case.

Outputs are computed once per exercise (reference and every wrong
implementation, through the worker's own evaluate path) and shared by the
tests of that exercise, which are marked ``ex3_1`` and ``ch03`` as in
test_two_sided.py, so ``pytest -m ex5_2`` checks one exercise.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from attn_course import diagnose as dg
from attn_course.diagnose import Diagnosis, Kind, diagnose, wrong_outputs
from attn_course.mistakes import catalogue, for_exercise
from attn_course.registry import CHAPTERS, Case, Exercise, all_exercises
from attn_course.runner import reference_results as _reference_outcomes
from attn_course.specs.proposed import PROPOSED

ROOT = Path(__file__).resolve().parents[2]
EXERCISES = all_exercises()
_public: dict[str, tuple[list[Case], list[dict]]] = {}


def reference_results(ex: Exercise, cases: list[Case]) -> list[dict]:
    """The reference's outcomes as the worker reports them (plain dicts)."""
    return [{"status": o.status, "value": o.value, "type": o.type} for o in _reference_outcomes(ex, cases)]


def public(ex_id: str) -> tuple[list[Case], list[dict]]:
    """The public cases (and any proposed ones) of an exercise, with the reference's outputs."""
    if ex_id not in _public:
        ex = EXERCISES[ex_id]
        cases = ex.make_cases()
        if ex_id in PROPOSED:
            cases = cases + PROPOSED[ex_id](np.random.default_rng(0), False)
        _public[ex_id] = (cases, reference_results(ex, cases))
    return _public[ex_id]


def _params():
    return [pytest.param(e.id, id=e.id, marks=[getattr(pytest.mark, e.marker),
                                               getattr(pytest.mark, f"ch{e.chapter:02d}")])
            for e in EXERCISES.values()]


def _value(result: dict) -> dict | None:
    return result["value"] if result.get("status") == "ok" else None


# -- (a) the catalogue itself -----------------------------------------------------------


def test_every_exercise_has_two_mistakes():
    entries = catalogue()
    assert {m.exercise for m in entries} <= set(EXERCISES), "an entry names an unknown exercise"
    few = {e: len(for_exercise(e)) for e in EXERCISES if len(for_exercise(e)) < 2}
    assert not few, f"exercises with fewer than two catalogued mistakes: {few}"


def _labels(chapter: int) -> set[str]:
    text = (ROOT / "chapters" / f"{CHAPTERS[chapter][0]}.md").read_text()
    return (set(re.findall(r"^:label:\s*(\S+)", text, re.M))
            | set(re.findall(r"^\(([\w-]+)\)=", text, re.M))
            | set(re.findall(r"\$\$\s*\(([\w-]+)\)", text)))


def test_sections_are_labels_of_the_book():
    labels = {ch: _labels(ch) for ch in CHAPTERS}
    missing = [(m.exercise, m.key, m.label) for m in catalogue() if m.label not in labels[m.chapter]]
    assert not missing, f"labels not found in their chapter's source: {missing}"
    for m in catalogue():
        page, target = m.section.split("#")
        assert page == f"chapters/{CHAPTERS[m.chapter][0]}.html"
        assert target == (f"equation-{m.label}" if m.label.startswith("eq-") else m.label)
    for label, ch in dg._SECTIONS.values():
        assert label in labels[ch]


def test_messages_are_fixed_second_person_text():
    for m in catalogue():
        assert re.search(r"\b[Yy]ou(r)?\b", m.message), (m.exercise, m.key)
        assert m.message.strip() == m.message and m.message.endswith((".", ")")), (m.exercise, m.key)
        assert re.fullmatch(r"[A-Za-z0-9]+(-[A-Za-z0-9_]+)*", m.key), m.key


# -- (b), (c), (d) every entry on the public cases ---------------------------------------------


@pytest.mark.parametrize("exercise", _params())
def test_each_mistake_is_seen_and_named(exercise):
    ex = EXERCISES[exercise]
    cases, refs = public(exercise)
    for m in for_exercise(exercise):
        seen, named = False, []
        for case, ref in zip(cases, refs):
            expected = _value(ref)
            if expected is None:  # a case that must raise: no value to diagnose
                continue
            wrong = wrong_outputs(ex, case)[m.key]
            if wrong is None:
                continue
            if not all(dg.close(wrong[k], expected[k], ex.rtol, ex.atol) for k in expected):
                seen = True
            d = diagnose(ex, case, wrong, expected)
            if d is not None and d.key == m.key:
                assert d == Diagnosis(Kind.CATALOGUE, m.key, m.message, m.section, d.field)
                named.append(case.name)
            if seen and named:
                break  # the later cases cost compilations and show nothing new
        assert seen, f"{exercise} {m.key}: the wrong implementation matches the reference on every case"
        assert named, f"{exercise} {m.key}: never diagnosed by name on its own output"


@pytest.mark.parametrize("exercise", _params())
def test_the_reference_is_never_diagnosed(exercise):
    ex = EXERCISES[exercise]
    cases, refs = public(exercise)
    assert any(_value(r) is not None for r in refs)
    for case, ref in zip(cases, refs):
        assert diagnose(ex, case, ref, ref) is None
        if _value(ref) is not None:
            assert diagnose(ex, case, _value(ref), _value(ref)) is None


@pytest.mark.parametrize("exercise", _params())
def test_no_mistake_passes_for_another(exercise):
    """Where an entry is first named, no other entry of the exercise gives the same output."""
    ex = EXERCISES[exercise]
    cases, refs = public(exercise)
    entries = for_exercise(exercise)
    for m in entries:
        for case, ref in zip(cases, refs):
            expected = _value(ref)
            if expected is None:
                continue
            outs = wrong_outputs(ex, case)
            if outs[m.key] is None:
                continue
            d = diagnose(ex, case, outs[m.key], expected)
            if d is None or d.key != m.key:
                continue
            twins = [o.key for o in entries if o.key != m.key and outs[o.key] is not None
                     and set(outs[o.key]) == set(expected)
                     and all(dg.close(outs[m.key][k], outs[o.key][k], *dg._match_tolerance(ex, expected[k]))
                             for k in expected)]
            assert not twins, f"{exercise} {m.key} on {case.name!r} is also {twins}"
            break


# -- (e) generic diagnoses on made-up answers ---------------------------------------------------


def _plain(name: str = "value") -> Exercise:
    """An exercise with no catalogue (2.99 does not exist), graded at the usual tolerance."""
    return Exercise("2.99", "made up", "attention.attention_scores", lambda rng, hidden: [])


CASE = Case("made up", {"S": np.zeros(1)})
RNG = np.random.default_rng(12)
E = RNG.standard_normal((2, 3, 4))
SQUARE = RNG.standard_normal((3, 4, 4))


def _generic(got, expected, ex=None):
    return diagnose(ex or _plain(), CASE, got, expected)


@pytest.mark.parametrize("factor, words", [
    (np.sqrt(8.0), "√8 times too large"),
    (3.0, "3 times too large"),
    (1 / np.sqrt(2.0), "√2 times too small"),
    (3.7, "between 2 and 10 times too large"),
    (1.3, "between 1 and 2 times too large"),
    (1 / 37.3, "between 10 and 100 times too small"),
    (512.5, "more than 100 times too large"),
])
def test_constant_factor(factor, words):
    d = _generic({"value": factor * E}, {"value": E})
    assert (d.kind, d.key, d.field) == (Kind.GENERIC, "factor", "value")
    assert words in d.message


def test_sign_flipped_and_negative_factor():
    assert _generic({"value": -E}, {"value": E}).key == "sign"
    d = _generic({"value": -2.0 * E}, {"value": E})
    assert d.key == "factor" and "2 times too large and has the wrong sign" in d.message


def test_transposed():
    d = _generic({"value": np.swapaxes(SQUARE, -1, -2)}, {"value": SQUARE})
    assert d.key == "transposed"
    d = _generic({"value": np.swapaxes(E, -1, -2)}, {"value": E})  # (2, 4, 3) for (2, 3, 4)
    assert d.key == "transposed"


def test_wrong_shape_and_dtype():
    d = _generic({"value": E[0]}, {"value": E})
    assert d.key == "shape" and "(3, 4)" in d.message and "(2, 3, 4)" in d.message
    d = _generic({"value": E.astype(np.float32)}, {"value": E})
    assert d.key == "dtype" and "float32" in d.message
    mask = E > 0
    assert _generic({"value": mask.astype(np.float64)}, {"value": mask}).key == "dtype"


def test_nan_and_inf_where_the_answer_is_finite():
    bad = E.copy()
    bad[1, 2, 3] = np.nan
    assert _generic({"value": bad}, {"value": E}).key == "nan"
    bad[1, 2, 3] = np.inf
    assert _generic({"value": bad}, {"value": E}).key == "inf"
    # nan where the answer is nan too is not a symptom
    exp = E.copy()
    exp[0, 0, 0] = np.nan
    got = exp.copy()
    got[1, 1, 1] += 1.0
    d = _generic({"value": got}, {"value": exp})
    assert d is None or d.key not in ("nan", "inf")


def test_rows_that_do_not_sum_to_one():
    A = np.exp(E) / np.exp(E).sum(axis=-1, keepdims=True)
    A[0, 0] = 0.0  # a dead row
    got = A.copy()
    got[1, 2] = A[1, 2] ** 2  # not a constant factor
    d = _generic({"value": got}, {"value": A})
    assert d.key == "rows" and "sum to 1" in d.message


def test_values_before_gradients():
    grad = RNG.standard_normal((2, 3, 4))
    exp = {"value": E, "d/dS": grad}
    d = _generic({"value": 2.0 * E, "d/dS": -grad}, exp)
    assert (d.key, d.field) == ("factor", "value")
    d = _generic({"value": E, "d/dS": -grad}, exp)
    assert (d.key, d.field) == ("sign", "d/dS") and d.message.startswith("Your values are right")
    bad = grad.copy()
    bad[0, 1, 2] = np.nan
    d = _generic({"value": E, "d/dS": bad}, exp)
    assert d.key == "nan" and "gradient" in d.message
    d = _generic({"value": E, "d/dS": grad + RNG.standard_normal(grad.shape)}, exp)
    assert d.key == "gradient" and d.field == "d/dS"


def test_right_answers_unrecognised_answers_and_exceptions():
    assert _generic({"value": E * (1 + 1e-12)}, {"value": E}) is None
    assert _generic({"value": RNG.standard_normal(E.shape)}, {"value": E}) is None
    raised = {"status": "raised", "type": "AttentionInputError", "message": "..."}
    assert _generic(raised, {"status": "ok", "value": {"value": E}}) is None
    assert _generic({"status": "ok", "value": {"value": E}}, raised) is None


def test_precomputed_catalogue_outputs():
    """The catalogue's outputs may come with the case (shipped data) instead of being run."""
    ex = EXERCISES["2.1"]
    cases, refs = public("2.1")
    case, ref = cases[0], _value(refs[0])
    outs = wrong_outputs(ex, case)
    d = diagnose(ex, case, outs["missing-scale"], ref, wrong=outs)
    assert d.key == "missing-scale"
    d = diagnose(ex, case, outs["missing-scale"], ref, wrong={})
    assert d.kind == Kind.GENERIC and d.key == "factor"
    assert d.text("https://book.example/").endswith(f"(see https://book.example/{d.section})")


# -- (f) no hidden number in a message ----------------------------------------------------------

_FORMATS = (".2f", ".3f", ".4f", ".2g", ".3g", ".4g", ".6g", "g", "r")


def _input_numbers(inputs) -> set[str]:
    """Every non-integer float of the inputs, formatted as a message might show it."""
    floats: list[float] = []
    for v in inputs.values():
        if isinstance(v, float):
            floats.append(v)
        elif isinstance(v, np.ndarray) and v.dtype.kind == "f":
            floats.extend(float(x) for x in v.ravel())
        elif isinstance(v, (list, tuple)):
            floats.extend(float(x) for a in v if isinstance(a, np.ndarray) for x in a.ravel())
    out = set()
    for x in floats:
        if np.isfinite(x) and x != round(x):
            for f in _FORMATS:
                s = format(x, f) if f != "r" else repr(x)
                if re.search(r"[.e]", s):  # an integer string also names sizes; skip it
                    out.add(s.lstrip("-"))
    return out


def _made_up(exp: np.ndarray, scalars: list[float]) -> list[np.ndarray]:
    """Wrong answers with each generic symptom, factors taken from the case's own numbers."""
    e = exp.astype(np.float64)
    out = [-e, 2.0 * e, np.sqrt(8.0) * e]
    out += [c * e for c in scalars] + [e / c for c in scalars if c != 0]
    if e.ndim >= 2:
        out.append(np.swapaxes(e, -1, -2))
    bad = e.copy()
    if bad.size:
        bad.flat[0] = np.nan
        out.append(bad)
    return out


@pytest.mark.parametrize("exercise", ["2.2", "2.4", "3.3", "4.4", "5.1", "5.3", "7.3", "8.3", "10.2"])
def test_no_hidden_number_in_a_message(exercise):
    ex = EXERCISES[exercise]
    cases = ex.make_cases(hidden=True, secret="x")[:3]
    refs = reference_results(ex, cases)
    checked = 0
    for case, ref in zip(cases, refs):
        expected = _value(ref)
        if expected is None:
            continue
        numbers = _input_numbers(case.inputs)
        scalars = [v for v in case.inputs.values() if isinstance(v, float) and np.isfinite(v)]
        for field, exp in expected.items():
            if np.asarray(exp).dtype.kind == "b":
                continue
            for bad in _made_up(np.asarray(exp), scalars):
                got = {**expected, field: bad}
                d = diagnose(ex, case, got, expected, wrong={})
                if d is None:
                    continue
                checked += 1
                tokens = set(re.findall(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", d.message))
                leaked = tokens & numbers
                assert not leaked, f"{exercise} {case.name}: {d.message!r} shows {leaked}"
    assert checked
    # the catalogue's own messages are fixed text: the same on every case
    for m in for_exercise(exercise):
        assert not (set(re.findall(r"\d+\.\d+", m.message))), (m.key, m.message)


# -- honesty: each switchboard with every switch off is the reference ------------------------------


def _switchboards():
    import jax.numpy as jnp

    from attn_course.mistakes import _softmax, ch03, ch04, ch05, ch06, ch07, ch08, ch09
    from attn_course.specs.ch04 import metric_field
    from attn_tensors import flash, geometry, gradients, hopfield, kernel, multihead, statmech, variants
    from attn_tensors.softmax import softmax_and_log_partition

    def sm(S, mask, T):
        return softmax_and_log_partition(S, mask, T)

    return [
        ("2.2", lambda i: _softmax.softmax(i["S"], i["mask"], i["T"]), lambda i: sm(i["S"], i["mask"], i["T"])),
        ("3.2", lambda i: ch03._entropy(i["A"], i["mask"]), lambda i: statmech.entropy(i["A"], i["mask"])),
        ("4.2", lambda i: ch04._christoffel(metric_field(*[i.get(k) for k in ("G0", "G1", "G2", "W0", "W1")]),
                                            jnp.asarray(i["x"])),
         lambda i: geometry.christoffel_symbols(metric_field(*[i.get(k) for k in ("G0", "G1", "G2", "W0", "W1")]),
                                                jnp.asarray(i["x"]))),
        ("5.1", lambda i: ch05._softmax_backward(i["A"], i["dL_dA"], i["T"]),
         lambda i: gradients.softmax_backward(i["A"], i["dL_dA"], i["T"])),
        ("5.3", lambda i: tuple(vars(ch05._backward(**i)).values()),
         lambda i: tuple(gradients.attention_backward(**i))),
        ("6.2", lambda i: ch06.forward(**i), lambda i: multihead.multihead_attention(**i)),
        ("6.4", lambda i: ch06._backward(**i), lambda i: multihead.multihead_backward(**i)),
        ("7.3", lambda i: ch07._relative(i["Q"], i["K"], i["R"], i["max_distance"], i["scale"]),
         lambda i: variants.relative_position_scores(**i)),
        ("8.2", lambda i: ch08._sweep(i["W"], i["s"], i["order"]),
         lambda i: hopfield.classical_async_sweep(i["W"], i["s"], i["order"])),
        ("8.3", lambda i: ch08._energy(i["xi"], i["X"], i["beta"], i["constants"]),
         lambda i: hopfield.modern_energy(i["xi"], i["X"], i["beta"], constants=i["constants"])),
        ("9.1", lambda i: ch09.online_block(i["m"], i["l"], i["x_new"]),
         lambda i: flash.online_softmax_update(i["m"], i["l"], i["x_new"])),
        ("9.3", lambda i: ch09._prf(i["X"], i["omega"], i["stabilize"]),
         lambda i: kernel.positive_random_features(i["X"], i["omega"], stabilize=i["stabilize"])),
        ("9.4", lambda i: ch09._lse(i["x"], i["block"]), lambda i: flash.online_logsumexp(i["x"], i["block"])),
    ]


@pytest.mark.parametrize("exercise, mine, reference", _switchboards(), ids=lambda x: x if isinstance(x, str) else "")
def test_switchboards_default_to_the_reference(exercise, mine, reference):
    """A wrong implementation is the right one with one switch turned: with none, it is the reference."""
    import jax

    from attn_course.worker import to_backend

    checked = 0
    for case in EXERCISES[exercise].make_cases():
        inputs = to_backend(dict(case.inputs))
        try:
            want = reference(inputs)
        except Exception:  # noqa: BLE001 - a case that must raise: nothing to compare
            continue
        got = jax.jit(lambda: mine(inputs))()
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for w, g in zip(want, got):
            if w is None:
                assert g is None
                continue
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12, atol=1e-12)
        checked += 1
    assert checked


def test_a_nearly_right_answer_is_not_named_after_a_mistake_that_is_right_here():
    """Matching is looser than grading; an entry equal to the answer on this case never matches."""
    ex = EXERCISES["2.1"]
    cases, refs = public("2.1")
    case, expected = cases[0], _value(refs[0])  # default scale: no metric, so this entry is right
    assert dg.close(wrong_outputs(ex, case)["metric-scaled-again"]["value"], expected["value"],
                    ex.rtol, ex.atol)
    got = {"value": expected["value"] * (1 + 1e-8)}
    assert not dg.close(got["value"], expected["value"], ex.rtol, ex.atol)
    assert diagnose(ex, case, got, expected) is None


@pytest.mark.parametrize("exercise", ["3.2", "5.1"])
def test_catalogue_diagnoses_of_hidden_cases_are_the_fixed_messages(exercise):
    ex = EXERCISES[exercise]
    cases = ex.make_cases(hidden=True, secret="x")
    refs = reference_results(ex, cases)
    named = 0
    for case, ref in zip(cases, refs):
        if _value(ref) is None:
            continue
        numbers = _input_numbers(case.inputs)
        for m in for_exercise(exercise):
            out = wrong_outputs(ex, case)[m.key]
            d = None if out is None else diagnose(ex, case, out, _value(ref))
            if d is not None and d.kind == Kind.CATALOGUE:
                named += 1
                assert d.message in {e.message for e in for_exercise(exercise)}
                assert not set(re.findall(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", d.message)) & numbers
    assert named


@pytest.mark.parametrize("exercise", ["3.2", "2.2"])
def test_hidden_feedback_says_nothing_the_answer_chose(exercise):
    """A submission sees a hidden case's inputs, so it could write a digest of them into its
    answer's scale, shape or dtype and read it back in its feedback: the factor alone ("43 times
    too large") carried about 9 bits a case, the shape more.  On a hidden case the words are the
    same whatever it chose; on a public case they still name the factor and the shape."""
    from attn_course.diagnose import explain
    from attn_course.scoring import Outcome, compare

    ex = EXERCISES[exercise]
    case = ex.make_cases(hidden=True, secret="x")[0]
    (ref,) = _reference_outcomes(ex, [case])
    exp = ref.value
    field = next(k for k in exp if not dg.is_gradient(k))

    def messages(choices, hidden=True) -> set[str]:
        return {compare(ex, case, ref, Outcome("ok", {**exp, field: np.asarray(x)}), hidden,
                        diagnose=explain).message for x in choices}

    scaled = [k * exp[field] for k in (2.0, 3.0, 43.0, 64.0, np.sqrt(8.0), 1 / 7)]
    assert len(messages(scaled)) == 1, messages(scaled)
    assert len(messages([-k * exp[field] for k in (2.0, 43.0)])) == 1
    assert len(messages([np.zeros(n) for n in (17, 999, 1234)])) == 1
    assert len(messages([exp[field].astype(t) for t in (np.float32, np.float16)])) == 1
    assert len(messages(scaled, hidden=False)) == len(scaled)  # public: the factor is named
    assert len(messages([np.zeros(n) for n in (17, 999, 1234)], hidden=False)) == 3
