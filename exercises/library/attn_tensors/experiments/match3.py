"""Part VII experiment: Match3, where third-order attention beats standard attention.

The task (Sanford, Hsu and Telgarsky 2023).  A sequence ``x_1 .. x_S`` of
integers mod ``M``; the target of position ``i`` is

    y_i = 1  iff  there are positions j, k with x_i + x_j + x_k = 0 (mod M)

(``j`` and ``k`` range over all positions: ``j = k`` and ``i`` itself are
allowed).  Standard attention scores single keys, S^{ij}; a pair (j, k) can
only enter output ``i`` as A^{ij} V^j + A^{ik} V^k, with no term coupling
x_j and x_k.  Sanford et al. prove that one standard layer needs a width (or
number of heads) polynomial in ``S`` for Match3, while a third-order layer
solves it at constant width.

Why a trilinear form sees it.  For a harmonic ``h`` put z = exp(2 pi i h x/M)
and store it as the real 2-vector (cos, sin).  A match makes z_i z_j z_k = 1,
and with z_i = a + ib, z_j = c + id, z_k = e + if

    Re(z_i z_j z_k) = a c e - a d f - b c f - b d e = sum_{t=1..4} Q^t K1^t K2^t,
    Q = (a, -a, -b, -b),   K1 = (c, d, c, d),   K2 = (e, f, f, e),

which is exactly the diagonal trilinear form S^{ijk} = Q^{ia} K1^{ja} K2^{ka}
of 2-simplicial attention, four feature slots per harmonic.  One harmonic
peaks at a match only barely (cos(2 pi/M) is close to 1), so a width ``d``
holds ``d // 4`` harmonics whose sum K(s) = sum_h cos(2 pi h s/M), with
s = x_i + x_j + x_k, is ``d // 4`` at s = 0 (mod M) and at most ``K_max``
elsewhere; :func:`best_harmonics` picks the set with the largest gap (for
M = 29 and d = 16: 4 against 0.97).  At a low temperature the pair softmax
puts its weight on matching pairs whenever one exists.  The values
V1 = K1, V2 = K2 make V1^{jt} V2^{kt} = (ce, df, cf, de), the real and
imaginary parts of z_j z_k, so a bilinear readout sum_h Re(z_i^h w_h) of the
output recovers K(s) at the attended pairs; it is thresholded halfway between
``K_max`` and ``d // 4``.  :func:`constructed_accuracy` runs this hand-built
layer through :func:`attn_tensors.variants.two_simplicial_attention`.

The experiment.  Both layers get the same input, the Fourier features of x
(all harmonics 1 .. (M-1)//2, a lossless encoding in which the group Z_M acts
linearly), the same width ``d`` and one head, the same readout (a ReLU MLP on
the token's features and the layer's output), the same hand-written Adam, the
same batches and the same number of steps.  Only the attention differs:

    standard      O^{ic} = softmax_j(Q^{ia} K^{ja} / sqrt(d)) V^{jc}
    2-simplicial  O^{ic} = softmax_{(j,k)}(Q^{ia} K1^{ja} K2^{ka} / sqrt(d)) V1^{jc} V2^{kc}

Everything is seeded; :func:`run_match3` returns a report (a dict of Python
numbers) and :func:`format_table` prints it.  JAX only (training uses
``jax.grad`` and ``jax.jit``), float32 whether or not x64 is enabled.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..attention import scaled_dot_product_attention
from ..variants import two_simplicial_attention

__all__ = [
    "Match3Config",
    "match3_labels",
    "match3_data",
    "fourier_features",
    "best_harmonics",
    "constructed_accuracy",
    "init_params",
    "layer_output",
    "train_layer",
    "run_match3",
    "format_table",
    "KINDS",
]

KINDS = ("standard", "two_simplicial")
_F32 = jnp.float32


@dataclass(frozen=True)
class Match3Config:
    """Sizes and training settings (the defaults run in well under a minute on 2 cores)."""

    S: int = 6  # sequence length
    M: int = 29  # modulus
    d: int = 16  # attention width (Q, K, V columns), one head
    hidden: int = 64  # readout MLP width
    steps: int = 3000  # Adam steps per model
    batch: int = 256
    lr: float = 1e-2  # peak learning rate, cosine decay to 0
    n_train: int = 20000  # training sequences
    n_test: int = 4000  # test sequences
    seed: int = 0


# -- data ----------------------------------------------------------------------
def match3_labels(x: np.ndarray, M: int) -> np.ndarray:
    """y_i = [exists j, k: x_i + x_j + x_k = 0 (mod M)], for x of shape (..., S)."""
    x = np.asarray(x)
    pair = (x[..., :, None] + x[..., None, :]) % M  # x_j + x_k, shape (..., S, S)
    pair = pair.reshape(x.shape[:-1] + (1, -1))  # (..., 1, S*S)
    need = (-x[..., :, None]) % M  # the pair sum position i needs, (..., S, 1)
    return np.any(pair == need, axis=-1)


def match3_data(n: int, S: int, M: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n sequences of S integers uniform in 0..M-1, and their Match3 targets."""
    x = rng.integers(0, M, size=(n, S))
    return x, match3_labels(x, M)


