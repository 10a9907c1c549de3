"""``headwise lab``: the three commands on tiny budgets write whole folders; mistakes exit 2 with one line;
Ctrl-C during training leaves nothing."""

from __future__ import annotations

import csv
import json

import pytest

from _cli_helpers import assert_user_error
from _pictures import assert_not_blank, read_png
from headwise.lab import load


@pytest.mark.slow  # the fast suite keeps a lighter test of the same path
def test_induction_tiny_writes_a_loadable_checkpoint(run_cli, tmp_path):
    out = tmp_path / "ind"
    outcome = run_cli("lab", "induction", "--out", str(out), "--seed", "3", "--steps", "4")
    assert outcome.code == 1, outcome.err  # four steps cannot reach the target: said, and exit 1
    assert "FAIL" in outcome.out and "second copy" in outcome.out
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "summary.json", "training.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ind"]  # no temporary left
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == 3 and summary["train"]["steps"] == 4 and summary["passed"] is False
    model = load(out)
    assert model.vocab_size == 256 and model.context_length == 64
    assert_not_blank(read_png(out / "training.png"))


@pytest.mark.slow
def test_heads_vs_one_and_prune_tiny(run_cli, tmp_path):
    out = tmp_path / "hv1"
    outcome = run_cli(
        "lab", "heads-vs-one", "--out", str(out), "--seeds", "2", "--steps", "2", "--tasks", "pair", "--heads", "1,2",
        "--workers", "1",
    )  # fmt: skip
    assert outcome.code == 0, outcome.err
    assert "verdict: void" in outcome.out  # two steps learn nothing: no comparison is made
    assert sorted(p.name for p in out.iterdir()) == ["heads_vs_one.csv", "heads_vs_one.json", "heads_vs_one.png"]
    rows = list(csv.DictReader((out / "heads_vs_one.csv").open()))
    evaluation = [r for r in rows if r["phase"] == "eval"]
    assert sorted({int(r["heads"]) for r in evaluation}) == [1, 2] and len(evaluation) == 4
    assert {int(r["seed"]) for r in rows if r["phase"] == "tune"}.isdisjoint({int(r["seed"]) for r in evaluation})
    assert len({r["parameters"] for r in rows}) == 1
    result = json.loads((out / "heads_vs_one.json").read_text())
    assert result["verdict"]["pair"]["outcome"] == "void" and set(result["sweep"]["pair"]) == {"1", "2"}
    assert_not_blank(read_png(out / "heads_vs_one.png"))

    assert run_cli("lab", "induction", "--out", str(tmp_path / "m"), "--steps", "2").code == 1
    outcome = run_cli("lab", "prune", "--model", str(tmp_path / "m"), "--sequences", "16", "--random-orders", "2")
    assert outcome.code == 0, outcome.err
    rows = list(csv.DictReader((tmp_path / "m" / "pruning" / "pruning.csv").open()))
    assert [int(r["removed"]) for r in rows] == list(range(9))
    read_png(tmp_path / "m" / "pruning" / "pruning.png")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["lab", "induction", "--out", "OUT", "--steps", "0"], ["--steps", "0"]),
        (["lab", "heads-vs-one", "--out", "OUT", "--tasks", "product"], ["--tasks", "product"]),
        (["lab", "heads-vs-one", "--out", "OUT", "--seeds", "0"], ["--seeds", "0"]),
        (["lab", "heads-vs-one", "--out", "OUT", "--heads", "1,3"], ["--heads", "d_model=32", "3"]),
        (["lab", "heads-vs-one", "--out", "OUT", "--heads", "two"], ["--heads", "two"]),
        (["lab", "induction", "--out", "FILE"], ["--out", "not a folder"]),
        (["lab", "heads-vs-one", "--out", "FILE"], ["--out", "not a folder"]),
        (["lab", "prune", "--model", "MISSING"], ["model", "not a folder"]),
        (["lab", "prune", "--model", "CORRUPT"], ["model", "safetensors"]),
        (["lab", "prune", "--model", "FOREIGN"], ["model_type"]),
        (["lab", "induction"], ["--out"]),
    ],
)
def test_mistakes_exit_2_with_one_line(run_cli, tmp_path, argv, words):
    (tmp_path / "FILE").write_text("x")
    for name in ("CORRUPT", "FOREIGN"):
        (tmp_path / name).mkdir()
    lab_config = {"model_type": "headwise-lab", "format_version": 1, "config": {}}
    (tmp_path / "CORRUPT" / "config.json").write_text(json.dumps(lab_config))
    (tmp_path / "CORRUPT" / "model.safetensors").write_bytes(b"\x00garbage")
    (tmp_path / "FOREIGN" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    argv = [str(tmp_path / a) if a in ("OUT", "FILE", "MISSING", "CORRUPT", "FOREIGN") else a for a in argv]
    outcome = run_cli(*argv)
    assert_user_error(outcome, *words)
    assert not (tmp_path / "OUT").exists()


def test_ctrl_c_during_training_writes_nothing(run_cli, tmp_path, monkeypatch):
    from headwise.lab import trainer

    calls = {"n": 0}
    real = trainer.masked_loss

    def interrupt_at_third_step(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(trainer, "masked_loss", interrupt_at_third_step)
    outcome = run_cli("lab", "induction", "--out", str(tmp_path / "ind"), "--steps", "10")
    assert outcome.code == 130 and "interrupted" in outcome.err
    assert list(tmp_path.iterdir()) == []
