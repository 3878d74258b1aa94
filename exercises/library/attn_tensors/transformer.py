"""A minimal transformer built from the library's attention (Parts VI, VII, X).

The pieces, each a pure function with the book's index letters (positions
``i, j``, model features ``d, e``, heads ``h``, the hidden features of the
feed-forward layer ``f``):

* :func:`sinusoidal_positions`: ``P^{i,2m} = sin(i theta_m)``,
  ``P^{i,2m+1} = cos(i theta_m)`` with the rotary frequencies
  ``theta_m = base^(-2m/d)``, positions counted from 0;
* :func:`layer_norm`: ``(X^{id} - mu^i) / sigma^i * gamma_d + beta_d``;
* :func:`feed_forward`: ``relu(X^{id} W_1^{df} + b_1^f) W_2^{fe} + b_2^e``;
* :func:`block`: one pre-norm transformer block on the residual stream,
  ``X <- X + MHA(LN(X))``, ``X <- X + FFN(LN(X))``, with
  :func:`attn_tensors.multihead.multihead_decomposition` as its attention;
* :func:`forward`: token and position embeddings, the blocks, a final norm
  and the unembedding, returning the logits and every block's attention
  weights ``A^{hij}``.

The forward pieces run on JAX and MLX arrays alike (the backend follows the
arrays).  The training helpers at the end (:func:`init_params`,
:func:`copy_task`, :func:`train`) are JAX only: a seeded copying task and a
hand-written Adam, small enough to train in seconds on a CPU while the book
builds (Part X).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import multihead as mh
from ._checks import AttentionInputError
from .backend import namespace, namespace_for
from .masking import causal_mask

__all__ = [
    "BlockParams",
    "ModelOutput",
    "sinusoidal_positions",
    "layer_norm",
    "feed_forward",
    "block",
    "forward",
    "init_params",
    "copy_task",
    "cross_entropy",
    "train",
]


# -- positions --------------------------------------------------------------------
def sinusoidal_positions(
    n: int, d: int, base: float = 10000.0, *, like: Any = None, dtype: Any = None
) -> Any:
    """P^{i,2m} = sin(i theta_m), P^{i,2m+1} = cos(i theta_m), theta_m = base^(-2m/d).

    Positions ``i = 0 .. n-1``; ``d`` must be even.  Row ``i + r`` is row
    ``i`` with each feature pair ``(2m, 2m+1)`` turned by the angle
    ``r theta_m``, so ``P^{id} P^{jd} = sum_m cos((i - j) theta_m)`` depends
    on ``i - j`` only: the same frequencies as the rotary embedding.
    """
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise AttentionInputError(f"n (index i, the number of positions) must be >= 1; got {n!r}")
    if not (isinstance(d, (int, np.integer)) and d >= 2 and d % 2 == 0):
        raise AttentionInputError(
            f"d (index d, the model features) must be even and >= 2 to pair features; got {d!r}"
        )
    xp = namespace_for(like)
    theta = float(base) ** (-2.0 * np.arange(d // 2) / d)  # theta_m
    phi = np.arange(n)[:, None] * theta[None, :]  # phi^{im} = i theta_m
    P = np.stack([np.sin(phi), np.cos(phi)], axis=-1).reshape(n, d)  # interleave pairs
    return xp.asarray(P, dtype=xp.default_float(like, dtype))


# -- the two sublayers --------------------------------------------------------------
def layer_norm(X: Any, gamma: Any, beta: Any, eps: float = 1e-5) -> Any:
    """Y^{id} = (X^{id} - mu^i) / sqrt(var^i + eps) gamma_d + beta_d, over the features d."""
    xp = namespace(X, gamma, beta)
    d = X.shape[-1]
    if gamma.shape[-1] != d or beta.shape[-1] != d:
        raise AttentionInputError(
            f"gamma and beta must have d={d} entries (index d, the features of X); "
            f"got {tuple(gamma.shape)} and {tuple(beta.shape)}"
        )
    mu = xp.mean(X, axis=-1, keepdims=True)  # mu^i
    var = xp.mean((X - mu) ** 2, axis=-1, keepdims=True)  # var^i
    return (X - mu) / xp.sqrt(var + eps) * gamma + beta


def feed_forward(X: Any, W_1: Any, b_1: Any, W_2: Any, b_2: Any) -> Any:
    """Y^{ie} = relu(X^{id} W_1^{df} + b_1^f) W_2^{fe} + b_2^e: the same MLP at every position i."""
    xp = namespace(X, W_1, W_2)
    if W_1.shape[0] != X.shape[-1] or W_2.shape[0] != W_1.shape[-1]:
        raise AttentionInputError(
            f"W_1 must be (d={X.shape[-1]}, f) and W_2 (f={W_1.shape[-1]}, e) "
            f"(indices d and f must match); got {tuple(W_1.shape)} and {tuple(W_2.shape)}"
        )
    # hidden^{if} = X^{id} W_1^{df} + b_1^f
    hidden = xp.einsum("...id,df->...if", X, W_1) + b_1
    return xp.einsum("...if,fe->...ie", xp.maximum(hidden, 0), W_2) + b_2


class BlockParams(NamedTuple):
    """The weights of one block; the attention's have the shapes of :mod:`multihead`."""

    W_Q: Any  # W_Q^{hda}  (H, d_model, d_k)
    W_K: Any  # W_K^{hda}  (H, d_model, d_k)
    W_V: Any  # W_V^{hdc}  (H, d_model, d_v)
    W_O: Any  # W_O^{hcd}  (H, d_v, d_model)
    ln1: tuple  # (gamma_d, beta_d) before attention
    ln2: tuple  # (gamma_d, beta_d) before the feed-forward layer
    W_1: Any  # W_1^{df}
    b_1: Any  # b_1^f
    W_2: Any  # W_2^{fd}
    b_2: Any  # b_2^d


