"""``headwise heads``'s flow: an encoder's or a decoder's heads studied on TEXT, a corpus or a probe, on one process or
across the ranks of a ``torchrun`` launch, then ``--importance`` and ``--composition`` — everything the command prints
and draws, without printing or drawing it.

:func:`run` takes the options (:class:`~headwise.study.HeadsOptions`, checked in one place) and returns a
:class:`HeadsResult`; progress goes to :class:`Bars` (context managers that yield the callbacks) and warnings to a
``warn`` callback. The command line prints the result (:mod:`headwise.study.heads_lines`) and draws its pictures.

Shape legend: NL layers, H heads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from headwise.commands import said
from headwise.commands._folders import prepare_folder
from headwise.study.options import HeadsOptions

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "Bars",
    "HeadsFound",
    "HeadsOptions",
    "HeadsResult",
    "check_importance_whole",
    "check_opened",
    "check_room",
    "heads_need",
    "composition_result",
    "decoder_study",
    "encoder_model",
    "encoder_study",
    "heads_importance",
    "run",
]


def _none_bar(*_):
    return contextlib.nullcontext()


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Bars:
    """How a heads study shows its progress: each a factory of a context manager that yields the callback (or None).

    Attributes:
        corpus: ``corpus(total)`` → ``progress(texts, tokens)``.
        rows: ``rows(hm, n)`` → ``rows(layer, done, length)`` for an example of ``n`` tokens (None: no bar).
        stages: ``stages()`` → ``progress(stage, done, total)``.
        layers: ``layers(hm)``: around the whole study of an opened model (a model opened layer by layer: the pass,
            the layer and the time left).
        ready: called once a decoder's statistics are about to run (the caller may start loading what draws them).
    """

    corpus: Callable = _none_bar
    rows: Callable = _none_bar
    stages: Callable = _none_bar
    layers: Callable = _none_bar
    ready: Callable[[], None] = _nothing


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


@dataclass
class HeadsResult:
    """What :func:`run` found, for the command line to print and draw.

    Attributes:
        options: the options run.
        hm: the model (None: the untrained block).
        found: the study (:class:`HeadsFound`); None for ``--queries-only``.
        decoder: a decoder's study (its table's columns, the probe, the head view's queries).
        probe: a decoder's probe (:class:`~headwise.study.DecoderPlan`'s).
        importance: ``--importance``'s result (:func:`~headwise.study.estimate_importance` or
            :func:`~headwise.study.run_importance`), else None.
        columns: the per-head columns heads.json / heads.csv add (importance's, then composition's), else None.
        composition: ``--composition``'s per-head columns (composition.png), None when not run or skipped.
        queries: ``--queries-only``: the :class:`~headwise.study.ExampleView` of the chosen rows alone.
        tokens: ``--queries-only``: the example's tokens.
    """

    options: HeadsOptions
    hm: HeadModel | None
    found: HeadsFound | None
    decoder: bool
    probe: object = None
    importance: object = None
    columns: dict | None = None
    composition: dict | None = None
    queries: object = None
    tokens: list = field(default_factory=list)


def run(options: HeadsOptions, *, warn: Callable[[str], None], bars: Bars = Bars(), hm=None) -> HeadsResult | None:
    """``headwise heads``: the model of ``--model`` opened (or ``hm``, already opened by the caller), checked against
    the options, ``--out`` created, then the encoder's or the decoder's study, ``--importance`` and ``--composition``.
    Under torchrun ranks other than 0 get None (rank 0 prints and writes).

    Raises:
        ValueError: one line naming the option, before anything is written; CollectiveTimeout: a stalled rank.
    """
    from headwise.models.memory import MemoryBudgetError
    from headwise.study.heads_model import heads_backend, open_heads_model

    opts = options
    if hm is None and opts.model not in (None, "untrained"):
        try:
            hm = open_heads_model(
                opts.model, cache=opts.cache, backend=heads_backend(opts), warn=warn, max_memory=opts.max_memory
            )
        except MemoryBudgetError as e:  # the user's budget named as given; the default's: the model does not fit
            raise ValueError(("" if e.given else "--model: ") + said(e)) from None
    check_opened(hm, opts)
    with bars.layers(hm):
        flow = _decoder if hm is not None and hm.kind == "decoder" else _encoder
        return flow(hm, opts, warn=warn, bars=bars)


def _encoder(hm: HeadModel | None, opts: HeadsOptions, *, warn, bars: Bars) -> HeadsResult | None:
    """The encoder's study (and the untrained block's, ``hm`` None), then ``--importance``."""
    hm, enc = encoder_model(hm, opts, warn=warn)
    check_importance_whole(hm, opts)
    prepare_folder(opts.out, "--out")
    found = encoder_study(hm, enc, opts, warn=warn, bars=bars)
    if found is None:  # not rank 0: rank 0 prints and writes
        return None
    result = HeadsResult(opts, hm, found, decoder=False)
    if opts.importance:
        result.importance, result.columns = heads_importance(hm, opts, found, None, warn=warn, bars=bars)
    return result


def _decoder(hm: HeadModel, opts: HeadsOptions, *, warn, bars: Bars) -> HeadsResult | None:
    """The decoder's study, ``--importance``, ``--composition`` and what the pictures show; ``--queries-only``: the
    chosen queries alone (:func:`_queries_only`)."""
    from headwise.distributed.ranks import launched
    from headwise.study.decoder import plan_decoder
    from headwise.study.heads_lines import view_note

    plan = plan_decoder(hm, opts)
    check_room(hm, plan)
    # what the study holds beside the pass until the pictures: its need beyond the process and the pass's weights
    kept = heads_need(hm, plan.tokens, plan.queries, held=0) - _pass_weights(hm)
    check_importance_whole(hm, opts, kept=kept)
    prepare_folder(opts.out, "--out")
    if opts.queries_only:
        return _queries_only(hm, opts, plan, warn=warn, bars=bars)
    early = None  # layer by layer, one process: the weights' circuits first, while the process holds least
    if opts.composition and hm.stream is not None and not launched():
        early = (composition_result(hm, warn=warn, bars=bars),)
    bars.ready()
    found = decoder_study(hm, opts, plan, warn=warn, bars=bars)
    if found is None:  # not rank 0: rank 0 prints and writes
        return None
    result = HeadsResult(opts, hm, found, decoder=True, probe=plan.probe)
    if opts.importance:
        result.importance, result.columns = heads_importance(hm, opts, found, plan.probe, warn=warn, bars=bars)
    if opts.composition:
        got = early[0] if early is not None else composition_result(hm, warn=warn, bars=bars)
        if got is not None:
            result.composition, found.extra["composition"] = got
            result.columns = {**(result.columns or {}), **got[0]}
    found.extra["view"] = view_note(found.view)
    return result


def _queries_only(hm: HeadModel, opts: HeadsOptions, plan, *, warn, bars: Bars) -> HeadsResult:
    """``--queries-only``: the example's queries A … B − 1 over keys A … B − 1, from one forward pass that forms those
    rows of every head and nothing else (no statistics)."""
    from headwise.study.decoder import query_rows

    a, b = plan.queries
    with bars.rows(hm, b - a) as rows:
        view = query_rows(hm, opts, plan, warn=warn, row_progress=rows)
    return HeadsResult(opts, hm, None, decoder=True, probe=plan.probe, queries=view, tokens=hm.token_texts(view.ids))


def _importance_bar(bar, suffix: str = ""):
    """``progress(stage, done, total)`` of the importance run drawn on ``bar`` (a stage progress)."""
    units = {
        "importance": "importance (batches)",
        "ablation": "ablation (passes)",
        "pruning": "pruning (passes)",
        "estimate": "estimate, every head (forward + backward passes)",
        "exact": "exact: the first heads and the curve (passes)",
        "search": "exact: more heads by their bounds (passes)",
    }
    return lambda stage, done, total: bar(units.get(stage, stage) + suffix, done, total)


def _ranked(hm: HeadModel, opts: HeadsOptions, corpus, probe, bars: Bars):
    """:func:`headwise.study.heads_across_ranks` under rank 0's bar. Returns the
    :class:`~headwise.study.RankedHeads` (``heads`` None on ranks other than 0)."""
    from headwise.distributed.ranks import first_rank
    from headwise.study.heads_ranks import heads_across_ranks

    with bars.stages() if first_rank() else contextlib.nullcontext() as stage:
        shards = None if stage is None else (lambda done, total: stage("shards of rank 0", done, total))
        bar = None if stage is None else _importance_bar(stage, ", rank 0")
        return heads_across_ranks(hm, opts, corpus, probe, progress=shards, importance_progress=bar)


def check_opened(hm: HeadModel | None, opts: HeadsOptions) -> None:
    """The checks of ``opts`` against the model ``--model`` opened (``hm`` None: the untrained block or the bundled
    encoder, not yet opened), before anything is written.

    Raises:
        ValueError: ``--composition`` or ``--queries-only`` without a decoder; ``--corpus`` of the untrained block
            under torchrun; opened layer by layer, ``--composition`` whose receiver layer with one sender layer's
            attention parts, or ``--importance`` whose gradient pass on the corpus's batches, do not fit the budget
            (one line naming the memory), or ``--importance`` under torchrun.
    """
    from headwise.distributed.ranks import launched

    if hm is not None and hm.stream is not None and opts.composition:
        from headwise.circuits.composition_layers import check_composition

        # opened layer by layer: a receiver layer and a group of its senders' layers at a time, within the budget
        check_composition(hm)
    if hm is not None and hm.stream is not None and opts.importance and launched():
        raise ValueError(
            f"--importance: {hm.name} was opened layer by layer, which --importance runs in one process alone; run "
            "it without torchrun, or with a --max-memory the whole model fits"
        )
    if opts.composition and (hm is None or hm.kind != "decoder"):
        raise ValueError("--composition: expected --model naming a decoder (the weights' circuits read its logits)")
    if opts.queries_only and (hm is None or hm.kind != "decoder"):
        raise ValueError("--queries-only: expected --model naming a decoder (the query view is a decoder's)")
    if hm is not None and opts.importance:
        from headwise.study.importance import check_top_k, estimated, importance_room, importance_texts
        from headwise.study.inputs import text_batches

        check_top_k(hm, opts)
        texts = importance_texts(opts) if hm.stream is not None and hm.tokenizer is not None else []
        if texts:  # layer by layer: the gradient pass weighed on the corpus's batches before the statistics' pass
            from headwise.models.layer_walk import layer_walk

            with layer_walk(hm):  # the wiring read within the walk
                mode = opts.ablation if estimated(hm, opts, lambda message: None) else None
            importance_room(hm, list(text_batches(hm, texts, opts.batch_size, lambda message: None)), mode)
    if opts.corpus is not None and launched() and opts.model == "untrained":
        raise ValueError("--corpus: under torchrun the documents are split across ranks for decoders only and for "
                         "checkpoint encoders (the bundled MiniLM, an encoder folder); --model untrained runs in one "
                         "process")  # fmt: skip


def _pass_weights(hm: HeadModel) -> int:
    """The pass's weights and working set :func:`heads_need` counts (the largest unit layer by layer)."""
    from headwise.models.memory import MIN_WORKING

    return hm.memory.layers if hm.memory is not None and hm.stream is not None else MIN_WORKING


