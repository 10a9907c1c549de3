"""One rank of a library-level corpus run (:func:`headwise.study.corpus_heads`) with a rank that may stall.

argv: MODEL CORPUS OUT STALL_RANK STALL_S TIMEOUT_S. The rank ``STALL_RANK`` sleeps ``STALL_S`` seconds after its
first shard; the others go on to the barrier. Prints ``ok`` or ``error: <the exception's line>``; exit 0 or 3.
"""

from __future__ import annotations

import os
import sys
import time

from headwise import study
from headwise.models import open_model

model, corpus, out, stall_rank, stall_s, timeout_s = sys.argv[1:7]
rank = int(os.environ["RANK"])


def progress(done: int, total: int) -> None:
    if rank == int(stall_rank) and done == 1:
        time.sleep(float(stall_s))


hm = open_model(model)
opts = study.HeadsOptions(corpus=corpus, model=model, out=out, batch_size=2)
try:
    study.corpus_heads(
        hm, opts, study.plan_decoder(hm, opts), warn=lambda m: None, progress=progress, timeout_s=float(timeout_s)
    )
except (study.CollectiveTimeout, ValueError) as e:
    print(f"error: {e}", flush=True)
    sys.exit(3)
print("ok", flush=True)
