"""Attention beyond one device, on ``torch.distributed``: tensor-parallel heads and ring attention.

- :func:`ring_attention` — context parallelism: the sequence is sharded across ranks, key/value shards
  travel around a ring (Liu et al. 2023); exact, differentiable, causal with a zigzag layout option.
- :class:`ContextParallelAttention` — a :class:`headwise.MultiHeadAttention` run on sequence shards
  through :func:`ring_attention`.
- :func:`parallelize_attention` — tensor parallelism: whole heads per rank through DTensor
  (``ColwiseParallel`` Wq/Wk/Wv, ``RowwiseParallel`` Wo, as in Megatron-LM and torchtitan).
- :func:`init_from_env`, :func:`attempt_store`, :func:`shutdown` — the process group from torchrun's environment,
  its keys apart for each restart attempt.

Tested on CPU with gloo; written for NCCL on GPUs (see docs/distributed.md).
"""

from headwise.distributed._group import attempt_store, init_from_env, shutdown
from headwise.distributed.context_parallel import ContextParallelAttention
from headwise.distributed.kernels import CpuFlashKernel, CudaEfficientKernel, CudaFlashKernel, MathKernel
from headwise.distributed.ring import (
    LAYOUTS,
    gather_sequence,
    ring_attention,
    shard_positions,
    shard_sequence,
    unshard_sequence,
)
from headwise.distributed.tensor_parallel import parallelize_attention

__all__ = [
    "LAYOUTS",
    "ContextParallelAttention",
    "CpuFlashKernel",
    "CudaEfficientKernel",
    "CudaFlashKernel",
    "MathKernel",
    "attempt_store",
    "gather_sequence",
    "init_from_env",
    "parallelize_attention",
    "ring_attention",
    "shard_positions",
    "shard_sequence",
    "shutdown",
    "unshard_sequence",
]
