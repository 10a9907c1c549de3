"""Read a Hugging Face ``config.json`` into an :class:`~headwise.sizing.arch.Architecture`.

Each supported ``model_type`` maps its own key names (``n_embd`` for GPT-2, ``hidden_size`` elsewhere)
and the layout its modeling file builds (which Linears carry biases, which norms exist, whether the
LM head is tied by default). What is counted is the model class named below, as built by
``transformers`` from the same config:

=============  ==========================  =====================================================
model_type     counted as                  layout
=============  ==========================  =====================================================
llama          LlamaForCausalLM            SwiGLU, RMSNorm, RoPE; ``attention_bias``, ``mlp_bias``
mistral        MistralForCausalLM          as Llama, no biases; ``sliding_window`` on every layer
qwen2          Qwen2ForCausalLM            as Llama, biases on Q, K, V only
qwen3          Qwen3ForCausalLM            as Llama, QK-norm per head
olmo2          Olmo2ForCausalLM            as Llama, QK-norm over the whole projections
gemma          GemmaForCausalLM            GeGLU, RMSNorm, tied head by default
gemma2         Gemma2ForCausalLM           as Gemma, four norms per layer; local / global layers
gemma3_text    Gemma3ForCausalLM           as Gemma 2, QK-norm per head; 5 local : 1 global
starcoder2     Starcoder2ForCausalLM       GELU MLP, LayerNorm, biases (``use_bias``); window
gpt_oss        GptOssForCausalLM           mixture of experts with biases, sinks, local / global
deepseek_v2    DeepseekV2ForCausalLM       latent attention, shared + routed experts
deepseek_v3    DeepseekV3ForCausalLM       the same (multi-token-prediction layers not counted)
gpt2           GPT2LMHeadModel             GELU MLP, LayerNorm, learned positions, tied head
bert           BertModel (with pooler)     GELU MLP, LayerNorm, learned positions, token types
=============  ==========================  =====================================================

Sliding windows: ``layer_types`` when the config lists them, else the family's default pattern (as its
``transformers`` configuration builds it); a window of ``null`` means none. Each value's default is the
``transformers`` default of that family.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headwise.sizing.arch import Architecture, check_bool, check_int

__all__ = ["from_hf_config", "SUPPORTED_MODEL_TYPES"]


@dataclass(frozen=True)
class _Family:
    """What a RoPE decoder family's modeling file builds, and its configuration's defaults."""

    tied: bool  # tie_word_embeddings default
    norms: int  # norms per layer
    attention_bias: bool | None  # the attention_bias default; None: no such key, no biases
    mlp_bias_key: bool = False  # has an mlp_bias key
    qkv_bias: bool = False  # biases on Q, K, V always (Qwen2)
    qk_norm: str = ""
    window: int | None = None  # sliding_window default when the key is absent
    pattern: int = 0  # default layer types: every pattern-th layer global (0: all windowed)
    window_switch: bool = False  # the window needs use_sliding_window (Qwen)
    sinks: bool = False


_ROPE_FAMILY = {
    "llama": _Family(False, 2, False, mlp_bias_key=True),
    "mistral": _Family(False, 2, None, window=4096),
    "qwen2": _Family(False, 2, None, qkv_bias=True, window=4096, window_switch=True),
    "qwen3": _Family(False, 2, False, qk_norm="head", window=4096, window_switch=True),
    "olmo2": _Family(False, 2, False, qk_norm="full"),
    "gemma": _Family(True, 2, False),
    "gemma2": _Family(True, 4, False, window=4096, pattern=2),
    "gemma3_text": _Family(True, 4, False, qk_norm="head", window=4096, pattern=6),
    "gpt_oss": _Family(False, 2, True, window=128, pattern=2, sinks=True),
    "deepseek_v2": _Family(False, 2, False, mlp_bias_key=True),
    "deepseek_v3": _Family(False, 2, False),
}
SUPPORTED_MODEL_TYPES = tuple(sorted([*_ROPE_FAMILY, "starcoder2", "gpt2", "bert"]))


class _Config:
    """A config dict with checked getters whose errors name the key and the file."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def int(self, key: str, default: Any = ...) -> int:
        value = self.data.get(key)
        if value is None:  # absent, or null as some configs write it
            if default is ...:
                raise ValueError(f"{self.where}: missing key {key!r}")
            return default
        return check_int(value, key, self.where)

    def count(self, key: str) -> int:
        """An integer >= 0; absent or null reads as 0 (no such part)."""
        value = self.data.get(key)
        return 0 if value is None else check_int(value, key, self.where, minimum=0)

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        return default if value is None else check_bool(value, key, self.where)

    def heads(self, hidden_key: str, heads_key: str, kv_key: str | None) -> tuple[int, int, int]:
        """(H, Hkv, Dh), checked: Hkv divides H; D divisible by H when ``head_dim`` is absent."""
        hidden, heads = self.int(hidden_key), self.int(heads_key)
        kv_heads = self.int(kv_key, heads) if kv_key else heads
        if heads % kv_heads:
            raise ValueError(f"{self.where}: {kv_key!r} ({kv_heads}) must divide {heads_key!r} ({heads})")
        head_dim = self.int("head_dim", None) if kv_key else None
        if head_dim is None:
            if hidden % heads:
                raise ValueError(
                    f"{self.where}: {hidden_key!r} ({hidden}) is not divisible by {heads_key!r} ({heads}) "
                    f"and 'head_dim' is absent"
                )
            head_dim = hidden // heads
        return heads, kv_heads, head_dim


