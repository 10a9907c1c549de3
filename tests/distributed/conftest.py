"""Launch a small gloo world of worker processes, torchrun-style, and collect what each rank saved.

Each test module starts its world once per world size (a module-scoped fixture) and runs many
sub-cases inside it, so the distributed suite stays within seconds rather than minutes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKERS = Path(__file__).parent / "workers"
TIMEOUT_S = 240  # the whole world; the workers' own collectives time out after HEADWISE_DIST_TIMEOUT


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_FAILURES: dict[tuple[str, int], str] = {}  # a world that failed is not started again for every test


def launch(worker: str, world_size: int, workdir: Path, *, timeout_s: float = TIMEOUT_S) -> list[dict]:
    """Run ``workers/<worker>`` on ``world_size`` ranks with torchrun's environment variables.

    Every rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (a free
    port) and writes ``workdir/rank<r>.pt``. Returns those dicts in rank order; fails the test with the
    ranks' logs if any rank exits non-zero or the world outlives ``timeout_s``.
    """
    if (worker, world_size) in _FAILURES:
        pytest.fail(f"(failed earlier in this session) {_FAILURES[worker, world_size]}")
    port = free_port()
    procs, logs = [], []
    for rank in range(world_size):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            HEADWISE_DIST_TIMEOUT="60",
            OMP_NUM_THREADS="1",
            PYTHONWARNINGS="ignore::FutureWarning",
        )
        log = open(workdir / f"rank{rank}.log", "w+")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKERS / worker), str(workdir)], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        )
    failed = None
    try:
        for p in procs:
            p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        failed = f"world of {world_size} did not finish within {timeout_s} s"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = []
    for rank, log in enumerate(logs):
        log.seek(0)
        text.append(f"--- rank {rank} (exit {procs[rank].returncode}) ---\n{log.read()[-4000:]}")
        log.close()
    if failed is None and any(p.returncode for p in procs):
        failed = "a rank failed"
    if failed:
        _FAILURES[worker, world_size] = message = f"{worker}: {failed}\n" + "\n".join(text)
        pytest.fail(message)
    return [torch.load(workdir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


@pytest.fixture(scope="session")
def launch_world():
    """The :func:`launch` function, for module-scoped fixtures that start one world per world size."""
    return launch


@pytest.fixture(scope="module")
def one_thread():
    """One thread in the test process, as torchrun gives each rank, whatever the tests before left: the ranks'
    float32 rounding depends on the thread count (measured: 2e-7 between counts on this suite's tiny decoder), so a
    one-process reference compared with the ranks is computed at theirs. Restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
