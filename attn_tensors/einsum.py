"""Part I, Foundations: index strings in words, in loops and in code.

An einsum string is index notation typed on one line.  ``'ia,ab,jb->ij'``
is S^{ij} = Q^{ia} g_{ab} K^{jb}: the indices left of ``->`` label the axes
of each operand, the ones right of it label the axes of the result.

* A **free** index appears in the output: the result keeps that axis.
* A **summed** (contracted) index appears in the inputs only: every term
  that shares its value is multiplied and the products are added up.
* ``...`` stands for leading batch axes; they broadcast like NumPy arrays
  and are carried into the output.
* Without ``->`` the output is implied, as in NumPy: ``...`` (if any) and
  then, in sorted order, the indices that appear exactly once.

This module reads such a string four ways: :func:`parse_einsum` (which
indices are free, which are summed, how large each is), :func:`explain_einsum`
(a sentence), :func:`loop_einsum` (the string read literally as nested loops,
the oracle of the tests) and :func:`einsum` (the fast version, checked, on the
backend of its arrays).  :data:`ATTENTION_EINSUMS` collects the contractions
of the book.
"""

from __future__ import annotations

import itertools
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np

from ._checks import AttentionInputError
from .backend import namespace

__all__ = [
    "EinsumSpec",
    "parse_einsum",
    "explain_einsum",
    "loop_einsum",
    "einsum",
    "EinsumEntry",
    "ATTENTION_EINSUMS",
]

_LETTERS = frozenset(string.ascii_letters)
_ELLIPSIS = "..."


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class EinsumSpec:
    """An einsum string taken apart: which indices are free, which are summed.

    ``inputs`` and ``output`` keep ``...`` where it was written; ``free`` and
    ``summed`` hold single letters only.  ``index_sizes`` and ``batch_shape``
    are known only when :func:`parse_einsum` was given the operands.
    """

    subscripts: str  # the explicit form, e.g. 'ia,ab,jb->ij'
    inputs: tuple[str, ...]  # one index string per operand
    output: str  # the output's index string ('' for a scalar)
    free: tuple[str, ...]  # indices kept, in output order
    summed: tuple[str, ...]  # indices contracted, in order of first use
    ellipsis: bool  # whether '...' (leading batch axes) appears
    implicit: bool  # whether the output was implied (no '->')
    names: tuple[str, ...]  # operand names used in messages
    index_sizes: tuple[tuple[str, int], ...] | None = None
    batch_shape: tuple[int, ...] | None = None  # broadcast shape of '...'

    @property
    def sizes(self) -> dict[str, int] | None:
        """The size of every index, or None when no operands were given."""
        return None if self.index_sizes is None else dict(self.index_sizes)

    @property
    def output_shape(self) -> tuple[int, ...] | None:
        """The shape of the result, or None when no operands were given."""
        if self.index_sizes is None:
            return None
        sizes = dict(self.index_sizes)
        shape: list[int] = []
        for piece in _split_ellipsis(self.output):
            if piece == _ELLIPSIS:
                shape.extend(self.batch_shape or ())
            else:
                shape.extend(sizes[c] for c in piece)
        return tuple(shape)

    def letters(self, term: str) -> str:
        """The letters of one index string, without '...'."""
        return term.replace(_ELLIPSIS, "")

    def __str__(self) -> str:
        return self.subscripts


def _split_ellipsis(term: str) -> list[str]:
    """'...ia' -> ['...', 'ia']; 'ia' -> ['ia']."""
    if _ELLIPSIS not in term:
        return [term]
    left, right = term.split(_ELLIPSIS)
    return [p for p in (left, _ELLIPSIS, right) if p]


def _check_term(term: str, where: str, subscripts: str) -> None:
    if term.count(_ELLIPSIS) > 1:
        raise AttentionInputError(
            f"'...' appears more than once in the {where} of einsum "
            f"'{subscripts}'; it may stand for one group of batch axes only"
        )
    for c in term.replace(_ELLIPSIS, ""):
        if c not in _LETTERS:
            raise AttentionInputError(
                f"bad character {c!r} in the {where} of einsum '{subscripts}': "
                "indices are single letters a-z, A-Z, and '...' stands for "
                "leading batch axes"
            )


