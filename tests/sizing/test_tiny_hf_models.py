"""The formulas against real modules: tiny Hugging Face models built offline from configs.

``total_params(from_hf_config(config.to_dict()))`` must equal ``sum(p.numel())`` of the model that
``transformers`` builds from the same config, and Q, K, V, O must equal the attention submodules'
parameter counts, exactly.
"""

import pytest

transformers = pytest.importorskip("transformers")

from headwise.sizing import attention_params, from_hf_config, kv_cache_bytes, total_params  # noqa: E402

SMALL = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, max_position_embeddings=64)


def _numel(module):
    return sum(p.numel() for p in module.parameters())


def _rope_cases():
    T = transformers
    return [
        ("llama-gqa", T.LlamaConfig(**SMALL, num_attention_heads=6, num_key_value_heads=2), T.LlamaForCausalLM),
        (
            "llama-biases-tied-headdim",
            T.LlamaConfig(
                **SMALL, num_attention_heads=6, num_key_value_heads=3, head_dim=10, attention_bias=True,
                mlp_bias=True, tie_word_embeddings=True,
            ),
            T.LlamaForCausalLM,
        ),
        ("llama-mqa", T.LlamaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=1), T.LlamaForCausalLM),
        ("mistral", T.MistralConfig(**SMALL, num_attention_heads=6, num_key_value_heads=2), T.MistralForCausalLM),
        ("qwen2", T.Qwen2Config(**SMALL, num_attention_heads=6, num_key_value_heads=2), T.Qwen2ForCausalLM),
        (
            "gemma2",
            T.Gemma2Config(**SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
            T.Gemma2ForCausalLM,
        ),
        (
            "gemma",
            T.GemmaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
            T.GemmaForCausalLM,
        ),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(7))
def test_rope_family_counts_equal_torch(case):
    label, config, model_class = _rope_cases()[case]
    model = model_class(config)
    arch = from_hf_config(config.to_dict())
    assert total_params(arch) == _numel(model), label
    attn = model.model.layers[0].self_attn
    counts = attention_params(arch)
    assert counts.q == _numel(attn.q_proj), label
    assert counts.k == _numel(attn.k_proj), label
    assert counts.v == _numel(attn.v_proj), label
    assert counts.o == _numel(attn.o_proj), label
    assert counts.per_layer == _numel(attn), label
    assert counts.total == sum(_numel(layer.self_attn) for layer in model.model.layers), label


def test_gpt2_counts_equal_torch():
    config = transformers.GPT2Config(vocab_size=97, n_embd=48, n_layer=3, n_head=4, n_positions=64, n_inner=72)
    model = transformers.GPT2LMHeadModel(config)
    arch = from_hf_config(config.to_dict())
    assert total_params(arch) == _numel(model)
    attn = model.transformer.h[0].attn
    counts = attention_params(arch)
    assert counts.q + counts.k + counts.v == _numel(attn.c_attn)  # the fused Conv1D
    assert counts.o == _numel(attn.c_proj)
    assert counts.per_layer == _numel(attn)


def test_gpt2_untied_head():
    config = transformers.GPT2Config(
        vocab_size=97, n_embd=48, n_layer=2, n_head=4, n_positions=64, tie_word_embeddings=False
    )
    model = transformers.GPT2LMHeadModel(config)
    assert total_params(from_hf_config(config.to_dict())) == _numel(model)


def test_bert_counts_equal_torch():
    config = transformers.BertConfig(
        vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
        max_position_embeddings=64, type_vocab_size=3,
    )  # fmt: skip
    model = transformers.BertModel(config)  # with its pooler
    arch = from_hf_config(config.to_dict())
    assert total_params(arch) == _numel(model)
    attn = model.encoder.layer[0].attention
    counts = attention_params(arch)
    assert counts.q == _numel(attn.self.query)
    assert counts.k == _numel(attn.self.key)
    assert counts.v == _numel(attn.self.value)
    assert counts.o == _numel(attn.output.dense)


def test_kv_cache_equals_a_real_cache():
    """The bytes of the K and V tensors a Hugging Face forward caches, for a GQA Llama."""
    import torch

    config = transformers.LlamaConfig(**SMALL, num_attention_heads=6, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config).eval()
    batch, seq = 3, 5
    with torch.no_grad():
        out = model(torch.zeros(batch, seq, dtype=torch.long), use_cache=True)
    cache = out.past_key_values
    nbytes = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert kv_cache_bytes(from_hf_config(config.to_dict()), seq, batch, "fp32") == nbytes
