"""``from_hf`` on the modern kinds: Mistral with a window, Starcoder2, Gemma 2, Gemma 3, GPT-OSS, Qwen3, OLMo 2,
Llama with YaRN and DeepSeek-V3 — tiny random models built offline from configs.

Each test runs the whole Hugging Face model (eager attention, float32, eval), so that its own code builds the
causal and sliding-window masks per layer type and the rotary tables; forward hooks capture the hidden states
each attention layer received and what it returned, and the converted module, fed the same hidden states,
must return the same ``(B, L, D)`` within 1e-5 on every layer (alternating models: local and global alike).
The sequences are longer than the windows, so windows are exercised. The largest difference per family is
printed (``-s``) for docs/variants.md.
"""

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from headwise.core.latent import LatentAttention  # noqa: E402
from headwise.interop import from_hf  # noqa: E402

TOL = 1e-5  # float32, absolute
D, B, L, W = 64, 2, 12, 4


def _randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Weights large enough that attention is far from uniform; norm scales near 1, sinks near 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() > 1:
                p.copy_(0.15 * noise)
            elif name.endswith("bias") or name.endswith("sinks"):
                p.copy_(0.5 * noise)
            elif "norm" in name and "gemma" in type(model).__name__.lower():
                p.copy_(0.1 * noise)  # Gemma's RMSNorm multiplies by 1 + weight
            else:
                p.copy_(1.0 + 0.1 * noise)
    return model.eval()


def _capture_all(model, modules, **forward):
    """``[(hidden_states in, output), ...]`` of each module, from one forward of the whole model."""
    calls = {id(m): None for m in modules}

    def hook(module, args, kwargs, output):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        calls[id(module)] = (x.detach().clone(), output[0].detach().clone())

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in modules]
    with torch.no_grad():
        model(**forward)
    for h in handles:
        h.remove()
    return [calls[id(m)] for m in modules]


SMALL = dict(hidden_size=D, num_hidden_layers=2, intermediate_size=48, vocab_size=32, max_position_embeddings=64)
GQA = dict(num_attention_heads=4, num_key_value_heads=2)
MHA4 = dict(num_attention_heads=4, num_key_value_heads=4)


def _families():
    T = transformers
    eager = {"attn_implementation": "eager"}
    return {
        "mistral-window": (T.MistralConfig(**SMALL, **GQA, sliding_window=W, **eager), T.MistralModel),
        "starcoder2": (T.Starcoder2Config(**SMALL, **GQA, sliding_window=W, **eager), T.Starcoder2Model),
        "gemma2": (
            T.Gemma2Config(
                **SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=W,
                attn_logit_softcapping=3.0, query_pre_attn_scalar=24, **eager,
            ),
            T.Gemma2Model,
        ),
        "gemma3": (
            T.Gemma3TextConfig(
                **{**SMALL, "num_hidden_layers": 3}, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                sliding_window=W, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                rope_parameters={
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                },
                query_pre_attn_scalar=20, **eager,
            ),
            T.Gemma3TextModel,
        ),
        "gpt_oss": (
            T.GptOssConfig(
                **SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=W,
                num_local_experts=4, num_experts_per_tok=2,
                rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "truncate": False, "original_max_position_embeddings": 16, "rope_theta": 500.0},
                **eager,
            ),
            T.GptOssModel,
        ),
        "qwen3": (
            T.Qwen3Config(
                **SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=16, use_sliding_window=True,
                sliding_window=W, max_window_layers=1, **eager,
            ),
            T.Qwen3Model,
        ),
        "olmo2": (T.Olmo2Config(**SMALL, num_attention_heads=4, num_key_value_heads=2, **eager), T.Olmo2Model),
        "llama-yarn": (
            T.LlamaConfig(
                **SMALL, num_attention_heads=4, num_key_value_heads=2,
                rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                 "rope_theta": 1000.0},
                **eager,
            ),
            T.LlamaModel,
        ),
        "deepseek_v3": (
            T.DeepseekV3Config(
                **SMALL, **MHA4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8,
                qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                moe_intermediate_size=16, first_k_dense_replace=1, n_group=2, topk_group=1,
                rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                 "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1,
                                 "rope_theta": 10000.0},
                **eager,
            ),
            T.DeepseekV3Model,
        ),
        "deepseek_v3-no-q-latent": (
            T.DeepseekV3Config(
                **SMALL, **MHA4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
                qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
                first_k_dense_replace=2, n_group=2, topk_group=1, rope_interleave=False, **eager,
            ),
            T.DeepseekV3Model,
        ),
    }  # fmt: skip


FAMILIES = [
    "mistral-window",
    "starcoder2",
    "gemma2",
    "gemma3",
    "gpt_oss",
    "qwen3",
    "olmo2",
    "llama-yarn",
    "deepseek_v3",
    "deepseek_v3-no-q-latent",
]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_layer_equals_hugging_face(family):
    config, model_class = _families()[family]
    model = _randomise(model_class(config))
    modules = [layer.self_attn for layer in model.layers]
    ids = torch.randint(0, 32, (B, L), generator=torch.Generator().manual_seed(1))
    calls = _capture_all(model, modules, input_ids=ids)
    worst = 0.0
    for i, (m, (x, want)) in enumerate(zip(modules, calls)):
        mine = from_hf(m)
        assert isinstance(mine, LatentAttention) == family.startswith("deepseek")
        with torch.no_grad():
            got = mine(x, is_causal=True)[0]
        torch.testing.assert_close(got, want, atol=TOL, rtol=0, msg=lambda s, i=i: f"{family} layer {i}: {s}")
        worst = max(worst, (got - want).abs().max().item())
    print(f"\n{family}: max |headwise - HF| over {len(modules)} layers = {worst:.2e}")


def test_windows_and_kinds_reach_the_module():
    fam = _families()
    gemma2 = from_hf(_randomise(fam["gemma2"][1](fam["gemma2"][0])).layers[0].self_attn)
    assert gemma2.sliding_window == W and gemma2.softcap == 3.0
    gemma3 = _randomise(fam["gemma3"][1](fam["gemma3"][0]))
    local, full = (from_hf(gemma3.layers[i].self_attn) for i in (0, 1))
    assert (local.sliding_window, full.sliding_window) == (W, None)
    assert local.qk_norm == "head" and local.positional.base == 10000.0 and full.positional.base == 1e6
    oss = from_hf(_randomise(fam["gpt_oss"][1](fam["gpt_oss"][0])).layers[0].self_attn)
    assert oss.sinks.shape == (4,) and oss.positional.attention_factor > 1
    olmo = from_hf(_randomise(fam["olmo2"][1](fam["olmo2"][0])).layers[0].self_attn)
    assert olmo.qk_norm == "full" and olmo.q_norm.weight.shape == (D,)


def test_bidirectional_gemma3_is_rejected_by_name():
    config, model_class = _families()["gemma3"]
    config.use_bidirectional_attention = True
    attn = model_class(config).layers[0].self_attn
    with pytest.raises(ValueError, match=r"use_bidirectional_attention=True: Gemma3Attention"):
        from_hf(attn)
