"""``headwise heads --composition``: heads.json and heads.csv hold the library's composition and copying scores,
composition.png is written; an encoder, or --queries-only with it, is one line, exit 2."""

from __future__ import annotations

import csv
import json
import math

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _cli_helpers import assert_user_error  # noqa: E402
from _decoders import save_decoder  # noqa: E402


@pytest.mark.parametrize("family", ["llama", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_composition_columns_and_summary(run_cli, tmp_path, family):
    from headwise.circuits import composition_scores, copying_scores, head_weights
    from headwise.models import open_model

    folder = save_decoder(tmp_path / family, family, init=0.5)
    out = tmp_path / "out"
    outcome = run_cli("heads", "the cat sat on the mat", "--model", str(folder), "--composition", "--out", str(out))
    assert outcome.code == 0, outcome.err
    assert (out / "composition.png").stat().st_size > 0
    report = json.loads((out / "heads.json").read_text())
    w = head_weights(open_model(folder))
    scores, copying = composition_scores(w), copying_scores(w)
    NL, H = copying.copying.shape
    rows = {(r["layer"], r["head"]): r for r in report["heads"]}
    for (layer, head), row in rows.items():
        assert row["copying"] == pytest.approx(float(copying.copying[layer, head]), abs=1e-6)
        assert row["copying_positive"] == pytest.approx(float(copying.positive[layer, head]), abs=1e-6)
        if layer == 0:
            assert row["k_composition_max"] is None
        else:
            expected = float(scores.k[:layer, :, layer, head].max())
            assert row["k_composition_max"] == pytest.approx(expected, abs=1e-6)
    summary = report["composition"]
    assert len(summary["k"]) == NL and len(summary["k"][0][0][0]) == H
    assert summary["k"][0][1][1][2] == pytest.approx(float(scores.k[0, 1, 1, 2]), abs=1e-5)
    assert summary["k"][1][0][0][0] is None  # no composition backwards
    best = summary["top"]["k"][0]
    assert best["score"] == pytest.approx(float(scores.k.nan_to_num(-1).max()), abs=1e-6)
    table = list(csv.DictReader((out / "heads.csv").open()))
    assert math.isclose(float(table[-1]["copying"]), float(copying.copying[NL - 1, H - 1]), abs_tol=1e-6)
    assert "strongest K-composition" in outcome.out


def test_composition_needs_a_decoder(run_cli, tmp_path):
    outcome = run_cli("heads", "a text", "--composition", "--out", str(tmp_path / "o"))
    assert_user_error(outcome, "--composition")
    assert not (tmp_path / "o").exists()


def test_composition_with_queries_only_is_refused(run_cli, tmp_path):
    argv = ("heads", "a text", "--model", "x", "--queries", "0:2", "--queries-only", "--composition")
    outcome = run_cli(*argv, "--out", str(tmp_path / "o"))
    assert_user_error(outcome, "--queries-only", "--composition")
