"""One rank of the tensor-parallel test world (started by tests/distributed/test_tensor_parallel.py).

For each case of ``<workdir>/inputs.pt`` it builds the module from its config and state dict (ranks
other than 0 perturb their copy first: the weights that count are rank 0's, distributed by
``parallelize_attention``), shards it over a 1-D CPU mesh, runs it, and saves the output, the input
gradient, the full parameter gradients and (when asked) this rank's attention weights.
"""

import os
import sys
import time
from pathlib import Path

import torch
from torch.distributed.device_mesh import init_device_mesh

from headwise import ALiBi, KVCache, MultiHeadAttention, RotaryEmbedding
from headwise.distributed import init_from_env, parallelize_attention, shutdown


def build(cfg, dtype):
    kw = dict(cfg)
    part = kw.pop("positional", None)
    if part == "rope":
        kw["positional"] = RotaryEmbedding(kw.get("head_dim") or kw["d_model"] // kw["num_heads"])
    elif part == "alibi":
        kw["positional"] = ALiBi(kw["num_heads"])
    return MultiHeadAttention(**kw, dtype=dtype)


def plain(t):
    """A plain tensor (the all-reduced output is an AsyncCollectiveTensor)."""
    import torch.distributed._functional_collectives as fc

    t = t.detach()
    return t.wait() if isinstance(t, fc.AsyncCollectiveTensor) else t


def run_case(case, mesh, rank):
    m = build(case["config"], case["dtype"])
    m.load_state_dict(case["state"])
    if rank != 0:
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1.0)  # must be overwritten by rank 0's weights
    parallelize_attention(m, mesh)
    if case["mode"] == "decode":
        x = case["x"]
        cache = KVCache.for_module(m, x.shape[0], x.shape[1])
        outs = [m(x[:, :3], is_causal=True, cache=cache)[0]]
        for t in range(3, x.shape[1]):
            outs.append(m(x[:, t : t + 1], is_causal=True, cache=cache)[0])
        return {"out": torch.cat([plain(o) for o in outs], dim=1), "cache_heads": cache.k.shape[1]}
    x = case["x"].clone().requires_grad_()
    kw = dict(case["call"])
    args = [x] + ([case["key"], case["value"]] if "key" in case else [])
    out, weights = m(*args, **kw)
    (out * case["g"]).sum().backward()
    grads = {n: p.grad.full_tensor() for n, p in m.named_parameters()}
    return {
        "out": plain(out),
        "dx": x.grad,
        "grads": grads,
        "weights": None if weights is None else weights.detach(),
        "local_shape": tuple(m.Wq.weight.to_local().shape),
    }


def capture(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        return (type(e).__name__, str(e))
    return None


def main(workdir: Path):
    cases = torch.load(workdir / "inputs.pt", weights_only=False)
    errors = {"no_group": capture(lambda: parallelize_attention(MultiHeadAttention(8, 2), None))}
    rank, world = init_from_env("gloo")
    mesh = init_device_mesh("cpu", (world,))
    t0 = time.perf_counter()
    results = {name: run_case(case, mesh, rank) for name, case in cases.items()}
    print(f"cases: {time.perf_counter() - t0:.2f} s", flush=True)

    errors["heads_not_divisible"] = capture(
        lambda: parallelize_attention(MultiHeadAttention(24, 6, num_kv_heads=3), mesh)
    )
    errors["modules_differ"] = capture(
        lambda: parallelize_attention(MultiHeadAttention(16, 4 if rank == 0 else 8), mesh)
    )
    m = parallelize_attention(MultiHeadAttention(16, 4), mesh)
    x = torch.randn(1, 3, 16)
    errors["averaged_weights"] = capture(lambda: m(x, need_weights=True))
    errors["twice"] = capture(lambda: parallelize_attention(m, mesh))
    errors["qk_norm"] = capture(lambda: parallelize_attention(MultiHeadAttention(16, 4, qk_norm="head"), mesh))
    results["after_errors"] = tuple(plain(m(x)[0]).shape)  # still in step

    record = {"rank": rank, "world": world, "results": results, "errors": errors}
    tmp = workdir / f"rank{rank}.pt.tmp"
    torch.save(record, tmp)
    os.replace(tmp, workdir / f"rank{rank}.pt")
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
