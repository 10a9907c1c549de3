"""A decoder's corpus statistics on ``torch.distributed``: documents split across ranks, sums reduced once, resumable.

``torchrun --nproc-per-node P [--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT] -m headwise heads --model M
--corpus FILE --out DIR`` runs :func:`corpus_heads` on every rank (the command line detects torchrun's ``RANK`` /
``WORLD_SIZE`` through :func:`headwise.distributed.ranks.launched`); a library caller calls it on every rank of its own
launch.

Shape legend: NL layers, H heads, N = NL · H, D documents (the corpus's non-empty UTF-8 lines), K shards.

How the work is cut (:mod:`headwise.study.shards`): the D documents in K shards of the batch size's consecutive
documents — the batches a one-process run reads — dealt to the ranks by token count. Each rank streams its shards
through the one streaming pass (:func:`headwise.analysis.streaming.read_rows`) into a fresh
:class:`~headwise.analysis.DecoderStats` per shard, whose running sums (:meth:`~headwise.analysis.DecoderStats.state`:
float64 tensors) are saved as the shard finishes. The ranks then pass one barrier that names a rank that never
arrives (``monitored_barrier``) and all-reduce their summed shards once, as one float64 vector; rank 0 adds the
probe's detectors and the example and returns the report. Every statistic equals the one-process run's up to the
order of the float64 additions (tested to 1e-9): the Jensen–Shannon rows sampled in a sentence depend on that sentence
alone (:func:`headwise.analysis.js_sample_rows`), so the ranks' union is the one-process sample.

Resuming. A shard whose file is in ``OUT/shards`` is loaded instead of computed, whichever rank computed it: after
``torchrun --max-restarts K`` restarts the ranks of a killed one, and on a second run with the same ``--out`` and
options — with any number of ranks, since the shards do not depend on it (the automatic batch size is the manifest's
on a resumed run). A manifest written for another model, corpus or options is refused with one line (ValueError),
before anything is computed or written.

Bad input, refused on every rank together with one line (ValueError): more ranks than documents, fewer shards than
ranks (naming ``--batch-size``), ranks that opened different weights or corpora (their hashes all-gathered), a
rendezvous that cannot be reached within the timeout. A rank that stalls is named by the barrier after the timeout
(:class:`~headwise.distributed.ranks.CollectiveTimeout`). The timeout: ``timeout_s=``, else
``$HEADWISE_DIST_TIMEOUT`` seconds, else :data:`~headwise.distributed.ranks.DEFAULT_TIMEOUT_S` (it must cover the
ranks' finishing-time spread; balanced shards keep that small).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headwise.distributed.ranks import ranks
from headwise.study.options import HeadsOptions
from headwise.study.shards import Shard, open_corpus_store, reduce_sums, shard_sums, unpack_state

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = ["CorpusRun", "corpus_heads", "widen_state"]


@dataclass
class CorpusRun:
    """What :func:`corpus_heads` did on this rank.

    Attributes:
        heads: rank 0: the :class:`~headwise.study.DecoderHeads` (report and example; :func:`encoder_corpus`: the
            :class:`~headwise.analysis.HeadReport`); other ranks: None.
        rank, world_size: this process's place.
        shards: this rank's shard indices; computed / resumed: those it computed / loaded from the store.
        documents: the corpus's D documents; truncated: those cut to the context (every rank's).
        payload_bytes: bytes of the one all-reduced vector (each rank sends about 2 (P − 1) / P of it, ring).
        compute_seconds: this rank's time on its shards (loading the resumed ones included); slowest_seconds: the
            slowest rank's; reduce_seconds: this rank's time in the barrier and the all-reduce (waiting included).
        batch_size: the documents of a shard (``--batch-size``, or the automatic one the manifest records).
    """

    heads: object
    rank: int
    world_size: int
    shards: list[int]
    computed: list[int]
    resumed: list[int]
    documents: int
    truncated: int
    payload_bytes: int
    compute_seconds: float = 0.0
    slowest_seconds: float = 0.0
    reduce_seconds: float = 0.0
    batch_size: int = 0


def widen_state(state: dict, max_length: int) -> dict:
    """``state`` with its argmax-offset histograms (keys ending in ``hist``, ``(N, 2m − 1)``: offsets −(m − 1) …
    m − 1) zero-padded to ``max_length`` (``(N, 2·max_length − 1)``), the offsets kept in place."""
    import torch

    out = dict(state)
    for key, h in state.items():
        if key.endswith("hist"):
            pad = max_length - (h.shape[-1] + 1) // 2
            if pad < 0:
                raise ValueError(f"state: '{key}' is wider ({h.shape[-1]}) than max_length={max_length} allows")
            out[key] = torch.nn.functional.pad(h, (pad, pad)) if pad else h
    return out


def corpus_heads(
    hm: HeadModel,
    options: HeadsOptions,
    plan,
    *,
    warn: Callable[[str], None],
    progress: Callable[[int, int], None] | None = None,
    timeout_s: float | None = None,
) -> CorpusRun:
    """A decoder's statistics over ``options.corpus`` on every rank of a torchrun launch (see the module's text).

    Call it on every rank, with the same model, options and corpus. The default gloo group is initialised from
    torchrun's environment when none is (and destroyed at the end); an initialised group is used as it is.

    Args:
        hm: the decoder (:class:`~headwise.models.HeadModel`); options: with ``corpus`` set (``out``: where the shards
            are kept, ``OUT/shards``); plan: :func:`~headwise.study.plan_decoder`'s.
        warn: one line per warning (rank 0 only: documents cut to the context, over all ranks).
        progress: ``(shards done, shards of this rank)`` after every shard.
        timeout_s: the collectives' timeout (see the module's text).
    Returns:
        the :class:`CorpusRun` (its ``heads`` on rank 0).
    Raises:
        ValueError: on every rank, naming what is wrong (see the module's text). CollectiveTimeout: a stalled rank.
    """
    import torch

    from headwise.analysis import CorpusFile, DecoderStats
    from headwise.analysis.streaming import read_rows
    from headwise.models import TruncationWarning
    from headwise.study.decoder import DecoderHeads, example_view, probe_detectors
    from headwise.study.inputs import text_batches

    if options.corpus is None:
        raise ValueError("--corpus: expected a corpus file (a distributed run splits its documents)")
    if hm.kind != "decoder":
        raise ValueError(f"--model: a distributed corpus run reads a decoder's heads, got a {hm.kind}")
    with ranks(timeout_s) as r:
        rank, world, timeout_s = r.rank, r.world_size, r.timeout_s
        corpus = options.corpus_path
        docs = list(CorpusFile(corpus))
        tokens = [min(len(e.ids), hm.max_length) for e in hm.tokenizer.encode_batch(docs)] if docs else []
        extra = {"block_size": options.block_size, "max_length": hm.max_length}
        store, shards = open_corpus_store(hm.model, options, docs, tokens, "decoder-heads", extra)
        mine = r.share([s.tokens for s in shards])
        longest = max(tokens) if tokens else 1  # the histogram's width all-reduced: ±(longest − 1)
        expected = set(DecoderStats(hm.num_layers, hm.num_heads, max_length=1).state()) | {"truncated"}

        def compute(s: Shard) -> dict:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TruncationWarning)  # counted, reported once by rank 0
                enc = hm.encode(docs[s.start : s.stop])  # the batch a one-process run reads
            # the offset histogram as wide as the shard's longest document (widened when the shards are added)
            stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=enc.ids.shape[1])
            read_rows(
                hm, enc.ids, enc.mask, head_stats=stats.heads, detector_stats=stats.detectors,
                block_size=options.block_size,
            )  # fmt: skip
            state = stats.state()
            state["truncated"] = torch.tensor(float(sum(enc.truncated)), dtype=torch.float64)
            return state

        sums = shard_sums(store, shards, mine, compute, expected, lambda st: widen_state(st, longest), progress)
        vector, layout = sums.vector, sums.layout
        reduce_sums(sums, timeout_s)
        store.clean()
        summed = unpack_state(vector, layout)
        truncated = int(round(float(summed.pop("truncated"))))
        heads = None
        if rank == 0:
            stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
            stats.add_state(widen_state(summed, hm.max_length))
            if truncated:
                warn(f"TEXT / --corpus: {truncated} text(s) longer than {hm.max_length} tokens were cut to it")
            report = stats.result(probe_detectors(hm, plan.probe, block_size=options.block_size), plan.probe)
            shown = options.text if options.text is not None else docs[0]
            [(ids, mask)] = list(text_batches(hm, [shown], 1, lambda m: None))
            example = example_view(hm, ids, mask, queries=plan.queries, block_size=options.block_size)
            heads = DecoderHeads(report, example)
        return CorpusRun(
            heads, rank, world, mine, sums.computed, sums.resumed, len(docs), truncated,
            vector.numel() * vector.element_size(), sums.compute_seconds, sums.slowest_seconds, sums.reduce_seconds,
            store.manifest["batch_size"],
        )  # fmt: skip
