"""headwise on a CUDA GPU: attention TFLOP/s in bf16 (L up to 32k) per SDPA backend, and the module itself.

    python benchmarks/gpu.py --out benchmarks/results/gpu.json        # about 1-2 minutes on an H100/H200

Standalone: needs only torch with CUDA (headwise is imported from ``src/`` when it is not installed). It
measures, with CUDA events (warm-up, then the median of several timed calls):

- a bf16 GEMM (8192³) — the achievable matrix rate — and the nominal dense bf16 peak of the GPU by name;
- ``F.scaled_dot_product_attention`` forward (and forward + backward) in bf16 at B·L = 32k tokens,
  H = 16, Dh = 128, L from 1k to 32k, non-causal and causal, for each backend (flash, cuDNN,
  memory-efficient) and for torch's own choice, with the kernel names the default choice launched;
- ``headwise.MultiHeadAttention`` (bf16, D = 2048, H = 16) against ``nn.MultiheadAttention`` with the same
  weights (forward, weights not requested), their agreement, and the kernels headwise launched — which
  shows that headwise takes the flash / cuDNN path on CUDA.

FLOPs: 4·B·H·L²·Dh for an attention forward (half of it causal); forward + backward counts 3.5 × that
(the backward recomputes the scores: 2.5 × the forward). Target: ≥ 60% of the GPU's bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
try:
    import headwise
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))
    import headwise

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu.json"))
    p.add_argument("--max-len", type=int, default=32768)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    name = torch.cuda.get_device_name()
    peak = nominal_peak(name)
    print(
        f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}",
        flush=True,
    )
    n = 8192
    ga, gb = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    tg = cuda_time(lambda: ga @ gb, warmup=5, reps=20)
    gemm = 2 * n**3 / tg / 1e12
    ga = gb = None
    print(f"bf16 GEMM {n}³: {gemm:.0f} TFLOP/s; nominal peak {peak} TFLOP/s", flush=True)
    lengths = [L for L in (1024, 2048, 4096, 8192, 16384, 32768) if a.max_len >= L]
    att = attention_rates(peak, lengths, tokens=32768, H=16, Dh=128, reps=a.reps)
    auto_kernels = {}
    q = torch.randn(1, 16, 8192, 128, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        auto_kernels["sdpa non-causal, L=8192"] = kernel_names(lambda: F.scaled_dot_product_attention(q, q, q))
        auto_kernels["sdpa causal, L=8192"] = kernel_names(
            lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)
        )
    q = None
    mod = module_check(a.reps)
    ok = [r for r in att if "tflops" in r]
    best = max(ok, key=lambda r: r["tflops"]) if ok else None
    auto_long = [r for r in ok if r["backend"] == "auto" and not r["causal"] and r["L"] == max(lengths)]
    payload = {
        "target": "gpu",
        "title": "8. GPU: bf16 attention TFLOP/s per SDPA backend, and the module",
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "command": "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gemm_tflops": gemm,
        "peak_tflops": peak,
        "attention": att,
        "auto_kernels": auto_kernels,
        "module": mod,
        "seconds": time.perf_counter() - t_start,
        "summary": [],
    }
    if best is not None:
        frac = best["tflops"] / peak if peak else None
        payload["summary"].append(
            {
                "metric": f"best bf16 attention forward: {best['backend']}, L={best['L']}, causal={best['causal']}",
                "value": best["tflops"],
                "goal": "≥ 60% of peak" if peak else None,
                "pass": None if frac is None else frac >= 0.6,
                "note": None if frac is None else f"{100 * frac:.0f}% of {peak:.0f} TFLOP/s; GEMM {gemm:.0f}",
            }
        )
    if auto_long:
        r = auto_long[0]
        frac = r["tflops"] / peak if peak else None
        payload["summary"].append(
            {
                "metric": f"torch's default SDPA choice, L={r['L']}, non-causal, bf16 forward TFLOP/s",
                "value": r["tflops"],
                "goal": "≥ 60% of peak" if peak else None,
                "pass": None if frac is None else frac >= 0.6,
                "note": None if frac is None else f"{100 * frac:.0f}% of peak",
            }
        )
    for key, m in mod.items():
        payload["summary"].append(
            {
                "metric": f"headwise module {key} bf16 forward: time vs nn.MultiheadAttention",
                "value": m["ratio_vs_torch"],
                "goal": None,
                "pass": None,
                "note": f"{m['headwise_tflops']:.0f} TFLOP/s; kernels {', '.join(m['attention_kernels'])[:120]}",
            }
        )
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print(f"wrote {path} in {payload['seconds']:.0f} s", flush=True)
    for row in payload["summary"]:
        print(f"  {row['metric']}: {row['value']:.3g} {row['note'] or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
