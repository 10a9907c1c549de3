"""Lookup by name, the data file's checks, and reading Hugging Face config.json (good and malformed)."""

import json

import pytest

from headwise.sizing import Architecture, attention_params, from_hf_config, get_arch, total_params


@pytest.mark.parametrize("name", ["llama-3-8b", "Llama-3-8B", "LLAMA_3_8B", "llama3 8b", "meta-llama/Meta-Llama-3-8B"])
def test_names_are_tolerant(name):
    assert get_arch(name).name == "Llama-3-8B"


def test_other_aliases():
    assert get_arch("gpt2").name == "GPT-2 small"
    assert get_arch("gpt2-xl").name == "GPT-2 XL"
    assert get_arch("llama-3.1-405b").name == "Llama-3.1-405B"
    assert get_arch("bert-base-uncased").name == "BERT-base"
    assert get_arch("qwen2.5-7b").name == "Qwen2.5-7B"


def test_unknown_name_suggests_closest():
    with pytest.raises(ValueError, match="unknown architecture 'llama-4-8b'") as info:
        get_arch("llama-4-8b")
    assert "Llama-3-8B" in str(info.value)
    with pytest.raises(ValueError, match="Mistral-7B"):
        get_arch("mistrall-7b")
    with pytest.raises(ValueError, match="known:"):
        get_arch("zzzz")
    with pytest.raises(TypeError, match="name"):
        get_arch(7)


ENTRY = {
    "name": "Tiny",
    "source": "test",
    "vocab_size": 10, "hidden_size": 8, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 4,
    "intermediate_size": 16, "ffn": "mlp", "qkv_bias": False, "o_bias": False, "mlp_bias": False,
    "norm": "rmsnorm", "norms_per_layer": 2, "embedding_norm": False, "final_norm": True,
    "max_positions": 32, "learned_positions": False, "type_vocab_size": 0, "output_head": "tied",
    "pooler": False,
}  # fmt: skip


def test_data_entry_checks_name_the_field():
    arch = Architecture.from_dict(ENTRY)
    assert total_params(arch) == 10 * 8 + (8 * 8 + 8 * 4 * 2 + 8 * 8) + (8 * 16 * 2) + 2 * 8 + 8
    for key, value, needle in [
        ("num_kv_heads", 3, "'num_kv_heads' \\(3\\) must divide 'num_heads' \\(2\\)"),
        ("hidden_size", 8.0, "'hidden_size' must be an integer"),
        ("ffn", "moe", "'ffn' must be one of"),
        ("qkv_bias", 1, "'qkv_bias' must be true or false"),
        ("bogus", 1, "unknown key 'bogus'"),
    ]:
        with pytest.raises(ValueError, match=needle):
            Architecture.from_dict({**ENTRY, key: value})
    broken = dict(ENTRY)
    del broken["head_dim"]
    with pytest.raises(ValueError, match="missing key 'head_dim'"):
        Architecture.from_dict(broken)


# config.json files as published on the Hugging Face hub (the keys that matter), typed in by hand.
HUB_CONFIGS = {
    "Llama-2-7B": {
        "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "attention_bias": False,
    },
    "Llama-3-8B": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 8192, "tie_word_embeddings": False,
    },
    "Mistral-7B": {
        "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 32768, "sliding_window": 4096, "tie_word_embeddings": False,
    },
    "Qwen2.5-7B": {
        "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 131072, "tie_word_embeddings": False,
    },
    "Gemma-2-9B": {
        "model_type": "gemma2", "vocab_size": 256000, "hidden_size": 3584, "intermediate_size": 14336,
        "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
        "max_position_embeddings": 8192,
    },
    "GPT-2 small": {
        "model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
        "n_positions": 1024, "n_ctx": 1024,
    },
    "BERT-base": {
        "model_type": "bert", "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512,
        "type_vocab_size": 2,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HUB_CONFIGS))
def test_hub_config_gives_the_builtin_counts(name, tmp_path):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(HUB_CONFIGS[name]))
    arch, builtin = from_hf_config(path), get_arch(name)
    assert arch.name == name  # the folder's name
    assert total_params(arch) == total_params(builtin)
    assert attention_params(arch) == attention_params(builtin)
    assert (arch.num_kv_heads, arch.head_dim) == (builtin.num_kv_heads, builtin.head_dim)
    assert from_hf_config(path.parent).name == name  # a folder holding config.json
    assert from_hf_config(HUB_CONFIGS[name], name="x").name == "x"


LLAMA = HUB_CONFIGS["Llama-3-8B"]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"hidden_size": None}, "missing key 'hidden_size'"),
        ({"num_hidden_layers": None}, "missing key 'num_hidden_layers'"),
        ({"model_type": None}, "missing key 'model_type'"),
        ({"model_type": "mamba"}, "'model_type' 'mamba' is not supported; supported: bert"),
        ({"hidden_size": "4096"}, r"^config: 'hidden_size' must be an integer >= 1, got '4096' \(str\)"),
        ({"intermediate_size": 14336.0}, "'intermediate_size' must be an integer"),
        ({"num_attention_heads": 0}, "'num_attention_heads' must be an integer >= 1, got 0"),
        ({"num_key_value_heads": 5}, "'num_key_value_heads' \\(5\\) must divide 'num_attention_heads' \\(32\\)"),
        ({"hidden_size": 4100}, "'hidden_size' \\(4100\\) is not divisible by 'num_attention_heads' \\(32\\)"),
        ({"tie_word_embeddings": "no"}, "'tie_word_embeddings' must be true or false"),
        ({"vocab_size": True}, "'vocab_size' must be an integer"),
    ],
)
def test_malformed_config_names_the_key(change, needle):
    config = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=needle) as e:
        from_hf_config(config)
    assert type(e.value) is ValueError


def test_head_dim_given_allows_indivisible_hidden():
    arch = from_hf_config({**LLAMA, "hidden_size": 4100, "head_dim": 128})
    assert attention_params(arch).q == 4100 * 32 * 128


def test_malformed_gpt2_and_bert():
    gpt2 = HUB_CONFIGS["GPT-2 small"]
    with pytest.raises(ValueError, match="missing key 'n_embd'"):
        from_hf_config({k: v for k, v in gpt2.items() if k != "n_embd"})
    with pytest.raises(ValueError, match="'n_embd' \\(770\\) is not divisible by 'n_head' \\(12\\)"):
        from_hf_config({**gpt2, "n_embd": 770})
    bert = HUB_CONFIGS["BERT-base"]
    with pytest.raises(ValueError, match="'type_vocab_size' must be an integer >= 0"):
        from_hf_config({**bert, "type_vocab_size": -1})


def test_config_files_that_are_not_configs(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{ not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        from_hf_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        from_hf_config(bad)
    with pytest.raises(FileNotFoundError, match=r"config: no such file: .*missing\.json"):
        from_hf_config(tmp_path / "missing.json")
    with pytest.raises(TypeError, match="path_or_dict"):
        from_hf_config(42)
