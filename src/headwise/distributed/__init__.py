"""Attention beyond one device, on ``torch.distributed``: tensor-parallel heads and ring attention, and the ranks of a
launch that every split run shares.

- :func:`ring_attention` — context parallelism: the sequence is sharded across ranks, key/value shards
  travel around a ring (Liu et al. 2023); exact, differentiable, causal with a zigzag layout option.
- :class:`ContextParallelAttention` — a :class:`headwise.MultiHeadAttention` run on sequence shards
  through :func:`ring_attention`.
- :func:`parallelize_attention` — tensor parallelism: whole heads per rank through DTensor
  (``ColwiseParallel`` Wq/Wk/Wv, ``RowwiseParallel`` Wo, as in Megatron-LM and torchtitan).
- :func:`shard_layers`, :func:`run_stages` — a model's blocks split over the ranks as pipeline stages (layer shards:
  each rank reads and holds its own layers).
- :func:`init_from_env`, :func:`attempt_store`, :func:`shutdown` — the process group from torchrun's environment,
  its keys apart for each restart attempt.
- :mod:`headwise.distributed.ranks` — where this process stands in a launch (read from the environment there alone),
  the collectives' one timeout, and :func:`ranks`: jobs dealt to the ranks by cost, results gathered in job order
  (the corpus runs, the patching and circuit sweeps, the lab's runs).

Tested on CPU with gloo; written for NCCL on GPUs (see docs/distributed.md). Importing the package loads nothing
else (PEP 562): torch loads with the first name used.
"""

from __future__ import annotations

import importlib

_MODULES = {
    "headwise.distributed._group": ["attempt_store", "init_from_env", "shutdown"],
    "headwise.distributed.context_parallel": ["ContextParallelAttention"],
    "headwise.distributed.kernels": ["CpuFlashKernel", "CudaEfficientKernel", "CudaFlashKernel", "MathKernel"],
    "headwise.distributed.layer_shards": ["run_stages", "shard_layers"],
    "headwise.distributed.ring": [
        "LAYOUTS", "gather_sequence", "ring_attention", "shard_positions", "shard_sequence", "unshard_sequence",
    ],
    "headwise.distributed.ranks": ["DEFAULT_TIMEOUT_S", "CollectiveTimeout", "Ranks", "launched", "ranks"],
    "headwise.distributed.tensor_parallel": ["parallelize_attention"],
}  # fmt: skip
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'headwise.distributed' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
