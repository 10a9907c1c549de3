"""Explicit caches for incremental decoding (gpt-fast style, preallocated), one per kind of attention.

- :class:`KVCache`: every key and value, ``(B, Hkv, C, Dh)``.
- :class:`SlidingWindowCache`: a ring of the last W keys and values (plus StreamingLLM's first n): its
  memory is bounded by the window, not by the context, and decoding goes on past the window.
- :class:`LatentCache`: multi-head latent attention's latent and rope key only.

Every cache follows one protocol, :class:`Cache`, so the attention modules never ask which one they hold:

- ``length``: tokens seen in the stream since the last :meth:`~Cache.reset` — the next token's slot. The
  same meaning in every cache (a ring has seen more tokens than it holds).
- ``held``: tokens whose entries the buffers hold now (``length`` for a full cache, at most ``W + n`` for a
  ring); ``nbytes``: the bytes of those entries; ``capacity``: the slots the buffers have.
- :meth:`~Cache.keys_after` ``(n, is_causal=, window=)``: checks a call before anything changes and returns
  S, the keys the update of its n tokens will return.
- :meth:`~Cache.update`: appends, and returns a :class:`CacheRead` — the keys in stream order with their token
  positions and what causality needs to place them (``key_slots``, ``window``, ``sink_tokens``), placed on
  the module's :class:`~headwise.core.call.AttentionCall` by :meth:`CacheRead.place`.
- :meth:`~Cache.crop` ``(n)`` rewinds the stream to n tokens (Hugging Face ``DynamicCache.crop``);
  :meth:`~Cache.reset` forgets it. Only the cache changes its books.

A module makes its own cache (``module.new_cache(batch_size, capacity, ...)``, torchtune's ``setup_caches``
idea); ``Cache.for_module(module, ...)`` (also reachable as ``KVCache.for_module``) asks it.
Shape legend: B batch, Hkv key/value heads, C capacity (slots), Dh head width, W window, R latent rank, Dr
rotary width, n new tokens, S keys returned.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from headwise import checks
from headwise.core import masks
from headwise.core.call import AttentionCall


class CacheRead(NamedTuple):
    """What an update returns: everything attention needs about the keys it attends.

    Attributes:
        tensors: the cached entries up to and including the new ones, in stream order: ``(k, v)``
            ``(B, Hkv, S, Dh)`` for a :class:`KVCache`, ``(latent (B, S, R), rope_key (B, S, Dr))`` for a
            :class:`LatentCache`.
        positions: ``(B, S)`` the token position of every returned entry.
        key_slots: ``(S,)`` each returned key's index in the stream, or None when they are ``0 … S − 1``
            (then plain causality needs no index at all: a kernel flag, or no mask for one new token).
        window: the most keys behind a query that the cache keeps (a ring's W), or None.
        sink_tokens: the first stream indices that stay visible whatever the window (StreamingLLM).
    """

    tensors: tuple[Tensor, ...]
    positions: Tensor
    key_slots: Tensor | None = None
    window: int | None = None
    sink_tokens: int = 0

    def place(self, call: AttentionCall) -> AttentionCall:
        """``call`` for queries after the cached keys: the keys' slots and sink tokens, the narrower window."""
        if self.key_slots is None and self.sink_tokens == 0 and self.window is None:
            return call
        return call.replace(
            key_slots=self.key_slots, sink_tokens=self.sink_tokens, window=masks.narrowest(call.window, self.window)
        )


class Cache:
    """The protocol every cache follows (see the module docstring); subclasses hold the buffers.

    A subclass sets ``capacity`` and ``length``, and defines :meth:`update` and ``_token_bytes``.
    """

    capacity: int
    length: int

    @classmethod
    def for_module(
        cls, module, batch_size: int, capacity: int, *, sink_tokens: int = 0, dtype=None, device=None
    ) -> Cache:
        """``module.new_cache(batch_size, capacity, sink_tokens=, dtype=, device=)``: the cache the module makes
        for itself (whichever class this is called on) — a :class:`KVCache` or, with a ``sliding_window``, a
        :class:`SlidingWindowCache` for a :class:`headwise.MultiHeadAttention`; a :class:`LatentCache` for a
        :class:`~headwise.core.latent.LatentAttention`.
        Raises:
            TypeError: a module that makes no cache. ValueError: as the module's ``new_cache``.
        """
        new_cache = getattr(module, "new_cache", None)
        if not callable(new_cache):
            raise TypeError(f"module: expected an attention module with new_cache(), got {type(module).__name__}")
        return new_cache(batch_size, capacity, sink_tokens=sink_tokens, dtype=dtype, device=device)

    @property
    def held(self) -> int:
        """Tokens whose entries the buffers hold now: ``min(length, capacity)``."""
        return min(self.length, self.capacity)

    @property
    def nbytes(self) -> int:
        """Bytes of the held entries (not of the preallocated capacity)."""
        return self.held * self._token_bytes()

    def _token_bytes(self) -> int:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the stream (the buffers are kept)."""
        self.length = 0

    def crop(self, length: int) -> None:
        """Rewind the stream to its first ``length`` tokens, as Hugging Face's ``DynamicCache.crop``.

        For callers that rewind: speculative decoding, or a benchmark that decodes the same token again.
        A negative ``length`` drops that many tokens from the end (``DynamicCache.crop``'s meaning too).
        Raises:
            ValueError: ``length`` not an integer in ``[-length, length]``, or — for a ring that has
            overwritten slots — tokens the shorter stream would need again are gone.
        """
        if isinstance(length, bool) or not isinstance(length, int) or abs(length) > self.length:
            raise ValueError(f"length: expected an integer in [-{self.length}, {self.length}], got {length!r}")
        length = length if length >= 0 else self.length + length
        if self.length > self.capacity and length < self.length:
            raise ValueError(
                f"length: a sliding-window cache that has overwritten slots cannot rewind to {length} "
                f"(it has seen {self.length} tokens, holds {self.capacity}); reset() it instead"
            )
        self._forget_from(length)
        self.length = length

    def _forget_from(self, length: int) -> None:
        """Drop the books of stream indices ``≥ length`` (nothing to do for a cache filled in order)."""

    def keys_after(self, n: int, *, is_causal: bool = True, window: int | None = None) -> int:
        """S, the keys an update of ``n`` new tokens returns — after checking the call fits this cache.

        ``is_causal`` and ``window`` describe the attending call; a full cache serves any call.
        Raises:
            ValueError: ``n`` more tokens exceed the capacity.
        """
        if self.length + n > self.capacity:
            raise ValueError(
                f"cache: appending {n} tokens to {self.length} cached ones exceeds its capacity of {self.capacity}"
            )
        return self.length + n

    def update(self, *entries: Tensor, positions: Tensor | None = None) -> CacheRead:
        raise NotImplementedError

    def _stream_positions(self, positions: Tensor | None, n: int, device) -> Tensor:
        """Token positions ``(n,)`` or ``(B, n)`` of the next n tokens: as given, or their stream indices."""
        if positions is None:
            return torch.arange(self.length, self.length + n, device=device)
        return positions.to(device)


class KVCache(Cache):
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
        k, v: the buffers; ``positions (B, C)`` the token position of every filled slot; ``length`` tokens
        seen (here: the filled slots).
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

    def __repr__(self) -> str:
        b, h, c, d = self.k.shape
        return (
            f"KVCache(batch_size={b}, capacity={c}, num_kv_heads={h}, head_dim={d}, "
            f"length={self.length}, dtype={self.k.dtype})"
        )

    def _token_bytes(self) -> int:
        b, h, _, d = self.k.shape
        return b * h * d * (self.k.element_size() + self.v.element_size())

    def _check_shapes(self, k: Tensor, v: Tensor) -> None:
        """Raise ValueError unless ``k, v (B, Hkv, n, Dh)`` fit the buffers."""
        b, h, _, d = self.k.shape
        if k.dim() != 4 or k.shape[0] != b or k.shape[1] != h or k.shape[3] != d or v.shape != k.shape:
            raise ValueError(
                f"cache: expected keys and values of shape (B, Hkv, n, Dh)=({b}, {h}, n, {d}), "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )

    def update(self, k: Tensor, v: Tensor, positions: Tensor | None = None) -> CacheRead:
        """Append ``k, v (B, Hkv, n, Dh)`` at token ``positions`` (``(n,)`` or ``(B, n)``; default the slots).

        Returns:
            a :class:`CacheRead` of views of the buffers: ``(k, v) (B, Hkv, length, Dh)``,
            ``positions (B, length)``; the keys sit at slots ``0 … length − 1`` (``key_slots`` None).
        Raises:
            ValueError: shapes that do not fit the cache, or more tokens than its capacity.
        """
        self._check_shapes(k, v)
        self.keys_after(k.shape[2])
        start, end = self.length, self.length + k.shape[2]
        self.k[:, :, start:end] = k.to(self.k.dtype)
        self.v[:, :, start:end] = v.to(self.v.dtype)
        self.positions[:, start:end] = self._stream_positions(positions, end - start, self.positions.device)
        self.length = end
        return CacheRead((self.k[:, :, :end], self.v[:, :, :end]), self.positions[:, :end])

    def commit(self, n: int = 1) -> None:
        """Count ``n`` tokens whose keys and values a kernel wrote in place at slots ``length … length + n − 1``
        (a compiled decode step), at their default positions (their slots)."""
        if self.length + n > self.capacity:
            raise ValueError(
                f"cache: appending {n} tokens to {self.length} cached ones exceeds its capacity of {self.capacity}"
            )
        if n == 1:
            self.positions[:, self.length] = self.length
        else:
            self.positions[:, self.length : self.length + n] = torch.arange(
                self.length, self.length + n, device=self.positions.device
            )
        self.length += n


class SlidingWindowCache(KVCache):
    """The last ``window`` keys and values in a ring of slots, plus the first ``sink_tokens`` (StreamingLLM).

    Mistral 7B's "rolling buffer cache" (Jiang et al. 2023 §2): token t goes to slot ``t mod W``, so memory
    stays ``(B, Hkv, W, Dh)`` however long the generation. With ``sink_tokens`` n the first n tokens keep
    slots of their own and stay visible to every query (Xiao et al. 2023, "Efficient Streaming Language
    Models with Attention Sinks"; the tokens keep their original positions here).

    An update returns the held keys in stream order followed by the new ones — a copy, since the ring is
    not in stream order — with ``key_slots`` (each key's index in the stream), the window and the sinks,
    so that causality is placed on the stream and decoding token by token equals the full causal forward
    with the same window. It serves causal calls of modules whose window is at most W (or None).

    Args:
        batch_size: B. window: W ≥ 1. num_kv_heads: Hkv. head_dim: Dh.
        sink_tokens: n ≥ 0 first tokens kept for ever.
        dtype, device: of the buffers ``k, v (B, Hkv, W + n, Dh)``.
    Attributes:
        length: tokens seen so far (the next token's stream index); ``held``: tokens the buffers hold (≤ W + n).
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

    def reset(self) -> None:
        super().reset()
        self.slots.fill_(-1)

    def next_slot(self) -> int:
        """The ring slot the next token goes to: its own among the sinks, else ``sinks + (t − sinks) mod W``."""
        t, n = self.length, self.sink_tokens
        return t if t < n else n + (t - n) % self.window

    def commit(self, n: int = 1) -> None:
        """Count one token whose key and value a kernel wrote in place at :meth:`next_slot` (a compiled decode
        step), at its default position (its stream index)."""
        if n != 1:
            raise ValueError(f"n: a ring takes tokens written in place one at a time, got {n!r}")
        slot = self.next_slot()
        self.slots[slot] = self.length
        self.positions[:, slot] = self.length
        self.length += 1

    def _forget_from(self, length: int) -> None:
        self.slots[self.slots >= length] = -1

    def keys_after(self, n: int, *, is_causal: bool = True, window: int | None = None) -> int:
        """``held + n``: the held keys and the new ones (a ring never overflows).

        Raises:
            ValueError: a call that is not causal, or whose window is wider than the ring's.
        """
        if not is_causal or (window or 0) > self.window:
            raise ValueError(
                f"cache: a SlidingWindowCache(window={self.window}) serves causal calls of a module whose "
                f"sliding_window is at most {self.window} (or None, StreamingLLM); got is_causal={is_causal}, "
                f"sliding_window={window}"
            )
        return self.held + n

    def key_slots(self, n: int, device=None) -> Tensor:
        """``(S,)`` stream indices of the keys the next :meth:`update` of ``n`` tokens returns: the held ones in
        order, then ``length … length + n − 1``."""
        held = self.slots[self.slots >= 0].sort().values
        new = torch.arange(self.length, self.length + n, device=held.device)
        return torch.cat([held, new]).to(device or held.device)

    def update(self, k: Tensor, v: Tensor, positions: Tensor | None = None) -> CacheRead:
        """Attend-ready keys: ``(k, v) (B, Hkv, held + n, Dh)`` and ``positions (B, held + n)``, the held ones
        (in stream order) then the new ``k, v (B, Hkv, n, Dh)``, with their ``key_slots``, the window and the
        sinks; then the ring keeps the sinks and the last W.

        Memory: a copy of the held keys plus the new ones for this call; the buffers never grow.
        """
        self._check_shapes(k, v)
        n, start = k.shape[2], self.length
        key_slots = self.key_slots(n, device=k.device)  # (held + n,)
        order = self.slots.argsort()[-self.held :] if self.held else self.slots[:0]  # held slots, oldest first
        positions = self._stream_positions(positions, n, self.positions.device).expand(k.shape[0], n)
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
        return CacheRead((k_all, v_all), pos_all, key_slots, self.window, self.sink_tokens)


class LatentCache(Cache):
    """The cache of :class:`~headwise.core.latent.LatentAttention`: the latent and the rope key, nothing else.

    ``R + Dr`` numbers per position and layer (DeepSeek-V3: 512 + 64; × 61 layers × 2 bytes = 70,272 bytes per
    token in bf16), where a :class:`KVCache` of the expanded keys and values would hold ``H · (Dn + Dr + Dv)``
    (DeepSeek-V3 ``inference/model.py``, ``kv_cache`` and ``pe_cache``).

    Args:
        batch_size: B. capacity: C, the most tokens it holds. kv_lora_rank: R. rope_dim: Dr.
        dtype, device: of the buffers ``latent (B, C, R)`` and ``rope_key (B, C, Dr)``.
    Attributes:
        latent, rope_key, positions ``(B, C)``, length (tokens seen: the filled slots).
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

    def __repr__(self) -> str:
        b, c, r = self.latent.shape
        return (
            f"LatentCache(batch_size={b}, capacity={c}, kv_lora_rank={r}, rope_dim={self.rope_key.shape[-1]}, "
            f"length={self.length}, dtype={self.latent.dtype})"
        )

    def _token_bytes(self) -> int:
        """``B · (R + Dr) · element size``."""
        b, _, r = self.latent.shape
        dr = self.rope_key.shape[-1]
        return b * (r * self.latent.element_size() + dr * self.rope_key.element_size())

    def update(self, latent: Tensor, rope_key: Tensor, positions: Tensor | None = None) -> CacheRead:
        """Append ``latent (B, n, R)`` and ``rope_key (B, n, Dr)`` (already rotated) at token ``positions``.

        Returns:
            a :class:`CacheRead` of views: ``(latent (B, length, R), rope_key (B, length, Dr))``,
            ``positions (B, length)``; the entries sit at slots ``0 … length − 1``.
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
        self.keys_after(latent.shape[1])
        start, end = self.length, self.length + latent.shape[1]
        self.latent[:, start:end] = latent.to(self.latent.dtype)
        self.rope_key[:, start:end] = rope_key.to(self.rope_key.dtype)
        self.positions[:, start:end] = self._stream_positions(positions, end - start, self.positions.device)
        self.length = end
        return CacheRead((self.latent[:, :end], self.rope_key[:, :end]), self.positions[:, :end])
