"""Positions in NumPy: sinusoidal tables, RoPE, ALiBi, causal masks — the answer key.

Shape legend: L query length, S key length, D model width, H heads, Dh head width.
"""

from __future__ import annotations

import math

import numpy as np

from headwise import checks


def sinusoidal_table(max_len: int, d_model: int, base: float = 10000.0):
    """The sinusoidal encoding of Vaswani et al. 2017 §3.5, ``(max_len, d_model)`` float64.

    ``PE[pos, 2i] = sin(pos / base^(2i/d_model))``, ``PE[pos, 2i+1] = cos(pos / base^(2i/d_model))``.

    Raises:
        ValueError: ``max_len`` or ``d_model`` not positive, or ``d_model`` odd.
    """
    checks.positive_int("max_len", max_len)
    if not isinstance(d_model, (int, np.integer)) or d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model: expected a positive even integer, got {d_model!r}")
    pos = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    i = np.arange(d_model // 2, dtype=np.float64)[None, :]  # (1, D/2)
    angles = pos / base ** (2 * i / d_model)  # (max_len, D/2)
    pe = np.zeros((max_len, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def rope_frequencies(head_dim: int, base: float = 10000.0):
    """``θ_i = base^(−2i/Dh)`` for ``i = 0 … Dh/2 − 1`` (Su et al. 2021, eq. 15)."""
    return 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def apply_rope(x, positions, base: float = 10000.0, convention: str = "half", inv_freq=None):
    """Rotate ``x (..., L, Dh)`` by the angles ``positions · θ``.

    ``convention="half"`` pairs feature ``i`` with ``i + Dh/2`` (GPT-NeoX, Hugging Face Llama);
    ``"interleaved"`` pairs ``2i`` with ``2i + 1`` (RoFormer, Meta's original Llama).
    ``positions`` is ``(L,)`` or broadcastable to ``x.shape[:-1]``.
    """
    x = np.asarray(x)
    dh = x.shape[-1]
    if dh % 2:
        raise ValueError(f"head_dim: RoPE needs an even head width, got {dh}")
    inv_freq = rope_frequencies(dh, base) if inv_freq is None else np.asarray(inv_freq)
    ang = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq  # (..., L, Dh/2)
    cos, sin = np.cos(ang), np.sin(ang)
    if convention == "half":
        x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    if convention == "interleaved":
        xe, xo = x[..., 0::2], x[..., 1::2]
        out = np.empty(np.broadcast_shapes(x.shape, cos.shape[:-1] + (dh,)), dtype=np.result_type(x, cos))
        out[..., 0::2] = xe * cos - xo * sin
        out[..., 1::2] = xe * sin + xo * cos
        return out
    raise ValueError(f"convention: expected 'half' or 'interleaved', got {convention!r}")


def alibi_slopes(num_heads: int):
    """ALiBi head slopes (Press et al. 2022): ``2^(−8h/n)`` for ``h = 1…n`` when n is a power of two;
    otherwise the closest power of two's slopes plus every other slope of the next power (as in the
    paper's code, BLOOM and MPT)."""
    checks.positive_int("num_heads", num_heads)

    def pow2(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = pow2(closest)
    if closest != num_heads:
        slopes += pow2(2 * closest)[0::2][: num_heads - closest]
    return np.asarray(slopes, dtype=np.float64)


def alibi_bias(num_heads: int, q_pos, k_pos):
    """``(H, L, S)`` bias ``−m_h · |i − j|`` (equal to the paper's ``−m_h (i − j)`` on causal rows)."""
    q_pos = np.asarray(q_pos, dtype=np.float64)
    k_pos = np.asarray(k_pos, dtype=np.float64)
    dist = np.abs(q_pos[..., :, None] - k_pos[..., None, :])  # (L, S)
    return -alibi_slopes(num_heads)[:, None, None] * dist[..., None, :, :]


def causal_mask(q_pos, k_pos):
    """Bool ``(L, S)``, True where key position ``j`` is after query position ``i`` (may not attend)."""
    return np.asarray(k_pos)[..., None, :] > np.asarray(q_pos)[..., :, None]
