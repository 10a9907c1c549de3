"""What a Hugging Face attention module's configuration says, as :func:`headwise.interop.from_hf` reads it: the
RoPE parameters (per layer type where the config has them), the layer's type and sliding window as the model builds
its mask, and the kinds of attention headwise does not compute (refused by name, :func:`refuse`).

Shape legend: Dh head width.
"""

from __future__ import annotations

from headwise.positional.rope import RotaryEmbedding

__all__ = ["ROPE_TYPES", "check_kinds", "head_count", "layer_type_of", "refuse", "rope_from_config", "window_of"]

ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # what headwise's RotaryEmbedding(scaling=...) computes
ROPE_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
YARN_OPTIONAL = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")


def refuse(m, kind: str, detail: str) -> ValueError:
    return ValueError(f"{detail}: {type(m).__name__} uses {kind}, which headwise does not compute")


def head_count(features: int, head_dim: int, what: str) -> int:
    if features % head_dim:
        raise ValueError(f"module: {what} has {features} output features, not a multiple of head_dim={head_dim}")
    return features // head_dim


# -- rotary embeddings from the config ---------------------------------------------------------------------


def rope_parameters(config, layer_type: str | None = None) -> tuple[dict, str]:
    """RoPE settings as one flat dict: transformers 5 ``rope_parameters`` (per layer type for Gemma 3);
    4.x ``rope_theta``, ``rope_scaling``."""
    params = getattr(config, "rope_parameters", None)
    if params is not None:
        where = "config.rope_parameters"
        if layer_type is not None and isinstance(params.get(layer_type), dict):
            params, where = params[layer_type], f"config.rope_parameters[{layer_type!r}]"
        nested = [k for k, v in params.items() if isinstance(v, dict)]
        if nested:
            raise ValueError(f"{where}: RoPE settings per layer type ({', '.join(nested)}) are not supported")
        params = dict(params)
    else:
        where = "config.rope_scaling"
        params = dict(getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params, where


def rope_from_config(
    m, config, head_dim: int, *, layer_type: str | None = None, convention: str = "half"
) -> RotaryEmbedding:
    cls = type(m).__name__
    params, where = rope_parameters(config, layer_type)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"{where}: {cls} rotates with rope_type {kind!r}, which headwise does not compute "
            f"(supported: {', '.join(ROPE_TYPES)})"
        )
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is not None and float(partial) != 1.0:
        raise refuse(m, "partial rotary embeddings", f"{where}: partial_rotary_factor={partial!r}")
    scaling = None
    if kind != "default":
        if kind in ("llama3", "yarn"):
            params.setdefault("original_max_position_embeddings", getattr(config, "max_position_embeddings", None))
        if kind == "yarn" and params.get("factor") is None:  # DeepSeek: the ratio of the two context lengths
            params["factor"] = config.max_position_embeddings / params["original_max_position_embeddings"]
        missing = [k for k in ROPE_KEYS[kind] if params.get(k) is None]
        if missing:
            raise ValueError(f"{where}: rope_type {kind!r} needs {', '.join(missing)}; got {params}")
        keys = ROPE_KEYS[kind] + (YARN_OPTIONAL if kind == "yarn" else ())
        scaling = {"rope_type": kind, **{k: params[k] for k in keys if params.get(k) is not None}}
    return RotaryEmbedding(head_dim, base=float(params["rope_theta"]), convention=convention, scaling=scaling)


# -- q_proj, k_proj, v_proj, o_proj: Llama and the families built like it ----------------------------------


def layer_type_of(m, config) -> str | None:
    """The layer's type as the model reads it to pick the layer's mask and rotary tables: ``config.layer_types``
    at the module's ``layer_idx`` (Gemma 2/3, Qwen2/3, GPT-OSS, Cohere 2, EXAONE 4, OLMo 3), else the module's own
    ``layer_type``, else None (every layer alike)."""
    types, idx = getattr(config, "layer_types", None), getattr(m, "layer_idx", None)
    if types is not None and idx is not None and 0 <= idx < len(types):
        return types[idx]
    return getattr(m, "layer_type", None)


def window_of(m, config) -> int | None:
    """The layer's sliding window, as the model builds its mask: by the layer's type in ``config.layer_types``
    where the config has them (a module's own ``sliding_window`` may be the config's on every layer, as EXAONE
    4's is, though its full-attention layers get the full causal mask), else the module's own (the config's
    window when the module has none and the config uses one: Mistral, Starcoder2)."""
    layer_type = layer_type_of(m, config)
    if getattr(config, "layer_types", None) is not None and layer_type is not None:
        return getattr(config, "sliding_window", None) if layer_type == "sliding_attention" else None
    if hasattr(m, "sliding_window"):
        return m.sliding_window
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return getattr(config, "sliding_window", None)


def check_kinds(m, config) -> None:
    """Refuse, by name, the kinds of the families built like Llama that headwise does not compute."""
    if getattr(m, "is_causal", True) is False:
        what = (
            "config.use_bidirectional_attention=True"
            if getattr(config, "use_bidirectional_attention", False)
            else "is_causal=False"
        )
        raise ValueError(
            f"{what}: {type(m).__name__} attending both ways is not supported "
            "(headwise converts the causal decoders; expected False)"
        )
    if getattr(config, "clip_qkv", None) is not None:
        raise refuse(m, "clipped queries, keys and values", f"config.clip_qkv={config.clip_qkv!r}")
    if getattr(config, "attention_chunk_size", None) is not None:
        raise refuse(m, "chunked attention", f"config.attention_chunk_size={config.attention_chunk_size!r}")
    if getattr(m, "attn_temperature_tuning", False) or getattr(config, "attn_temperature_tuning", False):
        raise refuse(m, "attention-temperature tuning", "config.attn_temperature_tuning=True")
