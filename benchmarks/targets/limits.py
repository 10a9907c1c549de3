"""The machine's own limits, which every headwise figure is read against: how each is measured, and the
``limits`` target that states them all in one table (theoretical FLOP rates, every GEMM library's rate, read
bandwidth). Each other target times the anchors it is read against in its own rounds, with these functions.

- **Theoretical FLOP rate** = cores × clock × FLOP per cycle per core. Cores: the CPUs this process may run
  on (``os.sched_getaffinity``); clock: ``cpu MHz`` of ``/proc/cpuinfo``; FLOP per cycle: float32 lanes of
  the widest vector unit (16 with AVX-512, 8 with AVX2) × 2 (a fused multiply-add is two FLOPs) × the FMA
  pipes per core. The pipe count is not in ``/proc/cpuinfo``; it is taken from the microarchitecture:
  2 full-width pipes for AMD Zen 5 (family 26) and for Intel Xeons with AVX-512, and 512-bit operations
  split over two 256-bit pipes on AMD Zen 4 (family 25, so 8 effective lanes). bfloat16: twice the float32
  rate with ``avx512_bf16`` (``vdpbf16ps`` does two products per float32 lane), 1024 FLOP per cycle per core
  with AMX, and otherwise the float32 rate (bf16 is widened to float32 to compute).
- **Best GEMM rate**: 2048³ products by ``torch.mm`` (MKL or oneDNN), the oneDNN linear
  (``torch.ops.mkldnn._linear_pointwise``, bias in the epilogue) and NumPy's BLAS (float32 only), timed
  in the same alternating rounds as what is compared with them; per round the fastest of them counts.
- **Read bandwidth**: ``torch.sum`` over a 1 GiB float32 tensor (far beyond the last-level cache), in the
  same rounds; a memory-bound kernel (one decoded token) can at best read its bytes at this rate.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable

import numpy as np
import torch
from machine import cpu_flags, cpuinfo, log
from row import Row
from timing import Timing, compare

from targets.base import Mode, Target, md_row

N = 2048
GEMM_FLOPS = 2 * N**3
READ = "read 1 GiB"
READ_BYTES = 2**30


def theoretical_peak(dtype: torch.dtype = torch.float32) -> dict:
    """``{"gflops", "cores", "ghz", "flop_per_cycle", "how"}`` for float32 or bfloat16 (see the module doc)."""
    flags = set(cpu_flags())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ghz = float(cpuinfo("cpu MHz") or 0) / 1e3
    family = cpuinfo("cpu family")
    amd = (cpuinfo("vendor_id") or "").startswith("AuthenticAMD")
    if "avx512f" in flags and not (amd and family == "25"):
        lanes, unit = 16, "AVX-512: 16 float32 lanes"
    elif "avx512f" in flags:
        lanes, unit = 8, "AVX-512 on two 256-bit halves (Zen 4): 8 effective float32 lanes"
    elif "avx2" in flags:
        lanes, unit = 8, "AVX2: 8 float32 lanes"
    else:
        lanes, unit = 4, "SSE: 4 float32 lanes"
    per_cycle, how = lanes * 2 * 2, f"{unit} × 2 (FMA) × 2 FMA pipes"
    if dtype == torch.bfloat16:
        if any(f.startswith("amx_bf16") for f in flags):
            per_cycle, how = 1024, "AMX tiles: 1024 bf16 FLOP per cycle"
        elif "avx512_bf16" in flags:
            per_cycle, how = 2 * per_cycle, f"avx512_bf16: 2 × ({how})"
        else:
            how += "; no bf16 instructions (no avx512_bf16, no AMX), so bf16 computes at the float32 rate"
    return {
        "gflops": cores * ghz * per_cycle,
        "cores": cores,
        "ghz": ghz,
        "flop_per_cycle": per_cycle,
        "how": f"{cores} cores × {ghz:.2f} GHz × {per_cycle} FLOP/cycle ({how})",
    }


def _onednn_linear(a: torch.Tensor, b: torch.Tensor) -> Callable[[], object] | None:
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
    if op is None:
        return None
    bias = torch.zeros(N, dtype=a.dtype)
    return lambda: op(a, b, bias, "none", [], "")


def gemms(dtype: torch.dtype = torch.float32) -> dict[str, Callable[[], object]]:
    """Zero-argument 2048³ products, one per library: ``{"gemm torch.mm", "gemm oneDNN linear", "gemm NumPy"}``.

    Named with the dtype for bfloat16 (``"gemm torch.mm bf16"``); NumPy has no bf16 BLAS.
    """
    a, b = torch.randn(N, N).to(dtype), torch.randn(N, N).to(dtype)
    tag = "" if dtype == torch.float32 else " bf16"
    out = {f"gemm torch.mm{tag}": lambda: a @ b}
    linear = _onednn_linear(a, b)
    if linear is not None:
        out[f"gemm oneDNN linear{tag}"] = linear
    if dtype == torch.float32:
        an, bn = a.numpy(), b.numpy()
        out["gemm NumPy"] = lambda: an @ bn
    return out


def read() -> dict[str, Callable[[], object]]:
    """``{"read 1 GiB": sum of a 1 GiB float32 tensor}``: the read-bandwidth anchor."""
    x = torch.ones(READ_BYTES // 4)
    return {READ: lambda: x.sum()}


def gemm_names(t: Timing) -> list[str]:
    return [n for n in t.times_s if n.startswith("gemm ")]


def best_gemm_per_round(t: Timing, dtype_tag: str = "") -> list[float]:
    """Per round, the fastest GEMM rate (FLOP/s) among the anchors of one dtype (``""`` float32, ``" bf16"``)."""
    names = [n for n in gemm_names(t) if n.endswith(" bf16") == (dtype_tag == " bf16")]
    return [max(GEMM_FLOPS / t.times_s[n][r] for n in names) for r in range(t.rounds)]


def fraction_of_gemm(t: Timing, name: str, flops: float, dtype_tag: str = "") -> float:
    """Median over rounds of ``name``'s FLOP rate ÷ the best GEMM rate of the same round."""
    best = best_gemm_per_round(t, dtype_tag)
    return statistics.median(flops / t.times_s[name][r] / best[r] for r in range(t.rounds))


def gemm_rates(t: Timing) -> dict[str, float]:
    """Median GFLOP/s of each GEMM anchor."""
    return {n: GEMM_FLOPS / s / 1e9 for n, s in t.median_s.items() if n.startswith("gemm ")}


def bandwidth_per_round(t: Timing) -> list[float]:
    """Read bandwidth (bytes/s) of each round."""
    return [READ_BYTES / s for s in t.times_s[READ]]


def fraction_of_roofline(t: Timing, name: str, nbytes: float) -> float:
    """Median over rounds of (``nbytes`` at the round's read bandwidth) ÷ ``name``'s time: 1 = at the roofline."""
    bw = bandwidth_per_round(t)
    return statistics.median(nbytes / bw[r] / t.times_s[name][r] for r in range(t.rounds))


def numpy_blas() -> str:
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001 - NumPy versions differ in what they report
        return "unknown"


class Limits(Target):
    name = "limits"
    title = "the machine's limits: theoretical FLOP rate, GEMM rates, read bandwidth"

    def measure(self, mode: Mode):
        fns = {**gemms(torch.float32), **gemms(torch.bfloat16), **read()}
        log(f"limits: {list(fns)}")
        with torch.inference_mode():
            res = compare(fns, rounds=mode.rounds + 1, target_s=mode.target_s)
        p32, p16 = theoretical_peak(torch.float32), theoretical_peak(torch.bfloat16)
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
