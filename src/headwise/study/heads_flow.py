"""The flow of ``headwise heads``: an encoder's or a decoder's heads studied on TEXT, a corpus or a probe, on one
process or across the ranks of a ``torchrun`` launch, then ``--importance`` and ``--composition`` — everything the
command prints and draws, without printing or drawing it.

The command line hands in its progress bars (:class:`Bars`: context managers that yield the callbacks) and a
``warn`` callback; it prints :class:`HeadsFound` (:func:`head_row`, :func:`roles_line`) and draws the pictures.

Shape legend: NL layers, H heads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from headwise.study.options import HeadsOptions

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "COLUMNS",
    "DECODER_COLUMNS",
    "Bars",
    "HeadsFound",
    "check_opened",
    "composition_line",
    "decoder_study",
    "encoder_model",
    "encoder_study",
    "head_row",
    "composition_result",
    "heads_composition",
    "heads_importance",
    "positional_line",
    "probe_line",
    "roles_line",
]

#: Columns of the printed table: (metric, header, format).
COLUMNS = (
    ("cls", "[CLS]", "{:.2f}"),
    ("sep", "[SEP]", "{:.2f}"),
    ("punct", ". ,", "{:.2f}"),
    ("self", "self", "{:.2f}"),
    ("prev", "prev", "{:.2f}"),
    ("next", "next", "{:.2f}"),
    ("entropy", "H nats", "{:.2f}"),
    ("entropy_cls", "H[CLS]", "{:.2f}"),
    ("entropy_ratio", "H/ln n", "{:.2f}"),
    ("distance", "dist", "{:.1f}"),
    ("confidence", "conf", "{:.2f}"),
)
#: Decoder table columns: (metric, header, format).
DECODER_COLUMNS = (
    ("prev", "prev", "{:.2f}"),
    ("first", "first", "{:.2f}"),
    ("duplicate_probe", "dup·p", "{:.2f}"),
    ("induction_probe", "ind·p", "{:.2f}"),
    ("induction", "ind", "{:.2f}"),
    ("self", "self", "{:.2f}"),
    ("entropy", "H nats", "{:.2f}"),
    ("entropy_ratio_causal", "H/ln m", "{:.2f}"),
    ("distance", "dist", "{:.1f}"),
    ("confidence", "conf", "{:.2f}"),
)


def head_row(report, layer: int, head: int, columns=COLUMNS) -> tuple[str, list[str]]:
    """One row of the layer × head table: ``(role, [each column's cell, then the positional cell])`` ("–": NaN)."""
    cells = []
    for metric, _, fmt in columns:
        v = float(report.metrics[metric][layer, head])
        cells.append("–" if v != v else fmt.format(v))
    share = float(report.metrics["positional_share"][layer, head])
    offset = int(report.metrics["positional_offset"][layer, head])
    pos = f"{offset:+d}" if report.positional[layer, head] else ("–" if share != share else f"({share:.0%})")
    return str(report.roles[layer, head]), [*cells, pos]


def roles_line(report) -> str:
    """``roles: broad 12, previous-token 3, …``, the most frequent first."""
    counts: dict[str, int] = {}
    for r in report.roles.ravel():
        counts[str(r)] = counts.get(str(r), 0) + 1
    return "roles: " + ", ".join(f"{r} {k}" for r, k in sorted(counts.items(), key=lambda x: -x[1]))


def _none_bar(*_):
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Bars:
    """How a heads study shows its progress: each a factory of a context manager that yields the callback (or None).

    Attributes:
        corpus: ``corpus(total)`` → ``progress(texts, tokens)``.
        rows: ``rows(hm, n)`` → ``rows(layer, done, length)`` for an example of ``n`` tokens (None: no bar).
        stages: ``stages()`` → ``progress(stage, done, total)``.
    """

    corpus: Callable = _none_bar
    rows: Callable = _none_bar
    stages: Callable = _none_bar


@dataclass
class HeadsFound:
    """What a heads study found, ready to print and draw.

    Attributes:
        title: the model's title; scope: what the statistics cover ("this text", "N sentences of FILE", …).
        report: the :class:`~headwise.analysis.HeadReport` (statistics over ``scope``).
        sentence: the example drawn, a :class:`~headwise.analysis.SentenceHeads`.
        extra: what heads.json adds (the model, the corpus, the sentence, …); ``--importance`` and
            ``--composition`` add to it.
        view: a decoder's :class:`~headwise.study.ExampleView` (None for an encoder); tokens: its tokens.
        ranked: under torchrun, ``--importance`` measured across the ranks (else None).
        lines: under torchrun, what the ranks did (one line each, for the terminal).
    """

    title: str
    scope: str
    report: object
    sentence: object
    extra: dict
    view: object = None
    tokens: list = field(default_factory=list)
    ranked: object = None
    lines: list = field(default_factory=list)


def _importance_bar(bar, suffix: str = ""):
    """``progress(stage, done, total)`` of the importance run drawn on ``bar`` (a stage progress)."""
    units = {
        "importance": "importance (batches)",
        "ablation": "ablation (passes)",
        "pruning": "pruning (passes)",
        "estimate": "estimate, every head (forward + backward passes)",
        "exact": "exact: the top heads and the curve (passes)",
    }
    return lambda stage, done, total: bar(units.get(stage, stage) + suffix, done, total)


def _ranked(hm: HeadModel, opts: HeadsOptions, corpus, probe, bars: Bars):
    """:func:`headwise.study.heads_across_ranks` under rank 0's bar. Returns the
    :class:`~headwise.study.RankedHeads` (``heads`` None on ranks other than 0)."""
    from headwise.distributed.ranks import first_rank
    from headwise.study.heads_run import heads_across_ranks

    with bars.stages() if first_rank() else contextlib.nullcontext() as stage:
        shards = None if stage is None else (lambda done, total: stage("shards of rank 0", done, total))
        bar = None if stage is None else _importance_bar(stage, ", rank 0")
        return heads_across_ranks(hm, opts, corpus, probe, progress=shards, importance_progress=bar)


def check_opened(hm: HeadModel, opts: HeadsOptions) -> None:
    """The checks of ``opts`` against the model ``--model`` opened (``hm`` None: the untrained block or the bundled
    encoder, not yet opened), before anything is written.

    Raises:
        ValueError: ``--composition`` or ``--queries-only`` without a decoder; ``--corpus`` of the untrained block
            under torchrun; opened layer by layer, ``--importance``, or ``--composition`` whose attention parts do
            not fit the budget (one line naming the memory).
    """
    from headwise.distributed.ranks import launched

    if hm is not None and hm.stream is not None:  # opened layer by layer: a backward pass refuses; --composition
        if opts.importance:  # keeps the attention parts in, within the budget
            hm.check_whole("--importance (a backward pass through every layer)")
        if opts.composition:
            from headwise.circuits.composition import weights_bytes
            from headwise.models.pinned import check_attention

            check_attention(hm, "--composition", extra=weights_bytes(hm))
    if opts.composition and (hm is None or hm.kind != "decoder"):
        raise ValueError("--composition: expected --model naming a decoder (the weights' circuits read its logits)")
    if opts.queries_only and (hm is None or hm.kind != "decoder"):
        raise ValueError("--queries-only: expected --model naming a decoder (the query view is a decoder's)")
    if hm is not None and opts.importance:
        from headwise.study.importance import check_top_k

        check_top_k(hm, opts)
    if opts.corpus is not None and launched() and opts.model == "untrained":
        raise ValueError("--corpus: under torchrun the documents are split across ranks for decoders only and for "
                         "checkpoint encoders (the bundled MiniLM, an encoder folder); --model untrained runs in one "
                         "process")  # fmt: skip


def positional_line(report) -> str:
    """What the encoder table's ``pos`` column and ``ln n`` say, one line."""
    return (
        "pos: Voita's positional test (argmax at one offset for ≥ 90% of tokens: the offset, else the share); "
        f"ln n = {float(report.metrics['uniform_entropy'][0, 0]):.2f} nats on average"
    )


def encoder_model(hm: HeadModel, opts: HeadsOptions, *, warn: Callable[[str], None]):
    """The encoder a heads study reads, checked against the options before anything is written: ``(hm, attend)`` —
    ``hm`` None is the untrained block; ``--model`` not given, the bundled encoder, opened here.

    Raises:
        ValueError: one line naming the option (:func:`~headwise.study.check_encoder`, ``--layer``).
    """
    from headwise.study.encoder import check_encoder, encoder_attend
    from headwise.study.heads_run import open_heads_model

    check_encoder(opts)
    if opts.model is None:
        hm = open_heads_model(None, warn=warn)
    enc = encoder_attend(opts.model, hm)
    opts.check_layer(enc.num_layers)
    return hm, enc


def encoder_study(
    hm: HeadModel, enc, opts: HeadsOptions, *, warn: Callable[[str], None], bars: Bars = Bars()
) -> HeadsFound | None:
    """An encoder's heads (from :func:`encoder_model`) over TEXT or the corpus, and the example sentence. Under
    torchrun with a corpus the documents are split across the ranks (:func:`~headwise.study.encoder_corpus`); ranks
    other than 0 get None.

    Raises:
        ValueError: one line naming the option; CollectiveTimeout: a stalled rank.
    """
    from headwise.distributed.ranks import first_rank, launched
    from headwise.study.encoder import encoder_report, encoder_texts, sentence_heads
    from headwise.study.encoder_ranks import encoder_corpus

    text, corpus_path = opts.text, opts.corpus_path
    extra = {"model": enc.title}
    report, ranked, lines = None, None, []
    if corpus_path is not None and launched():  # torchrun: the documents (and --importance's lines) split
        reader, _ = encoder_texts(opts, warn=warn if first_rank() else (lambda m: None))

        def corpus(progress):
            return encoder_corpus(enc, hm.model, hm.tokenizer, opts, warn=warn, progress=progress)

        run = _ranked(hm, opts, corpus, None, bars)
        if run.heads is None:  # not rank 0: rank 0 prints and writes
            return None
        report, ranked, lines = run.heads, run.importance, run.lines
    elif corpus_path is not None:
        reader, total = encoder_texts(opts, warn=warn)
        with bars.corpus(total) as progress:
            report = encoder_report(reader, enc, opts.batch_size, warn=warn, progress=progress)
    if corpus_path is not None:
        extra["corpus"] = {
            "path": str(corpus_path),
            "sentences": report.num_sentences,
            "skipped_undecodable": reader.num_undecodable,
            "skipped_blank": reader.num_blank,
        }
        if text is None:
            text = next(iter(reader))
    sentence, pieces, ids = sentence_heads(hm, text, enc, warn=warn)
    report = report or sentence.report
    extra["sentence"] = {"text": text, "tokens": sentence.tokens, "pieces": pieces, "ids": ids}
    scope = f"{report.num_sentences} sentences of {corpus_path.name}" if corpus_path is not None else "this sentence"
    return HeadsFound(enc.title, scope, report, sentence, extra, ranked=ranked, lines=lines)


def decoder_study(
    hm: HeadModel, opts: HeadsOptions, plan, *, warn: Callable[[str], None], bars: Bars = Bars()
) -> HeadsFound | None:
    """A decoder's heads over TEXT, the corpus or the probe (:func:`~headwise.study.decoder_heads`; ``plan`` from
    :func:`~headwise.study.plan_decoder`), and the example drawn. Under torchrun with a corpus the documents are split
    across the ranks (:func:`~headwise.study.corpus_heads`, resumable from ``--out``'s shards); ranks other than 0 get
    None.

    Raises:
        ValueError: one line naming the option; CollectiveTimeout: a stalled rank.
    """
    from headwise.analysis import SentenceHeads
    from headwise.distributed.ranks import launched
    from headwise.study.corpus_ranks import corpus_heads
    from headwise.study.decoder import decoder_heads, decoder_texts
    from headwise.study.heads_run import drawn

    probe, text, corpus_path = plan.probe, opts.text, opts.corpus_path
    extra: dict = {"model": hm.title, "backend": hm.backend, "probe_excluded_ids": list(hm.special_ids)}
    if hm.stream is not None:  # layer by layer: the route and its budget (the whole route is the usual one)
        extra["memory"] = {**hm.memory.to_dict(), "note": hm.memory.line()}
    texts, total = decoder_texts(opts)
    if corpus_path is not None:
        scope = f"{total} sentences of {corpus_path.name}"
    elif text is not None:
        scope = "this text"
    else:
        scope = f"its probe ({probe.batch} × {probe.total_length} random tokens)"
    ranked, lines = None, []  # under torchrun: the importance measured across the ranks
    if texts is None:  # the probe alone: no bars
        found = decoder_heads(hm, opts, plan, None, warn=warn)
    elif corpus_path is not None and launched():  # torchrun: the documents (and --importance's lines) split
        run = _ranked(hm, opts, lambda progress: corpus_heads(hm, opts, plan, warn=warn, progress=progress), probe,
                      bars)  # fmt: skip
        if run.heads is None:  # not rank 0: rank 0 prints and writes
            return None
        found, ranked, lines = run.heads, run.importance, run.lines
    else:
        with bars.rows(hm, plan.tokens) as rows, bars.corpus(total) as progress:
            found = decoder_heads(hm, opts, plan, texts, warn=warn, progress=progress, row_progress=rows)
    report, view = found.report, found.example
    if corpus_path is not None:
        extra["corpus"] = {"path": str(corpus_path), "sentences": report.num_sentences}
    tokens = hm.token_texts(view.ids)
    extra["sentence"] = {"text": text, "tokens": tokens, "pieces": hm.token_strings(view.ids), "ids": view.ids}
    sentence = SentenceHeads(report, *drawn(view, tokens))
    if hm.stream is not None:  # opened layer by layer: said above the table
        lines = [hm.memory.line(), *lines]
    return HeadsFound(hm.title, scope, report, sentence, extra, view=view, tokens=tokens, ranked=ranked, lines=lines)


def probe_line(probe) -> str:
    """What the decoder table's probe columns measured, one line."""
    return (
        f"probe: {probe.batch} sequences of {probe.length} random tokens × {probe.repeats} copies"
        f"{' after BOS' if probe.bos is not None else ''}, seed {probe.seed} (·p columns); first: attention "
        "to the first token; H/ln m: entropy over ln of the keys a query may see"
    )


def heads_importance(hm: HeadModel, opts: HeadsOptions, found: HeadsFound, probe=None, *, warn, bars: Bars = Bars()):
    """``--importance`` on the corpus's lines (a decoder without a tokenizer: its ``probe``) under the stage bar:
    :func:`~headwise.study.estimate_importance` (every head estimated, the top ``--top-k`` and a few at random
    measured, the pruning curve at a small grid; a decoder the circuits' wiring does not read: said to ``warn``, and
    the exact route), with ``--exact`` :func:`~headwise.study.run_importance` — or the result measured across the
    ranks (``found.ranked``). Adds its summary to ``found.extra``. Returns ``(result, columns for heads.json /
    heads.csv)``.

    Raises:
        ValueError: the untrained block (no objective to measure), an empty corpus, ``--top-k`` above the heads.
    """
    from headwise.study.importance import (
        check_top_k,
        estimated,
        importance_batches,
        importance_columns,
        importance_summary,
        importance_texts,
        run_importance,
    )
    from headwise.study.importance_estimate import estimate_importance

    if hm is None:
        raise ValueError("--importance: the untrained block has no objective to measure; pass --model")
    lines = importance_texts(opts)
    batches = importance_batches(hm, lines, probe, opts.batch_size, lambda m: warn(f"--importance: {m}"))
    result = found.ranked
    if result is None:
        check_top_k(hm, opts)
        with bars.stages() as bar:
            progress = None if bar is None else _importance_bar(bar)
            if estimated(hm, opts, warn):
                result = estimate_importance(
                    hm, batches, seed=opts.seed, mode=opts.ablation, top_k=opts.top_k, progress=progress
                )
            else:
                result = run_importance(hm, batches, seed=opts.seed, mode=opts.ablation, progress=progress)
    found.extra["importance"] = importance_summary(result)
    return result, importance_columns(result)


def heads_composition(hm: HeadModel, found: HeadsFound, *, warn, bars: Bars = Bars()):
    """``--composition``: the weights' circuits' per-head columns (:func:`~headwise.study.composition_columns`), their
    summary added to ``found.extra``; None (said to ``warn``) for a structure the weights' reader does not know — the
    rest of the study stands."""
    got = composition_result(hm, warn=warn, bars=bars)
    if got is None:
        return None
    found.extra["composition"] = got[1]
    return got[0]


def composition_result(hm: HeadModel, *, warn, bars: Bars = Bars()) -> tuple[dict, dict] | None:
    """:func:`~headwise.study.composition_columns` ``(columns, summary)`` with progress, or None (said to ``warn``) for
    a structure the weights' reader does not know or a budget it does not fit. The command runs it before the
    statistics on a model opened layer by layer (what the process holds then is what the budget check weighs; the
    weights' copies are gone before the statistics' passes)."""
    from headwise.study.decoder import composition_columns

    try:
        with bars.stages() as progress:
            if progress is not None:
                progress("composition and copying scores", 0, 1)
            cols, summary = composition_columns(hm)
            if progress is not None:
                progress("composition and copying scores", 1, 1)
    except ValueError as e:
        warn(f"--composition skipped: {' '.join(str(e).split())}")
        return None
    return cols, summary


def composition_line(summary: dict) -> str:
    """The strongest K-compositions, one line."""
    best = summary["top"]["k"][:3]
    pairs = ", ".join(
        f"L{t['sender_layer']}H{t['sender_head']}→L{t['layer']}H{t['head']} {t['score']:.2f}" for t in best
    )
    return f"composition (weights): strongest K-composition {pairs}; copying scores in heads.json, composition.png"
