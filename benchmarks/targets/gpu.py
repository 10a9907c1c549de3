"""The GPU: bf16 attention TFLOP/s per SDPA backend (L up to 32k), and the module on the device.

Measured by ``benchmarks/run.py --gpu`` on a CUDA machine (``--quick`` and ``--full`` skip it). It times
with CUDA events (warm-up, then the median of several timed calls):

- a bf16 GEMM (8192³) — the achievable matrix rate — and the nominal dense bf16 peak of the GPU by name;
- ``F.scaled_dot_product_attention`` forward (and forward + backward) in bf16 at B·L = 32k tokens,
  H = 16, Dh = 128, L from 1k to 32k, non-causal and causal, for each backend (flash, cuDNN,
  memory-efficient) and for torch's own choice, with the kernel names the default choice launched;
- ``headwise.MultiHeadAttention`` (bf16, D = 2048, H = 16) against ``nn.MultiheadAttention`` with the same
  weights (forward, weights not requested), their agreement, and the kernels headwise launched — which
  shows that headwise takes the flash / cuDNN path on CUDA.

FLOPs: 4·B·H·L²·Dh for an attention forward (half of it causal); forward + backward counts 3.5 × that
(the backward recomputes the scores: 2.5 × the forward). Goal: ≥ 60% of the GPU's bf16 peak.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from row import Row

import headwise
from targets.base import Target, fmt

# Nominal dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from the vendors' data sheets.
PEAKS = [
    ("H200", 989.4),
    ("H100 SXM", 989.4),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 756.0),
    ("GH200", 989.4),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.1),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.2),
    ("RTX 3090", 71.0),
]


def nominal_peak(name: str) -> float | None:
    for key, peak in PEAKS:
        if key.lower() in name.lower():
            return peak
    return None


def cuda_time(fn, *, warmup: int = 3, reps: int = 10) -> float:
    """Median seconds per call of ``fn`` (CUDA events around each call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def kernel_names(fn) -> list[str]:
    """Names of the CUDA kernels one call of ``fn`` launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    events = list(p.key_averages())
    names = [e.key for e in events if "CUDA" in str(getattr(e, "device_type", ""))]
    return sorted(set(names or [e.key for e in events]))


def _backends():
    from torch.nn.attention import SDPBackend

    out = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        out.insert(1, ("cudnn", SDPBackend.CUDNN_ATTENTION))
    return out


def attention_rates(peak: float | None, lengths: list[int], tokens: int, H: int, Dh: int, reps: int) -> list[dict]:
    from torch.nn.attention import sdpa_kernel

    rows = []
    dev = torch.device("cuda")
    for L in lengths:
        B = max(1, tokens // L)
        q, k, v = (torch.randn(B, H, L, Dh, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn(B, H, L, Dh, device=dev, dtype=torch.bfloat16)
        for causal in (False, True):
            flops = 4 * B * H * L * L * Dh * (0.5 if causal else 1.0)
            for name, backend in [("auto", None), *_backends()]:
                row = {"L": L, "B": B, "H": H, "Dh": Dh, "causal": causal, "backend": name}

                def fwd(q=q, k=k, v=v, causal=causal):
                    with torch.no_grad():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def fwd_bwd(q=q, k=k, v=v, g=g, causal=causal):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    out.backward(g)

                try:
                    if backend is None:
                        t = cuda_time(fwd, reps=reps)
                        tb = cuda_time(fwd_bwd, warmup=2, reps=max(3, reps // 2))
                    else:
                        with sdpa_kernel([backend]):
                            t = cuda_time(fwd, reps=reps)
                            tb = cuda_time(fwd_bwd, warmup=2, reps=max(3, reps // 2))
                except Exception as e:  # noqa: BLE001 - a backend not available for this shape / build
                    row["error"] = str(e).splitlines()[0][:200]
                    rows.append(row)
                    continue
                q.grad = k.grad = v.grad = None
                row.update(
                    time_ms=t * 1e3,
                    tflops=flops / t / 1e12,
                    fwd_bwd_ms=tb * 1e3,
                    fwd_bwd_tflops=3.5 * flops / tb / 1e12,
                )
                if peak:
                    row["fraction_of_peak"] = row["tflops"] / peak
                    row["fwd_bwd_fraction_of_peak"] = row["fwd_bwd_tflops"] / peak
                rows.append(row)
                print(
                    f"  L={L:6d} B={B:3d} causal={causal!s:5} {name:9s} "
                    + (
                        f"{row['tflops']:7.1f} TFLOP/s fwd, {row['fwd_bwd_tflops']:7.1f} fwd+bwd"
                        if "tflops" in row
                        else row.get("error", "")
                    ),
                    flush=True,
                )
        q = k = v = g = None
        torch.cuda.empty_cache()
    return rows


def module_check(reps: int) -> dict:
    """headwise.MultiHeadAttention vs nn.MultiheadAttention on the GPU, bf16, same weights."""
    from headwise.interop import to_torch

    dev = torch.device("cuda")
    out = {}
    for B, L, D, H in ((8, 2048, 2048, 16), (1, 32768, 2048, 16)):
        torch.manual_seed(0)
        m = headwise.MultiHeadAttention(D, H, device=dev, dtype=torch.bfloat16).eval()
        t = to_torch(m).eval()
        x = torch.randn(B, L, D, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            a = m(x)[0]
            b = t(x, x, x, need_weights=False)[0]
            c = m(x, is_causal=True)[0]
            pad = torch.zeros(B, L, dtype=torch.bool, device=dev)
            pad[:, L // 2 :] = True
            d = m(x, key_padding_mask=pad)[0]  # a mask: SDPA with a boolean mask on the GPU
            agree = float((a.float() - b.float()).abs().max() / b.float().abs().max())
            th = cuda_time(lambda m=m, x=x: m(x), reps=reps)
            tt = cuda_time(lambda t=t, x=x: t(x, x, x, need_weights=False), reps=reps)
            tc = cuda_time(lambda m=m, x=x: m(x, is_causal=True), reps=reps)
            kernels = kernel_names(lambda m=m, x=x: m(x))
        flops = 8 * B * L * D * D + 4 * B * L * L * D
        key = f"{B}x{L}x{D}x{H}"
        out[key] = {
            "shape": [B, L, D, H],
            "headwise_ms": th * 1e3,
            "torch_ms": tt * 1e3,
            "ratio_vs_torch": th / tt,
            "headwise_causal_ms": tc * 1e3,
            "headwise_tflops": flops / th / 1e12,
            "max_rel_diff_vs_torch": agree,
            "finite_with_padding_and_causal": bool(torch.isfinite(c).all() and torch.isfinite(d).all()),
            "attention_kernels": [
                n for n in kernels if any(s in n.lower() for s in ("flash", "cudnn", "fmha", "attention", "sdpa"))
            ],
        }
        print(
            f"  module {key}: headwise {th * 1e3:.2f} ms, nn.MHA {tt * 1e3:.2f} ms, ratio {th / tt:.3f}, "
            f"max rel diff {agree:.1e}; attention kernels {out[key]['attention_kernels']}",
            flush=True,
        )
        m = t = x = None
        torch.cuda.empty_cache()
    return out


class GPU(Target):
    name = "gpu"
    title = "GPU: bf16 attention TFLOP/s per SDPA backend, and the module"

    def __init__(self, max_len: int = 32768, reps: int = 10):
        self.max_len, self.reps = max_len, reps

    def measure(self, mode=None):
        torch.backends.cuda.matmul.allow_tf32 = False
        name = torch.cuda.get_device_name()
        peak = nominal_peak(name)
        print(
            f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}",
            flush=True,
        )
        n = 8192
        ga, gb = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        gemm = 2 * n**3 / cuda_time(lambda: ga @ gb, warmup=5, reps=20) / 1e12
        ga = gb = None
        print(f"bf16 GEMM {n}³: {gemm:.0f} TFLOP/s; nominal peak {peak} TFLOP/s", flush=True)
        lengths = [L for L in (1024, 2048, 4096, 8192, 16384, 32768) if self.max_len >= L]
        att = attention_rates(peak, lengths, tokens=32768, H=16, Dh=128, reps=self.reps)
        auto_kernels = {}
        q = torch.randn(1, 16, 8192, 128, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            auto_kernels["sdpa non-causal, L=8192"] = kernel_names(lambda: F.scaled_dot_product_attention(q, q, q))
            auto_kernels["sdpa causal, L=8192"] = kernel_names(
                lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)
            )
        q = None
        mod = module_check(self.reps)
        ok = [r for r in att if "tflops" in r]
        rows = []
        if ok:
            best = max(ok, key=lambda r: r["tflops"])
            rows.append(
                self._peak_row(
                    f"best bf16 attention forward: {best['backend']}, L={best['L']}, causal={best['causal']}",
                    best["tflops"],
                    peak,
                    f"GEMM {gemm:.0f}",
                )
            )
        auto_long = [r for r in ok if r["backend"] == "auto" and not r["causal"] and r["L"] == max(lengths)]
        if auto_long:
            r = auto_long[0]
            rows.append(
                self._peak_row(
                    f"torch's default SDPA choice, L={r['L']}, non-causal, bf16 forward TFLOP/s", r["tflops"], peak
                )
            )
        for key, m in mod.items():
            rows.append(
                Row(
                    f"headwise module {key} bf16 forward: time vs nn.MultiheadAttention",
                    m["ratio_vs_torch"],
                    note=f"{m['headwise_tflops']:.0f} TFLOP/s; kernels {', '.join(m['attention_kernels'])[:120]}",
                )
            )
        return self.result(
            rows,
            device=name,
            torch=torch.__version__,
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            gemm_tflops=gemm,
            peak_tflops=peak,
            attention=att,
            auto_kernels=auto_kernels,
            module=mod,
        )

    @staticmethod
    def _peak_row(metric: str, tflops: float, peak: float | None, extra: str = "") -> Row:
        if not peak:
            return Row(metric, tflops)
        note = f"{100 * tflops / peak:.0f}% of {peak:.0f} TFLOP/s" + (f"; {extra}" if extra else "")
        return Row.at_least(metric, tflops, 0.6 * peak, note, shown="≥ 60% of peak")

    def render(self, r):
        d = r.data
        lines = [
            f"Device: {d.get('device')}; torch {d.get('torch')}; measured bf16 GEMM "
            f"{fmt(d.get('gemm_tflops'))} TFLOP/s; nominal dense bf16 peak {fmt(d.get('peak_tflops'))} TFLOP/s.",
            "",
        ]
        if d.get("attention"):
            lines += [
                "| L | B | causal | backend | forward TFLOP/s | ÷ peak | forward + backward TFLOP/s |",
                "|---|---|---|---|---|---|---|",
            ]
            for row in d["attention"]:
                rate = fmt(row.get("tflops")) if "tflops" in row else row.get("error", "")[:60]
                lines.append(
                    f"| {row['L']:,} | {row['B']} | {row['causal']} | {row['backend']} | {rate} | "
                    f"{fmt(row.get('fraction_of_peak'))} | {fmt(row.get('fwd_bwd_tflops'))} |"
                )
            lines.append("")
        for key, m in d.get("module", {}).items():
            lines.append(
                f"Module {key} (B, L, D, H), bf16: headwise {m['headwise_ms']:.2f} ms vs nn.MultiheadAttention "
                f"{m['torch_ms']:.2f} ms (ratio {m['ratio_vs_torch']:.3f}), max relative difference "
                f"{m['max_rel_diff_vs_torch']:.1e}; attention kernels launched by headwise: "
                f"{', '.join(m['attention_kernels']) or '—'}."
            )
        return lines + [""]
