"""``headwise heads --max-memory``: the layer-by-layer route's files equal the whole route's (``--composition`` too,
under a budget that holds two layers' senders at a time), and bad budgets are one line naming the smallest budget that
works (or, for ``--composition``, the memory one receiver layer and one sender layer need, for ``--importance`` what
its gradient pass keeps), exit 2, nothing written;
``--importance`` layer by layer equals the whole route."""

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


def _same_csv(a, b, rel=1e-4):
    head_a, rows_a = _csv(a)
    head_b, rows_b = _csv(b)
    assert head_a == head_b and len(rows_a) == len(rows_b)
    for ra, rb in zip(rows_a, rows_b):
        for name, x, y in zip(head_a, ra, rb):
            try:
                fx, fy = float(x), float(y)
            except ValueError:
                assert x == y, name
                continue
            assert (np.isnan(fx) and np.isnan(fy)) or abs(fx - fy) <= rel * max(1.0, abs(fx)), (name, x, y)
    return head_a


@pytest.mark.parametrize("backend", ["headwise", pytest.param("auto", marks=pytest.mark.slow)])
def test_layer_by_layer_files_equal_the_whole_route(folder, tmp_path, run_cli, monkeypatch, backend):
    import headwise.study

    if backend == "auto":  # the Hugging Face route (what a non-Llama family takes), statistics alike
        monkeypatch.setattr(headwise.study, "heads_backend", lambda opts: "auto")
    whole = run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "whole"), "--max-memory", "20GB")
    assert whole.code == 0, whole.err
    _by_layer(monkeypatch)
    out = run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "layers"), "--max-memory", "20GB")
    assert out.code == 0, out.err
    assert "memory: layer by layer within 20.00 GB" in out.out
    _same_csv(tmp_path / "whole" / "heads.csv", tmp_path / "layers" / "heads.csv")
    memory = json.loads((tmp_path / "layers" / "heads.json").read_text())["memory"]
    assert memory["route"] == "layers" and memory["budget_bytes"] == 20 * 10**9


@pytest.mark.parametrize("budget", ["0", "12XB", "1MB", "-5GB"])
def test_bad_budgets_name_the_smallest_that_works(folder, tmp_path, run_cli, budget):
    out = run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "o"), "--max-memory", budget)
    assert_user_error(out, "--max-memory", "the smallest budget that works")
    assert re.search(r"smallest budget that works for llama(:| is) [0-9.]+ [kMG]?B", out.err)
    assert not (tmp_path / "o").exists()


COMPOSITION = ("copying", "copying_positive", "q_composition_max", "k_composition_max", "v_composition_max")


def _same_composition(whole, layers):
    """heads.csv's composition and copying columns and heads.json's scores of two runs' folders: the same."""
    head_w, rows_w = _csv(whole / "heads.csv")
    head_l, rows_l = _csv(layers / "heads.csv")
    assert head_w == head_l and all(name in head_w for name in COMPOSITION)
    for name in COMPOSITION:
        k = head_w.index(name)
        a = np.array([float(r[k] or "nan") for r in rows_w])  # empty: no score (no sender before layer 0)
        b = np.array([float(r[k] or "nan") for r in rows_l])
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7, err_msg=name)  # NaN where NaN
        assert np.isfinite(a).any(), name
    a = json.loads((whole / "heads.json").read_text())["composition"]
    b = json.loads((layers / "heads.json").read_text())["composition"]
    for kind in ("q", "k", "v", "k_group", "v_group"):
        x, y = (np.array(s[kind], dtype=np.float64) for s in (a, b))  # None (no score) -> NaN
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=2e-5, err_msg=kind)  # written to 5 decimals
    for kind in "qkv":  # the strongest pairs, in the same order
        keys = ("sender_layer", "sender_head", "layer", "head")
        assert [[t[k] for k in keys] for t in a["top"][kind]] == [[t[k] for k in keys] for t in b["top"][kind]]
    assert (layers / "composition.png").is_file()


