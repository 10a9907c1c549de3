"""Heads replaced where they meet W_O: zeroed, mean-ablated or patched — the one function every tool calls.

Shape legend: N rows of a forward pass, J copies of an input batch in one pass, P rows of one input batch (N = J·P),
H query heads, L query length, Dh head width.

A head's contribution is its slice of the output projection's input: the per-head outputs ``(N, H, L, Dh)`` at
``layers.{i}.attn.heads`` (:mod:`headwise.points`). :func:`replace_heads` replaces chosen heads of chosen copies
there: the batched engine (:mod:`headwise.analysis.batched`: J jobs as J copies of a batch, importance's ablations,
patching's sweep, circuits' paths) and :func:`headwise.hf.ablate` (one copy: J = 1) both call it. It lives at the
package's root, below ``analysis/`` and ``hf/`` alike, so that each reaches it without importing the other (``hf/``
imports no ``analysis/``).
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["MODES", "replace_heads"]

#: How a removed head's output is replaced: zeros, or its mean over the copy's real positions.
MODES = ("zero", "mean")


def replace_heads(out: Tensor, keep: Tensor, J: int, replacement: str | Tensor = "zero", real: Tensor | None = None):
    """Copy j's heads where ``keep[j]`` is True, replaced; the other heads and copies as they are — the one place
    heads are zeroed, mean-ablated or patched.

    Args:
        out: the per-head outputs ``(J·P, H, L, Dh)`` of one layer (row ``j·P + p`` is input p of copy j).
        keep: bool ``(J, H)`` (every position) or ``(J, H, L)`` (the positions marked).
        J: copies.
        replacement: ``"zero"``; ``"mean"`` (the head's mean over copy j's real positions, all P rows together);
            or a tensor ``(P, H, L, Dh)``, another run's heads (patching).
        real: ``"mean"``: bool ``(P, L)``, True at real (non-padding) positions (None: every position).
    Returns:
        ``(J·P, H, L, Dh)``.
    Raises:
        ValueError: an unknown ``replacement``; ``"mean"`` with no real position. RuntimeError: a replacement
            tensor of another shape than the layer's heads.
    """
    import torch

    N, H, L, Dh = out.shape
    P = N // J
    x = out.reshape(J, P, H, L, Dh)
    mask = keep[:, None, :, :, None] if keep.dim() == 3 else keep[:, None, :, None, None]  # (J, 1, H, L|1, 1)
    if isinstance(replacement, str):
        if replacement == "zero":
            return torch.where(mask, torch.zeros((), dtype=out.dtype, device=out.device), x).reshape(N, H, L, Dh)
        if replacement != "mean":
            raise ValueError(f"replacement: expected one of {MODES} or a tensor, got {replacement!r}")
        w = torch.ones(P, L, dtype=out.dtype, device=out.device) if real is None else real.to(out.dtype)
        w = w.to(out.device)[None, :, None, :, None]  # (1, P, 1, L, 1)
        count = w.sum()
        if float(count) == 0:
            raise ValueError("real: mean ablation found no real (non-padding) position in the batch")
        mean = (x * w).sum(dim=(1, 3), keepdim=True) / count  # (J, 1, H, 1, Dh)
        return torch.where(mask, mean, x).reshape(N, H, L, Dh)
    src = replacement.to(out.dtype)
    if tuple(src.shape) != (P, H, L, Dh):
        raise RuntimeError(f"replace_heads: the layer gave heads {tuple(out.shape)}, the source {tuple(src.shape)}")
    return torch.where(mask, src[None], x).reshape(N, H, L, Dh)
