"""headwise — multi-head attention and positional encodings you can read, verify and drop into a model.

Shape legend used everywhere: B batch, L query length, S key length, D model width, H heads,
Hkv key/value heads, Dh head width. Boolean masks are True where a query may not attend.

The torch-based names load lazily (PEP 562), so ``import headwise.reference`` — the NumPy answer
key — never imports torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "MultiHeadAttention": "headwise.core.attention",
    "AttentionBlock": "headwise.core.block",
    "EmbeddingWithPE": "headwise.core.block",
    "EncoderLayer": "headwise.core.layers",
    "DecoderLayer": "headwise.core.layers",
    "atlas": "headwise.commands.atlas",
    "Atlas": "headwise.commands.atlas",
    "Cache": "headwise.core.cache",
    "KVCache": "headwise.core.cache",
    "SlidingWindowCache": "headwise.core.cache",
    "LatentCache": "headwise.core.cache",
    "LatentAttention": "headwise.core.latent",
    "PositionalPart": "headwise.positional",
    "RotaryEmbedding": "headwise.positional",
    "ALiBi": "headwise.positional",
    "alibi_slopes": "headwise.positional",
    "LearnedPositionalEmbedding": "headwise.positional",
    "SinusoidalPositionalEncoding": "headwise.positional",
    "sinusoidal_table": "headwise.positional",
}
_SUBMODULES = {"core", "reference", "interop", "positional", "models", "analysis", "study", "viz", "sizing", "lab"}
# The core's entry point and masks, reachable as ``headwise.functional`` (``scaled_dot_product_attention``, the
# dispatcher and the maths it picks from) and ``headwise.masks``.
_CORE_MODULES = {"functional": "headwise.core.dispatch", "masks": "headwise.core.masks"}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES | set(_CORE_MODULES))


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _CORE_MODULES:
        value = importlib.import_module(_CORE_MODULES[name])
    elif name in _SUBMODULES:
        value = importlib.import_module(f"headwise.{name}")
    else:
        raise AttributeError(f"module 'headwise' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return __all__ + ["__version__"]
