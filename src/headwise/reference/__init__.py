"""The NumPy reference: the same maths as the torch core, the same names, no torch import.

float64 by default; the answer key every other path is tested against.
"""

from headwise.reference.attention import (
    merge_heads,
    multi_head_attention,
    rms_norm,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from headwise.reference.latent import latent_attention
from headwise.reference.positional import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    causal_mask,
    rope_attention_factor,
    rope_frequencies,
    sinusoidal_table,
    window_mask,
)

__all__ = [
    "softmax",
    "scaled_dot_product_attention",
    "split_heads",
    "merge_heads",
    "multi_head_attention",
    "latent_attention",
    "rms_norm",
    "sinusoidal_table",
    "rope_frequencies",
    "rope_attention_factor",
    "apply_rope",
    "alibi_slopes",
    "alibi_bias",
    "causal_mask",
    "window_mask",
]
