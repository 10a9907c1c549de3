"""One rank of the library-level sweeps across ranks: :func:`headwise.study.patch_across_ranks` and
:func:`headwise.study.circuit_across_ranks` on the cases of ``WORKDIR/cases.pt``; saves ``WORKDIR/rank<r>.pt``.

argv: WORKDIR. ``cases.pt`` holds ``{"model": folder, "clean": (P, L), "corrupted": (P, L), "answer": [P],
"wrong": [P], "patch": [options…], "circuit": [options…]}``; each result is saved beside its options.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from headwise import study
from headwise.models import open_model
from headwise.patching import logit_difference

workdir = Path(sys.argv[1])
rank = int(os.environ["RANK"])
cases = torch.load(workdir / "cases.pt", weights_only=False)
hm = open_model(cases["model"])
c, x, answer, wrong = cases["clean"], cases["corrupted"], cases["answer"], cases["wrong"]
metric = logit_difference(answer, wrong)
saved: dict = {"patch": [], "circuit": []}
with study.rank_group() as (_, world, _):
    for k, options in enumerate(cases["patch"]):
        run = study.patch_across_ranks(hm, c, x, metric, out=workdir / f"patch{k}", **options)
        saved["patch"].append(
            {
                "patched": None if run.patching is None else run.patching.patched,
                "metric_clean": None if run.patching is None else run.patching.metric_clean,
                "passes": None if run.patching is None else run.patching.passes,
                "positions": run.positions,
                "shards": run.shards,
                "computed": run.computed,
                "payload_bytes": run.payload_bytes,
            }
        )
    for options in cases["circuit"]:
        run = study.circuit_across_ranks(hm, c, x, answer=answer, wrong=wrong, **options)
        saved["circuit"].append(
            {
                "circuit": None if run.circuit is None else run.circuit.to_dict(),
                "pairs": run.pairs,
                "gathers": run.gathers,
                "payload_bytes": run.payload_bytes,
            }
        )
    saved["world"] = world
torch.save(saved, workdir / f"rank{rank}.pt")
