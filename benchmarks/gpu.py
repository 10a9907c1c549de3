"""headwise on a CUDA GPU (see ``targets/gpu.py`` for what is measured and how).

    python benchmarks/gpu.py --out benchmarks/results/gpu.json        # about 1-2 minutes on an H100/H200

Needs only torch with CUDA (headwise is imported from ``src/`` when it is not installed). Writes one
:class:`row.Result`, the same schema ``run.py`` writes, which ``report.py`` renders.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
try:
    import headwise  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))

from machine import command, log, machine, write_json  # noqa: E402
from targets.gpu import GPU  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu.json"))
    p.add_argument("--max-len", type=int, default=32768)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    info = machine()
    result = GPU(max_len=a.max_len, reps=a.reps).measure()
    result.run = {
        "mode": "gpu",
        "command": command(),
        "machine": info,
        "seconds": time.perf_counter() - t0,
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_json(Path(a.out), result.to_json())
    log(f"wrote {a.out} in {result.run['seconds']:.0f} s")
    for row in result.rows:
        log(row.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
