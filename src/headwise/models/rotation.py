"""How a layer rotates its queries and keys by position, as the anatomy found it (linear at each position).

Shape legend: n heads, L' positions, Dh head width, r rotated width.

One vocabulary with :mod:`headwise.positional.rope` and :mod:`headwise.interop.hf_probe`: the ``convention`` is one
of :data:`headwise.positional.rope.CONVENTIONS` — ``"half"`` (feature ``i`` with ``i + r/2``, Hugging Face's
``rotate_half``: Llama, GPT-NeoX, Phi's partial rotary) or ``"interleaved"`` (feature ``2i`` with ``2i + 1``: GLM,
Cohere) —, and ``tables`` the layout of the ``(cos, sin)`` the model hands its attention, one of :data:`TABLES`
(as :func:`headwise.interop.hf_probe.rotary_tables` builds them): ``"full"`` (Llama's ``cat([θ, θ])``),
``"halved"`` (one angle per pair, GPT-OSS) or ``"interleaved"`` (Cohere's ``repeat_interleave``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from headwise.positional.rope import CONVENTIONS

__all__ = ["TABLES", "Rotation"]

#: How a family lays out the ``(cos, sin)`` tables it hands its attention (see the module docstring).
TABLES = ("full", "halved", "interleaved")


def _rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def _rotate_interleaved(x: Tensor) -> Tensor:
    return torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)


@dataclass(frozen=True)
class Rotation:
    """How a layer rotates q and k by position.

    ``kind``: ``"none"``; ``"headwise"`` (the module's own part, ``part.rotate_qk``); ``"tables"`` (by the
    ``(cos, sin)`` the model hands its attention, ``position_embeddings``, in ``convention`` ∈
    :data:`~headwise.positional.rope.CONVENTIONS` from tables laid out as ``tables`` ∈ :data:`TABLES`).
    """

    kind: str
    part: object | None = None
    convention: str | None = None
    tables: str | None = None

    def __post_init__(self):
        if self.kind == "tables" and (self.convention not in CONVENTIONS or self.tables not in TABLES):
            raise ValueError(
                f"rotation: expected a convention in {CONVENTIONS} and tables in {TABLES}, got "
                f"{self.convention!r}, {self.tables!r}"
            )

    @classmethod
    def candidates(cls) -> list[Rotation]:
        """Every ``"tables"`` rotation the anatomy tries on the ``(cos, sin)`` handed to an attention."""
        pairs = (("half", "full"), ("half", "halved"), ("interleaved", "full"), ("interleaved", "interleaved"))
        return [cls("tables", convention=c, tables=t) for c, t in pairs]

    def _angles(self, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """``(cos, sin) (L', w)`` as handed -> ``(L', r)`` in this rotation's convention."""
        if self.tables == "halved":  # one angle per pair: (L', r/2)
            cos, sin = (
                (torch.cat([cos, cos], -1), torch.cat([sin, sin], -1))
                if self.convention == "half"
                else (cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1))
            )
        elif self.tables == "full" and self.convention == "interleaved":  # the frequencies from the first half
            r = cos.shape[-1]
            cos, sin = cos[..., : r // 2].repeat_interleave(2, -1), sin[..., : r // 2].repeat_interleave(2, -1)
        return cos, sin  # "full" for "half", "interleaved" for "interleaved": as handed

    def __call__(self, t: Tensor, pos: Tensor, position_embeddings=None) -> Tensor:
        """``t (n, L', Dh)`` at positions ``pos (L',)`` rotated; ``position_embeddings``: the ``(cos (1, L, w),
        sin)`` of the run (for ``"tables"``), indexed at ``pos``."""
        if self.kind == "none":
            return t
        if self.kind == "headwise":
            t4 = t[:, None]
            return self.part.rotate_qk(t4, t4, pos, pos)[0][:, 0]
        cos, sin = self._angles(*(x[0][pos].to(t.dtype) for x in position_embeddings))  # (L', r)
        r = cos.shape[-1]
        rot, rest = t[..., :r], t[..., r:]
        if self.convention == "half" and not (torch.is_grad_enabled() and t.requires_grad):
            h = r // 2  # x·cos + rotate_half(x)·sin, written half by half in place
            x1, x2 = rot[..., :h], rot[..., h:]
            out = torch.empty_like(t)
            torch.mul(x1, cos[..., :h], out=out[..., :h]).addcmul_(x2, sin[..., :h], value=-1.0)
            torch.mul(x2, cos[..., h:], out=out[..., h:r]).addcmul_(x1, sin[..., h:])
            if r < t.shape[-1]:
                out[..., r:] = rest
            return out
        turn = _rotate_half if self.convention == "half" else _rotate_interleaved
        return torch.cat([rot * cos + turn(rot) * sin, rest], -1)
