"""Every tool that fits on a checkpoint with Llama 3 8B's exact shapes, under ``--max-memory 4GB``, each a fresh
process: its peak resident memory (``VmHWM``), its time, the bytes it read.

    .venv/bin/python benchmarks/memory_8b.py [--keep DIR] [--only heads,qk,patch,importance,circuit]
        [--shapes mistral-7b] [--pairs N] [--method eap|atp*]

The checkpoint (written once by ``benchmarks/memory_layers.py``'s builder, random bf16 weights, 4 layers a shard and
an index; 16 GB): hidden 4,096, 32 layers, 32 query heads in 8 key/value groups, MLP 14,336, vocabulary 128,256,
untied — 8.03 B parameters; or, with ``--shapes mistral-7b``, Mistral 7B's (:data:`MISTRAL`). The cases:

- ``heads``: ``headwise heads`` on a text of 256 tokens (statistics, the example drawn);
- ``qk``: ``headwise qk`` of layer 16's head 5 at the last position (one forward pass, then one layer at a time);
- ``patch``: ``headwise patch`` of one clean/corrupted pair (every head, exact: a pass carries as many jobs as the
  budget holds, each layer read once a pass);
- ``importance``: ``headwise heads --importance`` with the sample corpus's first 8 lines, measured on ``--sentences``
  of them (default 1: the estimate keeps every head's write change, ``(B, T, D)`` each — 8 sentences of Llama 3 8B
  need 14 GB), the estimate walked back layer by layer, the top heads measured exactly, the pruning curve;
- ``circuit``: ``headwise circuit`` on ``--pairs`` indirect-object pairs (default 2) with ``--method`` (default
  ``eap``), the exact check of the top 20 edges (refused where it does not fit, the refusal's line recorded).

Runs are merged into the results file: a case run again replaces its own record (each stamped with its time and the
load average around it), the others stay.

The CPU, the core count and the load average are recorded with every run; the disk's own read rate of the
checkpoint with ``O_DIRECT`` where the file system allows it. Writes ``benchmarks/results/memory_8b.json``.
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

from memory_layers import BUILD, RESULTS, ROOT, cpu_model, disk_rate, env, run_command

CONFIG = dict(
    model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
    max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    rope_theta=500000.0, torch_dtype="bfloat16",
)  # fmt: skip
#: Another family's 7 B shapes (Mistral 7B v0.1: the same tensor names, a 4,096-token sliding window, a vocabulary
#: of 32,000): 7.24 B parameters.
MISTRAL = dict(
    CONFIG, model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=32000, max_position_embeddings=32768,
    rope_theta=10000.0, sliding_window=4096,
)  # fmt: skip
SHAPES = {"llama-3-8b": CONFIG, "mistral-7b": MISTRAL}
BUDGET = "4GB"


def parameters(config: dict) -> int:
    """The checkpoint's parameter count (Llama's tensors: projections, MLP, two norms a layer; embedding, final norm
    and unembedding)."""
    D, F, NL, H, KV, V = (config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                              "num_attention_heads", "num_key_value_heads", "vocab_size"))  # fmt: skip
    Dh = D // H
    return NL * (2 * D * H * Dh + 2 * D * KV * Dh + 3 * D * F + 2 * D) + 2 * V * D + D


def text_of(folder: Path, tokens: int) -> str:
    """The bundled sample corpus's first lines, cut to ``tokens`` tokens of the checkpoint's tokenizer."""
    from tokenizers import Tokenizer

    sys.path.insert(0, str(ROOT / "src"))
    from headwise.study.options import sample_corpus

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids: list[int] = []
    for line in sample_corpus().read_text(encoding="utf-8").splitlines():
        ids += tok.encode(" " + line.strip()).ids
        if len(ids) >= tokens:
            break
    return tok.decode(ids[:tokens])


def cases(
    folder: Path, out: Path, pairs_count: int = 2, method: str = "eap", sentences: int = 1
) -> dict[str, list[str]]:
    text = text_of(folder, 256)  # (puts the source on the path)
    from headwise.study.options import sample_corpus

    corpus = out / "corpus.txt"
    corpus.write_text("\n".join(sample_corpus().read_text(encoding="utf-8").splitlines()[:8]) + "\n", encoding="utf-8")
    pair = ("When Mary and John went to the store, John gave a drink to",
            "When Mary and John went to the store, Mary gave a drink to")  # fmt: skip
    pairs = out / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"clean": c, "corrupted": x, "answer": " Mary", "wrong": " John"}) + "\n"
                             for c, x in [(pair, pair[::-1])[i % 2] for i in range(pairs_count)]),
                     encoding="utf-8")  # fmt: skip
    model = ["--model", str(folder)]
    return {
        "heads": ["heads", text, *model, "--out", str(out / "heads")],
        "qk": ["qk", *model, "--text", text, "--head", "16.5", "--query", "-1", "--out", str(out / "qk")],
        "patch": ["patch", *model, "--clean", pair[0], "--corrupted", pair[1], "--answer", " Mary", "--wrong",
                  " John", "--out", str(out / "patch")],
        "importance": ["heads", *model, "--corpus", str(corpus), "--importance", "--importance-sentences",
                       str(sentences), "--out", str(out / "importance")],
        "circuit": ["circuit", *model, "--pairs", str(pairs), "--method", method, "--exact-top", "20", "--out",
                    str(out / "circuit")],
    }  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", type=Path, default=None, help="build the checkpoint here once and keep it")
    p.add_argument("--only", default="heads,qk", help="the cases to run (default: heads,qk)")
    p.add_argument("--shapes", default="llama-3-8b", choices=sorted(SHAPES), help="the family's shapes")
    p.add_argument("--pairs", type=int, default=2, help="circuit: indirect-object pairs (default 2)")
    p.add_argument("--method", default="eap", choices=["eap", "eap-ig", "atp*"], help="circuit: the method")
    p.add_argument("--sentences", type=int, default=1, help="importance: the sentences it measures on (default 1)")
    args = p.parse_args(argv)
    config = SHAPES[args.shapes]
    with tempfile.TemporaryDirectory(prefix="headwise-8b-") as tmp:
        folder = args.keep or Path(tmp) / f"{args.shapes}-shapes"
        built = None
        if not (folder / "model.safetensors.index.json").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", BUILD, str(folder), json.dumps(config)], env=env(), check=True)
            built = time.perf_counter() - t
            print(f"built {folder} in {built:.0f} s", flush=True)
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        rate = disk_rate(folder)
        runs = {}
        todo = cases(folder, Path(tmp), args.pairs, args.method, args.sentences)
        for name in args.only.split(","):
            r = run_command(todo[name], BUDGET)
            r["read_rate"] = r["read_bytes"] / r["seconds"]
            r["refused"] = r["stderr"].strip().splitlines()[-1] if r["code"] else None
            r["written"] = time.strftime("%Y-%m-%d %H:%M:%S")
            r["command"] = [a if len(a) < 80 else a[:77] + "..." for a in todo[name]]
            runs[name] = r
            print(name, {k: v for k, v in r.items() if k != "stderr"}, flush=True)
    name = "memory_8b.json" if args.shapes == "llama-3-8b" else f"memory_{args.shapes}.json"
    earlier = json.loads((RESULTS / name).read_text()) if (RESULTS / name).is_file() else {}
    if earlier.get("checkpoint", {}).get("config") == config:  # the same shapes: the other cases' records stay
        runs = {**earlier.get("runs", {}), **runs}
    result = {
        "cpu": cpu_model(), "cores": os.cpu_count(), "omp_threads": env()["OMP_NUM_THREADS"],
        "checkpoint": {"config": config, "bytes": size, "parameters": parameters(config), "built_seconds": built},
        "disk_rate_bytes_per_s": rate, "budget": BUDGET, "runs": runs,
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
