"""The data-parallel corpus run measured: 1 process × T threads against P ranks × 1 thread (``torchrun``), the bytes
all-reduced, and the time per document — what docs/distributed.md's planning table is computed from.

    python benchmarks/distributed_corpus.py one  MODEL CORPUS OUT THREADS     # a world of one gloo rank
    torchrun --nproc-per-node P benchmarks/distributed_corpus.py ranks MODEL CORPUS OUT 1

Each prints one JSON line (rank 0): documents, tokens, shards, the slowest rank's shard time, the reduction's time,
the all-reduced bytes. ``OUT`` is emptied of shards first (nothing resumed). Measured under the machine's load
(the load average is printed with it); run it on a quiet machine for the final numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from headwise import study
from headwise.models import open_model


def main() -> None:
    mode, model, corpus, out, threads = sys.argv[1:6]
    torch.set_num_threads(int(threads))
    out = Path(out)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        shutil.rmtree(out / "shards", ignore_errors=True)
    t0 = time.perf_counter()
    hm = open_model(model)
    opened = time.perf_counter() - t0
    opts = study.HeadsOptions(corpus=corpus, model=model, out=out, batch_size=8)
    plan = study.plan_decoder(hm, opts)
    if mode == "one":
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        time.sleep(1.0)  # rank 0 has emptied the shards
    t1 = time.perf_counter()
    run = study.corpus_heads(hm, opts, plan, warn=lambda m: None)
    total = time.perf_counter() - t1
    if dist.is_initialized():
        dist.destroy_process_group()
    if rank == 0:
        tokens = run.heads.report.num_tokens
        print(json.dumps({
            "mode": mode, "ranks": run.world_size, "threads": int(threads), "documents": run.documents,
            "tokens": tokens, "shards": len(study.plan_shards([0] * run.documents, 8)),
            "open_s": round(opened, 2), "slowest_shards_s": round(run.slowest_seconds, 2),
            "reduce_s": round(run.reduce_seconds, 3), "run_s": round(total, 2),
            "s_per_document": round(run.slowest_seconds / run.documents, 4),
            "allreduce_bytes": run.payload_bytes, "load": os.getloadavg()[0],
            "cpu": _cpu(),
        }))  # fmt: skip


def _cpu() -> str:
    with open("/proc/cpuinfo") as fh:
        return next((line.split(":", 1)[1].strip() for line in fh if "model name" in line), "?")


if __name__ == "__main__":
    main()
