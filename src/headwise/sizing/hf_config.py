"""Read a Hugging Face ``config.json`` into an :class:`~headwise.sizing.arch.Architecture`.

Each supported ``model_type`` maps its own key names (``n_embd`` for GPT-2, ``hidden_size`` elsewhere)
and the layout its modeling file builds (which Linears carry biases, which norms exist, whether the
LM head is tied by default). What is counted is the model class named below, as built by
``transformers`` from the same config:

=============  ==========================  =====================================================
model_type     counted as                  layout
=============  ==========================  =====================================================
llama          LlamaForCausalLM            SwiGLU, RMSNorm, RoPE; ``attention_bias``, ``mlp_bias``
mistral        MistralForCausalLM          as Llama, no biases
qwen2          Qwen2ForCausalLM            as Llama, biases on Q, K, V only
gemma          GemmaForCausalLM            GeGLU, RMSNorm, tied head by default
gemma2         Gemma2ForCausalLM           as Gemma, four norms per layer (sandwich norms)
gpt2           GPT2LMHeadModel             GELU MLP, LayerNorm, learned positions, tied head
bert           BertModel (with pooler)     GELU MLP, LayerNorm, learned positions, token types
=============  ==========================  =====================================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headwise.sizing.arch import Architecture, check_bool, check_int

__all__ = ["from_hf_config", "SUPPORTED_MODEL_TYPES"]

# model_type -> (tied head by default, norms per layer, has attention_bias key, has mlp_bias key)
_ROPE_FAMILY = {
    "llama": (False, 2, True, True),
    "mistral": (False, 2, False, False),
    "qwen2": (False, 2, False, False),
    "gemma": (True, 2, True, False),
    "gemma2": (True, 4, True, False),
}
SUPPORTED_MODEL_TYPES = tuple(sorted([*_ROPE_FAMILY, "gpt2", "bert"]))


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
        path_or_dict: path to ``config.json`` (or to the folder holding it), its parsed dict, or a
            ``transformers`` config object.
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
    return _rope_family(cfg, common, model_type)


def _rope_family(cfg: _Config, common: dict[str, Any], model_type: str) -> Architecture:
    tied_default, norms_per_layer, has_attention_bias, has_mlp_bias = _ROPE_FAMILY[model_type]
    heads, kv_heads, head_dim = cfg.heads("hidden_size", "num_attention_heads", "num_key_value_heads")
    attention_bias = cfg.bool("attention_bias", False) if has_attention_bias else False
    return Architecture(
        vocab_size=cfg.int("vocab_size"),
        hidden_size=cfg.int("hidden_size"),
        num_layers=cfg.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=cfg.int("intermediate_size"),
        ffn="gated",
        activation=str(cfg.data.get("hidden_activation") or cfg.data.get("hidden_act") or ""),
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=attention_bias,
        mlp_bias=cfg.bool("mlp_bias", False) if has_mlp_bias else False,
        norm="rmsnorm",
        norms_per_layer=norms_per_layer,
        embedding_norm=False,
        final_norm=True,
        max_positions=cfg.int("max_position_embeddings"),
        learned_positions=False,
        type_vocab_size=0,
        output_head="tied" if cfg.bool("tie_word_embeddings", tied_default) else "separate",
        pooler=False,
        kind="decoder",
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
