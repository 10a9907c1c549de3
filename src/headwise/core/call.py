"""``AttentionCall``: one record for everything an attention call needs besides ``q``, ``k`` and ``v``.

Shape legend: B batch, L query length, S key length (cached keys included), H query heads, Hkv key/value
heads, Dh query/key head width, Dv value head width.

The same keywords used to travel through every layer of the core — the dispatcher, the blocked weights path,
the rows a ``hook_qk`` reader forms, the latent module and the Hugging Face backend. They are one frozen record
now (torchtune passes parts, not flags): a module builds it once per forward, a cache places it on its slots
(:meth:`headwise.core.cache.CacheRead.place`), and :func:`headwise.core.dispatch.attend` reads it and picks the
path once. :func:`headwise.core.dispatch.scaled_dot_product_attention` keeps the flat keyword signature for
users and builds the record.

Masks follow :mod:`headwise.core.masks`: ``blocked`` bool True = may not attend, ``bias`` float added to the
scores, both broadcastable to ``(B, H, L, S)``; causality is placed by :func:`headwise.core.masks.causality`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from headwise import checks
from headwise.core import masks

__all__ = ["BACKENDS", "AttentionCall"]

BACKENDS = ("auto", "math", "sdpa")


@dataclass(frozen=True, slots=True)
class AttentionCall:
    """What to compute, besides ``q (B, H, L, Dh)``, ``k (B, Hkv, S, Dh)``, ``v (B, Hkv, S, Dv)``.

    Attributes:
        blocked: bool, True = may not attend, broadcastable to ``(B, H, L, S)``, or None.
        bias: float added to the scores (a float mask, ALiBi), broadcastable to ``(B, H, L, S)``, or None.
        is_causal: query slot ``q_offset + i`` attends key slots ``j ≤ q_offset + i`` (top-left aligned from
            ``q_offset``, as ``F.scaled_dot_product_attention`` at 0).
        q_offset: the queries sit at key slots ``q_offset … q_offset + L − 1`` (``S − L`` after a cache).
        window: sliding window W (needs ``is_causal``): keys ``j ≤ i − W`` are blocked too (Mistral, Gemma 2).
        key_slots: ``(S,)`` the keys' own slots when they are not ``0 … S − 1`` (a ring cache), or None.
        sink_tokens: StreamingLLM's first slots that stay visible past the window.
        scale: score scale (None: ``1 / sqrt(Dh)``).
        softcap: ``c``: scores ``c · tanh(s / c)`` before bias and masks (Gemma 2), or None.
        sinks: ``(H,)`` learned sink logits joining each row's softmax denominator (GPT-OSS ``s_aux``), or None.
        dropout_p: dropout on the weights (0 in eval).
        need_weights: also return the weights; average_heads: averaged over heads, ``(B, L, S)``.
        backend: ``"auto"``, ``"math"`` (the readable path end to end) or ``"sdpa"`` (the same as ``"auto"``).
    """

    blocked: Tensor | None = None
    bias: Tensor | None = None
    is_causal: bool = False
    q_offset: int = 0
    window: int | None = None
    key_slots: Tensor | None = None
    sink_tokens: int = 0
    scale: float | None = None
    softcap: float | None = None
    sinks: Tensor | None = None
    dropout_p: float = 0.0
    need_weights: bool = False
    average_heads: bool = False
    backend: str = "auto"

    def replace(self, **changes) -> AttentionCall:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def causality(self, L: int, S: int, *, as_flag: bool = False, device=None) -> tuple[bool, Tensor | None]:
        """``(flag, blocked (L, S) or None)``: this call's causality for ``L`` queries over ``S`` keys, placed by
        :func:`headwise.core.masks.causality` (the one rule)."""
        return masks.causality(
            self.is_causal, L, S, q_offset=self.q_offset, window=self.window, key_slots=self.key_slots,
            sink_tokens=self.sink_tokens, as_flag=as_flag, device=device,
        )  # fmt: skip

    def blocked_with_causality(self, L: int, S: int, device=None) -> Tensor | None:
        """``blocked`` joined with this call's causality (:meth:`causality` as a mask)."""
        return masks.either(self.blocked, self.causality(L, S, device=device)[1])

    def check(self, q: Tensor, k: Tensor, v: Tensor) -> None:
        """Raise ValueError / TypeError naming the argument unless ``q, k, v`` and this call fit together."""
        checks.one_of("backend", self.backend, BACKENDS)
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
        blocked, bias, sinks = self.blocked, self.bias, self.sinks
        if blocked is not None and (not isinstance(blocked, Tensor) or blocked.dtype != torch.bool):
            raise TypeError(
                f"blocked: expected a bool tensor (True = may not attend), got {getattr(blocked, 'dtype', blocked)!r}"
            )
        if bias is not None and (not isinstance(bias, Tensor) or not bias.is_floating_point()):
            raise TypeError(f"bias: expected a floating-point tensor, got {getattr(bias, 'dtype', bias)!r}")
        if self.window is not None:
            checks.positive_int("window", self.window)
            if not self.is_causal:
                raise ValueError(f"window: a sliding window needs is_causal=True, got window={self.window} without it")
        if self.softcap is not None:
            checks.positive_number("softcap", self.softcap)
        if sinks is not None and (
            not isinstance(sinks, Tensor) or not sinks.is_floating_point() or tuple(sinks.shape) != (q.shape[1],)
        ):
            raise ValueError(
                f"sinks: expected a float tensor of shape (H,)=({q.shape[1]},), one logit per query head, "
                f"got {getattr(sinks, 'shape', sinks)!r}"
            )