def _shape_of(x: Any) -> tuple[int, ...]:
    """A tuple of ints is a shape; anything else is an array (or a number)."""
    if isinstance(x, tuple) and all(isinstance(n, (int, np.integer)) for n in x):
        return tuple(int(n) for n in x)
    shape = getattr(x, "shape", None)
    return tuple(int(n) for n in (np.shape(x) if shape is None else shape))


def _label(k: int, names: tuple[str, ...]) -> str:
    return f"operand {k} ({names[k]})" if names[k] else f"operand {k}"


def parse_einsum(
    subscripts: str, *operands: Any, names: Sequence[str] | None = None
) -> EinsumSpec:
    """Read an einsum string: free indices (in the output) and summed ones (not).

    ``operands`` are optional arrays or shapes (a tuple of ints is read as a
    shape).  With them every index gets a size, and a clash is reported
    with the index and both sizes, e.g. ``index a has size 3 in operand 0
    (Q) but 4 in operand 2 (K)``.  ``names`` label the operands in messages.
    Every problem raises :class:`AttentionInputError`.
    """
    if not isinstance(subscripts, str):
        raise AttentionInputError(
            f"einsum subscripts must be a string such as 'ia,ja->ij'; "
            f"got {type(subscripts).__name__}"
        )
    text = "".join(subscripts.split())
    if text.count("->") > 1:
        raise AttentionInputError(
            f"einsum '{subscripts}' has more than one '->'"
        )
    implicit = "->" not in text
    lhs, _, rhs = text.partition("->")
    if "-" in lhs or ">" in lhs or "-" in rhs or ">" in rhs:
        raise AttentionInputError(
            f"bad character in einsum '{subscripts}': the arrow is written '->'"
        )
    inputs = tuple(lhs.split(","))
    for k, term in enumerate(inputs):
        _check_term(term, f"input spec {k} ('{term}')", subscripts)
    ellipsis = any(_ELLIPSIS in t for t in inputs)

    in_letters = [t.replace(_ELLIPSIS, "") for t in inputs]
    counts = Counter("".join(in_letters))
    if implicit:
        # NumPy's rule: '...' first, then the indices used exactly once, sorted.
        once = "".join(sorted(c for c, n in counts.items() if n == 1))
        output = (_ELLIPSIS if ellipsis else "") + once
    else:
        output = rhs
        if "," in output:
            raise AttentionInputError(
                f"einsum '{subscripts}' has a ',' in its output; "
                "the output is one index string"
            )
        _check_term(output, f"output ('{output}')", subscripts)
        out_letters = output.replace(_ELLIPSIS, "")
        for c, n in Counter(out_letters).items():
            if n > 1:
                raise AttentionInputError(
                    f"index {c} is repeated in the output '{output}' of einsum "
                    f"'{subscripts}'; an output index names one axis (for a "
                    f"diagonal write '{c}{c}->{c}')"
                )
        for c in out_letters:
            if c not in counts:
                raise AttentionInputError(
                    f"index {c} is in the output of einsum '{subscripts}' but "
                    "in none of the inputs; every output index must come from "
                    "an input"
                )
        if _ELLIPSIS in output and not ellipsis:
            raise AttentionInputError(
                f"the output of einsum '{subscripts}' has '...' but no input does"
            )
        if ellipsis and _ELLIPSIS not in output:
            raise AttentionInputError(
                f"the inputs of einsum '{subscripts}' have '...' (batch axes) "
                "but the output does not; keep '...' in the output, or name "
                "the axes you want summed with letters"
            )

    out_letters = output.replace(_ELLIPSIS, "")
    free = tuple(out_letters)
    all_letters = "".join(in_letters)
    summed = tuple(dict.fromkeys(c for c in all_letters if c not in out_letters))

    n_in = len(inputs)
    if names is None:
        label_names = ("",) * n_in
    else:
        label_names = tuple(str(n) for n in names)
        if len(label_names) != n_in:
            raise AttentionInputError(
                f"einsum '{subscripts}' has {n_in} input spec(s) but "
                f"{len(label_names)} name(s) were given: {label_names}"
            )
    explicit = ",".join(inputs) + "->" + output

    index_sizes = batch = None
    if operands:
        if len(operands) != n_in:
            raise AttentionInputError(
                f"einsum '{subscripts}' has {n_in} input spec(s) "
                f"({', '.join(repr(t) for t in inputs)}) but "
                f"{len(operands)} operand(s) were given"
            )
        index_sizes, batch = _sizes(
            subscripts, inputs, [_shape_of(x) for x in operands], label_names
        )

    return EinsumSpec(
        subscripts=explicit,
        inputs=inputs,
        output=output,
        free=free,
        summed=summed,
        ellipsis=ellipsis,
        implicit=implicit,
        names=label_names,
        index_sizes=index_sizes,
        batch_shape=batch,
    )


