"""Parameter counts and KV-cache sizes of real transformer architectures.

The architectures are data (``headwise/data/architectures.json``, each with the source of its
numbers); every count is computed from the shape, never stored::

    from headwise.sizing import get_arch, attention_params, total_params, kv_cache_bytes
    arch = get_arch("llama-3-8b")
    attention_params(arch).total            # 1_342_177_280: Q, K, V, O over 32 layers
    total_params(arch)                      # 8_030_261_248
    kv_cache_bytes(arch, 8192, 1, "bf16")   # 1 GiB: 2 * 32 layers * 8 KV heads * 128 * 8192 * 2 bytes

``from_hf_config("path/to/config.json")`` reads a Hugging Face config instead.
"""

from __future__ import annotations

from headwise.sizing.arch import Architecture
from headwise.sizing.count import (
    DTYPE_BYTES,
    AttentionParams,
    KVVariant,
    ParamBreakdown,
    as_mha,
    attention_params,
    dtype_bytes,
    kv_cache_bytes,
    kv_cache_elements,
    kv_cache_variants,
    param_breakdown,
    total_params,
)
from headwise.sizing.hf_config import SUPPORTED_MODEL_TYPES, from_hf_config
from headwise.sizing.registry import get_arch, list_archs, load_architectures, normalize_name

__all__ = [
    "Architecture",
    "AttentionParams",
    "ParamBreakdown",
    "DTYPE_BYTES",
    "SUPPORTED_MODEL_TYPES",
    "as_mha",
    "attention_params",
    "dtype_bytes",
    "from_hf_config",
    "get_arch",
    "kv_cache_bytes",
    "kv_cache_elements",
    "kv_cache_variants",
    "KVVariant",
    "list_archs",
    "load_architectures",
    "normalize_name",
    "param_breakdown",
    "total_params",
]
