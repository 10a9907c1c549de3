"""float32 forward, eval, weights not requested: headwise beside nn.MultiheadAttention, HF and the article."""

from __future__ import annotations

import torch
from machine import log
from peers import build, calls, check_agreement
from row import Row
from timing import compare

from targets.base import Mode, Target, contender_table, flops_mha, gemm_call

GEMM = "gemm 2048³"
GEMM_FLOPS = 2 * 2048**3


class Forward(Target):
    name = "forward"
    title = "float32 forward, eval, weights not requested"
    shapes = [(8, 512, 768, 12), (1, 4096, 512, 8)]

    def measure(self, mode: Mode):
        cases, rows = [], []
        for i, (B, L, D, H) in enumerate(self.shapes):
            first = i == 0
            mods = build(D, H, peers=("torch", "hf", "article") if first or mode.full else ("torch", "article"))
            x = torch.randn(B, L, D)
            diffs = check_agreement(mods, x, atol=1e-4)
            fns = calls(mods, x)
            if first:
                fns[GEMM] = gemm_call()
            log(f"forward {(B, L, D, H)}: {list(fns)}")
            with torch.inference_mode():
                res = compare(fns, rounds=mode.rounds + (1 if first else 0), target_s=mode.target_s)
            flops = flops_mha(B, L, D)
            case = {
                "shape": [B, L, D, H],
                "flops": flops,
                "agreement_max_abs": diffs,
                "timing": res.to_json(),
                "table": res.table(["torch", "hf", "article"], flops, names=list(mods)),
            }
            shape = str((B, L, D, H))
            r_hf = res.ratio("headwise", "hf") if "hf" in res else None
            if first:
                frac = res.paired("headwise", GEMM, lambda th, tg, flops=flops: (flops / th) / (GEMM_FLOPS / tg))
                # the ratio headwise would have if every one of its FLOPs ran at the measured GEMM rate
                ideal = res.paired(GEMM, "torch", lambda tg, tt, flops=flops: (flops / (GEMM_FLOPS / tg)) / tt)
                gemm_rate = GEMM_FLOPS / res.median_s[GEMM] / 1e9
                hw_rate = flops / res.median_s["headwise"] / 1e9
                case.update(gemm_gflops=gemm_rate, headwise_gflops=hw_rate, fraction_of_gemm=frac, ideal_vs_torch=ideal)
                rows += [
                    Row.at_most(f"{shape} time vs nn.MultiheadAttention", res.ratio("headwise", "torch"), 0.60),
                    Row.at_most(f"{shape} time vs HF BertAttention (sdpa)", r_hf, 0.95),
                    Row(f"{shape} time vs article module", res.ratio("headwise", "article")),
                    Row.at_least(
                        f"{shape} headwise GFLOP/s ÷ fp32 GEMM (2048³) GFLOP/s",
                        frac,
                        0.75,
                        f"{hw_rate:.0f} of {gemm_rate:.0f} GFLOP/s (medians)",
                    ),
                ]
            else:
                rows += [
                    Row.at_most(f"{shape} time vs nn.MultiheadAttention", res.ratio("headwise", "torch"), 1.0),
                    Row(f"{shape} time vs HF BertAttention (sdpa)", r_hf),
                    Row(f"{shape} time vs article module", res.ratio("headwise", "article")),
                ]
            cases.append(case)
        return self.result(rows, cases=cases)

    def render(self, r):
        lines = []
        for case in r.data["cases"]:
            B, L, D, H = case["shape"]
            agree = ", ".join(f"{k} {v:.1e}" for k, v in case["agreement_max_abs"].items())
            lines += [
                f"(B, L, D, H) = ({B}, {L}, {D}, {H}); {case['flops'] / 1e9:.1f} GFLOP per forward "
                f"(8·B·L·D² + 4·B·L²·D); peers' outputs agree with headwise's to {agree}.",
                "",
                *contender_table(case["table"]),
                "",
            ]
            if "gemm_gflops" in case:
                lines += [
                    f"float32 GEMM (2048³, `torch.mm`, timed in the same rounds): {case['gemm_gflops']:.0f} "
                    f"GFLOP/s; headwise reaches {case['headwise_gflops']:.0f} GFLOP/s = "
                    f"{case['fraction_of_gemm']:.2f} of it.",
                    "",
                ]
        return lines

    def notes(self, r, results):
        fwd = r.data["cases"][0]
        missed = [row for row in r.rows if row.passed is False and "time vs nn.MultiheadAttention" in row.metric]
        if not missed or "fraction_of_gemm" not in fwd:
            return []
        return [
            f"- **float32 forward.** headwise runs at {fwd['fraction_of_gemm']:.2f} × the float32 GEMM rate "
            f"measured in the same rounds ({fwd['headwise_gflops']:.0f} of {fwd['gemm_gflops']:.0f} GFLOP/s): it "
            "is bound by the floating-point rate. Had every one of its FLOPs run at the GEMM rate, its time would "
            f"be {fwd['ideal_vs_torch']:.2f} × nn.MultiheadAttention's, so ≤ 0.6 × needs nn.MultiheadAttention to "
            "waste more than this machine lets it (its fast path uses the same GEMMs; what it adds is a "
            "materialised (B·H, L, L) softmax, the bias-and-rescale pass and copies)."
        ]
