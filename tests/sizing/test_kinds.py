"""Sizing of the modern kinds: latent attention, sliding windows, QK-norm, sinks, mixtures of experts.

Parameter counts are compared with the modules ``transformers`` builds from the same tiny configs (exact);
KV-cache sizes with the arithmetic written out by hand, and, for latent attention and full layers, with the
bytes a Hugging Face cache really holds after a forward pass.
"""

import pytest

from headwise.sizing import (
    attention_params,
    from_hf_config,
    get_arch,
    kv_cache_bytes,
    kv_cache_variants,
    total_params,
)
from headwise.sizing.arch import Architecture

SMALL = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=4, max_position_embeddings=64)


def _numel(module):
    return sum(p.numel() for p in module.parameters())


def _cases():
    T = pytest.importorskip("transformers")
    return {
        "qwen3": (T.Qwen3Config(**SMALL, num_attention_heads=6, num_key_value_heads=2, head_dim=8), T.Qwen3ForCausalLM),
        "olmo2": (T.Olmo2Config(**SMALL, num_attention_heads=6, num_key_value_heads=2), T.Olmo2ForCausalLM),
        "gemma3": (
            T.Gemma3TextConfig(**SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8),
            T.Gemma3ForCausalLM,
        ),
        "gpt_oss": (
            T.GptOssConfig(
                **SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_local_experts=4,
                num_experts_per_tok=2, sliding_window=8,
            ),
            T.GptOssForCausalLM,
        ),
        "starcoder2": (
            T.Starcoder2Config(**SMALL, num_attention_heads=6, num_key_value_heads=2, sliding_window=8),
            T.Starcoder2ForCausalLM,
        ),
        "mistral-window": (
            T.MistralConfig(**SMALL, num_attention_heads=6, num_key_value_heads=2, sliding_window=8),
            T.MistralForCausalLM,
        ),
        "deepseek_v3": (
            T.DeepseekV3Config(
                **SMALL, num_attention_heads=4, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6,
                qk_rope_head_dim=4, v_head_dim=5, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                moe_intermediate_size=16, first_k_dense_replace=1, n_group=2, topk_group=1,
            ),
            T.DeepseekV3ForCausalLM,
        ),
        "deepseek_v2-lite": (
            T.DeepseekV2Config(
                **SMALL, num_attention_heads=4, q_lora_rank=None, kv_lora_rank=10, qk_nope_head_dim=6,
                qk_rope_head_dim=4, v_head_dim=5, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2,
                moe_intermediate_size=16, first_k_dense_replace=2, n_group=2, topk_group=1,
            ),
            T.DeepseekV2ForCausalLM,
        ),
    }  # fmt: skip


CASES = ["qwen3", "olmo2", "gemma3", "gpt_oss", "starcoder2", "mistral-window", "deepseek_v3", "deepseek_v2-lite"]


@pytest.mark.parametrize("label", CASES)
def test_counts_equal_the_hugging_face_modules(label):
    config, model_class = _cases()[label]
    model = model_class(config)
    arch = from_hf_config(config.to_dict())
    assert total_params(arch) == _numel(model), label
    attn = model.model.layers[0].self_attn
    assert attention_params(arch).per_layer == _numel(attn), label
    assert attention_params(arch).total == sum(_numel(layer.self_attn) for layer in model.model.layers), label


def test_windows_and_layer_types_from_configs():
    cases = _cases()
    windows = {k: from_hf_config(cases[k][0].to_dict()) for k in ("gemma3", "gpt_oss", "starcoder2", "mistral-window")}
    assert (windows["gemma3"].sliding_window, windows["gemma3"].global_layers) == (8, 0)  # 4 layers, pattern 6
    assert (windows["gpt_oss"].sliding_window, windows["gpt_oss"].global_layers) == (8, 2)  # alternating
    assert (windows["starcoder2"].sliding_window, windows["starcoder2"].sliding_layers) == (8, 4)
    assert windows["mistral-window"].sliding_layers == 4
    qwen3 = from_hf_config(cases["qwen3"][0].to_dict())
    assert qwen3.sliding_window == 0 and qwen3.qk_norm == "head"  # use_sliding_window is off by default
    assert from_hf_config(cases["deepseek_v3"][0].to_dict()).attention_variant == "MLA"


def test_config_json_without_layer_types_uses_the_family_pattern():
    gemma2 = dict(
        model_type="gemma2", vocab_size=10, hidden_size=16, intermediate_size=8, num_hidden_layers=42,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64, sliding_window=4096,
    )  # fmt: skip
    arch = from_hf_config(gemma2)
    assert (arch.sliding_window, arch.global_layers) == (4096, 21)
    assert from_hf_config({**gemma2, "sliding_window": None}).sliding_window == 0
    gemma3 = {**gemma2, "model_type": "gemma3_text", "num_hidden_layers": 62, "sliding_window": 1024}
    assert from_hf_config(gemma3).global_layers == 10
    with pytest.raises(ValueError, match=r"'layer_types' must be a list of 42 layer types"):
        from_hf_config({**gemma2, "layer_types": ["sliding_attention"] * 3})


