"""``headwise circuit`` on the bundled SmolLM2 (GGUF, 135 M parameters) whole and layer by layer: the peak resident
memory of each run against its budget, its time, and its circuit.json against the whole route's.

    .venv/bin/python benchmarks/memory_circuit.py [--methods eap,atp*] [--budgets 1GB,800MB]

Each run a fresh process (as ``benchmarks/memory_layers.py`` runs them: it reads its own ``VmHWM``), on the 8
indirect-object pairs of ``examples/ioi_pairs.jsonl`` with the exact check of the top 20 edges: the default budget
(the whole model in float32) and each budget given (below the whole route's need: layer by layer, each gradient pass
walking the layers back). Every layer-by-layer circuit.json is compared with the whole route's: each edge's estimate
and exact score (largest difference relative to the largest |score|), the circuit's edges. A budget the run refuses
is recorded with its one line. The CPU and the load average are recorded with every result.

Writes ``benchmarks/results/memory_circuit.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from memory_layers import RESULTS, ROOT, cpu_model, run_command

PAIRS = ROOT / "examples" / "ioi_pairs.jsonl"


def run(method: str, out: Path, budget: str | None) -> dict:
    args = ["circuit", "--model", "smollm2", "--pairs", str(PAIRS), "--method", method, "--out", str(out)]
    result = run_command(args, budget)
    result.update(method=method, refused=result["stderr"].strip().splitlines()[-1] if result["code"] else None)
    return result


def compare(whole: Path, layers: Path, method: str) -> dict:
    a = json.loads((whole / "circuit.json").read_text())
    b = json.loads((layers / "circuit.json").read_text())
    out = {"same_edges": [(e["sender"], e["receiver"]) for e in a["edges"]]
           == [(e["sender"], e["receiver"]) for e in b["edges"]],
           "same_circuit": a["circuit"]["edges"] == b["circuit"]["edges"]}  # fmt: skip
    for key in (method, "exact"):
        pairs = [(x["scores"][key], y["scores"][key]) for x, y in zip(a["edges"], b["edges"])
                 if x["scores"].get(key) is not None and y["scores"].get(key) is not None]  # fmt: skip
        scale = max(abs(x) for x, _ in pairs)
        out[f"{key}_scores"] = len(pairs)
        out[f"{key}_max_relative"] = max(abs(x - y) for x, y in pairs) / scale
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="eap,atp*")
    p.add_argument("--budgets", default="1GB,800MB")
    args = p.parse_args(argv)
    results: dict = {"cpu": cpu_model(), "pairs": str(PAIRS.relative_to(ROOT)), "runs": []}
    with tempfile.TemporaryDirectory(prefix="headwise-circuit-") as tmp:
        for method in args.methods.split(","):
            whole = Path(tmp) / f"{method}-whole"
            results["runs"].append(run(method, whole, None))
            print(json.dumps(results["runs"][-1]), flush=True)
            for budget in args.budgets.split(","):
                out = Path(tmp) / f"{method}-{budget}"
                result = run(method, out, budget)
                if result["code"] == 0:
                    result["against_whole"] = compare(whole, out, method)
                results["runs"].append(result)
                print(json.dumps(result), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "memory_circuit.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
