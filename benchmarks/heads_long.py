"""``headwise heads --model smollm2`` at long inputs beside the same model's Hugging Face sdpa forward.

    .venv/bin/python benchmarks/heads_long.py 1024 8192        # one row per length, each case a fresh process
    .venv/bin/python benchmarks/heads_long.py --no-sdpa 32768  # the command alone
    .venv/bin/python benchmarks/heads_long.py --repeats 3 1024 # three rows, each the sdpa case then the command

Each row names the CPU and the load average at its start, and gives the command's time ÷ the sdpa forward's and
where the command's time went (``phases``: seconds from interpreter start to the command's first step, then each
step in order, timed in the command's own process by wrapping its steps: opening the model, the statistics — the
text's pass and the probe's — the table and roles lines, the files; ``heads.png`` is drawn in a forked child from
the moment the statistics are known, and ``files`` ends when it is joined).

Each case runs in its own process; its time is wall time from interpreter start to files written (the command) or
of one forward after the load (sdpa, ``model(ids)`` with no gradient; up to 2,048 tokens also the faster of two warm
forwards after it, ``sdpa_warm_s`` and ``ratio_to_warm``), and its peak is the process's peak resident
set (``ru_maxrss``; for the command, the larger of its own and its forked picture child's). The text is the
bundled sample corpus repeated until it holds L tokens (given as TEXT, or
as a one-line ``--corpus`` file past 100 kB, the most one argument may hold).

Beyond SmolLM2's context of 8,192 tokens (which the command refuses), the model is SmolLM2's own weights in a
folder whose config raises ``max_position_embeddings`` to L: the same computation at that length (rotary
positions past the trained range, so its statistics mean nothing about the model, but its cost is the cost).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SDPA = """
import json, resource, sys, time, torch
from transformers import AutoModelForCausalLM
from headwise.models import open_model
hm = open_model(sys.argv[2])
folder = hm.model.config._name_or_path
ids = torch.tensor([json.load(open(sys.argv[1]))])
model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
del hm
times = []
with torch.no_grad():
    for _ in range(1 + int(sys.argv[3])):  # the first forward after the load, then warm ones
        t = time.perf_counter()
        model(ids)
        times.append(time.perf_counter() - t)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"time_s": times[0], "warm_s": min(times[1:], default=None), "peak_mib": peak}))
"""

#: Warm forwards after the first, up to this many tokens (the first one is what the command pays; a warm one is the
#: steady state, the stricter yardstick).
WARM_UP_TO, WARM = 2048, 2


def tokens(hm, L: int) -> tuple[str, list[int]]:
    """A text of exactly L SmolLM2 tokens (``hm``: the opened model) from the sample corpus, and its ids."""
    lines = (ROOT / "src/headwise/data/corpus/web_sentences.txt").read_text().split("\n")
    parts, k = [], 0
    while True:
        parts.extend(lines[(k + j) % len(lines)] + " " for j in range(64))
        k += 64
        ids = hm.tokenizer.encode("".join(parts)).ids
        if len(ids) >= L:
            break
    return hm.tokenizer.decode(ids[:L]), ids[:L]


def stretched(hm, L: int, tmp: Path) -> str:
    """``smollm2``, or for L beyond its context (``hm``: the opened model) a folder of its weights whose config allows
    L positions."""
    if hm.max_length >= L:
        return "smollm2"
    src = Path(hm.model.config._name_or_path)
    folder = tmp / f"smollm2-{L}"
    folder.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            (folder / f.name).symlink_to(f.resolve())
    config = json.loads((src / "config.json").read_text())
    config["max_position_embeddings"] = L
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


#: The command in a fresh process, its steps timed (``phases``, seconds in order) and its peak resident set.
COMMAND = """
import time
t0, now = time.perf_counter(), time.time()
import atexit, json, resource, sys
START = t0 - (now - float(sys.argv[1]))  # the launch, on this process's clock
import headwise.cli.heads as H
import headwise.study as S
import headwise.study.decoder as D
import headwise.study.heads_model as M
import headwise.viz.report as R
from headwise.cli import entry
phases = {}

def timed(owner, name, phase):
    f = getattr(owner, name)
    def wrapped(*a, **k):
        start = time.perf_counter()
        phases.setdefault("startup and imports", start - START)  # the first step begins
        phases.setdefault(phase, 0.0)  # in the order the steps begin
        try:
            return f(*a, **k)
        finally:
            phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - start
    setattr(owner, name, wrapped)

