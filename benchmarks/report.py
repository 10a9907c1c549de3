"""Render ``docs/performance.md`` and ``docs/img/scaling.png`` from ``benchmarks/results/*.json``.

    .venv/bin/python benchmarks/report.py            # after benchmarks/run.py --full (which calls it)

Only figures that are in the result files are written; a target without a result file says so.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "performance.md"
PLOT = ROOT / "docs" / "img" / "scaling.png"

ORDER = ["forward", "long", "bf16", "decode", "weights", "train", "blocked", "gpu"]


def _load() -> dict:
    out = {}
    for name in ORDER:
        p = RESULTS / f"{name}.json"
        if p.exists():
            out[name] = json.loads(p.read_text())
    return out


def _fmt(v, digits=3) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != 0 and abs(v) < 1e-3:
            return f"{v:.2e}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(v)


def _status(row) -> str:
    return "" if row["pass"] is None else ("**pass**" if row["pass"] else "**miss**")


def _summary_rows(res: dict) -> list[str]:
    lines = ["| target | measured | goal | status |", "|---|---|---|---|"]
    for name in ORDER:
        if name not in res:
            continue
        for row in res[name].get("summary", []):
            val = _fmt(row["value"])
            if row.get("note"):
                val += f" ({row['note']})"
            cells = [row["metric"], val, row["goal"] or "", _status(row)]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def _contender_table(table: list[dict]) -> list[str]:
    peers = []
    for row in table:
        for k in row:
            if k.startswith("ratio_vs_") and k[9:] not in peers:
                peers.append(k[9:])
    has_gf = any("gflops" in r for r in table)
    head = ["contender", "median time"] + (["GFLOP/s"] if has_gf else []) + [f"÷ {p}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        t = row["median_ms"]
        cells = [row["contender"], f"{t:.1f} ms" if t >= 1 else f"{t * 1e3:.0f} µs"]
        if has_gf:
            cells.append(f"{row['gflops']:.0f}" if "gflops" in row else "")
        for p in peers:
            r = row.get(f"ratio_vs_{p}")
            lo_hi = row.get(f"spread_vs_{p}")
            cells.append("" if r is None else f"{r:.3f} ({lo_hi[0]:.2f}–{lo_hi[1]:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _machine(res: dict) -> list[str]:
    any_ = next((r for r in res.values() if "machine" in r), None)
    if any_ is None:
        return ["(no results yet)"]
    m = any_["machine"]
    flags = ", ".join(m.get("cpu_flags", [])) or "—"
    return [
        "| | |",
        "|---|---|",
        f"| CPU | {m['cpu']} ({m['logical_cpus']} logical CPUs, shared with other jobs), flags: {flags} |",
        f"| memory | {m['memory_gib']} GiB |",
        f"| torch | {m['torch']} ({m['torch_threads']} threads, CPU capability {m['torch_cpu_capability']}) |",
        f"| numpy / transformers / Python | {m['numpy']} / {m['transformers']} / {m['python']} |",
        f"| platform | {m['platform']} |",
    ]


def _per_target(name: str, r: dict) -> list[str]:
    lines = [f"### {r['title']}", ""]
    load = r.get("machine", {}).get("loadavg_at_start")
    where = f", load average {load} at the start of the run, {r.get('loadavg_at_end')} at its end" if load else ""
    lines += [f"Command: `{r['command']}` — written {r['written']}{where}.", ""]
    if name == "forward":
        for case in r["cases"]:
            B, L, D, H = case["shape"]
            lines += [
                f"(B, L, D, H) = ({B}, {L}, {D}, {H}); {case['flops'] / 1e9:.1f} GFLOP per forward "
                "(8·B·L·D² + 4·B·L²·D); peers' outputs agree with headwise's to "
                + ", ".join(f"{k} {v:.1e}" for k, v in case["agreement_max_abs"].items())
                + ".",
                "",
            ]
            lines += _contender_table(case["table"]) + [""]
            if "gemm_gflops" in case:
                lines += [
                    f"float32 GEMM (2048³, `torch.mm`, timed in the same rounds): {case['gemm_gflops']:.0f} "
                    f"GFLOP/s; headwise reaches {case['headwise_gflops']:.0f} GFLOP/s = "
                    f"{case['fraction_of_gemm']:.2f} of it.",
                    "",
                ]
    elif name == "long":
        lines += [
            "Each case is a fresh process (`benchmarks/memcase.py`): one forward (after one untimed forward "
            "for L ≤ 4096), its wall time, and the process's peak resident set (VmHWM: interpreter, torch, "
            "weights, input and every intermediate). `setup` is the peak before the forward.",
            "",
        ]
        lines += ["| L | headwise time | headwise peak | nn.MHA time | nn.MHA peak |", "|---|---|---|---|---|"]
        by = {}
        for row in r["rows"]:
            by.setdefault(row["L"], {})[row["impl"]] = row
        for L in sorted(by):
            cells = [f"{L:,}"]
            for impl in ("headwise", "torch"):
                row = by[L].get(impl, {})
                if "time_s" in row:
                    cells += [
                        f"{row['time_s']:.2f} s",
                        f"{row['peak_mib']:.0f} MiB (setup {row['setup_peak_mib']:.0f})",
                    ]
                else:
                    cells += [row.get("skipped") or row.get("error") or "—", ""]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "![time and peak memory against L](img/scaling.png)", ""]
    elif name == "bf16":
        lines += _contender_table(r["table"]) + [""]
        lines += [
            "Error against the float64 NumPy reference (same weights and inputs, "
            f"{r['error_vs_float64_reference']['headwise bf16']['batch_items']} batch items):",
            "",
            "| path | ‖err‖/‖ref‖ | max abs err | max abs err ÷ max abs ref |",
            "|---|---|---|---|",
        ]
        for k, e in r["error_vs_float64_reference"].items():
            lines.append(f"| {k} | {e['rel_fro']:.2e} | {e['max_abs']:.2e} | {e['max_abs_over_max_ref']:.2e} |")
        lines += [
            "",
            "`tests/core/test_fast_paths.py::test_bf16_error_against_float64_reference_is_bounded` holds "
            "both bf16 paths to ‖err‖/‖ref‖ < 1e-2 and max|err|/max|ref| < 2e-2 at (2, 128, 256, 4).",
            "",
        ]
    elif name == "decode":
        st = r["stack"]
        lines += _contender_table(r["table"]) + [""]
        if "table_1_thread" in r:
            lines += ["With one torch thread for both:", ""] + _contender_table(r["table_1_thread"]) + [""]
        lines += [
            f"Decoded output equals the full causal forward to {r['max_abs_diff_decode_vs_full']:.1e}. "
            f"12-layer stack (residual headwise attention layers, D = 768, H = 12, float32, B = 1): prompt "
            f"{st['prompt']:,} tokens prefilled in {st['prefill_s']:.2f} s, then {st['new_tokens']} tokens at "
            f"a median {st['median_token_s'] * 1e3:.1f} ms each = **{st['tokens_per_s']:.0f} tokens/s**.",
            "",
        ]
    elif name == "blocked":
        mem, case = r["memory"], r.get("case", {})
        lines += _contender_table(r["table"]) + [""]
        lines += [
            f"Timed in a fresh process with OPENBLAS_NUM_THREADS={case.get('openblas_threads')} and "
            f"{case.get('torch_threads')} torch threads (`benchmarks/blocked_case.py`); the float64 and float32 "
            f"outputs agree to {_fmt(case.get('max_abs_diff_float64_vs_float32'))}.",
            "",
            f"(H, L, Dh) = ({r['H']}, {r['L']:,}, {r['Dh']}), block {r['block']}; max |blocked − plain| = "
            f"{r['max_diff_vs_plain']:.1e} at L = 2048 with a boolean mask. Peak memory of a fresh NumPy-only "
            f"process running it: {_fmt(mem.get('peak_mib'))} MiB (setup {_fmt(mem.get('setup_peak_mib'))} MiB,"
            " which holds q, k, v in float64).",
            "",
        ]
    elif name == "gpu":
        lines += [
            f"Device: {r.get('device')}; torch {r.get('torch')}; measured bf16 GEMM "
            f"{_fmt(r.get('gemm_tflops'))} TFLOP/s; nominal dense bf16 peak {_fmt(r.get('peak_tflops'))} TFLOP/s.",
            "",
        ]
        rows = r.get("attention", [])
        if rows:
            lines += [
                "| L | B | causal | backend | forward TFLOP/s | ÷ peak | forward + backward TFLOP/s |",
                "|---|---|---|---|---|---|---|",
            ]
            for row in rows:
                lines.append(
                    f"| {row['L']:,} | {row['B']} | {row['causal']} | {row['backend']} | "
                    f"{_fmt(row.get('tflops')) if 'tflops' in row else row.get('error', '')[:60]} | "
                    f"{_fmt(row.get('fraction_of_peak'))} | {_fmt(row.get('fwd_bwd_tflops'))} |"
                )
            lines.append("")
        for key, m in r.get("module", {}).items():
            lines.append(
                f"Module {key} (B, L, D, H), bf16: headwise {m['headwise_ms']:.2f} ms vs nn.MultiheadAttention "
                f"{m['torch_ms']:.2f} ms (ratio {m['ratio_vs_torch']:.3f}), max relative difference "
                f"{m['max_rel_diff_vs_torch']:.1e}; attention kernels launched by headwise: "
                f"{', '.join(m['attention_kernels']) or '—'}."
            )
        lines.append("")
    else:
        lines += _contender_table(r["table"]) + [""]
    return lines


def plot(res: dict) -> bool:
    if "long" not in res:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = res["long"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl, label, style in (("headwise", "headwise", "o-"), ("torch", "nn.MultiheadAttention", "s--")):
        rows = [x for x in r["rows"] if x["impl"] == impl and "time_s" in x]
        Ls = [x["L"] for x in rows]
        a1.plot(Ls, [x["time_s"] for x in rows], style, label=label)
        a2.plot(Ls, [x["peak_mib"] / 1024 for x in rows], style, label=label)
    skipped = [x["L"] for x in r["rows"] if x["impl"] == "torch" and "skipped" in x]
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xlabel("sequence length L  (B = 1, D = 512, H = 8, float32)")
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    a1.set_yscale("log")
    a1.set_ylabel("forward time (s)")
    a2.set_yscale("log")
    a2.set_ylabel("process peak RSS (GiB)")
    a2.axhline(1.5, color="grey", lw=0.8, ls=":")
    a2.text(r["rows"][0]["L"], 1.55, "1.5 GB target", color="grey", fontsize=8)
    if skipped:
        a1.set_title(
            f"nn.MultiheadAttention not run at L ≥ {min(skipped):,}: its (H, L, L) scores alone "
            "exceed the machine's memory",
            fontsize=8,
        )
    fig.suptitle("headwise vs nn.MultiheadAttention: time and peak memory against L (CPU)")
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=PLOT.parent, suffix=".png")
    os.close(fd)
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, PLOT)
    return True


FAST_PATHS = [
    (
        "fused projections",
        "self-attention (one input tensor), ≥ 1024 tokens; K/V when they share a context",
        "`torch.cat` of Wq; Wk; Wv per call (0.3 ms) and one matrix product, split into views — no copies",
    ),
    (
        "oneDNN linear",
        "float32 or bfloat16, CPU, no autograd, no autocast",
        "`torch.ops.mkldnn._linear_pointwise`: the bias added in the kernel's epilogue, not copied in first by `addmm`",
    ),
    (
        "SDPA",
        "weights not requested",
        "`F.scaled_dot_product_attention` (flash kernel on CPU; flash / cuDNN / efficient on CUDA), causal as the "
        "kernel's flag, heads merged by a view",
    ),
    ("one decoded token", "`is_causal` with a KV cache and one new token", "no mask at all (it sees every key)"),
    (
        "blocked weights",
        "`need_weights=True` (backend auto / sdpa)",
        "`functional.attention_weights`: ≤ 2M scores at a time, fused softmax, head average accumulated so "
        "(B, H, L, S) never exists",
    ),
    (
        "NumPy blocked",
        "`headwise.reference.scaled_dot_product_attention(..., block_size=N)`",
        "the online-softmax recurrence of FlashAttention over N × N tiles, float64",
    ),
]


def _fast_paths() -> str:
    rows = ["## What the fast paths are", "", "| path | when | what it does |", "|---|---|---|"]
    rows += [f"| {a} | {b} | {c} |" for a, b, c in FAST_PATHS]
    return "\n".join(rows) + "\n"


INTRO = """# Performance

