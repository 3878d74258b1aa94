"""attn_tensors: attention as a bilinear form, on JAX and MLX.

One module per part of the book:

========================  ==========================================
module                    book part
========================  ==========================================
``bilinear``              I   Foundations: metrics, bilinear forms
``einsum``                I   Foundations: index strings in words and loops
``attention``             II  The attention mechanism
``softmax``               II  The stable, masked softmax under it all
``statmech``              III Statistical mechanics
``geometry``              IV  Differential geometry
``gradients``             V   Gradient derivations
========================  ==========================================

Every function takes JAX or MLX arrays (the backend follows the arrays) and
any leading batch/head axes.
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
