"""The other tools on a model opened layer by layer: ``patch`` (exact patching), ``qk`` (one layer's weights at a
time after its pass) and ``circuit`` (differentiated layer by layer) equal the float32 route — patch's direct logit
attribution and ``patch --method attribution`` too; ``qk`` and ``circuit`` under a budget too small for their
activations, refused in one line naming the memory, nothing written; a bad budget names the smallest that works."""

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
    _same_attribution(a["logit_attribution"], b["logit_attribution"], folder)  # read one layer at a time
    assert "skipped" not in out.err


def _same_attribution(a: dict, b: dict, folder) -> None:
    assert a and a.keys() == b.keys()
    for name in a:
        for key, ref in a[name].items():
            if isinstance(ref, (int, float, list)):
                ref, got = torch.tensor(ref, dtype=torch.float64), torch.tensor(b[name][key], dtype=torch.float64)
                tol = routes_tol(folder, scale=float(ref.nan_to_num().abs().max()))
                torch.testing.assert_close(got, ref, rtol=0, atol=tol, equal_nan=True, msg=f"{name} {key}")
            else:
                assert b[name][key] == ref


def _circuit(folder, out, *extra, budget="20GB"):
    return ("circuit", "--model", str(folder), "--clean", CLEAN, "--corrupted", CORRUPTED, "--answer", "cat",
            "--wrong", "dog", "--out", str(out), "--exact-top", "6", "--qk-heads", "2", "--max-memory", budget,
            *extra)  # fmt: skip


def test_patch_attribution_layer_by_layer_equals_the_whole_route(run_cli, folder, tmp_path, monkeypatch):
    whole = run_cli(*_patch(folder, tmp_path / "whole", "--method", "attribution"))
    assert whole.code == 0, whole.err
    _by_layer(monkeypatch)
    out = run_cli(*_patch(folder, tmp_path / "layers", "--method", "attribution"))
    assert out.code == 0, out.err
    a = json.loads((tmp_path / "whole" / "patching.json").read_text())
    b = json.loads((tmp_path / "layers" / "patching.json").read_text())
    ref, got = torch.tensor(a["patched"], dtype=torch.float64), torch.tensor(b["patched"], dtype=torch.float64)
    tol = routes_tol(folder, scale=float(ref.nan_to_num().abs().max()))
    torch.testing.assert_close(got, ref, rtol=0, atol=tol, equal_nan=True)


@pytest.mark.parametrize("method", ["eap", "atp*"])
def test_circuit_layer_by_layer_equals_the_whole_route(run_cli, folder, tmp_path, monkeypatch, method):
    import headwise.cli._progress as progress

    whole = run_cli(*_circuit(folder, tmp_path / "whole", "--method", method))
    assert whole.code == 0, whole.err
    _by_layer(monkeypatch)
    monkeypatch.setattr(progress, "LAYER_EVERY", 0.0)  # every layer says where it is
    out = run_cli(*_circuit(folder, tmp_path / "layers", "--method", method))
    assert out.code == 0, out.err
    walked = [line for line in out.err.splitlines() if "(backward), layer" in line]
    assert walked and all("s left in this pass" in line for line in walked)  # the walk back, its layers counted
    assert "memory: layer by layer within 20.00 GB" in out.out
    assert "memory: 8 jobs a patched pass (what the budget holds)" in out.out
    a = json.loads((tmp_path / "whole" / "circuit.json").read_text())
    b = json.loads((tmp_path / "layers" / "circuit.json").read_text())
    scale = max(abs(e["scores"][method]) for e in a["edges"])
    tol = routes_tol(folder, scale=scale)
    assert [(e["sender"], e["receiver"]) for e in a["edges"]] == [(e["sender"], e["receiver"]) for e in b["edges"]]
    for key in (method, "exact"):
        got = torch.tensor([e["scores"].get(key, float("nan")) for e in b["edges"]], dtype=torch.float64)
        ref = torch.tensor([e["scores"].get(key, float("nan")) for e in a["edges"]], dtype=torch.float64)
        torch.testing.assert_close(got, ref, rtol=0, atol=tol, equal_nan=True)
    assert a["circuit"]["edges"] == b["circuit"]["edges"]
    assert b["node_details"].keys() == a["node_details"].keys()  # the direct effects and QK attribution too


