""":func:`headwise.distributed.init_from_env` keeps each restart attempt's keys apart in the launch's store
(``headwise/attempt-<TORCHELASTIC_RESTART_COUNT>``, as the corpus run does): the store it hands to
``init_process_group`` writes there, and ``torchrun --max-restarts 1`` on a static rendezvous restarts a world whose
rank died into a working group."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from _corpus import free_port
from headwise.distributed import _group, attempt_store, init_from_env


@pytest.fixture
def agent_store(monkeypatch):
    """A TCP store served by this process, as torchrun's agent serves it, and its environment for rank 0 of 1."""
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=datetime.timedelta(seconds=10),
                           wait_for_workers=False)  # fmt: skip
    for name, value in dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                            TORCHELASTIC_USE_AGENT_STORE="True").items():  # fmt: skip
        monkeypatch.setenv(name, value)
    return master, port


@pytest.mark.parametrize("attempt", [None, "0", "3"])
def test_attempt_store_writes_under_the_attempts_prefix(agent_store, monkeypatch, attempt):
    master, port = agent_store
    if attempt is None:
        monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    else:
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
    store = attempt_store("127.0.0.1", port, 0, 1, datetime.timedelta(seconds=10))
    store.set("probe", "x")
    assert master.get(f"headwise/attempt-{attempt or '0'}/probe") == b"x"
    assert not master.check(["probe"])


def test_init_from_env_hands_the_attempts_store_to_the_group(agent_store, monkeypatch):
    master, _ = agent_store
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    seen = {}

    def record(backend, **kw):
        seen.update(kw, backend=backend)

    monkeypatch.setattr(_group.dist, "init_process_group", record)
    monkeypatch.setattr(_group.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(_group.dist, "get_world_size", lambda: 1)
    assert init_from_env("gloo", timeout_s=7) == (0, 1)
    assert (seen["backend"], seen["rank"], seen["world_size"]) == ("gloo", 0, 1)
    assert seen["timeout"] == datetime.timedelta(seconds=7)
    seen["store"].set("probe", "y")
    assert master.get("headwise/attempt-2/probe") == b"y"


def test_init_from_env_joins_a_real_group(agent_store, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    try:
        assert init_from_env("gloo", timeout_s=10) == (0, 1)
        assert dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_torchrun_restart_on_a_static_rendezvous(tmp_path):
    """Rank 1 dies after the first attempt's collective; torchrun restarts both ranks on the same store, and the
    second attempt's group forms and reduces (3 = 1 + 2 on each rank)."""
    worker = Path(__file__).parent / "workers" / "restart_worker.py"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
         "--monitor-interval", "0.2", "--master-port", str(free_port()), str(worker), str(tmp_path)],
        env=dict(env, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for attempt in (0, 1):
        for rank in (0, 1):
            assert (tmp_path / f"attempt{attempt}-rank{rank}.txt").read_text() == "3"
