"""The data-parallel corpus run in one process: shards, their balance, the accumulators' partial sums, the shard
store and its manifest, and :func:`headwise.study.corpus_heads` on a world of one gloo rank — every statistic
against the one-process :func:`headwise.study.decoder_heads`, whole arrays."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _corpus import make_corpus, make_model  # noqa: E402
from headwise import study  # noqa: E402
from headwise.analysis import DecoderStats, HeadStats  # noqa: E402
from headwise.analysis.streaming import read_rows  # noqa: E402
from headwise.models import open_model  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return open_model(make_model(root / "model")), make_corpus(root / "corpus.txt"), root


def _options(corpus, out, **kw):
    return study.HeadsOptions(corpus=str(corpus), model="tiny", out=out, **kw)


def _one_process(hm, opts):
    plan = study.plan_decoder(hm, opts)
    texts, _ = study.decoder_texts(opts)
    warned = []
    return study.decoder_heads(hm, opts, plan, texts, warn=warned.append), warned


def _assert_same_report(a, b, tol=1e-9):
    assert a.num_sentences == b.num_sentences and a.num_tokens == b.num_tokens
    for name in a.metrics:
        np.testing.assert_allclose(a.metrics[name], b.metrics[name], rtol=0, atol=tol, equal_nan=True, err_msg=name)
    np.testing.assert_array_equal(a.roles, b.roles)
    np.testing.assert_array_equal(a.positional, b.positional)
    for name in ("js_divergence", "js_distance"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0, atol=tol, err_msg=name)
    np.testing.assert_allclose(np.abs(a.mds), np.abs(b.mds), rtol=0, atol=1e-7)  # an MDS axis may flip sign


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


# -- shards and their balance ----------------------------------------------------------------------------------


def test_plan_shards_are_the_one_process_batches():
    shards = study.plan_shards([5, 1, 7, 2, 9, 4, 3], 3)
    assert [(s.start, s.stop, s.tokens) for s in shards] == [(0, 3, 13), (3, 6, 15), (6, 7, 3)]
    with pytest.raises(ValueError, match="batch_size"):
        study.plan_shards([1, 2], 0)


@pytest.mark.parametrize("seed", range(6))
def test_assign_shards_balances_tokens_within_four_thirds_of_the_best(seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 100, size=int(rng.integers(4, 9))).tolist()
    shards = study.plan_shards(tokens, 1)
    world = int(rng.integers(2, 4))
    got = study.assign_shards(shards, world)
    assert sorted(itertools.chain(*got)) == list(range(len(shards)))  # every shard once
    worst = max(sum(tokens[k] for k in ks) for ks in got)
    best = min(  # brute force over every assignment
        max(sum(t for t, r in zip(tokens, owners) if r == rank) for rank in range(world))
        for owners in itertools.product(range(world), repeat=len(tokens))
    )
    assert worst <= best * 4 / 3 + 1e-9
    assert got == study.assign_shards(shards, world)  # deterministic


def test_assign_shards_refuses_more_ranks_than_shards():
    with pytest.raises(ValueError, match="WORLD_SIZE: 3 ranks for 2 shard"):
        study.assign_shards(study.plan_shards([1, 2], 1), 3)


# -- partial sums ----------------------------------------------------------------------------------------------


def test_partial_sums_added_equal_one_accumulator(setup):
    """Per-batch DecoderStats' states added in another order equal one accumulator fed every batch."""
    hm, corpus, _ = setup
    opts = _options(corpus, "unused", batch_size=4)
    texts = list(study.decoder_texts(opts)[0])
    whole = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
    parts = []
    for start in range(0, len(texts), 4):
        enc = hm.encode(texts[start : start + 4])
        one = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
        for stats in (whole, one):
            read_rows(hm, enc.ids, enc.mask, head_stats=stats.heads, detector_stats=stats.detectors)
        parts.append(one.state())
    merged = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
    for state in reversed(parts):
        merged.add_state(state)
    expected, got = whole.state(), merged.state()
    assert set(expected) == set(got) and all(v.dtype == torch.float64 for v in got.values())
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=1e-9, msg=k)
    _assert_same_report(merged.result(), whole.result())


def test_add_state_refuses_another_shape_or_key():
    stats = HeadStats(2, 4, max_length=16)
    with pytest.raises(ValueError, match="'hist' expected shape"):
        stats.add_state(HeadStats(2, 4, max_length=32).state())
    with pytest.raises(ValueError, match="missing \\['js_rows', 'js_sum'\\]"):
        stats.add_state(HeadStats(2, 4, max_length=16, js=False).state())
    before = stats.state()
    for k, v in stats.state().items():  # nothing was added by the refused calls
        torch.testing.assert_close(v, before[k])


# -- the store -------------------------------------------------------------------------------------------------


