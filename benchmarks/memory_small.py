"""Every command on the bundled SmolLM2 (GGUF, Q4_1, 135 M parameters) under ``--max-memory 400MB``, 256 tokens.

    .venv/bin/python benchmarks/memory_small.py [--budget 400MB] [--commands heads,importance,patch,qk,circuit]
                                                [--pairs 8] [--name memory_small]

Each command runs in a fresh process (as ``benchmarks/memory_layers.py`` runs them: it reads its own ``VmHWM``, the
kernel's high-water mark of the whole process's resident memory) on ``--model smollm2 --max-memory BUDGET`` (and
``--no-cache`` where the command has it) with a text of 256 tokens or an indirect-object pair of 256 tokens:

- ``heads TEXT``: the statistics of the text, the example drawn, the probe;
- ``heads TEXT --importance --corpus FILE``: FILE holds the text's sentences, one a line (256 tokens in all);
- ``patch --clean … --corrupted … --answer ' Mary' --wrong ' John'``: the exact sweep of every head;
- ``qk --text TEXT --head 17.3 --query -1``: one head's score split at the last token;
- ``circuit --pairs FILE``: ``--pairs`` pairs of 256 tokens (the filler varied per pair).

A run the budget refuses is recorded with its one line (and whether it named the amount it needs). Its peak, seconds,
exit code, the CPU and the load average before and after are recorded with every result: other processes may share
the machine, so times are noisy while memory is not.

Writes ``benchmarks/results/memory_small.json`` (``--name``: another name, for a run before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path

from memory_layers import RESULTS, cpu_model, run_command

BASE = (
    "The cat sat on the mat, and the cat sat on the mat again. Attention heads that copy, heads that look back one "
    "token, and heads that find the first token all show themselves on a text like this one, which repeats itself "
    "so that induction has something to find. "
)
FILL = "The dog ran to the park and back home again before the rain came down on the town"
#: 256 tokens under SmolLM2's tokenizer (four times BASE's 57, then FILL's words).
TEXT = BASE * 4 + FILL + " " + " ".join(FILL.split()[:14])
#: the indirect-object sentence (14 tokens) after 242 tokens of filler: a pair of 256 tokens
IOI = " When Mary and John went to the store, {} gave a drink to"
PREFIX = (BASE * 4).strip() + " " + FILL
NAMES = [("Mary", "John"), ("Anna", "Paul"), ("Sarah", "David"), ("Emma", "James"), ("Lucy", "Peter"),
         ("Alice", "Mark"), ("Kate", "Tom"), ("Jane", "Mike")]  # fmt: skip


def pair(i: int) -> dict:
    """The i-th pair: the same filler, the names changed (clean: the second name repeated; corrupted: the first)."""
    a, b = NAMES[i % len(NAMES)]
    sentence = IOI.replace("Mary", a).replace("John", b)
    return {"clean": PREFIX + sentence.format(b), "corrupted": PREFIX + sentence.format(a), "answer": f" {a}",
            "wrong": f" {b}"}  # fmt: skip


def commands(out: Path, corpus: Path, pairs: Path) -> dict[str, list[str]]:
    model = ["--model", "smollm2"]
    p = pair(0)
    return {
        "heads": ["heads", TEXT, *model, "--no-cache", "--out", str(out / "heads")],
        "importance": ["heads", TEXT, *model, "--no-cache", "--importance", "--corpus", str(corpus), "--out",
                       str(out / "importance")],
        "patch": ["patch", *model, "--clean", p["clean"], "--corrupted", p["corrupted"], "--answer", p["answer"],
                  "--wrong", p["wrong"], "--out", str(out / "patch")],
        "qk": ["qk", *model, "--text", TEXT, "--head", "17.3", "--query", "-1", "--out", str(out / "qk")],
        "circuit": ["circuit", *model, "--pairs", str(pairs), "--out", str(out / "circuit")],
    }  # fmt: skip


NEED = re.compile(r"(?:works for [^:]*: |needs about |is )([0-9.]+ [kMGT]?B)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", default="400MB")
    p.add_argument("--commands", default="heads,importance,patch,qk,circuit")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--name", default="memory_small")
    p.add_argument("--follow", type=int, default=3, help="reruns at the budget a refusal names (0: none)")
    args = p.parse_args(argv)
    results: dict = {"cpu": cpu_model(), "cores": os.cpu_count(), "omp_threads": os.environ.get("OMP_NUM_THREADS",
                     "2"), "budget": args.budget, "tokens": 256, "pairs": args.pairs, "runs": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="headwise-small-") as tmp:
        out = Path(tmp)
        corpus = out / "corpus.txt"
        corpus.write_text("\n".join(s.strip() + "." for s in TEXT.split(".") if s.strip()) + "\n")
        pairs = out / "pairs.jsonl"
        pairs.write_text("".join(json.dumps(pair(i)) + "\n" for i in range(args.pairs)))
        every = commands(out, corpus, pairs)
        for name in args.commands.split(","):
            budget, runs = args.budget, []
            for _ in range(1 + args.follow):  # the budget given, then the budget each refusal names
                result = measured(every[name], budget)
                runs.append(result)
                print(name, json.dumps({k: result[k] for k in ("budget", "code", "seconds", "peak_bytes",
                      "within_budget", "loadavg_before", "loadavg_after", "refused")}), flush=True)  # fmt: skip
                if not result["names_need"]:
                    break
                budget = result["names_need"].replace(" ", "")
            results["runs"][name] = runs
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


def measured(args: list[str], budget: str) -> dict:
    """One fresh run of ``args`` under ``budget``: :func:`memory_layers.run_command`'s record, with the refusal's line,
    the amount it names and whether the peak stayed within the budget."""
    result = run_command(args, budget)
    lines = result["stderr"].strip().splitlines()
    result["refused"] = lines[-1] if result["code"] and lines else None
    named = NEED.search(result["refused"] or "") if result["code"] == 2 else None
    result["names_need"] = named.group(1) if named else None
    result["within_budget"] = result["peak_bytes"] <= _bytes(budget)
    return result


def _bytes(size: str) -> int:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from headwise.models.memory import parse_size

    return parse_size(size)


if __name__ == "__main__":
    raise SystemExit(main())