@pytest.mark.slow  # the fast suite keeps a GGUF file's (tests/cli/test_heads_gguf.py) and the budget's below
def test_composition_layer_by_layer_equals_the_whole_route(folder, tmp_path, run_cli, monkeypatch):
    """A group of layers' attention parts at a time, the rest streamed, ``W_U W_E`` summed over slices of rows: the
    same columns and scores."""
    args = ("heads", TEXT, "--model", str(folder), "--composition", "--max-memory", "20GB", "--out")
    whole = run_cli(*args, str(tmp_path / "whole"))
    assert whole.code == 0, whole.err
    _by_layer(monkeypatch)
    out = run_cli(*args, str(tmp_path / "layers"))
    assert out.code == 0, out.err
    assert "memory: layer by layer within 20.00 GB" in out.out and "composition (weights)" in out.out
    _same_csv(tmp_path / "whole" / "heads.csv", tmp_path / "layers" / "heads.csv")
    _same_composition(tmp_path / "whole", tmp_path / "layers")


@pytest.mark.slow  # a few seconds: the fast suite keeps its three minutes
def test_composition_under_a_budget_that_streams_equals_the_whole_route(tmp_path_factory, tmp_path, run_cli,
                                                                         monkeypatch):  # fmt: skip
    """A budget under the whole route's opens the model layer by layer and holds two of its four layers' senders at
    a time: heads.csv and heads.json equal the whole route's."""
    import headwise.models.memory as memory
    from headwise.circuits import composition, composition_layers
    from headwise.models import open_model

    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    monkeypatch.setattr(composition, "BLOCK_BYTES", 2**16)  # a tiny model's products: the senders set the group
    monkeypatch.setattr("headwise.commands.heads.heads_need", lambda *a, **k: 0)  # the statistics' own need aside
    deep = save_decoder(tmp_path_factory.mktemp("deep") / "llama", "llama", init=0.5, layers=4)
    whole = run_cli("heads", TEXT, "--model", str(deep), "--composition", "--out", str(tmp_path / "whole"))
    assert whole.code == 0, whole.err
    budget = composition_layers.composition_need(open_model(deep, by_layer=True), 2)
    groups = []
    by_groups = composition_layers._by_groups
    monkeypatch.setattr(composition_layers, "_by_groups",
                        lambda t, group, *a: groups.append(group) or by_groups(t, group, *a))  # fmt: skip
    out = run_cli("heads", TEXT, "--model", str(deep), "--composition", "--out", str(tmp_path / "layers"),
                  "--max-memory", str(budget))  # fmt: skip
    assert out.code == 0, out.err
    assert f"memory: layer by layer within {memory.format_size(budget)}" in out.out, out.out
    assert "composition (weights)" in out.out and groups == [2]
    _same_csv(tmp_path / "whole" / "heads.csv", tmp_path / "layers" / "heads.csv")
    _same_composition(tmp_path / "whole", tmp_path / "layers")


def test_composition_under_a_budget_too_small_for_one_group(folder, tmp_path, run_cli, monkeypatch):
    """Not even one sender layer beside its receiver fits: one line naming the memory that does, nothing written."""
    import headwise.models.memory as memory
    from headwise.circuits.composition_layers import composition_need
    from headwise.models import open_model

    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    _by_layer(monkeypatch)
    smallest = open_model(folder, max_memory="20GB").memory.smallest
    hm = open_model(folder, max_memory=smallest)
    need = composition_need(hm, 1)
    assert need > smallest
    out = run_cli("heads", "--model", str(folder), "--composition", "--out", str(tmp_path / "o"),
                  "--max-memory", str(smallest))  # fmt: skip
    said = (
        "--composition reads the attention weights of a receiver layer and a group of its senders' layers at a time, "
        f"which needs about {memory.format_size(need)}"
    )
    assert_user_error(out, "opened layer by layer", said)
    assert not (tmp_path / "o").exists()


def _corpus(tmp_path) -> str:
    path = tmp_path / "corpus.txt"
    path.write_text("the cat sat on the mat .\nthe dog sat on the log .\na cat and a dog sat .\n", encoding="utf-8")
    return str(path)


