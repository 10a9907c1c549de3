"""bfloat16 forward: the module in bf16, and the float32 module under autocast; error vs float64."""

from __future__ import annotations

import sys

import numpy as np
import torch
from machine import ROOT, log
from peers import build
from row import Row
from timing import compare

import headwise
import headwise.reference as ref
from targets.base import Mode, Target, contender_table, flops_mha, gemm_call

sys.path.insert(0, str(ROOT / "tests"))
from _helpers import ref_params  # noqa: E402  (the tests' conversion of a module to reference weights)

GEMM32, GEMM16 = "gemm 2048³ fp32", "gemm 2048³ bf16"


def _errors(got: torch.Tensor, want: np.ndarray, batch_items: int) -> dict:
    e = got.double().numpy() - want
    return {
        "rel_fro": float(np.linalg.norm(e) / np.linalg.norm(want)),
        "max_abs": float(np.abs(e).max()),
        "max_abs_over_max_ref": float(np.abs(e).max() / np.abs(want).max()),
        "batch_items": batch_items,
    }


class BF16(Target):
    name = "bf16"
    title = "bfloat16 forward (module in bf16, and float32 module under autocast)"
    shape = (8, 512, 768, 12)

    def measure(self, mode: Mode):
        B, L, D, H = self.shape
        m32 = build(D, H, peers=("torch",))
        hw32, t32 = m32["headwise"], m32["torch"]
        hw16 = headwise.MultiHeadAttention(D, H, dtype=torch.bfloat16).eval()
        hw16.load_state_dict(hw32.state_dict())
        t16 = headwise.interop.to_torch(hw16).eval()
        x = torch.randn(B, L, D)
        x16 = x.bfloat16()

        def autocast_fwd(x=x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return hw32(x)[0]

        fns = {
            "nn.MHA fp32": lambda: t32(x, x, x, need_weights=False)[0],
            "headwise bf16": lambda: hw16(x16)[0],
            "headwise fp32 + autocast": autocast_fwd,
            "nn.MHA bf16": lambda: t16(x16, x16, x16, need_weights=False)[0],
            GEMM32: gemm_call(),
            GEMM16: gemm_call(dtype=torch.bfloat16),
        }
        log(f"bf16 {self.shape}: {list(fns)}")
        nb = B if mode.full else 2
        with torch.inference_mode():
            res = compare(fns, rounds=mode.rounds, target_s=mode.target_s)
            # error against the float64 NumPy reference on the same weights and inputs
            want, _ = ref.multi_head_attention(x[:nb].double().numpy(), ref_params(hw32), H)
            errs = {
                "headwise bf16": _errors(hw16(x16[:nb])[0], want, nb),
                "headwise fp32 + autocast": _errors(autocast_fwd(x[:nb]), want, nb),
                "headwise fp32": _errors(hw32(x[:nb])[0], want, nb),
            }
        gemm_speedup = res.ratio(GEMM32, GEMM16)
        e16 = errs["headwise bf16"]
        rows = [
            Row.at_least(
                "speed-up of headwise bf16 over nn.MHA fp32",
                1 / res.ratio("headwise bf16", "nn.MHA fp32"),
                5,
                f"bf16 GEMM is {gemm_speedup:.2f} × the fp32 GEMM rate here",
            ),
            Row.at_least(
                "speed-up of headwise fp32 + autocast over nn.MHA fp32",
                1 / res.ratio("headwise fp32 + autocast", "nn.MHA fp32"),
                5,
            ),
            Row("speed-up of headwise bf16 over nn.MHA bf16", 1 / res.ratio("headwise bf16", "nn.MHA bf16")),
            Row.at_most(
                "bf16 error ‖err‖/‖ref‖ vs float64 reference",
                e16["rel_fro"],
                1e-2,
                shown="< 1e-2 (the bound tests/core/test_fast_paths.py holds)",
            ),
            Row.at_most(
                "bf16 error max|err| / max|ref|", e16["max_abs_over_max_ref"], 2e-2, shown="< 2e-2 (test bound)"
            ),
        ]
        contenders = [n for n in fns if not n.startswith("gemm")]
        return self.result(
            rows,
            shape=list(self.shape),
            timing=res.to_json(),
            table=res.table(["nn.MHA fp32", "nn.MHA bf16"], flops_mha(B, L, D), names=contenders),
            gemm_gflops={k[11:]: 2 * 2048**3 / v / 1e9 for k, v in res.median_s.items() if k.startswith("gemm")},
            gemm_bf16_speedup=gemm_speedup,
            error_vs_float64_reference=errs,
        )

    def render(self, r):
        errs = r.data["error_vs_float64_reference"]
        lines = contender_table(r.data["table"]) + [""]
        lines += [
            "Error against the float64 NumPy reference (same weights and inputs, "
            f"{errs['headwise bf16']['batch_items']} batch items):",
            "",
            "| path | ‖err‖/‖ref‖ | max abs err | max abs err ÷ max abs ref |",
            "|---|---|---|---|",
        ]
        for k, e in errs.items():
            lines.append(f"| {k} | {e['rel_fro']:.2e} | {e['max_abs']:.2e} | {e['max_abs_over_max_ref']:.2e} |")
        return lines + [
            "",
            "`tests/core/test_fast_paths.py::test_bf16_error_against_float64_reference_is_bounded` holds "
            "both bf16 paths to ‖err‖/‖ref‖ < 1e-2 and max|err|/max|ref| < 2e-2 at (2, 128, 256, 4).",
            "",
        ]

    def notes(self, r, results):
        if not any(row.passed is False and "over nn.MHA fp32" in row.metric for row in r.rows):
            return []
        amx = "with" if any(f.startswith("amx") for f in r.run.get("machine", {}).get("cpu_flags", [])) else "no"
        speedup = r.data["gemm_bf16_speedup"]
        bound = ""
        fwd = results.get("forward")
        ideal = fwd.data["cases"][0].get("ideal_vs_torch") if fwd else None
        if ideal:
            bound = (
                f" Even with every FLOP at the bf16 GEMM rate the speed-up would be {speedup / ideal:.1f} × (the "
                f"bf16/fp32 GEMM ratio divided by the float32 forward's ideal ratio {ideal:.2f})."
            )
        return [
            f"- **bf16.** Here a bf16 GEMM runs at {speedup:.2f} × the float32 GEMM rate ({amx} AMX); a 5 × "
            "speed-up needs AMX (bf16 GEMM about 6.5 × the float32 rate)." + bound
        ]
