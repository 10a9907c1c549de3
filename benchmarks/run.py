"""headwise benchmarks: side by side against nn.MultiheadAttention, Hugging Face BertAttention and the article's module.

    .venv/bin/python benchmarks/run.py --quick     # make bench: every timed target, few rounds (< 3 minutes)
    .venv/bin/python benchmarks/run.py --full      # make bench-full: all targets, more rounds, the long-context
                                                   # scaling runs and the NumPy blocked reference at L = 16384;
                                                   # writes docs/performance.md and docs/img/scaling.png
    .venv/bin/python benchmarks/run.py --full --only forward,decode    # some targets

Results: ``benchmarks/results/<target>.json`` (full) or ``benchmarks/results/quick/<target>.json`` (quick).
Timing method: see ``benchmarks/_common.py`` (alternating rounds, medians, paired ratios, one process).
Memory: see ``benchmarks/memcase.py`` (a fresh process per case, its own peak RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from _common import ROOT, command, compare, flops_mha, gemm_call, log, machine, ratio, ratio_spread, write_json
from peers import build, calls, check_agreement

import headwise
import headwise.reference as ref

RESULTS = ROOT / "benchmarks" / "results"
PEER_NAMES = {
    "headwise": "headwise",
    "torch": "nn.MultiheadAttention",
    "hf": "HF BertAttention (sdpa)",
    "article": "article's from-scratch module",
}


class Mode:
    def __init__(self, full: bool):
        self.full = full
        self.rounds = 9 if full else 2
        self.target_s = 0.4 if full else 0.1


def _row(metric: str, value, goal: str | None = None, passed: bool | None = None, note: str | None = None) -> dict:
    return {"metric": metric, "value": value, "goal": goal, "pass": passed, "note": note}


def _maybe_ratio(res: dict, a: str, b: str) -> float | None:
    return ratio(res, a, b) if b in res["times_s"] else None


def _contenders_table(res: dict, against: list[str], flops: float | None = None) -> list[dict]:
    rows = []
    for name, t in res["median_s"].items():
        row = {"contender": name, "median_ms": t * 1e3}
        if flops:
            row["gflops"] = flops / t / 1e9
        for peer in against:
            if peer != name and peer in res["median_s"]:
                row[f"ratio_vs_{peer}"] = ratio(res, name, peer)
                row[f"spread_vs_{peer}"] = ratio_spread(res, name, peer)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------------
# 1 (+ issue 2, section 7): float32 forward
def target_forward(mode: Mode) -> dict:
    shapes = [(8, 512, 768, 12), (1, 4096, 512, 8)]
    out = {"target": "forward", "title": "1. float32 forward, eval, weights not requested", "cases": []}
    summary = []
    for B, L, D, H in shapes:
        first = shapes[0] == (B, L, D, H)
        mods = build(D, H, peers=("torch", "hf", "article") if first or mode.full else ("torch", "article"))
        x = torch.randn(B, L, D)
        diffs = check_agreement(mods, x, atol=1e-4)
        fns = calls(mods, x)
        if first:
            fns["gemm 2048³"] = gemm_call()
        log(f"forward {(B, L, D, H)}: {list(fns)}")
        with torch.inference_mode():
            res = compare(fns, rounds=mode.rounds + (1 if first else 0), target_s=mode.target_s)
        flops = flops_mha(B, L, D)
        table = _contenders_table(
            {**res, "median_s": {k: v for k, v in res["median_s"].items() if k != "gemm 2048³"}},
            ["torch", "hf", "article"],
            flops,
        )
        case = {"shape": [B, L, D, H], "flops": flops, "agreement_max_abs": diffs, "timing": res, "table": table}
        r_torch, r_art = ratio(res, "headwise", "torch"), ratio(res, "headwise", "article")
        r_hf = ratio(res, "headwise", "hf") if "hf" in fns else None
        if first:
            gemm_rate = 2 * 2048**3 / res["median_s"]["gemm 2048³"] / 1e9
            hw_rate = flops / res["median_s"]["headwise"] / 1e9
            # paired per-round fraction of the GEMM rate
            frac = statistics.median(
                (flops / th) / (2 * 2048**3 / tg)
                for th, tg in zip(res["times_s"]["headwise"], res["times_s"]["gemm 2048³"])
            )
            # the ratio headwise would have if every one of its FLOPs ran at the measured GEMM rate
            ideal = statistics.median(
                (flops / (2 * 2048**3 / tg)) / tt
                for tg, tt in zip(res["times_s"]["gemm 2048³"], res["times_s"]["torch"])
            )
            case.update(gemm_gflops=gemm_rate, headwise_gflops=hw_rate, fraction_of_gemm=frac, ideal_vs_torch=ideal)
            summary += [
                _row(
                    f"{(B, L, D, H)} time vs nn.MultiheadAttention",
                    r_torch,
                    "≤ 0.60 (≤ 1.0 in issue 2)",
                    r_torch <= 0.60,
                ),
                _row(f"{(B, L, D, H)} time vs HF BertAttention (sdpa)", r_hf, "≤ 0.95", r_hf <= 0.95),
                _row(f"{(B, L, D, H)} time vs article module", r_art, None, None),
                _row(
                    f"{(B, L, D, H)} headwise GFLOP/s ÷ fp32 GEMM (2048³) GFLOP/s",
                    frac,
                    "≥ 0.75",
                    frac >= 0.75,
                    f"{hw_rate:.0f} of {gemm_rate:.0f} GFLOP/s (medians)",
                ),
            ]
        else:
            summary += [
                _row(f"{(B, L, D, H)} time vs nn.MultiheadAttention", r_torch, "≤ 1.0 (issue 2)", r_torch <= 1.0),
                _row(f"{(B, L, D, H)} time vs HF BertAttention (sdpa)", r_hf, None, None),
                _row(f"{(B, L, D, H)} time vs article module", r_art, None, None),
            ]
        out["cases"].append(case)
        del mods
    out["summary"] = summary
    return out


# ---------------------------------------------------------------------------------------------------------
# 3: bf16
def target_bf16(mode: Mode) -> dict:
    B, L, D, H = 8, 512, 768, 12
    torch.manual_seed(0)
    m32 = build(D, H, peers=("torch",))
    hw32, t32 = m32["headwise"], m32["torch"]
    hw16 = headwise.MultiHeadAttention(D, H, dtype=torch.bfloat16).eval()
    hw16.load_state_dict(hw32.state_dict())
    t16 = headwise.interop.to_torch(hw16).eval()
    x = torch.randn(B, L, D)
    x16 = x.bfloat16()

    def autocast_fwd():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return hw32(x)[0]

    fns = {
        "nn.MHA fp32": lambda: t32(x, x, x, need_weights=False)[0],
        "headwise bf16": lambda: hw16(x16)[0],
        "headwise fp32 + autocast": autocast_fwd,
        "nn.MHA bf16": lambda: t16(x16, x16, x16, need_weights=False)[0],
        "gemm 2048³ fp32": gemm_call(),
        "gemm 2048³ bf16": gemm_call(dtype=torch.bfloat16),
    }
    log(f"bf16 {(B, L, D, H)}: {list(fns)}")
    with torch.inference_mode():
        res = compare(fns, rounds=mode.rounds, target_s=mode.target_s)
        # error against the float64 NumPy reference on the same weights and inputs
        p = {}
        for name, lin in (("q", hw32.Wq), ("k", hw32.Wk), ("v", hw32.Wv), ("o", hw32.Wo)):
            p[f"w{name}"] = lin.weight.double().numpy().T
            p[f"b{name}"] = lin.bias.double().numpy()
        nb = B if mode.full else 2
        want, _ = ref.multi_head_attention(x[:nb].double().numpy(), p, H)
        errs = {}
        for name, got in (
            ("headwise bf16", hw16(x16[:nb])[0]),
            ("headwise fp32 + autocast", None),
            ("headwise fp32", hw32(x[:nb])[0]),
        ):
            if got is None:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    got = hw32(x[:nb])[0]
            e = got.double().numpy() - want
            errs[name] = {
                "rel_fro": float(np.linalg.norm(e) / np.linalg.norm(want)),
                "max_abs": float(np.abs(e).max()),
                "max_abs_over_max_ref": float(np.abs(e).max() / np.abs(want).max()),
                "batch_items": nb,
            }
    gemm_speedup = ratio(res, "gemm 2048³ fp32", "gemm 2048³ bf16")
    speed = 1 / ratio(res, "headwise bf16", "nn.MHA fp32")
    speed_ac = 1 / ratio(res, "headwise fp32 + autocast", "nn.MHA fp32")
    speed_t16 = 1 / ratio(res, "headwise bf16", "nn.MHA bf16")
    return {
        "target": "bf16",
        "title": "3. bfloat16 forward (module in bf16, and float32 module under autocast)",
        "shape": [B, L, D, H],
        "timing": res,
        "table": _contenders_table(
            {**res, "median_s": {k: v for k, v in res["median_s"].items() if not k.startswith("gemm")}},
            ["nn.MHA fp32", "nn.MHA bf16"],
            flops_mha(B, L, D),
        ),
        "gemm_gflops": {k[11:]: 2 * 2048**3 / v / 1e9 for k, v in res["median_s"].items() if k.startswith("gemm")},
        "gemm_bf16_speedup": gemm_speedup,
        "error_vs_float64_reference": errs,
        "summary": [
            _row(
                "speed-up of headwise bf16 over nn.MHA fp32",
                speed,
                "≥ 5",
                speed >= 5,
                f"bf16 GEMM is {gemm_speedup:.2f} × the fp32 GEMM rate here",
            ),
            _row("speed-up of headwise fp32 + autocast over nn.MHA fp32", speed_ac, "≥ 5", speed_ac >= 5),
            _row("speed-up of headwise bf16 over nn.MHA bf16", speed_t16, None, None),
            _row(
                "bf16 error ‖err‖/‖ref‖ vs float64 reference",
                errs["headwise bf16"]["rel_fro"],
                "bounded by tests/core/test_fast_paths.py (< 1e-2)",
                errs["headwise bf16"]["rel_fro"] < 1e-2,
            ),
            _row(
                "bf16 error max|err| / max|ref|",
                errs["headwise bf16"]["max_abs_over_max_ref"],
                "< 2e-2 (test bound)",
                errs["headwise bf16"]["max_abs_over_max_ref"] < 2e-2,
            ),
        ],
    }


# ---------------------------------------------------------------------------------------------------------
# 4: decoding with a KV cache
def target_decode(mode: Mode) -> dict:
    D, H, prefix = 768, 12, 4096
    torch.manual_seed(0)
    m = headwise.MultiHeadAttention(D, H).eval()
    x = torch.randn(1, prefix + 1, D)
    cache = headwise.KVCache.for_module(m, 1, prefix + 1)
    with torch.inference_mode():
        m(x[:, :prefix], is_causal=True, cache=cache)
        full, _ = m(x, is_causal=True)

        def decode():
            cache.crop(prefix)  # forget the token appended by the previous call
            return m(x[:, prefix:], is_causal=True, cache=cache)[0]

        err = float((decode() - full[:, prefix:]).abs().max())
        fns = {"recompute (causal forward of 4097)": lambda: m(x, is_causal=True)[0], "decode 1 token": decode}
        log(f"decode prefix {prefix}: {list(fns)}")
        res = compare(fns, rounds=mode.rounds, target_s=mode.target_s)
        # the same pair with one torch thread (see the tokens/s note below)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            res_1 = compare(fns, rounds=max(2, mode.rounds // 2), target_s=mode.target_s)
        finally:
            torch.set_num_threads(threads)
    r = ratio(res, "decode 1 token", "recompute (causal forward of 4097)")
    r_1 = ratio(res_1, "decode 1 token", "recompute (causal forward of 4097)")

    # tokens per second through a 12-layer stack of residual attention layers
    layers, n_prompt, n_new = 12, (4096 if mode.full else 512), (64 if mode.full else 8)
    torch.manual_seed(1)
    stack = [headwise.MultiHeadAttention(D, H).eval() for _ in range(layers)]
    caches = [headwise.KVCache.for_module(mm, 1, n_prompt + n_new) for mm in stack]
    h = torch.randn(1, n_prompt, D)
    with torch.inference_mode():
        t0 = time.perf_counter()
        for mm, c in zip(stack, caches):
            h = h + mm(h, is_causal=True, cache=c)[0]
        t_prefill = time.perf_counter() - t0
        tok = h[:, -1:]
        per_token = []
        for _ in range(n_new):
            t0 = time.perf_counter()
            y = tok
            for mm, c in zip(stack, caches):
                y = y + mm(y, is_causal=True, cache=c)[0]
            per_token.append(time.perf_counter() - t0)
            tok = y
    tps = 1 / statistics.median(per_token)
    # the same decode with one torch thread: on a shared machine every parallel region of a small op can
    # wait for the second thread to be scheduled, which one thread never does
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for c in caches:
                c.crop(n_prompt)
            per_token_1 = []
            tok = h[:, -1:]
            for _ in range(n_new):
                t0 = time.perf_counter()
                y = tok
                for mm, c in zip(stack, caches):
                    y = y + mm(y, is_causal=True, cache=c)[0]
                per_token_1.append(time.perf_counter() - t0)
                tok = y
    finally:
        torch.set_num_threads(threads)
    tps_1 = 1 / statistics.median(per_token_1)
    return {
        "target": "decode",
        "title": "4. decoding with KVCache",
        "config": {"D": D, "H": H, "prefix": prefix, "B": 1},
        "max_abs_diff_decode_vs_full": err,
        "timing": res,
        "timing_1_thread": res_1,
        "table": _contenders_table(res, ["recompute (causal forward of 4097)"]),
        "table_1_thread": _contenders_table(res_1, ["recompute (causal forward of 4097)"]),
        "stack": {
            "layers": layers,
            "prompt": n_prompt,
            "new_tokens": n_new,
            "prefill_s": t_prefill,
            "median_token_s": statistics.median(per_token),
            "tokens_per_s": tps,
            "threads": threads,
            "tokens_per_s_1_thread": tps_1,
        },
        "summary": [
            _row(
                "one decoded token ÷ full causal recompute at prefix 4096",
                r,
                "≤ 1/200 = 0.005",
                r <= 1 / 200,
                f"1/{1 / r:.0f}, {threads} threads",
            ),
            _row(
                "the same with one torch thread for both",
                r_1,
                "≤ 1/200 = 0.005",
                r_1 <= 1 / 200,
                f"1/{1 / r_1:.0f}",
            ),
            _row(
                f"tokens/s, 12-layer stack (D=768, H=12), prompt {n_prompt}, {n_new} new tokens",
                tps,
                None,
                None,
                f"{threads} threads, median of {n_new} tokens; {tps_1:.0f} tokens/s with 1 thread",
            ),
        ],
    }


# ---------------------------------------------------------------------------------------------------------
# 5: need_weights=True
def target_weights(mode: Mode) -> dict:
    B, L, D, H = 8, 512, 768, 12
    mods = build(D, H, peers=("torch",))
    hw, tm = mods["headwise"], mods["torch"]
    x = torch.randn(B, L, D)
    with torch.inference_mode():
        a, wa = hw(x, need_weights=True)
        b, wb = tm(x, x, x, need_weights=True)
        diff = max(float((a - b).abs().max()), float((wa - wb).abs().max()))
        fns = {
            "headwise avg": lambda: hw(x, need_weights=True),
            "nn.MHA avg": lambda: tm(x, x, x, need_weights=True),
            "headwise per-head": lambda: hw(x, need_weights=True, average_weights=False),
            "nn.MHA per-head": lambda: tm(x, x, x, need_weights=True, average_attn_weights=False),
        }
        log(f"need_weights {(B, L, D, H)}: {list(fns)}")
        res = compare(fns, rounds=mode.rounds, target_s=mode.target_s)
    r = ratio(res, "headwise avg", "nn.MHA avg")
    r2 = ratio(res, "headwise per-head", "nn.MHA per-head")
    return {
        "target": "weights",
        "title": "5. need_weights=True (float32, eval)",
        "shape": [B, L, D, H],
        "agreement_max_abs": diff,
        "timing": res,
        "table": _contenders_table(res, ["nn.MHA avg", "nn.MHA per-head"]),
        "summary": [
            _row("weights averaged over heads: time vs nn.MultiheadAttention", r, "≤ 1.0", r <= 1.0),
            _row("per-head weights: time vs nn.MultiheadAttention", r2, "≤ 1.0", r2 <= 1.0),
        ],
    }


# ---------------------------------------------------------------------------------------------------------
# 6: training step
def target_train(mode: Mode) -> dict:
    B, L, D, H = 8, 512, 768, 12
    mods = build(D, H, peers=("torch", "hf", "article") if mode.full else ("torch",))
    for mod in mods.values():
        mod.train()
    x = torch.randn(B, L, D, requires_grad=True)
    g = torch.randn(B, L, D)
    fwd = calls(mods, x)

    def step(name):
        mod, f = mods[name], fwd[name]

        def run():
            for p in mod.parameters():
                p.grad = None
            x.grad = None
            (f() * g).sum().backward()

        return run

    fns = {name: step(name) for name in mods}
    fns["gemm 2048³"] = gemm_call()
    log(f"train {(B, L, D, H)}: {list(fns)}")
    res = compare(fns, rounds=mode.rounds, target_s=mode.target_s)
    r = ratio(res, "headwise", "torch")
    flops = 3 * flops_mha(B, L, D)  # backward ≈ twice the forward's products
    ideal = statistics.median(
        (flops / (2 * 2048**3 / tg)) / tt for tg, tt in zip(res["times_s"]["gemm 2048³"], res["times_s"]["torch"])
    )
    gemm_rate = 2 * 2048**3 / res["median_s"]["gemm 2048³"] / 1e9
    res["median_s"].pop("gemm 2048³")
    return {
        "target": "train",
        "title": "6. training step (forward + backward), float32",
        "shape": [B, L, D, H],
        "timing": res,
        "table": _contenders_table(res, ["torch", "hf", "article"], flops),
        "gemm_gflops": gemm_rate,
        "summary": [
            _row(
                "forward + backward: time vs nn.MultiheadAttention",
                r,
                "≤ 0.70",
                r <= 0.70,
                f"all 3 × forward FLOPs at the GEMM rate would give {ideal:.2f}",
            ),
            _row(
                "forward + backward: time vs HF BertAttention (sdpa)", _maybe_ratio(res, "headwise", "hf"), None, None
            ),
            _row("forward + backward: time vs article module", _maybe_ratio(res, "headwise", "article"), None, None),
        ],
    }


# ---------------------------------------------------------------------------------------------------------
# 2: long context (memory in fresh processes) and the scaling plot
def _memcase(impl: str, L: int, *, D=512, H=8, B=1, block=None, warmup=0, timeout=None, env=None) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "memcase.py"), "--impl", impl, "--B", str(B), "--L", str(L)]
    cmd += ["--D", str(D), "--H", str(H), "--warmup", str(warmup)]
    if block:
        cmd += ["--block", str(block)]
    log("  " + " ".join(cmd[1:]))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"impl": impl, "L": L, "error": f"timed out after {timeout} s"}
    if p.returncode != 0:
        return {"impl": impl, "L": L, "error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


TORCH_MAX_L = 16384  # nn.MultiheadAttention materialises (H, L, L) scores: 8.6 GB of them at 16k, 34 GB at 32k


def target_long(mode: Mode) -> dict:
    D, H = 512, 8
    lengths = [1024, 2048, 4096, 8192, 16384, 32768, 65536] if mode.full else [4096]
    rows = []
    for L in lengths:
        for impl in ("headwise", "torch"):
            if impl == "torch" and L > TORCH_MAX_L:
                rows.append(
                    {
                        "impl": impl,
                        "L": L,
                        "skipped": f"L > {TORCH_MAX_L}: scores alone need "
                        f"{H * L * L * 4 / 2**30:.0f} GiB (the machine has less)",
                    }
                )
                continue
            rows.append(_memcase(impl, L, D=D, H=H, warmup=1 if L <= 4096 else 0))
            log(f"    {rows[-1]}")
    long = [r for r in rows if r["impl"] == "headwise" and r["L"] == max(lengths)][0]
    summary = []
    if max(lengths) == 65536:
        ok = "peak_mib" in long and long["peak_mib"] < 1.5 * 1024
        summary.append(
            _row(
                "peak memory (process peak RSS) of a forward at (1, 65536, 512, 8)",
                long.get("peak_mib"),
                "< 1536 MiB",
                ok,
                f"{long.get('time_s', float('nan')):.0f} s; the interpreter, torch and the inputs included",
            )
        )
    else:
        summary.append(
            _row(f"peak memory at (1, {max(lengths)}, 512, 8)", long.get("peak_mib"), None, None, "quick run")
        )
    return {
        "target": "long",
        "title": "2. long context: time and peak memory against L",
        "D": D,
        "H": H,
        "rows": rows,
        "summary": summary,
    }


# ---------------------------------------------------------------------------------------------------------
# 7: the NumPy blocked reference
def target_blocked(mode: Mode) -> dict:
    H, dh, block = 8, 64, 1024
    L = 16384 if mode.full else 4096
    rng = np.random.default_rng(0)
    # equality with the plain mode (which forms L × L weights) at a size where that fits
    Le = 2048
    q, k, v = (rng.standard_normal((2, Le, dh)) for _ in range(3))
    mask = rng.random((Le, Le)) < 0.2
    plain, _ = ref.scaled_dot_product_attention(q, k, v, mask)
    blocked, _ = ref.scaled_dot_product_attention(q, k, v, mask, block_size=256)
    max_diff = float(np.abs(plain - blocked).max())
    # time against torch float32 (flash kernel) on the same q, k, v, in a fresh process with one OpenBLAS
    # thread (see benchmarks/blocked_case.py)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "blocked_case.py"), "--L", str(L), "--H", str(H)]
    cmd += ["--Dh", str(dh), "--block", str(block), "--rounds", str(3 if mode.full else 1)]
    log("  OPENBLAS_NUM_THREADS=1 " + " ".join(cmd[1:]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    case = json.loads(p.stdout.strip().splitlines()[-1])
    res = {
        "rounds": len(case["times_s"]["torch sdpa (float32)"]),
        "number": {n: 1 for n in case["times_s"]},
        "times_s": case["times_s"],
        "median_s": {n: statistics.median(t) for n, t in case["times_s"].items()},
    }
    r = ratio(res, "NumPy blocked (float64)", "torch sdpa (float32)")
    mem = _memcase("reference-blocked", L, D=H * dh, H=H, block=block, env=env)
    summary = [
        _row(
            "blocked vs plain, max abs difference (float64, L=2048, bool mask, block 256)",
            max_diff,
            "≤ 1e-12",
            max_diff <= 1e-12,
        ),
        _row(
            f"L={L}: NumPy blocked time ÷ torch float32 time",
            r,
            "≤ 3",
            r <= 3,
            "NumPy with one OpenBLAS thread, torch with its default threads",
        ),
        _row(
            f"L={L}: peak memory of the NumPy blocked run (process peak RSS, block {block})",
            mem.get("peak_mib"),
            "< 1024 MiB" if L == 16384 else None,
            (mem.get("peak_mib", 1e9) < 1024) if L == 16384 else None,
            "NumPy only (torch not imported); inputs q, k, v float64 included",
        ),
    ]
    return {
        "target": "blocked",
        "title": "7. NumPy blocked reference (online softmax)",
        "H": H,
        "Dh": dh,
        "L": L,
        "block": block,
        "timing": res,
        "case": case,
        "memory": mem,
        "max_diff_vs_plain": max_diff,
        "table": _contenders_table(res, ["torch sdpa (float32)"]),
        "summary": summary,
    }


TARGETS = {
    "forward": target_forward,
    "bf16": target_bf16,
    "decode": target_decode,
    "weights": target_weights,
    "train": target_train,
    "long": target_long,
    "blocked": target_blocked,
}


HISTORY = RESULTS / "history.jsonl"


def _append_history(payload: dict) -> None:
    """One line per full run of a target (its summary rows), so the report can show the run-to-run spread."""
    entry = {
        "written": payload["written"],
        "target": payload["target"],
        "loadavg": payload["machine"]["loadavg_at_start"],
        "summary": [{"metric": r["metric"], "value": r["value"], "pass": r["pass"]} for r in payload["summary"]],
    }
    HISTORY.parent.mkdir(parents=True, exist_ok=True)
    with open(HISTORY, "a") as f:
        f.write(json.dumps(entry) + "\n")


def _print_summary(payload: dict) -> None:
    log(f"== {payload['title']}")
    for row in payload["summary"]:
        v = row["value"]
        vs = f"{v:.4g}" if isinstance(v, float) else str(v)
        status = "" if row["pass"] is None else ("PASS" if row["pass"] else "MISS")
        goal = f"  (goal {row['goal']})" if row["goal"] else ""
        note = f"  [{row['note']}]" if row["note"] else ""
        log(f"   {status:4}  {row['metric']}: {vs}{goal}{note}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--quick", action="store_true", help="few rounds, short lengths (< 3 minutes)")
    g.add_argument("--full", action="store_true", help="all targets; writes docs/performance.md")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(TARGETS)}")
    p.add_argument("--no-docs", action="store_true", help="with --full: do not rewrite docs/performance.md")
    a = p.parse_args(argv)
    mode = Mode(full=a.full)
    names = [n for n in a.only.split(",") if n] or list(TARGETS)
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        p.error(f"--only: unknown targets {unknown}; expected some of {list(TARGETS)}")
    outdir = RESULTS if mode.full else RESULTS / "quick"
    info = machine()
    log(
        f"headwise benchmarks ({'full' if mode.full else 'quick'}) on {info['cpu']}, {info['logical_cpus']} CPUs, "
        f"torch {info['torch']} ({info['torch_threads']} threads), load {info['loadavg_at_start']}"
    )
    t_all = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        payload = TARGETS[name](mode)
        payload.update(
            mode="full" if mode.full else "quick",
            command=command(),
            machine=info,
            seconds=time.perf_counter() - t0,
            written=time.strftime("%Y-%m-%d %H:%M:%S"),
        )
        write_json(outdir / f"{name}.json", payload)
        if mode.full:
            _append_history(payload)
        _print_summary(payload)
    log(f"done in {time.perf_counter() - t_all:.0f} s; results in {outdir.relative_to(ROOT)}/")
    if mode.full and not a.no_docs:
        import report

        report.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
