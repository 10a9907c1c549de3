"""One rank of ``--importance``'s default route across ranks (:func:`headwise.study.estimate_across_ranks`) on the
cases of ``WORKDIR/cases.pt``; saves ``WORKDIR/rank<r>.pt``.

argv: WORKDIR. ``cases.pt`` holds ``{"model": folder, "lines": [str], "batch_size": int, "cases": [options…]}``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from headwise import study
from headwise.models import open_model

workdir = Path(sys.argv[1])
rank = int(os.environ["RANK"])
given = torch.load(workdir / "cases.pt", weights_only=False)
hm = open_model(given["model"])
batches = list(study.text_batches(hm, given["lines"], given["batch_size"], lambda m: None))
saved: dict = {"runs": []}
with study.rank_group() as (_, world, _):
    for options in given["cases"]:
        run = study.estimate_across_ranks(hm, batches, **options)
        r = run.result
        saved["runs"].append(
            {
                "batches": run.batches,
                "payload_bytes": run.payload_bytes,
                "estimate": r.estimate,
                "importance": r.importance,
                "ablation": r.ablation,
                "measured": r.measured,
                "base_loss": r.base_loss,
                "curves": r.curves,
                "tokens": r.num_tokens,
                "sequences": r.num_sequences,
                "agreement": r.agreement,
            }
        )
    saved["world"] = world
torch.save(saved, workdir / f"rank{rank}.pt")
