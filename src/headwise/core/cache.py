"""An explicit key/value cache for incremental decoding (gpt-fast style, preallocated).

Shape legend: B batch, Hkv key/value heads, C capacity (slots), Dh head width.
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
    def for_module(cls, module, batch_size: int, capacity: int, *, dtype=None, device=None) -> KVCache:
        """A cache sized for ``module`` (a :class:`headwise.MultiHeadAttention`), in its dtype and device."""
        w = module.Wk.weight
        local = w.to_local() if hasattr(w, "to_local") else w  # a DTensor under tensor parallelism
        return cls(
            batch_size,
            capacity,
            local.shape[0] // module.head_dim,
            module.head_dim,
            dtype=dtype or w.dtype,
            device=device or w.device,
        )

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
