"""A decoder's heads studied: every head's statistics and detectors over texts and the probe, and the example drawn.

The statistics are reduced inside attention a block of query rows at a time
(:func:`headwise.analysis.streaming.read_rows`), so any length up to the model's context is read in bounded memory.
Shape legend: NL layers, H heads, n the example's tokens, P bins of a pooled overview.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from headwise.study.inputs import (
    check_length,
    first_lines,
    make_probe,
    parse_queries,
    probe_batches,
    probe_ids,
    text_batches,
)
from headwise.study.options import HeadsOptions

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "PROBE_CHUNK",
    "VIEW_BINS",
    "VIEW_FULL_UP_TO",
    "DecoderHeads",
    "DecoderPlan",
    "ExampleView",
    "composition_columns",
    "decoder_heads",
    "decoder_report",
    "decoder_texts",
    "example_view",
    "plan_decoder",
    "probe_detectors",
    "query_rows",
    "view_bytes",
]

#: Longest example drawn at full resolution (heads.png / headview.html); a longer one is drawn pooled.
VIEW_FULL_UP_TO = 256
#: Bins per side of the pooled overview of a long example (tokens per bin: n / 128).
VIEW_BINS = 128
#: Probe sequences per forward pass (the default probe's 8 in one: 15 % faster than two of 4 on SmolLM2).
PROBE_CHUNK = 8
#: Probe sequences per batch of the statistics when the probe is the only input.
PROBE_BATCH = 4


@dataclass(frozen=True)
class ExampleView:
    """The example (the first sequence read) as drawn: its maps at full resolution, or pooled, and the queries kept.

    Attributes:
        ids: the example's token ids (its n real tokens).
        maps: ``(NL, H, n, n)`` float32 weights for n ≤ :data:`VIEW_FULL_UP_TO`, else None.
        pooled: ``(NL, H, P, P)`` for a longer example (cell (p, q): the mean over query bin p of the weight summed
            over key bin q), else None; ``bounds`` ``(P + 1,)`` the bins' token edges.
        kept: ``(NL, H, B − A, B − A)`` the queries A … B − 1 over keys A … B − 1 at full resolution, or None;
            ``queries`` ``(A, B)`` with it.
    """

    ids: list[int]
    maps: np.ndarray | None = None
    pooled: np.ndarray | None = None
    bounds: np.ndarray | None = None
    kept: np.ndarray | None = None
    queries: tuple[int, int] | None = None

    @property
    def n(self) -> int:
        """The example's tokens."""
        return len(self.ids)


@dataclass(frozen=True)
class DecoderPlan:
    """A decoder study's options checked against the model (:func:`plan_decoder`).

    Attributes:
        probe: the :class:`~headwise.analysis.Probe`, its segment shortened to fit the model.
        tokens: the example's tokens: TEXT's, the corpus's first line's (cut to the context), or a probe sequence's.
        queries: ``(A, B)`` parsed from ``--queries`` within those tokens, or None.
    """

    probe: object
    tokens: int
    queries: tuple[int, int] | None


def view_bytes(num_layers: int, num_heads: int, tokens: int, queries: tuple[int, int] | None = None) -> int:
    """Bytes the example's view holds from its pass to the pictures, for an example of ``tokens`` tokens: its
    ``(NL, H, n, n)`` float32 maps up to :data:`VIEW_FULL_UP_TO` tokens, else the pooled overview's
    ``(NL, H, VIEW_BINS, VIEW_BINS)`` sums and maps; the ``(NL, H, B − A, B − A)`` queries kept (``queries``)."""
    cells = tokens * tokens if tokens <= VIEW_FULL_UP_TO else 2 * VIEW_BINS * VIEW_BINS
    kept = 0 if queries is None else (queries[1] - queries[0]) ** 2
    return 4 * num_layers * num_heads * (cells + kept)


@dataclass(frozen=True)
class DecoderHeads:
    """What :func:`decoder_heads` found: the :class:`~headwise.analysis.DecoderReport` and the :class:`ExampleView`."""

    report: object
    example: ExampleView