def block(p: BlockParams, X: Any, mask: Any = None) -> tuple[Any, Any]:
    """X' = X + MHA(LN_1(X)),  X'' = X' + FFN(LN_2(X')): one pre-norm block.

    Returns ``(X'', A)`` with the attention weights ``A^{hij}``.  ``mask`` is a
    "may attend" mask for the scores ``(..., H, n, n)``, as in
    :func:`attn_tensors.multihead.multihead_attention`.
    """
    parts = mh.multihead_decomposition(layer_norm(X, *p.ln1), p.W_Q, p.W_K, p.W_V, p.W_O, mask=mask)
    X = X + parts.Y  # the attention writes into the residual stream
    X = X + feed_forward(layer_norm(X, *p.ln2), p.W_1, p.b_1, p.W_2, p.b_2)
    return X, parts.A


class ModelOutput(NamedTuple):
    """What :func:`forward` returns: logits, attention weights, residual stream."""

    logits: Any  # logits^{iv}  (..., n, vocab)
    attention: list  # one A^{hij} (..., H, n, n) per block
    residual: list  # the residual stream X^{id} before each block, then after the last


def forward(params: dict, tokens: Any, *, causal: bool = True) -> ModelOutput:
    """logits^{iv} = LN(X_L)^{id} U^{dv}, X_0^{id} = E^{t_i d} + P^{id}, X_{l+1} = block_l(X_l).

    ``params`` holds ``embed (vocab, d_model)``, ``unembed (d_model, vocab)``,
    ``ln_f (gamma, beta)``, ``blocks`` (a list of :class:`BlockParams`) and
    ``positions (n_max, d_model)`` (learned or :func:`sinusoidal_positions`).
    ``tokens`` are integers ``(..., n)`` with ``n <= n_max``.
    """
    xp = namespace(params["embed"])
    tokens = xp.asarray(tokens)
    n = tokens.shape[-1]
    if n > params["positions"].shape[0]:
        raise AttentionInputError(
            f"tokens have n={n} positions (index i) but the model has "
            f"{params['positions'].shape[0]} position rows"
        )
    X = params["embed"][tokens] + params["positions"][:n]  # X_0^{id}
    mask = causal_mask(n, like=X) if causal else None
    stream, maps = [X], []
    for p in params["blocks"]:
        X, A = block(p, X, mask)
        stream.append(X)
        maps.append(A)
    logits = xp.einsum("...id,dv->...iv", layer_norm(X, *params["ln_f"]), params["unembed"])
    return ModelOutput(logits, maps, stream)


