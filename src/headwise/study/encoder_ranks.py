"""An encoder's corpus statistics on ``torch.distributed``: :func:`headwise.study.corpus_heads`'s shards, store and
one reduction, for :func:`headwise.study.encoder_report`'s statistics (``torchrun … -m headwise heads --corpus FILE``
with an encoder's ``--model``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

from headwise.distributed.ranks import ranks
from headwise.study.corpus_ranks import CorpusRun
from headwise.study.options import HeadsOptions
from headwise.study.shards import Shard, open_corpus_store, reduce_sums, shard_sums, unpack_state

__all__ = ["encoder_corpus"]


def encoder_corpus(
    enc,
    model,
    tokenizer,
    options: HeadsOptions,
    *,
    warn: Callable[[str], None],
    progress: Callable[[int, int], None] | None = None,
    timeout_s: float | None = None,
) -> CorpusRun:
    """An encoder's corpus statistics (:func:`headwise.study.encoder_report`'s) on every rank of a torchrun launch.

    As :func:`corpus_heads`: the corpus's documents cut into the shards of ``--batch-size`` consecutive documents a
    one-process run reads, dealt by token count, each shard's :class:`~headwise.analysis.HeadStats` sums saved as it
    finishes (``OUT/shards``, resumed on a restart), one float64 all-reduce; rank 0 adds the sums and computes the
    report (the Jensen–Shannon rows of a sentence depend on that sentence alone, so the union over ranks is the
    one-process sample). The same refusals, with the manifest's ``kind`` ``"encoder-heads"``.

    Args:
        enc: the :class:`~headwise.study.EncoderAttend` (``attend``, NL, H, ``max_length``); model: its module (the
            weights hashed); tokenizer: a ``tokenizers.Tokenizer`` (token counts, for the balance only).
        options, warn, progress, timeout_s: as :func:`corpus_heads` (``warn``, rank 0: lines truncated, all ranks).
    Returns:
        the :class:`CorpusRun`, its ``heads`` the :class:`~headwise.analysis.HeadReport` on rank 0 (None elsewhere).
    """
    import torch

    from headwise.analysis import CorpusFile, HeadStats
    from headwise.models import TruncationWarning

    if options.corpus is None:
        raise ValueError("--corpus: expected a corpus file (a distributed run splits its documents)")
    n = enc.max_length
    with ranks(timeout_s) as r:
        rank, world, timeout_s = r.rank, r.world_size, r.timeout_s
        docs = list(CorpusFile(options.corpus_path))
        tokens = [min(len(e.ids), n) for e in tokenizer.encode_batch(docs)] if docs else []
        store, shards = open_corpus_store(model, options, docs, tokens, "encoder-heads", {"max_length": n})
        mine = r.share([s.tokens for s in shards])
        expected = set(HeadStats(enc.num_layers, enc.num_heads, max_length=n).state()) | {"truncated"}

        def compute(s: Shard) -> dict:
            stats = HeadStats(enc.num_layers, enc.num_heads, max_length=n)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", TruncationWarning)
                stats.update(*enc.attend(docs[s.start : s.stop]))  # the batch a one-process run reads
            cut = sum(issubclass(w.category, TruncationWarning) for w in caught)
            for w in caught:
                if not issubclass(w.category, TruncationWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            return stats.state() | {"truncated": torch.tensor(float(cut), dtype=torch.float64)}

        sums = shard_sums(store, shards, mine, compute, expected, lambda state: state, progress)
        reduce_sums(sums, timeout_s)
        store.clean()
        summed = unpack_state(sums.vector, sums.layout)
        truncated = int(round(float(summed.pop("truncated"))))
        report = None
        if rank == 0:
            stats = HeadStats(enc.num_layers, enc.num_heads, max_length=n)
            stats.add_state(summed)
            if truncated:
                warn(f"--corpus: {truncated} line(s) longer than {n} tokens were truncated to {n}")
            report = stats.result()
        return CorpusRun(
            report, rank, world, mine, sums.computed, sums.resumed, len(docs), truncated,
            sums.vector.numel() * sums.vector.element_size(), sums.compute_seconds, sums.slowest_seconds,
            sums.reduce_seconds, store.manifest["batch_size"],
        )  # fmt: skip
