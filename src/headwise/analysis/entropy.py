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

The per-row maths is written once, as the reducer :func:`entropy_rows` of a
:class:`~headwise.analysis.block.RowBlock`, which the full maps here and the streaming pass
(:mod:`headwise.analysis.streaming`) both call; :func:`causal_entropy_ratio_rows` is the decoders' ratio.
"""

from __future__ import annotations

import numpy as np

from headwise import checks
from headwise.analysis.block import RowBlock
from headwise.analysis.tokens import TokenInfo, as_attention, mean_over_rows, squeeze

__all__ = [
    "CLARK_ENTROPY_SMOOTHING",
    "entropy_rows",
    "causal_entropy_ratio_rows",
    "row_entropy",
    "attention_entropy",
    "cls_entropy",
    "uniform_entropy",
    "entropy_ratio",
    "at_cls",
    "over_uniform",
]

#: ε of Clark et al.'s smoothing before the entropy: ``0.9999 · α + 0.0001 / n``.
CLARK_ENTROPY_SMOOTHING = 1e-4


def _smoothing(value: float) -> float:
    return checks.number_in("smoothing", value, 0, 1)


def _entropy_sum(p, *, positive: bool = False):
    """``Σ_j −p_j ln p_j`` over the last axis (``0 ln 0 = 0``), as ``torch.special.entr(p).sum(-1)`` but through the
    vectorised ``log`` (entr is a scalar loop on CPU, ~4 × slower); ``p`` is overwritten by the log's temporary
    only when it is one. ``positive``: every p > 0 (no clamp needed)."""
    import torch

    t = torch.log(p) if positive else torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))  # p = 0: 0 · ln(tiny) = 0
    return t.mul_(p).sum(-1).neg_()


def entropy_rows(block: RowBlock, smoothing: float = CLARK_ENTROPY_SMOOTHING):
    """Entropy (nats) of each renormalised row ``a = w / T``, after Clark et al.'s smoothing over the n real keys:
    the reducer of :func:`row_entropy`.

    ``smoothing`` ε > 0: ``H(ε/n + (1 − ε) a)``, where keys outside the block's real ones — padded keys inside
    it, real keys beyond it (a causal block's future) — hold exactly ε/n and are added in closed form. ε = 0:
    the plain entropy, ``Σ_j entr(w_ij) / T + ln T`` (no ``(B, H, R, S')`` temporary beyond the log's).

    Returns:
        ``(B, H, R)``; 0 at padded rows (and at rows without weight when ε = 0).
    """
    import torch

    w, eps = block.w, float(smoothing)
    rowmask = block.rows[:, None, :].to(w.dtype)  # (B, 1, R)
    if eps == 0:
        log_total = torch.where(block.total > 0, block.total, torch.ones_like(block.total)).log()  # (B, H, R)
        return (_entropy_sum(w) * block.inv + log_total) * rowmask
    c = eps / block.n.clamp_min(1).to(w.dtype)  # (B,)
    p = torch.addcmul(c[:, None, None, None], w, ((1.0 - eps) * block.inv)[..., None])  # (B, H, R, S'), ≥ ε/n
    h = _entropy_sum(p, positive=True)  # (B, H, R)
    del p
    const = torch.special.entr(c)  # (B,)
    keys = block.keys
    correction = (block.n - keys.sum(1)) - (~keys).sum(1)  # real keys beyond S' minus padded keys within
    return (h + (correction * const)[:, None, None]) * rowmask


def causal_entropy_ratio_rows(block: RowBlock, seen):
    """Each row's plain entropy over ``ln m_i``, m_i the real keys at or before query i (``seen``, ``(B, R)``): the
    reducer of :func:`headwise.analysis.decoder.causal_entropy_ratio`.

    Returns:
        ``(ratio (B, H, R), rows (B, R))``: the ratios (0 elsewhere) and the rows they count (real, m_i ≥ 2).
    """
    import torch

    rows = block.rows & (seen >= 2)  # (B, R)
    ratio = entropy_rows(block, 0.0) / torch.log(seen.clamp_min(2)).to(block.w.dtype)[:, None, :]  # (B, H, R)
    return ratio * rows[:, None, :], rows


def _row_entropy(a: np.ndarray, info: TokenInfo, eps: float) -> np.ndarray:
    return entropy_rows(RowBlock.full(a, info), eps).numpy()  # (B, H, L)


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
    return squeeze(at_cls(_row_entropy(a, info, _smoothing(smoothing)), info), unbatched)


def at_cls(h: np.ndarray, info: TokenInfo) -> np.ndarray:
    """Row values ``h`` ``(B, H, L)`` at each sentence's first [CLS]: ``(B, H)``, NaN for a sentence without one."""
    has = np.asarray(info.cls).any(axis=1)  # (B,)
    first = np.argmax(info.cls, axis=1)  # (B,)
    out = np.take_along_axis(h, first[:, None, None], axis=-1)[..., 0]  # (B, H)
    return np.where(has[:, None], out, np.nan)


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
    return squeeze(over_uniform(h, info), unbatched)


def over_uniform(h: np.ndarray, info: TokenInfo) -> np.ndarray:
    """Head entropies ``h`` ``(B, H)`` divided by each sentence's ``ln n`` (NaN for n ≤ 1): ``(B, H)``."""
    ln_n = uniform_entropy(info)[:, None]  # (B, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ln_n > 0, h / np.where(ln_n > 0, ln_n, 1.0), np.nan)