def check_importance_whole(hm: HeadModel | None, opts: HeadsOptions, *, kept: int = 0) -> None:
    """``--importance`` under a budget given, weighed on the corpus's batches before anything is written, with
    ``kept`` bytes the command holds through it (a decoder's study: its maps, its page, the pictures' imports): on a
    model opened whole :func:`~headwise.study.importance.check_whole`, layer by layer
    :func:`~headwise.study.importance.importance_room`.

    Raises:
        ValueError: one line naming the budget, the largest batch and the memory the run needs.
    """
    if hm is None or not opts.importance or hm.tokenizer is None or hm.memory is None or not hm.memory.given:
        return
    from headwise.models.layer_walk import layer_walk
    from headwise.models.memory import MemoryBudgetError
    from headwise.study.importance import check_whole, estimated, importance_room, importance_texts
    from headwise.study.inputs import text_batches

    texts = importance_texts(opts)
    if not texts:
        return
    batches = list(text_batches(hm, texts, opts.batch_size, lambda message: None))
    with layer_walk(hm):  # the wiring read within the walk
        mode = opts.ablation if estimated(hm, opts, lambda message: None) else None
    if hm.stream is not None:  # layer by layer: the walk's need with what the study keeps by then
        importance_room(hm, batches, mode, kept=kept)
        return
    try:
        check_whole(hm, batches, mode=mode, kept=kept)
    except MemoryBudgetError as e:
        raise ValueError(said(e)) from None


