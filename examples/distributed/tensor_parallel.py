"""Tensor parallelism: one MultiHeadAttention with its heads split over N ranks (DTensor).

    torchrun --nproc_per_node=2 examples/distributed/tensor_parallel.py
    torchrun --nproc_per_node=4 examples/distributed/tensor_parallel.py --heads 8 --kv-heads 4 --positional alibi

Every rank builds the same module (one seed), keeps a copy as the single-process reference, shards
the original with ``parallelize_attention`` and checks that the sharded forward, its gradients and a
token-by-token decode with a per-rank KV cache match the reference. Rank 0 prints one line per rank.
"""

from __future__ import annotations

import argparse
import copy
import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from headwise import ALiBi, KVCache, MultiHeadAttention, RotaryEmbedding
from headwise.distributed import init_from_env, parallelize_attention, shutdown


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--positional", choices=("none", "rope", "alibi"), default="rope")
    p.add_argument("--seq-len", type=int, default=16)
    a = p.parse_args()

    rank, world = init_from_env()
    device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    head_dim = a.d_model // a.heads
    part = {"none": None, "rope": RotaryEmbedding(head_dim), "alibi": ALiBi(a.heads)}[a.positional]
    mha = MultiHeadAttention(a.d_model, a.heads, num_kv_heads=a.kv_heads, positional=part, device=device_type)
    single = copy.deepcopy(mha)
    parallelize_attention(mha, mesh["tp"])

    x = torch.randn(2, a.seq_len, a.d_model, device=device_type, requires_grad=True)
    ref, _ = single(x, is_causal=True)
    ref.sum().backward()
    ref_dx, x.grad = x.grad, None
    out, _ = mha(x, is_causal=True)
    out.sum().backward()

    cache = KVCache.for_module(mha, 2, a.seq_len)  # this rank's kv heads only
    with torch.no_grad():
        steps = [mha(x[:, t : t + 1], is_causal=True, cache=cache)[0] for t in range(a.seq_len)]
    decoded = torch.cat(steps, dim=1)
    out, ref = out.detach(), ref.detach()

    row = {
        "rank": rank,
        "local_q_heads": mha.Wq.weight.to_local().shape[0] // head_dim,
        "local_kv_heads": cache.k.shape[1],
        "max_err_out": float((out - ref).abs().max()),
        "max_err_dx": float((x.grad - ref_dx).abs().max()),
        "max_err_dWq": float((mha.Wq.weight.grad.full_tensor() - single.Wq.weight.grad).abs().max()),
        "max_err_decode": float((decoded - ref.detach()).abs().max()),
    }
    rows = [None] * world
    dist.all_gather_object(rows, row)
    if rank == 0:
        for r in rows:
            print(json.dumps(r))
    shutdown()


if __name__ == "__main__":
    main()
