"""Attention entropy, as Clark et al. 2019 measure it (§3.3, "focused vs broad attention").

Shape legend: B batch, H heads, L sequence length.

For one sentence of n real tokens, a head's weights α are first smoothed the way Clark et al.'s
notebook does it ("smooth to avoid NaNs"),

    α'_ij = (1 − ε) α_ij + ε / n,   ε = 10⁻⁴,   over the n real keys j,

so that no weight is 0 and every row still sums to 1. The entropy of query row i, in nats, is

    H_i = − Σ_j α'_ij ln α'_ij,

and the head's entropy for the sentence is the mean over the n query rows, ``(1/n) Σ_i H_i``. The
entropy of the [CLS] row is ``H_i`` at the [CLS] position alone (Clark et al. report it separately: in
BERT-base's last layer it is high, attention from [CLS] being broad). For comparison, uniform
attention over the sentence has entropy ``ln n`` (the smoothing leaves a uniform row unchanged).
Over a corpus, each sentence counts once. ``entropy_ratio`` divides a sentence's head entropy by its
``ln n`` (1 = uniform), which makes sentences of different lengths comparable.
"""

from __future__ import annotations

import numpy as np

from headwise import checks
from headwise.analysis.tokens import TokenInfo, as_attention, mean_over_rows, squeeze

__all__ = [
    "CLARK_ENTROPY_SMOOTHING",
    "row_entropy",
    "attention_entropy",
    "cls_entropy",
    "uniform_entropy",
    "entropy_ratio",
]

#: ε of Clark et al.'s smoothing before the entropy: ``0.9999 · α + 0.0001 / n``.
CLARK_ENTROPY_SMOOTHING = 1e-4


def _smoothing(value: float) -> float:
    return checks.number_in("smoothing", value, 0, 1)


def _row_entropy(a: np.ndarray, info: TokenInfo, eps: float) -> np.ndarray:
    n = info.lengths.astype(np.float64)[:, None, None, None]  # (B, 1, 1, 1)
    keys = info.valid[:, None, None, :]  # (B, 1, 1, L)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(keys, (1.0 - eps) * a + eps / np.maximum(n, 1.0), 0.0)  # (B, H, L, L)
        plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    h = -plogp.sum(axis=-1)  # (B, H, L)
    return np.where(info.valid[:, None, :], h, 0.0)


def row_entropy(attn, info: TokenInfo | None = None, *, smoothing: float = CLARK_ENTROPY_SMOOTHING) -> np.ndarray:
    """Entropy (nats) of every query row after Clark et al.'s smoothing.

    Args:
        attn: ``(B, H, L, L)`` or ``(H, L, L)``.
        info: token info (None: every position real).
        smoothing: ε of ``(1 − ε) α + ε / n``; 0 gives the plain entropy (with 0 · ln 0 = 0).
    Returns:
        ``(B, H, L)`` or ``(H, L)``; 0 at padded rows.
    """
    a, info, unbatched = as_attention(attn, info)
    return squeeze(_row_entropy(a, info, _smoothing(smoothing)), unbatched)


def attention_entropy(attn, info: TokenInfo | None = None, *, smoothing: float = CLARK_ENTROPY_SMOOTHING) -> np.ndarray:
    """Mean row entropy of each head: ``(1/n) Σ_i H_i`` (nats). Returns ``(B, H)`` or ``(H,)``."""
    a, info, unbatched = as_attention(attn, info)
    h = _row_entropy(a, info, _smoothing(smoothing))
    return squeeze(mean_over_rows(h, info.valid), unbatched)


def cls_entropy(attn, info: TokenInfo, *, smoothing: float = CLARK_ENTROPY_SMOOTHING) -> np.ndarray:
    """Entropy (nats) of the [CLS] query row of each head (the first [CLS] of a sentence).

    Returns:
        ``(B, H)`` or ``(H,)``; NaN for a sentence without [CLS].
    """
    a, info, unbatched = as_attention(attn, info)
    h = _row_entropy(a, info, _smoothing(smoothing))  # (B, H, L)
    has = info.cls.any(axis=1)  # (B,)
    first = np.argmax(info.cls, axis=1)  # (B,)
    out = np.take_along_axis(h, first[:, None, None], axis=-1)[..., 0]  # (B, H)
    return squeeze(np.where(has[:, None], out, np.nan), unbatched)


def uniform_entropy(info: TokenInfo) -> np.ndarray:
    """``ln n`` of each sentence: the entropy of uniform attention over its n real tokens. ``(B,)``."""
    n = np.asarray(info.valid, dtype=bool).reshape(-1, np.shape(info.valid)[-1]).sum(axis=1)
    with np.errstate(divide="ignore"):
        return np.where(n > 0, np.log(np.maximum(n, 1)), np.nan)


def entropy_ratio(attn, info: TokenInfo | None = None, *, smoothing: float = CLARK_ENTROPY_SMOOTHING) -> np.ndarray:
    """Head entropy divided by ``ln n`` for each sentence (1: uniform; NaN for n = 1).

    Returns:
        ``(B, H)`` or ``(H,)``.
    """
    a, info, unbatched = as_attention(attn, info)
    h = mean_over_rows(_row_entropy(a, info, _smoothing(smoothing)), info.valid)  # (B, H)
    ln_n = uniform_entropy(info)[:, None]  # (B, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ln_n > 0, h / np.where(ln_n > 0, ln_n, 1.0), np.nan)
    return squeeze(ratio, unbatched)
