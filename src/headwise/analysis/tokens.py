"""What each position of a batch is: a real token or padding, [CLS], [SEP], punctuation.

Shape legend: B batch, L sequence length (queries and keys are the same sequence: self-attention),
H heads.

Every per-head metric in :mod:`headwise.analysis` takes an attention array ``(B, H, L, L)`` (or one
sentence's ``(H, L, L)``) and a :class:`TokenInfo`. Padded positions (``valid`` False) are excluded from
every metric, as queries (rows) and as keys (columns).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["TokenInfo", "token_info", "as_token_info", "CLARK_PUNCTUATION", "as_attention"]

#: The punctuation tokens of Clark et al. 2019 (their notebook counts ``.`` and ``,``: "periods and commas").
CLARK_PUNCTUATION = frozenset({".", ","})


@dataclass(frozen=True)
class TokenInfo:
    """Boolean position masks of a batch, each ``(B, L)``.

    Attributes:
        valid: True for a real token, False for padding.
        cls: True where the token is the classifier token (``[CLS]``).
        sep: True where the token is a separator (``[SEP]``).
        punct: True where the token counts as punctuation (see :func:`token_info`).
        tokens: the token strings of each sentence without padding, or None.

    ``cls``, ``sep`` and ``punct`` are always False at padded positions.
    """

    valid: np.ndarray
    cls: np.ndarray
    sep: np.ndarray
    punct: np.ndarray
    tokens: tuple[tuple[str, ...], ...] | None = None

    @property
    def lengths(self) -> np.ndarray:
        """``(B,)`` number of real tokens in each sentence."""
        return self.valid.sum(axis=1)

    @property
    def special(self) -> np.ndarray:
        """``(B, L)`` True at [CLS] and [SEP]."""
        return self.cls | self.sep

    @classmethod
    def plain(cls, batch: int, length: int, lengths: Sequence[int] | None = None) -> TokenInfo:
        """Positions with no special tokens: every position valid, or the first ``lengths[b]`` of row b."""
        pos = np.arange(length)[None, :]  # (1, L)
        if lengths is None:
            valid = np.ones((batch, length), dtype=bool)
        else:
            n = np.asarray(lengths).reshape(-1, 1)  # (B, 1)
            if n.shape[0] != batch:
                raise ValueError(f"lengths: expected {batch} lengths, got {n.shape[0]}")
            valid = pos < n  # (B, L)
        none = np.zeros((batch, length), dtype=bool)
        return cls(valid=valid, cls=none, sep=none.copy(), punct=none.copy())


def token_info(
    tokens: Sequence[Sequence[str]],
    attention_mask=None,
    *,
    cls_token: str = "[CLS]",
    sep_token: str = "[SEP]",
    punctuation: Iterable[str] | None = None,
    length: int | None = None,
) -> TokenInfo:
    """Build a :class:`TokenInfo` from the token strings of a batch.

    Args:
        tokens: one sequence of token strings per sentence. Sentences may be shorter than the batch
            (then they are padded), or padded already (then pass ``attention_mask``).
        attention_mask: ``(B, L)``, 1 (or True) for a real token, 0 for padding, as Hugging Face
            tokenizers return it; default: every given token is real.
        cls_token, sep_token: the strings of the classifier and separator tokens.
        punctuation: the token strings counted as punctuation; default :data:`CLARK_PUNCTUATION`
            (``.`` and ``,``, as Clark et al. 2019 count them).
        length: L, the padded length (default: the longest sentence, or the mask's width).
    Returns:
        TokenInfo with masks ``(B, L)``.
    Raises:
        ValueError: a mask whose shape does not fit the tokens, a length shorter than a sentence.
    """
    punct_set = CLARK_PUNCTUATION if punctuation is None else frozenset(punctuation)
    batch = len(tokens)
    if attention_mask is not None:
        mask = np.asarray(attention_mask).astype(bool)
        if mask.ndim != 2 or mask.shape[0] != batch:
            raise ValueError(f"attention_mask: expected shape ({batch}, L), got {tuple(mask.shape)}")
        width = mask.shape[1] if length is None else length
        if width != mask.shape[1]:
            raise ValueError(f"length: expected the mask's width {mask.shape[1]}, got {length}")
    else:
        mask = None
        longest = max((len(t) for t in tokens), default=0)
        width = longest if length is None else length
        if width < longest:
            raise ValueError(f"length: expected at least the longest sentence ({longest}), got {length}")
    valid = np.zeros((batch, width), dtype=bool)
    is_cls, is_sep, is_punct = (np.zeros((batch, width), dtype=bool) for _ in range(3))
    kept: list[tuple[str, ...]] = []
    for b, sent in enumerate(tokens):
        sent = list(sent)
        if len(sent) > width:
            raise ValueError(f"tokens[{b}]: {len(sent)} tokens, longer than the length {width}")
        row_valid = np.zeros(width, dtype=bool)
        row_valid[: len(sent)] = True if mask is None else mask[b, : len(sent)]
        valid[b] = row_valid
        kept.append(tuple(t for t, v in zip(sent, row_valid) if v))
        for i, tok in enumerate(sent):
            if not row_valid[i]:
                continue
            is_cls[b, i] = tok == cls_token
            is_sep[b, i] = tok == sep_token
            is_punct[b, i] = tok in punct_set
    return TokenInfo(valid=valid, cls=is_cls, sep=is_sep, punct=is_punct, tokens=tuple(kept))


def as_token_info(info) -> TokenInfo:
    """``info`` itself if it is a :class:`TokenInfo`; else the token info of a tokenizer's batch.

    Args:
        info: a :class:`TokenInfo`, or any batch with ``tokens`` (one list of token strings per text,
            padding included) and ``attention_mask`` ``(B, L)`` (1 = real token), such as the
            :class:`headwise.models.EncodedBatch` the :mod:`headwise.models.attend` adapters return;
            read with :func:`token_info`'s defaults ([CLS], [SEP], Clark et al.'s punctuation).
    Raises:
        TypeError: neither.
    """
    if isinstance(info, TokenInfo):
        return info
    if hasattr(info, "tokens") and hasattr(info, "attention_mask"):
        return token_info(info.tokens, np.asarray(info.attention_mask))
    raise TypeError(f"info: expected a TokenInfo or a batch with tokens and attention_mask, got {type(info).__name__}")


def as_attention(attn, info: TokenInfo | None) -> tuple[np.ndarray, TokenInfo, bool]:
    """Check an attention array and its token info; return them batched, restricted to real tokens.

    The returned weights are float64 ``(B, H, L, L)``: rows (queries) and columns (keys) at padded
    positions are set to 0, and each real row is renormalised over the real keys. The renormalisation
    is a no-op for a model that masks padded keys (BERT does: their weights are exactly 0); for one that
    does not, it makes every metric that of the real tokens alone.

    Args:
        attn: ``(B, H, L, L)`` or ``(H, L, L)`` attention weights (NumPy array, or anything
            ``np.asarray`` accepts, e.g. a CPU torch tensor); rows should sum to 1.
        info: token info with masks ``(B, L)`` (or ``(L,)`` for an unbatched ``attn``); None means
            every position is a real token and none is special.
    Returns:
        ``(weights (B, H, L, L), info with (B, L) masks, unbatched)``, ``unbatched`` True when ``attn``
        was 3-D (the metrics then drop the batch axis of their results).
    Raises:
        ValueError: wrong number of axes, non-square maps, masks that do not fit, negative or
        non-finite weights.
    """
    a = np.asarray(attn, dtype=np.float64)
    if a.ndim not in (3, 4):
        raise ValueError(f"attn: expected shape (B, H, L, L) or (H, L, L), got {tuple(a.shape)}")
    unbatched = a.ndim == 3
    if unbatched:
        a = a[None]  # (1, H, L, L)
    batch, _, length, keys = a.shape
    if length != keys:
        raise ValueError(f"attn: expected square self-attention maps (L == S), got {tuple(a.shape)}")
    if not np.all(np.isfinite(a)):
        raise ValueError("attn: expected finite weights, got NaN or infinity")
    if np.any(a < 0):
        raise ValueError(f"attn: expected non-negative weights, got a minimum of {a.min():.3g}")
    if info is None:
        info = TokenInfo.plain(batch, length)
    else:
        masks = [np.asarray(m, dtype=bool) for m in (info.valid, info.cls, info.sep, info.punct)]
        if unbatched and masks[0].ndim == 1:
            masks = [m[None] for m in masks]  # (1, L)
        for name, m in zip(("valid", "cls", "sep", "punct"), masks):
            if m.shape != (batch, length):
                raise ValueError(f"info.{name}: expected shape ({batch}, {length}) to fit attn, got {m.shape}")
        valid = masks[0]
        info = TokenInfo(valid, masks[1] & valid, masks[2] & valid, masks[3] & valid, info.tokens)
    valid = info.valid
    pair = valid[:, None, :, None] & valid[:, None, None, :]  # (B, 1, L, L)
    a = np.where(pair, a, 0.0)
    total = a.sum(axis=-1, keepdims=True)  # (B, H, L, 1)
    a = np.divide(a, total, out=np.zeros_like(a), where=total > 0)
    return a, info, unbatched


def mean_over_rows(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Mean of per-row values over the selected rows of each sentence.

    Args:
        values: ``(B, H, L)``, one value per query row.
        rows: ``(B, L)`` bool, the rows to average (real tokens).
    Returns:
        ``(B, H)``; NaN for a sentence with no selected row.
    """
    count = rows.sum(axis=1)[:, None]  # (B, 1)
    total = np.where(rows[:, None, :], values, 0.0).sum(axis=-1)  # (B, H)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def squeeze(result: np.ndarray, unbatched: bool) -> np.ndarray:
    """Drop the batch axis of a result when the input was one sentence."""
    return result[0] if unbatched else result
