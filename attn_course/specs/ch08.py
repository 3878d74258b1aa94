"""Chapter 8, Hopfield Networks: exercises 8.1-8.4 (module ``hopfield``).

The asynchronous sweep (8.2) is graded on integer-valued weights, so every
local field ``h_i = W_{ij} s^j`` is an exact integer: ties ``h_i = 0`` are
exact and no case depends on the order of a floating-point sum.  Its cases
are drawn until they show what the statement asks (NumPy loop specs below
are used only to *choose* inputs; expected values come from the reference):
the given order gives a different state from the reversed order and from a
synchronous update, repeated indices matter, and a tie flips a neuron.
"""

from __future__ import annotations

import numpy as np

from ..registry import Case, Exercise
from ._gen import asarray, finite_sum, grad, normal, sizes, with_grad

# -- 8.1 Hebbian weights -------------------------------------------------------------


def _pm1(rng, *shape):
    return rng.choice(np.array([-1.0, 1.0]), size=shape)


def _hebbian_cases(rng, hidden):
    M, N, b = sizes(rng, hidden, (3, 5, 2))
    cases = [
        Case("plain", {"patterns": _pm1(rng, M, N)},
             f"M={M} patterns of N={N} neurons, entries +-1: divide by N, zero diagonal"),
        Case("integer patterns, batch", {"patterns": _pm1(rng, b, M, N).astype(np.int64)},
             f"int64 patterns of shape ({b}, {M}, {N}): a batch axis, and a floating W"),
        Case("real values", {"patterns": normal(rng, M + 3, N, scale=1.5)},
             "real-valued patterns, more patterns than before: the formula, not a +-1 trick"),
        Case("one axis", {"patterns": _pm1(rng, N)},
             "a 1-D argument has no pattern index: raise AttentionInputError"),
    ]
    if hidden:
        bad = _pm1(rng, M, N)
        bad[int(rng.integers(M)), int(rng.integers(N))] = np.nan
        cases.append(Case("non-finite", {"patterns": bad}, "a nan entry: raise AttentionInputError"))
    return cases


# -- 8.2 one asynchronous sweep ---------------------------------------------------------


def _sweep_loop(W, s, order, tie=1.0):
    """Literal loop: s_i <- sign(sum_j W[i, j] s[j]) for i in order (only to choose cases).

    ``tie`` is the value given at h_i = 0 (None: keep the old s_i).
    """
    s = np.array(s, dtype=float)
    ties = []  # (i, old s_i) at each exact tie
    for i in order:
        h = float(np.dot(W[i], s))
        if h == 0.0:
            ties.append((int(i), s[i]))
        s[i] = 1.0 if h > 0 else (-1.0 if h < 0 else (s[i] if tie is None else tie))
    return s, ties


def _sync_loop(W, s):
    h = W @ s
    return np.where(h >= 0, 1.0, -1.0)


def _int_weights(rng, N, high=3):
    """Symmetric integer weights with a zero diagonal (exact fields, exact ties)."""
    A = rng.integers(-high, high + 1, size=(N, N)).astype(float)
    W = np.triu(A, 1)
    return W + W.T


def _draw(rng, make, good, what, tries=2000):
    for _ in range(tries):
        inputs = make()
        if good(**inputs):
            return inputs
    raise RuntimeError(f"no {what} case found in {tries} draws")  # pragma: no cover


def _order_matters(rng, N):
    def make():
        return {"W": _int_weights(rng, N), "s": _pm1(rng, N), "order": rng.permutation(N)}

    def good(W, s, order):
        fwd, _ = _sweep_loop(W, s, order)
        rev, _ = _sweep_loop(W, s, order[::-1])
        return not np.array_equal(fwd, rev) and not np.array_equal(fwd, _sync_loop(W, s))

    return _draw(rng, make, good, "order-dependent")


