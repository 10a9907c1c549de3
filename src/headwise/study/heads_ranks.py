"""``headwise heads``'s corpus run and ``--importance`` together across the ranks of a ``torchrun`` launch (one gloo
group: :func:`headwise.distributed.ranks.ranks`), what rank 0 prints of them.

Shape legend: NL layers, H heads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headwise.distributed.ranks import ranks
from headwise.study.corpus_ranks import CorpusRun
from headwise.study.importance import estimated, importance_batches, importance_texts
from headwise.study.importance_ranks import estimate_across_ranks, importance_across_ranks
from headwise.study.options import HeadsOptions

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = ["RankedHeads", "heads_across_ranks"]


@dataclass
class RankedHeads:
    """What :func:`heads_across_ranks` found on this rank.

    Attributes:
        heads: rank 0: the corpus run's :class:`~headwise.study.DecoderHeads` (an encoder: its
            :class:`~headwise.analysis.HeadReport`); other ranks: None.
        importance: rank 0, with ``--importance``: the :class:`~headwise.analysis.importance.ImportanceResult`
            measured across the ranks; else None.
        lines: rank 0: what the ranks did, one line each (for the terminal); other ranks: none.
    """

    heads: object
    importance: object
    lines: list[str]


def heads_across_ranks(
    hm: HeadModel,
    opts: HeadsOptions,
    corpus: Callable[[Callable[[int, int], None] | None], CorpusRun],
    probe,
    *,
    progress: Callable[[int, int], None] | None = None,
    importance_progress: Callable[[str, int, int], None] | None = None,
) -> RankedHeads:
    """Under torchrun: ``corpus(progress)`` (:func:`~headwise.study.corpus_heads` or
    :func:`~headwise.study.encoder_corpus`: the documents split, resumable from ``--out``'s shards), then
    ``--importance``'s batches split (:func:`~headwise.study.importance_across_ranks`, batches of the corpus run's
    batch size), in one gloo group (:func:`headwise.distributed.ranks.ranks`).

    Args:
        hm: the model; opts: the options; corpus: the corpus run, given its ``progress(done, total)``; probe: a
            decoder's probe (the importance's sequences without a tokenizer), None for an encoder.
        progress: ``(shards done, this rank's shards)``; importance_progress: the importance's ``(stage, done,
            total)`` (:func:`~headwise.study.importance_across_ranks`).
    Raises:
        ValueError: one line on every rank (see the runs); CollectiveTimeout: a stalled rank.
    """
    with ranks():
        run = corpus(progress)
        ranked = None
        if opts.importance:
            lines = importance_texts(opts)  # rank 0 reads them again, warning once
            batches = importance_batches(hm, lines, probe, run.batch_size, lambda m: None)
            if estimated(hm, opts, lambda m: None):
                ranked = estimate_across_ranks(
                    hm,
                    batches,
                    seed=opts.seed,
                    mode=opts.ablation,
                    top_k=opts.top_k,
                    max_exact=opts.max_exact,
                    progress=importance_progress,
                )
            else:
                ranked = importance_across_ranks(
                    hm, batches, seed=opts.seed, mode=opts.ablation, out=opts.out, progress=importance_progress
                )
    if run.heads is None:
        return RankedHeads(None, None, [])
    said = [
        f"{run.world_size} ranks, {run.documents} documents; rank 0: {len(run.computed)} shard(s) computed, "
        f"{len(run.resumed)} resumed from {opts.out / 'shards'}"
    ]
    if ranked is not None:
        said.append(
            f"importance across {ranked.world_size} ranks: rank 0 measured {len(ranked.batches)} of the batches; "
            f"{ranked.payload_bytes:,} bytes all-reduced"
        )
    return RankedHeads(run.heads, None if ranked is None else ranked.result, said)
