"""The corpus run's shard plan adapts to its ranks when the user did not choose ``--batch-size``: the automatic batch
is ``min(32, ⌈D / ranks⌉)`` and is recorded in the manifest; a run resumed in the same ``--out`` on another number of
ranks takes the manifest's batch, so its shards stay that run's; an explicit ``--batch-size`` is kept (and refused
with one line when it leaves a rank without a shard). The runs under torchrun are in ``test_corpus_launch``."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _corpus import make_corpus  # noqa: E402
from headwise import study  # noqa: E402


def _options(corpus, out, **kw):
    return study.HeadsOptions(corpus=str(corpus), model="tiny", out=out, **kw)


def _store(out, manifest):
    return study.ShardStore(out / "shards", manifest)


def test_the_automatic_batch_gives_every_rank_a_shard(tmp_path):
    corpus = make_corpus(tmp_path / "corpus.txt")  # 30 documents
    auto = _options(corpus, tmp_path / "out", batch_size_auto=True)
    store = _store(tmp_path / "out", {"format": "f", "kind": "k", "batch_size": 32})
    assert study.corpus_batch_size(auto, 30, 1, store) == 30  # at most the default, 32
    assert study.corpus_batch_size(auto, 30, 2, store) == 15
    assert study.corpus_batch_size(auto, 30, 4, store) == 8  # ⌈30 / 4⌉: 4 shards
    assert study.corpus_batch_size(auto, 30, 30, store) == 1
    assert study.corpus_batch_size(_options(corpus, tmp_path / "out", batch_size=7, batch_size_auto=True), 300, 2,
                                   store) == 7  # fmt: skip
    given = _options(corpus, tmp_path / "out", batch_size=32)
    assert study.corpus_batch_size(given, 30, 2, store) == 32  # the user's value: kept (refused by the run)


def test_a_resumed_automatic_run_takes_the_manifests_batch(tmp_path):
    corpus = make_corpus(tmp_path / "corpus.txt")
    auto = _options(corpus, tmp_path / "out", batch_size_auto=True)
    first = _store(tmp_path / "out", {"format": "f", "kind": "k", "documents": 30, "batch_size": 10, "shards": 3})
    first.write_manifest()
    same = _store(tmp_path / "out", {"format": "f", "kind": "k", "documents": 30, "batch_size": 32})
    assert study.corpus_batch_size(auto, 30, 2, same) == 10  # resumed on 2 ranks: the shards of 10 kept
    other = _store(tmp_path / "out", {"format": "f", "kind": "other", "documents": 30, "batch_size": 32})
    assert study.corpus_batch_size(auto, 30, 2, other) == 15  # another run's manifest: refused later, not reused
