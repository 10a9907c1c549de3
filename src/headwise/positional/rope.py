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


def rope_frequencies(head_dim: int, base: float = 10000.0, scaling: dict | None = None, device=None) -> Tensor:
    """``θ_i`` for ``i = 0 … Dh/2 − 1``, float64, with optional context-extension scaling.

    ``scaling`` follows Hugging Face's ``rope_scaling``: ``{"rope_type": "linear", "factor": f}``
    (positions divided by f) or ``{"rope_type": "llama3", "factor", "low_freq_factor",
    "high_freq_factor", "original_max_position_embeddings"}`` (Llama 3.1); ``"default"`` or None: none.
    """
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"scaling: rope_type {kind!r} is not supported (expected 'default', 'linear' or 'llama3')")


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
        scaling: Hugging Face ``rope_scaling`` dict (``linear``, ``llama3``) or None.
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
        cos, sin = rope_angles(positions, self.inv_freq)
        return apply_rope(x, cos, sin, self.convention)

    def rotate_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = rope_angles(q_pos, self.inv_freq)
        q = apply_rope(q, cos, sin, self.convention)
        if k_pos is not q_pos:
            cos, sin = rope_angles(k_pos, self.inv_freq)
        return q, apply_rope(k, cos, sin, self.convention)
