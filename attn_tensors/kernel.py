"""Part IX, Efficient Attention: attention as kernel regression, and linear attention.

Softmax attention is Nadaraya-Watson kernel regression with the exponential
kernel:

    kappa(q, k) = exp(q^a g_{ab} k^b)                 (g_{ab} = delta_{ab}/sqrt(d_k))
    o^{ib} = sum_j kappa(q_i, k_j) V^{jb} / sum_j kappa(q_i, k_j)

If the kernel factors through a feature map, kappa(q, k) ~ phi(q)^c phi(k)^c,
the sums over keys can be done once for all queries:

    o^{ib} = phi(q_i)^c (sum_j phi(k_j)^c V^{jb}) / (phi(q_i)^c sum_j phi(k_j)^c)

which costs O(n d_phi d_v) time and never forms the n x n matrix (linear
attention).  Feature maps here: ``elu_plus_one`` (Katharopoulos et al. 2020)
and the positive random features of the Performer (FAVOR+, Choromanski et al.
2021), whose inner product estimates the exponential kernel without bias.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import (
    AttentionInputError,
    check_finite,
    batch_shape,
    require_match,
    require_ndim,
    require_padding_mask,
    require_qkv,
)
from .attention import attention_scores, scaled_dot_product_attention
from .backend import Backend, namespace
from .masking import _offset as _causal_offset
from .softmax import softmax_and_log_partition

__all__ = [
    "exponential_kernel",
    "gaussian_kernel",
    "nadaraya_watson",
    "elu_plus_one",
    "draw_random_features",
    "positive_random_features",
    "performer_feature_maps",
    "linear_attention",
    "random_feature_error",
]


# -- kernels -------------------------------------------------------------------


def _pairwise(xp: Backend, q: Any, k: Any, log_kernel: Callable, log: bool) -> Any:
    """Apply a pairwise log-kernel to rows (or to two single vectors)."""
    q, k = xp.floating(xp.asarray(q), xp.asarray(k))
    vectors = q.ndim == 1 and k.ndim == 1
    if vectors:
        q, k = q[None, :], k[None, :]
    out = log_kernel(q, k)
    if vectors:
        out = out[0, 0]
    return out if log else xp.exp(out)


def exponential_kernel(q: Any, k: Any, g: Any = None, *, log: bool = False) -> Any:
    """kappa^{ij} = exp(q^{ia} g_{ab} k^{jb}), with g_{ab} = delta_{ab}/sqrt(d_k) by default.

    ``q (..., n_q, d_k)`` and ``k (..., n_k, d_k)`` give ``(..., n_q, n_k)``;
    two vectors give a scalar.  ``log=True`` returns the exponent (the
    attention score), which is what a stable computation needs.
    """
    xp = namespace(q, k, g)
    return _pairwise(xp, q, k, lambda Q, K: attention_scores(Q, K, g), log)


def gaussian_kernel(q: Any, k: Any, sigma: float = 1.0, *, log: bool = False) -> Any:
    """kappa^{ij} = exp(-|q^i - k^j|^2 / (2 sigma^2)), the Gaussian RBF kernel.

    Shapes as in :func:`exponential_kernel`.  The squared distance is
    expanded as |q|^2 + |k|^2 - 2 q.k (no (n_q, n_k, d) intermediate).
    """
    xp = namespace(q, k)
    if not float(sigma) > 0:
        raise AttentionInputError(f"kernel width sigma must be positive; got sigma={sigma}")

    def log_rbf(Q, K):
        require_match("a", ("q", "d_k", Q.shape[-1]), ("k", "d_k", K.shape[-1]))
        # |q^i - k^j|^2 = q^{ia} q^{ia} + k^{ja} k^{ja} - 2 q^{ia} k^{ja}
        qq = xp.sum(Q * Q, axis=-1)[..., :, None]
        kk = xp.sum(K * K, axis=-1)[..., None, :]
        qk = xp.einsum("...ia,...ja->...ij", Q, K)
        dist2 = xp.maximum(qq + kk - 2 * qk, xp.zeros_like(qk))
        return -dist2 / (2.0 * float(sigma) ** 2)

    return _pairwise(xp, q, k, log_rbf, log)


def nadaraya_watson(
    Q: Any,
    K: Any,
    V: Any,
    kernel: Callable = exponential_kernel,
    mask: Any = None,
    **kernel_kwargs: Any,
) -> Any:
    """o^{ib} = sum_j kappa(q_i, k_j) V^{jb} / sum_j kappa(q_i, k_j), computed in log space.

    ``kernel(Q, K, log=True, **kernel_kwargs)`` must return
    ``log kappa (..., n_q, n_k)``; the weights are then the library's stable
    softmax of ``log kappa`` (so with :func:`exponential_kernel` this *is*
    scaled dot-product attention).  ``mask`` is the usual boolean "may
    attend" mask; a query with no admissible key gets 0.
    """
    xp = namespace(Q, K, V, mask)
    Q, K, V = xp.floating(xp.asarray(Q), xp.asarray(K), xp.asarray(V))
    require_ndim(Q, "Q", "ia")
    require_ndim(K, "K", "ja")
    require_ndim(V, "V", "jb")
    require_match("j", ("K", "n_k", K.shape[-2]), ("V", "n_k", V.shape[-2]))
    check_finite(xp, V=V)
    ### BEGIN SOLUTION 9.2
    log_kappa = kernel(Q, K, log=True, **kernel_kwargs)
    # A^{ij} = kappa^{ij} / sum_j kappa^{ij} = exp(log kappa^{ij} - log Z^i)
    A, _ = softmax_and_log_partition(log_kappa, mask, 1.0, xp)
    # o^{ib} = A^{ij} V^{jb}
    return xp.einsum("...ij,...jb->...ib", A, V)
    ### END SOLUTION


# -- feature maps ----------------------------------------------------------------


def elu_plus_one(x: Any) -> Any:
    """phi(x)^c = elu(x^c) + 1 = x^c + 1 for x^c > 0, exp(x^c) otherwise (always positive)."""
    xp = namespace(x)
    (x,) = xp.floating(xp.asarray(x))
    ### BEGIN SOLUTION 9.5
    # exp only sees x <= 0, so neither branch overflows (nor its gradient); a
    # where, not a minimum, so that the derivative at the kink x = 0 is exp(0) = 1
    # on every backend (minimum's derivative at a tie is 1/2 in JAX, 0 in MLX).
    return xp.where(x > 0, x + 1, xp.exp(xp.where(x > 0, xp.zeros_like(x), x)))
    ### END SOLUTION


def _numpy_rng(key: Any) -> np.random.Generator:
    """A NumPy generator seeded by an int, a ``jax.random`` key or a Generator."""
    if isinstance(key, np.random.Generator):
        return key
    if isinstance(key, (int, np.integer)):
        return np.random.default_rng(int(key))
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.random.default_rng([int(v) for v in np.asarray(key).ravel()])


def draw_random_features(
    key: Any,
    m: int,
    d_k: int,
    orthogonal: bool = True,
    *,
    like: Any = None,
    dtype: Any = None,
) -> Any:
    """omega^{ca} ~ N(0, delta_{ab}) for c < m: the random directions of positive random features.

    ``key`` is an int seed, a ``jax.random`` key or a NumPy ``Generator``; it
    seeds a NumPy generator (no compilation per shape), so JAX and MLX see the
    same ``omega`` (``like`` picks the backend and dtype of the result,
    default JAX float64).  With ``orthogonal=True`` the rows come in blocks of
    ``d_k`` mutually orthogonal directions whose lengths are redrawn from the
    chi distribution, so each row is still N(0, I) (orthogonal random
    features: same mean, lower variance).
    """
    m, d_k = int(m), int(d_k)
    if m < 1 or d_k < 1:
        raise AttentionInputError(
            f"need m >= 1 random features of dimension d_k >= 1; got m={m}, d_k={d_k}"
        )
    gen = _numpy_rng(key)
    if not orthogonal:
        omega = gen.standard_normal((m, d_k))
    else:
        n_blocks = -(-m // d_k)
        G = gen.standard_normal((n_blocks, d_k, d_k))
        # Rows of each block: an orthonormal basis of R^{d_k} (QR of a Gaussian
        # matrix, signs fixed by diag(R) so the basis is Haar-distributed).
        Qo, R = np.linalg.qr(G)
        Qo = Qo * np.sign(np.diagonal(R, axis1=-2, axis2=-1))[..., None, :]
        rows = np.swapaxes(Qo, -1, -2).reshape(n_blocks * d_k, d_k)[:m]
        # |omega^c| ~ chi(d_k): the length of a standard Gaussian vector
        lengths = np.linalg.norm(gen.standard_normal((m, d_k)), axis=-1)
        omega = rows * lengths[:, None]
    xp = namespace(like) if like is not None else namespace()
    if dtype is None:
        dtype = xp.result_float(xp.asarray(like)) if like is not None else None
    return xp.asarray(omega, dtype=dtype)


def positive_random_features(X: Any, omega: Any, *, stabilize: bool | str = True) -> Any:
    """phi(x)^c = exp(omega^{ca} x'_a - |x'|^2/2) / sqrt(m),  x' = x / d_k^{1/4}  (FAVOR+).

    ``X (..., n, d_k)``, ``omega (m, d_k)``; returns ``(..., n, m)``.  With
    ``omega`` from :func:`draw_random_features`,
    ``E[phi(q)^c phi(k)^c] = exp(q^a k^a / sqrt(d_k))`` exactly and every
    feature is positive.

    ``stabilize=True`` subtracts the largest exponent of each batch element
    (over its rows and features) before ``exp``: all of that element's
    features get one common factor, which cancels between numerator and
    denominator of linear attention, but not in ``phi(q).phi(k)`` itself --
    pass ``stabilize=False`` for the unbiased kernel estimate.  That is the
    stabiliser for the *keys*, whose factor must be common to all ``j``.

    ``stabilize="rows"`` subtracts each row's own largest exponent
    ``max_c u^{ic}``: the stabiliser for the *queries*.  Row ``i``'s factor
    cancels exactly in its own numerator and denominator, and no row
    underflows to zero however far its exponents sit below the other rows'
    (with the common maximum, a float32 query row whose exponents lie 100
    below it comes back as zeros).  :func:`linear_attention` takes the pair
    ``(phi_q, phi_k)`` for this; :func:`random_feature_error` uses it.
    """
    if stabilize not in (True, False, "rows"):
        raise AttentionInputError(
            f"stabilize must be True, False or 'rows'; got stabilize={stabilize!r}"
        )
    xp = namespace(X, omega)
    X, omega = xp.floating(xp.asarray(X), xp.asarray(omega))
    require_ndim(X, "X", "a")
    require_ndim(omega, "omega", "ca", extra_ok=False)
    require_match("a", ("omega", "d_k", omega.shape[-1]), ("X", "d_k", X.shape[-1]))
    ### BEGIN SOLUTION 9.3
    d_k, m = X.shape[-1], omega.shape[0]
    Xs = X / float(d_k) ** 0.25
    # u^{ic} = omega^{ca} x'^{ia} - |x'^i|^2 / 2
    u = xp.einsum("...a,ca->...c", Xs, omega) - 0.5 * xp.sum(Xs * Xs, axis=-1, keepdims=True)
    if stabilize:
        axes = (-2, -1) if u.ndim >= 2 and stabilize != "rows" else (-1,)
        u = u - xp.stop_gradient(xp.max(u, axis=axes, keepdims=True))
    return xp.exp(u) / float(np.sqrt(m))
    ### END SOLUTION


def performer_feature_maps(omega: Any) -> tuple[Callable, Callable]:
    """(phi_q, phi_k): positive random features stabilised per query row and per key set.

    ``phi_q(X) = positive_random_features(X, omega, stabilize="rows")`` and
    ``phi_k(X) = positive_random_features(X, omega)``: the pair
    :func:`linear_attention` needs for FAVOR+, where each stabilising factor
    cancels exactly (a query row's in its own ratio, the keys' common one in
    every ratio).
    """
    phi_q = functools.partial(positive_random_features, omega=omega, stabilize="rows")
    phi_k = functools.partial(positive_random_features, omega=omega)
    return phi_q, phi_k


# -- linear attention --------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _causal_core(xp: Backend, C: int) -> Callable:
    """_causal_sums compiled once per (shapes, chunk): eager calls reuse it."""
    return xp.compile(lambda phi_q, phi_k, V: _causal_sums(xp, phi_q, phi_k, V, C))


def _causal_sums(xp: Backend, phi_q: Any, phi_k: Any, V: Any, C: int) -> tuple[Any, Any]:
    """num^{ib} = sum_{j<=i} phi_q^{ic} phi_k^{jc} V^{jb},  den^i = sum_{j<=i} phi_q^{ic} phi_k^{jc}

    by a scan over chunks of C positions (see :func:`linear_attention`).
    """
    n_q, n_k = phi_q.shape[-2], phi_k.shape[-2]
    batch = tuple(np.broadcast_shapes(phi_q.shape[:-2], phi_k.shape[:-2], V.shape[:-2]))
    d_phi, d_v = phi_q.shape[-1], V.shape[-1]
    C = min(C, max(n_q, n_k))
    # Pad both to N: zero keys add nothing, padded queries are dropped, and a
    # query i >= n_k sees every key (top-left causality).
    N = -(-max(n_q, n_k) // C) * C

    def chunks(x):
        # (..., n, e) -> (T, ..., C, e): chunk t first
        x = xp.broadcast_to(x, batch + tuple(x.shape[-2:]))
        x = xp.pad(x, [(0, 0)] * len(batch) + [(0, N - x.shape[-2]), (0, 0)])
        x = xp.reshape(x, batch + (N // C, C, x.shape[-1]))
        return xp.moveaxis(x, -3, 0)

    q_t, k_t, v_t = chunks(phi_q), chunks(phi_k), chunks(V)
    tril = xp.tril(xp.ones((C, C), dtype=phi_q.dtype))

    def step(carry, t):
        S, z = carry
        q, k, v = q_t[t], k_t[t], v_t[t]
        # inside the chunk: W^{ij} = phi_q^{ic} phi_k^{jc} for j <= i
        W = xp.einsum("...ic,...jc->...ij", q, k) * tril
        # earlier chunks through the running sums U^{cb}, z^c
        num = xp.einsum("...ic,...cb->...ib", q, S) + xp.einsum("...ij,...jb->...ib", W, v)
        den = xp.einsum("...ic,...c->...i", q, z) + xp.sum(W, axis=-1)
        # U^{cb} += phi_k^{jc} V^{jb};  z^c += sum_j phi_k^{jc}
        S = S + xp.einsum("...jc,...jb->...cb", k, v)
        z = z + xp.sum(k, axis=-2)
        return (S, z), (num, den[..., None])

    init = (
        xp.zeros(batch + (d_phi, d_v), dtype=phi_q.dtype),
        xp.zeros(batch + (d_phi,), dtype=phi_q.dtype),
    )
    _, (num, den) = xp.scan(step, init, N // C)

    def unchunk(x):
        x = xp.moveaxis(x, 0, -3)
        return xp.reshape(x, x.shape[:-3] + (N, x.shape[-1]))[..., :n_q, :]

    return unchunk(num), unchunk(den)[..., 0]


def linear_attention(
    Q: Any,
    K: Any,
    V: Any,
    feature_map: Callable = elu_plus_one,
    mask: Any = None,
    *,
    causal: bool = False,
    eps: float = 0.0,
    chunk: int = 64,
    offset: int | None = None,
) -> Any:
    """o^{ib} = phi(q_i)^c (sum_j phi(k_j)^c V^{jb}) / (phi(q_i)^c sum_j phi(k_j)^c + eps).

    ``feature_map`` maps ``(..., n, d_k)`` to positive features
    ``(..., n, d_phi)`` (e.g. :func:`elu_plus_one`, or
    ``functools.partial(positive_random_features, omega=omega)``), or is a
    pair ``(phi_q, phi_k)`` of maps for the queries and the keys: a query
    row may carry any positive factor of its own (it cancels in its ratio),
    the keys only one factor common to all ``j``.  For positive random
    features the pair is :func:`performer_feature_maps`.  Cost
    O(n d_phi d_v): the n x n matrix is never formed.

    ``mask`` is a boolean padding mask ``(..., n_k)`` (True = may attend):
    padded keys get ``phi(k_j) = 0``.  ``causal=True`` sums only keys
    ``j <= i + offset``, ``offset = n_k - n_q`` by default as in
    :func:`attn_tensors.masking.causal_mask` (the last query lines up with
    the last key): a scan over chunks of ``chunk`` positions
    carries the running sums ``U^{cb} = sum_j phi(k_j)^c V^{jb}`` and
    ``z^c = sum_j phi(k_j)^c`` and treats each chunk's own keys with the
    masked (chunk x chunk) formula.  Time stays O(n (chunk + d_phi) d_v);
    memory is O(n (d_phi + d_v)) plus one ``(d_phi, d_v)`` state per chunk
    kept for autodiff -- not the ``(n, d_phi, d_v)`` array of a plain prefix
    sum (``cumsum``).  A query whose denominator is 0 (no admissible key)
    gets 0; ``eps`` (default 0) is the optional regulariser of the
    denominator used by some implementations.
    """
    xp = namespace(Q, K, V, mask)
    Q, K, V = xp.floating(xp.asarray(Q), xp.asarray(K), xp.asarray(V))
    require_qkv(Q, K, V)
    check_finite(xp, Q=Q, K=K, V=V)
    n_q, n_k = Q.shape[-2], K.shape[-2]
    map_q, map_k = feature_map if isinstance(feature_map, tuple) else (feature_map,) * 2
    phi_q, phi_k = map_q(Q), map_k(K)
    require_match(
        "c", ("phi(Q)", "d_phi", phi_q.shape[-1]), ("phi(K)", "d_phi", phi_k.shape[-1])
    )
    if mask is not None:
        batch = batch_shape((Q, 2), (K, 2), (V, 2))
        mask = require_padding_mask(xp, mask, n_k, batch, "linear_attention")
        # padded keys: phi(k_j) = 0, so they add nothing to either sum
        phi_k = xp.where(mask[..., None], phi_k, xp.zeros_like(phi_k))
    if not causal:
        # num^{ib} = phi(q)^{ic} U^{cb} and den^i = phi(q)^{ic} z^c, no (n_q, n_k) array
        ### BEGIN SOLUTION 9.5
        # KV^{cb} = phi(k)^{jc} V^{jb};  z^c = sum_j phi(k)^{jc}
        KV = xp.einsum("...jc,...jb->...cb", phi_k, V)
        z = xp.sum(phi_k, axis=-2)
        # num^{ib} = phi(q)^{ic} KV^{cb};  den^i = phi(q)^{ic} z^c
        num = xp.einsum("...ic,...cb->...ib", phi_q, KV)
        den = xp.einsum("...ic,...c->...i", phi_q, z)
        ### END SOLUTION
    else:
        if int(chunk) < 1:
            raise AttentionInputError(f"chunk size must be >= 1; got chunk={chunk}")
        # Align query i with key position i + offset by padding the front:
        # the core is top-left causal (query t sees keys t' <= t).
        offset = _causal_offset(n_q, n_k, offset)
        lead_q, lead_k = max(offset, 0), max(-offset, 0)
        phi_q = _pad_front(xp, phi_q, lead_q)
        phi_k, V = _pad_front(xp, phi_k, lead_k), _pad_front(xp, V, lead_k)
        num, den = _causal_core(xp, int(chunk))(phi_q, phi_k, V)
        num, den = num[..., lead_q:, :], den[..., lead_q:]
    den = den + eps
    den_safe = xp.where(den == 0, xp.ones_like(den), den)
    return num / den_safe[..., None]


def _pad_front(xp: Backend, x: Any, n: int) -> Any:
    """n zero rows before the position axis (-2): zero features add nothing to the sums."""
    if n == 0:
        return x
    widths = [(0, 0)] * (x.ndim - 2) + [(n, 0), (0, 0)]
    return xp.pad(x, widths)


def random_feature_error(
    Q: Any,
    K: Any,
    V: Any,
    m_list: Sequence[int],
    key: Any,
    *,
    orthogonal: bool = True,
    n_draws: int = 4,
) -> Any:
    """err(m) = |O_m - O|_F / |O|_F: Performer with m random features vs exact softmax attention.

    ``O`` is :func:`attn_tensors.scaled_dot_product_attention`, ``O_m`` is
    :func:`linear_attention` with :func:`positive_random_features` of ``m``
    features; the error is averaged over ``n_draws`` independent draws of
    ``omega``.  Returns an array of shape ``(len(m_list),)`` on the backend
    of ``Q`` (``key``: int seed, ``jax.random`` key or NumPy Generator).
    """
    xp = namespace(Q, K, V)
    Q, K, V = xp.floating(xp.asarray(Q), xp.asarray(K), xp.asarray(V))
    d_k = Q.shape[-1]
    O = scaled_dot_product_attention(Q, K, V)
    seeds = _numpy_rng(key).integers(2**63, size=(len(m_list), int(n_draws)))

    def error(Q, K, V, O, omega):
        diff = linear_attention(Q, K, V, performer_feature_maps(omega)) - O
        return xp.sqrt(xp.sum(diff * diff)) / xp.sqrt(xp.sum(O * O))

    error = xp.compile(error)  # one compilation per m instead of one per op
    errors = []
    for r, m in enumerate(m_list):
        err = xp.zeros((), dtype=O.dtype)
        for t in range(int(n_draws)):
            omega = draw_random_features(int(seeds[r, t]), int(m), d_k, orthogonal, like=Q)
            err = err + error(Q, K, V, O, omega)
        errors.append(err / int(n_draws))
    return xp.stack(errors)
