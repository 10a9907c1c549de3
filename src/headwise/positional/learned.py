"""Learned absolute positions (BERT, GPT-2): one trainable vector per position."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headwise import checks


class LearnedPositionalEmbedding(nn.Module):
    """``weight (max_len, D)``; ``forward(x (B, L, D), offset=0) = x + weight[offset : offset + L]``."""

    def __init__(self, max_len: int, d_model: int, *, device=None, dtype=None):
        super().__init__()
        checks.positive_int("max_len", max_len)
        checks.positive_int("d_model", d_model)
        self.max_len, self.d_model = max_len, d_model
        self.embedding = nn.Embedding(max_len, d_model, device=device, dtype=dtype)

    def positions(self, length: int, offset: int = 0) -> Tensor:
        """The rows for positions ``offset … offset + length − 1``: ``(length, D)``."""
        if offset < 0 or offset + length > self.max_len:
            raise ValueError(
                f"sequence length: positions {offset}..{offset + length - 1} exceed max_len={self.max_len}"
            )
        idx = torch.arange(offset, offset + length, device=self.embedding.weight.device)
        return self.embedding(idx)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, L, {self.d_model}), got {tuple(x.shape)}")
        return x + self.positions(x.shape[1], offset).to(x.dtype)
