"""Index strings: parsed, put in words, read as loops, and run on JAX and MLX.

The oracle for every contraction is ``loop_einsum`` (the string read
literally as nested loops); it is itself checked against ``np.einsum``,
an independent implementation, on the book's table and on random strings.
"""

from __future__ import annotations

import re
from collections import Counter

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_tensors import AttentionInputError
from attn_tensors.einsum import (
    ATTENTION_EINSUMS,
    EinsumSpec,
    einsum,
    explain_einsum,
    loop_einsum,
    parse_einsum,
)
from conftest import assert_close, to_backend, to_np

# One size per letter (and one batch shape for '...'): every test array is
# built from these, so 'ii' is square and shared letters agree.
SIZES = dict(a=2, b=3, c=2, d=3, h=2, i=3, j=4, k=2)
BATCH = (2, 3)


def shape_of(term: str, sizes=SIZES, batch=BATCH) -> tuple[int, ...]:
    """The shape an operand with this index string gets in the tests."""
    left, dots, right = term.partition("...")
    if not dots:
        return tuple(sizes[c] for c in term)
    return tuple(sizes[c] for c in left) + batch + tuple(sizes[c] for c in right)


def random_operands(rng, subscripts: str, sizes=SIZES, batch=BATCH):
    terms = subscripts.split("->")[0].split(",")
    return [rng.standard_normal(shape_of(t, sizes, batch)) for t in terms]


def by_hand(subscripts: str):
    """Output, free and summed indices from set logic, as one would on paper.

    Free: the letters of the output.  Summed: the letters of the inputs
    minus the free ones.  No output given: the letters used exactly once,
    sorted, after '...' if there is one.
    """
    lhs, arrow, rhs = subscripts.partition("->")
    terms = lhs.split(",")
    letters = [t.replace("...", "") for t in terms]
    used_once = sorted(c for c, n in Counter("".join(letters)).items() if n == 1)
    if arrow:
        output = rhs
    else:
        output = ("..." if any("..." in t for t in terms) else "") + "".join(used_once)
    free = set(output.replace("...", ""))
    summed = set("".join(letters)) - free
    return output, free, summed


# --------------------------------------------------------------------------
# parse_einsum
# --------------------------------------------------------------------------

PARSE_CASES = [
    # (subscripts, free (set), summed (set)): read off by eye
    ("ia,ab,jb->ij", {"i", "j"}, {"a", "b"}),
    ("ia,ja->ij", {"i", "j"}, {"a"}),
    ("a,a->", set(), {"a"}),
    ("a,b->ab", {"a", "b"}, set()),
    ("ii->", set(), {"i"}),
    ("ii->i", {"i"}, set()),
    ("ij->ji", {"i", "j"}, set()),
    ("ij", {"i", "j"}, set()),
    ("ji", {"i", "j"}, set()),
    ("ij,jk", {"i", "k"}, {"j"}),
    ("ii", set(), {"i"}),
    ("...ia,...ja->...ij", {"i", "j"}, {"a"}),
    ("...ij,jk", {"i", "k"}, {"j"}),
    ("hic,hcd->id", {"i", "d"}, {"h", "c"}),
    ("ij->", set(), {"i", "j"}),
]


@pytest.mark.parametrize("subscripts, free, summed", PARSE_CASES)
def test_parse_free_and_summed(subscripts, free, summed):
    """Free indices are the output's letters; summed ones are the rest."""
    spec = parse_einsum(subscripts)
    out, free_hand, summed_hand = by_hand(subscripts)
    assert (free_hand, summed_hand) == (free, summed)  # the two readings agree
    assert isinstance(spec, EinsumSpec)
    assert spec.output == out
    assert set(spec.free) == free and set(spec.summed) == summed
    assert spec.free == tuple(out.replace("...", ""))  # output order
    assert spec.implicit == ("->" not in subscripts)
    assert spec.ellipsis == ("..." in subscripts)
    assert spec.inputs == tuple(subscripts.split("->")[0].split(","))
    assert spec.subscripts == ",".join(spec.inputs) + "->" + out
    assert spec.sizes is None and spec.output_shape is None


def test_implicit_output_is_sorted_like_numpy():
    """Without '->' the output is the once-used letters in sorted order."""
    x = np.arange(6.0).reshape(2, 3)
    for sub in ("ij", "ji", "Ba", "aB"):
        spec = parse_einsum(sub, x)
        assert spec.output == "".join(sorted(sub))
        assert spec.output_shape == np.einsum(sub, x).shape


