"""``headwise heads --max-memory``: a Llama-shaped 1.6 B-parameter bf16 checkpoint analysed layer by layer.

    .venv/bin/python benchmarks/memory_layers.py                 # builds the checkpoint in a temp dir (3.3 GB), runs
    .venv/bin/python benchmarks/memory_layers.py --keep DIR      # builds it in DIR once and keeps it

The checkpoint is built from random weights (std 0.02, bf16; hidden 2048, 24 layers, 16 heads of 128, 8 key/value
heads, MLP 8192, vocabulary 32,000, untied unembedding: 1.64 B parameters, 6.6 GB in float32) with a byte-level BPE
tokenizer trained on the bundled corpus; nothing of it is shipped. Each run is a fresh process
(``python -c`` calling ``headwise.cli.main`` and reading its own ``VmHWM`` — the kernel's high-water mark of its
resident memory, what ``ru_maxrss`` reports without the parent's pages a fork carries — and ``/proc/self/io``): the
unlimited run (the default budget: the whole model in float32) and three budgets. Each budget's ``heads.csv`` is
compared with the unlimited run's (1e-4, relative to max(1, |x|)); the disk's own rate is read with ``O_DIRECT``
(no page cache) for comparison with what the runs read. The load average and the CPU are recorded with every
result: other processes may share the machine, so times are noisy while memory is not.

Writes ``benchmarks/results/memory_layers.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CONFIG = dict(
    model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=2048, intermediate_size=8192,
    num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
    max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    rope_theta=10000.0, torch_dtype="bfloat16",
)  # fmt: skip
TEXT = (
    "When Mary and John went to the store, John gave a drink to Mary. The cat sat on the mat, and the cat sat on "
    "the mat again. Attention heads that copy, heads that look back one token, and heads that find the first token "
    "all show themselves on a text like this one, which repeats itself so that induction has something to find."
)
BUDGETS = ("1GB", "1.5GB", "3GB")

BUILD = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
folder, config = Path(sys.argv[1]), json.loads(sys.argv[2])
D, F, NL, H, KV, V = (config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "vocab_size"))
Dh = D // H
g = torch.Generator().manual_seed(0)
def w(*shape):
    return (0.02 * torch.randn(*shape, generator=g)).to(torch.bfloat16)
def ones():
    return (1.0 + 0.05 * torch.randn(D, generator=g)).to(torch.bfloat16)
save_file({"model.embed_tokens.weight": w(V, D), "model.norm.weight": ones(), "lm_head.weight": w(V, D)},
          folder / "model-00000.safetensors", metadata={"format": "pt"})
for start in range(0, NL, 4):
    shard = {}
    for i in range(start, min(NL, start + 4)):
        p = f"model.layers.{i}."
        shard |= {p + "self_attn.q_proj.weight": w(H * Dh, D), p + "self_attn.k_proj.weight": w(KV * Dh, D),
                  p + "self_attn.v_proj.weight": w(KV * Dh, D), p + "self_attn.o_proj.weight": w(D, H * Dh),
                  p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D),
                  p + "mlp.down_proj.weight": w(D, F), p + "input_layernorm.weight": ones(),
                  p + "post_attention_layernorm.weight": ones()}
    save_file(shard, folder / f"model-{start // 4 + 1:05d}.safetensors", metadata={"format": "pt"})
(folder / "config.json").write_text(json.dumps(config, indent=1))
from safetensors import safe_open
weight_map = {}
for path in sorted(folder.glob("model-*.safetensors")):
    with safe_open(str(path), "pt") as f:
        weight_map |= {name: path.name for name in f.keys()}
index = {"metadata": {"total_size": sum(p.stat().st_size for p in folder.glob("model-*.safetensors"))},
         "weight_map": weight_map}
(folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from headwise.study.options import sample_corpus
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train([str(sample_corpus())], trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>", "<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(str(folder / "tokenizer.json"))
"""

