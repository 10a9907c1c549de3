"""``headwise heads --max-memory``: the layer-by-layer route's files equal the whole route's, and bad budgets are one
line naming the smallest budget that works, exit 2, nothing written."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest

from _cli_helpers import assert_user_error

pytest.importorskip("transformers")

from _decoders import save_decoder  # noqa: E402

TEXT = "the cat sat on the mat . the cat sat on the mat ."


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch
    from safetensors.torch import load_file, save_file

    path = save_decoder(tmp_path_factory.mktemp("m") / "llama", "llama", init=0.5)
    weights = path / "model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    return path


def _by_layer(monkeypatch):
    """Open the next models layer by layer whatever the budget (a tiny model fits any budget whole)."""
    import headwise.models.layered as layered

    route = layered.memory_route
    monkeypatch.setattr(layered, "memory_route", lambda *a, **k: route(*a, **{**k, "by_layer": True}))


def _csv(path):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


@pytest.mark.parametrize("backend", ["headwise", "auto"])
def test_layer_by_layer_files_equal_the_whole_route(folder, tmp_path, run_cli, monkeypatch, backend):
    import headwise.study

    if backend == "auto":  # the Hugging Face route (what --importance / --no-cache take), statistics alike
        monkeypatch.setattr(headwise.study, "heads_backend", lambda opts: "auto")
    whole = run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "whole"), "--max-memory", "20GB")
    assert whole.code == 0, whole.err
    _by_layer(monkeypatch)
    out = run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "layers"), "--max-memory", "20GB")
    assert out.code == 0, out.err
    assert "memory: layer by layer within 20.00 GB" in out.out
    head_w, rows_w = _csv(tmp_path / "whole" / "heads.csv")
    head_l, rows_l = _csv(tmp_path / "layers" / "heads.csv")
    assert head_w == head_l and len(rows_w) == len(rows_l)
    for rw, rl in zip(rows_w, rows_l):
        for name, a, b in zip(head_w, rw, rl):
            try:
                x, y = float(a), float(b)
            except ValueError:
                assert a == b, name
                continue
            assert (np.isnan(x) and np.isnan(y)) or abs(x - y) <= 1e-4 * max(1.0, abs(x)), (name, a, b)
    memory = json.loads((tmp_path / "layers" / "heads.json").read_text())["memory"]
    assert memory["route"] == "layers" and memory["budget_bytes"] == 20 * 10**9


@pytest.mark.parametrize("budget", ["0", "12XB", "1MB", "-5GB"])
def test_bad_budgets_name_the_smallest_that_works(folder, tmp_path, run_cli, budget):
    out = run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "o"), "--max-memory", budget)
    assert_user_error(out, "--max-memory", "the smallest budget that works")
    assert re.search(r"smallest budget that works for llama(:| is) [0-9.]+ [kMG]?B", out.err)
    assert not (tmp_path / "o").exists()


def test_composition_refuses_layer_by_layer(folder, tmp_path, run_cli, monkeypatch):
    _by_layer(monkeypatch)
    out = run_cli("heads", "--model", str(folder), "--composition", "--out", str(tmp_path / "o"))
    assert_user_error(out, "opened layer by layer", "--composition", "needs about")
    assert not (tmp_path / "o").exists()


def test_progress_by_layer_with_the_time_left(folder, tmp_path, run_cli, monkeypatch):
    import headwise.cli._progress as progress

    monkeypatch.setattr(progress, "LAYER_EVERY", 0.0)  # every layer says where it is
    whole = run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "w"))
    assert whole.code == 0 and "layer by layer: pass" not in whole.err  # a model opened whole says nothing
    _by_layer(monkeypatch)
    out = run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "o"))
    assert out.code == 0, out.err
    lines = "\n".join(line for line in out.err.splitlines() if "layer by layer: pass" in line)
    said = r"layer by layer: pass 1, layer 2/2, [0-9]+ s left in this pass \([0-9.]+ s a layer, [0-9]+% of it reading"
    assert re.search(said, lines), out.err
    assert "pass 3," in lines  # the statistics, the example drawn, the probe