def test_summed_in_order_of_first_use():
    """Summed indices are listed as they first appear in the inputs."""
    assert parse_einsum("ib,ba,ja->ij").summed == ("b", "a")
    assert parse_einsum("ia,ab,jb->ij").summed == ("a", "b")


def test_spec_is_frozen():
    spec = parse_einsum("ia,ja->ij")
    with pytest.raises(AttributeError):
        spec.output = "ji"


def test_sizes_from_arrays_and_shapes(rng):
    """Every index gets the size of its axes; '...' gets the broadcast shape."""
    Q = rng.standard_normal((2, 1, 3, 5))
    K = (4, 5)  # a tuple of ints is a shape
    spec = parse_einsum("...ia,ja->...ij", Q, K, names=("Q", "K"))
    assert spec.sizes == {"i": 3, "a": 5, "j": 4}
    assert spec.batch_shape == (2, 1)
    assert spec.output_shape == (2, 1, 3, 4)
    assert spec.names == ("Q", "K")
    spec = parse_einsum("...a,...a->...", (3, 1, 5), (2, 5))
    assert spec.batch_shape == (3, 2)
    assert spec.output_shape == np.einsum("...a,...a->...", np.ones((3, 1, 5)), np.ones((2, 5))).shape


def test_whitespace_is_ignored():
    assert parse_einsum(" ia , ja -> ij ").subscripts == "ia,ja->ij"


# --------------------------------------------------------------------------
# Errors: each names the index (or the bad piece) and the sizes
# --------------------------------------------------------------------------

ERROR_CASES = [
    # (subscripts, operands (shapes), names, fragments the message must hold)
    ("ia,ja->ij", [(5, 3), (6, 4)], ("Q", "K"),
     ["index a", "size 3", "operand 0 (Q)", "4", "operand 1 (K)"]),
    ("ia,ab,jb->ij", [(5, 3), (3, 4), (6, 5)], ("Q", "g", "K"),
     ["index b", "size 4", "operand 1 (g)", "5", "operand 2 (K)"]),
    ("ia,ab,ja->ij", [(5, 3), (3, 3), (6, 4)], ("Q", "g", "K"),
     ["index a has size 3 in operand 0 (Q) but 4 in operand 2 (K)"]),
    ("ii->", [(3, 4)], None, ["index i", "size 3", "4", "axis 0", "axis 1"]),
    ("i1,j->ij", [], None, ["bad character '1'", "'i1'"]),
    ("i.a->ia", [], None, ["bad character '.'"]),
    ("ia,ja->i_", [], None, ["bad character '_'"]),
    ("...i...", [], None, ["'...' appears more than once"]),
    ("ia,ja->ik", [], None, ["index k", "none of the inputs"]),
    ("ia,ja->iji", [], None, ["index i", "repeated in the output"]),
    ("ia,ja->ij", [(3, 4)], None, ["2 input spec", "1 operand"]),
    ("ia->i", [(3, 4), (3, 4)], None, ["1 input spec", "2 operand"]),
    ("ia,ja->ij", [], ("Q",), ["2 input spec", "1 name"]),
    ("ia->i", [(2, 3, 4)], ("Q",), ["operand 0 (Q)", "3 axes", "(2, 3, 4)", "'ia'", "needs 2"]),
    ("...ia->...i", [(4,)], None, ["1 axes", "'...ia'", "at least 2"]),
    ("...ia,...ja->...ij", [(2, 3, 4), (3, 5, 4)], ("Q", "K"),
     ["batch axes", "operand 0 (Q) has (2,)", "operand 1 (K) has (3,)", "2 vs 3"]),
    ("ia->...i", [], None, ["'...'", "no input"]),
    ("...i->i", [], None, ["'...'", "output does not"]),
    ("ij->j->i", [], None, ["more than one '->'"]),
    ("i->i,j", [], None, ["','", "output"]),
    ("ij-i", [], None, ["'->'"]),
]


@pytest.mark.parametrize("subscripts, shapes, names, fragments", ERROR_CASES)
def test_errors_name_the_index_and_sizes(subscripts, shapes, names, fragments):
    """Every bad string or operand list raises AttentionInputError that says what is wrong."""
    with pytest.raises(AttentionInputError) as err:
        parse_einsum(subscripts, *shapes, names=names)
    for f in fragments:
        assert f in str(err.value), (f, str(err.value))


