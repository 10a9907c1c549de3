"""``headwise atlas`` against ``headwise heads`` on the same model and corpus, side by side: each command a fresh
process (its wall time and its peak resident memory, ``ru_maxrss`` of the child), the commands alternated round by
round, every one on the same torch threads.

    python benchmarks/atlas_time.py --model smollm2 --rounds 1 [--corpus sample] [--out FILE]

Contenders: ``heads`` (the statistics alone), ``heads --importance`` (with the importance's search for the heads
that matter, to 8 × the top k), ``heads --importance --composition`` (the same runs the atlas makes
beside its pass) and ``atlas`` (the pass with the evidence and the writes, the importance, the weights' circuits, the
page); ``atlas --no-importance`` (with ``--only``) the pass and the weights' circuits alone. Results go to
``benchmarks/results/atlas_time.json`` (merged by ``--name``), with the CPU named and the load average before and
after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from headwise._machine import cpu_name  # noqa: E402

CONTENDERS = {
    "heads": ["heads", "--corpus", "{corpus}"],
    "heads --importance": ["heads", "--corpus", "{corpus}", "--importance"],
    "heads --importance --composition": ["heads", "--corpus", "{corpus}", "--importance", "--composition"],
    "atlas": ["atlas", "--corpus", "{corpus}"],
    "atlas --no-importance": ["atlas", "--corpus", "{corpus}", "--no-importance"],
}


def run_one(argv: list[str]) -> dict:
    """One command in a fresh process: wall seconds and its peak resident memory (bytes)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "headwise", *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    if status != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err[-2000:]}")
    return {"seconds": round(seconds, 1), "peak_bytes": usage.ru_maxrss * 1024, "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--corpus", default="sample")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", default=",".join(CONTENDERS), help="contenders, comma-separated")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "atlas_time.json")
    ap.add_argument("--name", help="the results' key (default: --model)")
    ap.add_argument("--encoder", action="store_true", help="an encoder: heads' contender without --composition")
    ap.add_argument("--keep", type=Path, help="keep the last round's atlas folder here (atlas.json, atlas.html)")
    args = ap.parse_args()
    names = [n.strip() for n in args.only.split(",")]
    runs: dict[str, list] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in names:
                argv = [a.format(corpus=args.corpus) for a in CONTENDERS[name]]
                if args.encoder:
                    argv = [a for a in argv if a != "--composition"]
                folder = Path(tmp) / f"{name.split()[0]}{r}"
                if name == "atlas" and args.keep is not None and r == args.rounds - 1:
                    folder = args.keep
                argv += ["--model", args.model, "--out", str(folder)]
                got = run_one(argv)
                runs[name].append(got)
                print(name, got, flush=True)
    best = {n: min(r["seconds"] for r in v) for n, v in runs.items()}
    entry = {
        "cpu": cpu_name(), "threads": os.cpu_count(), "model": args.model, "corpus": args.corpus,
        "rounds": args.rounds, "runs": runs,
        "ratios": {f"{a} / {h}": round(best[a] / best[h], 2) for a in best for h in best
                   if a != h and h.startswith("heads") and (a.startswith("atlas") or h == "heads")},
    }  # fmt: skip
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    data[args.name or args.model] = entry
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(entry["ratios"]))


if __name__ == "__main__":
    main()
