"""bfloat16 forward: the module in bf16 (and the float32 module under autocast) against the best bf16 GEMM
timed in the same rounds, its speed-up over float32 nn.MultiheadAttention, and its error against float64."""

from __future__ import annotations

import statistics
import sys

import numpy as np
import torch
from machine import ROOT, log
from peers import build
from row import Row
from timing import compare

import headwise
import headwise.reference as ref
from targets.base import Mode, Target, contender_table, flops_mha, fmt
from targets.forward import PROJ, SDPA, kernels
from targets.limits import fraction_of_gemm, gemm_rates, gemms, theoretical_peak

sys.path.insert(0, str(ROOT / "tests"))
from _helpers import ref_params  # noqa: E402  (the tests' conversion of a module to reference weights)

HW16, AUTOCAST, T32, T16 = "headwise bf16", "headwise fp32 + autocast", "nn.MHA fp32", "nn.MHA bf16"


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
            HW16: lambda: hw16(x16)[0],
            T32: lambda: t32(x, x, x, need_weights=False)[0],
            T16: lambda: t16(x16, x16, x16, need_weights=False)[0],
            AUTOCAST: autocast_fwd,
            **kernels(hw16, x16),
            **gemms(torch.bfloat16),
        }
        log(f"bf16 {self.shape}: {list(fns)}")
        nb = B if mode.full else 2
        with torch.inference_mode():
            res = compare(fns, rounds=mode.rounds + 1, target_s=mode.target_s)
            # error against the float64 NumPy reference on the same weights and inputs
            want, _ = ref.multi_head_attention(x[:nb].double().numpy(), ref_params(hw32), H)
            errs = {
                HW16: _errors(hw16(x16[:nb])[0], want, nb),
                AUTOCAST: _errors(autocast_fwd(x[:nb]), want, nb),
                "headwise fp32": _errors(hw32(x[:nb])[0], want, nb),
            }
        flops = flops_mha(B, L, D)
        peak = theoretical_peak(torch.bfloat16)
        frac = fraction_of_gemm(res, HW16, flops, " bf16")
        rate = flops / res.median_s[HW16] / 1e9
        floor = statistics.median(
            (p + a) / t for p, a, t in zip(res.times_s[PROJ], res.times_s[SDPA], res.times_s[HW16])
        )
        e16 = errs[HW16]
        rows = [
            Row.at_least(
                "headwise bf16 FLOP rate ÷ best bf16 GEMM rate",
                frac,
                0.55,
                f"{rate:.0f} GFLOP/s; {rate / peak['gflops']:.2f} of the theoretical {peak['gflops']:.0f}",
            ),
            Row("speed-up of headwise bf16 over nn.MHA fp32", 1 / res.ratio(HW16, T32)),
            Row("speed-up of headwise bf16 over nn.MHA bf16", 1 / res.ratio(HW16, T16)),
            Row("speed-up of headwise fp32 + autocast over nn.MHA fp32", 1 / res.ratio(AUTOCAST, T32)),
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
        return self.result(
            rows,
            shape=list(self.shape),
            timing=res.to_json(),
            table=res.table([T32, T16], flops, names=[HW16, T32, T16, AUTOCAST])
            + res.table([T32, T16], names=[PROJ, SDPA]),
            gemm_gflops=gemm_rates(res),
            headwise_gflops=rate,
            fraction_of_best_gemm=frac,
            peak=peak,
            kernel_gflops={
                PROJ: 8 * B * L * D * D / res.median_s[PROJ] / 1e9,
                SDPA: 4 * B * L * L * D / res.median_s[SDPA] / 1e9,
            },
            kernels_vs_headwise=floor,
            error_vs_float64_reference=errs,
        )

    def render(self, r):
        d = r.data
        errs = d["error_vs_float64_reference"]
        gemm = ", ".join(f"{k[5:]} {v:.0f}" for k, v in d["gemm_gflops"].items())
        kern = ", ".join(f"{k[8:]} {v:.0f} GFLOP/s" for k, v in d["kernel_gflops"].items())
        lines = contender_table(d["table"]) + [
            "",
            f"bf16 GEMM 2048³ in the same rounds (GFLOP/s): {gemm}; theoretical bf16 rate {d['peak']['gflops']:.0f} "
            f"({d['peak']['how']}). headwise bf16: {d['headwise_gflops']:.0f} GFLOP/s = "
            f"**{fmt(d['fraction_of_best_gemm'])} of the best bf16 GEMM**. Its two kernels alone in bf16: {kern} "
            f"(their sum is {fmt(d['kernels_vs_headwise'])} × headwise's time).",
            "",
            "Error against the float64 NumPy reference (same weights and inputs, "
            f"{errs[HW16]['batch_items']} batch items):",
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
        d = r.data
        if not any(row.passed is False for row in r.rows):
            return []
        kern = ", ".join(f"{k[8:]} {v:.0f} GFLOP/s" for k, v in d["kernel_gflops"].items())
        best = max(d["gemm_gflops"].values())
        return [
            f"- **bf16.** headwise bf16 runs at {d['headwise_gflops']:.0f} GFLOP/s = {fmt(d['fraction_of_best_gemm'])} "
            f"of the best bf16 GEMM ({best:.0f} GFLOP/s; theoretical {d['peak']['gflops']:.0f}: {d['peak']['how']}). "
            f"Its kernels alone in bf16: {kern}."
        ]