def test_subscripts_must_be_a_string():
    with pytest.raises(AttentionInputError, match="must be a string"):
        parse_einsum(["i", "j"])


def test_numpy_agrees_that_the_error_cases_are_errors(rng):
    """The strings rejected above with shapes are rejected (or unlike) in NumPy too."""
    for sub, shapes, _, _ in ERROR_CASES:
        if not shapes:
            continue
        arrays = [np.ones(s) for s in shapes]
        with pytest.raises((ValueError, TypeError)):
            np.einsum(sub, *arrays)


def test_named_axes_do_not_broadcast():
    """A named index of length 1 against length 3 is a clash (NumPy would broadcast)."""
    with pytest.raises(AttentionInputError, match="index j has size 1 .* but 3"):
        parse_einsum("ij,jk->ik", (2, 1), (3, 2))


# --------------------------------------------------------------------------
# explain_einsum
# --------------------------------------------------------------------------


def test_explain_bilinear_scores_sentence():
    """The book's example, word for word."""
    got = explain_einsum("ia,ab,jb->ij", names=("Q", "g", "K"), out="S")
    assert got == (
        "S[i,j] = sum over a, b of Q[i,a] * g[a,b] * K[j,b]: free indices "
        "i, j (kept); summed indices a, b (contracted)."
    )


@pytest.mark.parametrize("subscripts", [c[0] for c in PARSE_CASES] + [e.subscripts for e in ATTENTION_EINSUMS.values()])
def test_explain_names_free_and_summed(subscripts):
    """The sentence lists exactly the free indices as kept and the summed ones as contracted."""
    _, free, summed = by_hand(subscripts)
    spec = parse_einsum(subscripts)
    text = explain_einsum(subscripts)
    if free:
        assert f"free indices {', '.join(spec.free)} (kept)" in text
        assert set(spec.free) == free
    else:
        assert "no free indices" in text
    if summed:
        m = re.search(r"summed indices ([a-zA-Z, ]+) \(contracted\)", text)
        assert m and set(m.group(1).split(", ")) == summed
        assert f"sum over {', '.join(spec.summed)} of" in text
    else:
        assert "no summed indices" in text and "sum over" not in text
    assert ("leading batch axes ..." in text) == ("..." in subscripts)


@pytest.mark.parametrize(
    "subscripts, names, out, fragments",
    [
        ("ii->", ("A",), "s", ["s = sum over i of A[i,i]", "the result is a scalar",
                               "diagonal", "trace"]),
        ("ij->ji", ("A",), "B", ["B[j,i] = A[i,j]", "transpose", "no summed indices"]),
        ("a,b->ab", ("u", "v"), "M", ["M[a,b] = u[a] * v[b]", "outer product"]),
        ("ii->i", ("A",), "d", ["d[i] = A[i,i]", "diagonal"]),
        ("...ia,...ja->...ij", ("Q", "K"), "S",
         ["S[...,i,j] = sum over a of Q[...,i,a] * K[...,j,a]", "batch axes ..."]),
        ("hia,hja->hij", ("Q", "K"), "S", ["h is shared but kept", "head"]),
        ("...i->...", ("x",), "n", ["n[...] = sum over i of x[...,i]",
                                    "no free indices, only the leading batch axes"]),
        (",a->a", ("c", "v"), "w", ["w[a] = c * v[a]"]),
    ],
)
def test_explain_special_shapes(subscripts, names, out, fragments):
    """Traces, transposes, outer products, diagonals and batch axes get their remark."""
    text = explain_einsum(subscripts, names, out=out)
    for f in fragments:
        assert f in text, (f, text)
    assert text.endswith(".")


def test_explain_default_names_avoid_index_letters():
    text = explain_einsum("AB,Bc->Ac")
    lhs, body = text.split(" = ", 1)
    operands = re.findall(r"(\w+)\[", body.split(":")[0])
    assert len(operands) == 2 and not {"A", "B"} & set(operands)


def test_explain_rejects_bad_strings():
    with pytest.raises(AttentionInputError, match="index k"):
        explain_einsum("ia,ja->ik")


# --------------------------------------------------------------------------
# The book's table
# --------------------------------------------------------------------------


