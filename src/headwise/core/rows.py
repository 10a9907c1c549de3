"""``AttentionRows``: what the ``hook_qk`` point hands a hook — every head's attention, one block of query rows at
a time, formed exactly as the model forms it, never ``(B, H, L, S)`` at once.

Shape legend: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), L query length, S key length,
Dh head width, R rows of one block.

A module's hooked step (:func:`headwise.core.hooks.attend_hooked`) calls ``hook_qk(AttentionRows(q, k, call))`` with
the post-rotary q and k and the :class:`~headwise.core.call.AttentionCall` it is about to attend with, only while a
hook is registered there; the hook asks for the rows it wants
(:meth:`AttentionRows.weights`) and reduces them (streaming head statistics, :mod:`headwise.analysis.streaming`).
The rows are the readable path's maths (:func:`headwise.core.functional.attention_math`): scores
``q kᵀ · scale``, soft-capping, the bias, the user's ``blocked`` mask, causality with the window, the cache's key
slots and StreamingLLM's sink tokens (:func:`headwise.core.masks.causality`, the one rule), and the softmax
with learned sinks (:mod:`headwise.core.primitives`, shared with every path). Grouped-query heads are formed per
query head (key/value head g serves query heads ``g·G … (g+1)·G − 1``) without repeating the keys.

Memory of one call of :meth:`weights` for R rows: the scores and the weights, ``2 · B · H' · R · S'`` elements
of q's dtype (H' the heads asked for, S' the keys a causal block can see: at most ``q_offset + stop``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from headwise.core import masks
from headwise.core.call import AttentionCall
from headwise.core.primitives import soft_cap, softmax, softmax_

__all__ = ["AttentionRows"]


def _rows_of(m: Tensor | None, start: int, stop: int, keys: int) -> Tensor | None:
    """Rows ``start:stop`` and keys ``:keys`` of a mask broadcastable to ``(B, H, L, S)`` (rank 4 or less)."""
    if m is None:
        return None
    if m.dim() >= 2 and m.shape[-2] != 1:
        m = m[..., start:stop, :]
    return m[..., :keys] if m.shape[-1] != 1 else m


@dataclass(frozen=True)
class AttentionRows:
    """A forward pass's post-rotary queries and keys with the call they are attended with.

    Attributes:
        q: ``(B, H, L, Dh)``; k: ``(B, Hkv, S, Dh)`` (cached keys included, in stream order).
        call: the :class:`~headwise.core.call.AttentionCall` — its masks, causality, scale, soft-cap and sinks,
            also read as attributes of the rows:
        blocked: bool, True = may not attend, broadcastable to ``(B, H, L, S)``, or None.
        bias: float added to the scores (a float mask, ALiBi), broadcastable to ``(B, H, L, S)``, or None.
        is_causal, q_offset, window, key_slots, sink_tokens: causality as :func:`headwise.core.masks.causality`
            places it (top-left from ``q_offset``; a ring cache's slots).
        scale: score scale (None: ``1 / sqrt(Dh)``); softcap: ``c · tanh(s / c)``; sinks: ``(H,)`` sink logits.
    """

    q: Tensor
    k: Tensor
    call: AttentionCall = AttentionCall()

    blocked = property(lambda self: self.call.blocked)
    bias = property(lambda self: self.call.bias)
    is_causal = property(lambda self: self.call.is_causal)
    q_offset = property(lambda self: self.call.q_offset)
    window = property(lambda self: self.call.window)
    key_slots = property(lambda self: self.call.key_slots)
    sink_tokens = property(lambda self: self.call.sink_tokens)
    scale = property(lambda self: self.call.scale)
    softcap = property(lambda self: self.call.softcap)
    sinks = property(lambda self: self.call.sinks)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(B, H, L, S)``: the full map these rows make up."""
        B, H, L, _ = self.q.shape
        return B, H, L, self.k.shape[-2]

    def visible_keys(self, stop: int) -> int:
        """How many leading keys rows ``… stop − 1`` can see: all S, or ``q_offset + stop`` for a causal call
        over keys in slot order (later keys are blocked for every row of the block)."""
        S = self.k.shape[-2]
        if self.is_causal and self.key_slots is None:
            return max(0, min(S, self.q_offset + stop))
        return S

    def weights(self, start: int, stop: int, heads: Tensor | None = None, *, keys: int | None = None) -> Tensor:
        """The attention weights of query rows ``start … stop − 1``: ``(B, H', R, S')`` float32 or q's dtype.

        Args:
            start, stop: the query rows, ``0 ≤ start < stop ≤ L``.
            heads: query-head indices ``(H',)`` (None: every head).
            keys: S', the leading keys returned (default :meth:`visible_keys`; the rest are exactly 0).
        Returns:
            the weights, each row as the model's softmax forms it (rows fully blocked are zeros).
        """
        B, H, L, S = self.shape
        if not 0 <= start < stop <= L:
            raise ValueError(f"start, stop: expected 0 ≤ start < stop ≤ {L}, got {start}, {stop}")
        Sv = self.visible_keys(stop) if keys is None else keys
        hkv = self.k.shape[1]
        G = H // hkv
        scale = 1.0 / math.sqrt(self.q.shape[-1]) if self.scale is None else self.scale
        q = self.q[:, :, start:stop] * scale  # (B, H, R, Dh): the scale on q, not on R · S' scores
        k = self.k[:, :, :Sv].to(q.dtype)  # (B, Hkv, S', Dh)
        R, dh = stop - start, q.shape[-1]
        # a key/value head's G query heads stacked as G · R rows: one product per KV head, no broadcast copy of k
        scores = q.reshape(B, hkv, G * R, dh) @ k.transpose(-2, -1)  # (B, Hkv, G·R, S')
        scores = scores.reshape(B, H, R, Sv)  # (B, H, R, S')
        sinks = self.sinks
        bias = _rows_of(self.bias, start, stop, Sv)
        blocked = _rows_of(self.blocked, start, stop, Sv)
        if heads is not None:
            scores = scores[:, heads]
            sinks = None if sinks is None else sinks[heads]
            bias = None if bias is None or bias.dim() < 3 or bias.shape[-3] == 1 else bias[..., heads, :, :]
            if blocked is not None and blocked.dim() >= 3 and blocked.shape[-3] != 1:
                blocked = blocked[..., heads, :, :]
        scores = soft_cap(scores, self.softcap)
        if bias is not None:
            scores = scores + bias
        _, causal = self.call.replace(q_offset=self.q_offset + start).causality(R, S, device=q.device)  # (R, S)
        if causal is not None:
            causal = causal[:, :Sv]
        if sinks is not None or torch.is_grad_enabled() and scores.requires_grad:
            return softmax(scores, masks.either(blocked, causal), sinks)  # (B, H', R, S')
        if causal is not None and blocked is None and self.window is None and self.key_slots is None:
            # plain causality blocks only keys after the block's first row: fill those columns alone
            c0 = min(Sv, self.q_offset + start + 1)
            scores[..., c0:].masked_fill_(causal[:, c0:], float("-inf"))
            return softmax_(scores, dead=None if bias is None else masks.dead_rows(causal, bias))
        blocked = masks.either(blocked, causal)
        return softmax_(scores, blocked, dead=masks.dead_rows(blocked, bias))
