"""One sentence through a model: its per-head report, its tokens and its attention maps, ready to draw.

Shape legend: NL layers, H heads per layer, n tokens of the sentence.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from headwise.analysis.corpus import HeadReport, HeadStats
from headwise.analysis.roles import RoleThresholds
from headwise.analysis.tokens import TokenInfo

__all__ = ["SentenceHeads", "analyze_sentence", "bert_sentence_heads"]


@dataclass
class SentenceHeads:
    """A sentence's heads.

    Attributes:
        report: every metric of every head over this sentence alone (Voita's positional test then pools
            this sentence's tokens only).
        tokens: the n tokens, special ones included.
        attentions: ``(NL, H, n, n)`` float32 weights.
    """

    report: HeadReport
    tokens: list[str]
    attentions: np.ndarray


def analyze_sentence(
    text: str,
    attend: Callable[[list[str]], tuple[list, TokenInfo]],
    *,
    num_layers: int,
    num_heads: int,
    max_length: int = 512,
    thresholds: RoleThresholds | None = None,
) -> SentenceHeads:
    """Run ``attend`` on one text and report its heads (see :func:`headwise.analysis.analyze_texts`)."""
    maps, info = attend([text])
    stats = HeadStats(num_layers, num_heads, max_length=max_length, thresholds=thresholds)
    stats.update(maps, info)
    idx = np.flatnonzero(np.asarray(info.valid)[0])
    a = np.stack([np.asarray(m)[0][:, idx][:, :, idx] for m in maps]).astype(np.float32)  # (NL, H, n, n)
    tokens = list(info.tokens[0]) if info.tokens is not None else [str(i) for i in range(idx.size)]
    return SentenceHeads(stats.result(), tokens, a)


def bert_sentence_heads(text: str, *, path: str | os.PathLike | None = None) -> SentenceHeads:
    """The heads of a BERT checkpoint (default: the bundled all-MiniLM-L6-v2) on one text.

    This is the entry point for ``headwise demo``: pass the result to
    :func:`headwise.viz.report.write_head_views` for ``heads.png``, ``roles.png`` and ``headview.html``.

    Raises:
        FileNotFoundError / ValueError: as :func:`headwise.models.load_bert` and
        :func:`headwise.models.encode` (empty text). Warns ``TruncationWarning`` past 512 tokens.
    """
    from headwise.analysis.attend import model_attend
    from headwise.models import load_bert

    model, tokenizer = load_bert(path)
    c = model.config
    return analyze_sentence(
        text,
        model_attend(model, tokenizer),
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        max_length=c.max_position_embeddings,
    )