def formula_subscripts(formula: str) -> str:
    """'S^{ij} = Q^{ia} g_{ab} K^{jb}' -> 'ia,ab,jb->ij' (the index groups, in order)."""
    lhs, rhs = formula.split(" = ")

    def indices(token: str) -> str:
        return "".join(re.findall(r"\{([^}]*)\}", token))

    return ",".join(indices(t) for t in rhs.split()) + "->" + indices(lhs)


@pytest.mark.parametrize("name", list(ATTENTION_EINSUMS))
def test_table_formula_spells_the_subscripts(name):
    """The formula in index notation and the einsum string name the same indices."""
    entry = ATTENTION_EINSUMS[name]
    assert formula_subscripts(entry.formula) == entry.subscripts
    sub, formula, words = entry  # a plain 3-tuple too
    assert words and parse_einsum(sub).subscripts == sub


def test_table_has_the_books_contractions():
    subs = {e.subscripts for e in ATTENTION_EINSUMS.values()}
    for s in ["a,a->", "a,b->ab", "ij,jk->ik", "ij->ji", "ii->", "ia,ja->ij",
              "ia,ab,jb->ij", "ij,jb->ib", "id,hda->hia", "hia,hja->hij",
              "hij,hjc->hic", "hic,hcd->id"]:
        assert s in subs


# --------------------------------------------------------------------------
# loop_einsum against np.einsum (independent implementations)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ATTENTION_EINSUMS))
def test_loop_einsum_matches_numpy_on_the_table(name, rng):
    """The literal loops give what NumPy's einsum gives, for every contraction of the book."""
    sub = ATTENTION_EINSUMS[name].subscripts
    ops = random_operands(rng, sub)
    got = loop_einsum(sub, *ops)
    want = np.einsum(sub, *ops)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_loop_einsum_does_not_use_einsum(monkeypatch, rng):
    """The oracle is independent: it runs with np.einsum switched off."""
    Q, g, K = rng.standard_normal((3, 2)), rng.standard_normal((2, 2)), rng.standard_normal((4, 2))
    want = Q @ g @ K.T
    monkeypatch.setattr(np, "einsum", None)
    np.testing.assert_allclose(loop_einsum("ia,ab,jb->ij", Q, g, K), want, rtol=1e-12)


def test_loop_einsum_broadcasts_batch_axes_and_copies(rng):
    """'...' broadcasts length-1 and missing batch axes; inputs are left untouched."""
    Q = rng.standard_normal((2, 1, 3, 2))
    K = rng.standard_normal((4, 4, 2))
    K_before = K.copy()
    got = loop_einsum("...ia,...ja->...ij", Q, K)
    want = np.einsum("...ia,...ja->...ij", Q, K)
    assert got.shape == (2, 4, 3, 4)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_array_equal(K, K_before)


def test_loop_einsum_takes_backend_arrays(xp_name, rng):
    """JAX and MLX arrays are copied to float64 NumPy."""
    A = to_backend(rng.standard_normal((3, 3)), xp_name)
    got = loop_einsum("ij->ji", A)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    np.testing.assert_array_equal(got, to_np(A).T)


def test_loop_einsum_checks_sizes(rng):
    with pytest.raises(AttentionInputError, match="index a has size 2 .* but 3"):
        loop_einsum("ia,ja->ij", np.ones((3, 2)), np.ones((4, 3)))


LETTERS = "abcd"
FIXED = dict(a=2, b=3, c=2, d=3)  # fixed sizes: only the strings vary


@st.composite
def index_strings(draw, max_ops=3):
    """A random einsum string over a, b, c, d (repeats allowed), output explicit or implied."""
    n_ops = draw(st.integers(1, max_ops))
    terms = [
        "".join(draw(st.lists(st.sampled_from(LETTERS), min_size=0, max_size=3)))
        for _ in range(n_ops)
    ]
    used = sorted(set("".join(terms)))
    if draw(st.booleans()):
        return ",".join(terms)
    order = draw(st.permutations(used))
    keep = draw(st.integers(0, len(used)))
    return ",".join(terms) + "->" + "".join(order[:keep])


@given(index_strings(), st.integers(0, 2**32 - 1))
def test_loop_einsum_matches_numpy_on_random_strings(sub, seed):
    """For any index string on fixed sizes, the literal loops equal np.einsum."""
    ops = random_operands(np.random.default_rng(seed), sub, FIXED)
    got = loop_einsum(sub, *ops)
    want = np.einsum(sub, *ops)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


