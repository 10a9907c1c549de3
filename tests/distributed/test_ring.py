"""Ring attention on a real gloo world (2 and 4 ranks) against the single-process attention.

One world per world size runs every sub-case (module-scoped fixture); the comparisons happen here,
in the test process, against :func:`headwise.core.functional.scaled_dot_product_attention` on the full
sequence: outputs and the gradients of q, k, v, float64 within 1e-8 and float32 within 1e-5.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from headwise import MultiHeadAttention, RotaryEmbedding
from headwise import functional as HF
from headwise.core.primitives import repeat_kv
from headwise.distributed import ring_attention, shard_positions, shard_sequence, unshard_sequence

pytestmark = pytest.mark.distributed

TOL = {torch.float64: 1e-8, torch.float32: 1e-5}
B, H, DH, LP = 2, 4, 8, 6  # batch, query heads, head width, shard length


def _case(P, *, dtype, causal, layout, kv_heads, kernel, noncontig, seed, s_len=None, scale=None):
    g = torch.Generator().manual_seed(seed)
    L = LP * P
    S = L if s_len is None else s_len
    return {
        "dtype": dtype,
        "causal": causal,
        "layout": layout,
        "kernel": kernel,
        "noncontig": noncontig,
        "scale": scale,
        "q": torch.randn(B, H, L, DH, generator=g, dtype=torch.float64).to(dtype),
        "k": torch.randn(B, kv_heads, S, DH, generator=g, dtype=torch.float64).to(dtype),
        "v": torch.randn(B, kv_heads, S, DH, generator=g, dtype=torch.float64).to(dtype),
        "g": torch.randn(B, H, L, DH, generator=g, dtype=torch.float64).to(dtype),
    }


def make_cases(P):
    cases = {}
    grid = itertools.product(
        (torch.float64, torch.float32), (False, True), ("contiguous", "zigzag"), (H, 2, 1), ("flash", "math")
    )
    for i, (dtype, causal, layout, kvh, kernel) in enumerate(grid):
        name = f"{str(dtype)[6:]}-{'causal' if causal else 'full'}-{layout}-kv{kvh}-{kernel}"
        cases[name] = _case(
            P, dtype=dtype, causal=causal, layout=layout, kv_heads=kvh, kernel=kernel, noncontig=i % 2 == 1, seed=i
        )
    # cross-attention shards of another length, a custom scale
    cases["float64-cross-kv2-flash"] = _case(
        P,
        dtype=torch.float64,
        causal=False,
        layout="contiguous",
        kv_heads=2,
        kernel="flash",
        noncontig=True,
        seed=99,
        s_len=4 * P,
        scale=0.3,
    )
    return cases


CASE_NAMES = list(make_cases(2))

MODULE_CONFIG = dict(d_model=32, num_heads=8, num_kv_heads=4, head_dim=8, rope=True)


def _module(config, dtype):
    cfg = dict(config)
    if cfg.pop("rope", False):
        cfg["positional"] = RotaryEmbedding(cfg["head_dim"])
    return MultiHeadAttention(**cfg, dtype=dtype)


def make_module_cases(P):
    """ContextParallelAttention around a GQA + RoPE MultiHeadAttention (and a cross-attention one)."""
    cases = {}
    specs = [
        ("module-float64-causal-contiguous", torch.float64, True, "contiguous", MODULE_CONFIG, None),
        ("module-float64-causal-zigzag", torch.float64, True, "zigzag", MODULE_CONFIG, None),
        ("module-float32-causal-zigzag", torch.float32, True, "zigzag", MODULE_CONFIG, None),
        (
            "module-float64-cross",
            torch.float64,
            False,
            "contiguous",
            dict(d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, kdim=12, vdim=20, rope=True),
            4,
        ),
    ]
    for i, (name, dtype, causal, layout, config, s_per_rank) in enumerate(specs):
        torch.manual_seed(1000 + i)
        m = _module(config, dtype)
        L = LP * P
        case = {
            "config": config,
            "dtype": dtype,
            "causal": causal,
            "layout": layout,
            "kernel": None,
            "state": m.state_dict(),
            "x": torch.randn(B, L, 32, dtype=dtype),
            "g": torch.randn(B, L, 32, dtype=dtype),
        }
        if s_per_rank:
            case["key"] = torch.randn(B, s_per_rank * P, 12, dtype=dtype)
            case["value"] = torch.randn(B, s_per_rank * P, 20, dtype=dtype)
        cases[name] = case
    return cases


MODULE_CASE_NAMES = list(make_module_cases(2))


@pytest.fixture(scope="module", params=(2, pytest.param(4, marks=pytest.mark.slow)), ids=lambda p: f"world{p}")
def world(request, tmp_path_factory, launch_world):
    P = request.param
    workdir = tmp_path_factory.mktemp(f"ring{P}")
    cases = make_cases(P)
    g = torch.Generator().manual_seed(7)
    base = {n: torch.randn(B, H, LP * P, DH, generator=g, dtype=torch.float64) for n in ("q", "k", "v", "qx")}
    payload = {
        "cases": cases,
        "module_cases": make_module_cases(P),
        "base": base,
        "gather_case": CASE_NAMES[6],
        "subgroup_case": _case(
            2, dtype=torch.float64, causal=True, layout="zigzag", kv_heads=2, kernel="flash", noncontig=False, seed=123
        ),
    }
    torch.save(payload, workdir / "inputs.pt")
    ranks = launch_world("ring_worker.py", P, workdir)
    return P, payload, ranks


def reference(case):
    """Single-process attention of the full sequence and the gradients of sum(out * g)."""
    q, k, v = (case[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out, _ = HF.scaled_dot_product_attention(q, k, v, is_causal=case["causal"], scale=case["scale"], backend="math")
    (out * case["g"]).sum().backward()
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _unshard(ranks, key, name, layout):
    return unshard_sequence([r["results"][key][name] for r in ranks], layout=layout)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_matches_single_process(world, name):
    P, payload, ranks = world
    case = payload["cases"][name]
    ref = reference(case)
    tol = TOL[case["dtype"]]
    for part in ("out", "dq", "dk", "dv"):
        got = _unshard(ranks, name, part, case["layout"])
        assert got.dtype == case["dtype"] and got.shape == ref[part].shape
        err = (got - ref[part]).abs().max().item()
        assert err <= tol, f"{name} {part}: max |ring − single| = {err:.3g} > {tol:g} (world {P})"


@pytest.mark.parametrize("name", MODULE_CASE_NAMES)
def test_context_parallel_module_matches_single_process(world, name):
    """ContextParallelAttention(mha) on shards == mha on the full sequence; summed parameter gradients too."""
    P, payload, ranks = world
    case = payload["module_cases"][name]
    m = _module(case["config"], case["dtype"])
    m.load_state_dict(case["state"])
    x = case["x"].clone().requires_grad_()
    kv = [case["key"], case["value"]] if "key" in case else []
    out, _ = m(x, *kv, is_causal=case["causal"])
    (out * case["g"]).sum().backward()
    tol = TOL[case["dtype"]]
    for part, want in (("out", out.detach()), ("dx", x.grad)):
        got = unshard_sequence([r["results"][name][part] for r in ranks], layout=case["layout"], dim=1)
        err = (got - want).abs().max().item()
        assert err <= tol, f"{name} {part}: {err:.3g}"
    for pname, p in m.named_parameters():
        for r in ranks:
            err = (r["results"][name]["grads"][pname] - p.grad).abs().max().item()
            assert err <= tol, f"{name} grad {pname} on rank {r['rank']}: {err:.3g}"


def test_context_parallel_module_refuses_what_it_cannot_do():
    from headwise import ALiBi
    from headwise.distributed import ContextParallelAttention

    with pytest.raises(ValueError, match="ALiBi adds a score bias"):
        ContextParallelAttention(MultiHeadAttention(16, 4, positional=ALiBi(4)))
    with pytest.raises(TypeError, match="expected a headwise.MultiHeadAttention"):
        ContextParallelAttention(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="layout"):
        ContextParallelAttention(MultiHeadAttention(16, 4), layout="striped")
    with pytest.raises(RuntimeError, match="no process group"):
        ContextParallelAttention(MultiHeadAttention(16, 4))(torch.zeros(1, 4, 16))


def test_subgroup_ring(world):
    P, payload, ranks = world
    if P != 4:
        pytest.skip("sub-groups [0, 1] and [2, 3] need a world of 4")
    case, ref = payload["subgroup_case"], reference(payload["subgroup_case"])
    for pair in (ranks[0:2], ranks[2:4]):
        for part in ("out", "dq", "dk", "dv"):
            got = _unshard(pair, "subgroup", part, case["layout"])
            assert (got - ref[part]).abs().max().item() <= 1e-8


def test_gather_sequence(world):
    P, payload, ranks = world
    name = payload["gather_case"]
    full = _unshard(ranks, name, "out", payload["cases"][name]["layout"])
    for r in ranks:
        assert torch.equal(r["gathered"], full)


def test_every_rank_raises_on_bad_input(world):
    P, _, ranks = world
    for r in ranks:
        e = r["errors"]
        assert e["no_group"][0] == "RuntimeError" and "no process group is initialised" in e["no_group"][1]
        assert e["shape_mismatch"][0] == "ValueError" and "differ across ranks" in e["shape_mismatch"][1]
        assert "rank 0: q (2, 4, 4, 8)" in e["shape_mismatch"][1]
        assert e["heads_not_divisible"][0] == "ValueError" and "H % Hkv" in e["heads_not_divisible"][1]
        assert e["zigzag_odd"][0] == "ValueError" and "even shard length" in e["zigzag_odd"][1]
        assert e["causal_mismatch"][0] == "ValueError" and "causal=True" in e["causal_mismatch"][1]
        assert e["bad_layout"][0] == "ValueError" and "'diagonal'" in e["bad_layout"][1]
        assert e["seq_not_divisible"][0] == "ValueError" and "not divisible by" in e["seq_not_divisible"][1]
        msg = e["one_rank_bad"][1]
        if r["rank"] == P - 1:
            assert "expected a shard (B, H, L/P, Dh)" in msg and f"on rank {P - 1}" in msg
        else:
            assert f"rank(s) [{P - 1}] rejected their inputs" in msg


def test_world_still_in_step_after_errors(world):
    P, payload, ranks = world
    base = payload["base"]
    ref, _ = HF.scaled_dot_product_attention(base["q"], base["k"], base["v"], is_causal=True, backend="math")
    got = unshard_sequence([r["results"]["after_errors"]["out"] for r in ranks])
    assert (got - ref).abs().max().item() <= 1e-8


# ---------------------------------------------------------------------------------------------------
# single-process: layouts and the world of one


def test_layouts_round_trip_and_positions():
    x = torch.arange(16)
    zig = [shard_sequence(x, rank=r, world_size=4, layout="zigzag", dim=0).tolist() for r in range(4)]
    assert zig == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    for layout in ("contiguous", "zigzag"):
        shards = [shard_sequence(x, rank=r, world_size=4, layout=layout, dim=0) for r in range(4)]
        assert torch.equal(unshard_sequence(shards, layout=layout, dim=0), x)
        assert torch.equal(shard_positions(16, rank=2, world_size=4, layout=layout), shards[2])
    with pytest.raises(ValueError, match="not divisible by 8"):
        shard_sequence(torch.zeros(12), rank=0, world_size=4, layout="zigzag", dim=0)
    with pytest.raises(ValueError, match="rank: expected 0 … 3"):
        shard_sequence(x, rank=4, world_size=4, dim=0)


def test_no_process_group_is_a_clear_error():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="no process group is initialised"):
        ring_attention(q, q, q)


@pytest.mark.parametrize("kernel", ["math", "flash"])
def test_kernels_equal_single_process_attention(kernel):
    """The block kernels alone: out, lse and the flash backward from the global lse."""
    from headwise.distributed.kernels import resolve_kernel

    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, h, 10, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
    kern = resolve_kernel(kernel, q.device, q.dtype)
    for causal in (False, True):
        out, lse = kern.forward(q, k, v, causal=causal, scale=0.5)
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        ref, _ = HF.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=0.5, backend="math")
        ref.backward(do)
        scores = 0.5 * q @ repeat_kv(k, 4).transpose(-1, -2)
        if causal:
            scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), -math.inf)
        assert (out - ref).abs().max() <= 1e-12
        assert (lse - scores.logsumexp(-1)).abs().max() <= 1e-12
        grads = kern.backward(do, q, k, v, out, lse, causal=causal, scale=0.5)
        for got, want in zip(grads, (qq.grad, kk.grad, vv.grad)):
            assert (got - want).abs().max() <= 1e-12
