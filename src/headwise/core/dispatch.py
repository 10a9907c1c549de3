"""The one entry and the dispatcher: :func:`scaled_dot_product_attention` checks, :func:`attend` picks the path.

Also reachable as ``headwise.functional``. It stands above both the maths (:mod:`headwise.core.functional`:
``attention_math``, the readable path, and ``attention_sdpa``, the kernel call) and the fast paths
(:mod:`headwise.core.blocked`, :mod:`headwise.core.one_query`), so that the maths imports none of them.

:func:`attend` reads one :class:`~headwise.core.call.AttentionCall` and chooses once:

- ``attention_math`` for ``backend="math"`` (and for forward-mode derivatives, which only the maths has, and
  under ``torch.compile`` when weights, soft-capping or sinks are asked for);
- ``one_query.attention_one_query`` for one decoded token on the CPU without autograd (memory-bound: two matrix
  products over the entries as they lie, a bf16 cache read as bf16);
- ``blocked.attention_weights`` (the maths a block of scores at a time) when weights are asked for or
  soft-capping / sinks are on, which ``F.scaled_dot_product_attention`` cannot do;
- ``attention_sdpa`` otherwise, plain causality from the first slot as the kernel's flag (nothing ``L × S``).

Keys and values in another dtype than the queries (a bf16 cache under a float32 module) are cast to the
queries' dtype, except by the one-query route, which reads them as they are.

Shape legend: B batch, L query length, S key length, H query heads, Hkv key/value heads, Dh query/key head
width, Dv value head width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headwise.core import masks, one_query
from headwise.core.blocked import attention_weights
from headwise.core.call import BACKENDS, AttentionCall
from headwise.core.functional import attention_math, attention_sdpa
from headwise.core.guards import forward_mode

__all__ = ["BACKENDS", "AttentionCall", "attend", "attention_math", "attention_sdpa", "scaled_dot_product_attention"]


def attend(q: Tensor, k: Tensor, v: Tensor, call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    """:func:`scaled_dot_product_attention` without its input checks — for callers that checked at their own
    boundary (:class:`headwise.MultiHeadAttention`). Picks the path; see the module docstring.

    Args:
        q: ``(B, H, L, Dh)``; k: ``(B, Hkv, S, Dh)``; v: ``(B, Hkv, S, Dv)``.
        call: what the call needs besides them (:class:`~headwise.core.call.AttentionCall`): ``q_offset``,
            ``key_slots`` and ``sink_tokens`` place causality and the window on the keys' slots (after a cache,
            on a ring), all through :func:`headwise.core.masks.causality`, nowhere else.
    Returns:
        ``(out (B, H, L, Dv), weights (B, H, L, S) / (B, L, S) or None)``.
    """
    L, S = q.shape[-2], k.shape[-2]
    blocked, bias = call.blocked, call.bias
    if bias is not None and bias.dtype != q.dtype:  # scores are in q's dtype on every path (a float64 ALiBi bias)
        bias = bias.to(q.dtype)
        call = call.replace(bias=bias)
    need_weights = call.need_weights
    kernel_capped = call.softcap is not None or call.sinks is not None  # what F.sdpa cannot do
    # The readable path also for forward-mode derivatives (jvp): the SDPA kernels and the fast paths have no
    # forward-mode formulas, the maths does.
    math = (
        call.backend == "math"
        or (torch.compiler.is_compiling() and (need_weights or kernel_capped))
        or forward_mode(q, k, v)
    )
    if not (math or need_weights or kernel_capped) and one_query.applies(q, k, v, call.dropout_p):
        # one decoded token: memory-bound, two matrix products over the entries as they lie (a bf16 cache too)
        blocked = call.blocked_with_causality(L, S, device=q.device)
        return one_query.attention_one_query(q, k, v, blocked=blocked, bias=bias, scale=call.scale), None
    k, v = k.to(q.dtype), v.to(q.dtype)  # entries of a cache in another dtype (a bf16 cache)
    if math:
        out, weights = attention_math(
            q, k, v, blocked=call.blocked_with_causality(L, S, device=q.device), bias=bias, scale=call.scale,
            softcap=call.softcap, sinks=call.sinks, dropout_p=call.dropout_p,
        )  # fmt: skip
        if not need_weights:
            return out, None
        return out, (weights.mean(dim=1) if call.average_heads else weights)
    if need_weights or kernel_capped:
        return attention_weights(q, k, v, call)
    # Plain causality from the first slot goes to the kernel as a flag (nothing L × S is built); else a mask.
    flag, causal = call.causality(L, S, as_flag=blocked is None and bias is None, device=q.device)
    blocked = masks.either(blocked, causal)
    dropout_p = call.dropout_p
    return attention_sdpa(
        q, k, v, blocked=blocked, bias=bias, is_causal=flag, scale=call.scale, dropout_p=dropout_p
    ), None


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

    ``weights = softmax(cap(q kᵀ · scale) + bias, masked; sinks)``, ``out = weights v``. The keywords become one
    :class:`~headwise.core.call.AttentionCall`, checked once (:meth:`~headwise.core.call.AttentionCall.check`)
    and handed to :func:`attend`.

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
        backend: ``"math"`` (:func:`~headwise.core.functional.attention_math`), ``"sdpa"`` or ``"auto"`` (the
            same: the kernel when it can compute the call, else the blocked path).
    Returns:
        ``(out (B, H, L, Dv), weights (B, H, L, S) / (B, L, S) or None)``.
    Raises:
        ValueError / TypeError: shapes that do not fit, mask dtypes, a window without causality, a cap ≤ 0,
        sinks whose count is not H, an unknown backend.
    """
    call = AttentionCall(
        blocked=blocked, bias=bias, is_causal=is_causal, window=window, scale=scale, softcap=softcap, sinks=sinks,
        dropout_p=dropout_p, need_weights=need_weights, average_heads=average_heads, backend=backend,
    )  # fmt: skip
    call.check(q, k, v)
    return attend(q, k, v, call)
