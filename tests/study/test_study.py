"""headwise.study: the heads options checked in one place (each error naming its option), the decoder pipeline's
example against the model's own maps, the chosen queries alone against the full pass, and importance."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from headwise import study
from headwise.study import HeadsOptions

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _decoders import save_decoder  # noqa: E402

TEXT = "the cat sat on the mat . the cat sat on the mat ."


@pytest.fixture(scope="module")
def hm(tmp_path_factory):
    from headwise.models import open_model

    return open_model(save_decoder(tmp_path_factory.mktemp("study") / "llama", "llama", init=0.5))


def test_options_default_to_the_commands_defaults():
    o = HeadsOptions()
    assert (o.out, o.batch_size, o.importance_sentences, o.probe_length, o.probe_repeats, o.seed, o.cache) == (
        Path("headwise-out/heads"), 32, 64, 32, 2, 0, True,
    )  # fmt: skip
    assert o.corpus_path is None and HeadsOptions(corpus="sample").corpus_path == study.sample_corpus()
    assert study.sample_corpus().is_file()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.seed = 1
    assert isinstance(HeadsOptions(out="somewhere").out, Path)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"text": "  "}, "TEXT: expected a non-empty text, got an empty one"),
        ({"corpus": "/nonexistent.txt"}, "--corpus: no such file: '/nonexistent.txt'"),
        ({"corpus": "/"}, "--corpus: '/' is a folder; expected a text file"),
        ({"block_size": 0}, "--block-size: expected a positive number of query rows, got 0"),
        ({"queries_only": True}, "--queries-only: expected --queries A:B"),
        ({"queries_only": True, "queries": "0:2", "importance": True}, "--queries-only: draws the chosen queries"),
        ({"batch_size": 0}, "--batch-size: expected a positive integer, got 0"),
        ({"importance_sentences": -1}, "--importance-sentences: expected a positive integer, got -1"),
        ({"probe_repeats": 1}, "--probe-repeats: expected an integer ≥ 2, got 1"),
        ({"probe_length": True}, "--probe-length: expected an integer ≥ 2, got True"),
        ({"seed": -1}, "--seed:"),
    ],
)
def test_each_bad_option_is_named(options, message):
    with pytest.raises(ValueError) as e:
        HeadsOptions(**options)
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"text": 3}, "TEXT: expected a string or None, got int"),
        ({"corpus": Path("c.txt")}, "--corpus: expected a string or None, got PosixPath"),
        ({"layer": "1"}, "--layer: expected an integer or None, got '1'"),
        ({"block_size": 2.0}, "--block-size: expected an integer or None, got 2.0"),
    ],
)
def test_a_wrong_type_is_named(options, message):
    with pytest.raises(TypeError) as e:
        HeadsOptions(**options)
    assert str(e.value) == message


def test_the_options_are_spelled_as_on_the_command_line():
    assert [HeadsOptions.flag(n) for n in ("text", "cache", "probe_repeats", "queries_only")] == [
        "TEXT", "--no-cache", "--probe-repeats", "--queries-only",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="name: expected a field of HeadsOptions, got 'nope'"):
        HeadsOptions.flag("nope")


def test_the_plan_checks_the_options_against_the_model(hm):
    n = len(hm.tokenizer.encode(TEXT).ids)
    plan = study.plan_decoder(hm, HeadsOptions(text=TEXT, queries="1:5"))
    assert (plan.tokens, plan.queries) == (n, (1, 5))
    assert plan.probe.total_length == plan.probe.length * 2 + 1  # after BOS
    probe = study.plan_decoder(hm, HeadsOptions(probe_length=5, probe_repeats=3))
    assert (probe.tokens, probe.queries) == (16, None)
    for options, message in [
        ({"text": TEXT, "layer": 2}, "--layer: expected 0 … 1 for this model, got 2"),
        ({"text": TEXT, "queries": f"0:{n + 1}"}, f"--queries: expected 0 ≤ A < B ≤ {n}"),
        ({"text": TEXT, "queries": "a:b"}, "--queries: expected A:B (two integers), got 'a:b'"),
        ({"importance": True}, "--importance: expected --corpus FILE"),
        ({"probe_repeats": 200}, "--probe-repeats: 200 copies do not fit the model's 128 positions"),
        ({"text": " ".join(["cat"] * 200)}, "TEXT: 201 tokens, longer than the model's context of 128 tokens"),
    ]:
        with pytest.raises(ValueError) as e:
            study.plan_decoder(hm, HeadsOptions(**options))
        assert str(e.value).startswith(message), str(e.value)


def test_the_example_is_the_models_own_maps_and_the_kept_queries_their_block(hm):
    """A short example: ``maps`` is exactly what the model's attentions give; the kept queries A … B − 1 over keys
    A … B − 1 equal that block of the maps (float32 from one pass against another, by another kernel: 4e-6)."""
    options = HeadsOptions(text=TEXT, queries="2:9")
    plan = study.plan_decoder(hm, options)
    texts, total = study.decoder_texts(options)
    warnings: list[str] = []
    found = study.decoder_heads(hm, options, plan, texts, warn=warnings.append)
    view = found.example
    enc = hm.encode([TEXT])
    expected = np.stack([m[0] for m in hm.attentions(enc.ids, enc.mask)]).astype(np.float32)  # (NL, H, n, n)
    assert total == 1 and not warnings and view.ids == enc.ids[0].tolist() and view.n == plan.tokens
    assert view.pooled is None and view.bounds is None and view.queries == (2, 9)
    np.testing.assert_array_equal(view.maps, expected)
    np.testing.assert_allclose(view.kept, expected[:, :, 2:9, 2:9], rtol=0, atol=4e-6)
    assert found.report.num_tokens == plan.tokens and found.report.metrics["prev"].shape == (2, 4)
    alone = study.query_rows(hm, options, plan, warn=warnings.append)
    assert alone.maps is None and alone.pooled is None and alone.ids == view.ids and alone.queries == (2, 9)
    np.testing.assert_allclose(alone.kept, view.kept, rtol=0, atol=1e-6)


def test_a_short_example_alone_is_drawn_without_a_pass(hm):
    enc = hm.encode([TEXT])
    view = study.example_view(hm, enc.ids, enc.mask)
    expected = np.stack([m[0] for m in hm.attentions(enc.ids, enc.mask)]).astype(np.float32)
    assert view.kept is None and view.queries is None and view.pooled is None
    np.testing.assert_array_equal(view.maps, expected)


def test_the_probe_alone_is_read_when_there_is_no_text(hm):
    options = HeadsOptions(probe_length=6)
    plan = study.plan_decoder(hm, options)
    assert study.decoder_texts(options) == (None, 0)
    found = study.decoder_heads(hm, options, plan, None, warn=pytest.fail)
    first = study.probe_ids(hm, plan.probe)[0]
    assert found.example.ids == first.tolist() and found.example.n == plan.probe.total_length == 13
    assert found.report.num_sentences == plan.probe.batch


def test_importance_on_the_probe(hm):
    plan = study.plan_decoder(hm, HeadsOptions(probe_length=6))
    batches = study.importance_batches(hm, study.importance_texts(HeadsOptions()), plan.probe, 4, pytest.fail)
    assert [b[0].shape for b in batches] == [(4, 13), (4, 13)]
    stages: list[str] = []
    result = study.run_importance(
        hm, batches, seed=0, random_orders=1, points=3, progress=lambda stage, done, total: stages.append(stage)
    )
    columns = study.importance_columns(result)
    assert sorted(columns) == ["ablation_delta", "importance", "importance_norm"] and stages
    assert all(v.shape == (2, 4) for v in columns.values())
    summary = study.importance_summary(result)
    assert summary["objective"] == result.objective and summary["sequences"] == 8


def test_the_encoder_checks_name_their_option():
    for options, message in [
        ({}, "expected a TEXT or --corpus FILE"),
        ({"text": "x", "importance": True}, "--importance: expected --corpus FILE"),
    ]:
        with pytest.raises(ValueError, match=message):
            study.check_encoder(HeadsOptions(**options))
    study.check_encoder(HeadsOptions(corpus="sample", importance=True))
    HeadsOptions(layer=5).check_layer(6)
    with pytest.raises(ValueError, match="--layer: expected 0 … 5 for this model, got 6"):
        HeadsOptions(layer=6).check_layer(6)


def test_the_untrained_block_and_its_sentence():
    """The untrained block's sentence: the same heads as :func:`headwise.analysis.analyze_sentence` on its attend,
    the tokens shown as the text they add, the pieces kept beside them."""
    from headwise.analysis import analyze_sentence

    enc = study.encoder_attend("untrained")
    assert (enc.num_layers, enc.num_heads, enc.max_length) == (1, 4, 512) and enc.title.startswith("untrained")
    warned: list[str] = []
    sentence, pieces, ids = study.sentence_heads(None, "The cat sat.", enc, warn=warned.append)
    direct = analyze_sentence("The cat sat.", enc.attend, num_layers=1, num_heads=4, max_length=512)
    assert pieces == direct.tokens and len(ids) == len(pieces) and not warned
    assert pieces == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
    assert sentence.tokens == ["[CLS]", "␣the", "␣cat", "␣sat", ".", "[SEP]"]  # a space shown as ␣
    np.testing.assert_array_equal(sentence.attentions, direct.attentions)


def test_importing_the_package_loads_nothing_heavy():
    """The command line imports headwise.study at start-up for every command: no torch, analysis or model code."""
    import subprocess
    import sys

    code = (
        "import sys, headwise.study as s; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('headwise.analysis', 'headwise.models', "
        "'headwise.study.'))), sorted(s.__all__) == sorted(dir(s)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        study.nope  # noqa: B018
