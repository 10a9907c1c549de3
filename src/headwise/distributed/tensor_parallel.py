"""Tensor parallelism for :class:`headwise.MultiHeadAttention`: whole heads per rank, through DTensor.

The Megatron-LM split (Shoeybi et al. 2019, §3), as torchtitan writes it with
``torch.distributed.tensor.parallel``: ``Wq``, ``Wk``, ``Wv`` are ``ColwiseParallel`` — rank r keeps
output rows ``r·H/P·Dh … (r+1)·H/P·Dh − 1``, i.e. the projections of its own H/P query heads and
Hkv/P key/value heads — and ``Wo`` is ``RowwiseParallel`` — rank r keeps the input columns of its
heads, and the partial outputs are summed by one all-reduce. Attention itself needs no
communication: each rank attends with its own heads, which the module infers from the local width of
its projections (its ``view(B, L, -1, Dh)``).

Shape legend: B batch, L query length, S key length, D model width, H heads, Hkv key/value heads,
P tensor-parallel ranks, Dh head width.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from headwise.distributed._group import all_gather_rows, describe_rows

_PLAN_NAMES = ("Wq", "Wk", "Wv", "Wo")


def _head_range(num: int, rank: int, world: int) -> slice:
    per = num // world
    return slice(rank * per, (rank + 1) * per)


def _check_module(module: nn.Module, tp: int) -> None:
    missing = [name for name in (*_PLAN_NAMES, "num_heads", "num_kv_heads", "head_dim") if not hasattr(module, name)]
    if missing:
        raise TypeError(
            f"module: expected a headwise.MultiHeadAttention (Wq, Wk, Wv, Wo, num_heads, num_kv_heads, "
            f"head_dim), got {type(module).__name__} without {missing}"
        )
    if hasattr(module.Wq.weight, "device_mesh"):
        raise ValueError("module: already parallelized (its weights are DTensors)")
    if getattr(module, "qk_norm", None) is not None:
        raise ValueError(
            f"module.qk_norm: expected None under tensor parallelism, got {module.qk_norm!r} (the norm's weights "
            "would be replicated across ranks without their gradients being reduced; 'full' would also need "
            "statistics over every rank's heads)"
        )
    for name, count in (("num_heads", module.num_heads), ("num_kv_heads", module.num_kv_heads)):
        if count % tp:
            raise ValueError(
                f"module.{name}: {count} heads cannot be split into whole heads over {tp} tensor-parallel "
                f"ranks; expected a multiple of {tp} (use a tensor-parallel size dividing both num_heads="
                f"{module.num_heads} and num_kv_heads={module.num_kv_heads})"
            )


def parallelize_attention(module: nn.Module, tp_mesh, *, src_data_rank: int | None = 0) -> nn.Module:
    """Shard a :class:`headwise.MultiHeadAttention` over ``tp_mesh`` so each rank holds whole heads.

    Call it on every rank of the mesh, with the same module configuration. In place; returns ``module``.

    After it, ``module(query, …)`` on each rank takes the full (replicated) ``query (B, L, D)`` and returns
    the full ``(B, L, D)`` output (one all-reduce inside ``Wo``); the weights are DTensors
    (``Wq.weight`` is ``Shard(0)``, ``Wo.weight`` ``Shard(1)``, ``Wo.bias`` replicated). Rotary embedding
    is the same for every head and needs nothing; an :class:`headwise.ALiBi` part keeps the ids (and so
    the slopes) of this rank's heads only; learned ``sinks`` become a ``Shard(0)`` DTensor, so each rank
    keeps its heads' sink logits. QK-norm is refused. A :class:`headwise.KVCache` is per rank:
    ``KVCache.for_module(module, …)`` sizes it for the local Hkv / P heads.

    Per forward call, a ``(B, H, L, S)`` ``attn_mask`` is cut to this rank's heads; ``need_weights=True``
    is allowed only with ``average_weights=False`` and then returns this rank's heads
    ``(B, H/P, L, S)`` (an average over all heads would need a collective the module does not make).

    Args:
        module: a ``MultiHeadAttention`` (Wq, Wk, Wv, Wo as ``nn.Linear``).
        tp_mesh: a 1-D ``DeviceMesh`` (``init_device_mesh("cpu" | "cuda", (P,))``).
        src_data_rank: the mesh rank whose weights are distributed (default 0, so all ranks end with
            rank 0's weights); None: each rank keeps its own slice, which must then already agree.
    Returns:
        ``module``, parallelized.
    Raises:
        RuntimeError: no initialised process group.
        TypeError: ``module`` is not a headwise attention module, or ``tp_mesh`` is not a DeviceMesh.
        ValueError: ``num_heads`` or ``num_kv_heads`` not divisible by P, QK-norm, a mesh that is not 1-D, a
            module already parallelized, or modules whose sizes differ between ranks — raised on every
            rank (the sizes are all-gathered first).
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "parallelize_attention: no process group is initialised; call torch.distributed."
            "init_process_group(...) (or headwise.distributed.init_from_env()) on every rank first"
        )
    if not isinstance(tp_mesh, DeviceMesh):
        raise TypeError(f"tp_mesh: expected a torch.distributed DeviceMesh, got {type(tp_mesh).__name__}")
    if tp_mesh.ndim != 1:
        raise ValueError(f"tp_mesh: expected a 1-D mesh (pass mesh['tp'] of a larger one), got {tp_mesh.ndim}-D")
    tp, rank, group = tp_mesh.size(), tp_mesh.get_local_rank(), tp_mesh.get_group()

    # every rank must see the same sizes before any of them raises
    sizes = [getattr(module, n, -1) for n in ("d_model", "num_heads", "num_kv_heads", "head_dim")]
    sizes = [s if isinstance(s, int) else -1 for s in sizes]
    rows = all_gather_rows(torch.tensor(sizes), group).cpu()  # (P, 4)
    if not bool((rows == rows[0]).all()):
        raise ValueError(
            "module: the attention modules differ across ranks (d_model, num_heads, num_kv_heads, head_dim): "
            + describe_rows(rows, lambda r: str(tuple(r)))
        )
    _check_module(module, tp)

    parallelize_module(
        module,
        tp_mesh,
        {"Wq": ColwiseParallel(), "Wk": ColwiseParallel(), "Wv": ColwiseParallel(), "Wo": RowwiseParallel()},
        src_data_rank=src_data_rank,
    )
    if getattr(module, "sinks", None) is not None:  # one sink logit per head: each rank keeps its heads'
        from torch.distributed.tensor import Shard, distribute_tensor

        module.sinks = nn.Parameter(
            distribute_tensor(module.sinks.detach(), tp_mesh, [Shard(0)], src_data_rank=src_data_rank)
        )
    positional = getattr(module, "positional", None)
    if positional is not None and isinstance(getattr(positional, "head_ids", None), Tensor):
        positional.head_ids = positional.head_ids[_head_range(module.num_heads, rank, tp)].clone()  # ALiBi
    module._tp_heads = (_head_range(module.num_heads, rank, tp), tp)
    module.register_forward_pre_hook(_tp_pre_hook, with_kwargs=True)
    return module


def _tp_pre_hook(module: nn.Module, args, kwargs):
    heads, tp = module._tp_heads
    if kwargs.get("need_weights") and kwargs.get("average_weights", True):
        raise ValueError(
            "need_weights: under tensor parallelism each rank holds num_heads / "
            f"{tp} heads; pass average_weights=False to get this rank's heads (B, H/{tp}, L, S)"
        )
    mask = kwargs.get("attn_mask")
    if isinstance(mask, Tensor) and mask.dim() == 4 and mask.shape[1] == module.num_heads and tp > 1:
        kwargs = {**kwargs, "attn_mask": mask[:, heads]}  # (B, H/P, L, S)
    return args, kwargs
