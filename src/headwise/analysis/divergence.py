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

:func:`sentence_js_sums` (NumPy, float64) serves the full maps; :func:`js_sums_torch` is the same sums in torch for
the streaming pass's sampled rows (float32 rows, each pair once, only the keys some head weighs; written as
``H(m) = −½ Σ 2m ln 2m + ln 2 · Σ m``, which identical heads meet only to round-off, where the NumPy form gives
exactly 0).
"""

from __future__ import annotations

import math

import numpy as np

from headwise import checks
from headwise.analysis.tokens import TokenInfo, as_attention

__all__ = [
    "CLARK_JS_SMOOTHING",
    "sentence_js_sums",
    "js_sums_torch",
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


def js_sums_torch(p, smoothing: float = CLARK_JS_SMOOTHING, *, budget: int = 1 << 18):
    """:func:`headwise.analysis.divergence.sentence_js_sums` in torch: ``p`` ``(N, J, n)`` rows (a float32
    tensor), returns ``(N, N)`` float64 NumPy sums (symmetric, zero diagonal).

    Each pair once, and per row only the keys some head weighs (a causal row's first ``i + 1``): beyond them
    both smoothed rows hold ε/n and their divergence term is exactly 0. Per-key terms are summed in float32 (torch's
    cascade sum), the sums over rows in float64. ``budget``: elements of one chunk of pairs (at least N · n are
    used): 2¹⁸ (1 MB), so that the sum, its logarithm and their product stay in the core's cache — each pass over a
    16 MB chunk went to memory, 1.6 × slower for 270 heads (the same sums bit for bit: a pair's terms are summed
    alone, whatever the chunk).
    """
    import torch

    heads, rows, n = p.shape
    sums = torch.zeros(heads, heads, dtype=torch.float64)
    # two reused buffers of one chunk of pairs: `budget` elements (1 MB), or one head's pairs when that is more
    size = max(budget, heads * n)
    buf_s, buf_l = torch.empty(size), torch.empty(size)
    half_ln2 = 0.5 * math.log(2.0)
    for r in range(rows):
        row = p[:, r]  # (N, n)
        used = torch.nonzero(row.gt(0).any(0))
        k = int(used.max()) + 1 if used.numel() else 1
        q = (1.0 - smoothing) * row[:, :k].float() + smoothing / n  # (N, k), > 0
        qlq = (q * q.log()).sum(-1)  # (N,): −H(q)
        tot = q.sum(-1)  # (N,)
        chunk = max(1, budget // max(1, heads * k))
        for s0 in range(0, heads, chunk):
            s1 = min(heads, s0 + chunk)
            shape = (s1 - s0, heads - s0, k)
            size = shape[0] * shape[1] * shape[2]
            a_b = torch.add(q[s0:s1, None], q[None, s0:], out=buf_s[:size].view(shape))  # 2m, (c, N − s0, k)
            x = torch.log(a_b, out=buf_l[:size].view(shape)).mul_(a_b).sum(-1)  # Σ 2m ln 2m, (c, N − s0)
            # JS = H(m) − (H(a) + H(b)) / 2, H(m) = −Σ m ln m = −x / 2 + ln 2 · Σ (a + b) / 2
            js = (tot[s0:s1, None] + tot[None, s0:]) * half_ln2 - 0.5 * x
            js += 0.5 * (qlq[s0:s1, None] + qlq[None, s0:])
            sums[s0:s1, s0:] += js.double().clamp_min(0.0)
    sums = torch.triu(sums, diagonal=1)
    return (sums + sums.T).numpy()
