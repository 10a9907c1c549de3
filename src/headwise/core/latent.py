"""``LatentAttention``: multi-head latent attention (MLA), DeepSeek-V2 §2.1 (arXiv:2405.04434) and DeepSeek-V3.

Shape legend: B batch, L query length, S key length (cached ones included), D model width, H heads,
Rq query latent rank (``q_lora_rank``), R key/value latent rank (``kv_lora_rank``), Dn per-head query/key width
without position (``qk_nope_head_dim``), Dr rotary width shared by the heads (``qk_rope_head_dim``), Dv value
head width (``v_head_dim``).

Queries and keys/values go through low-rank latents; a rotary key of width Dr is shared by all heads::

    q = Wq_b(rms(Wq_a x))  (or Wq x)                (B, H, L, Dn+Dr) = [q_nope, q_pe], q_pe rotated
    c, k_pe = Wkv_a x                                c = rms(.) (B, S, R): the latent; k_pe (B, 1, S, Dr) rotated
    k_nope, v = Wkv_b c                              (B, H, S, Dn), (B, H, S, Dv)
    out = Wo · merge(softmax([q_nope, q_pe] [k_nope, k_pe]ᵀ · scale) v)

Two paths compute it (tested equal, ``tests/core/test_latent.py``):

- **plain** (``absorbed=False``): keys and values are expanded from the latent for every key, then
  :func:`headwise.core.dispatch.attend` runs over ``(B, H, S, Dn+Dr)`` keys and
  ``(B, H, S, Dv)`` values — Hugging Face ``DeepseekV3Attention``'s way.
- **absorbed** (``absorbed=True``, the default with a cache): ``W_UK`` (the key rows of ``Wkv_b``) is multiplied
  into the query and ``W_UV`` (its value rows) into the output, so attention runs over the latent itself: one
  key/value head of width ``R + Dr`` (values: the latent, width R) shared by the H query heads — DeepSeek-V3
  ``inference/model.py``, ``attn_impl="absorb"``. Only ``c`` and ``k_pe`` are kept: a :class:`LatentCache`
  holds ``(R + Dr)`` numbers per position, not ``H · (Dn + Dr + Dv)``.

Memory: both paths hand the attention to the functional entry point, whose SDPA path forms no ``L × S``
weights (the math path and ``need_weights`` do, as for :class:`~headwise.core.attention.MultiHeadAttention`);
the plain path also forms the expanded keys and values ``(B, H, S, Dn+Dr+Dv)``, the absorbed one only
``(B, H, L, R)`` queries.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from headwise import checks
from headwise.core import masks
from headwise.core.attention import MultiHeadAttention
from headwise.core.cache import LatentCache
from headwise.core.call import BACKENDS, AttentionCall
from headwise.core.hooks import HookPoint, attend_hooked
from headwise.positional.base import PositionalPart


class LatentAttention(nn.Module):
    """Multi-head latent attention, with DeepSeek's weight names (``inference/model.py``).

    Args:
        d_model: D.
        num_heads: H.
        kv_lora_rank: R, the key/value latent width (at most D).
        qk_nope_head_dim: Dn. qk_rope_head_dim: Dr (even). v_head_dim: Dv.
        q_lora_rank: Rq (at most D), or None for a full-rank ``Wq`` (DeepSeek-V2-Lite).
        bias: biases on ``Wq_a``, ``Wkv_a`` and ``Wo`` (Hugging Face ``attention_bias``); the up-projections
            ``Wq_b``, ``Wkv_b`` (and a full-rank ``Wq``) never have one.
        positional: a :class:`~headwise.positional.rope.RotaryEmbedding` of width Dr rotating ``q_pe`` and
            ``k_pe`` (DeepSeek: ``convention="interleaved"``, YaRN scaling), or None.
        scale: score scale (default ``1 / sqrt(Dn + Dr)``; DeepSeek-V3 multiplies it by ``mscale²`` under YaRN).
        sliding_window: W: also block keys ``j ≤ i − W`` (no DeepSeek model uses one; here for completeness).
        norm_eps: epsilon of the latent RMSNorms (1e-6 in DeepSeek-V2/V3).
        dropout: dropout on the attention weights while training.
        backend: as :class:`~headwise.core.attention.MultiHeadAttention`.
    Raises:
        ValueError / TypeError: sizes that are not positive integers, a latent rank above ``d_model``, an odd
        rope width, a positional part whose width is not Dr, an unknown backend.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        bias: bool = False,
        positional: PositionalPart | None = None,
        scale: float | None = None,
        sliding_window: int | None = None,
        norm_eps: float = 1e-6,
        dropout: float = 0.0,
        backend: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        for name, value in (
            ("d_model", d_model),
            ("num_heads", num_heads),
            ("kv_lora_rank", kv_lora_rank),
            ("qk_nope_head_dim", qk_nope_head_dim),
            ("qk_rope_head_dim", qk_rope_head_dim),
            ("v_head_dim", v_head_dim),
        ):
            checks.positive_int(name, value)
        for name, value in (("kv_lora_rank", kv_lora_rank), ("q_lora_rank", q_lora_rank)):
            if value is not None and (checks.positive_int(name, value) > d_model):
                raise ValueError(f"{name}: expected a rank of at most d_model={d_model}, got {value}")
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim: expected an even width (RoPE rotates pairs), got {qk_rope_head_dim}")
        if sliding_window is not None:
            checks.positive_int("sliding_window", sliding_window)
        checks.one_of("backend", backend, BACKENDS)
        checks.probability("dropout", dropout)
        if scale is not None:
            checks.positive_number("scale", scale)
        if positional is not None:
            if not isinstance(positional, PositionalPart):
                raise TypeError(f"positional: expected a PositionalPart or None, got {type(positional).__name__}")
            positional.check(num_heads=num_heads, head_dim=qk_rope_head_dim)
        self.d_model, self.num_heads = d_model, num_heads
        self.q_lora_rank, self.kv_lora_rank = q_lora_rank, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.scale = 1.0 / math.sqrt(qk_nope_head_dim + qk_rope_head_dim) if scale is None else float(scale)
        self.sliding_window, self.dropout, self.backend = sliding_window, float(dropout), backend
        kw = {"device": device, "dtype": dtype}
        dq = num_heads * (qk_nope_head_dim + qk_rope_head_dim)
        if q_lora_rank is None:
            self.Wq = nn.Linear(d_model, dq, bias=False, **kw)
        else:
            self.Wq_a = nn.Linear(d_model, q_lora_rank, bias=bias, **kw)
            self.q_norm = nn.RMSNorm(q_lora_rank, eps=norm_eps, **kw)
            self.Wq_b = nn.Linear(q_lora_rank, dq, bias=False, **kw)
        self.Wkv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=bias, **kw)
        self.kv_norm = nn.RMSNorm(kv_lora_rank, eps=norm_eps, **kw)
        self.Wkv_b = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False, **kw)
        self.Wo = nn.Linear(num_heads * v_head_dim, d_model, bias=bias, **kw)
        self.positional = positional
        self.hook_heads, self.hook_pattern = HookPoint(), HookPoint()  # where gates, ablation, capture act
        self.hook_qk = HookPoint()  # the queries and keys attended (latent ones on the absorbed path), while hooked

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, q_lora_rank={self.q_lora_rank}, "
            f"kv_lora_rank={self.kv_lora_rank}, qk_nope_head_dim={self.qk_nope_head_dim}, "
            f"qk_rope_head_dim={self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}, scale={self.scale:.6g}"
        )

    def _queries(self, x: Tensor) -> Tensor:
        """``(B, L, D) -> (B, H, L, Dn+Dr)``."""
        q = self.Wq(x) if self.q_lora_rank is None else self.Wq_b(self.q_norm(self.Wq_a(x)))  # (B, L, H·(Dn+Dr))
        return q.view(x.shape[0], x.shape[1], self.num_heads, -1).transpose(1, 2)  # (B, H, L, Dn+Dr)

    def new_cache(
        self, batch_size: int, capacity: int, *, sink_tokens: int = 0, dtype=None, device=None
    ) -> LatentCache:
        """A :class:`~headwise.core.cache.LatentCache` of ``capacity`` tokens for this module (the latent
        ``(batch_size, capacity, R)`` and rope key ``(batch_size, capacity, Dr)``), in its dtype and device
        unless given.
        Raises:
            ValueError: sizes that are not positive integers; ``sink_tokens`` (a latent cache keeps every token).
        """
        if sink_tokens:
            raise ValueError(f"sink_tokens: a LatentCache keeps every token and has no sinks, got {sink_tokens}")
        w = self.Wkv_a.weight
        kw = {"dtype": dtype or w.dtype, "device": device or w.device}
        return LatentCache(batch_size, capacity, self.kv_lora_rank, self.qk_rope_head_dim, **kw)

    def up_weights(self) -> tuple[Tensor, Tensor]:
        """``(W_UK (H, Dn, R), W_UV (H, Dv, R))``: the key and value rows of ``Wkv_b``, per head."""
        w = self.Wkv_b.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim :]

    def forward(
        self,
        x: Tensor,
        *,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        average_weights: bool = True,
        position_ids: Tensor | None = None,
        cache=None,
        absorbed: bool | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention of ``x (B, L, D)`` through the latent.

        Args:
            attn_mask, key_padding_mask, is_causal, need_weights, average_weights, position_ids: as
                :meth:`MultiHeadAttention.forward` (S counts cached keys).
            cache: a :class:`~headwise.core.cache.LatentCache`: the new latents and rope keys are appended.
            absorbed: the absorbed path (default: with a cache) or the plain one.
        Returns:
            ``(out (B, L, D), weights (B, L, S) or (B, H, L, S) or None)``.
        Raises:
            ValueError / TypeError: an input of the wrong rank, width or dtype; masks or positions that do not
            fit; a cache that does not fit.
        """
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model or not x.is_floating_point():
            raise ValueError(
                f"x: expected a floating-point tensor (B, L, {self.d_model}), got {getattr(x, 'shape', type(x))!r}"
            )
        if x.shape[1] == 0:
            raise ValueError(f"x: expected at least one token, got shape {tuple(x.shape)}")
        B, L, _ = x.shape
        R, Dn = self.kv_lora_rank, self.qk_nope_head_dim
        masks.require_causal(is_causal, self.sliding_window)
        offset = 0 if cache is None else cache.length  # the new tokens' first index in the stream
        absorbed = cache is not None if absorbed is None else bool(absorbed)

        q = self._queries(x)  # (B, H, L, Dn+Dr)
        q_nope, q_pe = q[..., :Dn], q[..., Dn:]
        kv = self.Wkv_a(x)  # (B, L, R+Dr)
        c = self.kv_norm(kv[..., :R])  # (B, L, R)
        k_pe = kv[..., R:].unsqueeze(1)  # (B, 1, L, Dr): one rotary key for all heads
        q_pos = MultiHeadAttention._positions(position_ids, B, L, offset, x.device)  # (L,) or (B, L)
        # S: every key attended; the cache checks the call before anything changes
        S = L if cache is None else cache.keys_after(L, is_causal=is_causal, window=self.sliding_window)
        blocked, bias = masks.build(
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            batch=B,
            heads=self.num_heads,
            L=L,
            S=S,
            dtype=q.dtype,
        )  # fmt: skip  — checked before the cache changes
        if self.positional is not None:
            q_pe, k_pe = self.positional.rotate_qk(q_pe, k_pe, q_pos, q_pos)
        call = AttentionCall(
            blocked=blocked, bias=bias, is_causal=is_causal, q_offset=offset, window=self.sliding_window,
            scale=self.scale, dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights,
            average_heads=average_weights, backend=self.backend,
        )  # fmt: skip
        if cache is not None:
            read = cache.update(c, k_pe[:, 0], q_pos)  # the entries in stream order and where they sit
            c, k_pe = read.tensors  # (B, S, R), (B, S, Dr)
            c, k_pe = c.to(q.dtype), k_pe.to(q.dtype).unsqueeze(1)  # k_pe (B, 1, S, Dr)
            call = read.place(call)
        if absorbed:
            w_uk, w_uv = self.up_weights()  # (H, Dn, R), (H, Dv, R)
            q_lat = torch.einsum("bhld,hdr->bhlr", q_nope, w_uk)  # (B, H, L, R)
            k_all = torch.cat([c.unsqueeze(1), k_pe], dim=-1)  # (B, 1, S, R+Dr): one key head for all
            out, weights = attend_hooked(
                self, torch.cat([q_lat, q_pe], dim=-1), k_all, c.unsqueeze(1), call,
                lambda o_lat: torch.einsum("bhlr,hvr->bhlv", o_lat, w_uv),  # (B, H, L, R) -> (B, H, L, Dv)
            )  # fmt: skip
        else:
            up = self.Wkv_b(c).view(B, S, self.num_heads, -1).transpose(1, 2)  # (B, H, S, Dn+Dv)
            k_nope, v = up[..., :Dn], up[..., Dn:]
            k = torch.cat([k_nope, k_pe.expand(-1, self.num_heads, -1, -1)], dim=-1)  # (B, H, S, Dn+Dr)
            out, weights = attend_hooked(self, torch.cat([q_nope, q_pe], dim=-1), k, v, call)  # (B, H, L, Dv)
        out = self.Wo(out.transpose(1, 2).reshape(B, L, -1))  # (B, L, H·Dv) -> (B, L, D)
        return out, weights
