"""One rank of the restart test (started by torchrun from tests/distributed/test_init_attempts.py).

Joins the group through :func:`headwise.distributed.init_from_env`, all-reduces its rank + 1 and checks the sum;
on the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0) rank 1 then dies (exit 3), so torchrun restarts every rank
on the same static rendezvous store. argv: OUT (each attempt's sum written to ``OUT/attempt<a>-rank<r>.txt``).
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from headwise.distributed import init_from_env

rank, world = init_from_env("gloo", timeout_s=30)
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
(Path(sys.argv[1]) / f"attempt{attempt}-rank{rank}.txt").write_text(f"{float(total):g}")
dist.barrier()
if attempt == "0" and rank == 1:
    os._exit(3)
dist.destroy_process_group()
