"""The small operations every attention path shares, written once: the readable path
(:func:`headwise.core.functional.attention_math`), the blocked weights path (:mod:`headwise.core.blocked`),
one-query attention (:mod:`headwise.core.one_query`), the rows a ``hook_qk`` reader forms
(:class:`headwise.core.rows.AttentionRows`) and the ring-attention block kernels
(:mod:`headwise.distributed.kernels`) import them from here.

Pure maths on tensors, no dispatch: the readable path may use them.

Shape legend: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), L query length, S key length,
Dh head width.
"""

from __future__ import annotations

import torch
from torch import Tensor


def soft_cap(scores: Tensor, cap: float | None) -> Tensor:
    """``cap · tanh(scores / cap)`` (Gemma 2's ``attn_logit_softcapping``), or ``scores`` when ``cap`` is None."""
    if cap is None:
        return scores
    return cap * torch.tanh(scores / cap)


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


def softmax_(
    scores: Tensor, blocked: Tensor | None = None, sinks: Tensor | None = None, *, dead: Tensor | None = None
) -> Tensor:
    """:func:`softmax`'s weights, overwriting ``scores``: torch's fused softmax (one pass, not five) for the fast
    paths, which own their scores. ``dead`` ``(..., L, 1)``: the rows with every key blocked (or at ``-inf``,
    :func:`headwise.core.masks.dead_rows`), which give zeros — and zero gradients, since their scores are
    zeroed before the softmax; None when no row can be. With ``sinks`` it is :func:`softmax` itself."""
    if sinks is not None:
        return softmax(scores, blocked, sinks)
    if blocked is not None:
        scores.masked_fill_(blocked, float("-inf"))
    if dead is not None:
        scores.masked_fill_(dead, 0.0)
    w = torch.softmax(scores, dim=-1)
    if dead is None:
        return w
    return w.masked_fill(dead, 0.0) if w.requires_grad else w.masked_fill_(dead, 0.0)  # autograd keeps w


def repeat_kv(x: Tensor, num_heads: int) -> Tensor:
    """``(B, Hkv, S, Dh) -> (B, H, S, Dh)``: key/value head g serves query heads g·G … (g+1)·G − 1, G = H / Hkv
    (Hugging Face Llama's ``repeat_kv``). Returns ``x`` itself when ``H == Hkv``."""
    hkv = x.shape[1]
    if hkv == num_heads:
        return x
    return x.repeat_interleave(num_heads // hkv, dim=1)  # (B, H, S, Dh)
