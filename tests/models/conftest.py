"""Checkpoint folders for the model tests: a tiny random BERT saved by Hugging Face (safetensors + vocab.txt)."""

from __future__ import annotations

import pytest

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "in",
    "beginning",
    "god",
    "created",
    "heaven",
    "earth",
    "and",
    "it",
    "was",
    "good",
    ".",
    ",",
    "!",
    "?",
]


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A 2-layer, 4-head, D = 32 BERT with random weights, as ``save_pretrained`` writes it."""
    transformers = pytest.importorskip("transformers")
    import torch

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + ["##s", "##ed"]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=24,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    with torch.no_grad():  # non-trivial LayerNorms, so that a mapping mix-up shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return folder
