"""The lab's experiments under the same launcher: heads-vs-one with ``workers="ranks"`` and multi-seed induction,
their runs dealt across 2 gloo ranks — every rank's result equal to the one-process run's (each run seeded on its
own; wall-clock fields aside)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from headwise.lab.heads_vs_one import HeadsSetup
from headwise.lab.induction import InductionSetup

HEADS = HeadsSetup(tasks=("pair",), heads=(1, 2), seeds=2, steps=3, lrs=(1e-3, 3e-2), eval_size=32, probe_size=16)
INDUCTION = InductionSetup(steps=4, eval_every=2, probe_size=16, final_probe_size=32)
SEEDS = (7, 3, 5)
TIMES = {"seconds", "wall_seconds", "tokens_per_s", "elapsed_s"}


def _without_times(value):
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def test_induction_seeds_outside_a_launch_are_the_single_runs():
    from headwise.lab.induction import run_induction, run_induction_seeds

    got = json.loads(json.dumps(run_induction_seeds(INDUCTION, (3, 1))))
    assert [s["seed"] for s in got] == [3, 1]
    assert _without_times(got[1]) == _without_times(json.loads(json.dumps(run_induction(INDUCTION, seed=1).summary)))
    with pytest.raises(ValueError, match="seeds"):
        run_induction_seeds(INDUCTION, ())


def test_heads_vs_one_ranks_outside_a_launch_is_refused():
    from headwise.lab.heads_vs_one import run_heads_vs_one

    with pytest.raises(ValueError, match="workers: 'ranks' expects an initialised torch.distributed group"):
        run_heads_vs_one(HEADS, workers="ranks")


@pytest.mark.slow
def test_two_ranks_equal_one_process(tmp_path, one_thread):
    from _corpus import free_port
    from headwise.lab.heads_vs_one import run_heads_vs_one
    from headwise.lab.induction import run_induction_seeds

    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")  # fmt: skip
        worker = Path(__file__).parent / "workers" / "lab_worker.py"
        procs.append(subprocess.Popen([sys.executable, str(worker), str(tmp_path)], env=env, stderr=subprocess.PIPE))
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    one = json.loads(json.dumps({"heads": run_heads_vs_one(HEADS), "induction": run_induction_seeds(INDUCTION, SEEDS)}))
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert _without_times(got) == _without_times(one)
