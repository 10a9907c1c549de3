"""``headwise heads``: outputs, corpus mode, the untrained block, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import shutil
from dataclasses import astuple

import pytest

from _cli_helpers import assert_user_error
from headwise.viz.report import OUTPUTS

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer, 2-head, D = 8 BERT with 16 positions and random weights, saved as Hugging Face names
    (built with headwise itself: no transformers needed), with the bundled model's tokenizer."""
    import torch
    from safetensors.torch import save_file

    from headwise.models import BertConfig, BertEncoder, checkpoint_names, default_model_path

    folder = tmp_path_factory.mktemp("tiny")
    config = dict(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16)
    config.update(max_position_embeddings=16, model_type="bert")
    (folder / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = BertEncoder(BertConfig(**{k: v for k, v in config.items() if k != "model_type"}))
    state = model.state_dict()
    save_file({hf: state[mine].contiguous() for mine, hf in checkpoint_names(2).items()}, folder / "model.safetensors")
    shutil.copy(default_model_path() / "tokenizer.json", folder / "tokenizer.json")
    return folder


def test_sentence_writes_every_output(run_cli, tmp_path):
    code, out, err = astuple(
        run_cli("heads", "In the beginning God created the heavens and the earth.", "--out", str(tmp_path))
    )
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(OUTPUTS)
    data = json.loads((tmp_path / "heads.json").read_text())
    assert (data["num_layers"], data["num_heads"], data["num_sentences"]) == (6, 12, 1)
    assert data["sentence"]["tokens"][0] == "[CLS]" and data["model"].startswith("all-MiniLM-L6-v2")
    assert "role" in out and "roles:" in out and "[CLS] sink" in out
    assert len((tmp_path / "heads.csv").read_text().splitlines()) == 1 + 72


def test_corpus_skips_undecodable_lines_and_shows_one_layer(run_cli, tmp_path, tiny):
    corpus = tmp_path / "c.txt"
    long_line = " ".join(["light"] * 20)
    corpus.write_bytes(b"It was good.\n\xff\xfe broken line\n\nGod saw the light.\n" + long_line.encode() + b"\n")
    argv = ["heads", "--corpus", str(corpus), "--model", str(tiny), "--layer", "1", "--out", str(tmp_path / "o")]
    code, out, err = astuple(run_cli(*argv))
    assert code == 0, err
    assert "skipped 1 line(s) that are not valid UTF-8 (line 2)" in err
    assert "1 line(s) longer than 16 tokens were truncated to 16" in err
    data = json.loads((tmp_path / "o" / "heads.json").read_text())
    assert data["corpus"]["sentences"] == 3 and data["corpus"]["skipped_undecodable"] == 1
    assert data["sentence"]["text"] == "It was good." and data["num_tokens"] == 6 + 7 + 16
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) == 2 and all(r.split("│")[1].strip() == "1" for r in rows)


def test_untrained_block(run_cli, tmp_path):
    code, out, err = astuple(run_cli("heads", "the cat sat on the mat", "--model", "untrained", "--out", str(tmp_path)))
    assert code == 0, err
    data = json.loads((tmp_path / "heads.json").read_text())
    assert (data["num_layers"], data["num_heads"]) == (1, 4) and data["model"].startswith("untrained AttentionBlock")


def test_too_long_text_is_truncated_with_a_warning(run_cli, tmp_path, tiny):
    code, out, err = astuple(run_cli("heads", " ".join(["word"] * 30), "--model", str(tiny), "--out", str(tmp_path)))
    assert code == 0, err
    assert "warning: TEXT: 32 tokens, more than the model's 16 positions; truncated to the first 16" in err
    data = json.loads((tmp_path / "heads.json").read_text())
    assert len(data["sentence"]["tokens"]) == 16 and data["sentence"]["tokens"][-1] == "[SEP]"
    assert (data["num_layers"], data["num_heads"]) == (2, 2) and data["model"].startswith(tiny.name)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["heads", "   "], "TEXT: expected a non-empty text"),
        (["heads"], "expected a TEXT or --corpus FILE"),
        (["heads", "x", "--model", "/nonexistent/ckpt"], "--model: model: no such folder"),
        (["heads", "x", "--corpus", "/nonexistent.txt"], "--corpus: no such file"),
        (["heads", "x", "--layer", "6"], "--layer: expected 0 … 5"),
    ],
)
def test_errors_are_one_line(run_cli, tmp_path, argv, message):
    outcome = run_cli(*argv, "--out", str(tmp_path / "o"))
    assert_user_error(outcome, message)


def test_corrupt_checkpoint_and_empty_corpus(run_cli, tmp_path):
    from headwise.models import default_model_path

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name in ("config.json", "tokenizer.json", "vocab.txt"):
        shutil.copy(default_model_path() / name, ckpt / name)
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 100)
    outcome = run_cli("heads", "x", "--model", str(ckpt), "--out", str(tmp_path / "o"))
    assert_user_error(outcome, "model.safetensors: corrupt or truncated safetensors file")
    corpus = tmp_path / "bad.txt"
    corpus.write_bytes(b"\xff\xfe\n\n")
    outcome = run_cli("heads", "--corpus", str(corpus), "--out", str(tmp_path / "o"))
    assert_user_error(outcome, "--corpus: no non-empty UTF-8 line")
    assert "(1 undecodable line(s) skipped)" in outcome.err


def test_a_model_folder_is_opened_once_per_command(run_cli, tiny, tmp_path, monkeypatch):
    """``--model DIR --importance`` on a BERT folder: the folder is checked once and its weights read once."""
    import headwise.models.sources as sources

    calls = {"inspect_folder": 0, "load_bert": 0}
    for name in calls:
        original = getattr(sources, name)

        def counted(*args, name=name, original=original, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(sources, name, counted)
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat .\nin the beginning god created the earth .\n")
    outcome = run_cli(
        "heads", "--model", str(tiny), "--corpus", str(corpus), "--importance", "--out", str(tmp_path / "o")
    )
    assert outcome.code == 0, outcome.err
    assert calls == {"inspect_folder": 1, "load_bert": 1}
    assert (tmp_path / "o" / "pruning.csv").read_text().startswith("removed,importance,estimate,")


def test_more_heads_than_a_screen_are_summarised_by_role(run_cli, tmp_path):
    """72 heads: each role counted with its strongest heads, every row left to the files (``--layer`` keeps the table:
    test_corpus_skips_undecodable_lines_and_shows_one_layer)."""
    code, out, err = astuple(run_cli("heads", "The cat sat on the mat.", "--out", str(tmp_path / "a")))
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) < 20
    data = json.loads((tmp_path / "a" / "heads.json").read_text())
    counts: dict = {}
    for row in data["heads"]:
        counts[row["role"]] = counts.get(row["role"], 0) + 1
    for role, n in counts.items():  # each role's line: its count
        assert any(line.split(role)[-1].split()[0] == str(n) for line in lines if line.startswith(f"  {role} "))
    assert "heads.csv" in out and "┏" not in out  # no table
