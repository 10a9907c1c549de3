"""``headwise heads --model smollm2`` at long inputs beside the same model's Hugging Face sdpa forward.

    .venv/bin/python benchmarks/heads_long.py 1024 8192        # one row per length, each case a fresh process

Each case runs in its own process; its time is wall time from model load to files written (the command) or of
one forward after the load (sdpa, ``model(ids)`` with no gradient), and its peak is the process's peak resident
set (``ru_maxrss``). The text is the bundled sample corpus repeated until it holds L tokens.
"""

from __future__ import annotations

import json
import os
import resource
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
hm = open_model("smollm2")
folder = hm.model.config._name_or_path
ids = torch.tensor([json.load(open(sys.argv[1]))])
model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
del hm
t = time.perf_counter()
with torch.no_grad():
    model(ids)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"time_s": time.perf_counter() - t, "peak_mib": peak}))
"""


def tokens(L: int) -> tuple[str, list[int]]:
    """A text of exactly L SmolLM2 tokens from the sample corpus, and its ids."""
    from headwise.models import open_model

    hm = open_model("smollm2")
    lines = (ROOT / "src/headwise/data/corpus/web_sentences.txt").read_text().split("\n")
    text, k = "", 0
    while len(hm.tokenizer.encode(text).ids) < L:
        text += lines[k % len(lines)] + " "
        k += 1
    ids = hm.tokenizer.encode(text).ids[:L]
    return hm.tokenizer.decode(ids), ids


def case(cmd: list[str]) -> dict:
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child so far
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return {"wall_s": wall, "children_peak_mib": peak, "stdout_tail": p.stdout.strip().splitlines()[-1:]}


def main(lengths: list[int]) -> None:
    rows = []
    for L in lengths:
        text, ids = tokens(L)
        with tempfile.TemporaryDirectory() as tmp:
            ids_file = Path(tmp) / "ids.json"
            ids_file.write_text(json.dumps(ids))
            sdpa = case([sys.executable, "-c", SDPA, str(ids_file)])
            cli = case(
                [sys.executable, "-c", "import sys, resource, json; from headwise.cli import main; "
                 "code = 0\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code or 0\n"
                 "print(json.dumps({'peak_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))\n"
                 "sys.exit(code)",
                 "heads", text, "--model", "smollm2", "--out", str(Path(tmp) / "out")]
            )  # fmt: skip
            size = (Path(tmp) / "out" / "headview.html").stat().st_size if "error" not in cli else None
        sdpa_out = json.loads(sdpa["stdout_tail"][0]) if "error" not in sdpa else sdpa
        cli_peak = json.loads(cli["stdout_tail"][0])["peak_mib"] if "error" not in cli else None
        row = {
            "L": L,
            "sdpa_forward_s": sdpa_out.get("time_s"),
            "sdpa_peak_mib": sdpa_out.get("peak_mib"),
            "heads_s": cli.get("wall_s"),
            "heads_peak_mib": cli_peak,
            "headview_bytes": size,
            "error": cli.get("error") or sdpa_out.get("error"),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [1024])
