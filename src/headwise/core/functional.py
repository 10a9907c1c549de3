"""Attention as pure functions of tensors — the maths that the modules call.

Shape legend: B batch, L query length, S key length, H query heads, Hkv key/value heads
(H % Hkv == 0; Hkv < H is grouped-query attention, Hkv = 1 multi-query), Dh query/key head width,
Dv value head width (Dh unless a model says otherwise).

Masks arrive as ``blocked`` (bool, True = may not attend) and ``bias`` (float, added to the scores),
both broadcastable to ``(B, H, L, S)`` — see :mod:`headwise.core.masks`. Causality (and a sliding window)
is decided by :func:`headwise.core.masks.causal` and nowhere else. A query row with every key blocked
yields zero weights and a zero output, in forward and backward (``nn.MultiheadAttention`` yields NaN
there, pytorch#41508).

The readable path is :func:`attention_math`. :func:`scaled_dot_product_attention` is the one entry: it
checks its inputs once and calls :func:`attend`, which picks the path — ``attention_math`` for
``backend="math"``, ``F.scaled_dot_product_attention`` (:func:`attention_sdpa`) when it can compute the
call, :func:`headwise.core.fastpath.attention_weights` (the same maths a block of scores at a time)
when weights are asked for or soft-capping / sinks are on, which the kernel cannot do, and
:func:`headwise.core.fastpath.attention_one_query` for one decoded token on the CPU without autograd.
Keys and values in another dtype than the queries (a bf16 cache under a float32 module) are cast to the
queries' dtype, except by the one-query kernel, which reads them as they are.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from headwise import checks
from headwise.core import fastpath, masks
from headwise.core.primitives import repeat_kv, softmax

BACKENDS = ("auto", "math", "sdpa")


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
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, L, S)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
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


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    q_offset: int = 0,
    window: int | None = None,
    key_slots: Tensor | None = None,
    sink_tokens: int = 0,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    average_heads: bool = False,
    backend: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """:func:`scaled_dot_product_attention` without its input checks — for callers that checked at
    their own boundary (:class:`headwise.MultiHeadAttention`). Picks the path; see the module docstring.

    ``q_offset``: the queries sit at key slots ``q_offset … q_offset + L − 1`` (0: top-left, the
    kernel's convention; ``S − L``: after a cache) — it places the causal and window masks.
    ``key_slots`` ``(S,)`` and ``sink_tokens``: the keys' own slots when they are not ``0 … S − 1`` (a ring
    cache's :class:`~headwise.core.cache.CacheRead`), and StreamingLLM's first slots that stay visible.
    All of it becomes a flag or a mask in :func:`headwise.core.masks.causality`, nowhere else.
    """
    L, S = q.shape[-2], k.shape[-2]
    if bias is not None and bias.dtype != q.dtype:  # scores are in q's dtype on every path (a float64 ALiBi bias)
        bias = bias.to(q.dtype)
    slots = {"q_offset": q_offset, "window": window, "key_slots": key_slots, "sink_tokens": sink_tokens}
    kernel_capped = softcap is not None or sinks is not None  # what F.scaled_dot_product_attention cannot do
    # The readable path also for forward-mode derivatives (jvp): the SDPA kernels and the fast paths have no
    # forward-mode formulas, the maths does.
    math = (
        backend == "math"
        or (torch.compiler.is_compiling() and (need_weights or kernel_capped))
        or fastpath.forward_mode(q, k, v)
    )
    if not (math or need_weights or kernel_capped) and fastpath.one_query_applies(q, k, v, dropout_p):
        # one decoded token: memory-bound, two matrix products over the entries as they lie (a bf16 cache too)
        _, causal = masks.causality(is_causal, L, S, **slots, device=q.device)
        out = fastpath.attention_one_query(q, k, v, blocked=masks.either(blocked, causal), bias=bias, scale=scale)
        return out, None
    k, v = k.to(q.dtype), v.to(q.dtype)  # entries of a cache in another dtype (a bf16 cache)
    if math:
        _, causal = masks.causality(is_causal, L, S, **slots, device=q.device)
        blocked = masks.either(blocked, causal)
        out, weights = attention_math(
            q, k, v, blocked=blocked, bias=bias, scale=scale, softcap=softcap, sinks=sinks, dropout_p=dropout_p
        )
        if not need_weights:
            return out, None
        return out, (weights.mean(dim=1) if average_heads else weights)
    if need_weights or kernel_capped:
        return fastpath.attention_weights(
            q,
            k,
            v,
            blocked=blocked,
            bias=bias,
            is_causal=is_causal,
            **slots,
            scale=scale,
            softcap=softcap,
            sinks=sinks,
            dropout_p=dropout_p,
            need_weights=need_weights,
            average_heads=average_heads,
        )
    # Plain causality from the first slot goes to the kernel as a flag (nothing L × S is built);
    # otherwise it is a mask.
    flag, causal = masks.causality(is_causal, L, S, **slots, as_flag=blocked is None and bias is None, device=q.device)
    blocked = masks.either(blocked, causal)
    out = attention_sdpa(q, k, v, blocked=blocked, bias=bias, is_causal=flag, scale=scale, dropout_p=dropout_p)
    return out, None


def check_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    backend: str = "auto",
) -> None:
    """Raise ValueError / TypeError naming the argument unless the call fits :func:`attend`."""
    checks.one_of("backend", backend, BACKENDS)
    if not all(isinstance(t, Tensor) for t in (q, k, v)):
        raise TypeError(
            f"q, k, v: expected torch.Tensors, got {type(q).__name__}, {type(k).__name__}, {type(v).__name__}"
        )
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
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(f"q, k, v: batch sizes differ: {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k: expected head width Dh={q.shape[-1]} (q's), got shape {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k, v: key lengths differ: {k.shape[-2]} and {v.shape[-2]}")
    if blocked is not None and (not isinstance(blocked, Tensor) or blocked.dtype != torch.bool):
        raise TypeError(
            f"blocked: expected a bool tensor (True = may not attend), got {getattr(blocked, 'dtype', blocked)!r}"
        )
    if bias is not None and (not isinstance(bias, Tensor) or not bias.is_floating_point()):
        raise TypeError(f"bias: expected a floating-point tensor, got {getattr(bias, 'dtype', bias)!r}")
    if window is not None:
        checks.positive_int("window", window)
        if not is_causal:
            raise ValueError(f"window: a sliding window needs is_causal=True, got window={window} without it")
    if softcap is not None:
        checks.positive_number("softcap", softcap)
    if sinks is not None and (
        not isinstance(sinks, Tensor) or not sinks.is_floating_point() or tuple(sinks.shape) != (q.shape[1],)
    ):
        raise ValueError(
            f"sinks: expected a float tensor of shape (H,)=({q.shape[1]},), one logit per query head, "
            f"got {getattr(sinks, 'shape', sinks)!r}"
        )


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    average_heads: bool = False,
    backend: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1) with GQA, masks and the modern kinds.

    ``weights = softmax(cap(q kᵀ · scale) + bias, masked; sinks)``, ``out = weights v``.

    Args:
        q: ``(B, H, L, Dh)``; k: ``(B, Hkv, S, Dh)``; v: ``(B, Hkv, S, Dv)``.
        blocked: bool, True = may not attend, broadcastable to ``(B, H, L, S)``.
        bias: float added to the scores (a float mask, ALiBi), broadcastable to ``(B, H, L, S)``.
        is_causal: query slot ``i`` attends key slots ``j ≤ i`` (top-left aligned, as
            ``F.scaled_dot_product_attention``).
        window: sliding window W (needs ``is_causal``): query ``i`` also may not attend keys ``j ≤ i − W``
            (Mistral, Gemma 2's local layers; Hugging Face ``sliding_window``).
        scale: defaults to ``1 / sqrt(Dh)``.
        softcap: ``c``: scores ``c · tanh(s / c)`` before bias and masks (Gemma 2's ``attn_logit_softcapping``).
        sinks: ``(H,)`` learned sink logits joining each row's softmax denominator (GPT-OSS ``s_aux``).
        dropout_p: dropout on the attention weights (pass 0 in eval).
        need_weights: also return the weights actually used (window, soft-capping and sinks included).
        average_heads: return them averaged over heads, ``(B, L, S)``.
        backend: ``"math"`` (:func:`attention_math`), ``"sdpa"`` or ``"auto"`` (the same: the kernel when it
            can compute the call, else the blocked path).
    Returns:
        ``(out (B, H, L, Dv), weights (B, H, L, S) / (B, L, S) or None)``.
    Raises:
        ValueError / TypeError: shapes that do not fit, mask dtypes, a window without causality, a cap ≤ 0,
        sinks whose count is not H, an unknown backend.
    """
    check_inputs(
        q, k, v, blocked=blocked, bias=bias, is_causal=is_causal, window=window, softcap=softcap, sinks=sinks,
        backend=backend,
    )  # fmt: skip
    return attend(
        q,
        k,
        v,
        blocked=blocked,
        bias=bias,
        is_causal=is_causal,
        window=window,
        scale=scale,
        softcap=softcap,
        sinks=sinks,
        dropout_p=dropout_p,
        need_weights=need_weights,
        average_heads=average_heads,
        backend=backend,
    )
