"""One rank of a fault-injection world (started by tests/hardening/test_distributed_faults.py).

``fault_worker.py WORKDIR SCHEME FAULT FAULTY_RANK``: SCHEME is ``ring`` (ring attention forward and backward, the
fault injected in the faulty rank's first block-kernel call, while its key/value shard is in flight) or
``tp`` (a tensor-parallel forward, the fault injected just before the row-parallel ``Wo`` and its
all-reduce). FAULT is ``raise`` (an exception propagates and the process exits with status 1),
``exit`` (``os._exit(3)`` — a crash, no clean-up) or ``hang`` (the rank stops answering: it sleeps
far past the collective timeout). The healthy ranks write ``WORKDIR/rank<r>.json``: the exception they
got (type, message), when it came (seconds after the collective started) and their timeout.
"""

import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from headwise.distributed import init_from_env

workdir, scheme, fault, faulty = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
rank, world = init_from_env("gloo")
timeout_s = float(os.environ["HEADWISE_DIST_TIMEOUT"])
started = {"t": None}


class Fault(RuntimeError):
    pass


def inject():
    if rank != faulty:
        return
    if fault == "raise":
        raise Fault(f"injected failure on rank {rank}")
    if fault == "exit":
        os._exit(3)
    if fault == "hang":
        time.sleep(20 * timeout_s)
        os._exit(4)


def run_ring():
    """Forward and backward of ring attention; the faulty rank fails in its first block-kernel call of
    the forward (its key/value shard is already posted to the next rank, so the healthy ranks may finish
    the forward and then wait on it in the backward's exchange of gradient accumulators)."""
    from headwise.distributed import MathKernel, ring_attention

    class FaultyKernel(MathKernel):
        armed = False

        def forward(self, q, k, v, *, causal, scale):
            if FaultyKernel.armed:
                inject()
            return super().forward(q, k, v, causal=causal, scale=scale)

    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g, requires_grad=True) for _ in range(3))
    ring_attention(q, k, v, kernel=FaultyKernel(), causal=True).sum().backward()  # warm-up: the world works
    FaultyKernel.armed = True
    started["t"] = time.monotonic()
    out = ring_attention(q, k, v, kernel=FaultyKernel(), causal=True)
    out.sum().backward()
    return out.detach()


def run_tp():
    from torch.distributed.device_mesh import init_device_mesh

    from headwise import MultiHeadAttention
    from headwise.distributed import parallelize_attention

    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4)
    mesh = init_device_mesh("cpu", (world,))
    parallelize_attention(m, mesh)
    x = torch.randn(2, 5, 16)
    m(x)  # a warm-up call: the world works
    m.Wo.register_forward_pre_hook(lambda mod, args: inject())
    started["t"] = time.monotonic()
    out, _ = m(x)
    return out.wait() if hasattr(out, "wait") else out


try:
    result = {"scheme": scheme, "fault": fault, "rank": rank, "timeout_s": timeout_s}
    try:
        out = run_ring() if scheme == "ring" else run_tp()
        float(out.sum())  # make sure any asynchronous collective has completed
        result["error"] = None
    except Fault:
        raise
    except Exception as e:  # noqa: BLE001 - the point is to record what a healthy rank sees
        result["error"] = {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "message": str(e)}
        result["traceback"] = traceback.format_exc()
    result["elapsed_s"] = None if started["t"] is None else time.monotonic() - started["t"]
    (workdir / f"rank{rank}.json").write_text(json.dumps(result))
finally:
    sys.stdout.flush()
os._exit(0)  # no destroy_process_group: its barrier would wait for the faulty rank
