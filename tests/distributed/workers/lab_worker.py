"""One rank of the lab's experiments under torchrun's environment: a tiny heads-vs-one sweep (``workers="ranks"``)
and multi-seed induction, each rank's results written to ``OUT/rank<r>.json``.

argv: OUT.

The rank leaves with ``os._exit`` once its file is written and the group destroyed, as the ``headwise`` command does
(``headwise.cli.entry``): at the interpreter's own exit a rank was seen to abort ("terminate called without an active
exception", a C++ thread of the group's still joinable while static objects were torn down).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from headwise.distributed.ranks import init_group
from headwise.lab.heads_vs_one import run_heads_vs_one
from headwise.lab.induction import run_induction_seeds

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_lab_launch import HEADS, INDUCTION, SEEDS  # noqa: E402

out = Path(sys.argv[1])
launch = init_group(120.0)
heads = run_heads_vs_one(HEADS, workers="ranks")
seeds = run_induction_seeds(INDUCTION, SEEDS)
(out / f"rank{launch.rank}.json").write_text(json.dumps({"heads": heads, "induction": seeds}))
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