def _repeats(rng, N):
    """An order with repeats that leaves some neurons out; the repeats change the result."""

    def make():
        order = rng.integers(0, N - 1, size=N + 2)  # neuron N-1 is never updated
        return {"W": _int_weights(rng, N), "s": _pm1(rng, N), "order": order}

    def good(W, s, order):
        fwd, _ = _sweep_loop(W, s, order)
        _, first = np.unique(order, return_index=True)
        once, _ = _sweep_loop(W, s, order[np.sort(first)])  # each neuron once
        return not np.array_equal(fwd, once)

    return _draw(rng, make, good, "repeated-index")


def _tie_batch(rng, N, b):
    """A batch where an exact tie h_i = 0 at s_i = -1 decides the final state."""

    def make():
        W = np.stack([_int_weights(rng, N, high=1) for _ in range(b)])
        return {"W": W, "s": _pm1(rng, b, N), "order": rng.integers(0, N, size=N + 1)}

    def good(W, s, order):
        decided = False
        for k in range(b):
            plus, ties = _sweep_loop(W[k], s[k], order, tie=1.0)
            minus, _ = _sweep_loop(W[k], s[k], order, tie=-1.0)
            kept, _ = _sweep_loop(W[k], s[k], order, tie=None)
            at_minus = any(old == -1.0 for _, old in ties)
            decided |= at_minus and not np.array_equal(plus, minus) and not np.array_equal(plus, kept)
        return decided

    return _draw(rng, make, good, "tie")


def _sweep_probe(fn, W, s, order):
    """The sweep in the given order and in the reversed order (both must match)."""
    return {"s": fn(W=W, s=s, order=order), "s (order reversed)": fn(W=W, s=s, order=order[::-1])}


def _sweep_cases(rng, hidden):
    (N, b) = sizes(rng, hidden, (6, 2))
    bad = dict(_order_matters(rng, N))
    bad["order"] = np.array([0, N, 1])
    cases = [
        Case("order matters", _order_matters(rng, N),
             f"N={N}, order a permutation: the given order, its reverse and a synchronous "
             "update all end in different states; each update sees the earlier ones"),
        Case("repeated indices", _repeats(rng, N),
             "an order with repeats that skips neuron N-1: a repeated neuron is updated "
             "again from the current state; neurons not in order keep their value"),
        Case("exact tie, batch", _tie_batch(rng, N, b),
             f"W of shape ({b}, {N}, {N}), s of shape ({b}, {N}): an exact tie h_i = 0 at "
             "s_i = -1 must give s_i = +1"),
        Case("index out of range", bad, f"order contains {N}, outside 0..{N - 1}: raise AttentionInputError"),
    ]
    if hidden:
        neg = dict(_order_matters(rng, N))
        neg["order"] = np.array([1, -1])
        two_d = dict(_order_matters(rng, N))
        two_d["order"] = two_d["order"][None, :]
        cases += [
            Case("negative index", neg, "a negative index: raise AttentionInputError"),
            Case("2-D order", two_d, "order must be 1-D: raise AttentionInputError"),
        ]
    return cases


# -- 8.3 and 8.4 the modern network ------------------------------------------------------


def _modern_base(rng, hidden):
    d, M, b = sizes(rng, hidden, (3, 4, 2))
    beta1 = 1.5 if not hidden else float(rng.uniform(0.3, 3.0))
    beta2 = 0.7 if not hidden else float(rng.uniform(0.2, 1.0))
    return d, M, b, beta1, beta2


def _energy_cases(rng, hidden):
    d, M, b, beta1, beta2 = _modern_base(rng, hidden)
    cases = [
        Case("plain", {"xi": normal(rng, d), "X": normal(rng, M, d), "beta": beta1, "constants": False},
             f"one state xi (d={d}), M={M} patterns, beta={beta1:g}; "
             "mind the 1/beta in front of the log-sum-exp"),
        Case("constants, batch",
             {"xi": normal(rng, b, d), "X": normal(rng, b, M, d), "beta": beta2, "constants": True},
             f"a batch of {b} memories, constants=True: + (1/beta) log M + 1/2 max_mu |X^mu|^2"),
        Case("large scores",
             {"xi": normal(rng, d, scale=10.0), "X": normal(rng, M, d, scale=10.0), "beta": 20.0,
              "constants": False},
             "beta X xi in the thousands: exp overflows unless the maximum is subtracted "
             "(use attention's log Z)"),
        Case("beta = 0", {"xi": normal(rng, d), "X": normal(rng, M, d), "beta": 0.0, "constants": False},
             "beta must be positive: raise AttentionInputError"),
    ]
    if hidden:
        cases += [
            Case("beta = inf", {"xi": normal(rng, d), "X": normal(rng, M, d), "beta": float("inf"),
                                "constants": False}, "beta must be finite"),
            Case("d mismatch", {"xi": normal(rng, d + 1), "X": normal(rng, M, d), "beta": 1.0,
                                "constants": True}, "xi and X disagree on index a"),
        ]
    return cases


