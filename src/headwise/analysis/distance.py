"""Mean attention distance: how far, in tokens, a head looks on average.

Shape legend: B batch, H heads, L sequence length.

For one sentence of n real tokens, query row i has mean distance ``d_i = Σ_j α_ij |i − j|`` (the
expected |i − j| under the row's weights; Vig & Belinkov 2019 call it the attention span), and the head's
value for the sentence is the mean over the rows, ``(1/n) Σ_i d_i``. A previous- or next-token head
scores ≈ 1, a self head 0; uniform attention over n tokens scores (n² − 1) / (3n).
"""

from __future__ import annotations

import numpy as np

from headwise.analysis.tokens import TokenInfo, as_attention, mean_over_rows, squeeze

__all__ = ["mean_attention_distance"]


def mean_attention_distance(attn, info: TokenInfo | None = None) -> np.ndarray:
    """Mean over query rows of ``Σ_j α_ij |i − j|`` (in positions).

    Args:
        attn: ``(B, H, L, L)`` or ``(H, L, L)``.
        info: token info (None: every position real). Distances count positions, so with left
            padding they are still those between real tokens.
    Returns:
        ``(B, H)`` or ``(H,)``.
    """
    a, info, unbatched = as_attention(attn, info)
    pos = np.arange(a.shape[-1])
    gap = np.abs(pos[:, None] - pos[None, :]).astype(np.float64)  # (L, L)
    per_row = (a * gap).sum(axis=-1)  # (B, H, L)
    return squeeze(mean_over_rows(per_row, info.valid), unbatched)
