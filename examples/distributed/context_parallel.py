"""Context parallelism: a MultiHeadAttention (GQA + RoPE) run on sequence shards through ring attention.

    torchrun --nproc_per_node=2 examples/distributed/context_parallel.py
    torchrun --nproc_per_node=4 examples/distributed/context_parallel.py --layout zigzag --seq-len 4096

Every rank holds the same module and only its shard of the sequence (``shard_sequence``); the wrapper
``ContextParallelAttention`` projects the shard, rotates it at its global positions and calls
``ring_attention``. The script checks the shard of the output and the all-reduced weight gradients
against the module run on the whole sequence in one process (skip with --no-check for long inputs).
"""

from __future__ import annotations

import argparse
import copy
import json

import torch
import torch.distributed as dist

from headwise import MultiHeadAttention, RotaryEmbedding
from headwise.distributed import ContextParallelAttention, init_from_env, shard_sequence, shutdown


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--layout", choices=("contiguous", "zigzag"), default="zigzag")
    p.add_argument("--no-check", action="store_true")
    a = p.parse_args()

    rank, world = init_from_env()
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    torch.manual_seed(0)
    mha = MultiHeadAttention(
        a.d_model, a.heads, num_kv_heads=a.kv_heads, positional=RotaryEmbedding(a.d_model // a.heads), device=device
    )
    single = copy.deepcopy(mha)
    cp = ContextParallelAttention(mha, layout=a.layout)

    x = torch.randn(1, a.seq_len, a.d_model, device=device)  # a real job would load only its shard
    x_shard = shard_sequence(x, rank=rank, world_size=world, layout=a.layout, dim=1)
    out, _ = cp(x_shard, is_causal=True)
    out.sum().backward()
    cp.reduce_gradients()

    row = {"rank": rank, "shard": tuple(x_shard.shape)}
    if not a.no_check:
        ref, _ = single(x, is_causal=True)
        ref.sum().backward()
        mine = shard_sequence(ref.detach(), rank=rank, world_size=world, layout=a.layout, dim=1)
        row["max_err_out"] = float((out.detach() - mine).abs().max())
        row["max_err_dWq"] = float((mha.Wq.weight.grad - single.Wq.weight.grad).abs().max())
    rows = [None] * world
    dist.all_gather_object(rows, row)
    if rank == 0:
        for r in rows:
            print(json.dumps(r))
    shutdown()


if __name__ == "__main__":
    main()
