"""One forward in a fresh process, reporting its time and the process's peak memory (one JSON line).

Peak memory is the process's peak resident set size, the kernel's high-water mark ``VmHWM`` from
``/proc/self/status``, read by the process itself after the forward: it counts everything the process ever
held — the interpreter, the libraries, the weights and inputs, and every intermediate of the forward.
(``resource.getrusage(RUSAGE_SELF).ru_maxrss`` would be wrong here: Linux carries the parent's RSS at
``fork`` into the child's ``ru_maxrss`` across ``exec``, so every child of a big parent reports at least
the parent's size. ``VmHWM`` belongs to the new address space alone; it falls back to ``ru_maxrss`` where
``/proc`` is missing.) ``setup_peak_mib`` is the same figure read just before the forward, so
``peak_mib - setup_peak_mib`` bounds what the forward itself added.

    python benchmarks/memcase.py --impl headwise --B 1 --L 65536 --D 512 --H 8
    python benchmarks/memcase.py --impl torch ...          # nn.MultiheadAttention, same weights
    python benchmarks/memcase.py --impl reference-blocked --L 16384 --D 512 --H 8 --block 1024   # NumPy only
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def _peak_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:  # pragma: no cover - not Linux
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["headwise", "torch", "reference-blocked"], required=True)
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--L", type=int, required=True)
    p.add_argument("--D", type=int, default=512)
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--block", type=int, default=1024, help="block size of the NumPy blocked reference")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--warmup", type=int, default=0, help="untimed forwards before the timed one")
    a = p.parse_args(argv)

    if a.impl == "reference-blocked":
        import numpy as np

        import headwise.reference as ref

        assert "torch" not in sys.modules, "the NumPy reference must not import torch"
        dh = a.D // a.H
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((a.B, a.H, a.L, dh)) for _ in range(3))  # float64
        setup = _peak_mib()
        t0 = time.perf_counter()
        out, _ = ref.scaled_dot_product_attention(q, k, v, block_size=a.block)
        elapsed = time.perf_counter() - t0
        ok = bool(np.isfinite(out).all())
    else:
        import torch

        import headwise
        from headwise.interop import to_torch

        if a.threads:
            torch.set_num_threads(a.threads)
        torch.manual_seed(0)
        m = headwise.MultiHeadAttention(a.D, a.H).eval()
        if a.impl == "torch":
            tm = to_torch(m).eval()
            del m

            def fwd(x):
                return tm(x, x, x, need_weights=False)[0]
        else:

            def fwd(x):
                return m(x)[0]

        x = torch.randn(a.B, a.L, a.D)
        with torch.inference_mode():
            setup = _peak_mib()
            for _ in range(a.warmup):
                fwd(x)
            t0 = time.perf_counter()
            out = fwd(x)
            elapsed = time.perf_counter() - t0
            ok = bool(torch.isfinite(out).all())
    print(
        json.dumps(
            {
                "impl": a.impl,
                "B": a.B,
                "L": a.L,
                "D": a.D,
                "H": a.H,
                "block": a.block if a.impl == "reference-blocked" else None,
                "time_s": elapsed,
                "peak_mib": _peak_mib(),
                "setup_peak_mib": setup,
                "finite": ok,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