#: What the pictures take in the process beyond the maps and the page: matplotlib's import (30 MB on SmolLM2's run)
#: and its figures' buffers (heads.png and roles.png are drawn in forked children where the system forks).
PICTURES = 48 * 2**20


def heads_need(hm: HeadModel, tokens: int, queries: tuple[int, int] | None = None, *, held: int | None = None) -> int:
    """The peak resident memory of a decoder's study of an example of ``tokens`` tokens, in bytes: what the process
    holds now (``held``, default :func:`~headwise.models.memory.current_rss`: the interpreter, the imports, the
    tokenizer, a whole model's weights), the pass's weights and activations (opened layer by layer the largest unit's
    float32 and stored bytes and :data:`~headwise.models.memory.MIN_WORKING`, else that working set alone), the
    example's view kept for the pictures (:func:`~headwise.study.decoder.view_bytes`: it grows with the square of the
    length up to 256 tokens), the head view's page three times (its JSON, the page, its bytes written:
    :func:`~headwise.viz.headview.page_size_bound`) and :data:`PICTURES`."""
    from headwise.models.memory import MIN_WORKING, current_rss
    from headwise.study.decoder import VIEW_BINS, VIEW_FULL_UP_TO, view_bytes
    from headwise.viz.headview import page_size_bound

    held = current_rss() if held is None else held
    plan = hm.memory
    weights = plan.layers if plan is not None and hm.stream is not None else MIN_WORKING
    rows = tokens if tokens <= VIEW_FULL_UP_TO else VIEW_BINS
    page = page_size_bound(rows, hm.num_layers, hm.num_heads)
    if queries is not None:
        page += page_size_bound(queries[1] - queries[0], hm.num_layers, hm.num_heads)
    view = view_bytes(hm.num_layers, hm.num_heads, tokens, queries)
    return held + weights + view + 3 * page + PICTURES


