"""need_weights=True: the blocked weights path beside nn.MultiheadAttention, averaged and per head."""

from __future__ import annotations

import torch
from machine import log
from peers import build
from row import Row
from timing import compare

from targets.base import Mode, Target


class Weights(Target):
    name = "weights"
    title = "need_weights=True (float32, eval)"
    shape = (8, 512, 768, 12)

    def measure(self, mode: Mode):
        B, L, D, H = self.shape
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
            log(f"need_weights {self.shape}: {list(fns)}")
            res = compare(fns, rounds=mode.rounds, target_s=mode.target_s)
        rows = [
            Row.at_most(
                "weights averaged over heads: time vs nn.MultiheadAttention",
                res.ratio("headwise avg", "nn.MHA avg"),
                1.0,
            ),
            Row.at_most(
                "per-head weights: time vs nn.MultiheadAttention",
                res.ratio("headwise per-head", "nn.MHA per-head"),
                1.0,
            ),
        ]
        return self.result(
            rows,
            shape=list(self.shape),
            agreement_max_abs=diff,
            timing=res.to_json(),
            table=res.table(["nn.MHA avg", "nn.MHA per-head"]),
        )