RUN = r"""
import json, sys, time
from headwise.cli import main
start = time.perf_counter()
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code or 0
seconds = time.perf_counter() - start
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
io = dict(l.split(": ") for l in open("/proc/self/io"))
print("RESULT " + json.dumps({"code": code, "seconds": seconds, "peak_bytes": int(status["VmHWM"].split()[0]) * 1024,
                              "read_bytes": int(io["read_bytes"]), "rchar": int(io["rchar"])}))
"""


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), HF_HUB_OFFLINE="1")
    e["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + e.get("PYTHONPATH", "")
    return e


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def run(folder: Path, out: Path, budget: str | None, *, extra: list[str] | None = None) -> dict:
    return run_command(["heads", TEXT, "--model", str(folder), "--out", str(out), *(extra or [])], budget)


def run_command(args: list[str], budget: str | None) -> dict:
    """``headwise ARGS [--max-memory BUDGET]`` in a fresh process: its exit code, seconds, peak resident memory
    (``VmHWM``), bytes read, the load average before and after, its ``memory:`` lines and the last 300 characters
    of its stderr."""
    if budget is not None:
        args = [*args, "--max-memory", budget]
    load = os.getloadavg()
    proc = subprocess.run([sys.executable, "-c", RUN, *args], env=env(), capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(proc.stderr[-2000:])
    result = json.loads(lines[-1][7:])
    result.update(budget=budget, loadavg_before=load, loadavg_after=os.getloadavg(), stderr=proc.stderr[-300:])
    result["route"] = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip().startswith("memory:")]
    return result


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def max_difference(a: Path, b: Path) -> float:
    """Largest |x − y| / max(1, |x|) over the numeric cells of two heads.csv (text cells must be equal)."""
    ha, ra = read_csv(a)
    hb, rb = read_csv(b)
    assert ha == hb and len(ra) == len(rb)
    worst = 0.0
    for x_row, y_row in zip(ra, rb):
        for x, y in zip(x_row, y_row):
            try:
                fx, fy = float(x), float(y)
            except ValueError:
                if x != y:
                    return float("inf")
                continue
            if fx != fx and fy != fy:
                continue
            worst = max(worst, abs(fx - fy) / max(1.0, abs(fx)))
    return worst


def disk_rate(folder: Path) -> float:
    """Bytes per second read from the checkpoint's files with O_DIRECT (the disk, not the page cache)."""
    total, start = 0, time.perf_counter()
    for path in sorted(folder.glob("*.safetensors")):
        proc = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct"], capture_output=True)
        if proc.returncode:
            return float("nan")
        total += path.stat().st_size
    return total / (time.perf_counter() - start)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", type=Path, default=None, help="build the checkpoint here once and keep it")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="headwise-1b6-") as tmp:
        folder = args.keep or Path(tmp) / "llama-1b6"
        if not (folder / "config.json").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", BUILD, str(folder), json.dumps(CONFIG)], env=env(), check=True)
            print(f"built {folder} in {time.perf_counter() - t:.0f} s", flush=True)
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        rate = disk_rate(folder)
        runs = {"unlimited": run(folder, Path(tmp) / "unlimited", None)}
        print("unlimited", {k: v for k, v in runs["unlimited"].items() if k != "stderr"}, flush=True)
        for budget in BUDGETS:
            r = run(folder, Path(tmp) / budget, budget)
            r["max_difference"] = max_difference(
                Path(tmp) / "unlimited" / "heads.csv", Path(tmp) / budget / "heads.csv"
            )
            r["time_ratio"] = r["seconds"] / runs["unlimited"]["seconds"]
            r["read_rate"] = r["read_bytes"] / r["seconds"]
            runs[budget] = r
            print(budget, {k: v for k, v in r.items() if k != "stderr"}, flush=True)
    result = {
        "cpu": cpu_model(), "cores": os.cpu_count(), "omp_threads": env()["OMP_NUM_THREADS"],
        "checkpoint": {"config": CONFIG, "bytes": size, "parameters": 1_638_000_000},
        "disk_rate_bytes_per_s": rate, "text": TEXT, "runs": runs,
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "memory_layers.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS / 'memory_layers.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
