"""Float32 tensors a model read layer by layer frees, kept by shape for the next layer's weights to be read into
(:class:`~headwise.models.streamed.LayerStream`): writing warm memory instead of first-touching a fresh allocation.

Shape legend: none (tensors are matched by their whole shape).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["BufferPool"]


class BufferPool:
    """Float32 tensors a released block leaves, by shape, for the next block's weights to be read into.

    Each block's weights are a fresh allocation otherwise (mapped by glibc on its own and given back when freed,
    :func:`headwise.models.memory.map_large_allocations`), and first-touching fresh memory runs several times slower
    than writing warm memory. A tensor is kept only when nothing else holds it or a view of it (its storage used by
    it alone), so no caller's copy of a weight is ever overwritten; the pool keeps at most ``limit`` bytes."""

    def __init__(self, limit: int):
        self.limit = limit
        self._free: dict[tuple[int, ...], list[Tensor]] = {}
        self.bytes = 0

    def keep(self, tensors: list) -> None:
        import sys

        for t in tensors:
            if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous() or t._base is not None:
                continue
            # nothing else holds it: the Python object (the list, the loop's name, the call's argument), the tensor
            # (an autograd graph's saved tensors), its storage (a view, a detached copy)
            if sys.getrefcount(t) > 3 or _users(t) != (1, 1):
                continue
            size = t.numel() * 4
            if self.bytes + size > self.limit:
                continue
            self._free.setdefault(tuple(t.shape), []).append(t.detach())
            self.bytes += size

    def take(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Tensor]:
        """A kept tensor for each name whose shape one has (``name → shape``), taken out of the pool."""
        out = {}
        for name, shape in shapes.items():
            free = self._free.get(tuple(shape))
            if free:
                t = free.pop()
                self.bytes -= t.numel() * 4
                out[name] = t
        return out

    def clear(self) -> None:
        self._free, self.bytes = {}, 0


def _users(t: Tensor) -> tuple[int, int]:
    """``(holders of the tensor, tensors using its storage)``; ``(0, 0)`` where PyTorch does not say."""
    try:
        return int(t._use_count()), int(torch._C._storage_Use_Count(t.untyped_storage()._cdata)) - 1  # less the new one
    except (AttributeError, RuntimeError):
        return 0, 0