def plan_decoder(hm: HeadModel, options: HeadsOptions) -> DecoderPlan:
    """Check ``options`` against the decoder ``hm`` before anything is computed or written.

    Raises:
        ValueError: naming the option: a ``--layer`` the model lacks; TEXT or ``--corpus`` for a model without a
            tokenizer; ``--importance`` without ``--corpus`` for one with; a probe that does not fit; a TEXT longer
            than the context; ``--queries`` outside the example.
    """
    options.check_layer(hm.num_layers)
    corpus = options.corpus_path
    if hm.tokenizer is None and options.text is not None:
        raise ValueError(f"TEXT: the checkpoint {hm.name} has no tokenizer.json; run without TEXT to analyse its probe")
    if hm.tokenizer is None and corpus is not None:
        raise ValueError(f"--corpus: the checkpoint {hm.name} has no tokenizer.json to read text with")
    if options.importance and corpus is None and hm.tokenizer is not None:
        raise ValueError("--importance: expected --corpus FILE (the sentences the objective is measured on)")
    probe = make_probe(hm, length=options.probe_length, repeats=options.probe_repeats, seed=options.seed)
    if options.text is not None:
        n = check_length(hm, options.text)
    elif corpus is not None:
        head = first_lines(corpus, 1)
        n = min(len(hm.tokenizer.encode(head[0]).ids), hm.max_length) if head else 0
    else:
        n = probe.total_length
    return DecoderPlan(probe, n, parse_queries(options.queries, n))


def decoder_texts(options: HeadsOptions) -> tuple[Iterator[str] | None, int]:
    """The texts a decoder's statistics read and how many: the corpus's lines, TEXT alone, or ``(None, 0)`` (the
    probe alone).

    Raises:
        ValueError: a corpus without a non-empty UTF-8 line (naming ``--corpus``).
    """
    corpus = options.corpus_path
    if corpus is not None:
        from headwise.analysis import CorpusFile

        reader = CorpusFile(corpus)
        total = reader.count()
        if total == 0:
            raise ValueError(f"--corpus: no non-empty UTF-8 line in '{corpus}'")
        return iter(reader), total
    if options.text is not None:
        return iter([options.text]), 1
    return None, 0


def decoder_heads(
    hm: HeadModel,
    options: HeadsOptions,
    plan: DecoderPlan,
    texts: Iterable[str] | None,
    *,
    warn: Callable[[str], None],
    progress: Callable[[int, int], None] | None = None,
    row_progress: Callable[[int, int, int], None] | None = None,
    observe: Callable | None = None,
) -> DecoderHeads:
    """Every head's statistics over ``texts`` (:func:`decoder_texts`; None: the probe's sequences) and the probe,
    and the example drawn: TEXT when a corpus is read beside it, else the first sequence read.

    Args:
        warn: called with one line per warning (texts cut to the model's context), naming the option.
        progress: ``(texts done, tokens done)`` after every batch of texts.
        row_progress: ``(layer, rows done, L)`` after every block of query rows of a long example.
        observe: ``observe(ids, mask, first_text)``, a context manager around each batch's pass yielding the block
            readers it adds (:class:`~headwise.study.atlas.AtlasPass`); None: the statistics alone.
    """
    if texts is None:
        batches = probe_batches(hm, plan.probe, PROBE_BATCH)
        report, example = decoder_report(hm, batches, plan.probe, block_size=options.block_size, queries=plan.queries)
        return DecoderHeads(report, example)
    batches = text_batches(hm, texts, options.batch_size, lambda m: warn(f"TEXT / --corpus: {m}"))
    report, example = decoder_report(
        hm,
        batches,
        plan.probe,
        progress=progress,
        block_size=options.block_size,
        queries=plan.queries,
        row_progress=row_progress,
        observe=observe,
    )
    if options.text is not None and options.corpus is not None:  # the example drawn is TEXT
        [(ids, mask)] = list(text_batches(hm, [options.text], 1, lambda m: warn(f"TEXT: {m}")))
        example = example_view(hm, ids, mask, queries=plan.queries, block_size=options.block_size)
    return DecoderHeads(report, example)


