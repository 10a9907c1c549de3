"""Long context: time and peak memory against L, each case in a fresh process; the scaling plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from machine import ROOT, log
from row import Row

from targets.base import Mode, Target

PLOT = ROOT / "docs" / "img" / "scaling.png"
TORCH_MAX_L = 16384  # nn.MultiheadAttention materialises (H, L, L) scores: 8.6 GB of them at 16k, 34 GB at 32k


def memcase(impl: str, L: int, *, D=512, H=8, B=1, block=None, warmup=0, timeout=None, env=None) -> dict:
    """One forward in a fresh process (``benchmarks/memcase.py``): its time and the process's peak memory."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "memcase.py"), "--impl", impl, "--B", str(B), "--L", str(L)]
    cmd += ["--D", str(D), "--H", str(H), "--warmup", str(warmup)]
    if block:
        cmd += ["--block", str(block)]
    log("  " + " ".join(cmd[1:]))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"impl": impl, "L": L, "error": f"timed out after {timeout} s"}
    if p.returncode != 0:
        return {"impl": impl, "L": L, "error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


class Long(Target):
    name = "long"
    title = "long context: time and peak memory against L"
    D, H = 512, 8

    def measure(self, mode: Mode):
        D, H = self.D, self.H
        lengths = [1024, 2048, 4096, 8192, 16384, 32768, 65536] if mode.full else [4096]
        cases = []
        for L in lengths:
            for impl in ("headwise", "torch"):
                if impl == "torch" and L > TORCH_MAX_L:
                    gib = H * L * L * 4 / 2**30
                    cases.append(
                        {
                            "impl": impl,
                            "L": L,
                            "skipped": f"L > {TORCH_MAX_L}: scores alone need {gib:.0f} GiB (the machine has less)",
                        }
                    )
                    continue
                cases.append(memcase(impl, L, D=D, H=H, warmup=1 if L <= 4096 else 0))
                log(f"    {cases[-1]}")
        longest = next(c for c in cases if c["impl"] == "headwise" and c["L"] == max(lengths))
        if max(lengths) == 65536:
            row = Row.at_most(
                "peak memory (process peak RSS) of a forward at (1, 65536, 512, 8)",
                longest.get("peak_mib"),
                1536,
                f"{longest.get('time_s', float('nan')):.0f} s; the interpreter, torch and the inputs included",
                shown="< 1536 MiB",
            )
        else:
            row = Row(f"peak memory at (1, {max(lengths)}, 512, 8)", longest.get("peak_mib"), note="quick run")
        return self.result([row], D=D, H=H, cases=cases)

    def render(self, r):
        lines = [
            "Each case is a fresh process (`benchmarks/memcase.py`): one forward (after one untimed forward "
            "for L ≤ 4096), its wall time, and the process's peak resident set (VmHWM: interpreter, torch, "
            "weights, input and every intermediate). `setup` is the peak before the forward.",
            "",
            "| L | headwise time | headwise peak | nn.MHA time | nn.MHA peak |",
            "|---|---|---|---|---|",
        ]
        by: dict[int, dict] = {}
        for case in r.data["cases"]:
            by.setdefault(case["L"], {})[case["impl"]] = case
        for L in sorted(by):
            cells = [f"{L:,}"]
            for impl in ("headwise", "torch"):
                c = by[L].get(impl, {})
                if "time_s" in c:
                    cells += [f"{c['time_s']:.2f} s", f"{c['peak_mib']:.0f} MiB (setup {c['setup_peak_mib']:.0f})"]
                else:
                    cells += [c.get("skipped") or c.get("error") or "—", ""]
            lines.append("| " + " | ".join(cells) + " |")
        return lines + ["", "![time and peak memory against L](img/scaling.png)", ""]

    def figures(self, r) -> list:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cases = r.data["cases"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for impl, label, style in (("headwise", "headwise", "o-"), ("torch", "nn.MultiheadAttention", "s--")):
            done = [c for c in cases if c["impl"] == impl and "time_s" in c]
            Ls = [c["L"] for c in done]
            a1.plot(Ls, [c["time_s"] for c in done], style, label=label)
            a2.plot(Ls, [c["peak_mib"] / 1024 for c in done], style, label=label)
        skipped = [c["L"] for c in cases if c["impl"] == "torch" and "skipped" in c]
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
        a2.text(cases[0]["L"], 1.55, "1.5 GB target", color="grey", fontsize=8)
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
        return [PLOT]
