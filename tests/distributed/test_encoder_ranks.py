"""An encoder's corpus statistics across ranks (:func:`headwise.study.encoder_corpus`): on a world of one gloo rank
against the one-process :func:`headwise.study.encoder_report` (every array of the report), resumed from its shards
and refused on another run's; and ``torchrun --nproc-per-node 2 -m headwise heads --model ENCODER --corpus …
--importance`` against the one-process run (heads.json, heads.csv, pruning.csv)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch.distributed as dist  # noqa: E402

from _corpus import make_corpus, max_difference  # noqa: E402
from _decoders import WORDS  # noqa: E402
from headwise import study  # noqa: E402


def save_bert(folder, *, positions: int = 24, seed: int = 0):
    """A 2-layer, 4-head, D = 32 random BERT (safetensors + vocab.txt) whose WordPiece vocabulary holds the tiny
    corpus's words; ``positions`` short enough that the long corpus line is cut."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(w.lower() for w in WORDS)]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=positions, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        initializer_range=0.5,
    )  # fmt: skip
    torch.manual_seed(seed)
    transformers.BertModel(config).eval().save_pretrained(folder, safe_serialization=True)
    return folder


pytestmark = pytest.mark.usefixtures("one_thread")  # the references at the ranks' thread count


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    from headwise.models import open_model

    root = tmp_path_factory.mktemp("enc")
    folder = save_bert(root / "bert")
    return folder, open_model(folder), make_corpus(root / "corpus.txt", lines=14, seed=2)


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _assert_same_report(a, b, tol=1e-9):
    assert a.num_sentences == b.num_sentences and a.num_tokens == b.num_tokens
    for name in a.metrics:
        np.testing.assert_allclose(a.metrics[name], b.metrics[name], rtol=0, atol=tol, equal_nan=True, err_msg=name)
    np.testing.assert_array_equal(a.roles, b.roles)
    np.testing.assert_array_equal(a.positional, b.positional)
    for name in ("js_divergence", "js_distance"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0, atol=tol, err_msg=name)


def test_encoder_corpus_on_one_rank_equals_one_process_and_resumes(encoder, tmp_path, world_of_one):
    folder, hm, corpus = encoder
    opts = study.HeadsOptions(corpus=str(corpus), model=str(folder), out=tmp_path / "out", batch_size=4)
    enc = study.encoder_attend(opts.model, hm)
    warned_one, warned = [], []
    reader, _ = study.encoder_texts(opts, warn=warned_one.append)
    want = study.encoder_report(reader, enc, opts.batch_size, warn=warned_one.append)
    run = study.encoder_corpus(enc, hm.model, hm.tokenizer, opts, warn=warned.append)
    _assert_same_report(run.heads, want)
    assert (run.documents, run.computed, run.resumed) == (14, [0, 1, 2, 3], [])
    assert run.truncated > 0 and warned == [m for m in warned_one if "truncated" in m]
    again = study.encoder_corpus(enc, hm.model, hm.tokenizer, opts, warn=[].append)
    assert (again.computed, again.resumed) == ([], [0, 1, 2, 3])
    _assert_same_report(again.heads, want)
    other = study.HeadsOptions(corpus=str(corpus), model=str(folder), out=tmp_path / "out", batch_size=5)
    with pytest.raises(ValueError, match="holds shards of another run"):
        study.encoder_corpus(enc, hm.model, hm.tokenizer, other, warn=[].append)
    assert json.loads((tmp_path / "out" / "shards" / "manifest.json").read_text())["kind"] == "encoder-heads"


def test_encoder_corpus_comparison_can_fail(encoder, tmp_path, world_of_one):
    """Another model's statistics differ from these by far more than the tolerance."""
    from headwise.models import open_model

    folder, hm, corpus = encoder
    opts = study.HeadsOptions(corpus=str(corpus), model=str(folder), out=tmp_path / "a", batch_size=4)
    run = study.encoder_corpus(study.encoder_attend(opts.model, hm), hm.model, hm.tokenizer, opts, warn=[].append)
    other = open_model(save_bert(tmp_path / "bert2", seed=1))
    opts2 = study.HeadsOptions(corpus=str(corpus), model=str(tmp_path / "bert2"), out=tmp_path / "b", batch_size=4)
    run2 = study.encoder_corpus(
        study.encoder_attend(opts2.model, other), other.model, other.tokenizer, opts2, warn=[].append
    )
    with pytest.raises(AssertionError):
        _assert_same_report(run2.heads, run.heads)


@pytest.mark.slow
def test_torchrun_encoder_with_importance_equals_one_process(encoder, tmp_path):
    """Two gloo ranks under torchrun: the encoder's corpus statistics and ``--importance`` (the embedding's turning
    rate, ablations and pruning curves) split; heads.json (the sweep's own work and seconds aside), heads.csv and
    pruning.csv equal one process's to 1e-6."""
    import subprocess
    import sys
    from pathlib import Path

    from _corpus import free_port
    from headwise.cli import main

    sys.path.insert(0, str(Path(__file__).parent))
    from test_corpus_launch import TORCHRUN, _env
    from test_importance_ranks import _rows, _same_table

    folder, _, corpus = encoder
    common = ["--model", str(folder), "--corpus", str(corpus), "--batch-size", "4", "--importance",
              "--importance-sentences", "10"]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main(["heads", *common, "--out", str(tmp_path / "one")])
    assert stop.value.code in (0, None)
    out = tmp_path / "two"
    run = subprocess.run(
        [*TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "headwise", "heads", *common,
         "--out", str(out)],
        env=_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 ranks, 14 documents" in run.stdout and "importance across 2 ranks" in run.stdout
    one, two = (json.loads((d / "heads.json").read_text()) for d in (tmp_path / "one", out))
    for data in (one, two):
        data["importance"].pop("sweep")
    assert max_difference(two, one) <= 1e-6
    for name in ("heads.csv", "pruning.csv"):
        _same_table(_rows(out / name), _rows(tmp_path / "one" / name), 1e-6)