def _read(path_or_dict: Any) -> tuple[Mapping[str, Any], str, str]:
    """(config dict, where to name it in errors, a default display name)."""
    if hasattr(path_or_dict, "to_dict") and not isinstance(path_or_dict, Mapping):
        path_or_dict = path_or_dict.to_dict()  # a transformers PretrainedConfig
    if isinstance(path_or_dict, Mapping):
        return path_or_dict, "config", ""
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise TypeError(f"path_or_dict must be a path to config.json or a dict, got {type(path_or_dict).__name__}")
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    where = str(path)
    if not path.is_file():
        raise FileNotFoundError(f"config: no such file: {where}")
    from headwise.models.gguf import gguf_config, is_gguf

    if is_gguf(path):  # a GGUF file (llama.cpp, Ollama): its architecture metadata, mapped by transformers
        return gguf_config(path), where, path.stem
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: expected a UTF-8 JSON file, got undecodable byte at offset {e.start}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object at the top, got {type(data).__name__}")
    default_name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return data, where, default_name


def from_hf_config(path_or_dict: Any, *, name: str | None = None) -> Architecture:
    """An :class:`Architecture` from a Hugging Face config (file, folder, dict or ``PretrainedConfig``).

    Args:
        path_or_dict: path to ``config.json`` (or to the folder holding it), a GGUF file (any name: its
            architecture metadata, read as transformers' GGUF loader reads it), a config's parsed dict,
            or a ``transformers`` config object.
        name: display name; default the config's ``_name_or_path``, else the folder's name, else
            the ``model_type``.

    Returns:
        The architecture of the model class the table in this module's docstring names.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON; ``model_type`` missing or unsupported; a needed key missing or not a
            positive integer; a flag not a boolean; ``num_key_value_heads`` not dividing
            ``num_attention_heads``; hidden width not divisible by the head count while
            ``head_dim`` is absent. The message names the key.
        TypeError: ``path_or_dict`` is neither a path nor a dict.
    """
    data, where, default_name = _read(path_or_dict)
    model_type = data.get("model_type")
    if model_type is None:
        raise ValueError(f"{where}: missing key 'model_type'")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{where}: 'model_type' {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    cfg = _Config(data, where)
    display = name or data.get("_name_or_path") or default_name or str(model_type)
    common = {"name": str(display), "source": f"Hugging Face config ({where}, model_type {model_type})"}
    if model_type == "gpt2":
        return _gpt2(cfg, common)
    if model_type == "bert":
        return _bert(cfg, common)
    if model_type == "starcoder2":
        return _starcoder2(cfg, common)
    return _rope_family(cfg, common, model_type)


def _windows(cfg: _Config, fam: _Family, num_layers: int) -> dict[str, int]:
    """``sliding_window`` and ``global_layers`` of a config: its ``layer_types``, else the family's pattern."""
    if fam.window_switch and not cfg.bool("use_sliding_window", False):
        return {}
    window = cfg.data.get("sliding_window", fam.window)
    if window is None:
        return {}
    window = check_int(window, "sliding_window", cfg.where)
    types = cfg.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise ValueError(
                f"{cfg.where}: 'layer_types' must be a list of {num_layers} layer types, got {types!r:.80}"
            )
        windowed = sum(t == "sliding_attention" for t in types)
    elif fam.window_switch:  # Qwen: layers from max_window_layers on are windowed
        windowed = max(0, num_layers - cfg.int("max_window_layers", num_layers))
    else:
        pattern = cfg.int("sliding_window_pattern", fam.pattern) if fam.pattern else 0
        windowed = num_layers - (num_layers // pattern if pattern else 0)
    if windowed == 0:
        return {}
    return {"sliding_window": window, "global_layers": num_layers - windowed}


def _latent(cfg: _Config) -> tuple[int, dict[str, Any]]:
    """(head_dim, fields) of a DeepSeek config's latent attention and experts."""
    nope, rope = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim")
    fields = {
        "q_lora_rank": cfg.count("q_lora_rank"),
        "kv_lora_rank": cfg.int("kv_lora_rank"),
        "qk_rope_head_dim": rope,
        "v_head_dim": cfg.int("v_head_dim"),
        "num_experts": cfg.count("n_routed_experts"),
        "shared_experts": cfg.count("n_shared_experts"),
        "moe_intermediate_size": cfg.count("moe_intermediate_size"),
        "dense_layers": min(cfg.count("first_k_dense_replace"), cfg.int("num_hidden_layers")),
    }
    if fields["num_experts"]:
        fields["experts_per_token"] = cfg.int("num_experts_per_tok")
    return nope + rope, fields


def _rope_family(cfg: _Config, common: dict[str, Any], model_type: str) -> Architecture:
    fam = _ROPE_FAMILY[model_type]
    extra: dict[str, Any] = {"qk_norm": fam.qk_norm, "attention_sinks": fam.sinks}
    if model_type.startswith("deepseek"):
        cfg.int("hidden_size")
        heads = kv_heads = cfg.int("num_attention_heads")
        head_dim, latent = _latent(cfg)
        extra.update(latent)
        num_layers = cfg.int("num_hidden_layers")
    else:
        heads, kv_heads, head_dim = cfg.heads("hidden_size", "num_attention_heads", "num_key_value_heads")
        num_layers = cfg.int("num_hidden_layers")
        extra.update(_windows(cfg, fam, num_layers))
    if model_type == "gpt_oss":
        extra.update(
            num_experts=cfg.int("num_local_experts"),
            experts_per_token=cfg.int("num_experts_per_tok"),
            expert_bias=True,
        )
    attention_bias = False if fam.attention_bias is None else cfg.bool("attention_bias", fam.attention_bias)
    return Architecture(
        vocab_size=cfg.int("vocab_size"),
        hidden_size=cfg.int("hidden_size"),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=cfg.int("intermediate_size"),
        ffn="gated",
        activation=str(cfg.data.get("hidden_activation") or cfg.data.get("hidden_act") or ""),
        qkv_bias=fam.qkv_bias or attention_bias,
        o_bias=attention_bias,
        mlp_bias=cfg.bool("mlp_bias", False) if fam.mlp_bias_key else False,
        norm="rmsnorm",
        norms_per_layer=fam.norms,
        embedding_norm=False,
        final_norm=True,
        max_positions=cfg.int("max_position_embeddings"),
        learned_positions=False,
        type_vocab_size=0,
        output_head="tied" if cfg.bool("tie_word_embeddings", fam.tied) else "separate",
        pooler=False,
        kind="decoder",
        **extra,
        **common,
    )


def _starcoder2(cfg: _Config, common: dict[str, Any]) -> Architecture:
    heads, kv_heads, head_dim = cfg.heads("hidden_size", "num_attention_heads", "num_key_value_heads")
    bias = cfg.bool("use_bias", True)
    return Architecture(
        vocab_size=cfg.int("vocab_size"),
        hidden_size=cfg.int("hidden_size"),
        num_layers=cfg.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=cfg.int("intermediate_size"),
        ffn="mlp",
        activation=str(cfg.data.get("hidden_act") or ""),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        norm="layernorm",
        norms_per_layer=2,
        embedding_norm=False,
        final_norm=True,
        max_positions=cfg.int("max_position_embeddings"),
        learned_positions=False,
        type_vocab_size=0,
        output_head="tied" if cfg.bool("tie_word_embeddings", True) else "separate",
        pooler=False,
        kind="decoder",
        **_windows(cfg, _Family(True, 2, None), cfg.int("num_hidden_layers")),
        **common,
    )


def _gpt2(cfg: _Config, common: dict[str, Any]) -> Architecture:
    if cfg.bool("add_cross_attention", False):
        raise ValueError(f"{cfg.where}: 'add_cross_attention' true (GPT-2 with cross-attention) is not supported")
    heads, _, head_dim = cfg.heads("n_embd", "n_head", None)
    hidden = cfg.int("n_embd")
    return Architecture(
        vocab_size=cfg.int("vocab_size"),
        hidden_size=hidden,
        num_layers=cfg.int("n_layer"),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        intermediate_size=cfg.int("n_inner", 4 * hidden),
        ffn="mlp",
        activation=str(cfg.data.get("activation_function") or ""),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        norm="layernorm",
        norms_per_layer=2,
        embedding_norm=False,
        final_norm=True,
        max_positions=cfg.int("n_positions"),
        learned_positions=True,
        type_vocab_size=0,
        output_head="tied" if cfg.bool("tie_word_embeddings", True) else "separate",
        pooler=False,
        kind="decoder",
        **common,
    )


def _bert(cfg: _Config, common: dict[str, Any]) -> Architecture:
    heads, _, head_dim = cfg.heads("hidden_size", "num_attention_heads", None)
    type_vocab = cfg.data.get("type_vocab_size")
    return Architecture(
        vocab_size=cfg.int("vocab_size"),
        hidden_size=cfg.int("hidden_size"),
        num_layers=cfg.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        intermediate_size=cfg.int("intermediate_size"),
        ffn="mlp",
        activation=str(cfg.data.get("hidden_act") or ""),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        norm="layernorm",
        norms_per_layer=2,
        embedding_norm=True,
        final_norm=False,
        max_positions=cfg.int("max_position_embeddings"),
        learned_positions=True,
        type_vocab_size=2 if type_vocab is None else check_int(type_vocab, "type_vocab_size", cfg.where, minimum=0),
        output_head="none",
        pooler=True,
        kind="encoder",
        **common,
    )
