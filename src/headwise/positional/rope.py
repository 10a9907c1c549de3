"""Rotary position embedding (RoPE), Su et al. 2021 ("RoFormer"), as two pure functions and a part.

Two conventions pair the features differently:

- ``"half"``: feature ``i`` with ``i + Dh/2`` — GPT-NeoX, Hugging Face ``LlamaAttention`` (``rotate_half``).
- ``"interleaved"``: feature ``2i`` with ``2i + 1`` — RoFormer and Meta's original Llama
  (``torch.view_as_complex`` on pairs).

Both rotate pair ``i`` by the angle ``pos · θ_i`` with ``θ_i = base^(−2i/Dh)``, so the score between a
query at ``m`` and a key at ``n`` depends only on ``m − n``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from headwise.positional.base import PositionalPart

CONVENTIONS = ("half", "interleaved")


_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
ROPE_TYPES = ("default", *_SCALING_KEYS)


def _scaling_type(scaling: dict | None) -> str:
    """The ``rope_type`` of a Hugging Face scaling dict, checked: a known type with its keys."""
    if not scaling:
        return "default"
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"scaling: rope_type {kind!r} is not supported (expected one of {ROPE_TYPES})")
    missing = [key for key in _SCALING_KEYS.get(kind, ()) if scaling.get(key) is None]
    if missing:
        raise ValueError(f"scaling: rope_type {kind!r} needs {', '.join(missing)}; got {scaling}")
    return kind


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(head_dim: int, base: float = 10000.0, scaling: dict | None = None, device=None) -> Tensor:
    """``θ_i`` for ``i = 0 … Dh/2 − 1``, float64, with optional context-extension scaling.

    ``scaling`` follows Hugging Face's ``rope_scaling`` / ``rope_parameters`` (``modeling_rope_utils.py``):
    ``{"rope_type": "linear", "factor": f}`` (positions divided by f); ``{"rope_type": "llama3", "factor",
    "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}`` (Llama 3.1); ``{"rope_type":
    "yarn", "factor": s, "original_max_position_embeddings": L0, "beta_fast": 32, "beta_slow": 1, "truncate":
    True}`` (YaRN, Peng et al. 2023 §3.2: pairs turning more than ``beta_fast`` times in ``L0`` tokens keep
    ``θ_i``, those turning fewer than ``beta_slow`` times get ``θ_i / s``, a linear ramp between); ``"default"``
    or None: none. YaRN's attention factor is :func:`rope_attention_factor`. The same formulas as
    :func:`headwise.reference.rope_frequencies`, tested equal to Hugging Face's.

    Raises:
        ValueError: an unknown ``rope_type`` or a missing key.
    """
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    kind = _scaling_type(scaling)
    if kind == "default":
        return inv
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor
    old = float(scaling["original_max_position_embeddings"])
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, smoothed, scaled)
    beta_fast = float(scaling.get("beta_fast") or 32.0)
    beta_slow = float(scaling.get("beta_slow") or 1.0)

    def dim_of(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` turns in `old`
        return head_dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no division by zero
    i = torch.arange(head_dim // 2, dtype=torch.float64, device=device)
    ramp = ((i - low) / (high - low)).clamp(0.0, 1.0)  # 0: keep θ_i (fast pairs), 1: θ_i / s (slow pairs)
    return inv / factor * ramp + inv * (1.0 - ramp)


def rope_attention_factor(scaling: dict | None = None) -> float:
    """The factor multiplying RoPE's ``cos`` and ``sin`` (so the scores by its square): 1 except for YaRN.

    YaRN: ``attention_factor`` when given; else ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` when both
    are set (DeepSeek-V2/V3), else ``0.1 · ln(s) + 1`` (Peng et al. 2023 eq. 21), as Hugging Face.
    """
    if _scaling_type(scaling) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all:
        return _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all))
    return _yarn_mscale(factor)


def rope_angles(positions: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """``cos, sin`` of ``positions · θ``: ``(L, Dh/2)`` for positions ``(L,)``, ``(B, 1, L, Dh/2)`` for ``(B, L)``."""
    ang = positions.to(torch.float64)[..., None] * inv_freq.to(positions.device)  # (..., L, Dh/2)
    if ang.dim() == 3:
        ang = ang[:, None]  # (B, 1, L, Dh/2): one angle per batch item, shared by the heads
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, convention: str = "half") -> Tensor:
    """Rotate ``x (B, H, L, Dh)`` by the angles whose ``cos, sin`` are ``(…, L, Dh/2)``."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if convention == "half":
        x1, x2 = x.chunk(2, dim=-1)  # (B, H, L, Dh/2) each
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    xe, xo = x[..., 0::2], x[..., 1::2]  # (B, H, L, Dh/2) each
    return torch.stack([xe * cos - xo * sin, xe * sin + xo * cos], dim=-1).flatten(-2)  # (B, H, L, Dh)


class RotaryEmbedding(PositionalPart):
    """RoPE as a part for ``MultiHeadAttention(positional=RotaryEmbedding(head_dim))``.

    Args:
        head_dim: Dh, even.
        base: ``θ`` base (Hugging Face ``rope_theta``), 10000 in the paper.
        convention: ``"half"`` (GPT-NeoX / Hugging Face Llama) or ``"interleaved"`` (RoFormer / Meta Llama).
        scaling: Hugging Face ``rope_scaling`` dict (``linear``, ``llama3``, ``yarn``) or None; with YaRN the
            rotated q and k are also multiplied by :func:`rope_attention_factor` (as Hugging Face's ``cos``/``sin``).
    Raises:
        ValueError: an odd or non-positive ``head_dim``, an unknown convention, a non-positive base, a scaling
            dict of unknown type or missing keys.
    """

    def __init__(self, head_dim: int, *, base: float = 10000.0, convention: str = "half", scaling: dict | None = None):
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
            raise ValueError(f"head_dim: RoPE needs a positive even head width, got {head_dim!r}")
        if convention not in CONVENTIONS:
            raise ValueError(f"convention: expected one of {CONVENTIONS}, got {convention!r}")
        if not base > 0:
            raise ValueError(f"base: expected a positive number, got {base!r}")
        self.head_dim, self.base, self.convention, self.scaling = head_dim, float(base), convention, scaling
        self.register_buffer("inv_freq", rope_frequencies(head_dim, self.base, scaling), persistent=False)
        self.attention_factor = rope_attention_factor(scaling)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, convention={self.convention!r}, scaling={self.scaling}"

    def check(self, *, num_heads: int, head_dim: int) -> None:
        if head_dim != self.head_dim:
            raise ValueError(
                f"positional: RotaryEmbedding(head_dim={self.head_dim}) given to a module with head_dim={head_dim}"
            )

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x (B, H, L, Dh)`` rotated at ``positions (L,)`` or ``(B, L)``."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x: expected last dimension head_dim={self.head_dim}, got shape {tuple(x.shape)}")
        cos, sin = self._angles(positions)
        return apply_rope(x, cos, sin, self.convention)

    def _angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = rope_angles(positions, self.inv_freq)
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor  # YaRN
        return cos, sin

    def rotation(self) -> tuple[Tensor, str, float] | None:
        """``(inv_freq, convention, attention_factor)`` — None for a subclass, which may rotate otherwise."""
        if type(self) is not RotaryEmbedding or self.inv_freq.dtype != torch.float64:
            return None
        return self.inv_freq, self.convention, self.attention_factor

    def rotate_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self._angles(q_pos)
        q = apply_rope(q, cos, sin, self.convention)
        if k_pos is not q_pos:
            cos, sin = self._angles(k_pos)
        return q, apply_rope(k, cos, sin, self.convention)
