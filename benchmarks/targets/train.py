"""Training step (forward and backward), float32, beside nn.MultiheadAttention and Hugging Face."""

from __future__ import annotations

import torch
from machine import log
from peers import build, calls
from row import Row
from timing import compare

from targets.base import Mode, Target, flops_mha, gemm_call

GEMM = "gemm 2048³"
GEMM_FLOPS = 2 * 2048**3


class Train(Target):
    name = "train"
    title = "training step (forward + backward), float32"
    shape = (8, 512, 768, 12)

    def measure(self, mode: Mode):
        B, L, D, H = self.shape
        mods = build(D, H, peers=("torch", "hf", "article") if mode.full else ("torch",))
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

        fns = {name: step(name) for name in mods}
        fns[GEMM] = gemm_call()
        log(f"train {self.shape}: {list(fns)}")
        res = compare(fns, rounds=mode.rounds, target_s=mode.target_s)
        flops = 3 * flops_mha(B, L, D)  # backward ≈ twice the forward's products
        ideal = res.paired(GEMM, "torch", lambda tg, tt: (flops / (GEMM_FLOPS / tg)) / tt)
        rows = [
            Row.at_most(
                "forward + backward: time vs nn.MultiheadAttention",
                res.ratio("headwise", "torch"),
                0.70,
                f"all 3 × forward FLOPs at the GEMM rate would give {ideal:.2f}",
            ),
            Row(
                "forward + backward: time vs HF BertAttention (sdpa)",
                res.ratio("headwise", "hf") if "hf" in res else None,
            ),
            Row(
                "forward + backward: time vs article module",
                res.ratio("headwise", "article") if "article" in res else None,
            ),
        ]
        return self.result(
            rows,
            shape=list(self.shape),
            timing=res.to_json(),
            table=res.table(["torch", "hf", "article"], flops, names=list(mods)),
            gemm_gflops=GEMM_FLOPS / res.median_s[GEMM] / 1e9,
        )

    def notes(self, r, results):
        missed = [row for row in r.rows if row.passed is False]
        if not missed:
            return []
        return [
            f"- **training step.** {missed[0].note}: forward and backward are GEMMs and the flash kernel's "
            "backward, the same kernels nn.MultiheadAttention's training path calls (it also uses SDPA when "
            "weights are not requested), so the only room is its extra copies."
        ]