def decoder_report(
    hm: HeadModel,
    batches: Iterable[tuple],
    probe,
    *,
    progress=None,
    block_size=None,
    queries=None,
    row_progress=None,
    observe=None,
):
    """Stream ``(ids (b, T), mask (b, T))`` batches and the probe into a :class:`~headwise.analysis.DecoderReport`,
    every head's statistics reduced inside attention a block of query rows at a time
    (:func:`headwise.analysis.streaming.read_rows`).

    Args:
        queries: ``(A, B)``: the first sequence's queries kept at full resolution (None: none).
        progress: ``(texts done, tokens done)`` after every batch.
        row_progress: ``(layer, rows done, L)`` after every block (long inputs).
        observe: as :func:`decoder_heads`'s.
    Returns:
        ``(report, example)``: the report and the first sequence's :class:`ExampleView`.
    """
    from headwise.analysis import DecoderStats
    from headwise.analysis.streaming import read_rows

    stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
    example = None
    texts = 0
    for ids, mask in batches:
        first = example is None
        n = int(mask[0].sum())
        pool = VIEW_BINS if first and n > VIEW_FULL_UP_TO else None
        keep = queries if first else None
        with observe(ids, mask, texts) if observe is not None else contextlib.nullcontext([]) as extra:
            reader = read_rows(
                hm, ids, mask, head_stats=stats.heads, detector_stats=stats.detectors, block_size=block_size,
                progress=row_progress, pool=pool, keep=keep, extra=extra,
            )  # fmt: skip
        if first:
            example = _view(hm, ids, mask, n, reader)
        texts += ids.shape[0]
        if progress is not None:
            progress(texts, stats.num_tokens)
    return stats.result(probe_detectors(hm, probe, block_size=block_size), probe), example


def probe_detectors(hm: HeadModel, probe, *, block_size=None) -> dict:
    """The detectors' scores on the probe's sequences, :data:`PROBE_CHUNK` per forward pass: name → ``(NL, H)``
    (:meth:`headwise.analysis.DetectorStats.result`)."""
    from headwise.analysis import DetectorStats
    from headwise.analysis.streaming import read_rows

    detectors = DetectorStats(hm.num_layers, hm.num_heads)
    ids = probe_ids(hm, probe)
    for start in range(0, ids.shape[0], PROBE_CHUNK):
        chunk = ids[start : start + PROBE_CHUNK]
        read_rows(hm, chunk, None, detector_stats=detectors, block_size=block_size)
    return detectors.result()


def _view(hm: HeadModel, ids, mask, n: int, reader=None) -> ExampleView:
    """The first sequence's view: what ``reader`` (a streaming pass) pooled and kept; the full maps, from one more
    forward pass of that sequence, when it pooled nothing (or there was no pass)."""
    pooled = None if reader is None else reader.pooled
    view: dict = {"ids": ids[0, :n].tolist()}
    if pooled is None:
        maps = hm.attentions(ids[:1, :n], mask[:1, :n])  # bounded: n ≤ VIEW_FULL_UP_TO
        out = np.empty((len(maps), *maps[0].shape[1:]), np.float32)  # (NL, H, n, n)
        for i in range(len(maps)):  # each layer's map dropped once copied: the maps are held once, not twice
            out[i], maps[i] = maps[i][0], None
        view["maps"] = out
    else:
        view["pooled"], view["bounds"] = reader.pooled_maps()
    if reader is not None and reader.kept is not None:
        view["kept"], view["queries"] = reader.kept.numpy(), reader.keep
    return ExampleView(**view)


def example_view(hm: HeadModel, ids, mask, *, queries=None, block_size=None, row_progress=None) -> ExampleView:
    """The first sequence's :class:`ExampleView` alone (no statistics): its maps when it is short and no queries are
    kept, else one streaming pass that pools and keeps them."""
    from headwise.analysis.streaming import read_rows

    n = int(mask[0].sum())
    pool = VIEW_BINS if n > VIEW_FULL_UP_TO else None
    if pool is None and queries is None:
        return _view(hm, ids, mask, n)
    reader = read_rows(
        hm, ids[:1], mask[:1], block_size=block_size, progress=row_progress, pool=pool, keep=queries
    )  # fmt: skip
    return _view(hm, ids, mask, n, reader)


