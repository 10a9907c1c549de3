"""ALiBi, Press et al. 2022 ("Train Short, Test Long"): a linear distance penalty per head."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from headwise import checks
from headwise.positional.base import PositionalPart


def alibi_slopes(num_heads: int) -> Tensor:
    """Head slopes ``m_h`` (float64, ``(H,)``).

    For a power of two n: ``2^(−8h/n)``, ``h = 1 … n``. Otherwise the slopes of the closest lower power
    of two, then every other slope of the next power of two — the paper's code, BLOOM
    (``build_alibi_tensor``) and MPT (``gen_slopes``) agree on this. Computed here in torch; a test holds
    it equal to :func:`headwise.reference.alibi_slopes`.
    """
    checks.positive_int("num_heads", num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))  # the largest power of two ≤ H
    h = torch.arange(1, closest + 1, dtype=torch.float64)
    slopes = 2.0 ** (-8.0 * h / closest)  # (closest,)
    if closest < num_heads:
        extra = torch.arange(1, 2 * (num_heads - closest), 2, dtype=torch.float64)  # odd h of 2·closest
        slopes = torch.cat([slopes, 2.0 ** (-8.0 * extra / (2 * closest))])  # (H,)
    return slopes


def alibi_bias(slopes: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """``−m_h · |i − j|``: ``(1, H, L, S)`` for positions ``(L,)``/``(S,)``, ``(B, H, L, S)`` for ``(B, ·)``.

    On causal rows (``j ≤ i``) this is the paper's ``−m_h (i − j)``; BLOOM's ``m_h · j`` differs from it by
    a per-row constant, which softmax ignores.
    """
    dist = (q_pos[..., :, None] - k_pos[..., None, :]).abs().to(slopes.dtype)  # (…, L, S)
    if dist.dim() == 2:
        dist = dist[None]  # (1, L, S)
    return -slopes[None, :, None, None] * dist[:, None]  # (B | 1, H, L, S)


class ALiBi(PositionalPart):
    """ALiBi as a part for ``MultiHeadAttention(positional=ALiBi(num_heads))``.

    The heads it serves are an integer buffer ``head_ids (H,)`` (tensor parallelism shards it with the
    heads: a rank keeps the ids of its own heads); the slopes are recomputed from them in float64, so
    casting the module to bf16 never rounds them.
    """

    def __init__(self, num_heads: int):
        super().__init__()
        checks.positive_int("num_heads", num_heads)
        self.num_heads = num_heads
        self.register_buffer("head_ids", torch.arange(num_heads), persistent=False)

    @property
    def slopes(self) -> Tensor:
        """float64 ``(H_local,)``: the slopes of the heads this part serves."""
        return alibi_slopes(self.num_heads).to(self.head_ids.device)[self.head_ids]

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"

    def check(self, *, num_heads: int, head_dim: int) -> None:
        if num_heads != self.num_heads:
            raise ValueError(
                f"positional: ALiBi(num_heads={self.num_heads}) given to a module with num_heads={num_heads}"
            )

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return alibi_bias(self.slopes, q_pos, k_pos)
