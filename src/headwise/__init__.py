"""headwise — multi-head attention and positional encodings you can read, verify and drop into a model.

Shape legend used everywhere: B batch, L query length, S key length, D model width, H heads,
Hkv key/value heads, Dh head width. Boolean masks are True where a query may not attend.
"""

from headwise import functional, masks
from headwise.attention import MultiHeadAttention
from headwise.block import AttentionBlock, EmbeddingWithPE
from headwise.cache import KVCache
from headwise.positional import (
    ALiBi,
    LearnedPositionalEmbedding,
    PositionalPart,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    sinusoidal_table,
)

__version__ = "0.1.0"

__all__ = [
    "MultiHeadAttention",
    "AttentionBlock",
    "EmbeddingWithPE",
    "KVCache",
    "PositionalPart",
    "RotaryEmbedding",
    "ALiBi",
    "alibi_slopes",
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEncoding",
    "sinusoidal_table",
    "functional",
    "masks",
]