BATCHES = [(), (1,), (2,), (3, 2), (3, 1), (1, 2)]  # all broadcast to (3, 2)


@given(index_strings(), st.data(), st.integers(0, 2**32 - 1))
def test_loop_einsum_matches_numpy_with_batch_axes(sub, data, seed):
    """With '...' in front of every operand, batch axes broadcast as in NumPy."""
    lhs, arrow, rhs = sub.partition("->")
    terms = lhs.split(",")
    out = rhs if arrow else "".join(sorted(c for c, n in Counter("".join(terms)).items() if n == 1))
    sub = ",".join("..." + t for t in terms) + "->..." + out
    rng = np.random.default_rng(seed)
    ops = [rng.standard_normal(data.draw(st.sampled_from(BATCHES)) + shape_of(t, FIXED)) for t in terms]
    got = loop_einsum(sub, *ops)
    want = np.einsum(sub, *ops)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@given(index_strings())
def test_parse_matches_set_logic_on_random_strings(sub):
    """Free = output letters, summed = input letters not in the output, for any string."""
    spec = parse_einsum(sub)
    out, free, summed = by_hand(sub)
    assert spec.output == out
    assert set(spec.free) == free and set(spec.summed) == summed
    assert len(spec.summed) == len(summed)


# --------------------------------------------------------------------------
# einsum() on JAX and MLX
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ATTENTION_EINSUMS))
def test_einsum_on_backends_matches_loops(name, xp_name, rng):
    """The checked einsum on each backend equals the literal loops."""
    sub = ATTENTION_EINSUMS[name].subscripts
    ops = [to_backend(x, xp_name) for x in random_operands(rng, sub)]
    got = einsum(sub, *ops)
    if xp_name == "mlx":
        import mlx.core as mx

        assert isinstance(got, mx.array)
    else:
        assert isinstance(got, jax.Array)
    # The loops read the same (possibly float32) inputs.
    assert_close(got, loop_einsum(sub, *ops), xp_name)


@pytest.mark.parametrize("sub", ["ij", "ji", "ii", "...ij,jk", "ij,jk"])
def test_einsum_implicit_output_on_backends(sub, xp_name, rng):
    """Implied outputs follow the NumPy rule on both backends."""
    ops = [to_backend(x, xp_name) for x in random_operands(rng, sub)]
    assert_close(einsum(sub, *ops), loop_einsum(sub, *ops), xp_name)


def test_einsum_keeps_float64(xp_name, rng):
    """float64 in, float64 out, to float64 accuracy (MLX on the CPU too)."""
    if xp_name == "mlx":
        import mlx.core as mx

        f64 = mx.float64
    else:
        f64 = np.float64
    Q, g, K = (to_backend(rng.standard_normal(s), xp_name, dtype=f64) for s in [(3, 2), (2, 2), (4, 2)])
    got = einsum("ia,ab,jb->ij", Q, g, K)
    assert got.dtype == f64
    np.testing.assert_allclose(to_np(got), loop_einsum("ia,ab,jb->ij", Q, g, K), rtol=1e-12)


def test_einsum_errors_on_backends(xp_name, rng):
    """A clash is reported before the backend sees it, naming the index and sizes."""
    Q = to_backend(rng.standard_normal((5, 3)), xp_name)
    K = to_backend(rng.standard_normal((6, 4)), xp_name)
    with pytest.raises(AttentionInputError) as err:
        einsum("ia,ja->ij", Q, K, names=("Q", "K"))
    assert "index a has size 3 in operand 0 (Q) but 4 in operand 1 (K)" in str(err.value)


def test_einsum_takes_numpy_and_traces_under_jit(rng):
    """NumPy inputs go to JAX; under jit only shapes are checked."""
    Q, K = rng.standard_normal((3, 2)), rng.standard_normal((4, 2))
    got = jax.jit(lambda q, k: einsum("ia,ja->ij", q, k))(Q, K)
    assert isinstance(got, jax.Array)
    np.testing.assert_allclose(got, loop_einsum("ia,ja->ij", Q, K), rtol=1e-12)
    grad = jax.grad(lambda q: einsum("ia,ja->", q, K))(Q)
    np.testing.assert_allclose(grad, np.broadcast_to(K.sum(0), Q.shape), rtol=1e-12)
