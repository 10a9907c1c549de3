"""Two source trees of headwise side by side: the same six cases, in alternating rounds, each case a fresh process.

    .venv/bin/python benchmarks/before_after.py OLD_SRC NEW_SRC [--rounds 5] [--only heads,patch,circuit,atp]

``OLD_SRC`` and ``NEW_SRC`` are ``src`` folders (for example a ``git worktree add --detach /tmp/old COMMIT``'s
``/tmp/old/src`` and this checkout's ``src``); each case runs with ``PYTHONPATH`` set to one of them, so both are
timed with the same interpreter, packages, threads and machine, the order of the two alternating between rounds.
A refactor that must change nothing measurable is checked with it.

Cases (float32, no gradient, the torch threads in force — the Timer is given them, its own default is one):

- ``forward``: ``MultiHeadAttention(768, 12)`` on (B, L) = (8, 512), the median of ``torch.utils.benchmark``'s
  ``blocked_autorange`` (about 1 s).
- ``decode``: one decoded token after a 4,096-token prefix in a ``KVCache`` (the cache cropped back after each
  step), the same timer.
- ``heads``: ``headwise heads --model smollm2`` on a 1,024-token text, wall time of the whole command.
- ``patch``: ``headwise patch --model smollm2`` on one indirect-object prompt pair (every head, exact), wall time.
- ``circuit``: ``headwise circuit --model smollm2 --pairs examples/ioi_pairs.jsonl --method eap`` (8 pairs: EAP over
  every edge, the top 20 patched exactly, the faithfulness curve), wall time.
- ``atp``: the same with ``--method 'atp*'`` (each query and key receiver's pattern recomputed exactly), wall time.

Printed: per case the medians of OLD and NEW, NEW ÷ OLD per round (median, lowest, highest), the CPU's name.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TIMED = r"""
import json, sys, torch
from torch.utils import benchmark
import headwise
torch.manual_seed(0)
case = sys.argv[1]
mha = headwise.MultiHeadAttention(768, 12).eval()
threads = torch.get_num_threads()
with torch.no_grad():
    if case == "forward":
        x = torch.randn(8, 512, 768)
        mha(x)
        stmt, env = "mha(x)", {"mha": mha, "x": x}
    else:
        prefix = torch.randn(1, 4096, 768)
        token = torch.randn(1, 1, 768)
        cache = headwise.KVCache.for_module(mha, batch_size=1, capacity=4097)
        mha(prefix, is_causal=True, cache=cache)
        def step():
            mha(token, is_causal=True, cache=cache)
            cache.crop(4096)
        step()
        stmt, env = "step()", {"step": step}
    m = benchmark.Timer(stmt, globals=env, num_threads=threads).blocked_autorange(min_run_time=1.0)
print(json.dumps({"seconds": m.median}))
"""

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"


def text_1024(src: str) -> str:
    """A 1,024-token text for SmolLM2, built as benchmarks/heads_long.py builds it (with the OLD tree)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import heads_long; from headwise.models import open_model; "
        "print(heads_long.tokens(open_model('smollm2'), 1024)[0], end='')"
    )
    env = {**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "benchmarks")], env=env, check=True, capture_output=True, text=True
    ).stdout


def run_case(case: str, src: str, text: str) -> float:
    env = {**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if case in ("forward", "decode"):
        out = subprocess.run(
            [sys.executable, "-c", TIMED, case], env=env, check=True, capture_output=True, text=True
        ).stdout
        return json.loads(out.strip().splitlines()[-1])["seconds"]
    with tempfile.TemporaryDirectory() as tmp:
        if case == "heads":
            argv = ["heads", "--model", "smollm2", text, "--out", f"{tmp}/out"]
        elif case in ("circuit", "atp"):
            pairs = str(ROOT / "examples" / "ioi_pairs.jsonl")
            method = "eap" if case == "circuit" else "atp*"
            argv = ["circuit", "--model", "smollm2", "--pairs", pairs, "--method", method, "--out", f"{tmp}/out"]
        else:
            argv = ["patch", "--model", "smollm2", "--clean", CLEAN, "--corrupted", CORRUPTED]
            argv += ["--answer", " Mary", "--wrong", " John", "--out", f"{tmp}/out"]
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "headwise", *argv], env=env, check=True, capture_output=True)
        return time.perf_counter() - t


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", help="the OLD tree's src folder")
    p.add_argument("new", help="the NEW tree's src folder")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="forward,decode,heads,patch,circuit,atp")
    a = p.parse_args(argv)
    cases = [c for c in a.only.split(",") if c]
    text = text_1024(a.old) if "heads" in cases else ""
    print(f"CPU: {cpu_name()}; load at start {os.getloadavg()[0]:.2f}; {a.rounds} rounds")
    results = {}
    for case in cases:
        old, new = [], []
        run_case(case, a.old, text)  # warm: Numba's cache, the GGUF folder, the page cache
        run_case(case, a.new, text)
        for r in range(a.rounds):
            order = [(a.old, old), (a.new, new)] if r % 2 == 0 else [(a.new, new), (a.old, old)]
            for src, into in order:
                into.append(run_case(case, src, text))
        ratios = [n / o for n, o in zip(new, old)]
        results[case] = {"old": old, "new": new}
        print(
            f"{case:8s} old {statistics.median(old):.4g} s  new {statistics.median(new):.4g} s  "
            f"new/old {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})",
            flush=True,
        )
    print(f"load at end {os.getloadavg()[0]:.2f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
