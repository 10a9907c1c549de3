"""Explicit caches for incremental decoding (gpt-fast style, preallocated), one per kind of attention.

- :class:`KVCache`: every key and value, ``(B, Hkv, C, Dh)``.
- :class:`SlidingWindowCache`: a ring of the last W keys and values (plus StreamingLLM's first n): its
  memory is bounded by the window, not by the context, and decoding goes on past the window.
- :class:`LatentCache`: multi-head latent attention's latent and rope key only.

``KVCache.for_module(module, ...)`` picks the right one for a module. Shape legend: B batch, Hkv key/value
heads, C capacity (slots), Dh head width, W window, R latent rank, Dr rotary width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headwise import checks


class KVCache:
    """Preallocated keys and values of one attention layer.

    Pass it as ``mha(x, cache=cache)``: the call appends the new (already rotated) keys and values at
    slots ``length … length + n − 1`` and attends over all ``length + n`` of them. Query positions default
    to the slots, so decoding token by token equals the full causal forward.

    Args:
        batch_size: B.
        capacity: C, the most tokens it holds; appending beyond it raises ValueError.
        num_kv_heads: Hkv (the module's ``num_kv_heads``; per rank under tensor parallelism).
        head_dim: Dh.
        dtype, device: of the buffers ``k, v (B, Hkv, C, Dh)``.
    Attributes:
        k, v: the buffers; ``positions (B, C)`` the token position of every filled slot; ``length`` the
        number of filled slots.
    """

    def __init__(
        self,
        batch_size: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        for name, value in (
            ("batch_size", batch_size),
            ("capacity", capacity),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            checks.positive_int(name, value)
        shape = (batch_size, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.positions = torch.zeros(batch_size, capacity, dtype=torch.long, device=device)
        self.capacity = capacity
        self.length = 0

    @classmethod
    def for_module(
        cls, module, batch_size: int, capacity: int, *, sink_tokens: int = 0, dtype=None, device=None
    ) -> KVCache | SlidingWindowCache | LatentCache:
        """A cache sized for ``module``, in its dtype and device.

        A :class:`headwise.MultiHeadAttention` gets a :class:`KVCache` of ``capacity`` tokens — or, with a
        ``sliding_window`` W, a :class:`SlidingWindowCache` holding at most ``W + sink_tokens`` of them
        whatever ``capacity`` asks (it decodes past it). A :class:`~headwise.core.latent.LatentAttention`
        gets a :class:`LatentCache`.
        """
        if hasattr(module, "kv_lora_rank"):
            return LatentCache.for_module(module, batch_size, capacity, dtype=dtype, device=device)
        w = module.Wk.weight
        local = w.to_local() if hasattr(w, "to_local") else w  # a DTensor under tensor parallelism
        sizes = (local.shape[0] // module.head_dim, module.head_dim)
        kw = {"dtype": dtype or w.dtype, "device": device or w.device}
        window = getattr(module, "sliding_window", None)
        if window is not None:
            checks.positive_int("capacity", capacity)
            return SlidingWindowCache(batch_size, window, *sizes, sink_tokens=sink_tokens, **kw)
        if sink_tokens:
            raise ValueError(
                f"sink_tokens: StreamingLLM's sinks need a window; got {sink_tokens} for a module without "
                "sliding_window (build a SlidingWindowCache with the window you want)"
            )
        return cls(batch_size, capacity, *sizes, **kw)

    def __repr__(self) -> str:
        b, h, c, d = self.k.shape
        return (
            f"KVCache(batch_size={b}, capacity={c}, num_kv_heads={h}, head_dim={d}, "
            f"length={self.length}, dtype={self.k.dtype})"
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the cached keys and values alone (the filled slots, not the preallocated capacity)."""
        b, h, _, d = self.k.shape
        return self.length * b * h * d * (self.k.element_size() + self.v.element_size())

    def reset(self) -> None:
        """Forget every slot (the buffers are kept)."""
        self.length = 0

    def crop(self, length: int) -> None:
        """Keep the first ``length`` slots and forget the rest, as Hugging Face's ``DynamicCache.crop``.

        For callers that rewind: speculative decoding, or a benchmark that decodes the same token again.
        A negative ``length`` drops that many slots from the end (``DynamicCache.crop``'s meaning too).
        Raises:
            ValueError: ``length`` not an integer or beyond the filled slots.
        """
        if isinstance(length, bool) or not isinstance(length, int) or abs(length) > self.length:
            raise ValueError(f"length: expected an integer in [-{self.length}, {self.length}], got {length!r}")
        self.length = length if length >= 0 else self.length + length

    def check(self, k: Tensor, v: Tensor) -> None:
        """Raise ValueError unless ``k, v (B, Hkv, n, Dh)`` fit this cache and its free slots."""
        b, h, _, d = self.k.shape
        if k.dim() != 4 or k.shape[0] != b or k.shape[1] != h or k.shape[3] != d or v.shape != k.shape:
            raise ValueError(
                f"cache: expected keys and values of shape (B, Hkv, n, Dh)=({b}, {h}, n, {d}), "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if self.length + k.shape[2] > self.capacity:
            raise ValueError(
                f"cache: appending {k.shape[2]} tokens to {self.length} cached ones exceeds its capacity of "
                f"{self.capacity}"
            )

    def update(self, k: Tensor, v: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Append ``k, v (B, Hkv, n, Dh)`` at token ``positions`` (``(n,)`` or ``(B, n)``; default the slots).

        Returns:
            ``(k_all, v_all (B, Hkv, length, Dh), positions_all (B, length))`` — views of the buffers.
        Raises:
            ValueError: shapes that do not fit the cache, or more tokens than its capacity.
        """
        self.check(k, v)
        start, end = self.length, self.length + k.shape[2]
        self.k[:, :, start:end] = k.to(self.k.dtype)
        self.v[:, :, start:end] = v.to(self.v.dtype)
        if positions is None:
            positions = torch.arange(start, end, device=self.positions.device)
        self.positions[:, start:end] = positions.to(self.positions.device)
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end], self.positions[:, :end]


class SlidingWindowCache(KVCache):
    """The last ``window`` keys and values in a ring of slots, plus the first ``sink_tokens`` (StreamingLLM).

    Mistral 7B's "rolling buffer cache" (Jiang et al. 2023 §2): token t goes to slot ``t mod W``, so memory
    stays ``(B, Hkv, W, Dh)`` however long the generation. With ``sink_tokens`` n the first n tokens keep
    slots of their own and stay visible to every query (Xiao et al. 2023, "Efficient Streaming Language
    Models with Attention Sinks"; the tokens keep their original positions here).

    An update returns the held keys in the order of their slots followed by the new ones; the module
    attends over them with causality and the window placed on :meth:`key_slots` (each key's index in the
    whole stream), so decoding token by token equals the full causal forward with the same window.

    Args:
        batch_size: B. window: W ≥ 1. num_kv_heads: Hkv. head_dim: Dh.
        sink_tokens: n ≥ 0 first tokens kept for ever.
        dtype, device: of the buffers ``k, v (B, Hkv, W + n, Dh)``.
    Attributes:
        length: tokens seen so far (the next token's slot); ``held``: tokens the buffers hold (≤ W + n).
    """

    def __init__(
        self,
        batch_size: int,
        window: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        sink_tokens: int = 0,
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        checks.positive_int("window", window)
        checks.non_negative_int("sink_tokens", sink_tokens)
        super().__init__(batch_size, window + sink_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.window, self.sink_tokens = window, sink_tokens
        self.slots = torch.full((window + sink_tokens,), -1, dtype=torch.long, device=self.k.device)  # -1: empty

    def __repr__(self) -> str:
        b, h, _, d = self.k.shape
        return (
            f"SlidingWindowCache(batch_size={b}, window={self.window}, sink_tokens={self.sink_tokens}, "
            f"num_kv_heads={h}, head_dim={d}, length={self.length}, held={self.held}, dtype={self.k.dtype})"
        )

    @property
    def held(self) -> int:
        """Tokens the buffers hold now: ``min(length, W + n)``."""
        return min(self.length, self.capacity)

    @property
    def nbytes(self) -> int:
        """Bytes of the held keys and values: at most ``(W + n) · B · Hkv · Dh · 2 · element size``."""
        b, h, _, d = self.k.shape
        return self.held * b * h * d * (self.k.element_size() + self.v.element_size())

    def reset(self) -> None:
        self.length = 0
        self.slots.fill_(-1)

    def crop(self, length: int) -> None:
        """Forget the last tokens, back to ``length`` (a negative one counts from the end) — only while the
        ring still holds everything the shorter stream would hold (nothing was evicted since).

        Raises:
            ValueError: ``length`` not an integer in range, or tokens needed again were overwritten.
        """
        if isinstance(length, bool) or not isinstance(length, int) or abs(length) > self.length:
            raise ValueError(f"length: expected an integer in [-{self.length}, {self.length}], got {length!r}")
        length = length if length >= 0 else self.length + length
        if self.length > self.capacity and length < self.length:
            raise ValueError(
                f"length: a sliding-window cache that has overwritten slots cannot rewind to {length} "
                f"(it has seen {self.length} tokens, holds {self.capacity}); reset() it instead"
            )
        self.slots[self.slots >= length] = -1
        self.length = length

    def key_slots(self, n: int, device=None) -> Tensor:
        """``(S,)`` stream indices of the keys the next :meth:`update` of ``n`` tokens returns: the held ones in
        order, then ``length … length + n − 1``."""
        held = self.slots[self.slots >= 0].sort().values
        new = torch.arange(self.length, self.length + n, device=held.device)
        return torch.cat([held, new]).to(device or held.device)

    def check(self, k: Tensor, v: Tensor) -> None:
        b, h, _, d = self.k.shape
        if k.dim() != 4 or k.shape[0] != b or k.shape[1] != h or k.shape[3] != d or v.shape != k.shape:
            raise ValueError(
                f"cache: expected keys and values of shape (B, Hkv, n, Dh)=({b}, {h}, n, {d}), "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )

    def update(self, k: Tensor, v: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Attend-ready keys: ``(k_all, v_all (B, Hkv, held + n, Dh), positions_all (B, held + n))``, the held
        ones (by slot) then the new ``k, v (B, Hkv, n, Dh)``; then the ring keeps the sinks and the last W.

        Memory: a copy of the held keys plus the new ones for this call; the buffers never grow.
        """
        self.check(k, v)
        n, start = k.shape[2], self.length
        order = self.slots.argsort()[-self.held :] if self.held else self.slots[:0]  # held slots, oldest first
        if positions is None:
            positions = torch.arange(start, start + n, device=self.positions.device)
        positions = positions.to(self.positions.device).expand(k.shape[0], n)
        k_all = torch.cat([self.k[:, :, order].to(k.dtype), k], dim=2)  # (B, Hkv, held + n, Dh)
        v_all = torch.cat([self.v[:, :, order].to(v.dtype), v], dim=2)
        pos_all = torch.cat([self.positions[:, order], positions], dim=1)  # (B, held + n)
        stream = torch.arange(start, start + n, device=self.slots.device)  # each new token's index
        keep = (stream < self.sink_tokens) | (stream >= start + n - self.window)  # the sinks, the last W
        stream = stream[keep]
        target = torch.where(
            stream < self.sink_tokens, stream, self.sink_tokens + (stream - self.sink_tokens) % self.window
        )  # ring slot of each kept token
        keep_at = keep.nonzero().squeeze(1).to(k.device)
        self.k.index_copy_(2, target.to(self.k.device), k.index_select(2, keep_at).to(self.k.dtype))
        self.v.index_copy_(2, target.to(self.v.device), v.index_select(2, keep_at).to(self.v.dtype))
        self.positions.index_copy_(
            1, target.to(self.positions.device), positions.index_select(1, keep_at.to(positions.device))
        )
        self.slots[target] = stream
        self.length = start + n
        return k_all, v_all, pos_all


class LatentCache:
    """The cache of :class:`~headwise.core.latent.LatentAttention`: the latent and the rope key, nothing else.

    ``R + Dr`` numbers per position and layer (DeepSeek-V3: 512 + 64; × 61 layers × 2 bytes = 70,272 bytes per
    token in bf16), where a :class:`KVCache` of the expanded keys and values would hold ``H · (Dn + Dr + Dv)``
    (DeepSeek-V3 ``inference/model.py``, ``kv_cache`` and ``pe_cache``).

    Args:
        batch_size: B. capacity: C, the most tokens it holds. kv_lora_rank: R. rope_dim: Dr.
        dtype, device: of the buffers ``latent (B, C, R)`` and ``rope_key (B, C, Dr)``.
    Attributes:
        latent, rope_key, positions ``(B, C)``, length (filled slots).
    """

    def __init__(
        self,
        batch_size: int,
        capacity: int,
        kv_lora_rank: int,
        rope_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        for name, value in (
            ("batch_size", batch_size),
            ("capacity", capacity),
            ("kv_lora_rank", kv_lora_rank),
            ("rope_dim", rope_dim),
        ):
            checks.positive_int(name, value)
        self.latent = torch.zeros(batch_size, capacity, kv_lora_rank, dtype=dtype, device=device)
        self.rope_key = torch.zeros(batch_size, capacity, rope_dim, dtype=dtype, device=device)
        self.positions = torch.zeros(batch_size, capacity, dtype=torch.long, device=device)
        self.capacity, self.length = capacity, 0

    @classmethod
    def for_module(cls, module, batch_size: int, capacity: int, *, dtype=None, device=None) -> LatentCache:
        """A cache sized for a :class:`~headwise.core.latent.LatentAttention`, in its dtype and device."""
        w = module.Wkv_a.weight
        return cls(
            batch_size,
            capacity,
            module.kv_lora_rank,
            module.qk_rope_head_dim,
            dtype=dtype or w.dtype,
            device=device or w.device,
        )

    def __repr__(self) -> str:
        b, c, r = self.latent.shape
        return (
            f"LatentCache(batch_size={b}, capacity={c}, kv_lora_rank={r}, rope_dim={self.rope_key.shape[-1]}, "
            f"length={self.length}, dtype={self.latent.dtype})"
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the filled latents and rope keys: ``length · B · (R + Dr) · element size``."""
        b, _, r = self.latent.shape
        dr = self.rope_key.shape[-1]
        return self.length * b * (r * self.latent.element_size() + dr * self.rope_key.element_size())

    def reset(self) -> None:
        self.length = 0

    def crop(self, length: int) -> None:
        """As :meth:`KVCache.crop`."""
        KVCache.crop(self, length)

    def update(self, latent: Tensor, rope_key: Tensor, positions: Tensor | None = None):
        """Append ``latent (B, n, R)`` and ``rope_key (B, n, Dr)`` (already rotated) at token ``positions``.

        Returns:
            ``(latent_all (B, length, R), rope_key_all (B, length, Dr), positions_all (B, length))``, views.
        Raises:
            ValueError: shapes that do not fit, or more tokens than the capacity.
        """
        b, _, r = self.latent.shape
        dr = self.rope_key.shape[-1]
        if (
            latent.dim() != 3
            or (latent.shape[0], latent.shape[2]) != (b, r)
            or rope_key.shape != (b, latent.shape[1], dr)
        ):
            raise ValueError(
                f"cache: expected latent (B, n, R)=({b}, n, {r}) and rope_key (B, n, Dr)=({b}, n, {dr}), "
                f"got {tuple(latent.shape)} and {tuple(rope_key.shape)}"
            )
        start, end = self.length, self.length + latent.shape[1]
        if end > self.capacity:
            raise ValueError(
                f"cache: appending {latent.shape[1]} tokens to {start} cached ones exceeds its capacity of "
                f"{self.capacity}"
            )
        self.latent[:, start:end] = latent.to(self.latent.dtype)
        self.rope_key[:, start:end] = rope_key.to(self.rope_key.dtype)
        if positions is None:
            positions = torch.arange(start, end, device=self.positions.device)
        self.positions[:, start:end] = positions.to(self.positions.device)
        self.length = end
        return self.latent[:, :end], self.rope_key[:, :end], self.positions[:, :end]
