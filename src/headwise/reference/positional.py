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


ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _rope_type(scaling) -> str:
    if not scaling:
        return "default"
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"scaling: expected rope_type one of {ROPE_TYPES}, got {kind!r}")
    return kind


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's ``0.1 · mscale · ln(factor) + 1`` (1 for ``factor ≤ 1``), Peng et al. 2023 eq. (21)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(head_dim: int, base: float = 10000.0, scaling=None):
    """``θ_i = base^(−2i/Dh)`` for ``i = 0 … Dh/2 − 1`` (Su et al. 2021, eq. 15), with optional scaling.

    ``scaling`` is a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict (``modeling_rope_utils.py``):

    - ``{"rope_type": "linear", "factor": f}``: ``θ_i / f`` (position interpolation, Chen et al. 2023);
    - ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
      "original_max_position_embeddings"}``: Llama 3.1's banded interpolation;
    - ``{"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0, "beta_fast": 32,
      "beta_slow": 1, "truncate": True}``: YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension",
      §3.2 "NTK-by-parts"). With ``d(r) = Dh · ln(L0 / (2π r)) / (2 ln base)`` the dimension whose
      wavelength fits ``r`` rotations in ``L0`` tokens, ``low = d(beta_fast)``, ``high = d(beta_slow)``
      (floored / ceiled when ``truncate``, clipped to ``[0, Dh − 1]``) and the ramp
      ``γ_i = clip((i − low) / (high − low), 0, 1)``: ``θ'_i = θ_i / s · γ_i + θ_i · (1 − γ_i)`` — fast
      (high-frequency) pairs keep their angle, slow ones are interpolated by ``s``. The attention scale that
      goes with it is :func:`rope_attention_factor`.
    """
    inv = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    kind = _rope_type(scaling)
    if kind == "default":
        return inv
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor
    old = float(scaling["original_max_position_embeddings"])
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return np.where(medium, smoothed, scaled)
    beta_fast = float(scaling.get("beta_fast") or 32.0)
    beta_slow = float(scaling.get("beta_slow") or 1.0)

    def dim_of(rotations):  # the (fractional) dimension whose wavelength fits `rotations` turns in `old`
        return head_dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no division by zero
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)  # γ_i
    return inv / factor * ramp + inv * (1.0 - ramp)


def rope_attention_factor(scaling=None) -> float:
    """The factor by which RoPE's ``cos`` and ``sin`` are multiplied (so scores by its square).

    1 except for YaRN: ``attention_factor`` when given; else ``mscale(s, mscale) / mscale(s, mscale_all_dim)``
    when both are set (DeepSeek-V2/V3), else ``0.1 · ln(s) + 1`` (Peng et al. 2023 eq. 21, ``√(1/t)``),
    as Hugging Face ``_compute_yarn_parameters``.
    """
    if _rope_type(scaling) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all:
        return _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all))
    return _yarn_mscale(factor)


def apply_rope(x, positions, base: float = 10000.0, convention: str = "half", inv_freq=None, scaling=None):
    """Rotate ``x (..., L, Dh)`` by the angles ``positions · θ``.

    ``convention="half"`` pairs feature ``i`` with ``i + Dh/2`` (GPT-NeoX, Hugging Face Llama);
    ``"interleaved"`` pairs ``2i`` with ``2i + 1`` (RoFormer, Meta's original Llama).
    ``positions`` is ``(L,)`` or broadcastable to ``x.shape[:-1]``. ``scaling``: see
    :func:`rope_frequencies`; with YaRN the rotated vector is also multiplied by
    :func:`rope_attention_factor` (Hugging Face multiplies ``cos`` and ``sin``).
    """
    x = np.asarray(x)
    dh = x.shape[-1]
    if dh % 2:
        raise ValueError(f"head_dim: RoPE needs an even head width, got {dh}")
    inv_freq = rope_frequencies(dh, base, scaling) if inv_freq is None else np.asarray(inv_freq)
    ang = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq  # (..., L, Dh/2)
    factor = rope_attention_factor(scaling)
    cos, sin = np.cos(ang) * factor, np.sin(ang) * factor
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


def window_mask(q_pos, k_pos, window: int):
    """Bool ``(L, S)``, True where key position ``j ≤ i − W``: the key fell out of query ``i``'s window.

    Sliding-window attention (Child et al. 2019; Beltagy et al. 2020; Mistral 7B, Jiang et al. 2023):
    with causality, query ``i`` sees the ``W`` keys ``i − W + 1 … i`` — Hugging Face ``sliding_window``'s
    meaning (``kv_idx > q_idx − sliding_window`` in ``masking_utils.py``).

    Raises:
        ValueError: ``window`` not a positive integer.
    """
    checks.positive_int("window", window)
    return np.asarray(k_pos)[..., None, :] <= np.asarray(q_pos)[..., :, None] - window


def causal_mask(q_pos, k_pos, window: int | None = None):
    """Bool ``(L, S)``, True where key position ``j`` is after query position ``i`` (may not attend),
    or (with ``window``) also where ``j ≤ i − W`` (see :func:`window_mask`)."""
    blocked = np.asarray(k_pos)[..., None, :] > np.asarray(q_pos)[..., :, None]
    return blocked if window is None else blocked | window_mask(q_pos, k_pos, window)