# -- training (JAX only) --------------------------------------------------------------
def init_params(
    key: Any,
    *,
    vocab: int,
    n_max: int,
    d_model: int = 32,
    H: int = 2,
    d_k: int = 8,
    d_ff: int = 64,
    n_blocks: int = 1,
    positions: str = "learned",
    dtype: Any = "float32",
) -> dict:
    """Random initial weights (JAX); ``positions`` is ``"learned"`` or ``"sinusoidal"``."""
    import jax
    import jax.numpy as jnp

    if positions not in ("learned", "sinusoidal"):
        raise AttentionInputError(f"positions must be 'learned' or 'sinusoidal'; got {positions!r}")
    keys = iter(jax.random.split(key, 4 + 6 * n_blocks))

    def normal(shape, fan_in=1):
        return jax.random.normal(next(keys), shape, dtype) / float(np.sqrt(fan_in))

    ones, zeros = jnp.ones(d_model, dtype), jnp.zeros(d_model, dtype)
    blocks = [
        BlockParams(
            W_Q=normal((H, d_model, d_k), d_model),
            W_K=normal((H, d_model, d_k), d_model),
            W_V=normal((H, d_model, d_k), d_model),
            W_O=normal((H, d_k, d_model), H * d_k),
            ln1=(ones, zeros),
            ln2=(ones, zeros),
            W_1=normal((d_model, d_ff), d_model),
            b_1=jnp.zeros(d_ff, dtype),
            W_2=normal((d_ff, d_model), d_ff),
            b_2=zeros,
        )
        for _ in range(n_blocks)
    ]
    P = (
        0.1 * normal((n_max, d_model))
        if positions == "learned"
        else sinusoidal_positions(n_max, d_model, dtype=dtype)
    )
    return {
        "embed": normal((vocab, d_model)),
        "positions": P,
        "blocks": blocks,
        "ln_f": (ones, zeros),
        "unembed": normal((d_model, vocab), d_model),
    }


def copy_task(key: Any, batch: int, m: int, vocab: int) -> tuple[Any, Any, Any]:
    """Sequences ``x_1..x_m, SEP, x_1..x_m`` (SEP = vocab - 1; x from 0..vocab-2).

    Returns ``(tokens, targets, weight)``, each ``(batch, 2m + 1)`` but the last
    position dropped: the target at position ``i`` is the token at ``i + 1``, and
    ``weight`` is 1 where that target is a copied token (positions ``m .. 2m-1``)
    and 0 elsewhere, since the first half is random and cannot be predicted.
    """
    import jax
    import jax.numpy as jnp

    x = jax.random.randint(key, (batch, m), 0, vocab - 1)
    sep = jnp.full((batch, 1), vocab - 1)
    seq = jnp.concatenate([x, sep, x], axis=1)  # (batch, 2m + 1)
    tokens, targets = seq[:, :-1], seq[:, 1:]
    weight = jnp.broadcast_to((jnp.arange(2 * m) >= m).astype(jnp.float32), (batch, 2 * m))
    return tokens, targets, weight


def cross_entropy(logits: Any, targets: Any, weight: Any) -> Any:
    """L = -sum_i w_i log softmax(logits^i)_{t_i} / sum_i w_i (JAX)."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return -jnp.sum(weight * picked) / jnp.sum(weight)


def train(
    params: dict,
    *,
    steps: int,
    m: int,
    vocab: int,
    batch: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    train_positions: bool = True,
) -> tuple[dict, np.ndarray]:
    """Adam (beta1 = 0.9, beta2 = 0.999, eps = 1e-8) on fresh copy-task batches (JAX).

    Returns the trained parameters and the loss of every step.  With
    ``train_positions=False`` the position rows stay as given (for fixed
    sinusoidal positions).
    """
    import jax
    import jax.numpy as jnp

    b1, b2, eps = 0.9, 0.999, 1e-8
    fixed = {} if train_positions else {"positions": params["positions"]}
    trainable = {k: v for k, v in params.items() if k not in fixed}

    def loss_fn(tp, tokens, targets, weight):
        return cross_entropy(forward({**tp, **fixed}, tokens).logits, targets, weight)

    @jax.jit
    def step(state, key):
        tp, mom, vel, t = state
        tokens, targets, weight = copy_task(key, batch, m, vocab)
        loss, g = jax.value_and_grad(loss_fn)(tp, tokens, targets, weight)
        loss = loss.astype(jnp.float32)
        t = t + 1
        mom = jax.tree_util.tree_map(lambda a, b: b1 * a + (1 - b1) * b, mom, g)
        vel = jax.tree_util.tree_map(lambda a, b: b2 * a + (1 - b2) * b * b, vel, g)
        c1, c2 = 1 - b1**t, 1 - b2**t
        tp = jax.tree_util.tree_map(
            lambda w, a, v: (w - lr * (a / c1) / (jnp.sqrt(v / c2) + eps)).astype(w.dtype),
            tp,
            mom,
            vel,
        )
        return (tp, mom, vel, t), loss

    zeros = jax.tree_util.tree_map(jnp.zeros_like, trainable)
    keys = jax.random.split(jax.random.PRNGKey(seed), steps)
    (trainable, _, _, _), losses = jax.lax.scan(step, (trainable, zeros, zeros, 0.0), keys)
    return {**trainable, **fixed}, np.asarray(losses)
