"""Voita et al. 2019's head confidence and positional-head test ("Analyzing Multi-Head Self-Attention", §4).

Shape legend: B batch, H heads, L sequence length.

- **Confidence**: "the average of its maximum attention weight excluding the end of sentence symbol,
  where average is taken over tokens": ``c = mean over query tokens i of max_j α_ij``. In a BERT
  input the counterparts of Voita's end-of-sentence symbol are the special tokens, so the query rows
  of [CLS] and [SEP] are left out (``exclude_special=True``). Unlike Clark et al.'s sentence means, the
  average is over tokens: a corpus's long sentences weigh more.
- **Positional head**: a head is positional "if at least 90% of the time its maximum attention
  weight is assigned to a specific relative position". For every query token i (the same tokens as
  for confidence), take the offset ``k_i = argmax_j α_ij − i``; the head's share is the frequency of
  its most common offset, and it is positional when that share is ≥ ``threshold`` (0.9). Voita et al.
  find the offsets −1 and +1 in practice.

The per-row maths is written once, as the reducer :func:`row_max_offsets` of a
:class:`~headwise.analysis.block.RowBlock` (and :func:`count_offsets`, the histogram's step), which the full
maps here and the streaming pass (:mod:`headwise.analysis.streaming`) both call.
"""

from __future__ import annotations

import numpy as np

from headwise import checks
from headwise.analysis.block import RowBlock
from headwise.analysis.tokens import TokenInfo, as_attention, squeeze

__all__ = [
    "VOITA_POSITIONAL_THRESHOLD",
    "row_max_offsets",
    "count_offsets",
    "query_rows",
    "row_max",
    "confidence",
    "argmax_offsets",
    "positional_heads",
]

#: Voita et al.'s share of tokens whose argmax sits at one relative position.
VOITA_POSITIONAL_THRESHOLD = 0.9


def row_max_offsets(block: RowBlock):
    """Each row's largest weight and the offset of its argmax, ``c_{argmax_j w_ij} − c_i`` (c: the block's
    positions; ties go to the smallest j; a row without weight: ``−c_i``, as the argmax of zeros is key 0): the
    reducer of :func:`row_max`, :func:`confidence` and :func:`argmax_offsets`.

    The maximum is of the weights as given (not renormalised): the full maps hand renormalised rows, the corpus
    statistics read each row's own maximum.

    Returns:
        ``(maxima (B, H, R), offsets (B, H, R) int64)``; maxima 0 at padded rows (offsets: select rows).
    """
    import torch

    w = block.w
    B, H, R, _ = w.shape
    mx, am = w.max(-1)  # (B, H, R)
    q = block.qpos[:, None, :]  # (B, 1, R)
    off = torch.where(mx > 0, block.kpos.gather(1, am.reshape(B, -1)).reshape(B, H, R) - q, -q)
    return mx * block.rows[:, None, :], off


def count_offsets(hist, offsets, rows, max_length: int) -> None:
    """Add one to ``hist[h, k + max_length − 1]`` for every selected row of head h whose argmax offset is k (in place,
    no histogram-sized temporary): the histogram's step of :func:`offset_histogram` and of the streaming pass.

    Args:
        hist: ``(H, 2·max_length − 1)`` int64 tensor (contiguous); offsets: ``(B, H, R)`` from
            :func:`row_max_offsets`; rows: ``(B, R)`` bool, the query rows counted.
    """
    import torch

    B, H, R = offsets.shape
    head = torch.arange(H)[None, :, None]  # (1, H, 1)
    where = (head * hist.shape[-1] + offsets + max_length - 1)[rows[:, None, :].expand(B, H, R)]  # (rows kept,)
    hist.view(-1).index_put_((where,), torch.ones_like(where), accumulate=True)


def query_rows(info: TokenInfo, exclude_special: bool = True) -> np.ndarray:
    """``(B, L)`` bool: the query tokens these statistics average over (real ones, maybe not [CLS]/[SEP])."""
    return info.valid & ~info.special if exclude_special else info.valid


def row_max(attn, info: TokenInfo | None = None) -> np.ndarray:
    """``(B, H, L)`` (or ``(H, L)``) largest weight of each query row; 0 at padded rows."""
    a, info, unbatched = as_attention(attn, info)
    return squeeze(row_max_offsets(RowBlock.full(a, info))[0].numpy(), unbatched)