def check_room(hm: HeadModel, plan) -> None:
    """A decoder's study weighed against a budget the user gave (``--max-memory``), before anything is written:
    :func:`heads_need` of the example (``plan``: :func:`~headwise.study.decoder.plan_decoder`'s).

    Raises:
        ValueError: one line naming the budget, the example's length and the memory the run needs.
    """
    from headwise.models.memory import HELD_SLACK, MemoryBudgetError, format_size

    memory = hm.memory
    if memory is None or not memory.given:
        return
    need = heads_need(hm, plan.tokens, plan.queries)
    if need <= memory.budget:
        return
    need += HELD_SLACK  # named: a run given it is not refused again by what the process holds moving
    route = "opened layer by layer" if hm.stream is not None else "opened whole"
    message = (
        f"{{option}}: {format_size(memory.budget)} is too small for {hm.name} ({route}): heads on an example of "
        f"{plan.tokens} tokens needs about {format_size(need)} (what the process holds, the pass's weights and "
        "activations, the example's attention maps kept for its pictures, the pictures); give a {option} at least "
        "that"
    )
    error = MemoryBudgetError(message, given=True, budget=memory.budget, need=need, route=memory.route)
    raise ValueError(said(error))


def encoder_model(hm: HeadModel | None, opts: HeadsOptions, *, warn: Callable[[str], None]):
    """The encoder a heads study reads, checked against the options before anything is written: ``(hm, attend)`` —
    ``hm`` None is the untrained block; ``--model`` not given, the bundled encoder, opened here.

    Raises:
        ValueError: one line naming the option (:func:`~headwise.study.check_encoder`, ``--layer``).
    """
    from headwise.study.encoder import check_encoder, encoder_attend
    from headwise.study.heads_model import open_heads_model

    check_encoder(opts)
    if opts.model is None:
        hm = open_heads_model(None, warn=warn)
    enc = encoder_attend(opts.model, hm)
    opts.check_layer(enc.num_layers)
    return hm, enc


