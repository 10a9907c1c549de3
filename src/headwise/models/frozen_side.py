"""One head's query or key side frozen at a run: the affine map from the residual stream to its post-rotary query
(key), with the input norm's and the QK-norm's scales held at that run (what QK attribution sends each part of the
residual stream through). Built by the anatomy: :meth:`headwise.models.anatomy.LayerAnatomy.freeze_side`.

Shape legend: n parts, L' positions, D model width, Dh head width.

    part ─ input norm (scale frozen at its position; a LayerNorm's centring is linear) ─ the head's columns of
    W_Q or W_K (the bias its own part) ─ QK-norm (scale frozen per position) ─ the side's factor ─ rotation
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from headwise.models.norms import FrozenNorm

__all__ = ["FrozenSide"]


class FrozenSide:
    """The map from the residual stream to one head's post-rotary query or key, frozen at a run.

    Attributes:
        G: ``(D, Dh)`` float64, the head's columns with the input norm's gain (and centring) folded in: a part ``t``
            of the residual goes to ``(t @ G) · inv`` before the QK-norm (:meth:`projected`).
        b: ``(Dh,)`` the projection's bias (zeros without one); ``norm_bias``: ``(Dh,)`` the input norm's bias
            through the columns (None without an input norm).
    """

    def __init__(
        self,
        W: Tensor,
        b: Tensor,
        input_norm: FrozenNorm | None,
        qk_norm: tuple[FrozenNorm, slice] | None,
        rotate: Callable[[Tensor, Tensor], Tensor],
        scale: float = 1.0,
    ):
        self.input_norm, self.qk_norm, self.rotate = input_norm, qk_norm, rotate
        self.scale = scale  # a factor the module puts on this side after the projection (OPT's queries)
        self.G = W if input_norm is None else input_norm.fold(W)  # (D, Dh)
        self.norm_bias = None if input_norm is None else input_norm.bias @ W  # (Dh,)
        self.b = b

    def _after_projection(self, t: Tensor, pos: Tensor, rotate: bool = True) -> Tensor:
        """``t (n, L', Dh)`` at positions ``pos (L',)``: the frozen QK-norm, the factor, then the rotation."""
        if self.qk_norm is not None:
            frozen, cols = self.qk_norm
            if frozen.centred:  # a LayerNorm QK-norm over each head's Dh (Persimmon): its centring is linear
                t = t - t.mean(-1, keepdim=True)
            t = t * frozen.gain[cols] * frozen.inv[pos][None, :, None]
        if self.scale != 1.0:
            t = t * self.scale
        return self.rotate(t, pos) if rotate else t

    def projected(self, t: Tensor, pos: Tensor, rotate: bool = True) -> Tensor:
        """``t (n, L', Dh)``: residual parts at ``pos (L',)`` already multiplied by :attr:`G` -> ``(n, L', Dh)``
        (``rotate=False``: before the rotation)."""
        if self.input_norm is not None:
            t = t * self.input_norm.inv[pos][None, :, None]
        return self._after_projection(t, pos, rotate)

    def constants(self, pos: Tensor, rotate: bool = True) -> Tensor:
        """``(2, L', Dh)``: the input norm's bias and the projection's bias (with a QK-norm's), each through the
        rest of the map (``rotate=False``: before the rotation)."""
        n = pos.shape[0]
        nb = torch.zeros_like(self.b) if self.norm_bias is None else self.norm_bias
        t = torch.stack([nb, self.b])[:, None, :].expand(2, n, -1)
        t = self._after_projection(t, pos, rotate=False)
        if self.qk_norm is not None:
            frozen, cols = self.qk_norm
            t = t.clone()
            t[1] = t[1] + frozen.bias[cols] * self.scale
        return self.rotate(t, pos) if rotate else t
