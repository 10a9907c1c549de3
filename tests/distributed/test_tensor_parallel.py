"""Tensor-parallel attention (DTensor, whole heads per rank) on a gloo world of 2 and 4 ranks,
against the same module in one process: outputs, input and parameter gradients, per-rank attention
weights and KV-cache decoding; MHA, GQA, RoPE, ALiBi, cross-attention, per-head masks, learned sinks
(sharded with the heads) with a sliding window and soft-capping.
"""

from __future__ import annotations

import pytest
import torch

from headwise import ALiBi, KVCache, MultiHeadAttention, RotaryEmbedding

pytestmark = pytest.mark.distributed

TOL = {torch.float64: 1e-10, torch.float32: 4e-6}
B, L, D = 2, 7, 32

CONFIGS = {
    "mha": dict(d_model=D, num_heads=4),
    "gqa": dict(d_model=D, num_heads=8, num_kv_heads=4, head_dim=8),
    "gqa-rope": dict(d_model=D, num_heads=8, num_kv_heads=4, head_dim=8, positional="rope"),
    "alibi": dict(d_model=D, num_heads=8, num_kv_heads=4, positional="alibi"),
    "nobias-cross": dict(d_model=D, num_heads=4, kdim=12, vdim=20, bias=False),
    "gqa-sinks-window": dict(d_model=D, num_heads=8, num_kv_heads=4, sinks=True, sliding_window=3, softcap=4.0),
}


def build(cfg, dtype):
    kw = dict(cfg)
    part = kw.pop("positional", None)
    if part == "rope":
        kw["positional"] = RotaryEmbedding(kw.get("head_dim") or kw["d_model"] // kw["num_heads"])
    elif part == "alibi":
        kw["positional"] = ALiBi(kw["num_heads"])
    return MultiHeadAttention(**kw, dtype=dtype)


def make_cases():
    cases = {}
    seed = 0
    for dtype in (torch.float64, torch.float32):
        for cname, cfg in CONFIGS.items():
            for causal in (False, True):
                if (cname == "nobias-cross" and causal) or (cname == "gqa-sinks-window" and not causal):
                    continue
                seed += 1
                torch.manual_seed(seed)
                m = build(cfg, dtype)
                if m.sinks is not None:
                    torch.nn.init.normal_(m.sinks)  # not the zeros they start at
                case = {
                    "config": cfg,
                    "dtype": dtype,
                    "state": m.state_dict(),
                    "mode": "forward",
                    "x": torch.randn(B, L, D, dtype=dtype),
                    "g": torch.randn(B, L, D, dtype=dtype),
                    "call": {"is_causal": causal},
                }
                if cname == "nobias-cross":
                    case["key"] = torch.randn(B, 5, 12, dtype=dtype)
                    case["value"] = torch.randn(B, 5, 20, dtype=dtype)
                cases[f"{str(dtype)[6:]}-{cname}-{'causal' if causal else 'full'}"] = case
        # a per-head boolean mask (cut to each rank's heads) and this rank's weights
        torch.manual_seed(seed + 100)
        m = build(CONFIGS["gqa"], dtype)
        cases[f"{str(dtype)[6:]}-gqa-headmask-weights"] = {
            "config": CONFIGS["gqa"],
            "dtype": dtype,
            "state": m.state_dict(),
            "mode": "forward",
            "x": torch.randn(B, L, D, dtype=dtype),
            "g": torch.randn(B, L, D, dtype=dtype),
            "call": {"attn_mask": torch.rand(B, 8, L, L) < 0.3, "need_weights": True, "average_weights": False},
        }
        m = build(CONFIGS["gqa-rope"], dtype)
        cases[f"{str(dtype)[6:]}-gqa-rope-decode"] = {
            "config": CONFIGS["gqa-rope"],
            "dtype": dtype,
            "state": m.state_dict(),
            "mode": "decode",
            "x": torch.randn(B, L, D, dtype=dtype),
        }
    return cases


CASES = make_cases()


@pytest.fixture(scope="module", params=(2, pytest.param(4, marks=pytest.mark.slow)), ids=lambda p: f"world{p}")
def world(request, tmp_path_factory, launch_world):
    P = request.param
    workdir = tmp_path_factory.mktemp(f"tp{P}")
    torch.save(CASES, workdir / "inputs.pt")
    return P, launch_world("tp_worker.py", P, workdir)


def reference(case):
    m = build(case["config"], case["dtype"])
    m.load_state_dict(case["state"])
    if case["mode"] == "decode":
        x = case["x"]
        cache = KVCache.for_module(m, x.shape[0], x.shape[1])
        outs = [m(x[:, :3], is_causal=True, cache=cache)[0]]
        for t in range(3, x.shape[1]):
            outs.append(m(x[:, t : t + 1], is_causal=True, cache=cache)[0])
        return {"out": torch.cat(outs, dim=1).detach()}
    x = case["x"].clone().requires_grad_()
    args = [x] + ([case["key"], case["value"]] if "key" in case else [])
    out, weights = m(*args, **case["call"])
    (out * case["g"]).sum().backward()
    return {
        "out": out.detach(),
        "dx": x.grad,
        "weights": weights,
        "grads": {n: p.grad for n, p in m.named_parameters()},
    }


@pytest.mark.parametrize("name", list(CASES))
def test_matches_single_process(world, name):
    P, ranks = world
    case = CASES[name]
    ref = reference(case)
    tol = TOL[case["dtype"]]
    for r in ranks:
        got = r["results"][name]
        err = (got["out"] - ref["out"]).abs().max().item()
        assert err <= tol, f"{name} rank {r['rank']}: out differs by {err:.3g}"
        if case["mode"] == "decode":
            assert got["cache_heads"] == case["config"]["num_kv_heads"] // P  # a per-rank cache
            continue
        assert (got["dx"] - ref["dx"]).abs().max().item() <= tol
        for pname, g in ref["grads"].items():
            assert (got["grads"][pname] - g).abs().max().item() <= tol, f"{name}: grad of {pname}"
        heads = case["config"]["num_heads"]
        assert got["local_shape"][0] == heads // P * (case["config"].get("head_dim") or D // heads)
    if ref.get("weights") is not None:
        local = [r["results"][name]["weights"] for r in ranks]  # (B, H/P, L, S) each
        assert all(w.shape[1] == case["config"]["num_heads"] // P for w in local)
        assert (torch.cat(local, dim=1) - ref["weights"]).abs().max().item() <= tol


def test_every_rank_raises_on_bad_input(world):
    P, ranks = world
    for r in ranks:
        e = r["errors"]
        assert e["no_group"][0] == "RuntimeError" and "no process group is initialised" in e["no_group"][1]
        kind, msg = e["heads_not_divisible"]
        assert kind == "ValueError"
        assert ("num_heads: 6 heads" if P == 4 else "num_kv_heads: 3 heads") in msg and f"multiple of {P}" in msg
        assert e["modules_differ"][0] == "ValueError" and "differ across ranks" in e["modules_differ"][1]
        assert "average_weights=False" in e["averaged_weights"][1]
        assert "already parallelized" in e["twice"][1]
        assert e["qk_norm"][0] == "ValueError" and "module.qk_norm: expected None" in e["qk_norm"][1]
        assert r["results"]["after_errors"] == (1, 3, 16)
