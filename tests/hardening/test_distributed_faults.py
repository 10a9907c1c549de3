"""Distributed faults: a rank that raises, crashes or hangs during ring attention or a tensor-parallel
forward makes the other ranks fail with a clear error within the collective timeout — never a hang.

Each case starts a gloo world on CPU (``workers/fault_worker.py``), torchrun-style, with
``HEADWISE_DIST_TIMEOUT`` = :data:`TIMEOUT_S`, injects the fault on rank 1 and checks what the healthy
ranks saw: the exception and its message, how long after the faulty call it came, and that they exited.
Figures: docs/reliability.md ("Distributed faults").
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).parent / "workers" / "fault_worker.py"
TIMEOUT_S = 10.0  # the collectives' timeout inside the world
START_SLACK_S = 90.0  # starting the processes (imports, rendezvous) on a loaded 2-core machine
FAULTY = 1
EXIT_CODE = {"raise": 1, "exit": 3}

RING_ERROR = r"ring_attention: rank \d could not exchange key/value shards with its ring neighbours"
GLOO_ERROR = r"Connection (closed|reset) by peer|Timed out waiting \d+ms"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(scheme: str, fault: str, world: int, workdir: Path) -> tuple[dict[int, dict], list[int | None], float]:
    """Start the world, wait for the healthy ranks, kill what is left.

    Returns ``(reports by healthy rank, exit codes by rank, seconds until every healthy rank exited)``.
    """
    port = _free_port()
    procs, logs = [], []
    t0 = time.monotonic()
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            HEADWISE_DIST_TIMEOUT=str(TIMEOUT_S),
            OMP_NUM_THREADS="1",
            PYTHONWARNINGS="ignore",
        )
        log = open(workdir / f"rank{rank}.log", "w+")  # noqa: SIM115 - closed below
        logs.append(log)
        argv = [sys.executable, str(WORKER), str(workdir), scheme, fault, str(FAULTY)]
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    healthy = [r for r in range(world) if r != FAULTY]
    try:
        for r in healthy:
            procs[r].wait(timeout=START_SLACK_S + 3 * TIMEOUT_S)
        if fault != "hang":
            procs[FAULTY].wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    finally:
        wall = time.monotonic() - t0
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    text = []
    for r, log in enumerate(logs):
        log.seek(0)
        text.append(f"--- rank {r} (exit {codes[r]}) ---\n{log.read()[-3000:]}")
        log.close()
    reports = {}
    for r in healthy:
        path = workdir / f"rank{r}.json"
        assert path.exists(), "a healthy rank wrote no report:\n" + "\n".join(text)
        reports[r] = json.loads(path.read_text())
    return reports, codes, wall


def check(scheme, fault, world, workdir):
    reports, codes, wall = run_world(scheme, fault, world, workdir)
    for r, rep in reports.items():
        assert codes[r] == 0, (r, codes)  # it finished (with the error recorded), nobody had to kill it
        err = rep["error"]
        assert err is not None, f"rank {r} did not notice the fault on rank {FAULTY}"
        assert "RuntimeError" in err["mro"], err
        pattern = RING_ERROR if scheme == "ring" else GLOO_ERROR
        assert re.search(pattern, err["message"]), err["message"]
        assert rep["elapsed_s"] <= TIMEOUT_S + 5.0, f"rank {r} took {rep['elapsed_s']:.1f} s to fail"
        if fault == "hang":
            assert rep["elapsed_s"] >= 0.9 * TIMEOUT_S  # nothing but the timeout can detect a silent rank
            assert re.search(r"Timed out waiting", err["message"]), err["message"]
    if fault in EXIT_CODE:
        assert codes[FAULTY] == EXIT_CODE[fault], codes
    times = {r: round(rep["elapsed_s"], 3) for r, rep in reports.items()}
    print(f"\n{scheme}/{fault}/world {world}: detected after {times} s; world over in {wall:.1f} s")
    return reports


FAST = [("tp", "exit", 2)]
SLOW = [
    ("ring", "raise", 2),
    ("ring", "exit", 2),
    ("ring", "hang", 2),
    ("tp", "raise", 2),
    ("tp", "hang", 2),
    ("ring", "exit", 4),
]


@pytest.mark.parametrize(
    "scheme, fault, world",
    [pytest.param(*c, id="-".join(map(str, c))) for c in FAST]
    + [pytest.param(*c, id="-".join(map(str, c)), marks=pytest.mark.slow) for c in SLOW],
)
def test_a_failing_rank_makes_the_others_fail_within_the_timeout(scheme, fault, world, tmp_path):
    check(scheme, fault, world, tmp_path)
