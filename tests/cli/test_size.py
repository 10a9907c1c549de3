"""``headwise size``: exit codes, and the key numbers (computed through the API) in its output."""

import json

import pytest

from headwise.cli import main
from headwise.sizing import (
    as_mha,
    attention_params,
    get_arch,
    kv_cache_bytes,
    list_archs,
    total_params,
)
from headwise.sizing.units import format_count


def run(capsys, *args):
    """Run ``headwise size ARGS``; returns (exit status, stdout, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["size", *args])
    out, err = capsys.readouterr()
    return info.value.code, out, err


def test_one_model_prints_q_k_v_o_share_and_kv_cache(capsys):
    rc, out, err = run(capsys, "llama-3-8b", "--seq-len", "4096", "--batch", "2", "--dtype", "fp16")
    assert rc == 0, err
    arch = get_arch("Llama-3-8B")
    att = attention_params(arch)
    for count in (att.q, att.k, att.o, att.per_layer, att.total, att.q * 32, att.k * 32):
        assert f"{count:,}" in out
    total = total_params(arch)
    assert f"{total:,}" in out
    assert f"{100 * att.total / total:.1f}%" in out
    assert f"{kv_cache_bytes(arch, 1, 1, 'fp16'):,} B" in out
    assert f"{kv_cache_bytes(arch, 4096, 2, 'fp16'):,} B" in out
    assert f"{kv_cache_bytes(as_mha(arch), 4096, 2, 'fp16'):,} B" in out  # plain MHA instead
    assert "4× smaller" in out
    assert "1.5B: off" in out  # the article's ~1.5B is flagged


def test_default_seq_len_is_the_context(capsys):
    rc, out, _ = run(capsys, "Mistral-7B")
    assert rc == 0
    arch = get_arch("Mistral-7B")
    assert f"seq_len {arch.max_positions} × batch 1" in out
    assert f"{kv_cache_bytes(arch, arch.max_positions, 1, 'bf16'):,} B" in out


def test_mha_model_has_no_saving_line(capsys):
    rc, out, _ = run(capsys, "gpt2", "--dtype", "int8", "--seq-len", "10")
    assert rc == 0
    assert "no GQA saving" in out
    assert f"{kv_cache_bytes(get_arch('gpt2'), 10, 1, 'int8'):,} B" in out


def test_all_prints_one_row_per_architecture_with_errata(capsys):
    rc, out, err = run(capsys, "--all")
    assert rc == 0, err
    lines = out.splitlines()
    for name in list_archs():
        arch = get_arch(name)
        att, total = attention_params(arch).total, total_params(arch)
        (row,) = [line for line in lines if line.startswith(f"│ {name} ")]
        for cell in (str(arch.hidden_size), format_count(att), format_count(total), f"{100 * att / total:.1f}%"):
            assert f" {cell} " in row, (name, cell)
    (row,) = [line for line in lines if line.startswith("│ Llama-2-7B ")]
    assert "31.9%" in row and "26%" in row and "OFF" in row
    (row,) = [line for line in lines if line.startswith("│ Llama-3-8B ")]
    assert "1.34B" in row and "1.5B" in row and "OFF" in row
    assert "total 6.74B (article 8B: off)" in out


def test_config_file(capsys, tmp_path):
    config = {
        "model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    }  # fmt: skip
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    rc, out, err = run(capsys, "--config", str(path), "--seq-len", "100")
    assert rc == 0, err
    att = attention_params(get_arch_from(path))
    assert "tiny" in out
    assert f"{att.total:,}" in out
    assert f"{total_params(get_arch_from(path)):,}" in out


def get_arch_from(path):
    from headwise.sizing import from_hf_config

    return from_hf_config(path)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["llama-4-8b"], "Llama-3-8B"),  # suggestions
        (["llama-3-8b", "--dtype", "fp8"], "--dtype: expected one of bf16|fp16|fp32|int8, got 'fp8'"),
        (["llama-3-8b", "--seq-len", "0"], "--seq-len: expected a positive integer, got 0"),
        (["llama-3-8b", "--batch", "-2"], "--batch: expected a positive integer, got -2"),
        (["--all", "--seq-len", "5"], "--seq-len"),
        (["llama-3-8b", "--all"], "give one of"),
        ([], "give one of"),
    ],
)
def test_user_mistakes_are_one_line_exit_2(capsys, args, needle):
    rc, out, err = run(capsys, *args)
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"model_type": "llama", "hidden_size": 64}', "missing key"),
        ('{"model_type": "llama", "vocab_size": 10, "hidden_size": "64"}', "'hidden_size'"),
        ("{ nope", "not valid JSON"),
        ('{"model_type": "t5"}', "'model_type' 't5' is not supported"),
    ],
)
def test_malformed_config_exit_2(capsys, tmp_path, content, needle):
    path = tmp_path / "config.json"
    path.write_text(content)
    rc, out, err = run(capsys, "--config", str(path))
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_missing_config_file_exit_2(capsys, tmp_path):
    rc, _, err = run(capsys, "--config", str(tmp_path / "nope.json"))
    assert rc == 2 and len(err.strip().splitlines()) == 1
