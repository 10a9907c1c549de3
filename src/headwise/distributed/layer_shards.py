"""Layer shards: a model's blocks split over the ranks of a process group and run as pipeline stages.

Rank r holds the contiguous blocks ``[a_r, b_r)`` of :func:`shard_layers`. A batch's hidden states ``(B, L, D)`` pass
from rank to rank by point-to-point ``send`` / ``recv``: rank 0 runs the first stage (the embedding and its blocks),
rank r receives from r − 1, runs its blocks and sends to r + 1, and the last rank's result (after its last stage: the
final norm) is broadcast to every rank. With a model opened layer by layer (:mod:`headwise.models.streamed`) each rank
brings in its own blocks alone, so N machines share a model's reading and each holds 1 / N of its layers (what the
``N`` columns of ``headwise size --memory`` plan). A batch passes the stages one after the other; several batches
keep them all busy (pipelining, ``torch.distributed.pipelining``'s schedules).

- :func:`shard_layers` — the contiguous blocks of each rank.
- :func:`run_stages` — one batch through the stages, a stage being this rank's function of the hidden states.

Shape legend: B batch, L length, D model width, NL layers, P ranks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from headwise.distributed._group import require_group

__all__ = ["run_stages", "shard_layers"]


def shard_layers(num_layers: int, world_size: int) -> list[tuple[int, int]]:
    """``[(a_r, b_r)]`` for ranks r = 0 … P − 1: NL blocks in contiguous shards, the first ``NL mod P`` one larger.

    Raises:
        ValueError: fewer layers than ranks, or counts below 1, naming them.
    """
    if world_size < 1 or num_layers < 1:
        raise ValueError(f"shard_layers: expected positive counts, got {num_layers} layers and {world_size} ranks")
    if num_layers < world_size:
        raise ValueError(
            f"shard_layers: {num_layers} layers cannot be split over {world_size} ranks (one at least each)"
        )
    base, extra = divmod(num_layers, world_size)
    bounds, a = [], 0
    for r in range(world_size):
        b = a + base + (r < extra)
        bounds.append((a, b))
        a = b
    return bounds


def run_stages(
    stage: Callable[[Tensor | None], Tensor],
    shape: tuple[int, ...],
    *,
    dtype: torch.dtype = torch.float32,
    group: dist.ProcessGroup | None = None,
) -> Tensor:
    """One batch through the ranks' stages in rank order; every rank returns the last stage's output.

    Args:
        stage: this rank's stage: ``stage(None)`` on rank 0 (it starts from the batch itself), ``stage(h)`` on the
            others with the previous rank's output ``h``; it returns a tensor of ``shape`` (``(B, L, D)``).
        shape, dtype: what passes between the ranks (the same on every rank).
        group: the process group (None: the default one).
    Returns:
        the last rank's output ``shape``, on every rank.
    Raises:
        RuntimeError: no process group (as :func:`require_group`); a stage whose output has another shape or dtype.
    """
    rank, world = require_group(group, who="run_stages")
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
    h = None
    if rank > 0:
        h = torch.empty(shape, dtype=dtype)
        dist.recv(h, src=ranks[rank - 1], group=group)
    out = stage(h).detach().contiguous()
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise RuntimeError(f"run_stages: rank {rank}'s stage gave {tuple(out.shape)} {out.dtype}, expected "
                           f"{tuple(shape)} {dtype}")  # fmt: skip
    if rank < world - 1:
        dist.send(out, dst=ranks[rank + 1], group=group)
        out = torch.empty(shape, dtype=dtype)
    dist.broadcast(out, src=ranks[world - 1], group=group)
    return out