def _sizes(
    subscripts: str,
    inputs: tuple[str, ...],
    shapes: list[tuple[int, ...]],
    names: tuple[str, ...],
) -> tuple[tuple[tuple[str, int], ...], tuple[int, ...] | None]:
    """Give every index its size; check agreement and the batch broadcast."""
    seen: dict[str, tuple[int, int, int]] = {}  # letter -> (size, operand, axis)
    batch_shapes: list[tuple[int, tuple[int, ...]]] = []
    for k, (term, shape) in enumerate(zip(inputs, shapes)):
        letters = term.replace(_ELLIPSIS, "")
        has_dots = _ELLIPSIS in term
        n = len(letters)
        if len(shape) < n or (not has_dots and len(shape) != n):
            want = f"at least {n}" if has_dots else f"{n}"
            raise AttentionInputError(
                f"{_label(k, names)} has {len(shape)} axes (shape {shape}) but "
                f"its index string '{term}' needs {want}"
                + ("" if has_dots else "; write '...' for leading batch axes")
            )
        n_batch = len(shape) - n
        if has_dots:
            left = term.index(_ELLIPSIS)
            batch_shapes.append((k, shape[left : left + n_batch]))
            axes = list(range(left)) + list(range(left + n_batch, len(shape)))
        else:
            axes = list(range(len(shape)))
        for c, axis in zip(letters, axes):
            size = shape[axis]
            if c in seen and seen[c][0] != size:
                size0, k0, axis0 = seen[c]
                if k0 == k:
                    where0 = f"axis {axis0} of {_label(k0, names)}"
                    where = f"axis {axis}"
                else:
                    where0, where = _label(k0, names), _label(k, names)
                raise AttentionInputError(
                    f"index {c} has size {size0} in {where0} but {size} in "
                    f"{where} (einsum '{subscripts}'; an index names one axis "
                    "length, so these must match)"
                )
            seen.setdefault(c, (size, k, axis))
    index_sizes = tuple((c, v[0]) for c, v in seen.items())
    if not batch_shapes:
        return index_sizes, None
    ndim = max(len(s) for _, s in batch_shapes)
    batch: list[int] = []
    for pos in range(ndim):
        size, owner = 1, None
        for k, s in batch_shapes:
            p = len(s) - ndim + pos
            if p < 0 or s[p] == 1:
                continue
            if owner is not None and s[p] != size:
                raise AttentionInputError(
                    f"the batch axes '...' do not broadcast in einsum "
                    f"'{subscripts}': {_label(owner, names)} has "
                    f"{dict(batch_shapes)[owner]} but {_label(k, names)} has "
                    f"{s} (batch axis {pos - ndim} is {size} vs {s[p]})"
                )
            size, owner = s[p], k
        batch.append(size)
    return index_sizes, tuple(batch)


# --------------------------------------------------------------------------
# In words
# --------------------------------------------------------------------------


def _indexed(name: str, term: str) -> str:
    """'Q', '...ia' -> 'Q[...,i,a]'; a scalar operand is its bare name."""
    pieces: list[str] = []
    for piece in _split_ellipsis(term):
        pieces.extend([piece] if piece == _ELLIPSIS else list(piece))
    return f"{name}[{','.join(pieces)}]" if pieces else name


def _default_names(n: int, taken: set[str]) -> tuple[str, ...]:
    pool = [c for c in "ABCDEFGHPRUVWXYZ" if c not in taken]
    pool += [f"T{k}" for k in range(n)]
    return tuple(pool[:n])


