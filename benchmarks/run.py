"""headwise benchmarks: side by side against nn.MultiheadAttention, Hugging Face and the article's module.

    .venv/bin/python benchmarks/run.py --quick     # make bench: every CPU target, few rounds (about 3 minutes)
    .venv/bin/python benchmarks/run.py --full      # make bench-full: more rounds, the long-context scaling runs
                                                   # and the NumPy blocked reference at L = 16384; writes
                                                   # docs/performance.md and docs/img/scaling.png
    .venv/bin/python benchmarks/run.py --full --only forward,decode    # some targets
    python benchmarks/run.py --gpu                 # on a CUDA machine: the GPU target alone (about 1-2 minutes
                                                   # on an H100/H200); writes benchmarks/results/gpu.json

Each target (``benchmarks/targets/``) measures one concern and renders its own section of the report.
Results: ``benchmarks/results/<target>.json`` (full) or ``benchmarks/results/quick/<target>.json`` (quick),
each one ``row.Result``. Timing method: ``benchmarks/timing.py``; memory: ``benchmarks/memcase.py``.
``--gpu`` needs only torch with CUDA (headwise is imported from ``src/`` when it is not installed); what it
measures and how: ``benchmarks/targets/gpu.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from machine import RESULTS, ROOT, command, log, machine, write_json

try:
    import headwise  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))

from row import Result  # noqa: E402
from targets import ALL, CPU, Mode  # noqa: E402

HISTORY = RESULTS / "history.jsonl"


def append_history(result: Result) -> None:
    """One line per full run of a target (its rows), so the report can show the run-to-run spread."""
    entry = {
        "written": result.run["written"],
        "target": result.target,
        "cpu": result.run["machine"]["cpu"],
        "kind": result.run["machine"].get("kind"),
        "loadavg": result.run["machine"]["loadavg_at_start"],
        "summary": [{"metric": r.metric, "value": r.value, "pass": r.passed, "note": r.note} for r in result.rows],
    }
    HISTORY.parent.mkdir(parents=True, exist_ok=True)
    with open(HISTORY, "a") as f:
        f.write(json.dumps(entry) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--quick", action="store_true", help="few rounds, short lengths (about 3 minutes)")
    g.add_argument("--full", action="store_true", help="every CPU target; writes docs/performance.md")
    g.add_argument("--gpu", action="store_true", help="the GPU target alone, on a CUDA machine")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(CPU)}")
    p.add_argument("--no-docs", action="store_true", help="with --full: do not rewrite docs/performance.md")
    p.add_argument("--out", default=str(RESULTS / "gpu.json"), help="with --gpu: the result file")
    p.add_argument("--max-len", type=int, default=32768, help="with --gpu: the longest sequence")
    p.add_argument("--reps", type=int, default=10, help="with --gpu: timed calls per measurement")
    a = p.parse_args(argv)
    if a.gpu:
        return gpu(Path(a.out), max_len=a.max_len, reps=a.reps)
    mode = Mode(full=a.full)
    names = [n for n in a.only.split(",") if n] or CPU
    unknown = sorted(set(names) - set(CPU))
    if unknown:
        p.error(f"--only: unknown targets {unknown}; expected some of {CPU}")
    outdir = RESULTS if mode.full else RESULTS / "quick"
    info = machine()
    log(
        f"headwise benchmarks ({mode.name}) on {info['cpu']}, {info['logical_cpus']} CPUs, "
        f"torch {info['torch']} ({info['torch_threads']} threads), load {info['loadavg_at_start']}"
    )
    t_all = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        result = ALL[name].measure(mode)
        result.run = {
            "mode": mode.name,
            "command": command(),
            "machine": info,
            "seconds": time.perf_counter() - t0,
            "written": time.strftime("%Y-%m-%d %H:%M:%S"),
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        }
        write_json(outdir / f"{name}.json", result.to_json())
        if mode.full:
            append_history(result)
        log(f"== {result.title}")
        for row in result.rows:
            log(row.line())
    log(f"done in {time.perf_counter() - t_all:.0f} s; results in {outdir.relative_to(ROOT)}/")
    if mode.full and not a.no_docs:
        import report

        report.main([])
    return 0


def gpu(out: Path, *, max_len: int, reps: int) -> int:
    """The GPU target (``targets/gpu.py``), written to ``out`` in the schema ``report.py`` renders."""
    import torch
    from targets.gpu import GPU

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    info = machine()
    result = GPU(max_len=max_len, reps=reps).measure()
    result.run = {
        "mode": "gpu",
        "command": command(),
        "machine": info,
        "seconds": time.perf_counter() - t0,
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_json(out, result.to_json())
    log(f"wrote {out} in {result.run['seconds']:.0f} s")
    for row in result.rows:
        log(row.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
