"""The other tools on a model opened layer by layer: ``patch`` (exact patching) equals the float32 route, its direct
logit attribution skipped with a note naming the memory it needs; ``patch --method attribution``, ``qk`` and
``circuit`` (every layer's weights at once) refused in one line naming it, nothing written; a bad budget names the
smallest that works."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _cli_helpers import assert_user_error  # noqa: E402
from _decoders import save_decoder  # noqa: E402

CLEAN, CORRUPTED = "the cat sat on the mat and the dog", "the dog sat on the mat and the dog"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_decoder(tmp_path_factory.mktemp("layered") / "llama", "llama", init=0.5)


def _by_layer(monkeypatch):
    """Open the next models layer by layer whatever the budget (a tiny model fits any budget whole)."""
    import headwise.models.layered as layered

    route = layered.memory_route
    monkeypatch.setattr(layered, "memory_route", lambda *a, **k: route(*a, **{**k, "by_layer": True}))


def _patch(folder, out, *extra):
    return ("patch", "--model", str(folder), "--clean", CLEAN, "--corrupted", CORRUPTED, "--answer", "cat",
            "--wrong", "dog", "--out", str(out), "--max-memory", "20GB", *extra)  # fmt: skip


def test_patch_layer_by_layer_equals_the_whole_route(run_cli, folder, tmp_path, monkeypatch):
    whole = run_cli(*_patch(folder, tmp_path / "whole", "--head", "1.2", "--batch-size", "3"))
    assert whole.code == 0, whole.err
    _by_layer(monkeypatch)
    out = run_cli(*_patch(folder, tmp_path / "layers", "--head", "1.2", "--batch-size", "3"))
    assert out.code == 0, out.err
    assert "memory: layer by layer within 20.00 GB" in out.out
    a = json.loads((tmp_path / "whole" / "patching.json").read_text())
    b = json.loads((tmp_path / "layers" / "patching.json").read_text())
    for key in ("patched", "normalised"):
        torch.testing.assert_close(torch.tensor(b[key]), torch.tensor(a[key]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(b["positions"]["patched"]), torch.tensor(a["positions"]["patched"]),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    assert b["metric_clean"] == pytest.approx(a["metric_clean"], abs=1e-5)
    assert a["logit_attribution"] and not b["logit_attribution"]  # reads every layer's weights: skipped, said why
    assert any("direct logit attribution skipped" in n and "needs about" in n for n in b["notes"])
    assert "direct logit attribution skipped" in out.err


@pytest.mark.parametrize(
    "command",
    [
        lambda f, o: _patch(f, o, "--method", "attribution"),
        lambda f, o: (
            "qk",
            "--model",
            str(f),
            "--text",
            CLEAN,
            "--head",
            "1.2",
            "--query",
            "-1",
            "--out",
            str(o),
            "--max-memory",
            "20GB",
        ),  # fmt: skip
        lambda f, o: (
            "circuit",
            "--model",
            str(f),
            "--clean",
            CLEAN,
            "--corrupted",
            CORRUPTED,
            "--answer",
            "cat",
            "--wrong",
            "dog",
            "--out",
            str(o),
        ),  # fmt: skip
    ],
    ids=["patch-attribution", "qk", "circuit"],
)
def test_tools_that_read_every_layer_refuse_by_name(run_cli, folder, tmp_path, monkeypatch, command):
    _by_layer(monkeypatch)
    out = run_cli(*command(folder, tmp_path / "o"))
    assert_user_error(out, "opened layer by layer", "reads every layer's weights at once, which needs about")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("tool", ["patch", "qk"])
def test_a_bad_budget_names_the_smallest_that_works(run_cli, folder, tmp_path, tool):
    if tool == "patch":
        args = [a for a in _patch(folder, tmp_path / "o") if a != "20GB"][:-1]
    else:
        args = ["qk", "--model", str(folder), "--text", CLEAN, "--head", "1.2", "--query", "-1", "--out",
                str(tmp_path / "o")]  # fmt: skip
    out = run_cli(*args, "--max-memory", "12XB")
    assert_user_error(out, "--max-memory", "expected a size such as", "the smallest budget that works")
    assert not (tmp_path / "o").exists()
