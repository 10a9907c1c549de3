"""Scaled dot-product and multi-head attention in NumPy: the answer key.

Shape legend: B batch, L query length, S key length, D model width, H heads, Hkv key/value heads,
Dh head width. Leading batch dimensions are optional everywhere (``...``).

Mask convention (as ``torch.nn.MultiheadAttention``): a boolean mask is True where a query **may not**
attend; a float mask is added to the scores (``-inf`` blocks). A query row with every key blocked gets
all-zero weights and a zero output — never NaN.

Weights follow the ``x @ w`` convention of the second article: ``wq`` has shape ``(D, H·Dh)``, i.e. the
transpose of a ``torch.nn.Linear`` weight.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from headwise import checks
from headwise.reference._masks import split_mask as _split_mask
from headwise.reference.positional import alibi_bias, apply_rope, causal_mask, window_mask

QK_NORMS = (None, "head", "full")


def softmax(x, axis=-1, mask=None, sink=None):
    """Numerically stable softmax (max-subtracted).

    Args:
        x: scores, any shape.
        axis: axis to normalise over.
        mask: optional bool array broadcastable to ``x``; True entries are excluded and get weight 0.
        sink: optional logits broadcastable to ``x`` with ``axis`` of size 1: one extra entry per row that
            joins the denominator and gets no output of its own (GPT-OSS's ``s_aux``; Xiao et al. 2023's
            attention sink made a learned logit): ``w_j = exp(x_j) / (exp(sink) + Σ_k exp(x_k))``.
    Returns:
        Array of ``x``'s shape; every row sums to 1 (less the sink's share), or is all 0 when every entry
        of it is masked (or is ``-inf``).
    """
    x = np.asarray(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    if mask is not None:
        x = np.where(np.asarray(mask, dtype=bool), -np.inf, x)
    m = np.max(x, axis=axis, keepdims=True)
    if sink is not None:
        sink = np.asarray(sink, dtype=x.dtype)
        m = np.maximum(m, sink)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    dead = s == 0  # every key blocked: zeros, whatever the sink
    if sink is not None:
        s = s + np.exp(sink - m)
    return e / np.where(dead, 1.0, s)


def scaled_dot_product_attention(
    q,
    k,
    v,
    mask=None,
    scale=None,
    *,
    is_causal=False,
    window=None,
    softcap=None,
    sinks=None,
    block_size=None,
):
    """softmax(q kᵀ · scale + mask) v, Vaswani et al. 2017 eq. (1), with the modern kinds.

    In order: ``s = q kᵀ · scale``; with ``softcap`` ``s = c · tanh(s / c)`` (Gemma 2); ``+`` the float
    mask; the boolean mask, ``is_causal`` and ``window`` block entries; the softmax over keys, with the
    ``sinks`` logit in its denominator (GPT-OSS).

    Args:
        q: ``(..., H, L, Dh)``; k: ``(..., H, S, Dh)``; v: ``(..., H, S, Dv)`` (leading axes optional
            unless ``sinks`` is given).
        mask: bool (True = may not attend) or float (added), broadcastable to ``(..., L, S)``.
        scale: defaults to ``1 / sqrt(Dh)``.
        is_causal: block key slot ``j > i`` (top-left aligned: slot = index).
        window: W ≥ 1: also block key slot ``j ≤ i − W`` (Hugging Face ``sliding_window``).
        softcap: c > 0: cap the scores at ``±c`` smoothly (``attn_logit_softcapping``).
        sinks: ``(H,)`` one logit per head joining each row's denominator (``s_aux``).
        block_size: if given, visit the keys this many at a time with the online-softmax recurrence of
            FlashAttention (:func:`headwise.reference.blocked.blocked_attention`): memory ``O(L · block_size)``,
            no weights formed (plain masks only).
    Returns:
        ``(out (..., L, Dv), weights (..., L, S))``; weights are None in the blocked mode. A row with every
        key blocked has zero weights and a zero output.
    Raises:
        ValueError: ``window`` or ``softcap`` not positive, ``sinks`` not ``(H,)``, or a kind combined with
            ``block_size``.
    """
    if block_size is not None:
        if is_causal or window is not None or softcap is not None or sinks is not None:
            raise ValueError("block_size: the blocked mode takes plain masks only (no causal, window, softcap, sinks)")
        from headwise.reference.blocked import blocked_attention

        return blocked_attention(q, k, v, mask, scale, block_size=block_size), None
    q, k, v = (np.asarray(a) for a in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., L, S)
    if softcap is not None:
        c = checks.positive_number("softcap", softcap)
        scores = c * np.tanh(scores / c)
    blocked, bias = _split_mask(mask)
    if bias is not None:
        scores = scores + bias
    L, S = scores.shape[-2:]
    if is_causal or window is not None:
        i, j = np.arange(L), np.arange(S)
        slots = causal_mask(i, j, window) if is_causal else window_mask(i, j, window)
        blocked = slots if blocked is None else (blocked | slots)
    sink = None
    if sinks is not None:
        sinks = np.asarray(sinks)
        heads = scores.shape[-3] if scores.ndim >= 3 else None
        if sinks.ndim != 1 or sinks.shape[0] != heads:
            raise ValueError(f"sinks: expected shape (H,)=({heads},), one logit per query head, got {sinks.shape}")
        sink = sinks[:, None, None]  # (H, 1, 1)
    weights = softmax(scores, axis=-1, mask=blocked, sink=sink)
    return weights @ v, weights


def rms_norm(x, weight=None, eps: float = 1e-6):
    """RMSNorm over the last axis (Zhang & Sennrich 2019): ``x / sqrt(mean(x²) + eps) · weight``."""
    x = np.asarray(x)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * np.asarray(weight)


def split_heads(x, num_heads):
    """``(..., L, H·Dh) -> (..., H, L, Dh)``."""
    x = np.asarray(x)
    *lead, L, F = x.shape
    if F % num_heads:
        raise ValueError(f"num_heads: {num_heads} does not divide the feature width {F}")
    x = x.reshape(*lead, L, num_heads, F // num_heads)  # (..., L, H, Dh)
    return np.swapaxes(x, -2, -3)  # (..., H, L, Dh)


def merge_heads(x):
    """``(..., H, L, Dh) -> (..., L, H·Dh)``: the concatenation of the heads."""
    x = np.swapaxes(np.asarray(x), -2, -3)  # (..., L, H, Dh)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def multi_head_attention(
    x,
    params: Mapping[str, np.ndarray],
    num_heads: int,
    *,
    context=None,
    mask=None,
    num_kv_heads: int | None = None,
    causal: bool = False,
    positions=None,
    key_positions=None,
    rope: Mapping | None = None,
    alibi: bool = False,
    scale=None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    qk_norm: str | None = None,
    norm_eps: float = 1e-6,
):
    """Multi-head attention, Vaswani et al. 2017 §3.2.2, with the modern variants.

    Args:
        x: queries' input ``(L, D)`` or ``(B, L, D)``.
        params: ``wq (D, H·Dh)``, ``wk (Dk, Hkv·Dh)``, ``wv (Dv, Hkv·Dh)``, ``wo (H·Dh, D)`` and optional
            biases ``bq, bk, bv, bo`` (``x @ w + b`` convention); ``sinks (H,)`` for learned attention sinks
            (GPT-OSS); ``q_norm``, ``k_norm`` for ``qk_norm`` (``(Dh,)`` per head, ``(H·Dh,)`` / ``(Hkv·Dh,)``
            full width).
        num_heads: H.
        context: keys' and values' input ``(S, Dk)`` / ``(B, S, Dk)``; defaults to ``x``.
        mask: bool (True = may not attend) or float (added), broadcastable to ``(B, H, L, S)``.
        num_kv_heads: Hkv for grouped-query attention (1 = multi-query); defaults to H. Key/value head
            ``g`` serves query heads ``g·H/Hkv … (g+1)·H/Hkv − 1``.
        causal: block keys whose position is after the query's.
        positions / key_positions: integer positions of queries ``(L,)`` and keys ``(S,)``
            (default ``0…L−1`` / ``0…S−1``); used by causal, the window, RoPE and ALiBi.
        rope: ``{"base": 10000.0, "convention": "half" | "interleaved", "scaling": {...}}`` to rotate q and k
            (``scaling`` as :func:`headwise.reference.rope_frequencies`, YaRN included).
        alibi: add the ALiBi bias ``−m_h·|i − j|`` (Press et al. 2022).
        sliding_window: W: block keys at positions ``≤ i − W`` (see :func:`window_mask`).
        softcap: c: scores ``c · tanh(s / c)`` before masks and biases (Gemma 2).
        qk_norm: ``"head"`` — RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3); ``"full"`` — over
            the whole q and k projections before the split into heads (OLMo 2); None.
        norm_eps: the RMSNorm epsilon.
    Returns:
        ``(out, weights)``: ``out`` like ``x``; ``weights (H, L, S)`` or ``(B, H, L, S)``.
    """
    p = params
    x = np.asarray(x)
    ctx = x if context is None else np.asarray(context)
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    checks.one_of("qk_norm", qk_norm, QK_NORMS)
    q = x @ p["wq"] + p.get("bq", 0.0)  # (..., L, H·Dh)
    k = ctx @ p["wk"] + p.get("bk", 0.0)  # (..., S, Hkv·Dh)
    v = ctx @ p["wv"] + p.get("bv", 0.0)
    if qk_norm == "full":
        q, k = rms_norm(q, p["q_norm"], norm_eps), rms_norm(k, p["k_norm"], norm_eps)
    q = split_heads(q, num_heads)  # (..., H, L, Dh)
    k = split_heads(k, num_kv_heads)  # (..., Hkv, S, Dh)
    v = split_heads(v, num_kv_heads)
    if qk_norm == "head":
        q, k = rms_norm(q, p["q_norm"], norm_eps), rms_norm(k, p["k_norm"], norm_eps)
    L, S = q.shape[-2], k.shape[-2]
    q_pos = np.arange(L) if positions is None else np.asarray(positions)
    if key_positions is not None:
        k_pos = np.asarray(key_positions)
    else:
        k_pos = q_pos if context is None else np.arange(S)
    if rope is not None:
        q = apply_rope(q, q_pos, **rope)
        k = apply_rope(k, k_pos, **rope)
    group = num_heads // num_kv_heads
    k = np.repeat(k, group, axis=-3)  # (..., H, S, Dh)
    v = np.repeat(v, group, axis=-3)
    blocked, bias = _split_mask(mask)
    if causal:
        c = causal_mask(q_pos, k_pos)
        blocked = c if blocked is None else (blocked | c)
    if sliding_window is not None:
        w = window_mask(q_pos, k_pos, sliding_window)
        blocked = w if blocked is None else (blocked | w)
    if alibi:
        a = alibi_bias(num_heads, q_pos, k_pos)  # (H, L, S)
        bias = a if bias is None else bias + a
    if blocked is not None and bias is not None:
        total = np.where(blocked, -np.inf, bias)
    else:
        total = blocked if blocked is not None else bias
    out, weights = scaled_dot_product_attention(q, k, v, mask=total, scale=scale, softcap=softcap, sinks=p.get("sinks"))
    out = merge_heads(out) @ p["wo"] + p.get("bo", 0.0)  # (..., L, D)
    return out, weights