def encoder_study(
    hm, enc, opts: HeadsOptions, *, warn: Callable[[str], None], bars: Bars = Bars()
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
    hm, opts: HeadsOptions, plan, *, warn: Callable[[str], None], bars: Bars = Bars()
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
    from headwise.study.heads_lines import drawn

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


def heads_importance(
    hm: HeadModel, opts: HeadsOptions, found: HeadsFound, probe=None, *, warn, bars: Bars = Bars(), curves: bool = True
):
    """``--importance`` on the corpus's lines (a decoder without a tokenizer: its ``probe``) under the stage bar:
    :func:`~headwise.study.estimate_importance` (every head estimated, the top ``--top-k`` and a few at random
    measured, the pruning curve at a small grid; a decoder the circuits' wiring does not read: said to ``warn``, and
    the exact route), with ``--exact`` :func:`~headwise.study.run_importance` — or the result measured across the
    ranks (``found.ranked``). Adds its summary to ``found.extra``. Returns ``(result, columns for heads.json /
    heads.csv)``.

    On a model opened layer by layer the run is a :func:`~headwise.models.layer_walk.layer_walk`, weighed first on its
    batches (:func:`~headwise.study.importance.importance_room`), the batched ablations given what the budget leaves.

    ``curves=False``: the estimate's route measures its heads alone, without the pruning curve (the atlas).

    Raises:
        ValueError: the untrained block (no objective to measure), an empty corpus, ``--top-k`` above the heads; layer
            by layer, a budget the gradient pass does not fit (one line naming the memory).
    """
    from headwise.models.layer_walk import layer_walk
    from headwise.study.importance import (
        check_top_k,
        estimated,
        importance_batches,
        importance_columns,
        importance_room,
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
        if hm.memory is not None and hm.memory.given:
            from headwise.models.memory import map_large_allocations

            # a budget given: each large temporary mapped on its own and given back when freed (glibc's heap kept the
            # attention-aware terms' chunks, layer after layer, 0.2 GB over the freed memory on SmolLM2)
            map_large_allocations()
        with bars.stages() as bar, layer_walk(hm):
            route = estimated(hm, opts, warn)  # the wiring read within the walk (a model opened layer by layer)
            # layer by layer: weighed; whole under a budget given: what it leaves the ablations
            memory = importance_room(hm, batches, opts.ablation if route else None)
            progress = None if bar is None else _importance_bar(bar)
            if route:
                grid = {} if curves else {"grid": (0.0,), "random_orders": 1}  # the intact run's point alone
                result = estimate_importance(hm, batches, seed=opts.seed, mode=opts.ablation, top_k=opts.top_k,
                                             max_exact=opts.max_exact,
                                             progress=progress, memory=memory, **grid)  # fmt: skip
            else:
                result = run_importance(hm, batches, seed=opts.seed, mode=opts.ablation, progress=progress,
                                        memory=memory)  # fmt: skip
    found.extra["importance"] = importance_summary(result)
    return result, importance_columns(result)


def composition_result(hm: HeadModel, *, warn, bars: Bars = Bars()) -> tuple[dict, dict] | None:
    """:func:`~headwise.study.composition_columns` ``(columns, summary)`` with progress, or None (said to ``warn``) for
    a structure the weights' reader does not know or a budget it does not fit. The command runs it before the
    statistics on a model opened layer by layer (what the process holds then is what the budget check weighs; the
    weights' copies are gone before the statistics' passes)."""
    from headwise.study.decoder import composition_columns

    stage = "composition and copying scores"
    try:
        with bars.stages() as progress:
            if progress is not None:
                progress(stage, 0, 1)
            layers = None  # layer by layer: the bar counts the layers read
            if progress is not None and hm.stream is not None:
                layers = lambda done, total: progress(stage, done, total)  # noqa: E731
            cols, summary = composition_columns(hm, progress=layers)
            if progress is not None and layers is None:
                progress(stage, 1, 1)
    except ValueError as e:
        warn(f"--composition skipped: {said(e)}")
        return None
    return cols, summary