def confidence(attn, info: TokenInfo | None = None, *, exclude_special: bool = True) -> np.ndarray:
    """Voita's confidence of each head in each sentence: the mean of the row maxima.

    Args:
        attn: ``(B, H, L, L)`` or ``(H, L, L)``.
        info: token info (None: every position real, none special).
        exclude_special: leave out the query rows of [CLS] and [SEP].
    Returns:
        ``(B, H)`` or ``(H,)``; NaN for a sentence with no query row left.
    """
    a, info, unbatched = as_attention(attn, info)
    rows = query_rows(info, exclude_special)  # (B, L)
    count = rows.sum(axis=1)[:, None]  # (B, 1)
    maxima = row_max_offsets(RowBlock.full(a, info))[0].numpy()  # (B, H, L)
    total = np.where(rows[:, None, :], maxima, 0.0).sum(axis=-1)  # (B, H)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return squeeze(out, unbatched)


def argmax_offsets(attn, info: TokenInfo | None = None) -> np.ndarray:
    """``argmax_j α_ij − i`` for every query row: ``(B, H, L)`` (or ``(H, L)``) integers.

    Ties go to the smallest j. Padded rows hold 0; select rows with :func:`query_rows`.
    """
    a, info, unbatched = as_attention(attn, info)
    off = row_max_offsets(RowBlock.full(a, info))[1].numpy()  # (B, H, L)
    return squeeze(np.where(info.valid[:, None, :], off, 0), unbatched)


def offset_histogram(attn, info: TokenInfo | None, max_length: int, *, exclude_special: bool = True) -> np.ndarray:
    """Count, per head, the query tokens whose argmax sits at each offset −(max_length−1) … max_length−1.

    Returns:
        ``(H, 2·max_length − 1)`` integer counts; column ``k + max_length − 1`` is offset k.
    """
    import torch

    a, info, _ = as_attention(attn, info)
    if a.shape[-1] > max_length:
        raise ValueError(f"max_length: expected at least the sequence length {a.shape[-1]}, got {max_length}")
    off = row_max_offsets(RowBlock.full(a, info))[1]  # (B, H, L)
    hist = torch.zeros(a.shape[1], 2 * max_length - 1, dtype=torch.int64)
    count_offsets(hist, off, torch.as_tensor(query_rows(info, exclude_special)), max_length)
    return hist.numpy()


def positional_from_histogram(
    hist: np.ndarray, threshold: float = VOITA_POSITIONAL_THRESHOLD
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Share and offset of each head's most common argmax offset, and whether share ≥ threshold.

    Args:
        hist: ``(…, 2·max_length − 1)`` counts from :func:`offset_histogram` (summed over a corpus).
    Returns:
        ``(share, offset, is_positional)``, each of shape ``hist.shape[:-1]``; share NaN and offset 0
        for a head with no counted token.
    """
    checks.number_in("threshold", threshold, 0, 1, low_closed=False, high_closed=True)
    hist = np.asarray(hist)
    center = (hist.shape[-1] - 1) // 2
    total = hist.sum(axis=-1)
    best = hist.argmax(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total > 0, hist.max(axis=-1) / np.maximum(total, 1), np.nan)
    offset = np.where(total > 0, best - center, 0)
    return share, offset, np.nan_to_num(share, nan=0.0) >= threshold


def positional_heads(
    attn,
    info: TokenInfo | None = None,
    *,
    threshold: float = VOITA_POSITIONAL_THRESHOLD,
    exclude_special: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Voita's positional-head test over all query tokens of a batch.

    Args:
        attn: ``(B, H, L, L)`` or ``(H, L, L)``.
        info: token info (None: every position real, none special).
        threshold: the share of tokens that must have their argmax at one offset (0.9).
        exclude_special: leave out the query rows of [CLS] and [SEP].
    Returns:
        ``(share, offset, is_positional)``, each ``(H,)``: the most common argmax offset of each head,
        the share of tokens that have it, and ``share ≥ threshold``.
    """
    length = np.shape(attn)[-1]
    hist = offset_histogram(attn, info, length, exclude_special=exclude_special)
    return positional_from_histogram(hist, threshold)
