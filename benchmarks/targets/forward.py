"""float32 forward, eval, weights not requested: headwise beside nn.MultiheadAttention, HF and the article,
read against the best float32 GEMM rate timed in the same rounds and the theoretical rate."""

from __future__ import annotations

import statistics

import torch
from machine import log
from peers import build, calls, check_agreement
from row import Row
from timing import compare

from targets.base import Mode, Target, contender_table, flops_mha, fmt
from targets.limits import fraction_of_gemm, gemm_rates, gemms, theoretical_peak

PROJ, SDPA = "kernel: 4 projections (F.linear)", "kernel: SDPA alone"


def kernels(m, x: torch.Tensor) -> dict:
    """The two kernels a forward cannot avoid, timed alone: four (B·L, D) × (D, D) products and SDPA."""
    B, L, D = x.shape
    H = m.num_heads
    ws = [(lin.weight, lin.bias) for lin in (m.Wq, m.Wk, m.Wv, m.Wo)]
    q = torch.randn(B, H, L, D // H, dtype=x.dtype)

    def proj():
        for w, b in ws:
            torch.nn.functional.linear(x, w, b)

    return {PROJ: proj, SDPA: lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)}


class Forward(Target):
    name = "forward"
    title = "float32 forward, eval, weights not requested"
    main_shape = (8, 512, 768, 12)
    long_shape = (1, 4096, 512, 8)

    def measure(self, mode: Mode):
        peak = theoretical_peak(torch.float32)
        cases, rows = [], []
        for B, L, D, H in [self.main_shape, self.long_shape] if mode.full else [self.main_shape]:
            main = self.main_shape == (B, L, D, H)
            mods = build(D, H, peers=("torch", "hf", "article"))
            x = torch.randn(B, L, D)
            diffs = check_agreement(mods, x, atol=1e-4)
            fns = {**calls(mods, x), **kernels(mods["headwise"], x), **gemms(torch.float32)}
            log(f"forward {(B, L, D, H)}: {list(fns)}")
            with torch.inference_mode():
                res = compare(fns, rounds=mode.rounds + 1, target_s=mode.target_s)
            flops = flops_mha(B, L, D)
            frac = fraction_of_gemm(res, "headwise", flops)
            rate = flops / res.median_s["headwise"] / 1e9
            # the time headwise would take were it nothing but its two kernels, over nn.MultiheadAttention's
            floor = statistics.median(
                (p + a) / t for p, a, t in zip(res.times_s[PROJ], res.times_s[SDPA], res.times_s["torch"])
            )
            cases.append(
                {
                    "shape": [B, L, D, H],
                    "flops": flops,
                    "agreement_max_abs": diffs,
                    "timing": res.to_json(),
                    "table": res.table(["torch", "hf", "article"], flops, names=list(mods))
                    + res.table(["torch", "hf", "article"], names=[PROJ, SDPA]),
                    "gemm_gflops": gemm_rates(res),
                    "headwise_gflops": rate,
                    "fraction_of_best_gemm": frac,
                    "fraction_of_peak": rate / peak["gflops"],
                    "peak_gflops": peak["gflops"],
                    "kernels_vs_torch": floor,
                    "kernel_gflops": {
                        PROJ: 8 * B * L * D * D / res.median_s[PROJ] / 1e9,
                        SDPA: 4 * B * L * L * D / res.median_s[SDPA] / 1e9,
                    },
                }
            )
            shape = str((B, L, D, H))
            if main:
                rows += [
                    Row.at_most(f"{shape} time vs nn.MultiheadAttention", res.ratio("headwise", "torch"), 0.48),
                    Row.at_least(
                        f"{shape} headwise FLOP rate ÷ best float32 GEMM rate",
                        frac,
                        0.62,
                        f"{rate:.0f} GFLOP/s; {rate / peak['gflops']:.2f} of the theoretical {peak['gflops']:.0f}",
                    ),
                    Row(f"{shape} time vs HF BertAttention (sdpa)", res.ratio("headwise", "hf")),
                ]
            else:
                rows += [
                    Row.at_most(f"{shape} time vs nn.MultiheadAttention", res.ratio("headwise", "torch"), 1.0),
                    Row(f"{shape} headwise FLOP rate ÷ best float32 GEMM rate", frac, note=f"{rate:.0f} GFLOP/s"),
                ]
        return self.result(rows, cases=cases)

    def render(self, r):
        lines = []
        for case in r.data["cases"]:
            B, L, D, H = case["shape"]
            agree = ", ".join(f"{k} {v:.1e}" for k, v in case["agreement_max_abs"].items())
            gemm = ", ".join(f"{k[5:]} {v:.0f}" for k, v in case["gemm_gflops"].items())
            kern = ", ".join(f"{k[8:]} {v:.0f} GFLOP/s" for k, v in case["kernel_gflops"].items())
            lines += [
                f"(B, L, D, H) = ({B}, {L}, {D}, {H}); {case['flops'] / 1e9:.1f} GFLOP per forward "
                f"(8·B·L·D² + 4·B·L²·D); peers' outputs agree with headwise's to {agree}.",
                "",
                *contender_table(case["table"]),
                "",
                f"GEMM 2048³ in the same rounds (GFLOP/s): {gemm}. headwise: {case['headwise_gflops']:.0f} GFLOP/s = "
                f"**{fmt(case['fraction_of_best_gemm'])} of the best GEMM** (per-round median) and "
                f"{fmt(case['fraction_of_peak'])} of the theoretical {case['peak_gflops']:.0f} GFLOP/s. "
                f"The two kernels alone: {kern}; their sum is {fmt(case['kernels_vs_torch'])} × "
                "nn.MultiheadAttention's time — the floor for any module built on them.",
                "",
            ]
        return lines

    def notes(self, r, results):
        case = r.data["cases"][0]
        missed = [row.metric for row in r.rows if row.passed is False]
        if not missed:
            return []
        kern = ", ".join(f"{k[8:]} {v:.0f} GFLOP/s" for k, v in case["kernel_gflops"].items())
        return [
            f"- **float32 forward** ({'; '.join(missed)}). headwise runs at {case['headwise_gflops']:.0f} GFLOP/s = "
            f"{fmt(case['fraction_of_best_gemm'])} of the best GEMM measured in the same rounds. Its two kernels "
            f"timed alone run at {kern}; headwise's time can be no lower than their sum, which is "
            f"{fmt(case['kernels_vs_torch'])} × nn.MultiheadAttention's time."
        ]