headwise's fast paths, measured side by side with `torch.nn.MultiheadAttention`, Hugging Face
`BertAttention` (sdpa) and the first article's from-scratch module. Generated by `benchmarks/report.py` from
`benchmarks/results/*.json`; regenerate everything with `make bench-full` (`make bench` is the quick run,
results under `benchmarks/results/quick/`, no docs).

## How it is measured

- **Side by side, one process.** Every comparison builds headwise's module and the peers with *the same
  weights* (copied, and checked to give the same output before timing) and feeds them *the same input*.
- **Alternating rounds, medians.** Each round times every contender once with `torch.utils.benchmark.Timer`
  (a fixed number of calls per contender, about 0.4 s), the order rotating between rounds. A time is the
  median over rounds; a ratio is the median over rounds of the per-round ratio (in brackets: the lowest and
  highest per-round ratio), so load from other jobs on this shared 2-CPU machine hits both sides of a ratio
  alike. Absolute times move with that load (the load averages are recorded); the ratios are what to read.
- **Peak memory** is measured in a fresh process per case (`benchmarks/memcase.py`): the process's own
  peak resident set, `VmHWM` from `/proc/self/status`, interpreter, torch, weights and inputs included.
- **FLOPs** count 8·B·L·D² for the four projections and 4·B·L·S·D for q·kᵀ and p·v.
- Timings are never test assertions; the tests (`tests/core/test_fast_paths.py`) check that every fast path
  agrees with the readable math path and the NumPy reference.

