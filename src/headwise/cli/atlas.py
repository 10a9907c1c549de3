"""``headwise atlas``: every head of a decoder explained over a corpus, as one offline page.

``headwise atlas [--model M] [--corpus FILE] [--out DIR]`` reads the corpus (default: the bundled sample) in one
streaming pass — every head's statistics and role, its strongest contexts, its attention by offset, what it writes —
then measures every head's importance (the estimate, the strongest heads exactly) and reads the weights' circuits
(composition partners, the OV circuit's copying), and writes into ``--out`` (default ``headwise-out/atlas``):

- ``atlas.json`` — every head's record (format ``headwise.atlas/1``, docs/heads.md);
- ``atlas.html`` — the self-contained offline page: a grid of layers × heads coloured by role and shaded by
  importance, each head's card on a click, search and filters.

It prints what fits a screen: each role counted with its strongest heads. Bad input is one line on stderr and exit
status 2, before any file is written.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from headwise.cli._app import app
from headwise.cli._output import table_console, write_failed
from headwise.cli._progress import corpus_progress, layer_progress, stage_progress


def _warn(message: str) -> None:
    import sys

    print(f"headwise: warning: {message}", file=sys.stderr)


@app.command()
def atlas(
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="A decoder: checkpoint folder (config.json + *.safetensors + tokenizer.json), a GGUF file, or "
            "'smollm2' (bundled SmolLM2-135M-Instruct, the default).",
        ),
    ] = "smollm2",
    corpus: Annotated[
        str, typer.Option("--corpus", help="UTF-8 text file, one text per line, or 'sample' (bundled, the default).")
    ] = "sample",
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("headwise-out/atlas"),
    top: Annotated[int, typer.Option("--top", help="Contexts kept per head (1–64).", min=1)] = 8,
    no_importance: Annotated[
        bool, typer.Option("--no-importance", help="Skip the importance run (every head's ablation).")
    ] = False,
    no_composition: Annotated[
        bool, typer.Option("--no-composition", help="Skip the weights' circuits (composition partners, copying).")
    ] = False,
    importance_sentences: Annotated[
        int, typer.Option("--importance-sentences", help="Corpus texts the importance is measured on.", min=1)
    ] = 64,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            help="The exact top heads sought; the top K by |estimate| and by Michel's importance are measured first, "
            "then more by their bounds (default min(10, heads/4)).",
        ),
    ] = None,
    max_exact: Annotated[
        int | None,
        typer.Option("--max-exact", help="Most heads measured exactly (default --top-k + 6)."),
    ] = None,
    ablation: Annotated[str, typer.Option("--ablation", help="How a head is removed: zero or mean.")] = "zero",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Corpus texts per model call.", min=1)] = 32,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the probe and of the random heads measured.", min=0)] = 0,
    max_memory: Annotated[
        str | None, typer.Option("--max-memory", help="Peak memory budget: 1.5GB, 400MB, 2GiB (default 80% free).")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="GGUF: de-quantise in memory; write no safetensors copy to the cache.")
    ] = False,
) -> None:
    """Every head of a decoder: what it does, the evidence from a corpus, what it writes, how much it matters and
    whom it works with — atlas.json and an offline atlas.html."""
    from headwise.commands import atlas as flow
    from headwise.commands.heads import Bars

    opts = flow.AtlasOptions(
        model=model, corpus=corpus, out=out, top=top, importance=not no_importance, composition=not no_composition,
        batch_size=batch_size, importance_sentences=importance_sentences, ablation=ablation, top_k=top_k, seed=seed,
        max_exact=max_exact,
        max_memory=max_memory, cache=not no_cache,
    )  # fmt: skip
    bars = Bars(corpus=partial(corpus_progress, command="atlas"), stages=partial(stage_progress, "atlas"),
                layers=partial(layer_progress, command="atlas"))  # fmt: skip
    result = flow.run(opts, warn=_warn, bars=bars)
    console = table_console()
    for line in result.lines:
        console.print(line, highlight=False, markup=False)
    try:
        paths = result.atlas.save(out)
    except OSError as e:
        raise write_failed("--out", out, e) from None
    console.print("wrote " + ", ".join(str(p) for p in paths.values()), highlight=False, markup=False)
