"""One rank of the layer-shards test world (started by tests/distributed/test_layer_shards.py).

Opens ``<workdir>/llama`` layer by layer, runs ``<workdir>/inputs.pt``'s batch through this rank's shard of the
blocks (headwise.models.layered.sharded_hidden_states) and writes ``<workdir>/rank<r>.pt``: the final hidden states
every rank returns, the units this rank brought in, and the seconds the pass took.
"""

import sys
import time
from pathlib import Path

import torch

from headwise.distributed import init_from_env, shutdown
from headwise.models import open_model
from headwise.models.layered import sharded_hidden_states

workdir = Path(sys.argv[1])
rank, world = init_from_env("gloo")
try:
    case = torch.load(workdir / "inputs.pt")
    hm = open_model(workdir / "llama", backend="headwise", by_layer=True)
    brought = []
    hm.stream.on_unit = lambda unit, index, total: brought.append(unit)
    start = time.perf_counter()
    hidden = sharded_hidden_states(hm.model, case["ids"], case["mask"])
    seconds = time.perf_counter() - start
    torch.save({"hidden": hidden, "brought": brought, "seconds": seconds}, workdir / f"rank{rank}.pt")
finally:
    shutdown()
