"""Positional encodings: added to embeddings (sinusoidal, learned) or acting inside attention (RoPE, ALiBi)."""

from headwise.positional.alibi import ALiBi, alibi_bias, alibi_slopes
from headwise.positional.base import PositionalPart
from headwise.positional.learned import LearnedPositionalEmbedding
from headwise.positional.rope import RotaryEmbedding, apply_rope, rope_angles, rope_frequencies
from headwise.positional.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table

__all__ = [
    "PositionalPart",
    "RotaryEmbedding",
    "rope_frequencies",
    "rope_angles",
    "apply_rope",
    "ALiBi",
    "alibi_slopes",
    "alibi_bias",
    "sinusoidal_table",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
]