def explain_einsum(
    subscripts: str, names: Sequence[str] | None = None, out: str = "out"
) -> str:
    """out[free] = sum over the summed indices of the operands' product, in words.

    ``explain_einsum('ia,ab,jb->ij', ('Q', 'g', 'K'), out='S')`` gives
    ``S[i,j] = sum over a, b of Q[i,a] * g[a,b] * K[j,b]: free indices
    i, j (kept); summed indices a, b (contracted).``  Remarks follow for
    batch axes ``...``, diagonals and traces, transposes, outer products
    and shared indices that are kept (batch or head indices).
    """
    spec = parse_einsum(subscripts, names=names)
    n = len(spec.inputs)
    if names is None:
        taken = set("".join(spec.letters(t) for t in spec.inputs))
        names = _default_names(n, taken)
    names = tuple(str(x) for x in names)

    product = " * ".join(_indexed(nm, t) for nm, t in zip(names, spec.inputs))
    if not product:
        product = "1"
    body = f"sum over {', '.join(spec.summed)} of {product}" if spec.summed else product
    lhs = _indexed(out, spec.output)

    batch = "leading batch axes ... broadcast and carried along"
    if spec.free:
        kept = f"free indices {', '.join(spec.free)} (kept)"
        kept += f", with {batch}" if spec.ellipsis else ""
    elif spec.ellipsis:
        kept = f"no free indices, only the {batch}"
    else:
        kept = "no free indices (the result is a scalar)"
    gone = (
        f"summed indices {', '.join(spec.summed)} (contracted)"
        if spec.summed
        else "no summed indices"
    )

    remarks: list[str] = []
    letters = [spec.letters(t) for t in spec.inputs]
    for nm, ls in zip(names, letters):
        for c, k in Counter(ls).items():
            if k > 1:
                remarks.append(
                    f"{c} is repeated within {nm}, so only its diagonal enters"
                )
    one = letters[0] if n == 1 else ""
    if not spec.output and len(one) == 2 and len(set(one)) == 1:
        remarks.append("this is the trace")
    if (
        n == 1
        and not spec.summed
        and len(set(letters[0])) == len(letters[0])
        and spec.letters(spec.output) != letters[0]
    ):
        remarks.append("this is a transpose: the same numbers, axes reordered")
    shared_kept = [c for c in spec.free if sum(c in ls for ls in letters) > 1]
    if n > 1 and not spec.summed and not shared_kept and all(
        len(set(ls)) == len(ls) for ls in letters
    ):
        remarks.append("this is an outer product: no index is shared")
    if shared_kept:
        remarks.append(
            f"{', '.join(shared_kept)} "
            + ("is" if len(shared_kept) == 1 else "are")
            + " shared but kept, so there is one contraction per value "
            "(a batch or head index)"
        )
    tail = "".join(f"; {r}" for r in remarks)
    return f"{lhs} = {body}: {kept}; {gone}{tail}."


# --------------------------------------------------------------------------
# As loops (the oracle) and as code (the fast path)
# --------------------------------------------------------------------------


def loop_einsum(subscripts: str, *arrays: Any) -> np.ndarray:
    """out[free] = sum over the summed indices of the product, as literal loops.

    The Tensor-Puzzles reading of index notation: one Python loop over
    every index (``itertools.product``), one multiply-add per step, on
    float64 NumPy copies.  ``...`` is expanded into spare letters first,
    and a batch axis of length 1 broadcasts.  Slow by design; it is the
    oracle the tests compare :func:`einsum` with.
    """
    spec = parse_einsum(subscripts, *arrays)
    ### BEGIN SOLUTION 1.4
    ops = [np.array(x, dtype=np.float64) for x in arrays]  # copies
    sizes = dict(spec.index_sizes or ())

    # Expand '...' into spare letters, right-aligned as in broadcasting.
    batch = spec.batch_shape or ()
    used = set("".join(spec.letters(t) for t in spec.inputs))
    spare = [c for c in string.ascii_letters if c not in used][: len(batch)]
    if len(spare) < len(batch):
        raise AttentionInputError(
            f"einsum '{subscripts}': too many batch axes to name with spare letters"
        )
    for c, size in zip(spare, batch):
        sizes[c] = size

    def expand(term: str, ndim: int) -> list[str]:
        letters = spec.letters(term)
        if _ELLIPSIS not in term:
            return list(letters)
        left = term.index(_ELLIPSIS)
        n_batch = ndim - len(letters)
        dots = spare[len(spare) - n_batch :] if n_batch else []
        return list(term[:left]) + dots + list(term[left + 3 :])

    # For each operand: its axis letters and which axes broadcast (length 1).
    op_axes = []
    for term, x in zip(spec.inputs, ops):
        axes = expand(term, x.ndim)
        fixed = [x.shape[k] == 1 and sizes[c] != 1 for k, c in enumerate(axes)]
        op_axes.append(list(zip(axes, fixed)))
    out_axes = expand(spec.output, len(batch) + len(spec.free))
    loop_letters = out_axes + [c for c in spec.summed]

    out = np.zeros(tuple(sizes[c] for c in out_axes), dtype=np.float64)
    for values in itertools.product(*(range(sizes[c]) for c in loop_letters)):
        at = dict(zip(loop_letters, values))
        term_value = 1.0
        for x, axes in zip(ops, op_axes):
            term_value *= x[tuple(0 if fixed else at[c] for c, fixed in axes)]
        out[tuple(at[c] for c in out_axes)] += term_value
    return out
    ### END SOLUTION


