"""The NumPy blocked reference (online softmax, float64) against torch's float32 SDPA, and its memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from machine import ROOT, log
from row import Row
from timing import Timing

import headwise.reference as ref
from targets.base import Mode, Target, contender_table, fmt
from targets.long import memcase

NUMPY, TORCH = "NumPy blocked (float64)", "torch sdpa (float32)"


class Blocked(Target):
    name = "blocked"
    title = "NumPy blocked reference (online softmax)"
    H, Dh, block = 8, 64, 1024

    def measure(self, mode: Mode):
        H, dh, block = self.H, self.Dh, self.block
        L = 16384 if mode.full else 4096
        # equality with the plain mode (which forms L × L weights) at a size where that fits
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((2, 2048, dh)) for _ in range(3))
        mask = rng.random((2048, 2048)) < 0.2
        plain, _ = ref.scaled_dot_product_attention(q, k, v, mask)
        blocked, _ = ref.scaled_dot_product_attention(q, k, v, mask, block_size=256)
        max_diff = float(np.abs(plain - blocked).max())
        # time against torch float32 (flash kernel) on the same q, k, v, in a fresh process with one OpenBLAS
        # thread (see benchmarks/blocked_case.py)
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        cmd = [sys.executable, str(ROOT / "benchmarks" / "blocked_case.py"), "--L", str(L), "--H", str(H)]
        cmd += ["--Dh", str(dh), "--block", str(block), "--rounds", str(3 if mode.full else 1)]
        log("  OPENBLAS_NUM_THREADS=1 " + " ".join(cmd[1:]))
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
        case = json.loads(p.stdout.strip().splitlines()[-1])
        res = Timing(len(case["times_s"][TORCH]), {n: 1 for n in case["times_s"]}, case["times_s"])
        mem = memcase("reference-blocked", L, D=H * dh, H=H, block=block, env=env)
        big = L == 16384
        peak = f"L={L}: peak memory of the NumPy blocked run (process peak RSS, block {block})"
        peak_note = "NumPy only (torch not imported); inputs q, k, v float64 included"
        rows = [
            Row.at_most(
                "blocked vs plain, max abs difference (float64, L=2048, bool mask, block 256)", max_diff, 1e-12
            ),
            Row.at_most(
                f"L={L}: NumPy blocked time ÷ torch float32 time",
                res.ratio(NUMPY, TORCH),
                3,
                "NumPy with one OpenBLAS thread, torch with its default threads",
            ),
            Row.at_most(peak, mem.get("peak_mib"), 1024, peak_note, shown="< 1024 MiB")
            if big
            else Row(peak, mem.get("peak_mib"), note=peak_note),
        ]
        return self.result(
            rows,
            H=H,
            Dh=dh,
            L=L,
            block=block,
            timing=res.to_json(),
            case=case,
            memory=mem,
            max_diff_vs_plain=max_diff,
            table=res.table([TORCH]),
        )

    def render(self, r):
        d = r.data
        mem, case = d["memory"], d["case"]
        return contender_table(d["table"]) + [
            "",
            f"Timed in a fresh process with OPENBLAS_NUM_THREADS={case.get('openblas_threads')} and "
            f"{case.get('torch_threads')} torch threads (`benchmarks/blocked_case.py`); the float64 and float32 "
            f"outputs agree to {fmt(case.get('max_abs_diff_float64_vs_float32'))}.",
            "",
            f"(H, L, Dh) = ({d['H']}, {d['L']:,}, {d['Dh']}), block {d['block']}; max |blocked − plain| = "
            f"{d['max_diff_vs_plain']:.1e} at L = 2048 with a boolean mask. Peak memory of a fresh NumPy-only "
            f"process running it: {fmt(mem.get('peak_mib'))} MiB (setup {fmt(mem.get('setup_peak_mib'))} MiB,"
            " which holds q, k, v in float64).",
            "",
        ]

    def notes(self, r, results):
        if not any(row.passed is False and "time" in row.metric for row in r.rows):
            return []
        return [
            "- **NumPy blocked time.** float64 GEMMs run at half the float32 rate on this CPU, and NumPy's "
            "element-wise passes (max, exp, sums) are single-threaded, so the float64 reference trails torch's "
            "float32 flash kernel by the measured factor."
        ]
