"""Attention as pure functions of tensors — the maths that the modules call.

Shape legend: B batch, L query length, S key length, H query heads, Hkv key/value heads
(H % Hkv == 0; Hkv < H is grouped-query attention, Hkv = 1 multi-query), Dh head width.

Masks arrive as ``blocked`` (bool, True = may not attend) and ``bias`` (float, added to the scores),
both broadcastable to ``(B, H, L, S)`` — see :mod:`headwise.core.masks`. A query row with every key blocked
yields zero weights and a zero output, in forward and backward (``nn.MultiheadAttention`` yields NaN
there, pytorch#41508).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from headwise.core import masks

BACKENDS = ("auto", "math", "sdpa")


def _onednn_linear_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        return False


_ONEDNN_LINEAR = _onednn_linear_available()
_ONEDNN_DTYPES = (torch.float32, torch.bfloat16)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: ``x Wᵀ + b``, ``(..., In) -> (..., Out)``.

    For float32 and bfloat16 on the CPU when no gradient is recorded (and autocast is off), it runs
    oneDNN's matmul with the bias added in the kernel's epilogue (``torch.ops.mkldnn._linear_pointwise``,
    the op TorchInductor's CPU path uses) instead of ``addmm``, which first copies the bias into the output
    (and, in float32, calls MKL); on the AMD Zen 4 benchmark machine that is 10-25% faster for
    projection-sized products. The result equals ``F.linear``'s up to round-off (tested). Everything else
    goes to ``F.linear``.
    """
    if (
        _ONEDNN_LINEAR
        and type(x) is Tensor
        and x.dtype in _ONEDNN_DTYPES
        and weight.dtype == x.dtype
        and x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.dim() >= 2
        and x.numel() > 0
        and (bias is None or bias.dtype == x.dtype)
        and not torch.is_autocast_enabled("cpu")
        and not (
            torch.is_grad_enabled()
            and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
        )
    ):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


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


