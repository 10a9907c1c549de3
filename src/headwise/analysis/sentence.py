"""One sentence through a model: its per-head report, its tokens and its attention maps, ready to draw.

Shape legend: NL layers, H heads per layer, n tokens of the sentence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from headwise.analysis.corpus import HeadReport, HeadStats
from headwise.analysis.roles import RoleThresholds
from headwise.analysis.tokens import as_token_info

__all__ = ["SentenceHeads", "analyze_sentence"]


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
    attend: Callable[[list[str]], tuple[list, object]],
    *,
    num_layers: int,
    num_heads: int,
    max_length: int = 512,
    thresholds: RoleThresholds | None = None,
) -> SentenceHeads:
    """Run ``attend`` on one text and report its heads (see :func:`headwise.analysis.analyze_texts`).

    ``attend`` returns NL maps ``(1, H, L, L)`` and the text's token info (or its tokenizer batch), as
    the adapters of :mod:`headwise.models.attend` do.
    """
    maps, info = attend([text])
    info = as_token_info(info)
    stats = HeadStats(num_layers, num_heads, max_length=max_length, thresholds=thresholds)
    stats.update(maps, info)
    idx = np.flatnonzero(np.asarray(info.valid)[0])
    a = np.stack([np.asarray(m)[0][:, idx][:, :, idx] for m in maps]).astype(np.float32)  # (NL, H, n, n)
    tokens = list(info.tokens[0]) if info.tokens is not None else [str(i) for i in range(idx.size)]
    return SentenceHeads(stats.result(), tokens, a)
