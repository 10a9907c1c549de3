"""The machine's limits in one table: theoretical FLOP rates, every GEMM library's rate, read bandwidth.

Each other target times the anchors it is read against in its own rounds; this one states them all
together, with how the theoretical rate is computed (see ``benchmarks/limits.py``).
"""

from __future__ import annotations

import statistics

import torch
from limits import GEMM_FLOPS, READ, READ_BYTES, bandwidth_per_round, gemm_rates, gemms, numpy_blas, read
from limits import theoretical_peak as peak
from machine import log
from row import Row
from timing import compare

from targets.base import Mode, Target, md_row


class Limits(Target):
    name = "limits"
    title = "the machine's limits: theoretical FLOP rate, GEMM rates, read bandwidth"

    def measure(self, mode: Mode):
        fns = {**gemms(torch.float32), **gemms(torch.bfloat16), **read()}
        log(f"limits: {list(fns)}")
        with torch.inference_mode():
            res = compare(fns, rounds=mode.rounds + 1, target_s=mode.target_s)
        p32, p16 = peak(torch.float32), peak(torch.bfloat16)
        rates = gemm_rates(res)
        best32 = max((n for n in rates if not n.endswith("bf16")), key=rates.get)
        best16 = max((n for n in rates if n.endswith("bf16")), key=rates.get)
        bw = statistics.median(bandwidth_per_round(res)) / 1e9
        rows = [
            Row("theoretical float32 FLOP rate (GFLOP/s)", p32["gflops"], note=p32["how"]),
            Row("theoretical bfloat16 FLOP rate (GFLOP/s)", p16["gflops"], note=p16["how"]),
            Row(
                "best float32 GEMM 2048³ (GFLOP/s)",
                rates[best32],
                note=f"{best32[5:]}; {rates[best32] / p32['gflops']:.2f} of the theoretical rate",
            ),
            Row(
                "best bfloat16 GEMM 2048³ (GFLOP/s)",
                rates[best16],
                note=f"{best16[5:]}; {rates[best16] / p16['gflops']:.2f} of the theoretical rate",
            ),
            Row("read bandwidth (GB/s)", bw, note="torch.sum over 1 GiB of float32"),
        ]
        return self.result(
            rows,
            peak={"float32": p32, "bfloat16": p16},
            gemm_gflops=rates,
            read_gb_s=bw,
            read_bytes=READ_BYTES,
            gemm_flops=GEMM_FLOPS,
            numpy_blas=numpy_blas(),
            timing=res.to_json(),
            table=res.table([], names=[n for n in fns if n != READ]),
        )

    def render(self, r):
        d = r.data
        lines = [
            "| limit | value | how |",
            "|---|---|---|",
            md_row(
                [
                    "theoretical float32 rate",
                    f"{d['peak']['float32']['gflops']:.0f} GFLOP/s",
                    d["peak"]["float32"]["how"],
                ]
            ),
            md_row(
                [
                    "theoretical bfloat16 rate",
                    f"{d['peak']['bfloat16']['gflops']:.0f} GFLOP/s",
                    d["peak"]["bfloat16"]["how"],
                ]
            ),
        ]
        for name, rate in d["gemm_gflops"].items():
            dtype = "bfloat16" if name.endswith("bf16") else "float32"
            frac = rate / d["peak"][dtype]["gflops"]
            lib = f" ({d['numpy_blas']})" if "NumPy" in name else ""
            lines.append(
                md_row([f"{name}{lib}", f"{rate:.0f} GFLOP/s", f"2048³ product, {frac:.2f} of the theoretical rate"])
            )
        lines.append(md_row(["read bandwidth", f"{d['read_gb_s']:.1f} GB/s", "`torch.sum` over 1 GiB of float32"]))
        return lines + [""]
