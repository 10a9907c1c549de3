"""Attention as pure functions of tensors — the maths, and nothing that picks a path.

Shape legend: B batch, L query length, S key length, H query heads, Hkv key/value heads
(H % Hkv == 0; Hkv < H is grouped-query attention, Hkv = 1 multi-query), Dh query/key head width,
Dv value head width (Dh unless a model says otherwise).

Masks arrive as ``blocked`` (bool, True = may not attend) and ``bias`` (float, added to the scores),
both broadcastable to ``(B, H, L, S)`` — see :mod:`headwise.core.masks`; causality is already in them (the
dispatcher places it with :func:`headwise.core.masks.causality`). A query row with every key blocked yields
zero weights and a zero output, in forward and backward (``nn.MultiheadAttention`` yields NaN there,
pytorch#41508).

:func:`attention_math` is the readable path; :func:`attention_sdpa` the same call through
``F.scaled_dot_product_attention``. This module imports only masks and the primitives: the entry point
``scaled_dot_product_attention`` and the dispatcher ``attend``, which chooses between these two and the fast
paths, stand above it in :mod:`headwise.core.dispatch` (also reachable as ``headwise.functional``).
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from headwise.core import masks
from headwise.core.primitives import repeat_kv, soft_cap, softmax


def attention_math(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """The readable path: ``softmax(cap(q kᵀ · scale) + bias) v``.

    ``cap(x) = softcap · tanh(x / softcap)`` when ``softcap`` is given (Gemma 2), else ``x``.
    Memory: the ``(B, H, L, S)`` scores and weights.
    Returns ``(out (B, H, L, Dv), weights (B, H, L, S))``.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    h = q.shape[1]
    k = repeat_kv(k, h)  # (B, H, S, Dh)
    v = repeat_kv(v, h)  # (B, H, S, Dv)
    scores = soft_cap((q @ k.transpose(-2, -1)) * scale, softcap)  # (B, H, L, S)
    if bias is not None:
        scores = scores + bias
    weights = softmax(scores, blocked, sinks)  # (B, H, L, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights  # (B, H, L, Dv), (B, H, L, S)


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
    """``F.scaled_dot_product_attention`` (flash / fused kernels). Returns ``out (B, H, L, Dv)``.

    ``is_causal`` is the kernel's flag (top-left aligned) and is only passed without masks. Memory: the
    kernel's own (flash: O(L·Dh) per head) plus the ``(B|1, H|1, L, S)`` mask when masks are given.
    """
    mask = masks.to_sdpa(blocked, bias, q.dtype)
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    dead = masks.dead_rows(blocked, bias)
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return out