{FAST_PATHS}
`backend="math"` keeps the readable softmax path, the reference the fast paths are tested against.
"""


def _spread(res: dict) -> list[str]:
    """Every full run recorded in ``results/history.jsonl``, for the targets measured more than once."""
    path = RESULTS / "history.jsonl"
    if not path.exists():
        return []
    runs: dict[str, list[tuple[str, float, str | None]]] = {}
    for line in path.read_text().splitlines():
        h = json.loads(line)
        for row in h["summary"]:
            if isinstance(row["value"], (int, float)) and row["pass"] is not None:
                runs.setdefault(row["metric"], []).append((h["written"], row["value"], h.get("note")))
    many = {m: v for m, v in runs.items() if len(v) > 1}
    if not many:
        return []
    lines = [
        "## Run-to-run spread",
        "",
        "Every full run of a target on this shared machine, from `benchmarks/results/history.jsonl` (the tables "
        "above show the latest). The spread is the load from other jobs; the latest run is not chosen as the best.",
        "",
        "| target | runs (written: value) |",
        "|---|---|",
    ]
    for metric, vals in many.items():
        cells = "; ".join(f"{w}: {_fmt(v)}" + (f" ({n})" if n else "") for w, v, n in vals)
        lines.append(f"| {metric} | {cells} |".replace("max |", "max \\|"))
    return lines + [""]


def render(res: dict) -> str:
    lines = [INTRO.replace("{FAST_PATHS}", _fast_paths()), "## Machine and versions", ""] + _machine(res) + [""]
    lines += ["## Every target", ""] + _summary_rows(res) + [""]
    lines += _notes(res) + _spread(res) + ["## Per target", ""]
    for name in ORDER:
        if name in res:
            lines += _per_target(name, res[name])
        elif name == "gpu":
            lines += [
                "### 8. GPU",
                "",
                "Not run yet on this machine (no GPU). On a CUDA machine: "
                "`python benchmarks/gpu.py --out benchmarks/results/gpu.json`, then "
                "`python benchmarks/report.py`.",
                "",
            ]
        else:
            lines += [f"### {name}", "", "No result file yet: `make bench-full`.", ""]
    return "\n".join(lines) + "\n"


def _notes(res: dict) -> list[str]:
    """Why the missed targets are missed, from the measured figures."""
    out = ["## Reading the misses", ""]
    fwd = res.get("forward", {}).get("cases", [{}])[0]
    missed = {r["metric"] for name in res for r in res[name].get("summary", []) if r["pass"] is False}
    if "fraction_of_gemm" in fwd and any("(8, 512, 768, 12) time vs nn.MultiheadAttention" in m for m in missed):
        out.append(
            f"- **float32 forward (target 1).** headwise runs at {fwd['fraction_of_gemm']:.2f} × the float32 GEMM rate "
            f"measured in the same rounds ({fwd['headwise_gflops']:.0f} of {fwd['gemm_gflops']:.0f} GFLOP/s): it is "
            "bound by the floating-point rate. Had every one of its FLOPs run at the GEMM rate, its time would be "
            f"{fwd['ideal_vs_torch']:.2f} × nn.MultiheadAttention's, so ≤ 0.6 × needs nn.MultiheadAttention to "
            "waste more than this machine lets it (its fast path uses the same GEMMs; what it adds is a "
            "materialised (B·H, L, L) softmax, the bias-and-rescale pass and copies). The issue's figures came "
            "from a machine with AMX where nn.MultiheadAttention ran at 54% of the GEMM rate."
        )
    bf = res.get("bf16", {})
    if "gemm_bf16_speedup" in bf and any("bf16 over nn.MHA fp32" in m for m in missed):
        amx = "with" if any(f.startswith("amx") for f in bf["machine"]["cpu_flags"]) else "no"
        bound = ""
        if "ideal_vs_torch" in fwd:
            bound = (
                f" Even with every FLOP at the bf16 GEMM rate the speed-up would be "
                f"{bf['gemm_bf16_speedup'] / fwd['ideal_vs_torch']:.1f} × (the bf16/fp32 GEMM ratio divided by "
                f"target 1's ideal ratio {fwd['ideal_vs_torch']:.2f})."
            )
        out.append(
            f"- **bf16 (target 3).** Here a bf16 GEMM runs at {bf['gemm_bf16_speedup']:.2f} × the float32 GEMM rate "
            f"({amx} AMX); the 5 × target assumed AMX (bf16 GEMM about 6.5 × the float32 rate)." + bound
        )
    tr = res.get("train", {})
    rows = [r for r in tr.get("summary", []) if r["pass"] is False]
    if rows:
        out.append(
            f"- **training step (target 6).** {rows[0]['note']}: forward and backward are GEMMs and the flash "
            "kernel's backward, the same kernels nn.MultiheadAttention's training path calls (it also uses SDPA "
            "when weights are not requested), so the only room is its extra copies."
        )
    dec = res.get("decode", {}).get("stack")
    if dec:
        out.append(
            f"- **decode tokens/s.** With {dec['threads']} threads {dec['tokens_per_s']:.0f} tokens/s, with 1 thread "
            f"{dec['tokens_per_s_1_thread']:.0f}: a decode step is ~50 small ops, and on this shared machine each "
            "parallel region can wait for the second thread to be scheduled; one thread never waits."
        )
    blk = res.get("blocked", {})
    rows = [r for r in blk.get("summary", []) if r["pass"] is False and "time" in r["metric"]]
    if rows:
        out.append(
            "- **NumPy blocked time (target 7).** float64 GEMMs run at half the float32 rate on this CPU, and NumPy's "
            "element-wise passes (max, exp, sums) are single-threaded, so the float64 reference trails torch's "
            "float32 flash kernel by the measured factor."
        )
    return out + [""]


def main(argv=None) -> int:
    res = _load()
    plotted = plot(res)
    DOC.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=DOC.parent, suffix=".md")
    with os.fdopen(fd, "w") as f:
        f.write(render(res))
    os.replace(tmp, DOC)
    print(f"wrote {DOC.relative_to(ROOT)}" + (f" and {PLOT.relative_to(ROOT)}" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
