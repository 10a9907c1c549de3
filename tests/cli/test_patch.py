"""``headwise patch``: the files it writes agree with the library, and every mistake is one line, exit 2,
with nothing written."""

from __future__ import annotations

import csv
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
    return save_decoder(tmp_path_factory.mktemp("patch") / "llama", "llama", init=0.5)


def _args(folder, out, *extra, clean=CLEAN, corrupted=CORRUPTED, answer="cat", wrong="dog"):
    return (
        "patch",
        "--model",
        str(folder),
        "--clean",
        clean,
        "--corrupted",
        corrupted,
        "--answer",
        answer,
        "--wrong",
        wrong,
        "--out",
        str(out),
        *extra,
    )


def _library(folder, direction="denoise"):
    from headwise.models import open_model
    from headwise.patching import direct_logit_attribution, logit_difference, patch_heads

    hm = open_model(folder)
    c = torch.tensor([hm.tokenizer.encode(CLEAN).ids])
    x = torch.tensor([hm.tokenizer.encode(CORRUPTED).ids])
    metric = logit_difference(hm.tokenizer.token_to_id("cat"), hm.tokenizer.token_to_id("dog"))
    return hm, c, x, patch_heads(hm, c, x, metric, direction=direction), direct_logit_attribution(hm, c, metric)


def test_the_files_hold_what_the_library_measures(run_cli, folder, tmp_path):
    out = tmp_path / "out"
    outcome = run_cli(*_args(folder, out, "--head", "1.2", "--batch-size", "3"))
    assert outcome.code == 0, outcome.err
    assert sorted(p.name for p in out.iterdir()) == ["patching.csv", "patching.json", "patching.png"]
    report = json.loads((out / "patching.json").read_text())
    hm, c, x, sweep, dla = _library(folder)
    assert report["clean_ids"] == c[0].tolist() and report["corrupted_ids"] == x[0].tolist()
    assert report["clean_ids"][0] == 0  # the tokenizer's <bos>, as the model reads it
    assert len(report["patched"]) == 2 and all(len(row) == 4 for row in report["patched"])
    # the command's batches (3 rows) are not the library's: another order of sums, float32 round-off apart
    tol = routes_tol(folder, scale=logits_scale(report))
    torch.testing.assert_close(torch.tensor(report["patched"]), sweep.mean_patched, atol=tol, rtol=0)
    assert_normalised(report)
    assert report["metric_clean"] == pytest.approx(float(sweep.metric_clean[0]), abs=tol)
    assert report["metric_corrupted"] == pytest.approx(float(sweep.metric_corrupted[0]), abs=tol)
    assert report["metric_clean"] != pytest.approx(report["metric_corrupted"], abs=1e-3)
    attribution = report["logit_attribution"]["clean"]
    torch.testing.assert_close(torch.tensor(attribution["heads"]), dla.heads[0].float(), atol=tol, rtol=0)
    assert attribution["total"] == pytest.approx(report["metric_clean"], abs=1e-4)
    assert report["logit_attribution"]["corrupted"]["total"] == pytest.approx(report["metric_corrupted"], abs=1e-4)
    assert report["positions"]["heads"] == [[1, 2]] and len(report["positions"]["patched"][0]) == c.shape[1]
    assert report["answer"] == {"text": "cat", "id": hm.tokenizer.token_to_id("cat")}
    rows = list(csv.DictReader((out / "patching.csv").open()))
    head_rows = [r for r in rows if r["part"] == "head"]
    assert len(head_rows) == 8
    assert float(head_rows[5]["patched"]) == pytest.approx(report["patched"][1][1], abs=1e-5)
    assert {r["part"] for r in rows} >= {"head", "mlp", "embed", "attention_bias", "total"}
    assert (out / "patching.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "L" in outcome.out and "wrote patching.json" in outcome.out


def test_attribution_and_noise(run_cli, folder, tmp_path):
    out = tmp_path / "noise"
    assert run_cli(*_args(folder, out, "--direction", "noise")).code == 0
    _, _, _, sweep, _ = _library(folder, "noise")
    report = json.loads((out / "patching.json").read_text())
    assert report["direction"] == "noise"
    tol = routes_tol(folder, scale=logits_scale(report))
    torch.testing.assert_close(torch.tensor(report["patched"]), sweep.mean_patched, atol=tol, rtol=0)
    out = tmp_path / "attribution"
    assert run_cli(*_args(folder, out, "--method", "attribution")).code == 0
    report = json.loads((out / "patching.json").read_text())
    assert report["method"] == "attribution" and report["passes"] == 2
    assert len(report["attribution_per_position"]) == 2


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(corrupted="the dog sat on the mat"), ["--corrupted", "7 tokens", "--clean has 10"]),
        (dict(answer="cat dog"), ["--answer", "'cat dog' encodes to 2 tokens", "['cat', 'dog']"]),
        (dict(wrong="zebra"), ["--wrong", "'zebra' is not in the vocabulary", "<unk>"]),
        (dict(wrong="cat"), ["--wrong", "'cat' is the same token as --answer"]),
        (dict(answer=""), ["--answer", "encodes to 0 tokens"]),
        (dict(clean="  "), ["--clean", "expected a non-empty text"]),
    ],
)
def test_bad_texts_and_tokens(run_cli, folder, tmp_path, change, words):
    out = tmp_path / "out"
    assert_user_error(run_cli(*_args(folder, out, **change)), *words)
    assert not out.exists()


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--head", "2.0"], ["--head", "layer 2 in '2.0' is out of range", "2 attention layers (0..1)"]),
        (["--head", "1.4"], ["--head", "head 4 in '1.4' is out of range", "4 heads (0..3)"]),
        (["--head", "one"], ["--head", "expected LAYER.HEAD"]),
        (["--method", "guess"], ["--method", "exact, attribution", "'guess'"]),
        (["--direction", "up"], ["--direction", "'up'"]),
    ],
)
def test_bad_options(run_cli, folder, tmp_path, extra, words):
    out = tmp_path / "out"
    assert_user_error(run_cli(*_args(folder, out, *extra)), *words)
    assert not out.exists()


def test_bad_models(run_cli, tmp_path):
    out = tmp_path / "out"
    assert_user_error(run_cli(*_args(tmp_path / "missing", out)), "--model")
    bare = save_decoder(tmp_path / "bare", "llama", tokenizer=False)
    assert_user_error(run_cli(*_args(bare, out)), "--model", "no tokenizer.json")
    assert not out.exists()


def test_the_folder_appears_whole_or_not_at_all(run_cli, folder, tmp_path, monkeypatch):
    import headwise.viz.patching as pictures

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pictures, "plot_patching", fail)
    out = tmp_path / "out"
    outcome = run_cli(*_args(folder, out))
    assert outcome.code == 2 and "Traceback" not in outcome.err
    last = outcome.err.strip().splitlines()[-1]  # after the progress bar
    assert last.startswith("headwise: error: --out: cannot write") and "No space left on device" in last
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
