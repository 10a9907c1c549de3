"""Mean attention distance: how far, in tokens, a head looks on average.

Shape legend: B batch, H heads, L sequence length.

For one sentence of n real tokens, query row i has mean distance ``d_i = Σ_j α_ij |i − j|`` (the
expected |i − j| under the row's weights; Vig & Belinkov 2019 call it the attention span), and the head's
value for the sentence is the mean over the rows, ``(1/n) Σ_i d_i``. A previous- or next-token head
scores ≈ 1, a self head 0; uniform attention over n tokens scores (n² − 1) / (3n).

The per-row maths is written once, as the reducer :func:`distance_rows` of a
:class:`~headwise.analysis.block.RowBlock`, which the full maps here and the streaming pass
(:mod:`headwise.analysis.streaming`) both call.
"""

from __future__ import annotations

import numpy as np

from headwise.analysis.block import RowBlock
from headwise.analysis.tokens import TokenInfo, as_attention, mean_over_rows, squeeze

__all__ = ["distance_rows", "mean_attention_distance"]


def distance_rows(block: RowBlock):
    """Each renormalised row's mean distance ``Σ_j a_ij |c_i − c_j|`` (c: the block's positions): the reducer of
    :func:`mean_attention_distance`.

    Written as ``Σ_j a_ij (c_i − c_j) + 2 Σ_{j > i} a_ij (c_j − c_i)``: the first sum from the rows' totals and
    position moments (:class:`~headwise.analysis.block.RowBlock`), the second 0 for a causal block.

    Returns:
        ``(B, H, R)``; 0 at padded rows.
    """
    w = block.w
    q = block.qpos.to(w.dtype)  # (B, R)
    dist = q[:, None, :] * block.total - block.moment  # (B, H, R)
    if not block.causal:
        ahead = (block.kpos.to(w.dtype)[:, None, :] - q[:, :, None]).clamp_min(0)  # (B, R, S')
        dist = dist + 2.0 * (w * ahead[:, None]).sum(-1)
    return dist * block.scale


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
    per_row = distance_rows(RowBlock.full(a, info)).numpy()  # (B, H, L)
    return squeeze(mean_over_rows(per_row, info.valid), unbatched)
