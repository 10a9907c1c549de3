"""A block of attention rows with what each of its positions is: the one input of every metric's reducer.

Shape legend: B batch, H heads, R query rows of the block, S' keys the block sees (all L of a full map; a causal
block of the streaming pass sees the keys up to its last row), L padded length.

Every per-head metric of :mod:`headwise.analysis` is a sum over query rows of something computed from one row
of one head's weights. Each metric's module writes that per-row maths once, as a *reducer*: a function of a
:class:`RowBlock` returning one value per row, ``(B, H, R)`` (0 at padded rows). Both paths call the same
reducers: the full-map functions on one block holding the whole map (:meth:`RowBlock.full`, rows = keys =
every position), the streaming pass (:mod:`headwise.analysis.streaming`) on a block of rows at a time as the
model forms them inside attention (:meth:`RowBlock.of`). Each path then finishes the per-row values its way
(a mean over rows per sentence; running sums over blocks).

Each row is taken over the real keys and renormalised (as :func:`~headwise.analysis.tokens.as_attention` does)
through its total ``T``: a reducer applies ``inv = 1 / T`` to its per-row result rather than to every weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headwise.analysis.tokens import TokenInfo

__all__ = ["RowBlock", "inverse"]


def inverse(total):
    """``1 / total`` where a row has weight, 0 where it has none (a fully blocked or padded row): same shape."""
    import torch

    return torch.where(total > 0, 1.0 / torch.where(total > 0, total, torch.ones_like(total)), 0.0)


@dataclass(frozen=True)
class RowBlock:
    """Rows ``start … start + R − 1`` of every head's weights and what their positions are (torch tensors).

    Attributes:
        w: ``(B, H, R, S')`` float weights as the model formed them, padded keys set to 0.
        start: the first query row's index in the sequence.
        rows: ``(B, R)`` bool, real query rows; keys: ``(B, S')`` bool, real keys.
        n: ``(B,)`` int64 real tokens of each sentence (every key, inside the block or beyond it).
        qpos: ``(B, R)`` int64 positions of the queries; kpos: ``(B, S')`` int64 positions of the keys — the
            positions distances and argmax offsets count (the streaming pass: among the real tokens; a full
            map: its slots).
        total: ``(B, H, R)`` each row's weight over the real keys ``T``; inv: ``1 / T`` (0 for an empty row);
            scale: ``inv`` at the real rows, 0 at padded ones.
        moment: ``(B, H, R)`` ``Σ_j w_ij · kpos_j`` (formed with the totals in one product; the distance's).
        causal: no row weighs a key after its own position (the distance skips the keys ahead).
    """

    w: object
    start: int
    rows: object
    keys: object
    n: object
    qpos: object
    kpos: object
    total: object
    moment: object
    inv: object
    scale: object
    causal: bool = False

    @classmethod
    def of(cls, w, start: int, rows, keys, n, qpos, kpos, *, causal: bool = False) -> RowBlock:
        """A block of weights ``w`` ``(B, H, R, S')``; padded keys (``keys`` False) are zeroed here, and the rows'
        totals and position moments formed in one pass over the weights."""
        import torch

        if not bool(keys.all()):
            w = w * keys[:, None, None, :]  # padded keys out
        kp = kpos.to(w.dtype)  # (B, S')
        tk = w @ torch.stack([torch.ones_like(kp), kp], -1)[:, None]  # (B, H, R, 2): Σ_j w_ij and Σ_j w_ij c_j
        total, moment = tk[..., 0], tk[..., 1]  # (B, H, R)
        inv = inverse(total)  # (B, H, R)
        scale = inv * rows[:, None, :].to(w.dtype)  # (B, H, R): renormalisation, padded rows out
        return cls(w, start, rows, keys, n, qpos, kpos, total, moment, inv, scale, causal)

    @classmethod
    def full(cls, a: np.ndarray, info: TokenInfo) -> RowBlock:
        """The whole map as one block: ``a`` ``(B, H, L, L)`` float64 as :func:`~headwise.analysis.tokens.as_attention`
        returns it (padded rows and keys 0, real rows renormalised), positions = slots."""
        import torch

        valid = torch.as_tensor(np.asarray(info.valid, dtype=bool))  # (B, L)
        B, L = valid.shape
        pos = torch.arange(L).expand(B, L)  # (B, L)
        return cls.of(torch.from_numpy(np.ascontiguousarray(a)), 0, valid, valid, valid.sum(1), pos, pos)

    @property
    def stop(self) -> int:
        """One past the last query row."""
        return self.start + self.w.shape[-2]
