"""One rank of a library-level patching sweep across ranks (:func:`headwise.study.patch_across_ranks`) under
``torchrun --max-restarts 1``, in which rank 1 of the first attempt kills itself (SIGKILL) after its second shard.

argv: MODEL OUT CASES. Prints ``attempt A rank R computed [...] resumed [...]`` (and, before the kill, ``attempt 0
rank 1 saved [...]``); rank 0 of the attempt that finishes saves ``OUT/result.pt``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
from _lines import say

from headwise import study
from headwise.models import open_model
from headwise.patching import logit_difference

model, out, cases = sys.argv[1:4]
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
inputs = torch.load(cases, weights_only=False)
hm = open_model(model)
metric = logit_difference(inputs["answer"], inputs["wrong"])
plan = study.plan_sweep(hm, inputs["clean"].shape[1], inputs["heads"], 1)
mine = study.deal([s.cost for s in plan], int(os.environ["WORLD_SIZE"]))[rank]


def progress(done: int, total: int) -> None:
    if attempt == 0 and rank == 1 and done == 2:
        say(f"attempt 0 rank 1 saved {mine[:2]}")
        os.kill(os.getpid(), signal.SIGKILL)


run = study.patch_across_ranks(
    hm, inputs["clean"], inputs["corrupted"], metric, heads=inputs["heads"], batch_size=1, out=Path(out),
    progress=progress,
)  # fmt: skip
say(f"attempt {attempt} rank {rank} computed {run.computed} resumed {run.resumed}")
if rank == 0:
    torch.save({"patched": run.patching.patched, "positions": run.positions}, Path(out) / "result.pt")
