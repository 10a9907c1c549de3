"""Average attention to token kinds and to relative positions (Clark et al. 2019, §3.1 and §3.2).

Shape legend: B batch, H heads, L sequence length.

For one sentence of n real tokens and one head with weights α (rows: queries i, columns: keys j),
Clark et al.'s average attention to a set T of key positions is

    A_T = (1/n) Σ_i Σ_{j ∈ T} α_ij,

the mean over the n query tokens of the weight each puts on T. Attention to a relative position
(self, previous, next) is averaged over the query tokens that *have* a token there: "to the previous
token" is ``A = (1/(n − 1)) Σ_{i ≥ 1} α_{i,i-1}``, so a head that always looks back scores exactly 1.
This is the share of a head's attention that falls on the pattern, over the queries for which the
pattern is defined — the convention of the decoder detectors (:mod:`headwise.analysis.detectors`), so
that ``prev`` is one quantity in encoder and decoder reports. (Clark et al.'s notebook divides by all
n tokens instead, which gives a perfect previous-token head (n − 1)/n: 0.96 on a 25-token sentence.)
Over a corpus the per-sentence values are averaged, each sentence counting once
(:mod:`headwise.analysis.corpus`).

Every function takes ``attn`` ``(B, H, L, L)`` or ``(H, L, L)`` and a :class:`TokenInfo` (None: all
positions real, none special) and returns ``(B, H)`` (or ``(H,)``); padded rows and keys are excluded.

The per-row maths is written once, as two reducers of a :class:`~headwise.analysis.block.RowBlock` that the
full maps here and the streaming pass (:mod:`headwise.analysis.streaming`) both call: :func:`mass_on` (the
weight on marked keys) and :func:`mass_at` (the weight on one key per row).
"""

from __future__ import annotations

import numpy as np

from headwise.analysis.block import RowBlock
from headwise.analysis.tokens import TokenInfo, as_attention, mean_over_rows, squeeze

__all__ = [
    "mass_on",
    "mass_at",
    "offset_keys",
    "attention_to_mask",
    "attention_to_offset",
    "attention_to_cls",
    "attention_to_sep",
    "attention_to_punctuation",
    "attention_to_self",
    "attention_to_previous",
    "attention_to_next",
]


def mass_on(block: RowBlock, marks):
    """Each row's renormalised weight on marked keys, ``Σ_j a_ij m_jk``: the reducer of :func:`attention_to_mask`.

    Args:
        block: the rows.
        marks: ``(B, S', K)`` float (of the weights' dtype), K sets of keys (1 = in the set).
    Returns:
        ``(B, H, R, K)``; 0 at padded rows.
    """
    return (block.w @ marks[:, None]) * block.scale[..., None]


def mass_at(block: RowBlock, key):
    """Each row's renormalised weight on one key, ``a_{i, key_i}``: the reducer of :func:`attention_to_offset`
    (and of the previous- and first-token detectors).

    Args:
        block: the rows.
        key: ``(B, R)`` int64, the key of each row (−1, or a key beyond the block's S': none).
    Returns:
        ``(B, H, R)``; 0 at padded rows and rows without a key.
    """
    B, H, R, Sv = block.w.shape
    ok = (key >= 0) & (key < Sv)  # (B, R)
    g = block.w.gather(-1, key.clamp(0, Sv - 1)[:, None, :, None].expand(B, H, R, 1))[..., 0]  # (B, H, R)
    return g * block.scale * ok[:, None, :]


def _to_mask(a: np.ndarray, info: TokenInfo, targets: np.ndarray) -> np.ndarray:
    import torch

    marks = torch.as_tensor(np.asarray(targets, dtype=np.float64))[..., None]  # (B, L, 1)
    per_row = mass_on(RowBlock.full(a, info), marks)[..., 0].numpy()  # (B, H, L)
    return mean_over_rows(per_row, info.valid)


