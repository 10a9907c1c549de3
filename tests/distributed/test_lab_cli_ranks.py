"""``torchrun … -m headwise lab heads-vs-one`` and ``lab induction --seeds`` deal their runs across the ranks (one
seed or configuration per rank): rank 0 writes the same files as the one-process command (wall-clock fields aside);
and the new option's bad input as one line, exit 2, nothing written."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from headwise.cli import main

HEADS_ARGS = ["heads-vs-one", "--tasks", "pair", "--heads", "1,2", "--seeds", "2", "--steps", "3", "--workers", "1"]
SEEDS_ARGS = ["induction", "--seeds", "1,0", "--steps", "2"]


def _refused(capsys, args, expected: str, out: Path) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["lab", *args, "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not out.exists()


def test_seeds_bad_input_is_one_line(tmp_path, capsys):
    expected = "--seeds: expected comma-separated non-negative integers"
    _refused(capsys, ["induction", "--seeds", "1,x"], expected, tmp_path / "a")
    _refused(capsys, ["induction", "--seeds", "-1"], expected, tmp_path / "b")
    _refused(capsys, ["induction", "--seed", "2", "--seeds", "1"], "--seed: 2 given with --seeds", tmp_path / "c")


def test_one_seed_under_torchrun_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _refused(capsys, ["induction", "--seed", "1"], "--seeds: under torchrun expected --seeds A,B,…", tmp_path / "o")


def _csv_without(path: Path, column: str) -> list[dict]:
    return [{k: v for k, v in row.items() if k != column} for row in csv.DictReader(path.open())]


@pytest.mark.slow
def test_torchrun_lab_commands_equal_one_process(tmp_path, one_thread):
    """The one-process run in this process at the ranks' one thread (training's rounding depends on the count)."""
    from _corpus import free_port

    sys.path.insert(0, str(Path(__file__).parent))
    from test_corpus_launch import TORCHRUN, _env
    from test_lab_launch import _without_times

    for args, name in ((HEADS_ARGS, "heads_vs_one"), (SEEDS_ARGS, "induction_seeds")):
        one, two = tmp_path / f"{name}-one", tmp_path / f"{name}-two"
        with pytest.raises(SystemExit) as stop:
            main(["lab", *args, "--out", str(one)])
        assert stop.value.code in (0, None, 1)  # 1: a seed of these few steps misses the target, as on the ranks
        run = subprocess.run(
            [*TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "headwise", "lab", *args,
             "--out", str(two)],
            env=_env(), capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert run.returncode == stop.value.code or (run.returncode != 0 and stop.value.code == 1), run.stderr[-3000:]
        assert "2 ranks" in run.stdout, run.stdout[-2000:]
        got, want = (json.loads((d / f"{name}.json").read_text()) for d in (two, one))
        assert _without_times(got) == _without_times(want)
        assert _csv_without(two / f"{name}.csv", "seconds") == _csv_without(one / f"{name}.csv", "seconds")