def test_bad_latent_configs_name_the_key():
    base = get_arch("deepseek-v3")
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__ if f != "article"}
    with pytest.raises(ValueError, match=r"'kv_lora_rank' \(8000\) must be at most 'hidden_size' \(7168\)"):
        Architecture(**{**fields, "kv_lora_rank": 8000})
    with pytest.raises(ValueError, match=r"'qk_rope_head_dim' \(192\) must be even and below 'head_dim' \(192"):
        Architecture(**{**fields, "qk_rope_head_dim": 192})
    with pytest.raises(ValueError, match=r"'global_layers' \(62\) must be at most 'num_layers' \(61\)"):
        Architecture(**{**fields, "kv_lora_rank": 0, "q_lora_rank": 0, "qk_rope_head_dim": 0, "sliding_window": 8,
                        "global_layers": 62})  # fmt: skip
    with pytest.raises(ValueError, match=r"'qk_norm' must be one of"):
        Architecture(**{**fields, "qk_norm": "layer"})


def test_published_kv_cache_figures():
    # DeepSeek-V3: (512 + 64) × 61 layers × 2 bytes; Llama-3-70B: 2 × 8 × 128 × 80 × 2.
    assert kv_cache_bytes(get_arch("deepseek-v3"), 1) == (512 + 64) * 61 * 2 == 70_272
    assert kv_cache_bytes(get_arch("llama-3-70b"), 1) == 2 * 8 * 128 * 80 * 2 == 327_680
    assert kv_cache_bytes(get_arch("deepseek-v2"), 1) == (512 + 64) * 60 * 2


def test_windows_cap_the_cache():
    mistral = get_arch("mistral-7b")
    per_position = 2 * 8 * 128 * 32 * 2
    assert kv_cache_bytes(mistral, 4096) == kv_cache_bytes(mistral, 32768) == 4096 * per_position
    assert kv_cache_bytes(mistral, 100, 3) == 300 * per_position
    gemma2 = get_arch("gemma-2-9b")
    per_layer = 2 * 8 * 256 * 2
    assert kv_cache_bytes(gemma2, 8192) == (21 * 8192 + 21 * 4096) * per_layer
    gpt_oss = get_arch("gpt-oss-120b")
    assert kv_cache_bytes(gpt_oss, 131072) == (18 * 131072 + 18 * 128) * 2 * 8 * 64 * 2
    gemma3 = get_arch("gemma-3-27b")
    assert kv_cache_bytes(gemma3, 2048, dtype="fp32") == (10 * 2048 + 52 * 1024) * 2 * 16 * 128 * 4


@pytest.mark.parametrize(
    "name", ["llama-3-8b", "mistral-7b", "deepseek-v3", "gpt-oss-120b", "bert-base", "gemma-3-27b"]
)
def test_kv_variants_side_by_side(name):
    arch = get_arch(name)
    rows = kv_cache_variants(arch, 8192, 2, "fp16")
    (own,) = [r for r in rows if r.own]
    assert own.total == kv_cache_bytes(arch, 8192, 2, "fp16")
    by = {r.name: r for r in rows}
    h, dh, n = arch.num_heads, arch.head_dim, arch.num_layers
    if arch.attention_variant != "MLA":
        assert by["MHA"].per_token == 2 * h * dh * n * 2
        assert by["MQA"].per_token == 2 * dh * n * 2
        assert by["MLA"].per_token == (4 * dh + dh // 2) * n * 2  # DeepSeek-V2's d_c = 4 d_h, d_R = d_h / 2
        assert by["sliding window"].total <= by[arch.attention_variant if not arch.sliding_window else "GQA"].total
    else:
        assert by["MHA"].per_token == h * (dh + arch.value_head_dim) * n * 2
    assert all(r.source for r in rows)


def test_latent_cache_equals_what_hugging_face_caches():
    torch = pytest.importorskip("torch")
    config, model_class = _cases()["deepseek_v3"]
    model = model_class(config).eval()
    with torch.no_grad():
        out = model(torch.randint(0, 97, (3, 11)), use_cache=True)
    held = sum(t.numel() * t.element_size() for layer in out.past_key_values.layers for t in (layer.keys, layer.values))
    assert held == kv_cache_bytes(from_hf_config(config.to_dict()), 11, 3, "fp32")


def _size(capsys, *args):
    import typer

    from headwise.cli import app, main

    group = hasattr(typer.main.get_command(app), "commands")
    with pytest.raises(SystemExit) as info:
        main(["size", *args] if group else list(args))
    out, err = capsys.readouterr()
    return info.value.code, out, err


def test_cli_prints_the_latent_and_windowed_caches(capsys):
    rc, out, err = _size(capsys, "deepseek-v3", "--seq-len", "1")
    assert rc == 0, err
    assert "70,272 B" in out and "latent 512 + rope key 64" in out
    assert f"{total_params(get_arch('deepseek-v3')):,}" in out
    rc, out, err = _size(capsys, "mistral-7b", "--seq-len", "32768")
    assert rc == 0, err
    assert f"{4096 * 2 * 8 * 128 * 32 * 2:,} B" in out  # capped at the window
    assert "sliding window 4096 on every layer" in out
    for kind in ("MHA", "GQA", "MQA", "MLA", "sliding window"):
        assert f"│ {kind}" in out


def test_cli_reads_a_latent_config(capsys, tmp_path):
    config, _ = _cases()["deepseek_v3"]
    path = tmp_path / "config.json"
    path.write_text(config.to_json_string())
    rc, out, err = _size(capsys, "--config", str(path), "--seq-len", "10", "--dtype", "fp32")
    assert rc == 0, err
    assert f"{(10 + 4) * 4 * 4 * 10:,} B" in out  # (R + Dr) · layers · 4 bytes · 10 positions
