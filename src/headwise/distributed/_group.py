"""Process-group plumbing shared by the distributed schemes: set-up, tear-down and agreement checks.

Every check whose answer could differ between ranks is made *after* an all-gather of what each rank
holds, so that all ranks reach the same verdict and raise the same error together — a rank that raised
alone would leave the others waiting in the next collective until the timeout.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch import Tensor

from headwise.distributed.ranks import Launch, attempt_store, resolve_timeout


def require_group(group: dist.ProcessGroup | None, *, who: str) -> tuple[int, int]:
    """``(rank, world_size)`` of this process in ``group`` (None: the default group).

    Raises:
        RuntimeError: torch.distributed is unavailable or no process group was initialised (every rank
            raises it on its own, no collective is involved), or this process is not in ``group``.
    """
    if not dist.is_available():
        raise RuntimeError(f"{who}: torch.distributed is not available in this build of torch")
    if not dist.is_initialized():
        raise RuntimeError(
            f"{who}: no process group is initialised; call torch.distributed.init_process_group(...) "
            "(or headwise.distributed.init_from_env()) on every rank first"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise RuntimeError(f"{who}: this process (global rank {dist.get_rank()}) is not a member of group")
    return rank, dist.get_world_size(group)


def all_gather_rows(row: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """Stack one int64 vector ``(n,)`` from each rank: ``(P, n)``, through the functional collectives."""
    import torch.distributed._functional_collectives as fc

    row = row.to(torch.int64).contiguous()
    if group is None:
        group = dist.group.WORLD
    gather = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor  # renamed in torch 2.12
    out = gather(row[None], 0, group)  # (P, n)
    return out.wait() if isinstance(out, fc.AsyncCollectiveTensor) else out


def describe_rows(rows: Tensor, render) -> str:
    """``"rank 0: …; rank 1: …"`` with ``render(row) -> str``."""
    return "; ".join(f"rank {r}: {render(rows[r].tolist())}" for r in range(rows.shape[0]))


def init_from_env(backend: str | None = None, *, timeout_s: float | None = None) -> tuple[int, int]:
    """Initialise the default process group from torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``), with a collective timeout so a failing rank never hangs the rest.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; None: NCCL when CUDA is available, else gloo.
        timeout_s: seconds a collective may wait; default ``$HEADWISE_DIST_TIMEOUT``, else
            :data:`headwise.distributed.ranks.DEFAULT_TIMEOUT_S` (:func:`headwise.distributed.ranks.resolve_timeout`).
    Returns:
        ``(rank, world_size)``. On NCCL the current CUDA device is set to ``LOCAL_RANK``. The group's keys live under
        the restart attempt's prefix of the launch's store (:func:`attempt_store`), so ``torchrun --max-restarts K``
        with a static rendezvous restarts cleanly.
    Raises:
        RuntimeError: a variable is missing (not launched by torchrun).
    """
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"init_from_env: environment variables {missing} are not set; launch with "
            "`torchrun --nproc_per_node=N script.py`"
        )
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout_s = resolve_timeout(timeout_s)
    device_id = None
    if backend == "nccl":
        local = Launch.from_env().local_rank
        torch.cuda.set_device(local)
        device_id = torch.device("cuda", local)
    launch = Launch.from_env()
    rank, world = launch.rank, launch.world_size
    timeout = datetime.timedelta(seconds=timeout_s)
    store = attempt_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout, device_id=device_id)
    return dist.get_rank(), dist.get_world_size()


def shutdown() -> None:
    """Barrier, then ``destroy_process_group`` (no-op when no group is initialised)."""
    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
