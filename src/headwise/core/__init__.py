"""The PyTorch core: attention as pure functions, the module that holds the projections, masks, caches.

One concept per file — ``call`` (``AttentionCall``: one record for an attention call), ``functional`` (the
maths: ``attention_math`` and the SDPA call), ``dispatch`` (the entry ``scaled_dot_product_attention`` and the
dispatcher ``attend``, above the maths and the fast paths), the fast paths the readable path never needs
(``projections``, ``blocked``, ``one_query``, ``decode``, ``kernels``), ``masks`` (the one mask convention and its
one conversion), ``cache`` (the ``Cache`` protocol: ``KVCache``, ``SlidingWindowCache``, ``LatentCache``), ``attention``
(``MultiHeadAttention``), ``latent`` (``LatentAttention``), ``block`` (the first article's embedding and
attention block). Positional parts live beside it in :mod:`headwise.positional`.
"""

from headwise.core.attention import MultiHeadAttention
from headwise.core.block import AttentionBlock, EmbeddingWithPE
from headwise.core.cache import Cache, CacheRead, KVCache, LatentCache, SlidingWindowCache
from headwise.core.latent import LatentAttention

__all__ = [
    "AttentionBlock",
    "Cache",
    "CacheRead",
    "EmbeddingWithPE",
    "KVCache",
    "LatentAttention",
    "LatentCache",
    "MultiHeadAttention",
    "SlidingWindowCache",
]
