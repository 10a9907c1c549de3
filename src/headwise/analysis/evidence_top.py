"""The running top contexts of :class:`~headwise.analysis.evidence.HeadEvidence`: each head's strongest rows kept
across a corpus in a fixed room, and the snippet of token ids shown around each.

Shape legend: H heads of one layer, T kept contexts per head (``top``), M candidates, C snippet tokens
(``context``), F = :data:`FIELDS` + C integers per context.

A kept context is one float (its weight; :data:`EMPTY` for an empty slot) and F integers: the text, the query and
key positions among the text's real tokens, the key's and the query's index in the snippet, then the C snippet
ids (:data:`GAP` where the span between key and query is cut, :data:`NONE` past the snippet's end).

Order (deterministic, independent of block sizes and of the order batches or ranks are merged in): weight
descending; ties by text, then query position, ascending.
"""

from __future__ import annotations

__all__ = ["EMPTY", "FIELDS", "GAP", "NONE", "merge_top", "snippets"]

#: The weight of an empty slot (every real weight is ≥ 0).
EMPTY = -1.0
#: Integers before the snippet: text, query, key, key_at, query_at.
FIELDS = 5
#: The snippet's id where the span between key and query is cut.
GAP = -1
#: The snippet's id past its end.
NONE = -2
_TEXT_STRIDE = 1 << 32  # tie-break key: text · stride + query (positions < 2³²)


def merge_top(weights, fields, new_weights, new_fields, top: int):
    """The ``top`` strongest of kept contexts and new ones, per head.

    Args:
        weights: ``(H, T)`` float64 kept weights (:data:`EMPTY` for none); fields: ``(H, T, F)`` int64.
        new_weights: ``(H, M)`` float64 candidates (:data:`EMPTY`: none); new_fields: ``(H, M, F)`` int64.
        top: T.
    Returns:
        ``(weights (H, T), fields (H, T, F))``, strongest first (ties: text, then query, ascending).
    """
    import torch

    w = torch.cat([weights, new_weights], 1)  # (H, T + M)
    f = torch.cat([fields, new_fields], 1)  # (H, T + M, F)
    tie = torch.where(w > EMPTY, f[..., 0] * _TEXT_STRIDE + f[..., 1], torch.iinfo(torch.int64).max)
    first = torch.sort(tie, dim=1, stable=True).indices  # (H, T + M) by text, query
    w1 = w.gather(1, first)
    second = torch.sort(w1, dim=1, descending=True, stable=True).indices[:, :top]  # (H, T) by weight, ties kept
    order = first.gather(1, second)
    return w.gather(1, order), f.gather(1, order[..., None].expand(-1, -1, f.shape[-1]))


def snippets(query, key, n, context: int):
    """Which real positions each context's snippet shows: at most ``context`` tokens around key and query.

    When key, query and ``context // 8`` tokens on either side fit in ``context`` tokens, one window: ``context //
    8`` tokens after the later position (where the text has them), the rest before it. Otherwise two pieces joined
    by a gap: ``(context − 1) // 2`` tokens around the earlier position (a quarter of them after it) and the rest
    ending ``context // 8`` tokens after the later one.

    Args:
        query, key: ``(M,)`` int64 positions among the text's real tokens; n: ``(M,)`` the text's real tokens.
        context: C (≥ 5).
    Returns:
        ``(positions (M, C), key_at (M,), query_at (M,))``: each snippet slot's real position (:data:`GAP` for the
        cut, :data:`NONE` past the end) and the key's / query's index in the snippet.
    """
    import torch

    C = context
    tail, w1 = C // 8, (C - 1) // 2
    w2 = C - 1 - w1
    lo, hi = torch.minimum(query, key), torch.maximum(query, key)
    cut = hi - lo + 1 + 2 * tail > C
    # one window (cut False)
    end = torch.minimum(n, hi + 1 + tail)
    start = (end - C).clamp(min=0)
    end = torch.minimum(n, start + C)
    # two pieces (cut True)
    end2 = torch.minimum(n, hi + 1 + tail)
    start2 = end2 - w2
    end1 = torch.minimum(lo + 1 + w1 // 4, start2 - 1)
    start1 = (end1 - w1).clamp(min=0)
    s1 = torch.where(cut, start1, start)
    len1 = torch.where(cut, end1 - start1, end - start)
    len2 = torch.where(cut, end2 - start2, 0)
    j = torch.arange(C)[None, :]  # (1, C)
    j2 = j - len1[:, None] - 1
    pos = torch.full((query.shape[0], C), NONE, dtype=torch.int64)
    pos = torch.where(cut[:, None] & (j2 >= 0) & (j2 < len2[:, None]), start2[:, None] + j2, pos)
    pos = torch.where(cut[:, None] & (j == len1[:, None]), GAP, pos)
    pos = torch.where(j < len1[:, None], s1[:, None] + j, pos)

    def at(p):
        in_first = ~cut | (p < start2)
        return torch.where(in_first, p - s1, len1 + 1 + p - start2)

    return pos, at(key), at(query)
