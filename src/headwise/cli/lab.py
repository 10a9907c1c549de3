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

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from headwise.cli._app import CLIError, app
from headwise.cli._output import write_pruning
from headwise.cli._progress import StepBar, stage_progress

lab_app = typer.Typer(
    name="lab",
    help="Train small transformers on the CPU: induction heads, one head against many, pruning.",
    no_args_is_help=True,
)
app.add_typer(lab_app, name="lab")

_THREADS_HELP = "torch threads while training (one is fastest on a busy 2-core machine)."


def _positive(option: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise CLIError(f"{option}: expected a positive integer, got {value}")


def _out_folder(out: Path, option: str = "--out") -> Path:
    """Check that ``out`` can become the output folder (its parent is created)."""
    if out.exists() and not out.is_dir():
        raise CLIError(f"{option}: '{out}' exists and is not a folder")
    try:
        out.absolute().parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(f"{option}: cannot create the folder '{out.parent}': {e.strerror or e}") from None
    return out


@contextlib.contextmanager
def _ranks():
    """Under torchrun: the ranks of the launch for the block (:func:`headwise.distributed.ranks.ranks`: the gloo group
    from its environment, destroyed after it); yields ``(rank, world_size)``, or None outside a launch."""
    from headwise.distributed.ranks import launched, ranks

    if not launched():
        yield None
        return
    with ranks() as r:
        yield r.rank, r.world_size


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
    _positive("--steps", steps)
    _positive("--threads", threads)
    if seed < 0:
        raise CLIError(f"--seed: expected a non-negative integer, got {seed}")
    chosen = _seed_list(seeds, seed)
    out = _out_folder(out)
    if chosen is not None:
        _induction_seeds(out, chosen, steps, threads)
        return
    from headwise.distributed.ranks import launched

    if launched():
        raise CLIError("--seeds: under torchrun expected --seeds A,B,… (one run per seed, dealt across the ranks); "
                       "a single --seed runs in one process")  # fmt: skip

    from headwise._io import atomic_folder, write_text_atomic
    from headwise.lab.induction import InductionSetup, run_induction, summary_lines
    from headwise.lab.records import json_text
    from headwise.models.lab_checkpoint import write_checkpoint_files
    from headwise.viz.lab import plot_training

    setup = InductionSetup() if steps is None else InductionSetup(steps=steps)
    with StepBar(f"induction, seed {seed}", setup.steps) as bar:
        run = run_induction(setup, seed=seed, callback=bar.step, num_threads=threads)
    s = run.summary
    with atomic_folder(out) as tmp:
        write_checkpoint_files(
            run.model,
            tmp,
            training={"experiment": "induction", "seed": seed, "steps": setup.steps, "passed": s["passed"]},
        )
        write_text_atomic(tmp / "summary.json", json_text(s))
        plot_training(
            run.history, tmp / "training.png", ln_v=s["ln_v"], bound=s["bound"], title=f"Induction, seed {seed}"
        )
    typer.echo(
        f"wrote {out}/ (model.safetensors, config.json, summary.json, training.png) in {s['seconds']:.0f} s "
        f"({s['tokens_per_s'] / 1000:.1f}k tokens/s)"
    )
    for line in summary_lines(s):
        typer.echo(line)
    if not s["passed"]:
        raise typer.Exit(1)


def _seed_list(seeds: str | None, seed: int) -> list[int] | None:
    """``--seeds A,B,…`` as integers ≥ 0 (None when not given); with ``--seed`` other than 0: refused."""
    if seeds is None:
        return None
    try:
        chosen = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        chosen = []
    if not chosen or min(chosen) < 0:
        raise CLIError(f"--seeds: expected comma-separated non-negative integers, got {seeds!r}")
    if seed != 0:
        raise CLIError(f"--seed: {seed} given with --seeds; expected one of the two")
    return chosen


def _induction_seeds(out: Path, seeds: list[int], steps: int | None, threads: int) -> None:
    """``lab induction --seeds``: one run per seed (:func:`headwise.lab.induction.run_induction_seeds`; under
    torchrun dealt across the ranks), the summaries written by rank 0; exit status 1 when a seed misses the target."""
    from headwise._io import atomic_folder, write_text_atomic
    from headwise.lab.induction import SEED_COLUMNS, InductionSetup, run_induction_seeds, seed_rows
    from headwise.lab.records import csv_text, json_text

    setup = InductionSetup() if steps is None else InductionSetup(steps=steps)
    with _ranks() as place:
        first = place is None or place[0] == 0
        note = f", rank 0's share of {place[1]} ranks" if place else ""
        with StepBar(f"induction, {len(seeds)} seeds{note}", len(seeds), unit="runs") if first else (
            contextlib.nullcontext()
        ) as bar:  # fmt: skip

            def on_run(summary):
                bar.advance(f"seed {summary['seed']}: {'pass' if summary['passed'] else 'FAIL'}")

            runs = run_induction_seeds(setup, seeds, num_threads=threads, on_run=on_run if first else None)
    if not first:
        return
    rows = seed_rows(runs)
    with atomic_folder(out) as tmp:
        data = {"experiment": "induction", "steps": setup.steps, "seeds": seeds, "runs": runs}
        write_text_atomic(tmp / "induction_seeds.json", json_text(data))
        write_text_atomic(tmp / "induction_seeds.csv", csv_text(rows, SEED_COLUMNS))
    shown = f"{place[1]} ranks" if place else "one process"
    typer.echo(f"wrote {out}/ (induction_seeds.json, induction_seeds.csv): {len(seeds)} seeds, {shown}")
    for r in rows:
        typer.echo(
            f"  seed {r['seed']}: second-copy loss {r['loss_repeated']:.3f} nats = {r['repeated_over_ln_v']:.3f} "
            f"· ln V ({'pass' if r['passed'] else 'FAIL'}); induction heads: {r['induction_heads'] or 'none'}"
        )
    if not all(r["passed"] for r in rows):
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
    from headwise.lab.heads_setup import setup_from_options
    from headwise.lab.heads_vs_one import run_heads_vs_one

    _positive("--seeds", seeds)
    _positive("--steps", steps)
    _positive("--threads", threads)
    _positive("--workers", workers)
    setup = setup_from_options(tasks, heads, seeds=seeds, steps=steps, full=full)
    out = _out_folder(out)

    from headwise._io import atomic_folder, write_text_atomic
    from headwise.lab.heads_verdict import CSV_COLUMNS, result_lines
    from headwise.lab.records import csv_text, json_text
    from headwise.viz.lab import plot_heads_vs_one

    n_tune, n_eval = setup.run_counts()
    with _ranks() as place:  # torchrun: the runs dealt across the ranks, rank 0 draws its share and writes
        mode, shown = ("ranks", f"{place[1]} ranks") if place else (workers, f"{workers} worker(s)")
        first = place is None or place[0] == 0
        note = f", rank 0's share of {place[1]} ranks" if place else ""
        title = f"heads vs one: {n_tune} tuning + {n_eval} evaluation runs{note}"
        with StepBar(title, n_tune + n_eval, unit="runs") if first else contextlib.nullcontext() as bar:

            def on_run(run, done, total_runs):
                what = run["accuracy"] if run["task"] != "language" else run["loss"]
                bar.advance(f"last: {run['phase']} {run['task']} H={run['heads']} seed {run['seed']} {what:.3f}")

            result = run_heads_vs_one(setup, on_run=on_run if first else None, num_threads=threads, workers=mode)
    if not first:
        return
    with atomic_folder(out) as tmp:
        write_text_atomic(tmp / "heads_vs_one.json", json_text(result))
        write_text_atomic(tmp / "heads_vs_one.csv", csv_text(result["tuning_runs"] + result["runs"], CSV_COLUMNS))
        plot_heads_vs_one(
            result,
            tmp / "heads_vs_one.png",
            title=f"One head against many at equal width and parameters: {setup.seeds} seeds per head count, "
            "learning rate tuned per head count",
        )
    typer.echo(
        f"wrote {out}/ (heads_vs_one.json, .csv, .png) in {result['wall_seconds']:.0f} s "
        f"(training time summed over the runs: {result['seconds']:.0f} s, {shown})"
    )
    for line in result_lines(result):
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
    from headwise._io import atomic_folder, write_text_atomic
    from headwise.commands import lab as flow
    from headwise.lab.records import json_text

    options = flow.PruneOptions(model=model, out=out, sequences=sequences, random_orders=random_orders, seed=seed,
                                threads=threads, ablation=ablation)  # fmt: skip
    run = flow.run(options, stages=stage_progress)
    out, n_heads = run.out, run.hm.num_layers * run.hm.num_heads
    with atomic_folder(out) as tmp:
        write_pruning(run.result, tmp, run.title)
        write_text_atomic(tmp / "importance.json", json_text({"importance": run.importance, "order": run.order}))
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
    from headwise._io import atomic_folder, write_text_atomic
    from headwise.lab.circuit_suite import run_suite, suite_tasks, table_lines
    from headwise.lab.records import json_text
    from headwise.viz.lab import plot_circuit_suite

    _positive("--steps", steps)
    _positive("--threads", threads)
    names, out = suite_tasks("--tasks", tasks), _out_folder(out)
    echo = lambda task, what: typer.echo(f"{task}: {what}", err=True)  # noqa: E731 - the progress lines
    result = run_suite(names, seed=seed, steps=steps, num_threads=threads, stage=echo)
    with atomic_folder(out) as tmp:
        write_text_atomic(tmp / "circuits.json", json_text(result))
        plot_circuit_suite(result, tmp / "circuits.png")
    typer.echo(f"wrote {out}/ (circuits.json, circuits.png) in {result['seconds']:.0f} s, {result['cpu']}")
    typer.echo("\n".join(table_lines(result)))
    if not all(r["confirmation"]["confirmed"] for r in result["tasks"].values()):
        raise typer.Exit(1)