def test_store_round_trip_mismatch_and_damage(tmp_path):
    store = study.ShardStore(tmp_path / "shards", {"format": "x", "batch_size": 4})
    assert store.mismatch() is None and store.load(0) is None
    store.write_manifest()
    state = {"a": torch.arange(6, dtype=torch.float64).reshape(2, 3), "b": torch.tensor(2.5, dtype=torch.float64)}
    store.save(3, state)
    got = store.load(3)
    assert set(got) == {"a", "b"} and torch.equal(got["a"], state["a"]) and torch.equal(got["b"], state["b"])
    assert [p.name for p in sorted((tmp_path / "shards").iterdir())] == ["manifest.json", "shard-000003.safetensors"]
    other = study.ShardStore(tmp_path / "shards", {"format": "x", "batch_size": 8})
    message = other.mismatch()
    assert "holds shards of another run" in message and "batch_size 4 there, 8 now" in message
    path = store.path(3)
    path.write_bytes(path.read_bytes()[:20])  # damaged outside headwise: computed again, never trusted
    assert store.load(3) is None


def test_weights_hash_names_the_weights(setup, tmp_path):
    hm, _, root = setup
    again = open_model(root / "model")
    other = open_model(make_model(tmp_path / "other", seed=1))
    assert study.weights_sha256(hm.model) == study.weights_sha256(again.model)
    assert study.weights_sha256(hm.model) != study.weights_sha256(other.model)


# -- the run on one rank ---------------------------------------------------------------------------------------


def test_corpus_heads_on_one_rank_equals_one_process_and_resumes(setup, tmp_path, world_of_one):
    hm, corpus, _ = setup
    opts = _options(corpus, tmp_path / "out", batch_size=4)
    plan = study.plan_decoder(hm, opts)
    reference, ref_warned = _one_process(hm, opts)
    warned, seen = [], []
    run = study.corpus_heads(hm, opts, plan, warn=warned.append, progress=lambda d, t: seen.append((d, t)))
    assert run.rank == 0 and run.world_size == 1 and run.documents == 30 and run.truncated == 1
    assert run.computed == list(range(8)) and run.resumed == [] and seen[-1] == (8, 8)
    assert len(warned) == 1 and "1 text(s) longer than 64 tokens" in warned[0] and len(ref_warned) == 1
    _assert_same_report(run.heads.report, reference.report)
    assert run.heads.example.ids == reference.example.ids
    np.testing.assert_allclose(run.heads.example.maps, reference.example.maps, rtol=0, atol=1e-6)
    manifest = json.loads((tmp_path / "out" / "shards" / "manifest.json").read_text())
    assert manifest["shards"] == 8 and manifest["documents"] == 30 and manifest["batch_size"] == 4
    assert manifest["model_sha256"] == study.weights_sha256(hm.model)
    # a second run with the same --out and options computes nothing
    again = study.corpus_heads(hm, opts, plan, warn=lambda m: None)
    assert again.computed == [] and again.resumed == list(range(8))
    _assert_same_report(again.heads.report, run.heads.report, tol=0)  # the same sums, added in the same order
    # one shard lost, one damaged, one holding other sums: only they are computed again
    shards = tmp_path / "out" / "shards"
    (shards / "shard-000005.safetensors").unlink()
    (shards / "shard-000002.safetensors").write_bytes(b"\x00" * 12)
    store = study.ShardStore(shards, {})
    store.save(6, {"heads.hist": torch.zeros(3, 5, dtype=torch.float64)})
    third = study.corpus_heads(hm, opts, plan, warn=lambda m: None)
    assert third.computed == [2, 5, 6]
    _assert_same_report(third.heads.report, reference.report)


def test_corpus_heads_refuses_another_runs_shards(setup, tmp_path, world_of_one):
    hm, corpus, _ = setup
    opts = _options(corpus, tmp_path / "out", batch_size=4)
    study.corpus_heads(hm, opts, study.plan_decoder(hm, opts), warn=lambda m: None)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out" / "shards").iterdir()}
    other = _options(corpus, tmp_path / "out", batch_size=5)
    with pytest.raises(ValueError, match="holds shards of another run .*batch_size 4 there, 5 now"):
        study.corpus_heads(hm, other, study.plan_decoder(hm, other), warn=lambda m: None)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out" / "shards").iterdir()} == before


def test_corpus_heads_outside_a_launch_is_refused(setup, tmp_path, monkeypatch):
    hm, corpus, _ = setup
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    opts = _options(corpus, tmp_path / "out", batch_size=4)
    with pytest.raises(ValueError, match="RANK / WORLD_SIZE: not set; launch with torchrun"):
        study.corpus_heads(hm, opts, study.plan_decoder(hm, opts), warn=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_launch_from_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert study.Launch.from_env() is None and not study.launched()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert study.Launch.from_env() == study.Launch(1, 2, 1)
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK: expected 0 … WORLD_SIZE − 1 = 1, got 2"):
        study.Launch.from_env()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="expected integers"):
        study.Launch.from_env()


def test_an_encoder_under_torchrun_is_refused(tmp_path, monkeypatch, capsys):
    from headwise.cli import main

    corpus = make_corpus(tmp_path / "c.txt")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as stop:
        main(["heads", "--model", "untrained", "--corpus", str(corpus), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--corpus: under torchrun the documents are split across ranks for decoders only" in err[0]
    assert not (tmp_path / "out").exists()
