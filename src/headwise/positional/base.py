"""The interface of a positional part passed to ``MultiHeadAttention(positional=...)``."""

from __future__ import annotations

from torch import Tensor, nn


class PositionalPart(nn.Module):
    """Positions that act inside attention (rather than being added to the embeddings).

    A part may rotate queries and keys (RoPE) and/or add a bias to the scores (ALiBi). Positions are
    integer tensors ``(L,)`` (shared by the batch) or ``(B, L)``.
    """

    def rotate_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``q (B, H, L, Dh)``, ``k (B, Hkv, S, Dh)`` -> the same, rotated. Default: unchanged."""
        return q, k

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """A float bias broadcastable to ``(B, H, L, S)``, or None. Default: None."""
        return None

    def rotation(self) -> tuple[Tensor, str, float] | None:
        """``(inv_freq (Dh/2,) float64, convention, factor)`` when this part only rotates queries and keys as
        RoPE with these frequencies (a compiled decode step can then rotate them itself), else None. Default:
        None."""
        return None

    def check(self, *, num_heads: int, head_dim: int) -> None:
        """Raise ValueError if this part cannot serve a module with these sizes."""
