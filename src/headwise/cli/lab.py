"""``headwise lab``: train small transformers on the CPU and watch their heads.

- ``headwise lab induction --out DIR [--seed N]``: a 2-layer attention-only model learns in-context
  copying; writes the checkpoint (``model.safetensors`` + ``config.json``), ``summary.json`` and
  ``training.png``. Exit status 1 when the held-out loss on the second copy misses the target. ``--seeds A,B,…``:
  one run per seed, their summaries in ``induction_seeds.json`` / ``.csv``.
- ``headwise lab heads-vs-one --out DIR [--full]``: 1, 2, 4, 8 heads at equal width and parameters, the
  learning rate tuned per head count on tuning seeds, 8 evaluation seeds, two synthetic tasks and a
  character-level language model; writes ``heads_vs_one.json``, ``heads_vs_one.csv``, ``heads_vs_one.png``.
- ``headwise lab circuits --out DIR``: tasks whose circuit is known by construction, each confirmed by exact patching
  and every edge method scored on it; writes ``circuits.json`` and ``circuits.png`` (exit 1: one not confirmed).
- ``headwise lab prune --model DIR``: Michel et al.'s head importance, loss against heads removed (by
  importance, by measured ablation and at random); writes ``pruning.csv`` and ``pruning.png`` as
  ``headwise heads --importance`` does (one code path, one schema), and ``importance.json``.

Under ``torchrun`` (``RANK`` / ``WORLD_SIZE`` set), ``heads-vs-one`` and ``induction --seeds`` deal their runs across
the ranks (one gloo group from torchrun's environment); rank 0 writes the same files as one process.

Every output folder appears whole or not at all (written beside it, then renamed): Ctrl-C leaves nothing
half-written. The progress bars live here; the lab reports through callbacks.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from headwise.cli._app import app
from headwise.cli._output import write_pruning
from headwise.cli._progress import StepBar, stage_progress

lab_app = typer.Typer(
    name="lab",
    help="Train small transformers on the CPU: induction heads, one head against many, pruning.",
    no_args_is_help=True,
)
app.add_typer(lab_app, name="lab")

_THREADS_HELP = "torch threads while training (one is fastest on a busy 2-core machine)."


def _write(out: Path, files: dict[str, str], *, checkpoint=None, draw=None) -> None:
    """``checkpoint(folder)``'s files, the result files' text and ``draw(folder)``'s pictures written into ``out``,
    whole or not at all."""
    from headwise._io import atomic_folder, write_text_atomic

    with atomic_folder(out) as tmp:
        if checkpoint is not None:
            checkpoint(tmp)
        for name, text in files.items():
            write_text_atomic(tmp / name, text)
        if draw is not None:
            draw(tmp)


@lab_app.command("induction")
def induction(
    out: Annotated[Path, typer.Option("--out", help="Folder for the checkpoint, summary.json and training.png.")],
    seed: Annotated[int, typer.Option("--seed", help="Seeds the initialisation, the data and the probes.")] = 0,
    steps: Annotated[int | None, typer.Option("--steps", help="Training steps (default: the measured set-up).")] = None,
    threads: Annotated[int, typer.Option("--threads", help=_THREADS_HELP)] = 1,
    seeds: Annotated[
        str | None,
        typer.Option(
            "--seeds",
            help="Comma-separated seeds, one run each: their summaries in induction_seeds.json / .csv (no "
            "checkpoints); under torchrun the seeds are dealt across the ranks.",
        ),
    ] = None,
) -> None:
    """Grow induction heads in a 2-layer attention-only model (a few minutes on 2 cores).

    Judged on held-out random sequences in which a segment of 8-24 tokens appears twice at random
    places: the loss on the second copy must be at most 0.3 · ln V (exit status 1 otherwise; with --seeds, when
    any seed misses it).
    """
    from headwise.commands import lab as flow

    got = flow.run(flow.InductionOptions(out=out, seed=seed, steps=steps, threads=threads, seeds=seeds), bar=StepBar)
    if got is None:  # not rank 0: rank 0 writes
        return
    if got.run is None:  # --seeds: the summaries alone
        _write(got.options.out, got.files)
    else:
        from headwise.models.lab_checkpoint import write_checkpoint_files
        from headwise.viz.lab import plot_training

        s = got.run.summary
        _write(
            got.options.out,
            got.files,
            checkpoint=lambda tmp: write_checkpoint_files(got.run.model, tmp, training=got.training),
            draw=lambda tmp: plot_training(got.run.history, tmp / "training.png", ln_v=s["ln_v"], bound=s["bound"],
                                           title=f"Induction, seed {seed}"),
        )  # fmt: skip
    typer.echo(got.written)
    for line in got.lines:
        typer.echo(line)
    if not got.passed:
        raise typer.Exit(1)


@lab_app.command("heads-vs-one")
def heads_vs_one(
    out: Annotated[Path, typer.Option("--out", help="Folder for heads_vs_one.json, .csv and .png.")],
    seeds: Annotated[
        int | None, typer.Option("--seeds", help="Evaluation seeds per (task, head count); default 8 (16 with --full).")
    ] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", help="Training steps of every run (default: each task's).")
    ] = None,
    tasks: Annotated[
        str, typer.Option("--tasks", help="Comma-separated: pair, triple, language, difference, sum, previous.")
    ] = "pair,triple,language",
    heads: Annotated[str, typer.Option("--heads", help="Comma-separated head counts compared.")] = "1,2,4,8",
    full: Annotated[bool, typer.Option("--full", help="16 evaluation seeds, 2 tuning seeds, twice the steps.")] = False,
    threads: Annotated[int, typer.Option("--threads", help=_THREADS_HELP)] = 1,
    workers: Annotated[
        int, typer.Option("--workers", help="Runs trained at once, one process each (under torchrun: one per rank).")
    ] = 2,
) -> None:
    """Compare 1, 2, 4 and 8 heads at equal width and parameter count, learning rate tuned per head count
    (about 6 minutes on 2 free cores; --full about four times that).

    A task whose best head count does not solve it in 80% of the seeds gets the verdict "void".
    """
    from headwise.commands import lab as flow
    from headwise.viz.lab import plot_heads_vs_one

    options = flow.HeadsVsOneOptions(out=out, seeds=seeds, steps=steps, tasks=tasks, heads=heads, full=full,
                                     threads=threads, workers=workers)  # fmt: skip
    got = flow.run(options, bar=StepBar)
    if got is None:  # not rank 0: rank 0 writes
        return
    _write(got.options.out, got.files,
           draw=lambda tmp: plot_heads_vs_one(got.result, tmp / "heads_vs_one.png", title=got.title))  # fmt: skip
    typer.echo(got.written)
    for line in got.lines:
        typer.echo(line)


@lab_app.command("prune")
def prune(
    model: Annotated[Path, typer.Option("--model", help="A lab checkpoint folder (from 'headwise lab induction').")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder for pruning.csv and pruning.png (default: MODEL/pruning).")
    ] = None,
    sequences: Annotated[
        int, typer.Option("--sequences", help="Held-out sequences for importance and for the loss.")
    ] = 256,
    random_orders: Annotated[int, typer.Option("--random-orders", help="Random removal orders to compare with.")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the probe sequences and the random orders.")] = 0,
    threads: Annotated[int, typer.Option("--threads", help=_THREADS_HELP)] = 1,
    ablation: Annotated[
        str, typer.Option("--ablation", help="How a head is removed: zero (its output 0) or mean.")
    ] = "zero",
) -> None:
    """Michel et al.'s head importance on a lab model, and the loss as heads are removed.

    The loss is the next-token loss on the second copy (tokens 2-n) of held-out induction sequences
    (random tokens with one segment of 8-24 tokens repeated); importance is estimated on other
    sequences of the same kind.
    """
    from headwise.commands import lab as flow

    options = flow.PruneOptions(model=model, out=out, sequences=sequences, random_orders=random_orders, seed=seed,
                                threads=threads, ablation=ablation)  # fmt: skip
    run = flow.run(options, stages=partial(stage_progress, "lab"))
    out, n_heads = run.out, run.hm.num_layers * run.hm.num_heads
    _write(out, {"importance.json": run.importance_json}, draw=lambda tmp: write_pruning(run.result, tmp, run.title))
    ranked = ", ".join(f"{k} {v:.2f}" for k, v in sorted(run.importance.items(), key=lambda kv: -kv[1]))
    curves, half = run.result.curves, n_heads // 2
    typer.echo(f"wrote {out}/ (pruning.csv, pruning.png, importance.json)")
    typer.echo(f"importance (normalised per layer): {ranked}")
    typer.echo(
        f"loss with all heads {curves['importance'][0]:.3f}; after removing half ({half}): by importance "
        f"{curves['importance'][half]:.3f}, at random {curves['random_mean'][half]:.3f}"
    )


@lab_app.command("circuits")
def circuits(
    out: Annotated[Path, typer.Option("--out", help="Folder for circuits.json and circuits.png.")],
    seed: Annotated[int, typer.Option("--seed", help="Seeds every model, its data, probes and prompt pairs.")] = 0,
    tasks: Annotated[
        str, typer.Option("--tasks", help="Comma-separated among offset, retrieve, induction, query, value.")
    ] = "offset,retrieve,induction,value",
    steps: Annotated[int | None, typer.Option("--steps", help="Training steps of every task.")] = None,
    threads: Annotated[int, typer.Option("--threads", help=_THREADS_HELP)] = 1,
) -> None:
    """Score every circuit method against circuits known by construction, confirmed by exact patching (CPU minutes)."""
    from headwise.commands import lab as flow
    from headwise.viz.lab import plot_circuit_suite

    options = flow.CircuitsOptions(out=out, seed=seed, tasks=tasks, steps=steps, threads=threads)
    echo = lambda task, what: typer.echo(f"{task}: {what}", err=True)  # noqa: E731 - the progress lines
    got = flow.run(options, stage=echo)
    result = got.result
    _write(got.options.out, got.files, draw=lambda tmp: plot_circuit_suite(result, tmp / "circuits.png"))
    typer.echo(f"wrote {got.options.out}/ (circuits.json, circuits.png) in {result['seconds']:.0f} s, {result['cpu']}")
    typer.echo("\n".join(got.lines))
    if not got.confirmed:
        raise typer.Exit(1)
