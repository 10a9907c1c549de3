"""One rank of the ring-attention test world (started by tests/distributed/test_ring.py).

Reads ``<workdir>/inputs.pt`` (full-sequence cases written by the test), runs each case on this rank's
shard, and writes ``<workdir>/rank<r>.pt``: per case the output and the gradients of q, k, v for this
rank's shard, plus the error (type, message) that each bad-input case raised here.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from headwise.distributed import (
    ContextParallelAttention,
    gather_sequence,
    init_from_env,
    ring_attention,
    shard_sequence,
    shutdown,
)


def run_case(case, rank, world, group=None):
    layout = case["layout"]
    shard = {}
    for name in ("q", "k", "v", "g"):
        full = case[name]  # (B, H, L, Dh)
        if case["noncontig"] and name != "g":
            full = full.transpose(1, 2).contiguous()  # (B, L, H, Dh): sharded, then viewed as (B, H, Lp, Dh)
            leaf = shard_sequence(full, rank=rank, world_size=world, layout=layout, dim=1).clone().requires_grad_()
            shard[name] = (leaf, leaf.transpose(1, 2))  # a non-contiguous view
        else:
            leaf = shard_sequence(full, rank=rank, world_size=world, layout=layout, dim=2).clone()
            leaf.requires_grad_(name != "g")
            shard[name] = (leaf, leaf)
    q, k, v = shard["q"][1], shard["k"][1], shard["v"][1]
    assert not case["noncontig"] or not q.is_contiguous()
    out = ring_attention(
        q, k, v, group=group, causal=case["causal"], layout=layout, scale=case["scale"], kernel=case["kernel"]
    )
    (out * shard["g"][1]).sum().backward()
    grads = {}
    for name in ("q", "k", "v"):
        leaf = shard[name][0]
        grads[name] = leaf.grad.transpose(1, 2) if case["noncontig"] else leaf.grad  # (B, H, Lp, Dh)
    return {"out": out.detach(), "dq": grads["q"], "dk": grads["k"], "dv": grads["v"]}


def run_module_case(case, rank, world):
    """ContextParallelAttention on this rank's shard of x (B, L, D); gradients summed over the world."""
    from headwise import MultiHeadAttention, RotaryEmbedding

    cfg = dict(case["config"])
    if cfg.pop("rope", False):
        cfg["positional"] = RotaryEmbedding(cfg["head_dim"])
    m = MultiHeadAttention(**cfg, dtype=case["dtype"])
    m.load_state_dict(case["state"])
    layout = case["layout"]
    cp = ContextParallelAttention(m, layout=layout, kernel=case["kernel"])

    def shard(t):
        return shard_sequence(t, rank=rank, world_size=world, layout=layout, dim=1)

    x = shard(case["x"]).clone().requires_grad_()
    kv = [shard(case["key"]), shard(case["value"])] if "key" in case else []
    out, weights = cp(x, *kv, is_causal=case["causal"])
    assert weights is None
    (out * shard(case["g"])).sum().backward()
    cp.reduce_gradients()
    return {"out": out.detach(), "dx": x.grad, "grads": {n: p.grad for n, p in m.named_parameters()}}


def capture(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        return (type(e).__name__, str(e))
    return None


def main(workdir: Path):
    payload = torch.load(workdir / "inputs.pt", weights_only=False)
    cases, base = payload["cases"], payload["base"]
    errors = {}
    q0 = base["q"][:, :, :4]
    errors["no_group"] = capture(lambda: ring_attention(q0, q0, q0))  # before init_process_group

    rank, world = init_from_env("gloo")
    results = {}
    t0 = time.perf_counter()
    for name, case in cases.items():
        results[name] = run_case(case, rank, world)
    seconds = time.perf_counter() - t0
    for name, case in payload["module_cases"].items():
        results[name] = run_module_case(case, rank, world)

    # gather_sequence: the full output on every rank
    c = cases[payload["gather_case"]]
    out = results[payload["gather_case"]]["out"]
    gathered = gather_sequence(out, layout=c["layout"])

    # a ring over sub-groups: ranks [0, 1] and [2, 3] (world 4)
    if world == 4:
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        sub = groups[rank // 2]
        results["subgroup"] = run_case(payload["subgroup_case"], rank % 2, 2, group=sub)

    # bad input: every rank must raise, none may hang
    lp = base["q"].shape[2] // world
    q, k, v = (shard_sequence(base[n], rank=rank, world_size=world) for n in ("q", "k", "v"))
    qx = shard_sequence(base["qx"], rank=rank, world_size=world, dim=2)
    if rank == 0:
        qx = qx[:, :, : lp - 2]
    errors["shape_mismatch"] = capture(lambda: ring_attention(qx, k, v))
    k3 = k[:, :3]
    errors["heads_not_divisible"] = capture(lambda: ring_attention(q, k3, k3))
    q_bad = q[0] if rank == world - 1 else q
    errors["one_rank_bad"] = capture(lambda: ring_attention(q_bad, k, v))
    q_odd = q[:, :, :3]
    errors["zigzag_odd"] = capture(lambda: ring_attention(q_odd, q_odd, q_odd, causal=True, layout="zigzag"))
    errors["causal_mismatch"] = capture(lambda: ring_attention(q, k, v, causal=(rank == 0)))
    errors["bad_layout"] = capture(lambda: ring_attention(q, k, v, layout="diagonal"))
    errors["seq_not_divisible"] = capture(lambda: shard_sequence(base["q"][:, :, :-1], rank=rank, world_size=world))
    # the world is still in step after all that
    results["after_errors"] = {"out": ring_attention(q, k, v, causal=True).detach()}

    record = {
        "rank": rank,
        "world": world,
        "results": results,
        "errors": errors,
        "gathered": gathered,
        "seconds": seconds,
    }
    tmp = workdir / f"rank{rank}.pt.tmp"
    torch.save(record, tmp)
    os.replace(tmp, workdir / f"rank{rank}.pt")
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
