"""The two small operations every attention path shares, written once: the readable path
(:func:`headwise.core.functional.attention_math`), the blocked path (:mod:`headwise.core.fastpath`) and the
ring-attention block kernels (:mod:`headwise.distributed.kernels`) import them from here.

Pure maths on tensors, no dispatch: the readable path may use them.

Shape legend: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), L query length, S key length,
Dh head width.
"""

from __future__ import annotations

import torch
from torch import Tensor


def softmax(scores: Tensor, blocked: Tensor | None = None, sinks: Tensor | None = None) -> Tensor:
    """Max-subtracted softmax over the last axis; blocked (or ``-inf``) entries get 0.

    ``sinks`` ``(H,)``: one extra logit per head (axis −3 of ``scores``) in every row's denominator and
    with no value of its own, as GPT-OSS's ``s_aux``, so a row's weights sum to less than one.
    A row with every entry blocked gives all zeros and zero gradients, never NaN.
    """
    if blocked is not None:
        scores = scores.masked_fill(blocked, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)  # (..., L, 1)
    sink = None
    if sinks is not None:
        sink = sinks.to(scores.dtype)[:, None, None]  # (H, 1, 1)
        m = torch.maximum(m, sink)
    m = m.detach()  # softmax is shift-invariant: a constant
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(scores - m)
    s = e.sum(dim=-1, keepdim=True)
    if sink is not None:
        s = s + torch.exp(sink - m)  # a fully blocked row: e = 0, so its weights stay 0
    return e / torch.where(s == 0, torch.ones_like(s), s)


def repeat_kv(x: Tensor, num_heads: int) -> Tensor:
    """``(B, Hkv, S, Dh) -> (B, H, S, Dh)``: key/value head g serves query heads g·G … (g+1)·G − 1, G = H / Hkv
    (Hugging Face Llama's ``repeat_kv``). Returns ``x`` itself when ``H == Hkv``."""
    hkv = x.shape[1]
    if hkv == num_heads:
        return x
    return x.repeat_interleave(num_heads // hkv, dim=1)  # (B, H, S, Dh)
