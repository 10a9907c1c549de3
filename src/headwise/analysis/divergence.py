"""Jensen–Shannon divergence and distance between every pair of heads (Clark et al. 2019, §6).

Shape legend: B batch, N heads of the whole model (layers × heads, flattened layer-major:
``n = layer · H + head``), L sequence length.

For two heads a, b and one query token i of a sentence with n real tokens, both attention rows are
smoothed as in Clark et al.'s ``head_distances.py``, ``p' = 0.999 · p + 0.001 / n``, then

    JS(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m) = H(m) − ½ (H(p) + H(q)),   m = ½ (p + q)   (nats, ≤ ln 2).

Clark et al. sum JS over every token of their data; headwise divides the sum by the number of tokens,
so the *divergence* between two heads is the mean per-token JS (it does not grow with the corpus).
The *Jensen–Shannon distance* is its square root: a true metric (Endres & Schindelin 2003; it is
``scipy.spatial.distance.jensenshannon`` for one pair of rows), which :func:`classical_mds` maps to
the plane. Identical heads have divergence and distance exactly 0.
"""

from __future__ import annotations

import numpy as np

from headwise import checks
from headwise.analysis.tokens import TokenInfo, as_attention

__all__ = [
    "CLARK_JS_SMOOTHING",
    "sentence_js_sums",
    "js_divergence_sums",
    "js_divergence_between_heads",
    "js_distance_between_heads",
]

#: ε of Clark et al.'s smoothing before the divergence: ``0.999 · α + 0.001 / n``.
CLARK_JS_SMOOTHING = 1e-3


def _entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(p)).sum(axis=-1)


def js_divergence_sums(
    attn, info: TokenInfo | None = None, *, smoothing: float = CLARK_JS_SMOOTHING
) -> tuple[np.ndarray, int]:
    """Sum over the batch's real query tokens of the JS divergence between every pair of heads.

    Args:
        attn: ``(B, N, L, L)`` (or ``(N, L, L)``): all the heads to compare, e.g. every layer's heads
            stacked along axis 1.
        info: token info (None: every position real).
        smoothing: ε of ``(1 − ε) α + ε / n``, in (0, 1) (Clark et al.: 0.001).
    Returns:
        ``(sums (N, N), tokens)``: symmetric sums with a zero diagonal, and the number of tokens summed.
    """
    checks.number_in("smoothing", smoothing, 0, 1, low_closed=False)
    a, info, _ = as_attention(attn, info)
    heads = a.shape[1]
    sums = np.zeros((heads, heads))
    tokens = 0
    for b in range(a.shape[0]):
        idx = np.flatnonzero(info.valid[b])
        if idx.size:
            sums += sentence_js_sums(a[b][:, idx][:, :, idx], smoothing)  # real rows and keys only
            tokens += idx.size
    return sums, tokens


def sentence_js_sums(p: np.ndarray, smoothing: float = CLARK_JS_SMOOTHING) -> np.ndarray:
    """JS divergence between every pair of heads, summed over the query rows of one sentence.

    Args:
        p: ``(N, n, n)`` one sentence's attention of N heads over its n real tokens (rows sum to 1).
        smoothing: ε of ``(1 − ε) α + ε / n``.
    Returns:
        ``(N, N)`` symmetric sums, zero diagonal.
    """
    heads, n = p.shape[0], p.shape[-1]
    p = (1.0 - smoothing) * np.asarray(p, dtype=np.float64) + smoothing / n
    h = _entropy(p)  # (N, n)
    sums = np.zeros((heads, heads))
    for i in range(heads):
        m = 0.5 * (p[i][None] + p)  # (N, n, n)
        js = _entropy(m) - 0.5 * (h[i][None] + h)  # (N, n)
        sums[i] = np.maximum(js, 0.0).sum(axis=-1)
    sums = 0.5 * (sums + sums.T)  # exact symmetry despite round-off
    np.fill_diagonal(sums, 0.0)
    return sums


def js_divergence_between_heads(
    attn, info: TokenInfo | None = None, *, smoothing: float = CLARK_JS_SMOOTHING
) -> np.ndarray:
    """Mean per-token JS divergence (nats) between every pair of heads: ``(N, N)``."""
    sums, tokens = js_divergence_sums(attn, info, smoothing=smoothing)
    if tokens == 0:
        raise ValueError("info: expected at least one real token, got none")
    return sums / tokens


def js_distance_between_heads(
    attn, info: TokenInfo | None = None, *, smoothing: float = CLARK_JS_SMOOTHING
) -> np.ndarray:
    """Jensen–Shannon distance ``sqrt(mean per-token JS divergence)`` between every pair of heads: ``(N, N)``."""
    return np.sqrt(js_divergence_between_heads(attn, info, smoothing=smoothing))