def _energy_probe(fn, **inputs):
    """E, and the gradient of a weighted sum of E with respect to xi and to beta (traced)."""
    E = fn(**inputs)
    xi = inputs["xi"]

    def loss(x, b):
        return finite_sum(fn(**{**inputs, "xi": x, "beta": b}))

    dxi, dbeta = grad(loss, argnums=(0, 1))(xi, asarray(inputs["beta"], like=xi))
    return {"E": E, "dE/dxi": dxi, "dE/dbeta": dbeta}


def _update_cases(rng, hidden):
    d, M, b, beta1, beta2 = _modern_base(rng, hidden)
    X = normal(rng, M, d, scale=3.0)
    near = X[int(rng.integers(M))] + normal(rng, d, scale=0.3)  # a noisy stored pattern
    cases = [
        Case("plain", {"xi": normal(rng, d), "X": normal(rng, M, d), "beta": beta1},
             f"one state xi (d={d}), M={M} patterns, beta={beta1:g}: T = 1/beta, no 1/sqrt(d)"),
        Case("batch", {"xi": normal(rng, b, d), "X": normal(rng, b, M, d), "beta": beta2},
             f"xi of shape ({b}, {d}) and X of shape ({b}, {M}, {d}): the result has shape ({b}, {d})"),
        Case("large beta", {"xi": near, "X": X, "beta": 100.0},
             "beta = 100 near a stored pattern: beta X xi of order 1e3, exp overflows unless the "
             "maximum is subtracted; the gradient must stay finite"),
        Case("d mismatch", {"xi": normal(rng, d + 1), "X": normal(rng, M, d), "beta": 1.0},
             "xi has one more feature than X (index a): raise AttentionInputError"),
    ]
    if hidden:
        cases += [
            Case("beta < 0", {"xi": normal(rng, d), "X": normal(rng, M, d), "beta": -0.5},
                 "beta must be positive"),
            Case("beta = inf", {"xi": normal(rng, d), "X": normal(rng, M, d), "beta": float("inf")},
                 "beta must be finite"),
        ]
    return cases


EXERCISES = [
    Exercise(
        "8.1", "Hebbian weights", "hopfield.hebbian_weights", _hebbian_cases, points=2,
        hint="Divide by N, the number of neurons (not M), and zero the diagonal by multiplying "
        "with 1 - I instead of writing into the array.",
    ),
    Exercise(
        "8.2", "One asynchronous sweep", "hopfield.classical_async_sweep", _sweep_cases, points=2,
        probe=_sweep_probe,
        hint="Update one neuron at a time from the current, already updated state (sgn(0) = +1); "
        "a synchronous update or a sorted order gives a different state.",
    ),
    Exercise(
        "8.3", "The modern energy", "hopfield.modern_energy", _energy_cases, points=3,
        probe=_energy_probe,
        hint="E = -(log Z)/beta + |xi|^2/2 with log Z from attention (one query xi, T = 1/beta, "
        "scale 1); never compare a traced beta with 0 in Python.",
    ),
    Exercise(
        "8.4", "The Hopfield update", "hopfield.modern_update", _update_cases, points=2,
        probe=with_grad("xi", name="xi_new"),
        hint="Make xi a single query row (xi[..., None, :]), attend with keys = values = X at "
        "T = 1/beta and scale 1, then drop the query axis again.",
    ),
]
