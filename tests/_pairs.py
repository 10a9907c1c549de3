"""Three prompt pairs of one length for the runs across ranks, and the tiny GQA decoder they run on."""

from __future__ import annotations

from pathlib import Path

#: Three pairs of one length (two ranks get 2 and 1 of them where pairs are split): clean, corrupted, answer, wrong.
PAIRS = [
    ("the cat sat on the mat and the dog", "the dog sat on the mat and the dog", "cat", "dog"),
    ("a dog ran to the tree and the cat", "a cat ran to the tree and the cat", "dog", "cat"),
    ("a cat saw the red house and the dog", "a dog saw the red house and the dog", "cat", "dog"),
]


def pairs_decoder(root: Path):
    """``(folder, opened model, clean ids (3, L), corrupted ids (3, L), answer ids, wrong ids)`` of :data:`PAIRS` on
    a saved 2-layer × 4-head GQA Llama with the tiny word tokenizer."""
    import torch

    from _decoders import save_decoder
    from headwise.models import open_model

    folder = save_decoder(Path(root) / "llama", "llama", init=0.5)
    hm = open_model(folder)
    tok = hm.tokenizer
    c = torch.tensor([tok.encode(p[0]).ids for p in PAIRS])
    x = torch.tensor([tok.encode(p[1]).ids for p in PAIRS])
    answer = [tok.token_to_id(p[2]) for p in PAIRS]
    wrong = [tok.token_to_id(p[3]) for p in PAIRS]
    return folder, hm, c, x, answer, wrong
