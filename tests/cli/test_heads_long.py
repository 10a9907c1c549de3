"""``headwise heads --model DIR`` at long inputs: the streaming pass, no fixed cap, a pooled overview, full rows of
``--queries``, and the bad inputs of the long path refused in one line."""

from __future__ import annotations

import json
import shlex

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


def _page_data(path) -> dict:
    html = path.read_text(encoding="utf-8")
    return json.loads(html.split('id="headview-data">', 1)[1].split("</script>", 1)[0])


@pytest.mark.slow  # the fast suite keeps a lighter test of the same path
def test_the_pooled_head_view_holds_the_command_that_draws_chosen_queries(run_cli, tmp_path, long_model):
    text = " ".join(["a", "the"] * 150)  # 301 tokens with BOS: pooled; 599 characters: written out in the command
    out = tmp_path / "out"
    outcome = run_cli("heads", text, "--model", str(long_model), "--out", str(out), "--queries", "200:250")
    assert outcome.code == 0, outcome.err
    data = _page_data(out / "headview.html")
    ov = data["overview"]
    assert ov["tokens"] == 301 and len(ov["bounds"]) == 129 and ov["bounds"][-1] == 301
    model, folder = shlex.quote(str(long_model)), shlex.quote(str(out))
    assert ov["command"] == f"headwise heads --model {model} '{text}' --queries-only --out {folder}"
    assert ov["queries"] == [200, 250] and ov["max_queries"] == 512 and ov["note"] == ""
    assert data["links"] == [{"href": "headview_queries.html", "text": "queries 200–249 at full resolution"}]
    queries = _page_data(out / "headview_queries.html")
    assert queries["overview"] is None and queries["links"][0]["href"] == "headview.html"
    # A longer TEXT is not repeated in the page: the command says TEXT, and the note says what it stands for.
    outcome = run_cli("heads", _text(1500), "--model", str(long_model), "--out", str(out))
    assert outcome.code == 0, outcome.err
    ov = _page_data(out / "headview.html")["overview"]
    assert (
        " TEXT --queries-only --out " in ov["command"] and "not repeated here" in ov["note"] and ov["queries"] is None
    )
    assert _page_data(out / "headview.html")["links"] == []  # the older headview_queries.html is not linked


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--block-size", "0"), ("--block-size", "0")),
        (("--block-size", "-3"), ("--block-size", "-3")),
        (("--queries", "10:9000"), ("--queries", "10:9000", "≤ 11")),
        (("--queries", "5:2"), ("--queries", "5:2")),
        (("--queries-only",), ("--queries-only", "--queries A:B")),
        (("--queries", "2:5", "--queries-only", "--importance"), ("--queries-only", "--importance")),
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


@pytest.mark.slow  # the fast suite keeps a lighter test of the same path
def test_queries_only_writes_the_chosen_rows_alone_as_the_full_pass_keeps_them(run_cli, tmp_path, long_model):
    """``--queries-only``: headview_queries.html from a pass over the chosen rows alone — the same page the full
    run writes for those queries — and every other file left as it was."""
    text = " ".join(["a", "the", "cat"] * 100)  # 301 tokens with BOS
    full, alone = tmp_path / "full", tmp_path / "alone"
    outcome = run_cli("heads", text, "--model", str(long_model), "--out", str(full), "--queries", "120:180")
    assert outcome.code == 0, outcome.err
    outcome = run_cli("heads", text, "--model", str(long_model), "--out", str(alone), "--queries", "5:40")
    assert outcome.code == 0, outcome.err
    before = {f.name: f.read_bytes() for f in alone.iterdir() if f.name != "headview_queries.html"}
    outcome = run_cli(
        "heads", text, "--model", str(long_model), "--out", str(alone), "--queries", "120:180", "--queries-only"
    )
    assert outcome.code == 0, outcome.err
    assert "one pass over those rows alone" in outcome.out
    assert {f.name: f.read_bytes() for f in alone.iterdir() if f.name != "headview_queries.html"} == before
    got, want = _page_data(alone / "headview_queries.html"), _page_data(full / "headview_queries.html")
    assert got["n"] == 60 and got["tokens"] == want["tokens"]
    for key in ("keys", "weights", "thumbs", "k", "dropped"):
        assert got[key] == want[key], key
    assert got["links"] == [{"href": "headview.html", "text": "the whole example"}]
