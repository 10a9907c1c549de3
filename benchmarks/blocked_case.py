"""The NumPy blocked reference (float64) against torch's float32 SDPA, side by side in one fresh process.

    OPENBLAS_NUM_THREADS=1 python benchmarks/blocked_case.py --L 16384 --H 8 --Dh 64 --block 1024 --rounds 3

Prints one JSON line: per-round seconds of each, alternating (the order rotating), on the same q, k, v.
``benchmarks/run.py`` starts it with ``OPENBLAS_NUM_THREADS=1`` (NumPy's OpenBLAS reads it when NumPy is
imported, so it must be set before): on the 2-vCPU benchmark machine a two-thread OpenBLAS pool spent
about three times longer on the reference's small (block × Dh) · (Dh × block) products than one thread
did, its second thread mostly waiting. torch keeps its own threads (MKL / oneDNN, not OpenBLAS).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--L", type=int, default=16384)
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--Dh", type=int, default=64)
    p.add_argument("--block", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import headwise.reference as ref

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((a.H, a.L, a.Dh)) for _ in range(3))  # float64
    tq, tk, tv = (torch.from_numpy(x).float()[None] for x in (q, k, v))  # (1, H, L, Dh) float32
    with torch.inference_mode():
        runs = {
            "NumPy blocked (float64)": lambda: ref.scaled_dot_product_attention(q, k, v, block_size=a.block),
            "torch sdpa (float32)": lambda: F.scaled_dot_product_attention(tq, tk, tv),
        }
        out_np, _ = runs["NumPy blocked (float64)"]()
        out_t = runs["torch sdpa (float32)"]()  # warm-up of both, and their agreement
        diff = float(np.abs(out_np - out_t[0].double().numpy()).max())
        names = list(runs)
        times = {n: [] for n in names}
        for r in range(a.rounds):
            for n in names[r % 2 :] + names[: r % 2]:
                t0 = time.perf_counter()
                runs[n]()
                times[n].append(time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "L": a.L,
                "H": a.H,
                "Dh": a.Dh,
                "block": a.block,
                "times_s": times,
                "max_abs_diff_float64_vs_float32": diff,
                "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
                "torch_threads": torch.get_num_threads(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
