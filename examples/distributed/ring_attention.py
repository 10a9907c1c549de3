"""Ring attention (context parallelism) on N ranks, with a check against one process and memory figures.

    torchrun --nproc_per_node=4 examples/distributed/ring_attention.py --seq-len 4096 --causal --layout zigzag
    torchrun --nproc_per_node=2 examples/distributed/ring_attention.py --check          # small, compared
    torchrun --nproc_per_node=4 examples/distributed/ring_attention.py --memory --json out.json

Every rank builds the same full q, k, v from one seed and keeps its shard (a real job would only ever
hold the shard), runs forward and backward through ``ring_attention``, and rank 0 prints a line per
rank. On GPUs the same command uses NCCL (see docs/distributed.md).

--memory measures, per rank, (a) the peak of live tensor memory during forward + backward as seen by
``torch.distributed._tools.mem_tracker.MemTracker`` (every tensor created by a PyTorch op, from the
inputs to the ring's receive buffers; not a kernel's internal scratch) and (b) the process's peak
resident set (``resource.getrusage``), which includes the ~0.3-0.5 GiB of the torch library itself.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist

from headwise.distributed import init_from_env, ring_attention, shard_sequence, shutdown


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=1024, help="full sequence length L (all ranks together)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA); default --heads")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous")
    p.add_argument("--dtype", choices=("float32", "float64", "bfloat16"), default="float32")
    p.add_argument("--kernel", default="auto", help="auto | math | flash | efficient")
    p.add_argument("--check", action="store_true", help="compare with single-process attention (small L)")
    p.add_argument("--memory", action="store_true", help="measure peak memory per rank")
    p.add_argument("--json", default=None, help="rank 0 writes the per-rank figures here")
    return p.parse_args()


def main() -> None:
    a = parse()
    rank, world = init_from_env()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    dtype = getattr(torch, a.dtype)
    hkv = a.kv_heads or a.heads
    g = torch.Generator().manual_seed(0)

    def full(h):
        return torch.randn(a.batch, h, a.seq_len, a.head_dim, generator=g, dtype=torch.float32).to(dtype)

    q_full, k_full, v_full, do_full = full(a.heads), full(hkv), full(hkv), full(a.heads)

    def shard(t):
        return shard_sequence(t, rank=rank, world_size=world, layout=a.layout).contiguous().to(device)

    q, k, v, do = (shard(t) for t in (q_full, k_full, v_full, do_full))
    if not a.check:
        del q_full, k_full, v_full, do_full  # keep only this rank's shard, as a real job would
    for t in (q, k, v):
        t.requires_grad_()

    tracker = None
    if a.memory:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(q, k, v, do)
    rss_before = _rss_mib()
    dist.barrier()
    t0 = time.perf_counter()
    if tracker is not None:
        with tracker:
            out = ring_attention(q, k, v, causal=a.causal, layout=a.layout, kernel=a.kernel)
            out.backward(do)
    else:
        out = ring_attention(q, k, v, causal=a.causal, layout=a.layout, kernel=a.kernel)
        out.backward(do)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0

    row = {"rank": rank, "world": world, "seq_len": a.seq_len, "shard_len": q.shape[2], "seconds": round(seconds, 3)}
    if tracker is not None:
        peak = tracker.get_tracker_snapshot("peak")
        row["tensor_peak_mib"] = round(sum(s["Total"] for s in peak.values()) / 2**20, 2)
        row["inputs_mib"] = round(sum(t.numel() * t.element_size() for t in (q, k, v, do)) / 2**20, 2)
        row["rss_before_mib"] = round(rss_before, 1)
        row["rss_peak_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        if device.type == "cuda":
            row["cuda_max_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 2)
    if a.check:
        row.update(_check(a, rank, world, q_full, k_full, v_full, do_full, out, q, k, v))

    rows = [None] * world
    dist.all_gather_object(rows, row)
    if rank == 0:
        for r in rows:
            print(json.dumps(r))
        if a.json:
            tmp = a.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"args": vars(a), "ranks": rows}, f, indent=1)
            os.replace(tmp, a.json)
    shutdown()


def _check(a, rank, world, q_full, k_full, v_full, do_full, out, q, k, v) -> dict:
    """Max |ring − single process| over this rank's shard, for the output and the three gradients."""
    from headwise import functional as HF

    qq, kk, vv = (t.clone().requires_grad_() for t in (q_full, k_full, v_full))
    ref, _ = HF.scaled_dot_product_attention(qq, kk, vv, is_causal=a.causal, backend="math")
    ref.backward(do_full)
    errs = {}
    pairs = {"out": (out, ref), "dq": (q.grad, qq.grad), "dk": (k.grad, kk.grad), "dv": (v.grad, vv.grad)}
    for name, (got, want) in pairs.items():
        mine = shard_sequence(want, rank=rank, world_size=world, layout=a.layout)
        errs[f"max_err_{name}"] = float((got.detach().cpu().double() - mine.detach().double()).abs().max())
    return errs


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


if __name__ == "__main__":
    main()
