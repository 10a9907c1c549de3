"""Tiny random Hugging Face models of many families, built offline from configs (float32, eval).

Weights are redrawn larger than Hugging Face's init (std 0.02 nearly averages) so that attention is far
from uniform and a wrong mask, scale or head shows in the logits.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 96
_SMALL = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48, vocab_size=VOCAB)
_MOE = dict(num_experts_per_tok=2)

# case -> (family, config overrides on top of _SMALL). Sliding windows (4) are shorter than the test batches.
DECODERS = {
    "llama": ("llama", dict(num_key_value_heads=2)),
    "mistral": ("mistral", dict(num_key_value_heads=2, sliding_window=None)),
    "mistral_window": ("mistral", dict(num_key_value_heads=2, sliding_window=4)),
    "qwen2": ("qwen2", dict(num_key_value_heads=2)),
    "qwen3": ("qwen3", dict(num_key_value_heads=2, head_dim=8)),
    "gemma": ("gemma", dict(num_key_value_heads=1, head_dim=8)),
    "gemma2": ("gemma2", dict(num_key_value_heads=2, head_dim=8, sliding_window=4, attn_logit_softcapping=5.0)),
    "gemma3_text": ("gemma3_text", dict(num_key_value_heads=2, head_dim=8, sliding_window=4)),
    "phi3": ("phi3", dict(num_key_value_heads=2, pad_token_id=0)),
    "olmo2": ("olmo2", dict(num_key_value_heads=2)),
    "gpt2": ("gpt2", dict(n_embd=32, n_head=4, n_layer=2)),
    "gpt_oss": ("gpt_oss", dict(num_key_value_heads=2, head_dim=8, num_local_experts=4, sliding_window=4, **_MOE)),
    "deepseek_v3": (
        "deepseek_v3",
        dict(
            num_key_value_heads=4,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_rope_head_dim=4,
            qk_nope_head_dim=8,
            v_head_dim=6,
            n_routed_experts=4,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            moe_intermediate_size=16,
            **_MOE,
        ),
    ),
}


def family_calls_interface(family: str) -> bool:
    """Whether the installed transformers runs ``family`` through its AttentionInterface (headwise's probe)."""
    import importlib

    from transformers import AutoConfig

    from headwise.hf.backend import calls_interface

    module = type(AutoConfig.for_model(family)).__module__.replace(".configuration_", ".modeling_")
    return calls_interface(importlib.import_module(module))


# Falcon runs on the interface from transformers 5.25 on (a supported family there, equal to eager).
if family_calls_interface("falcon"):
    DECODERS["falcon"] = ("falcon", dict(num_kv_heads=2, new_decoder_architecture=True))
ENCODERS = {"bert": ("bert", dict())}
CASES = {**DECODERS, **ENCODERS}


def randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Redraw every parameter (matrices std 0.15, biases 0.1, other vectors — norm scales, sinks — 1 ± 0.1); eval."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() > 1:
                p.copy_(0.15 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(1.0 + 0.1 * noise)
    return model.eval()


def build(case: str, *, attn: str = "eager", seed: int = 0) -> nn.Module:
    """A tiny random model of ``CASES[case]`` (``AutoModelForCausalLM``, or ``AutoModel`` for encoders)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    family, overrides = CASES[case]
    config = AutoConfig.for_model(family, **{**_SMALL, **overrides})
    kind = AutoModel if case in ENCODERS else AutoModelForCausalLM
    torch.manual_seed(seed)
    return randomise(kind.from_config(config, attn_implementation=attn, dtype=torch.float32), seed)


def batch(B: int = 3, L: int = 9, seed: int = 1) -> dict:
    """Token ids with left padding of 0, 2 and 4 tokens (B=3), and the 2-D mask (1 = real)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    for b in range(B):
        mask[b, : 2 * b] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask}


#: families for the converter sweep (tests/interop): family -> config overrides on top of _SMALL. Windows (4) are
#: shorter than the test sequences; Cohere 2 has four layers, so that its pattern (three local, one global) shows.
CONVERTIBLE = {
    "llama": dict(num_key_value_heads=2),
    "mistral": dict(num_key_value_heads=2, sliding_window=4),
    "qwen2": dict(num_key_value_heads=2, attention_bias=True),
    "qwen3": dict(num_key_value_heads=2, head_dim=16),
    "gemma": dict(num_key_value_heads=1, head_dim=8),
    "gemma2": dict(num_key_value_heads=2, head_dim=16, sliding_window=4, attn_logit_softcapping=5.0),
    "gemma3_text": dict(num_key_value_heads=2, head_dim=8, sliding_window=4),
    "cohere": dict(num_key_value_heads=2),
    "cohere2": dict(num_key_value_heads=2, num_hidden_layers=4, sliding_window=4),
    "olmo2": dict(num_key_value_heads=2),
    "starcoder2": dict(num_key_value_heads=2, sliding_window=4),
    "smollm3": dict(num_key_value_heads=2, num_hidden_layers=4, pad_token_id=0),
    "gpt_oss": dict(num_key_value_heads=2, head_dim=8, num_local_experts=4, sliding_window=4, **_MOE),
    # three local layers with RoPE and a window, one global layer with neither (the module's own sliding_window is
    # the config's on every layer)
    "exaone4": dict(num_key_value_heads=2, num_hidden_layers=4, sliding_window=4, sliding_window_pattern=4),
    # RoPE settings per layer type: the global layer rotates by YaRN on another base
    "olmo3": dict(
        num_key_value_heads=2,
        num_hidden_layers=4,
        sliding_window=4,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "yarn",
                "rope_theta": 500000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 512,
            },
        },
    ),
    "gpt2": dict(n_embd=32, n_head=4, n_layer=2),
    "bert": dict(),
}


def from_config(family: str, overrides: dict | None = None, *, seed: int = 0) -> nn.Module:
    """A tiny random base model (``AutoModel``, eager attention) of any ``family`` ``AutoConfig`` knows."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(family, **{**_SMALL, **(overrides or {})})
    torch.manual_seed(seed)
    return randomise(AutoModel.from_config(config, attn_implementation="eager", dtype=torch.float32), seed)
