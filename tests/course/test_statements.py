"""Similar code statement by statement (attn_course.statements), as the similarity report uses it."""

from __future__ import annotations

import random

from attn_course import RELEASE_LIBRARY, ROOT
from attn_course.similarity import compare_class, student_code
from attn_course.statements import MIN_STATEMENTS, normalised, statements

MODULE = "attn_tensors/statmech.py"
STUB = (RELEASE_LIBRARY / MODULE).read_text()
REFERENCE = student_code((ROOT / MODULE).read_text(), STUB)  # the reference's own code: many statements


def _interleaved(code: str, junk: list[str], seed: int = 0, every: int = 1) -> str:
    """``code`` with a statement of ``junk`` after every ``every``-th of its own that does not open a block."""
    rng = random.Random(seed)
    out = []
    for k, line in enumerate(code.split("\n")):
        out.append(line)
        if not line.rstrip().endswith(":") and k % every == 0:
            out.append(line[: len(line) - len(line.lstrip())] + rng.choice(junk))
    return "\n".join(out)


def _pairs(codes: dict[str, str], threshold: float = 0.6):
    rep = compare_class({sid: {MODULE: code} for sid, code in codes.items()}, {MODULE: STUB}, threshold)
    return {(p.a, p.b): p for p in rep.pairs}, rep


def test_normalised_statements_ignore_names_and_keep_what_they_call():
    a = normalised("    peak = xp.max(S / T, axis=-1, keepdims=True)")
    assert a == normalised("top=xp.max(scores/temp,axis=-1,keepdims=True)")  # renamed, respaced: the same
    assert a != normalised("peak = xp.min(S / T, axis=-1, keepdims=True)")  # another function
    assert a != normalised("peak = xp.max(S / T, axis=-2, keepdims=True)")  # another axis
    assert a != normalised("peak = xp.max(S / T, axis=-1, keepdim=True)")  # another keyword
    assert normalised("note = 'a'") == normalised('remark = "b"') == "V=S"
    assert [s.text for s in statements("x = 1\n    total = xp.sum(xp.exp(S - m), axis=-1)")] == [
        "V=V.sum(V.exp(V-V),axis=-1)"]  # (the short one left out)


def test_a_copy_interleaved_with_statements_of_its_own_is_found():
    """Red team, round 17: a junk statement after each copied one (``_k = 0``, ``del _k``, or one that
    looks like work) broke every k-gram across statements; the whole module copied that way dropped
    to 47%, under the threshold."""
    junk = ["_k = 0", "del _k", "_k = None", "_scratch_buffer = xp.zeros_like(S) * 0.0", "_unused = float(len(S.shape))"]
    copy = _interleaved(REFERENCE, junk)
    pairs, rep = _pairs({"ada": REFERENCE, "bea": copy})
    p = pairs[("ada", "bea")]
    assert p.similarity_a == 1.0 and p.similarity >= 0.6, p
    # at a threshold the k-grams reach too, the pair is listed with the copy's own figure, not the diluted one
    padded = _interleaved(REFERENCE, ["_k = 0"], every=2)  # (the k-grams find this one, at 0.89)
    assert _pairs({"ada": REFERENCE, "bea": padded}, threshold=0.3)[0][("ada", "bea")].similarity_a == 1.0
    # the view highlights whole statements of each: the copied ones in bea's code, none of the junk
    assert all("_k" not in rep.code[("bea", MODULE)][s:e] and "_scratch" not in rep.code[("bea", MODULE)][s:e]
               for s, e in p.slices_b)


def test_independent_or_reordered_code_and_a_few_common_lines_make_no_pair():
    """Statements match in order only, and a pair needs MIN_STATEMENTS of them: the same lines in
    another order, or an exercise's few lines that independent work shares too, make no pair."""
    lines = [ln for ln in REFERENCE.split("\n") if ln.strip()]
    shuffled = lines[:]
    random.Random(1).shuffle(shuffled)
    few = "\n".join([s for s in REFERENCE.split("\n") if len(normalised(s)) >= 16][: MIN_STATEMENTS - 1])
    other = ("    import numpy as np\n    values = np.asarray(S, dtype=float) / float(T)\n"
             "    out = [np.log(np.exp(row - row.max()).sum()) + row.max() for row in values]\n"
             "    return xp.asarray(np.array(out))")
    pairs, _ = _pairs({"ada": REFERENCE, "bea": "\n".join(shuffled), "cy": few + "\n" + other})
    assert ("ada", "bea") not in pairs or pairs[("ada", "bea")].similarity < 1.0  # (k-grams may still find it)
    assert ("ada", "cy") not in pairs, pairs


def test_hostile_statements_are_read_in_one_pass():
    """A quote that no quote closes, escaped quotes by the hundred thousand: each string is one token,
    an open one running to the line's end (a first draft of the tokenizer rescanned from every quote,
    quadratic: 100,000 characters held it for minutes; a regression hangs here)."""
    n = 100_000
    assert normalised('"\\' * n) == "S" and normalised('"\\' * n + "\\") == "S"
    assert normalised("'''\\" * n) == "S" and normalised('x = "open') == "V=S"
    assert normalised('"a' * n) == "SV" * (n // 2) and normalised("a\"\\" * n).startswith("VS")
    assert normalised("x = f(" + ", ".join(f"a{i}=b{i}" for i in range(n)) + ")").count("=V") == n + 1  # (x = too)
