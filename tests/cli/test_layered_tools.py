"""The other tools on a model opened layer by layer: ``patch`` (exact patching) and ``qk`` (every layer's attention
parts kept in, the rest streamed) equal the float32 route, patch's direct logit attribution skipped with a note
naming the memory it needs; ``patch --method attribution`` and ``circuit`` (every layer's weights at once), and ``qk``
under a budget too small for the attention parts, refused in one line naming the memory, nothing written; a bad
budget names the smallest that works."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _cli_helpers import assert_user_error  # noqa: E402
from _decoders import routes_tol, save_decoder  # noqa: E402
from _helpers import assert_normalised, logits_scale  # noqa: E402

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
    tol = routes_tol(folder, scale=logits_scale(a))
    for x, y in ((b["patched"], a["patched"]), (b["positions"]["patched"], a["positions"]["patched"])):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), rtol=0, atol=tol)
    for key in ("metric_clean", "metric_corrupted"):
        assert b[key] == pytest.approx(a[key], abs=tol)
    assert_normalised(a)
    assert_normalised(b)
    assert a["logit_attribution"] and not b["logit_attribution"]  # reads every layer's weights: skipped, said why
    assert any("direct logit attribution skipped" in n and "needs about" in n for n in b["notes"])
    assert "direct logit attribution skipped" in out.err


@pytest.mark.parametrize(
    "command",
    [
        lambda f, o: _patch(f, o, "--method", "attribution"),
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
    ids=["patch-attribution", "circuit"],
)
def test_tools_that_read_every_layer_refuse_by_name(run_cli, folder, tmp_path, monkeypatch, command):
    _by_layer(monkeypatch)
    out = run_cli(*command(folder, tmp_path / "o"))
    assert_user_error(out, "opened layer by layer", "reads every layer's weights at once, which needs about")
    assert not (tmp_path / "o").exists()


def _qk(folder, out, budget="20GB"):
    return ("qk", "--model", str(folder), "--text", CLEAN, "--head", "1.2", "--query", "-1", "--out", str(out),
            "--max-memory", budget)  # fmt: skip


def test_qk_layer_by_layer_equals_the_whole_route(run_cli, folder, tmp_path, monkeypatch):
    whole = run_cli(*_qk(folder, tmp_path / "whole"))
    assert whole.code == 0, whole.err
    _by_layer(monkeypatch)
    out = run_cli(*_qk(folder, tmp_path / "layers"))
    assert out.code == 0, out.err
    a = json.loads((tmp_path / "whole" / "qk.json").read_text())
    b = json.loads((tmp_path / "layers" / "qk.json").read_text())
    assert a.keys() == b.keys() and (a["key"], a["keys"], a["tokens"]) == (b["key"], b["keys"], b["tokens"])
    for key in ("scores", "logits", "weights"):
        got, ref = torch.tensor(b[key]), torch.tensor(a[key])
        torch.testing.assert_close(got, ref, rtol=0, atol=routes_tol(folder, scale=ref.abs().max().item()))
    for side in ("query_parts", "key_parts"):
        assert [p["part"] for p in a[side]] == [p["part"] for p in b[side]]
        for field in ("term", "centred", "effect"):
            got, ref = (torch.tensor([p[field] for p in x[side]], dtype=torch.float64) for x in (b, a))
            tol = routes_tol(folder, scale=ref.abs().max().item())
            torch.testing.assert_close(got, ref, rtol=0, atol=tol, msg=f"{side} {field}")
    assert [t["query_part"] + t["key_part"] for t in a["top_terms"]] == [
        t["query_part"] + t["key_part"] for t in b["top_terms"]]  # fmt: skip
    assert (tmp_path / "layers" / "qk.png").is_file()


def test_qk_under_a_budget_too_small_for_the_attention_parts(run_cli, folder, tmp_path, monkeypatch):
    """The smallest budget that opens the model layer by layer holds one layer; every layer's attention parts do
    not fit it: one line naming the memory they need, nothing written."""
    import headwise.models.memory as memory
    from headwise.models import open_model
    from headwise.models.pinned import attention_need

    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    _by_layer(monkeypatch)
    smallest = open_model(folder, max_memory="20GB").memory.smallest
    need = attention_need(open_model(folder, max_memory=smallest))
    assert need > smallest
    out = run_cli(*_qk(folder, tmp_path / "o", str(smallest)))
    assert_user_error(out, "opened layer by layer", f"qk reads every layer's attention weights at once, which needs "
                      f"about {memory.format_size(need)} (a --max-memory at least that)")  # fmt: skip
    assert not (tmp_path / "o").exists()
    out = run_cli(*_qk(folder, tmp_path / "o", str(need)))  # the memory it names is enough
    assert out.code == 0, out.err


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


@pytest.mark.parametrize("tool", ["heads", "patch", "qk"])
def test_the_budget_help_says_80_percent_free(run_cli, monkeypatch, tool):
    monkeypatch.setenv("COLUMNS", "200")  # the help's box wide enough that the sentence stays on one line
    out = run_cli(tool, "--help")
    assert out.code == 0, out.err
    text = " ".join(out.out.replace("│", " ").split())
    assert "(default 80% free)" in text and "%%" not in text