def offset_keys(valid, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """The key ``i + offset`` of each query i (the pattern :func:`attention_to_offset` scores, for :func:`mass_at`).

    Args:
        valid: ``(B, L)`` bool, real tokens.
    Returns:
        ``(key (B, L) int64, −1 where i + offset is not a real token; has_target (B, L) bool)``.
    """
    valid = np.asarray(valid, dtype=bool)
    batch, length = valid.shape
    key = np.full((batch, length), -1, dtype=np.int64)
    has_target = np.zeros_like(valid)  # (B, L): query i has a real token at i + offset
    if abs(offset) < length:
        rows = np.arange(max(0, -offset), min(length, length - offset))
        has_target[:, rows] = valid[:, rows + offset]
        key[:, rows] = np.where(has_target[:, rows], rows + offset, -1)
    return key, has_target


def _to_offset(a: np.ndarray, info: TokenInfo, offset: int) -> np.ndarray:
    import torch

    key, has_target = offset_keys(info.valid, offset)
    per_row = mass_at(RowBlock.full(a, info), torch.as_tensor(key)).numpy()  # (B, H, L)
    return mean_over_rows(per_row, info.valid & has_target)


def attention_to_mask(attn, targets, info: TokenInfo | None = None) -> np.ndarray:
    """Average attention to the key positions marked in ``targets``: ``(1/n) Σ_i Σ_{j∈T} α_ij``.

    Args:
        attn: ``(B, H, L, L)`` or ``(H, L, L)``.
        targets: ``(B, L)`` (or ``(L,)``) bool, the key positions T.
        info: token info (None: every position real).
    Returns:
        ``(B, H)`` or ``(H,)``, in [0, 1].
    """
    a, info, unbatched = as_attention(attn, info)
    t = np.asarray(targets, dtype=bool)
    if t.ndim == 1:
        t = t[None]  # (1, L)
    if t.shape != info.valid.shape:
        raise ValueError(f"targets: expected shape {info.valid.shape}, got {t.shape}")
    return squeeze(_to_mask(a, info, t & info.valid), unbatched)


def attention_to_offset(attn, offset: int, info: TokenInfo | None = None) -> np.ndarray:
    """Average attention from each token i to token i + offset, over the tokens i that have one there.

    ``offset`` 0 is the token itself, −1 the previous token, +1 the next one. The mean is over the
    query tokens i whose i + offset is a real token (a query with nothing there is left out, not
    counted as 0), so a head that always attends at the offset scores exactly 1.

    Returns:
        ``(B, H)`` or ``(H,)``; NaN for a sentence with no such query (one token, offset ≠ 0).
    """
    if isinstance(offset, bool) or not isinstance(offset, int | np.integer):
        raise TypeError(f"offset: expected an integer, got {offset!r}")
    a, info, unbatched = as_attention(attn, info)
    return squeeze(_to_offset(a, info, int(offset)), unbatched)


def attention_to_cls(attn, info: TokenInfo) -> np.ndarray:
    """Average attention to [CLS] (``info.cls``). Returns ``(B, H)`` or ``(H,)``."""
    a, info, unbatched = as_attention(attn, info)
    return squeeze(_to_mask(a, info, info.cls), unbatched)


def attention_to_sep(attn, info: TokenInfo) -> np.ndarray:
    """Average attention to [SEP] (``info.sep``; all separators of the sentence together)."""
    a, info, unbatched = as_attention(attn, info)
    return squeeze(_to_mask(a, info, info.sep), unbatched)


def attention_to_punctuation(attn, info: TokenInfo) -> np.ndarray:
    """Average attention to punctuation tokens (``info.punct``; by default ``.`` and ``,`` as Clark et al.)."""
    a, info, unbatched = as_attention(attn, info)
    return squeeze(_to_mask(a, info, info.punct), unbatched)


def attention_to_self(attn, info: TokenInfo | None = None) -> np.ndarray:
    """Average attention of each token to itself, ``(1/n) Σ_i α_ii``; identity maps give 1."""
    return attention_to_offset(attn, 0, info)


def attention_to_previous(attn, info: TokenInfo | None = None) -> np.ndarray:
    """Average attention to the previous token over the tokens that have one, ``(1/(n−1)) Σ_{i≥1} α_{i,i−1}``."""
    return attention_to_offset(attn, -1, info)


def attention_to_next(attn, info: TokenInfo | None = None) -> np.ndarray:
    """Average attention to the next token over the tokens that have one, ``(1/(n−1)) Σ_{i<n−1} α_{i,i+1}``."""
    return attention_to_offset(attn, 1, info)
