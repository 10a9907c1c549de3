"""One rank of a resumable circuit run across ranks (:func:`headwise.study.circuit_across_ranks`) under
``torchrun --max-restarts 1``, in which rank 1 of the first attempt kills itself (SIGKILL) at its first step of the
faithfulness curve (the attribution and exact stages kept).

argv: MODEL OUT INPUTS. Prints ``attempt A rank R computed [...] resumed [...]`` (and ``attempt 0 rank 1 killed in
faithfulness`` before the kill); rank 0 of the attempt that finishes writes ``OUT/circuit.json``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
from _lines import say

from headwise import study
from headwise.models import open_model

model, out, inputs = sys.argv[1], Path(sys.argv[2]), torch.load(sys.argv[3], weights_only=False)
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
hm = open_model(model)


def progress(stage: str, done: int, total: int) -> None:
    if attempt == 0 and rank == 1 and stage == "faithfulness":
        say("attempt 0 rank 1 killed in faithfulness")
        os.kill(os.getpid(), signal.SIGKILL)


run = study.circuit_across_ranks(
    hm, inputs["clean"], inputs["corrupted"], answer=inputs["answer"], wrong=inputs["wrong"], out=out,
    progress=progress, **inputs["options"],
)  # fmt: skip
say(f"attempt {attempt} rank {rank} computed {json.dumps(run.computed)} resumed {json.dumps(run.resumed)}")
if rank == 0:
    (out / "circuit.json").write_text(json.dumps(run.circuit.to_dict()))
