"""Tiny random decoders of many families on headwise's backend, with an eager twin of the same weights (the families
of the anatomy tests)."""

from __future__ import annotations

import copy
import warnings

import torch

import headwise.hf  # noqa: F401  (registers "headwise")
from _hf_models import randomise

V = 128
_BASE = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=96, vocab_size=V)
#: family -> config overrides
FAMILIES = {
    "llama": dict(num_key_value_heads=2),
    "qwen2": dict(num_key_value_heads=2),
    "qwen3": dict(num_key_value_heads=2, head_dim=16),
    "gemma2": dict(num_key_value_heads=2, head_dim=16, attn_logit_softcapping=20.0),
    "gemma3_text": dict(num_key_value_heads=2, head_dim=16),
    "olmo2": dict(num_key_value_heads=2),
    "helium": dict(num_key_value_heads=2, head_dim=16),
    "glm": dict(num_key_value_heads=2, head_dim=16, pad_token_id=0),
    "starcoder2": dict(num_key_value_heads=2),
    "stablelm": dict(num_key_value_heads=2),
    "persimmon": dict(),
    "olmo": dict(),
    "mistral": dict(num_key_value_heads=2),
    "cohere": dict(num_key_value_heads=2),
    "phi": dict(),
    "gpt_bigcode": dict(n_embd=64, n_head=4, n_layer=2),
    "falcon": dict(num_kv_heads=2, new_decoder_architecture=True),
    # the structures the anatomy exists for: Conv1D, interleaved query_key_value with a parallel residual,
    # a fused qkv_proj, residual / embedding / attention multipliers and a logit scale
    "gpt2": dict(n_embd=64, n_head=4, n_layer=2),
    "gpt_neox": dict(),
    "phi3": dict(num_key_value_heads=2, pad_token_id=0),
    "granite": dict(
        num_key_value_heads=2,
        residual_multiplier=0.5,
        embedding_multiplier=3.0,
        logits_scaling=4.0,
        attention_multiplier=0.2,
    ),
    # norms stored otherwise: Nemotron's LayerNorm of 1 + w (a subclass of nn.LayerNorm), Gemma's RMS norm of 1 + w
    "nemotron": dict(num_key_value_heads=2),
    "gemma": dict(num_key_value_heads=2, head_dim=16),
    # refused by the anatomy: OPT's MLP is two loose linears in the block (no MLP module), GPT-J rotates inside
    # its attention from positions the attention computes itself
    "opt": dict(ffn_dim=96, word_embed_proj_dim=64),
    "gptj": dict(n_embd=64, n_head=4, n_layer=2, rotary_dim=8),
}
REFUSED = {"opt", "gptj"}


def tiny(family: str, attn: str = "headwise", seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random ``AutoModelForCausalLM`` of ``family`` (weights redrawn by :func:`_hf_models.randomise`);
    ``overrides``: config entries over the family's (``num_hidden_layers=5``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, **{**_BASE, **FAMILIES[family], **overrides})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        return randomise(AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=attn), seed)
