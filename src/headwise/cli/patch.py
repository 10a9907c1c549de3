"""``headwise patch``: which heads carry an answer — activation patching per head and direct logit attribution.

``headwise patch --model DIR --clean TEXT --corrupted TEXT --answer TOKEN --wrong TOKEN --out DIR
[--method exact|attribution] [--direction denoise|noise] [--head L.H ...] [--batch-size N]``

The metric is logit(answer) − logit(wrong) at the last position. ``--method exact`` (default) runs the
corrupted text once per head with that head's output taken from the clean run (``--direction denoise``; or the
clean text with the corrupted head, ``noise``), batched; ``attribution`` estimates the same sweep from one
forward and one backward pass (:mod:`headwise.patching`). ``--head 23.3`` (repeatable) also patches that head
one position at a time. The direct logit attribution of both texts (each head's, MLP's and the embeddings'
share of the logit difference, the final norm's scale frozen) comes in the same files.

Writes into ``--out`` (the folder appears whole or not at all): ``patching.json`` (the ids, both metrics, the
patched metric and its normalised effect per layer and head, the attribution), ``patching.csv`` (one row per
part) and ``patching.png`` (the layer × head maps).

Under ``torchrun --nproc-per-node P -m headwise patch …`` the exact sweep's batches are dealt to the ranks
(:func:`headwise.study.patch_across_ranks`): rank 0 writes the same files as one process (the same batches, so the
same numbers) and ``--out/shards`` keeps each batch's values, so a restarted or repeated run with the same options
computes only what is missing. ``--method attribution`` runs on rank 0 alone. See ``docs/distributed.md``.

``--model``: a model folder, a GGUF file or a bundled name (``smollm2``) that :func:`headwise.models.open_model`
opens and that is a decoder (a Hugging Face causal LM on headwise's backend, a lab checkpoint). ``TOKEN`` must
encode to exactly one token, as typed (for byte-level BPE, " Mary" with its leading space is one token). Bad
input — texts of different token lengths, an answer or wrong token of several tokens or unknown, identical
answer and wrong tokens, a ``--head`` out of range
— is one line on stderr and exit status 2, before anything is written.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from headwise import study
from headwise.cli._app import CLIError, app
from headwise.cli._output import write_failed
from headwise.cli._progress import layer_progress, stage_progress

OUTPUTS = ("patching.json", "patching.csv", "patching.png")


@app.command()
def patch(
    model: Annotated[
        str,
        typer.Option("--model", help="A decoder: a model folder, a GGUF file, or 'smollm2' (as headwise heads)."),
    ],
    clean: Annotated[str, typer.Option("--clean", help="The clean text (the answer is right).")],
    corrupted: Annotated[str, typer.Option("--corrupted", help="The corrupted text, of the same token length.")],
    answer: Annotated[str, typer.Option("--answer", help="The answer token, as typed (e.g. ' Mary').")],
    wrong: Annotated[str, typer.Option("--wrong", help="The wrong token the answer is compared with.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for patching.json / .csv / .png.")],
    method: Annotated[str, typer.Option("--method", help="exact or attribution.")] = "exact",
    direction: Annotated[
        str, typer.Option("--direction", help="denoise (clean head into the corrupted run) or noise.")
    ] = "denoise",
    heads: Annotated[
        list[str] | None, typer.Option("--head", help="LAYER.HEAD also patched one position at a time; repeatable.")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Patched copies per forward pass.")] = 16,
    max_memory: Annotated[
        str | None, typer.Option("--max-memory", help="Peak memory budget: 1.5GB, 400MB (default 80% free).")
    ] = None,
) -> None:
    """Patch every head (clean ↔ corrupted) and split the logit difference into the parts that write it."""
    import json

    from headwise._io import atomic_folder, write_text_atomic
    from headwise.commands import patch as flow
    from headwise.viz.patching import plot_patching

    options = flow.PatchOptions(
        model=model, clean=clean, corrupted=corrupted, answer=answer, wrong=wrong, out=out, method=method,
        direction=direction, heads=tuple(heads or ()), batch_size=batch_size, max_memory=max_memory,
    )  # fmt: skip
    try:
        got = flow.run(
            options, stages=partial(stage_progress, "patch"), layers=partial(layer_progress, command="patch"),
            note=typer.echo,
        )  # fmt: skip
    except study.CollectiveTimeout as e:
        raise CLIError(str(e)) from None
    if got is None:  # not rank 0: rank 0 writes
        return
    hm, found = got.hm, got.found
    for line in found.lines:
        typer.echo(line)
    result = found.result
    title = f"{hm.title}: {answer!r} vs {wrong!r}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_folder(out, keep=("shards",) if study.launched() else ()) as folder:  # kept: a rerun resumes
            write_text_atomic(folder / "patching.json", json.dumps(got.report, indent=1, ensure_ascii=False) + "\n")
            write_text_atomic(folder / "patching.csv", got.csv)
            heads_dla = None
            if found.dla:
                heads_dla = [[math.nan if v is None else v for v in row] for row in found.dla["clean"]["heads"]]
            plot_patching(
                result.normalised.numpy(),
                folder / "patching.png",
                logit_attribution=heads_dla,
                title=title,
                method=result.method,
                direction=direction,
            )
    except OSError as e:
        raise write_failed("--out", out, e) from None

    for note in found.notes:
        typer.echo(f"headwise: warning: {note}", err=True)
    typer.echo(f"{hm.title}")
    clean_m, corrupt_m = float(result.metric_clean.mean()), float(result.metric_corrupted.mean())
    typer.echo(f"metric clean {clean_m:+.3f}, corrupted {corrupt_m:+.3f} ({result.method}, {direction})")
    typer.echo(flow.top_line(result))
    typer.echo(f"{result.passes} forward passes, {result.seconds:.1f} s; wrote {', '.join(OUTPUTS)} to {out}")