timed(M, "open_heads_model", "model open")
timed(S, "decoder_heads", "statistics (text pass and probe)")
timed(D, "probe_detectors", "of which the probe")
timed(H, "print_head_table", "table")
timed(R, "write_heads_outputs", "files (heads.png joined)")
timed(R, "_joined", "of which waiting for heads.png")

def report():  # an exit handler: run by entry() once the command is done, before the process leaves
    total = time.perf_counter() - START
    phases["the rest (parsing, checks, tokens, printing)"] = total - sum(
        v for k, v in phases.items() if not k.startswith("of which")
    )
    phases["total"] = total
    peak = max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(json.dumps({"peak_mib": peak / 1024, "phases": phases}))

atexit.register(report)
sys.argv = ["headwise", *sys.argv[2:]]
entry()  # as the console script ends: main, then the prompt exit
"""


def case(cmd: list[str], *, command: bool = False) -> dict:
    """``cmd`` in a fresh process (``command``: the arguments of ``headwise`` run through :data:`COMMAND`): its wall
    time, the last line it printed, or its error."""
    if command:
        cmd = [sys.executable, "-c", COMMAND, repr(time.time()), *cmd]
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    wall = time.perf_counter() - start
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return {"wall_s": wall, "stdout_tail": p.stdout.strip().splitlines()[-1:]}


def measure(L: int, sdpa: bool = True) -> dict:
    """One row: the sdpa forward and the command on the same L tokens, each in a fresh process, side by side (the
    sdpa case first, the command right after it); the CPU, the load average at the start, the ratio and the
    command's phases with them."""
    from machine import cpu_model

    from headwise.models import open_model

    load = os.getloadavg()[0]

    hm = open_model("smollm2")  # once: the tokens, and the folder past the context
    text, ids = tokens(hm, L)
    with tempfile.TemporaryDirectory() as tmp:
        model = stretched(hm, L, Path(tmp))
        del hm  # not held while the cases run
        ids_file = Path(tmp) / "ids.json"
        ids_file.write_text(json.dumps(ids))
        given = [text]
        if len(text.encode()) > 100_000:  # past what one argument may hold (128 KiB): a corpus of one line
            (Path(tmp) / "text.txt").write_text(text.replace("\n", " ") + "\n")
            given = ["--corpus", str(Path(tmp) / "text.txt")]
        sdpa_out = {}
        if sdpa:
            warm = WARM if L <= WARM_UP_TO else 0
            got = case([sys.executable, "-c", SDPA, str(ids_file), model, str(warm)])
            sdpa_out = json.loads(got["stdout_tail"][0]) if "error" not in got else got
        cli = case(["heads", *given, "--model", model, "--out", str(Path(tmp) / "out")], command=True)
        size = (Path(tmp) / "out" / "headview.html").stat().st_size if "error" not in cli else None
    told = json.loads(cli["stdout_tail"][0]) if "error" not in cli else {}
    forward, heads = sdpa_out.get("time_s"), cli.get("wall_s")
    return {
        "L": L,
        "model": "smollm2" if model == "smollm2" else f"SmolLM2's weights, context raised to {L}",
        "cpu": cpu_model(),
        "load": round(load, 2),
        "sdpa_forward_s": forward,
        "sdpa_warm_s": sdpa_out.get("warm_s"),
        "sdpa_peak_mib": sdpa_out.get("peak_mib"),
        "heads_s": heads,
        "ratio": heads / forward if heads and forward else None,
        "ratio_to_warm": heads / sdpa_out["warm_s"] if heads and sdpa_out.get("warm_s") else None,
        "heads_peak_mib": told.get("peak_mib"),
        "phases": {k: round(v, 2) for k, v in told.get("phases", {}).items()},
        "headview_bytes": size,
        "error": cli.get("error") or sdpa_out.get("error"),
    }


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("lengths", nargs="*", type=int, default=[1024])
    parser.add_argument("--no-sdpa", action="store_true", help="the command alone")
    parser.add_argument("--repeats", type=int, default=1, help="rows per length")
    a = parser.parse_args(argv)
    for L in a.lengths:
        for _ in range(a.repeats):
            print(json.dumps(measure(L, not a.no_sdpa), ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