def query_rows(
    hm: HeadModel, options: HeadsOptions, plan: DecoderPlan, *, warn: Callable[[str], None], row_progress=None
):
    """The example's queries A … B − 1 over keys A … B − 1 (``plan.queries``) from one forward pass that forms those
    rows of every head and nothing else: an :class:`ExampleView` with ``kept`` and ``queries`` alone (no maps, no
    statistics). The example is TEXT, else the corpus's first line, else the probe's first sequence.

    Args:
        warn: called with one line when the text was cut to the model's context, naming the option.
        row_progress: ``(layer, rows done, B − A)`` after every block of rows.
    """
    from headwise.analysis.streaming import read_rows

    if plan.queries is None:
        raise ValueError("--queries-only: expected --queries A:B (the queries to draw)")
    if options.text is not None or options.corpus is not None:
        text = options.text if options.text is not None else first_lines(options.corpus_path, 1)[0]
        [(ids, mask)] = list(text_batches(hm, [text], 1, lambda m: warn(f"TEXT / --corpus: {m}")))
    else:
        [(ids, mask)] = probe_batches(hm, plan.probe, 1)[:1]
    reader = read_rows(
        hm, ids, mask, keep=plan.queries, rows_only=True, block_size=options.block_size, progress=row_progress
    )  # fmt: skip
    n = int(mask[0].sum())
    return ExampleView(ids=ids[0, :n].tolist(), kept=reader.kept.numpy(), queries=reader.keep)


def composition_columns(hm: HeadModel, *, progress=None) -> tuple[dict[str, np.ndarray], dict]:
    """The weights' circuits of every head (:mod:`headwise.circuits.composition`, Elhage et al. 2021) for
    ``heads.json`` / ``heads.csv``: ``(columns, summary)``. A model opened layer by layer reads a group of layers'
    attention parts at a time (:func:`headwise.circuits.composition_layers.weights_circuits`; ``progress(done,
    total)`` as each layer is read).

    Returns:
        columns: per-head ``(NL, H)`` values — ``copying`` (``Σ Re λ / Σ |λ|`` of the OV circuit through the
            embedding and unembedding), ``copying_positive`` (the fraction of its nonzero eigenvalues with a
            positive real part), ``q_composition_max`` / ``k_composition_max`` / ``v_composition_max`` (the
            strongest sender into this head; NaN in layer 0).
        summary: the conventions, the 20 strongest pairs of each kind, and the full ``(NL, H, NL, H)`` Q/K/V and
            ``(NL, H, NL, Hkv)`` per-group K/V scores (None where no score: same or later sender).
    """
    from headwise.circuits.composition_layers import weights_circuits

    scores, copying = weights_circuits(hm, progress=progress)  # W_U W_E alone: the (V, D) matrices are not copied

    def receiver_max(s):
        m = s.numpy().reshape(-1, *s.shape[2:])  # (NL·H, NL, H)
        finite = np.isfinite(m).any(0)
        out = np.full(m.shape[1:], np.nan)
        out[finite] = np.nanmax(np.where(np.isfinite(m), m, -np.inf), 0)[finite]
        return out

    def nested(s):
        return np.round(s.numpy().astype(np.float64), 5).tolist()

    def clean(x):
        if isinstance(x, list):
            return [clean(v) for v in x]
        return None if x != x else x

    columns = {
        "copying": copying.copying.numpy(),
        "copying_positive": copying.positive.numpy(),
        **{f"{k}_composition_max": receiver_max(getattr(scores, k)) for k in "qkv"},
    }
    summary = {
        "convention": (
            "Elhage et al. 2021: Q/K/V composition ||W_OV^s W||_F / (||W_OV^s||_F ||W||_F) with W = W_QK^r, "
            "W_QK^r^T, W_OV^r of the receiver; indices [sender layer, sender head, receiver layer, receiver head]; "
            "norms' gains folded, their scales set to 1; RoPE at offset 0 (the content part); GQA: per query head, "
            "and per key/value group into W_K^g / W_V^g alone (k_group, v_group); copying = sum Re(lambda) / "
            "sum |lambda| of W_E W_V W_O W_U's nonzero eigenvalues"
        ),
        "top": {
            k: [dict(zip(("sender_layer", "sender_head", "layer", "head", "score"), t)) for t in scores.top(k, 20)]
            for k in "qkv"
        },
        **{k: clean(nested(getattr(scores, k))) for k in ("q", "k", "v", "k_group", "v_group")},
    }
    return columns, summary
