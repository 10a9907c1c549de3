"""headwise benchmarks: side by side against nn.MultiheadAttention, Hugging Face and the article's module.

    .venv/bin/python benchmarks/run.py --quick     # make bench: every CPU target, few rounds (about 3 minutes)
    .venv/bin/python benchmarks/run.py --full      # make bench-full: more rounds, the long-context scaling runs
                                                   # and the NumPy blocked reference at L = 16384; writes
                                                   # docs/performance.md and docs/img/scaling.png
    .venv/bin/python benchmarks/run.py --full --only forward,decode    # some targets

Each target (``benchmarks/targets/``) measures one concern and renders its own section of the report.
Results: ``benchmarks/results/<target>.json`` (full) or ``benchmarks/results/quick/<target>.json`` (quick),
each one ``row.Result``. Timing method: ``benchmarks/timing.py``; memory: ``benchmarks/memcase.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from machine import RESULTS, ROOT, command, log, machine, write_json
from row import Result
from targets import ALL, CPU, Mode

HISTORY = RESULTS / "history.jsonl"


def append_history(result: Result) -> None:
    """One line per full run of a target (its rows), so the report can show the run-to-run spread."""
    entry = {
        "written": result.run["written"],
        "target": result.target,
        "cpu": result.run["machine"]["cpu"],
        "loadavg": result.run["machine"]["loadavg_at_start"],
        "summary": [{"metric": r.metric, "value": r.value, "pass": r.passed} for r in result.rows],
    }
    HISTORY.parent.mkdir(parents=True, exist_ok=True)
    with open(HISTORY, "a") as f:
        f.write(json.dumps(entry) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--quick", action="store_true", help="few rounds, short lengths (about 3 minutes)")
    g.add_argument("--full", action="store_true", help="every CPU target; writes docs/performance.md")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(CPU)}")
    p.add_argument("--no-docs", action="store_true", help="with --full: do not rewrite docs/performance.md")
    a = p.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
