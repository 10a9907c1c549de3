"""``headwise heads --model smollm2`` at long inputs beside the same model's Hugging Face sdpa forward.

    .venv/bin/python benchmarks/heads_long.py 1024 8192        # one row per length, each case a fresh process
    .venv/bin/python benchmarks/heads_long.py --no-sdpa 32768  # the command alone

Each case runs in its own process; its time is wall time from interpreter start to files written (the command) or
of one forward after the load (sdpa, ``model(ids)`` with no gradient), and its peak is the process's peak resident
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
t = time.perf_counter()
with torch.no_grad():
    model(ids)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"time_s": time.perf_counter() - t, "peak_mib": peak}))
"""


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


def case(cmd: list[str]) -> dict:
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    wall = time.perf_counter() - start
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return {"wall_s": wall, "stdout_tail": p.stdout.strip().splitlines()[-1:]}


def measure(L: int, sdpa: bool = True) -> dict:
    """One row: the sdpa forward and the command on the same L tokens, each in a fresh process."""
    from headwise.models import open_model

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
            got = case([sys.executable, "-c", SDPA, str(ids_file), model])
            sdpa_out = json.loads(got["stdout_tail"][0]) if "error" not in got else got
        cli = case(
            [sys.executable, "-c", "import sys, resource, json; from headwise.cli import main; "
             "code = 0\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code or 0\n"
             "peak = max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))\n"
             "print(json.dumps({'peak_mib': peak / 1024}))\n"
             "sys.exit(code)",
             "heads", *given, "--model", model, "--out", str(Path(tmp) / "out")]
        )  # fmt: skip
        size = (Path(tmp) / "out" / "headview.html").stat().st_size if "error" not in cli else None
    cli_peak = json.loads(cli["stdout_tail"][0])["peak_mib"] if "error" not in cli else None
    return {
        "L": L,
        "model": "smollm2" if model == "smollm2" else f"SmolLM2's weights, context raised to {L}",
        "sdpa_forward_s": sdpa_out.get("time_s"),
        "sdpa_peak_mib": sdpa_out.get("peak_mib"),
        "heads_s": cli.get("wall_s"),
        "heads_peak_mib": cli_peak,
        "headview_bytes": size,
        "error": cli.get("error") or sdpa_out.get("error"),
    }


def main(argv: list[str]) -> None:
    sdpa = "--no-sdpa" not in argv
    for L in [int(x) for x in argv if x != "--no-sdpa"] or [1024]:
        print(json.dumps(measure(L, sdpa)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
