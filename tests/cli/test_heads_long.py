"""``headwise heads --model DIR`` at long inputs: the streaming pass, no fixed cap, a pooled overview, full rows of
``--queries``, and the bad inputs of the long path refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _cli_helpers import assert_user_error

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _decoders import WORDS, save_decoder  # noqa: E402


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    return save_decoder(tmp_path_factory.mktemp("long") / "llama", "llama", positions=2048, init=0.5)


def _text(words: int) -> str:
    rng = np.random.default_rng(0)
    return " ".join(rng.choice(WORDS[:18], words))


def test_past_1024_tokens_streams_pools_and_keeps_the_chosen_queries(run_cli, tmp_path, long_model):
    text = _text(1500)  # 1,501 tokens with BOS: past the old cap of 1,024
    out = tmp_path / "out"
    outcome = run_cli("heads", text, "--model", str(long_model), "--out", str(out), "--queries", "1400:1460")
    assert outcome.code == 0, outcome.err
    data = json.loads((out / "heads.json").read_text())
    assert data["num_tokens"] == 1501
    view = data["view"]
    assert view["pooled"] and view["bins"] == 128 and view["queries"] == [1400, 1460]
    assert view["js_rows_per_sequence"] == 32
    assert "Jensen–Shannon" in outcome.out and "pooled to 128 × 128 bins" in outcome.out
    assert (out / "headview_queries.html").exists()
    assert (out / "headview.html").stat().st_size < 4_000_000


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--block-size", "0"), ("--block-size", "0")),
        (("--block-size", "-3"), ("--block-size", "-3")),
        (("--queries", "10:9000"), ("--queries", "10:9000", "≤ 11")),
        (("--queries", "5:2"), ("--queries", "5:2")),
    ],
)
def test_bad_block_sizes_and_query_ranges_are_refused(run_cli, tmp_path, long_model, args, words):
    out = tmp_path / "out"
    outcome = run_cli(
        "heads", "the cat sat on the mat . the cat sat", "--model", str(long_model), "--out", str(out), *args
    )
    assert_user_error(outcome, *words)
    assert not out.exists()


def test_a_text_longer_than_the_context_is_refused(run_cli, tmp_path, long_model):
    out = tmp_path / "out"
    outcome = run_cli("heads", _text(2100), "--model", str(long_model), "--out", str(out))
    assert_user_error(outcome, "TEXT", "2,101 tokens", "context of 2,048")
    assert not out.exists()
