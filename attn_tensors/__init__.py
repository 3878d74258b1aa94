"""attn_tensors: attention as a bilinear form, on JAX and MLX.

One module per part of the book:

========================  ==============================================
module                    book part
========================  ==============================================
``bilinear``              I    Foundations: metrics, bilinear forms
``einsum``                I    Foundations: index strings in words and loops
``attention``             II   The attention mechanism
``softmax``               II   The stable, masked softmax under it all
``statmech``              III  Statistical mechanics
``geometry``              IV   Differential geometry
``gradients``             V    Gradient derivations
``multihead``             VI   Multi-head attention
``masking``               VII  Masks ("may attend")
``variants``              VII  Attention variants
``hopfield``              VIII Hopfield networks
``kernel``                IX   Kernel regression and linear attention
``flash``                 IX   Online softmax and flash attention
``transformer``           VI, X  A minimal transformer block, trained in Part X
``backend``               the one adapter between JAX and MLX
========================  ==============================================

Every function takes JAX or MLX arrays (the backend follows the arrays) and
any leading batch/head axes.  The submodules load on first use
(``attn_tensors.statmech``), so ``import attn_tensors`` stays light.
"""

from .attention import (
    AttentionParts,
    attention_decomposition,
    attention_output,
    attention_scores,
    attention_weights,
    kernel_scores,
    low_rank_metric,
    scaled_dot_product_attention,
)
from ._checks import AttentionInputError
from .softmax import log_partition, softmax

__version__ = "0.1.0"

_SUBMODULES = {
    "attention", "backend", "bilinear", "einsum", "experiments", "flash",
    "geometry", "gradients", "hopfield", "kernel", "masking", "multihead",
    "softmax", "statmech", "transformer", "variants",
}


def __getattr__(name: str):
    """Load a submodule on first attribute access (PEP 562)."""
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "AttentionInputError",
    "AttentionParts",
    "attention_decomposition",
    "attention_output",
    "attention_scores",
    "attention_weights",
    "kernel_scores",
    "log_partition",
    "low_rank_metric",
    "scaled_dot_product_attention",
    "softmax",
]