def test_importance_layer_by_layer_equals_the_whole_route(folder, tmp_path, run_cli, monkeypatch):
    """The gradient pass walks the layers back (each block recomputed with its weights brought in again): the
    estimate, the heads measured exactly and the curves equal the whole route's."""
    corpus = _corpus(tmp_path)
    args = ("heads", "--corpus", corpus, "--model", str(folder), "--importance", "--max-memory", "20GB", "--out")
    whole = run_cli(*args, str(tmp_path / "whole"))
    assert whole.code == 0, whole.err
    _by_layer(monkeypatch)
    out = run_cli(*args, str(tmp_path / "layers"))
    assert out.code == 0, out.err
    assert "memory: layer by layer within 20.00 GB" in out.out
    head = _same_csv(tmp_path / "whole" / "heads.csv", tmp_path / "layers" / "heads.csv")
    assert any("importance" in name for name in head)


def test_importance_under_a_budget_too_small_for_its_gradient_pass(folder, tmp_path, run_cli, monkeypatch):
    """The smallest budget that opens the model layer by layer holds one layer: --importance's gradient pass is
    refused in one line naming the memory it needs, nothing written."""
    import headwise.models.memory as memory
    from headwise.models import open_model

    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    _by_layer(monkeypatch)
    smallest = open_model(folder, max_memory="20GB").memory.smallest
    out = run_cli("heads", "--corpus", _corpus(tmp_path), "--model", str(folder), "--importance", "--out",
                  str(tmp_path / "o"), "--max-memory", str(smallest))  # fmt: skip
    assert_user_error(out, "opened layer by layer", "--importance reads one layer's weights at a time and what it "
                      "keeps of every layer's activations, which needs about")  # fmt: skip
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
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


def test_importance_layer_by_layer_is_refused_under_torchrun(folder, tmp_path, run_cli, monkeypatch):
    """The ranks do not walk the layers back: one line, before the statistics' pass, nothing written."""
    import headwise.distributed.ranks as ranks

    _by_layer(monkeypatch)
    monkeypatch.setattr(ranks, "launched", lambda: True)
    out = run_cli("heads", "--corpus", _corpus(tmp_path), "--model", str(folder), "--importance", "--out",
                  str(tmp_path / "o"), "--max-memory", "20GB")  # fmt: skip
    assert_user_error(out, "--importance", "opened layer by layer", "without torchrun")
    assert not (tmp_path / "o").exists()


def test_heads_need_grows_with_the_example_and_its_heads(folder):
    """The study's need counts what grows with the text: the example's maps (the square of its length up to 256
    tokens, then the pooled overview's fixed bins) and the head view's page, beside what the process holds."""
    from headwise.commands.heads import PICTURES, heads_need
    from headwise.models import open_model
    from headwise.study.decoder import VIEW_BINS, view_bytes

    hm = open_model(folder, max_memory="20GB")
    NL, H = hm.num_layers, hm.num_heads
    needs = [heads_need(hm, n, held=0) for n in (8, 64, 256)]
    assert needs[0] < needs[1] < needs[2]
    assert needs[0] > PICTURES  # the pictures and the pass's working set are counted whatever the length
    assert heads_need(hm, 256, held=10**9) == needs[2] + 10**9  # what the process holds, counted as measured
    assert view_bytes(NL, H, 256) == 4 * NL * H * 256 * 256
    assert view_bytes(NL, H, 4096) == view_bytes(NL, H, 100_000) == 4 * NL * H * 2 * VIEW_BINS**2  # pooled
    assert view_bytes(NL, H, 100, (10, 30)) == 4 * NL * H * (100 * 100 + 20 * 20)  # --queries kept
    assert view_bytes(2 * NL, H, 256) == 2 * view_bytes(NL, H, 256)


def test_heads_under_a_budget_too_small_for_its_example(folder, tmp_path, run_cli, monkeypatch):
    """A budget that opens the model but not the study of its example is refused in one line naming the example's
    length and the memory it needs, nothing written; that memory as the budget runs."""
    import headwise.models.memory as memory
    from headwise.models import open_model

    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    _by_layer(monkeypatch)
    smallest = open_model(folder, max_memory="20GB").memory.smallest
    out = run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "o"), "--max-memory",
                  str(smallest))  # fmt: skip
    assert_user_error(out, "--max-memory", "heads on an example of 15 tokens needs about")
    assert not (tmp_path / "o").exists()
    need = re.search(r"needs about ([0-9.]+ [kMG]?B)", out.err).group(1).replace(" ", "")
    ok = run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "o"), "--max-memory", need)
    assert ok.code == 0, ok.err


