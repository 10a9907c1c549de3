"""Training step (forward and backward), float32, beside nn.MultiheadAttention and Hugging Face, read
against the best float32 GEMM rate timed in the same rounds."""

from __future__ import annotations

import torch
from machine import log
from peers import build, calls
from row import Row
from timing import compare

from targets.base import Mode, Target, contender_table, flops_mha, fmt
from targets.limits import fraction_of_gemm, gemm_rates, gemms


class Train(Target):
    name = "train"
    title = "training step (forward + backward), float32"
    shape = (8, 512, 768, 12)

    def measure(self, mode: Mode):
        B, L, D, H = self.shape
        mods = build(D, H, peers=("torch", "hf", "article") if mode.full else ("torch", "hf"))
        for mod in mods.values():
            mod.train()
        x = torch.randn(B, L, D, requires_grad=True)
        g = torch.randn(B, L, D)
        fwd = calls(mods, x)

        def step(name):
            def run():
                for p in mods[name].parameters():
                    p.grad = None
                x.grad = None
                (fwd[name]() * g).sum().backward()

            return run

        fns = {**{name: step(name) for name in mods}, **gemms(torch.float32)}
        log(f"train {self.shape}: {list(fns)}")
        res = compare(fns, rounds=mode.rounds + 1, target_s=mode.target_s)
        flops = 3 * flops_mha(B, L, D)  # the backward ≈ twice the forward's products
        frac = fraction_of_gemm(res, "headwise", flops)
        best = max(gemm_rates(res).values()) * 1e9
        ideal = flops / best / res.median_s["torch"]  # headwise's ratio were every FLOP at the best GEMM rate
        rows = [
            Row.at_most(
                "forward + backward: time vs nn.MultiheadAttention",
                res.ratio("headwise", "torch"),
                0.85,
                f"every FLOP at the best GEMM rate would give {ideal:.2f}",
            ),
            Row("forward + backward: time vs HF BertAttention (sdpa)", res.ratio("headwise", "hf")),
            Row("forward + backward: headwise FLOP rate ÷ best float32 GEMM rate", frac),
        ]
        if "article" in res:
            rows.append(Row("forward + backward: time vs article module", res.ratio("headwise", "article")))
        return self.result(
            rows,
            shape=list(self.shape),
            flops=flops,
            timing=res.to_json(),
            table=res.table(["torch", "hf", "article"], flops, names=list(mods)),
            gemm_gflops=gemm_rates(res),
            fraction_of_best_gemm=frac,
            ideal_vs_torch=ideal,
        )

    def render(self, r):
        d = r.data
        gemm = ", ".join(f"{k[5:]} {v:.0f}" for k, v in d["gemm_gflops"].items())
        return contender_table(d["table"]) + [
            "",
            f"FLOPs: 3 × the forward's ({d['flops'] / 1e9:.0f} GFLOP per step). GEMM 2048³ in the same rounds "
            f"(GFLOP/s): {gemm}; headwise at {fmt(d['fraction_of_best_gemm'])} of the best.",
            "",
        ]

    def notes(self, r, results):
        missed = [row for row in r.rows if row.passed is False]
        if not missed:
            return []
        return [
            f"- **training step.** {missed[0].note}: forward and backward are GEMMs and the flash kernel's "
            "backward, the same kernels nn.MultiheadAttention's training path calls."
        ]