def fourier_features(x: np.ndarray, M: int, harmonics: Any = None) -> np.ndarray:
    """phi(x) = (cos(2 pi h x/M), sin(2 pi h x/M)) for each harmonic h, pairs side by side.

    Default harmonics ``1 .. (M-1)//2``.  Returns float32 of shape
    ``x.shape + (2 * n_harmonics,)``, the block of harmonic ``h`` at columns
    ``(2t, 2t+1)`` for the t-th harmonic.
    """
    h = np.arange(1, (M - 1) // 2 + 1) if harmonics is None else np.asarray(harmonics)
    angle = 2.0 * np.pi * np.asarray(x)[..., None] * h / M  # (..., H)
    phi = np.stack([np.cos(angle), np.sin(angle)], axis=-1)  # (..., H, 2)
    return phi.reshape(phi.shape[:-2] + (-1,)).astype(np.float32)


# -- the hand-built 2-simplicial layer -------------------------------------------
def best_harmonics(M: int, n: int) -> tuple[tuple[int, ...], float]:
    """The n harmonics h that maximise n - max_{s != 0} sum_h cos(2 pi h s / M), and that max."""
    s = np.arange(1, M)
    best: tuple[float, tuple[int, ...]] = (-np.inf, ())
    for hs in itertools.combinations(range(1, (M - 1) // 2 + 1), n):
        k_max = float(np.cos(2 * np.pi * np.outer(s, hs) / M).sum(axis=1).max())
        if n - k_max > best[0] + 1e-12:
            best = (n - k_max, hs)
    return best[1], n - best[0]


def constructed_accuracy(
    x: np.ndarray, y: np.ndarray, M: int, d: int = 16, beta: float = 10.0
) -> float:
    """Accuracy of the hand-built width-d 2-simplicial layer (module docstring) on (x, y).

    Report-style: returns a Python float.
    """
    n_h = d // 4
    hs, k_max = best_harmonics(M, n_h)
    phi = fourier_features(x, M, hs).astype(np.float64)  # (..., S, 2 n_h)
    a, b = phi[..., 0::2], phi[..., 1::2]  # cos and sin of each harmonic
    # four slots per harmonic (module docstring)
    Q = np.stack([a, -a, -b, -b], axis=-1).reshape(a.shape[:-1] + (-1,))
    K1 = np.stack([a, b, a, b], axis=-1).reshape(a.shape[:-1] + (-1,))
    K2 = np.stack([a, b, b, a], axis=-1).reshape(a.shape[:-1] + (-1,))
    pad = d - Q.shape[-1]  # unused slots (d not a multiple of 4) stay zero
    Q, K1, K2 = (np.pad(t, [(0, 0)] * (t.ndim - 1) + [(0, pad)]) for t in (Q, K1, K2))
    O = np.asarray(
        two_simplicial_attention(
            jnp.asarray(Q), jnp.asarray(K1), jnp.asarray(K2),
            jnp.asarray(K1), jnp.asarray(K2), T=1.0 / beta, scale=1.0,
        )
    )[..., : 4 * n_h].reshape(a.shape + (4,))
    re_w = O[..., 0] - O[..., 1]  # Re(w_h) = ce - df
    im_w = O[..., 2] + O[..., 3]  # Im(w_h) = cf + de
    r = np.sum(a * re_w - b * im_w, axis=-1)  # sum_h Re(z_i^h w_h)
    pred = r > (n_h + k_max) / 2
    return float(np.mean(pred == np.asarray(y)))


# -- the two trained layers ------------------------------------------------------
_PROJECTIONS = {"standard": ("W_Q", "W_K", "W_V"),
                "two_simplicial": ("W_Q", "W_K1", "W_K2", "W_V1", "W_V2")}


def init_params(kind: str, cfg: Match3Config, d_in: int, key: Any) -> dict:
    """Projections W (d_in, d) for the layer, then readout W1 (d_in + d, hidden), b1, w2, b2."""
    if kind not in _PROJECTIONS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    names = _PROJECTIONS[kind]
    keys = jax.random.split(key, len(names) + 2)
    p = {n: jax.random.normal(k, (d_in, cfg.d), _F32) / math.sqrt(d_in)
         for n, k in zip(names, keys)}
    fan = d_in + cfg.d
    p["W1"] = jax.random.normal(keys[-2], (fan, cfg.hidden), _F32) / math.sqrt(fan)
    p["b1"] = jnp.zeros((cfg.hidden,), _F32)
    p["w2"] = jax.random.normal(keys[-1], (cfg.hidden,), _F32) / math.sqrt(cfg.hidden)
    p["b2"] = jnp.zeros((), _F32)
    return p


def layer_output(kind: str, p: dict, F: Any) -> Any:
    """O^{ic} of one attention layer on features F (..., S, d_in)."""
    if kind == "standard":
        # O^{ic} = softmax_j(Q^{ia} K^{ja} / sqrt(d)) V^{jc}
        return scaled_dot_product_attention(F @ p["W_Q"], F @ p["W_K"], F @ p["W_V"])
    # O^{ic} = softmax_{(j,k)}(Q^{ia} K1^{ja} K2^{ka} / sqrt(d)) V1^{jc} V2^{kc}
    return two_simplicial_attention(
        F @ p["W_Q"], F @ p["W_K1"], F @ p["W_K2"], F @ p["W_V1"], F @ p["W_V2"]
    )


def _logits(kind: str, p: dict, F: Any) -> Any:
    O = layer_output(kind, p, F)
    h = jax.nn.relu(jnp.concatenate([F, O], axis=-1) @ p["W1"] + p["b1"])
    return h @ p["w2"] + p["b2"]


def _loss(kind: str, p: dict, F: Any, Y: Any) -> Any:
    """Mean binary cross-entropy with logits z: log(1 + e^z) - y z."""
    z = _logits(kind, p, F)
    return jnp.mean(jnp.logaddexp(0.0, z) - Y * z)


def _adam_step(kind: str):
    """One jitted Adam step (beta1 = 0.9, beta2 = 0.999, eps = 1e-8), written out."""

    @jax.jit
    def step(p, m, v, F, Y, lr_t, bc1, bc2):
        loss, g = jax.value_and_grad(lambda q: _loss(kind, q, F, Y))(p)
        m = jax.tree.map(lambda m_, g_: 0.9 * m_ + 0.1 * g_, m, g)
        v = jax.tree.map(lambda v_, g_: 0.999 * v_ + 0.001 * g_ * g_, v, g)
        p = jax.tree.map(
            lambda p_, m_, v_: p_ - lr_t * (m_ / bc1) / (jnp.sqrt(v_ / bc2) + 1e-8), p, m, v
        )
        return p, m, v, loss

    return step


def _accuracy(kind: str, p: dict, F: np.ndarray, Y: np.ndarray, chunk: int = 2000) -> float:
    right = 0
    for s in range(0, len(F), chunk):
        z = np.asarray(_logits(kind, p, jnp.asarray(F[s:s + chunk])))
        right += int(np.sum((z > 0) == Y[s:s + chunk]))
    return right / np.size(Y)  # one target per position


def train_layer(kind: str, cfg: Match3Config, data: dict) -> dict:
    """Train one layer plus readout with Adam on data["F_train"], data["y_train"].

    Report-style: returns a dict of Python numbers (accuracies, loss, time,
    parameter count) and the trained parameters under "params".
    """
    F_tr, y_tr = data["F_train"], data["y_train"].astype(np.float32)
    p = init_params(kind, cfg, F_tr.shape[-1], jax.random.PRNGKey(cfg.seed))
    m = jax.tree.map(jnp.zeros_like, p)
    v = jax.tree.map(jnp.zeros_like, p)
    step = _adam_step(kind)
    batches = np.random.default_rng(cfg.seed + 1)  # the same batches for both kinds
    t0 = time.perf_counter()
    loss = float("nan")
    for t in range(1, cfg.steps + 1):
        idx = batches.integers(0, len(F_tr), cfg.batch)
        lr_t = cfg.lr * 0.5 * (1.0 + math.cos(math.pi * t / cfg.steps))
        p, m, v, loss = step(
            p, m, v, jnp.asarray(F_tr[idx]), jnp.asarray(y_tr[idx]),
            np.float32(lr_t), np.float32(1 - 0.9**t), np.float32(1 - 0.999**t),
        )
    seconds = time.perf_counter() - t0
    n_train_eval = min(len(F_tr), len(data["F_test"]))
    return {
        "kind": kind,
        "params": p,
        "n_params": int(sum(np.size(x) for x in jax.tree.leaves(p))),
        "final_loss": float(loss),
        "train_acc": _accuracy(kind, p, F_tr[:n_train_eval], data["y_train"][:n_train_eval]),
        "test_acc": _accuracy(kind, p, data["F_test"], data["y_test"]),
        "seconds": seconds,
    }


def run_match3(cfg: Match3Config | None = None, **overrides: Any) -> dict:
    """Train both layers on the same seeded data and report test accuracy.

    ``overrides`` replace fields of the config (``run_match3(steps=300)``).
    Report-style: returns a dict of Python numbers and strings.
    """
    cfg = replace(cfg or Match3Config(), **overrides)
    rng = np.random.default_rng(cfg.seed)
    x_tr, y_tr = match3_data(cfg.n_train, cfg.S, cfg.M, rng)
    x_te, y_te = match3_data(cfg.n_test, cfg.S, cfg.M, rng)
    data = {
        "F_train": fourier_features(x_tr, cfg.M), "y_train": y_tr,
        "F_test": fourier_features(x_te, cfg.M), "y_test": y_te,
    }
    positive = float(np.mean(y_te))
    results = {"config": asdict(cfg), "positive_rate": positive,
               "baseline_acc": max(positive, 1 - positive)}
    for kind in KINDS:
        r = train_layer(kind, cfg, data)
        r.pop("params")
        results[kind] = r
    hs, k_max = best_harmonics(cfg.M, cfg.d // 4)
    results["constructed"] = {
        "test_acc": constructed_accuracy(x_te, y_te, cfg.M, cfg.d),
        "harmonics": hs,
        "gap": cfg.d // 4 - k_max,
    }
    return results


def format_table(results: dict) -> str:
    """The report of :func:`run_match3` as a small text table."""
    c = results["config"]
    lines = [
        f"Match3: S={c['S']}, M={c['M']}, width d={c['d']}, one head, readout MLP "
        f"{c['hidden']}; {c['n_train']} train / {c['n_test']} test sequences, "
        f"{c['steps']} Adam steps, seed {c['seed']}",
        f"{'model':<34}{'params':>8}{'train acc':>11}{'test acc':>10}{'time (s)':>10}",
        f"{'class-balance baseline':<34}{'-':>8}{'-':>11}"
        f"{results['baseline_acc']:>10.3f}{'-':>10}",
    ]
    names = {"standard": "standard attention (1 layer)",
             "two_simplicial": "2-simplicial attention (1 layer)"}
    for kind in KINDS:
        r = results[kind]
        lines.append(
            f"{names[kind]:<34}{r['n_params']:>8d}{r['train_acc']:>11.3f}"
            f"{r['test_acc']:>10.3f}{r['seconds']:>10.1f}"
        )
    k = results["constructed"]
    lines.append(
        f"{'2-simplicial, hand-built (beta=10)':<34}{'-':>8}{'-':>11}"
        f"{k['test_acc']:>10.3f}{'-':>10}"
    )
    lines.append(
        f"(hand-built layer: harmonics {tuple(int(h) for h in k['harmonics'])}, "
        f"score gap {k['gap']:.2f}; positives {results['positive_rate']:.3f} of test targets)"
    )
    return "\n".join(lines)
