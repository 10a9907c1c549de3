"""Attention as pure functions of tensors — the maths that the modules call.

Shape legend: B batch, L query length, S key length, H query heads, Hkv key/value heads
(H % Hkv == 0; Hkv < H is grouped-query attention, Hkv = 1 multi-query), Dh head width.

Masks arrive as ``blocked`` (bool, True = may not attend) and ``bias`` (float, added to the scores),
both broadcastable to ``(B, H, L, S)`` — see :mod:`headwise.masks`. A query row with every key blocked
yields zero weights and a zero output, in forward and backward (``nn.MultiheadAttention`` yields NaN
there, pytorch#41508).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from headwise import masks

BACKENDS = ("auto", "math", "sdpa")


def softmax(scores: Tensor, blocked: Tensor | None = None) -> Tensor:
    """Max-subtracted softmax over the last axis; blocked (or ``-inf``) entries get 0.

    A row with every entry blocked gives all zeros and zero gradients, never NaN.
    """
    if blocked is not None:
        scores = scores.masked_fill(blocked, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True).detach()  # softmax is shift-invariant: a constant
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(scores - m)
    s = e.sum(dim=-1, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


def repeat_kv(x: Tensor, num_heads: int) -> Tensor:
    """``(B, Hkv, S, Dh) -> (B, H, S, Dh)``: key/value head g serves query heads g·G … (g+1)·G − 1."""
    hkv = x.shape[1]
    if hkv == num_heads:
        return x
    return x.repeat_interleave(num_heads // hkv, dim=1)  # (B, H, S, Dh)


def _check(q: Tensor, k: Tensor, v: Tensor, backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v: expected rank-4 tensors (B, H, L, Dh), got shapes {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[1] != v.shape[1] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"k, v: expected the same number of key/value heads dividing the {q.shape[1]} query heads, "
            f"got {k.shape[1]} and {v.shape[1]}"
        )


def attention_math(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """The readable path: ``softmax(q kᵀ · scale + bias) v``. Returns ``(out (B,H,L,Dh), weights (B,H,L,S))``."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    h = q.shape[1]
    k = repeat_kv(k, h)  # (B, H, S, Dh)
    v = repeat_kv(v, h)
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, L, S)
    if bias is not None:
        scores = scores + bias
    weights = softmax(scores, blocked)  # (B, H, L, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights  # (B, H, L, Dh), (B, H, L, S)


def attention_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The fast path: ``F.scaled_dot_product_attention`` (flash / fused kernels). Returns ``out (B,H,L,Dh)``.

    ``is_causal`` here means top-left aligned (query i sees keys j <= i) and is only passed to the
    kernel when there is no other mask.
    """
    gqa = q.shape[1] != k.shape[1]
    mask = masks.to_sdpa(blocked, bias, q.dtype)
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout_p,
        is_causal=is_causal and mask is None,
        scale=scale,
        enable_gqa=gqa,
    )
    dead = masks.dead_rows(blocked, bias)
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return out


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    backend: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1) with GQA, masks and two paths.

    Args:
        q: ``(B, H, L, Dh)``; k, v: ``(B, Hkv, S, Dh)``.
        blocked: bool, True = may not attend, broadcastable to ``(B, H, L, S)``.
        bias: float added to the scores (a float mask, ALiBi), broadcastable to ``(B, H, L, S)``.
        is_causal: also block keys ``j > i`` (top-left aligned, as ``F.scaled_dot_product_attention``).
        scale: defaults to ``1 / sqrt(Dh)``.
        dropout_p: dropout on the attention weights (pass 0 in eval).
        need_weights: return the weights ``(B, H, L, S)``; forces the math path.
        backend: ``"math"`` (readable softmax), ``"sdpa"`` (``F.scaled_dot_product_attention``) or
            ``"auto"`` (sdpa unless weights are needed).
    Returns:
        ``(out (B, H, L, Dh), weights (B, H, L, S) or None)``.
    """
    _check(q, k, v, backend)
    if need_weights or backend == "math":
        if is_causal:
            L, S = q.shape[-2], k.shape[-2]
            c = masks.causal(torch.arange(L, device=q.device), torch.arange(S, device=q.device))
            blocked = c if blocked is None else blocked | c
        out, w = attention_math(q, k, v, blocked=blocked, bias=bias, scale=scale, dropout_p=dropout_p)
        return out, (w if need_weights else None)
    return attention_sdpa(
        q, k, v, blocked=blocked, bias=bias, is_causal=is_causal, scale=scale, dropout_p=dropout_p
    ), None