def test_circuit_under_a_budget_too_small_for_its_activations(run_cli, folder, tmp_path, monkeypatch):
    """The smallest budget that opens the model layer by layer holds one layer; a circuit run also keeps
    activations of every layer: one line naming the memory it needs, nothing written; that memory does."""
    import headwise.models.memory as memory
    from headwise.circuits.footprint import circuit_activations
    from headwise.models import open_model
    from headwise.models.layer_walk import walk_need

    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    _by_layer(monkeypatch)
    smallest = open_model(folder, max_memory="20GB").memory.smallest
    hm = open_model(folder, max_memory=smallest)
    length = len(hm.tokenizer.encode(CLEAN).ids)
    need = walk_need(hm, activations=circuit_activations(hm, 1, length, method="eap", batch_size=1))  # one job
    assert need > smallest
    out = run_cli(*_circuit(folder, tmp_path / "o", budget=str(smallest)))
    assert_user_error(out, "opened layer by layer", "circuit reads one layer's weights at a time and what it keeps of "
                      f"every layer's activations, which needs about {memory.format_size(need)} (a --max-memory at "
                      "least that)")  # fmt: skip
    assert not (tmp_path / "o").exists()
    out = run_cli(*_circuit(folder, tmp_path / "o", budget=str(need)))  # the memory it names is enough
    assert out.code == 0, out.err


def test_patch_under_a_budget_too_small_for_one_job(run_cli, folder, tmp_path, monkeypatch):
    """The smallest budget that opens the model layer by layer holds one layer; an exact sweep also keeps both cached
    runs and one patched job: one line naming the memory it needs, nothing written; that memory does."""
    import headwise.models.memory as memory
    from headwise.models import open_model
    from headwise.models.layer_walk import walk_need
    from headwise.patching.exact import exact_activations

    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    _by_layer(monkeypatch)
    smallest = open_model(folder, max_memory="20GB").memory.smallest
    hm = open_model(folder, max_memory=smallest)
    length = len(hm.tokenizer.encode(CLEAN).ids)
    need = walk_need(hm, activations=exact_activations(hm, (1, length), True))
    assert need > smallest
    args = [a if a != "20GB" else str(smallest) for a in _patch(folder, tmp_path / "o")]
    out = run_cli(*args)
    assert_user_error(out, "opened layer by layer", "patch reads one layer's weights at a time and what it keeps of "
                      f"every layer's activations, which needs about {memory.format_size(need)} (a --max-memory at "
                      "least that)")  # fmt: skip
    assert not (tmp_path / "o").exists()
    out = run_cli(*[a if a != "20GB" else str(need) for a in _patch(folder, tmp_path / "o")])
    assert out.code == 0, out.err


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


def test_qk_under_a_budget_too_small_for_its_run(run_cli, folder, tmp_path, monkeypatch):
    """The smallest budget that opens the model layer by layer holds one layer; qk also keeps what it recorded of
    the run: one line naming the memory it needs, nothing written; that memory does (one layer's weights in at a
    time, every layer's attention parts no longer pinned)."""
    import headwise.models.memory as memory
    from headwise.circuits.qk import qk_activations
    from headwise.models import open_model
    from headwise.models.layer_walk import walk_need

    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    _by_layer(monkeypatch)
    smallest = open_model(folder, max_memory="20GB").memory.smallest
    hm = open_model(folder, max_memory=smallest)
    need = walk_need(hm, activations=qk_activations(hm, len(hm.tokenizer.encode(CLEAN).ids)))
    assert need > smallest
    out = run_cli(*_qk(folder, tmp_path / "o", str(smallest)))
    assert_user_error(out, "opened layer by layer", "qk reads one layer's weights at a time and what it keeps of "
                      f"every layer's activations, which needs about {memory.format_size(need)} (a --max-memory at "
                      "least that)")  # fmt: skip
    assert not (tmp_path / "o").exists()
    out = run_cli(*_qk(folder, tmp_path / "o", str(need)))  # the memory it names is enough
    assert out.code == 0, out.err


@pytest.mark.parametrize("tool", ["patch", "qk", "circuit"])
def test_a_bad_budget_names_the_smallest_that_works(run_cli, folder, tmp_path, tool):
    if tool in ("patch", "circuit"):
        made = _patch(folder, tmp_path / "o") if tool == "patch" else _circuit(folder, tmp_path / "o")
        args = [a for a in made if a != "20GB"][:-1] if tool == "patch" else list(made[:-2])
    else:
        args = ["qk", "--model", str(folder), "--text", CLEAN, "--head", "1.2", "--query", "-1", "--out",
                str(tmp_path / "o")]  # fmt: skip
    out = run_cli(*args, "--max-memory", "12XB")
    assert_user_error(out, "--max-memory", "expected a size such as", "the smallest budget that works")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("tool", ["heads", "patch", "qk", "circuit"])
def test_the_budget_help_says_80_percent_free(run_cli, monkeypatch, tool):
    monkeypatch.setenv("COLUMNS", "200")  # the help's box wide enough that the sentence stays on one line
    out = run_cli(tool, "--help")
    assert out.code == 0, out.err
    text = " ".join(out.out.replace("│", " ").split())
    assert "(default 80% free)" in text and "%%" not in text