def test_importance_need_grows_with_the_tokens(folder):
    """--importance's need on a model opened whole grows with the tokens of its largest pass: the gradient pass's
    activations, what autograd saves of every layer, the estimate's chunk."""
    import torch

    from headwise.circuits.atp import CHUNK_BYTES
    from headwise.models import open_model
    from headwise.study.importance import importance_activations, importance_whole

    hm = open_model(folder, max_memory="20GB")

    def batches(rows, length):
        return [(torch.ones(rows, length, dtype=torch.long), torch.ones(rows, length, dtype=torch.long))]

    needs = [importance_whole(hm, batches(r, n)) for r, n in ((1, 8), (2, 8), (2, 16))]
    assert needs[0] < needs[1] < needs[2]
    keeps = [importance_activations(hm, batches(r, n)) for r, n in ((1, 8), (2, 16))]
    assert CHUNK_BYTES < keeps[0] < keeps[1]  # the estimate's chunk counted whatever the length
    assert importance_whole(hm, batches(2, 16)) - keeps[1] > 0  # autograd's saves on top
    # the estimate's parts (rows repacked by length) weighed in place of the batches: never more
    assert importance_whole(hm, batches(2, 16), "zero") <= needs[2]


def _importance_columns(path):
    head, rows = _csv(path)
    names = [n for n in head if "importance" in n or "ablation" in n]
    return {n: np.array([float(r[head.index(n)]) for r in rows]) for n in names}


@pytest.mark.slow  # a few seconds: the fast suite keeps its three minutes
def test_importance_opened_whole_under_a_budget_too_small(folder, tmp_path, run_cli, monkeypatch):
    """A budget that opens the model whole but not --importance's gradient pass is refused in one line naming the
    memory it needs, nothing written; that memory as the budget runs, its importance, estimates, exact ablations
    and curves equal the run without a budget."""
    import headwise.circuits.atp as atp
    import headwise.models.memory as memory
    from headwise.models import open_model

    corpus = _corpus(tmp_path)
    args = ("heads", "--corpus", corpus, "--model", str(folder), "--importance", "--out")
    free = run_cli(*args, str(tmp_path / "free"))
    assert free.code == 0, free.err
    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    monkeypatch.setattr(atp, "CHUNK_BYTES", 512 * 2**20)  # an estimate bigger than the whole route's working set
    plan = open_model(folder, max_memory="20GB").memory
    budget = plan.held + plan.whole  # the smallest that opens it whole
    out = run_cli(*args, str(tmp_path / "o"), "--max-memory", str(budget))
    assert_user_error(out, "--max-memory", "(opened whole): --importance on passes of up to", "needs about")
    assert not (tmp_path / "o").exists()
    need = re.search(r"needs about ([0-9.]+ [kMG]?B)", out.err).group(1).replace(" ", "")
    ok = run_cli(*args, str(tmp_path / "o"), "--max-memory", need)
    assert ok.code == 0, ok.err
    assert "memory: whole" in ok.out or "layer by layer" not in ok.out
    got, want = _importance_columns(tmp_path / "o" / "heads.csv"), _importance_columns(tmp_path / "free" / "heads.csv")
    assert set(got) == set(want) and "ablation_estimate" in got
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7, equal_nan=True, err_msg=name)
    a = json.loads((tmp_path / "o" / "heads.json").read_text())["importance"]
    b = json.loads((tmp_path / "free" / "heads.json").read_text())["importance"]
    assert a["half_removed"] == pytest.approx(b["half_removed"], rel=1e-5)
    ea, eb = a["exact_heads"], b["exact_heads"]  # the same heads for the same reasons; its numbers to float rounding
    numbers = ("threshold", "next_bound", "factors")
    assert {k: v for k, v in ea.items() if k not in numbers} == {k: v for k, v in eb.items() if k not in numbers}
    assert ea["threshold"] == pytest.approx(eb["threshold"], rel=1e-5)
    assert ea["factors"] == pytest.approx(eb["factors"], rel=1e-5)
    assert (ea["next_bound"] is None) == (eb["next_bound"] is None)
