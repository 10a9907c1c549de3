"""Sinusoidal positional encoding, Vaswani et al. 2017 §3.5."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headwise import checks


def sinusoidal_table(
    max_len: int, d_model: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32, device=None
) -> Tensor:
    """``(max_len, d_model)``: ``PE[pos, 2i] = sin(pos / base^(2i/d))``, ``PE[pos, 2i+1] = cos(…)``.

    The first article's ``positional_encoding``; the same formula as
    :func:`headwise.reference.sinusoidal_table`. Angles are computed in float64, then cast.

    Raises:
        ValueError: non-positive sizes or an odd ``d_model``.
    """
    checks.positive_int("max_len", max_len)
    checks.positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model: expected an even width for sinusoidal positions, got {d_model}")
    pos = torch.arange(max_len, dtype=torch.float64, device=device)[:, None]  # (max_len, 1)
    i = torch.arange(d_model // 2, dtype=torch.float64, device=device)[None, :]  # (1, D/2)
    angles = pos / base ** (2 * i / d_model)  # (max_len, D/2)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.to(dtype)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to ``x (B, L, D)``: ``x + PE[offset : offset + L]``.

    No trainable parameters; the table is a (non-persistent) buffer of ``max_len`` rows.
    """

    def __init__(self, d_model: int, max_len: int = 512):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer("pe", sinusoidal_table(max_len, d_model), persistent=False)

    def positions(self, length: int, offset: int = 0) -> Tensor:
        """The rows for positions ``offset … offset + length − 1``: ``(length, D)``."""
        if offset < 0 or offset + length > self.max_len:
            raise ValueError(
                f"sequence length: positions {offset}..{offset + length - 1} exceed max_len={self.max_len}"
            )
        return self.pe[offset : offset + length]

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, L, {self.d_model}), got {tuple(x.shape)}")
        return x + self.positions(x.shape[1], offset).to(x.dtype)
