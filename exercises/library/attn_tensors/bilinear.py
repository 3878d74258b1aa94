"""Part I, Foundations: metric tensors, index gymnastics and bilinear forms.

Index letters follow the book: ``a b c`` are feature indices, ``i`` queries,
``j`` keys.  Any leading axes before the named ones are batch axes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._checks import (
    AttentionInputError,
    batch_shape,
    require_match,
    require_ndim,
    require_square,
)
from .backend import namespace, namespace_for

__all__ = [
    "euclidean_metric",
    "scaled_euclidean_metric",
    "learned_metric",
    "diagonal_metric",
    "general_metric",
    "inverse_metric",
    "lower_index",
    "raise_index",
    "bilinear_form",
    "quadratic_form",
    "bilinear_form_batch",
    "MetricReport",
    "check_metric",
    "is_positive_definite",
]


def euclidean_metric(d: int, *, like: Any = None, dtype: Any = None) -> Any:
    """g_{ab} = delta_{ab}: the standard dot product on R^d.

    ``like`` picks the backend (pass an MLX array to get an MLX metric).
    """
    xp = namespace_for(like)
    if int(d) < 1:
        raise AttentionInputError(f"metric dimension d must be >= 1; got d={d}")
    return xp.eye(int(d), dtype=xp.default_float(like, dtype))


def scaled_euclidean_metric(d: int, *, like: Any = None, dtype: Any = None) -> Any:
    """g_{ab} = delta_{ab} / sqrt(d): the metric hidden in scaled dot-product attention."""
    g = euclidean_metric(d, like=like, dtype=dtype)
    return g / float(np.sqrt(int(d)))


def learned_metric(W: Any) -> Any:
    """g_{ab} = W^{c}_{a} W_{cb} = (W^T W)_{ab}: positive semi-definite, rank <= rows of W.

    ``W`` has shape ``(..., r, d)``; the metric has shape ``(..., d, d)``.
    With ``r < d`` the metric is rank-deficient (see :func:`check_metric`).
    """
    xp = namespace(W)
    (W,) = xp.floating(xp.asarray(W))
    require_ndim(W, "W", "ca")
    raise NotImplementedError('Exercise 1.2: implement learned_metric (The learned metric); run `attn-course check 1.2`')


def diagonal_metric(w: Any) -> Any:
    """g_{ab} = w_a delta_{ab}: one positive weight per feature."""
    xp = namespace(w)
    (w,) = xp.floating(xp.asarray(w))
    require_ndim(w, "w", "a")
    d = w.shape[-1]
    # g_{ab} = w_a delta_{ab}
    return xp.einsum("...a,ab->...ab", w, xp.eye(d, dtype=w.dtype))


def general_metric(M: Any) -> Any:
    """g_{ab} = (M_{ab} + M_{ba}) / 2: the symmetric part of any square matrix.

    Only the symmetric part of ``M`` enters a quadratic form v^a M_{ab} v^b.
    Whether the result is a true (positive-definite) metric is for
    :func:`check_metric` to say.
    """
    xp = namespace(M)
    (M,) = xp.floating(xp.asarray(M))
    require_square(M, "M")
    return (M + xp.swap_last(M)) / 2


def inverse_metric(g: Any) -> Any:
    """g^{ab} with g^{ac} g_{cb} = delta^a_b."""
    xp = namespace(g)
    (g,) = xp.floating(xp.asarray(g))
    require_square(g, "g")
    return xp.inv(g)


def lower_index(v: Any, g: Any) -> Any:
    """v_a = g_{ab} v^b (vector to covector)."""
    xp = namespace(v, g)
    v, g = xp.floating(xp.asarray(v), xp.asarray(g))
    require_ndim(v, "v", "b")
    require_square(g, "g")
    raise NotImplementedError('Exercise 1.1: implement lower_index (Lowering an index); run `attn-course check 1.1`')


def raise_index(u: Any, g: Any) -> Any:
    """v^a = g^{ab} u_b (covector to vector), by solving g_{ab} v^b = u_a.

    Takes the metric ``g`` itself (not its inverse) and never forms g^{ab}.
    """
    xp = namespace(u, g)
    u, g = xp.floating(xp.asarray(u), xp.asarray(g))
    require_ndim(u, "u", "b")
    require_square(g, "g")
    require_match("b", ("g", "d", g.shape[-1]), ("u", "d", u.shape[-1]))
    shape = batch_shape((g, 2), (u, 1))
    g_b = xp.broadcast_to(g, shape + tuple(g.shape[-2:]))
    u_b = xp.broadcast_to(u, shape + (u.shape[-1],))
    return xp.solve(g_b, u_b[..., None])[..., 0]


def bilinear_form(u: Any, v: Any, M: Any) -> Any:
    """B(u, v) = u^a M_{ab} v^b (one number per leading batch index)."""
    xp = namespace(u, v, M)
    u, v, M = xp.floating(xp.asarray(u), xp.asarray(v), xp.asarray(M))
    require_ndim(u, "u", "a")
    require_ndim(v, "v", "b")
    require_ndim(M, "M", "ab")
    require_match("a", ("M", "rows", M.shape[-2]), ("u", "d", u.shape[-1]))
    require_match("b", ("M", "columns", M.shape[-1]), ("v", "d", v.shape[-1]))
    batch_shape((u, 1), (M, 2), (v, 1))
    # B = u^a M_{ab} v^b
    return xp.einsum("...a,...ab,...b->...", u, M, v)


def quadratic_form(v: Any, M: Any) -> Any:
    """q(v) = v^a M_{ab} v^b = B(v, v): the squared length when M is a metric."""
    return bilinear_form(v, v, M)


def bilinear_form_batch(Q: Any, K: Any, g: Any) -> Any:
    """Batch bilinear form for attention scores: S^{ij} = Q^{ia} g_{ab} K^{jb}."""
    xp = namespace(Q, K, g)
    Q, K, g = xp.floating(xp.asarray(Q), xp.asarray(K), xp.asarray(g))
    require_ndim(Q, "Q", "ia")
    require_ndim(K, "K", "jb")
    require_ndim(g, "g", "ab")
    raise NotImplementedError('Exercise 1.3: implement bilinear_form_batch (Batched bilinear scores); run `attn-course check 1.3`')


@dataclass(frozen=True)
class MetricReport:
    """What :func:`check_metric` found about a candidate metric g_{ab}."""

    d: int
    symmetric: bool
    rank: int
    min_eigenvalue: float
    max_eigenvalue: float
    kind: str

    @property
    def positive_definite(self) -> bool:
        return self.kind == "positive definite"

    def __str__(self) -> str:
        return (
            f"{self.kind} (d={self.d}, rank={self.rank}, eigenvalues in "
            f"[{self.min_eigenvalue:.3g}, {self.max_eigenvalue:.3g}])"
        )


def check_metric(g: Any, rtol: float | None = None) -> MetricReport:
    """Classify g_{ab}: positive definite, positive semi-definite (rank r < d),
    indefinite, or not symmetric.

    Eigenvalues below ``rtol * max|eigenvalue|`` count as zero; the default
    tolerance is ``d * eps`` of the dtype, as for a numerical rank.  A learned
    metric W^T W with fewer rows than columns is reported as
    "positive semi-definite (rank r < d)", never as positive definite.
    """
    xp = namespace(g)
    (g,) = xp.floating(xp.asarray(g))
    require_square(g, "g")
    if g.ndim != 2:
        raise AttentionInputError(
            f"check_metric takes one metric of shape (d, d); got shape {tuple(g.shape)}"
        )
    raise NotImplementedError('Exercise 1.5: implement check_metric (Classifying a candidate metric); run `attn-course check 1.5`')


def is_positive_definite(g: Any, rtol: float | None = None) -> bool:
    """True when g_{ab} is symmetric with all eigenvalues above tolerance."""
    return check_metric(g, rtol).positive_definite