def einsum(subscripts: str, *arrays: Any, names: Sequence[str] | None = None) -> Any:
    """out[free] = sum over the summed indices of the product, checked, on xp.

    The string is validated by :func:`parse_einsum` first, so a clash says
    which index and which sizes (``index a has size 3 in operand 0 (Q) but 4
    in operand 1 (K)``) instead of a backend traceback; then the backend's
    own ``einsum`` (JAX or MLX) does the work and its array is returned.
    """
    xp = namespace(*arrays)
    arrays = tuple(xp.asarray(x) for x in arrays)
    spec = parse_einsum(subscripts, *arrays, names=names)
    return xp.einsum(spec.subscripts, *arrays)


# --------------------------------------------------------------------------
# The book's contractions
# --------------------------------------------------------------------------


class EinsumEntry(NamedTuple):
    """One contraction of the book: the einsum string, the formula, in words."""

    subscripts: str
    formula: str  # index notation; its index groups spell out the subscripts
    words: str


ATTENTION_EINSUMS: dict[str, EinsumEntry] = {
    "dot_product": EinsumEntry(
        "a,a->",
        "s = u^{a} v_{a}",
        "multiply matching components of u and v and add them up",
    ),
    "outer_product": EinsumEntry(
        "a,b->ab",
        "M^{ab} = u^{a} v^{b}",
        "every component of u times every component of v; nothing is summed",
    ),
    "matrix_multiply": EinsumEntry(
        "ij,jk->ik",
        "C^{ik} = A^{ij} B_{j}^{k}",
        "row i of A against column k of B, summed over the shared index j",
    ),
    "transpose": EinsumEntry(
        "ij->ji",
        "B^{ji} = A^{ij}",
        "the same numbers with the two axes swapped",
    ),
    "trace": EinsumEntry(
        "ii->",
        "s = A^{i}_{i}",
        "the diagonal of a square matrix, added up",
    ),
    # The seed writes 'bij,bjk->bik'; b is a feature index in this book, so
    # the batch axes are written '...' (any number of them, broadcast).
    "batch_matmul": EinsumEntry(
        "...ij,...jk->...ik",
        "C^{...ik} = A^{...ij} B^{...jk}",
        "one matrix product per batch element; the batch axes are kept",
    ),
    "scores": EinsumEntry(
        "ia,ja->ij",
        "S^{ij} = Q^{ia} K^{ja}",
        "query i against key j, summed over the feature index a "
        "(scaled by 1/sqrt(d_k) afterwards)",
    ),
    "bilinear_scores": EinsumEntry(
        "ia,ab,jb->ij",
        "S^{ij} = Q^{ia} g_{ab} K^{jb}",
        "query i and key j through the metric g, summed over a and b",
    ),
    "output": EinsumEntry(
        "ij,jb->ib",
        "O^{ib} = A^{ij} V^{jb}",
        "each query's output is the weighted sum of the value rows over keys j",
    ),
    "multihead_projection": EinsumEntry(
        "id,hda->hia",
        "Q^{hia} = X^{id} W_Q^{hda}",
        "project every token i into each head h, summed over the model index d",
    ),
    "multihead_scores": EinsumEntry(
        "hia,hja->hij",
        "S^{hij} = Q^{hia} K^{hja}",
        "one score matrix per head h, summed over the head's features a",
    ),
    "head_outputs": EinsumEntry(
        "hij,hjc->hic",
        "O^{hic} = A^{hij} V^{hjc}",
        "one weighted sum of values per head h, summed over keys j",
    ),
    "head_combination": EinsumEntry(
        "hic,hcd->id",
        "Y^{id} = O^{hic} W_O^{hcd}",
        "map every head back to the model space and add the heads: "
        "summed over h and c",
    ),
}
