"""Totals of the built-in architectures against published figures, and the arithmetic by hand."""

import pytest

from headwise.sizing import (
    as_mha,
    attention_params,
    dtype_bytes,
    get_arch,
    kv_cache_bytes,
    list_archs,
    load_architectures,
    param_breakdown,
    total_params,
)
from headwise.sizing.units import format_bytes, format_count

# Published totals, typed in from the sources named (Hugging Face checkpoints' parameter counts;
# GPT-3 from Brown et al. 2020, Table 2.1) — not taken from the package's data file.
PUBLISHED = {
    "BERT-base": 109.48e6,
    "BERT-large": 335.1e6,
    "GPT-2 small": 124.44e6,
    "GPT-2 medium": 354.8e6,
    "GPT-2 large": 774.0e6,
    "GPT-2 XL": 1557.6e6,
    "GPT-3 175B": 175e9,
    "Llama-2-7B": 6.738e9,
    "Llama-2-13B": 13.016e9,
    "Llama-2-70B": 68.977e9,
    "Llama-3-8B": 8.030e9,
    "Llama-3-70B": 70.554e9,
    "Llama-3.1-405B": 405.85e9,
    "Mistral-7B": 7.242e9,
    "Qwen2.5-7B": 7.616e9,
    "Gemma-2-9B": 9.242e9,
}


def test_every_required_architecture_is_there_with_a_source():
    names = list_archs()
    assert set(PUBLISHED) <= set(names)
    assert len(names) >= 15
    for arch in load_architectures():
        assert arch.source, arch.name
        assert arch.published_source, arch.name


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_within_half_a_percent_of_published(name):
    arch = get_arch(name)
    total = total_params(arch)
    assert abs(total / PUBLISHED[name] - 1) < 0.005, (name, total)
    # the data file's published figure is the same one (it is shown beside the computed total)
    assert arch.published_total == pytest.approx(PUBLISHED[name], rel=1e-9)


def test_exact_totals_of_well_known_checkpoints():
    # exact parameter counts of the Hugging Face checkpoints (sum of tensor sizes in their safetensors)
    assert total_params(get_arch("bert-base-uncased")) == 109_482_240
    assert total_params(get_arch("gpt2")) == 124_439_808
    assert total_params(get_arch("llama-2-7b")) == 6_738_415_616
    assert total_params(get_arch("llama-3-8b")) == 8_030_261_248
    assert total_params(get_arch("mistral-7b")) == 7_241_732_096


def test_attention_by_hand():
    # Llama-2-7B: plain MHA, no biases: 4 * 4096^2 per layer, 32 layers (seeds README: 2.15B)
    a = attention_params(get_arch("Llama-2-7B"))
    assert (a.q, a.k, a.v, a.o) == (4096**2,) * 4
    assert a.total == 32 * 4 * 4096**2 == 2_147_483_648
    # Llama-3-8B: 8 KV heads of 128 -> K and V are 4096 -> 1024 (seeds README: 1.34B, not ~1.5B)
    a = attention_params(get_arch("Llama-3-8B"))
    assert (a.q, a.k, a.v, a.o) == (4096 * 4096, 4096 * 1024, 4096 * 1024, 4096 * 4096)
    assert a.total == 32 * (2 * 4096**2 + 2 * 4096 * 1024)
    # GPT-2 small: biases everywhere
    a = attention_params(get_arch("gpt2"))
    assert a.per_layer == 4 * (768 * 768 + 768)
    # Qwen2.5-7B: 28 heads x 128, 4 KV heads, biases on Q, K, V only
    a = attention_params(get_arch("Qwen2.5-7B"))
    assert (a.q, a.k, a.v, a.o) == (3584 * 3584 + 3584, 3584 * 512 + 512, 3584 * 512 + 512, 3584 * 3584)
    # Gemma-2-9B: 16 x 256 = 4096 query features from d_model 3584
    a = attention_params(get_arch("Gemma-2-9B"))
    assert (a.q, a.k, a.v, a.o) == (3584 * 4096, 3584 * 2048, 3584 * 2048, 4096 * 3584)


def test_seeds_errata_figures():
    arch = get_arch("Llama-2-7B")
    share = attention_params(arch).total / total_params(arch)
    assert share == pytest.approx(0.3187, abs=5e-4)  # ~32%, not the article's 26%


def test_breakdown_by_hand_bert_base():
    p = param_breakdown(get_arch("BERT-base"))
    d, f = 768, 3072
    assert p.token_embedding == 30522 * d
    assert p.position_embedding == 512 * d
    assert p.token_type_embedding == 2 * d
    assert p.embedding_norm == 2 * d
    assert p.ffn == 12 * (d * f + f + f * d + d)
    assert p.layer_norms == 12 * 2 * 2 * d
    assert p.pooler == d * d + d
    assert p.output_head == 0 and p.final_norm == 0


def test_tied_and_untied_heads():
    assert param_breakdown(get_arch("gpt2")).output_head == 0  # tied to wte
    assert param_breakdown(get_arch("Gemma-2-9B")).output_head == 0
    assert param_breakdown(get_arch("Llama-3-8B")).output_head == 128256 * 4096


def test_kv_cache_by_hand():
    arch = get_arch("Llama-3-8B")
    per_token = 2 * 32 * 8 * 128  # K and V, 32 layers, 8 KV heads of 128
    assert kv_cache_bytes(arch, 1, 1, "bf16") == per_token * 2
    assert kv_cache_bytes(arch, 8192, 4, "fp32") == per_token * 8192 * 4 * 4
    assert kv_cache_bytes(arch, 100, 3, "int8") == per_token * 100 * 3
    assert kv_cache_bytes(arch, 8192, 1, "fp16") == 2**30
    mha = as_mha(arch)
    assert mha.num_kv_heads == 32 and mha.published_total is None
    assert kv_cache_bytes(mha, 8192, 1, "bf16") == 4 * kv_cache_bytes(arch, 8192, 1, "bf16")
    assert attention_params(mha).total == attention_params(get_arch("Llama-2-7B")).total
    # an MHA model is its own MHA
    gpt2 = get_arch("gpt2")
    assert kv_cache_bytes(as_mha(gpt2), 10, 2) == kv_cache_bytes(gpt2, 10, 2)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"seq_len": 0}, "seq_len"),
        ({"seq_len": 1.5}, "seq_len"),
        ({"seq_len": True}, "seq_len"),
        ({"batch": 0}, "batch"),
        ({"batch": "2"}, "batch"),
        ({"dtype": "fp8"}, "dtype"),
    ],
)
def test_kv_cache_bad_input(kwargs, needle):
    args = {"seq_len": 16, "batch": 1, "dtype": "bf16", **kwargs}
    with pytest.raises(ValueError, match=needle):
        kv_cache_bytes(get_arch("gpt2"), **args)


def test_dtype_names():
    assert [dtype_bytes(d) for d in ("bf16", "FP16", "fp32", "int8", "bfloat16", "float32")] == [2, 2, 4, 1, 2, 4]


def test_units():
    assert format_count(124_439_808) == "124.44M"
    assert format_count(6_738_415_616) == "6.74B"
    assert format_count(512) == "512"
    assert format_bytes(131_072) == "128.00 KiB"
    assert format_bytes(2**30) == "1.00 GiB"
    assert format_bytes(12) == "12 B"