def _check(q: Tensor, k: Tensor, v: Tensor, backend: str, blocked: Tensor | None, bias: Tensor | None) -> None:
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

    ``is_causal`` here means top-left aligned (query i sees keys j <= i). Alone it goes to the kernel
    as a flag; beside another mask it is folded into ``blocked`` (the kernel ignores the flag then).
    """
    gqa = q.shape[1] != k.shape[1]
    if is_causal and (blocked is not None or bias is not None):
        c = masks.causal(torch.arange(q.shape[-2], device=q.device), torch.arange(k.shape[-2], device=q.device))
        blocked, is_causal = (c if blocked is None else blocked | c), False
    mask = masks.to_sdpa(blocked, bias, q.dtype)
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=gqa,
    )
    dead = masks.dead_rows(blocked, bias)
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return out


# Scores held at once by the need-weights path: 2**21 elements is 8 MB in float32 — small enough to stay
# in the cache and in the allocator's reused heap (glibc maps blocks over 32 MB afresh, page by page).
_WEIGHTS_CHUNK = 1 << 21


def _rank4(m: Tensor | None) -> Tensor | None:
    return None if m is None else m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))  # (B|1, H|1, L|1, S|1)


def _part(m: Tensor | None, b: slice, h: slice, r: slice) -> Tensor | None:
    """The ``[b, h, r]`` block of a rank-4 mask broadcastable to ``(B, H, L, S)``; size-1 axes stay."""
    if m is None:
        return None
    return m[
        b if m.shape[0] > 1 else slice(None),
        h if m.shape[1] > 1 else slice(None),
        r if m.shape[2] > 1 else slice(None),
    ]


def attention_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    average_heads: bool = False,
) -> tuple[Tensor, Tensor]:
    """The fast path that returns weights: :func:`attention_math`'s maths, a block of scores at a time.

    Loops over batch items, groups of heads and (for long sequences) query rows so that at most
    ``_WEIGHTS_CHUNK`` scores exist at once besides the returned weights; uses the fused ``torch.softmax``
    and in-place scaling/masking. With ``average_heads`` the ``(B, H, L, S)`` weights are never formed.
    Tested to agree with :func:`attention_math` (``tests/core/test_fast_paths.py``).

    Args:
        q: ``(B, H, L, Dh)``; k, v: ``(B, Hkv, S, Dh)``; blocked, bias, is_causal, scale, dropout_p: as
            :func:`scaled_dot_product_attention` (``is_causal`` top-left aligned).
        average_heads: return weights averaged over heads ``(B, L, S)`` instead of ``(B, H, L, S)``.
    Returns:
        ``(out (B, H, L, Dh), weights (B, H, L, S) or (B, L, S))``; ``out`` is laid out as
        ``(B, L, H, Dh)`` in memory, so merging heads is a view.
    """
    B, H, L, _ = q.shape
    S, Dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = repeat_kv(k, H).transpose(-2, -1)  # (B, H, Dh, S)
    v = repeat_kv(v, H)  # (B, H, S, Dv)
    q = q * scale  # scaling q (L·Dh products) is cheaper than scaling the scores (L·S)
    blocked, bias = _rank4(blocked), _rank4(bias)
    per_head = max(1, _WEIGHTS_CHUNK // max(1, L * S))
    groups = -(-H // min(H, per_head))
    hc = -(-H // groups)  # heads per block, balanced
    rc = L if hc > 1 else max(1, min(L, _WEIGHTS_CHUNK // max(1, S)))  # query rows per block
    out = q.new_empty(B, L, H, Dv)  # (B, L, H, Dv): heads merge with a view
    weights = q.new_empty((B, L, S) if average_heads else (B, H, L, S))
    key_slots = torch.arange(S, device=q.device)
    for b0 in range(B):
        bs = slice(b0, b0 + 1)
        for r0 in range(0, L, rc):
            rs = slice(r0, min(L, r0 + rc))
            mean = None
            for h0 in range(0, H, hc):
                hs = slice(h0, min(H, h0 + hc))
                s = q[b0, hs, rs] @ k[b0, hs]  # (h, r, S)
                part_bias = _part(bias, bs, hs, rs)
                if part_bias is not None:
                    s += part_bias[0]
                part = _part(blocked, bs, hs, rs)
                part = None if part is None else part[0]
                if is_causal:
                    c = masks.causal(torch.arange(rs.start, rs.stop, device=q.device), key_slots)  # (r, S)
                    part = c if part is None else part | c
                dead = masks.dead_rows(part, part_bias[0] if part_bias is not None else None)
                if part is not None:
                    s.masked_fill_(part, float("-inf"))
                if dead is not None:  # a row with no key left: zeros, and no NaN in the gradient
                    s.masked_fill_(dead, 0.0)
                w = torch.softmax(s, dim=-1)  # (h, r, S)
                if dead is not None:
                    w = w.masked_fill(dead, 0.0)
                if dropout_p > 0.0:
                    w = F.dropout(w, p=dropout_p)
                out[b0, rs, hs] = (w @ v[b0, hs]).transpose(0, 1)  # (r, h, Dv)
                if average_heads:
                    mean = w.sum(0) if mean is None else mean + w.sum(0)  # (r, S)
                else:
                    weights[b0, hs, rs] = w
            if average_heads:
                weights[b0, rs] = mean / H
    return out.transpose(1, 2), weights  # (B, H, L, Dv), weights


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
        need_weights: return the weights ``(B, H, L, S)``: with ``backend="math"`` from the readable path,
            otherwise from :func:`attention_weights` (the same maths in blocks, tested to agree).
        backend: ``"math"`` (readable softmax), ``"sdpa"`` (``F.scaled_dot_product_attention``) or
            ``"auto"`` (sdpa unless weights are needed).
    Returns:
        ``(out (B, H, L, Dh), weights (B, H, L, S) or None)``.
    """
    _check(q, k, v, backend, blocked, bias)
    if need_weights and backend != "math":
        return attention_weights(
            q, k, v, blocked=blocked, bias=bias, is_causal=is_causal, scale=scale, dropout_p=dropout_p
        )
    if backend == "math":
        if is_causal:
            L, S = q.shape[-2], k.shape[-2]
            c = masks.causal(torch.arange(L, device=q.device), torch.arange(S, device=q.device))
            blocked = c if blocked is None else blocked | c
        out, w = attention_math(q, k, v, blocked=blocked, bias=bias, scale=scale, dropout_p=dropout_p)
        return out, (w if need_weights else None)
    return attention_sdpa(
        q, k, v, blocked=blocked, bias=bias, is_causal=is_causal, scale=scale, dropout_p=dropout_p
    ), None
