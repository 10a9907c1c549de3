"""The blocked weights path: :func:`headwise.core.functional.attention_math`'s maths, a block of scores at a time.

What ``F.scaled_dot_product_attention`` cannot do — return the weights, soft-cap the scores, add sinks to the
denominator — without forming ``(B, H, L, S)`` scores at once. Tested to agree with the readable path
(``tests/core/test_fast_paths.py``).

Shape legend: B batch, L query length, S key length, H query heads, Hkv key/value heads, Dh head width,
Dv value head width; h heads and r query rows of one block.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from headwise.core import masks
from headwise.core.call import AttentionCall
from headwise.core.primitives import repeat_kv, soft_cap, softmax_

# Scores held at once by :func:`attention_weights`: 2**21 elements is 8 MB in float32 — small enough to
# stay in the cache and in the allocator's reused heap (glibc maps blocks over 32 MB afresh, page by page).
WEIGHTS_CHUNK = 1 << 21


def rank4(m: Tensor | None) -> Tensor | None:
    """A mask or bias broadcastable to ``(B, H, L, S)`` as a rank-4 view ``(B|1, H|1, L|1, S|1)``."""
    return None if m is None else m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))  # (B|1, H|1, L|1, S|1)


def _part(m: Tensor | None, b: int, h: slice, r: slice) -> Tensor | None:
    """The ``[b, h, r]`` block ``(h|1, r|1, S|1)`` of a rank-4 mask broadcastable to ``(B, H, L, S)``."""
    if m is None:
        return None
    return m[
        b if m.shape[0] > 1 else 0,
        h if m.shape[1] > 1 else slice(None),
        r if m.shape[2] > 1 else slice(None),
    ]


def attention_weights(q: Tensor, k: Tensor, v: Tensor, call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    """:func:`headwise.core.functional.attention_math`'s maths, a block of scores at a time.

    Loops over batch items, groups of heads and (for long sequences) query rows so that at most
    ``WEIGHTS_CHUNK`` scores exist at once besides the returned weights; causality and the window are
    built per block (nothing ``L × S`` beyond the weights asked for). Memory: the output, the weights if
    asked (``(B, H, L, S)``, or ``(B, L, S)`` with ``average_heads``), and one block of scores.

    Args:
        q: ``(B, H, L, Dh)``; k: ``(B, Hkv, S, Dh)``; v: ``(B, Hkv, S, Dv)``.
        call: the masks, causality, scale, soft-cap, sinks and dropout; ``call.need_weights`` returns the
            weights (False: only the output — for soft-capping or sinks), ``call.average_heads`` averaged over
            heads ``(B, L, S)``.
    Returns:
        ``(out (B, H, L, Dv), weights or None)``; ``out`` is laid out as ``(B, L, H, Dv)`` in memory, so
        merging heads is a view.
    """
    B, H, L, _ = q.shape
    S, Dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if call.scale is None else call.scale
    k = repeat_kv(k, H).transpose(-2, -1)  # (B, H, Dh, S)
    v = repeat_kv(v, H)  # (B, H, S, Dv)
    q = q * scale  # scaling q (L·Dh products) is cheaper than scaling the scores (L·S)
    blocked, bias, sinks = rank4(call.blocked), rank4(call.bias), call.sinks
    per_head = max(1, WEIGHTS_CHUNK // max(1, L * S))
    groups = -(-H // min(H, per_head))
    hc = -(-H // groups)  # heads per block, balanced
    rc = L if hc > 1 else max(1, min(L, WEIGHTS_CHUNK // max(1, S)))  # query rows per block
    out = q.new_empty(B, L, H, Dv)  # (B, L, H, Dv): heads merge with a view
    weights = None
    if call.need_weights:
        weights = q.new_empty((B, L, S) if call.average_heads else (B, H, L, S))
    for b in range(B):
        for r0 in range(0, L, rc):
            rs = slice(r0, min(L, r0 + rc))
            mean = None
            _, causal = call.replace(q_offset=call.q_offset + r0).causality(rs.stop - r0, S, device=q.device)
            for h0 in range(0, H, hc):
                hs = slice(h0, min(H, h0 + hc))
                s = soft_cap(q[b, hs, rs] @ k[b, hs], call.softcap)  # (h, r, S)
                part_bias = _part(bias, b, hs, rs)
                if part_bias is not None:
                    s += part_bias
                part = masks.either(_part(blocked, b, hs, rs), causal)  # (h|1, r, S): with these rows' causality
                w = softmax_(s, part, None if sinks is None else sinks[hs], dead=masks.dead_rows(part, part_bias))
                if call.dropout_p > 0.0:
                    w = F.dropout(w, p=call.dropout_p)
                out[b, rs, hs] = (w @ v[b, hs]).transpose(0, 1)  # (r, h, Dv)
                if weights is None:
                    continue
                if call.average_heads:
                    mean = w.sum(0) if mean is None else mean + w.sum(0)  # (r, S)
                else:
                    weights[b, hs, rs] = w
            if weights is not None and call.average_heads:
                weights[b, rs] = mean / H
    return out.transpose(1, 2), weights  # (B, H, L, Dv), weights
