"""One rank of a resumable importance run across ranks (:func:`headwise.study.importance_across_ranks`) under
``torchrun --max-restarts 1``, in which rank 1 of the first attempt kills itself (SIGKILL) in the gates' pass of its
second batch, once its first batch's phase-1 shard is saved.

argv: MODEL OUT OPTIONS (JSON). Prints ``attempt A rank R computed [...] resumed [...]`` (and, before the kill,
``attempt 0 rank 1 saved [...]``: the batches whose phase-1 shards are on disk); rank 0 of the attempt that finishes
saves ``OUT/result.npy``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
from _lines import say

from headwise import study
from headwise.models import open_model

model, out, options = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
hm = open_model(model)
corpus = Path(model).parent / "corpus.txt"
lines = [line for line in corpus.read_text(errors="replace").splitlines() if line.strip()][:10]
batches = list(study.text_batches(hm, lines, 3, lambda m: None))
mine = study.deal([float(b[0].numel()) for b in batches], int(os.environ["WORLD_SIZE"]))[rank]
seen: list = []


def progress(stage: str, done: int, total: int) -> None:
    if attempt == 0 and rank == 1 and stage == "importance":
        seen.append(done)
        if len(seen) == 2:  # the second batch's gates' pass: the first batch's shard is saved
            saved = [k for k in mine if (out / "importance-shards" / f"shard-{k:06d}.safetensors").is_file()]
            say(f"attempt 0 rank 1 saved {json.dumps(saved)}")
            os.kill(os.getpid(), signal.SIGKILL)


run = study.importance_across_ranks(hm, batches, out=out, progress=progress, **options)
say(f"attempt {attempt} rank {rank} computed {json.dumps(run.computed)} resumed {json.dumps(run.resumed)}")
if rank == 0:
    np.save(out / "result.npy", np.array(run.result, dtype=object), allow_pickle=True)
