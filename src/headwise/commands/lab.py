"""``headwise lab``'s flows: small transformers trained on the CPU and their heads watched — each subcommand's options
checked in one place (errors naming the option), its run, and what it writes, for the command line to write and print.

- :class:`InductionOptions` → :class:`InductionResult`: ``headwise lab induction``, one seed's run and checkpoint, or
  ``--seeds``' runs (under torchrun dealt across the ranks).
- :class:`HeadsVsOneOptions` → :class:`HeadsVsOneResult`: ``headwise lab heads-vs-one`` (under torchrun the runs dealt
  across the ranks).
- :class:`CircuitsOptions` → :class:`CircuitsResult`: ``headwise lab circuits``, every circuit method scored against
  tasks whose circuit is known by construction.
- :class:`PruneOptions` → :class:`PruneResult`: ``headwise lab prune``, Michel et al.'s head importance on a lab
  checkpoint and the loss as heads go (:func:`headwise.study.run_importance`: the one importance run, on the lab's
  held-out induction batches, :func:`headwise.lab.prune.prune_batches`).

:func:`run` takes the options and returns the result; progress goes to callbacks.

Shape legend: N layers, H heads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import singledispatch
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "CircuitsOptions",
    "CircuitsResult",
    "HeadsVsOneOptions",
    "HeadsVsOneResult",
    "InductionOptions",
    "InductionResult",
    "PruneOptions",
    "PruneResult",
    "run",
]


def _positive(option: str, value: int | None) -> None:
    if value is not None and (value <= 0):
        raise ValueError(f"{option}: expected a positive integer, got {value}")


class _NoBar:
    """The bar of a rank that draws none."""

    def step(self, progress) -> None:
        return None

    def advance(self, note: str) -> None:
        return None


def _no_bar(title: str, total: int, *, unit: str = "steps"):
    return contextlib.nullcontext(_NoBar())


@singledispatch
def run(options, **callbacks):
    """A ``headwise lab`` subcommand's run, chosen by its options' type: :class:`InductionOptions`,
    :class:`HeadsVsOneOptions`, :class:`CircuitsOptions` or :class:`PruneOptions`.

    Callbacks: ``bar(title, total, unit=)`` — a context manager yielding a bar with ``step(progress)`` (the trainer's
    callback) and ``advance(note)`` (one run done), on rank 0 alone; ``stage(task, what)`` — the circuit suite's lines;
    ``stages()`` — the pruning run's stage bars.
    """
    raise TypeError(f"options: expected one of the lab's options records, got {type(options).__name__}")


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


def _seed_list(seeds: str | None, seed: int) -> tuple[int, ...] | None:
    """``--seeds A,B,…`` as integers ≥ 0 (None when not given); with ``--seed`` other than 0: refused."""
    if seeds is None:
        return None
    try:
        chosen = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        chosen = []
    if not chosen or min(chosen) < 0:
        raise ValueError(f"--seeds: expected comma-separated non-negative integers, got {seeds!r}")
    if seed != 0:
        raise ValueError(f"--seed: {seed} given with --seeds; expected one of the two")
    return tuple(chosen)


@dataclass(frozen=True)
class InductionOptions:
    """What ``headwise lab induction`` runs and writes (its options).

    Attributes:
        out: the folder for the checkpoint, summary.json and training.png (``--seeds``: the seeds' summaries).
        seed: seeds the initialisation, the data and the probes.
        steps: training steps (None: the measured set-up's).
        threads: torch threads while training.
        seeds: ``"A,B,…"``, one run per seed (no checkpoints); ``chosen`` holds them parsed.
    Raises:
        ValueError: naming the option: a count that is not positive, a negative seed, seeds that are not a list of
            non-negative integers, ``--seed`` given with ``--seeds``.
    """

    out: Path
    seed: int = 0
    steps: int | None = None
    threads: int = 1
    seeds: str | None = None
    chosen: tuple[int, ...] | None = field(init=False, default=None)

    def __post_init__(self):
        _positive("--steps", self.steps)
        _positive("--threads", self.threads)
        if self.seed < 0:
            raise ValueError(f"--seed: expected a non-negative integer, got {self.seed}")
        object.__setattr__(self, "chosen", _seed_list(self.seeds, self.seed))
        object.__setattr__(self, "out", Path(self.out))


@dataclass
class InductionResult:
    """What ``headwise lab induction`` found (rank 0).

    Attributes:
        options: the options run; setup: the :class:`~headwise.lab.induction.InductionSetup`.
        run: one seed's :class:`~headwise.lab.induction.InductionRun` (the model, its history, its summary), or None
            with ``--seeds``; training: what its checkpoint records of the training.
        files: ``{name: text}`` of the result files; lines: what the terminal shows after the files are written.
        written: the files' names as the terminal says them; passed: every run met the target.
    """

    options: InductionOptions
    setup: object
    run: object
    training: dict
    files: dict[str, str]
    written: str
    lines: list[str]
    passed: bool


@run.register
def _(options: InductionOptions, *, bar: Callable = _no_bar) -> InductionResult | None:
    from headwise.commands._folders import out_folder
    from headwise.lab.induction import InductionSetup, run_induction, summary_lines
    from headwise.lab.records import json_text

    o = options
    out_folder(o.out)
    setup = InductionSetup() if o.steps is None else InductionSetup(steps=o.steps)
    if o.chosen is not None:
        return _induction_seeds(o, setup, bar)
    from headwise.distributed.ranks import launched

    if launched():
        raise ValueError("--seeds: under torchrun expected --seeds A,B,… (one run per seed, dealt across the ranks); "
                         "a single --seed runs in one process")  # fmt: skip
    with bar(f"induction, seed {o.seed}", setup.steps) as shown:
        got = run_induction(setup, seed=o.seed, callback=shown.step, num_threads=o.threads)
    s = got.summary
    training = {"experiment": "induction", "seed": o.seed, "steps": setup.steps, "passed": s["passed"]}
    written = (
        f"wrote {o.out}/ (model.safetensors, config.json, summary.json, training.png) in {s['seconds']:.0f} s "
        f"({s['tokens_per_s'] / 1000:.1f}k tokens/s)"
    )
    return InductionResult(o, setup, got, training, {"summary.json": json_text(s)}, written, summary_lines(s),
                           s["passed"])  # fmt: skip


def _induction_seeds(o: InductionOptions, setup, bar: Callable) -> InductionResult | None:
    """``lab induction --seeds``: one run per seed (:func:`headwise.lab.induction.run_induction_seeds`; under torchrun
    dealt across the ranks); None on ranks other than 0."""
    from headwise.lab.induction import SEED_COLUMNS, run_induction_seeds, seed_rows
    from headwise.lab.records import csv_text, json_text

    seeds = list(o.chosen)
    with _ranks() as place:
        first = place is None or place[0] == 0
        note = f", rank 0's share of {place[1]} ranks" if place else ""
        with bar(f"induction, {len(seeds)} seeds{note}", len(seeds), unit="runs") if first else _no_bar("", 0) as b:

            def on_run(summary):
                b.advance(f"seed {summary['seed']}: {'pass' if summary['passed'] else 'FAIL'}")

            runs = run_induction_seeds(setup, seeds, num_threads=o.threads, on_run=on_run if first else None)
    if not first:
        return None
    rows = seed_rows(runs)
    data = {"experiment": "induction", "steps": setup.steps, "seeds": seeds, "runs": runs}
    files = {"induction_seeds.json": json_text(data), "induction_seeds.csv": csv_text(rows, SEED_COLUMNS)}
    shown = f"{place[1]} ranks" if place else "one process"
    written = f"wrote {o.out}/ (induction_seeds.json, induction_seeds.csv): {len(seeds)} seeds, {shown}"
    lines = [
        f"  seed {r['seed']}: second-copy loss {r['loss_repeated']:.3f} nats = {r['repeated_over_ln_v']:.3f} "
        f"· ln V ({'pass' if r['passed'] else 'FAIL'}); induction heads: {r['induction_heads'] or 'none'}"
        for r in rows
    ]
    return InductionResult(o, setup, None, {}, files, written, lines, all(r["passed"] for r in rows))


@dataclass(frozen=True)
class HeadsVsOneOptions:
    """What ``headwise lab heads-vs-one`` runs and writes (its options).

    Attributes:
        out: the folder for heads_vs_one.json, .csv and .png.
        seeds: evaluation seeds per (task, head count) (None: 8, 16 with ``full``); steps: training steps of every
            run (None: each task's); tasks: comma-separated task names; heads: comma-separated head counts;
            full: the long version; threads: torch threads while training; workers: runs trained at once.
        setup: the :class:`~headwise.lab.heads_setup.HeadsSetup` they make.
    Raises:
        ValueError: naming the option: a count that is not positive, an unknown task, a head count that does not
            divide the width.
    """

    out: Path
    seeds: int | None = None
    steps: int | None = None
    tasks: str = "pair,triple,language"
    heads: str = "1,2,4,8"
    full: bool = False
    threads: int = 1
    workers: int = 2
    setup: object = field(init=False, default=None)

    def __post_init__(self):
        from headwise.lab.heads_setup import setup_from_options

        for option, value in (("--seeds", self.seeds), ("--steps", self.steps), ("--threads", self.threads),
                              ("--workers", self.workers)):  # fmt: skip
            _positive(option, value)
        setup = setup_from_options(self.tasks, self.heads, seeds=self.seeds, steps=self.steps, full=self.full)
        object.__setattr__(self, "setup", setup)
        object.__setattr__(self, "out", Path(self.out))


@dataclass
class HeadsVsOneResult:
    """What ``headwise lab heads-vs-one`` found (rank 0): the result (``heads_vs_one.json``'s), the files' text, the
    picture's title, the line saying what was written and the verdict's lines."""

    options: HeadsVsOneOptions
    result: dict
    files: dict[str, str]
    title: str
    written: str
    lines: list[str]


@run.register
def _(options: HeadsVsOneOptions, *, bar: Callable = _no_bar) -> HeadsVsOneResult | None:
    from headwise.commands._folders import out_folder
    from headwise.lab.heads_verdict import CSV_COLUMNS, result_lines
    from headwise.lab.heads_vs_one import run_heads_vs_one
    from headwise.lab.records import csv_text, json_text

    o, setup = options, options.setup
    out_folder(o.out)
    n_tune, n_eval = setup.run_counts()
    with _ranks() as place:  # torchrun: the runs dealt across the ranks, rank 0 draws its share and writes
        mode, shown = ("ranks", f"{place[1]} ranks") if place else (o.workers, f"{o.workers} worker(s)")
        first = place is None or place[0] == 0
        note = f", rank 0's share of {place[1]} ranks" if place else ""
        title = f"heads vs one: {n_tune} tuning + {n_eval} evaluation runs{note}"
        with bar(title, n_tune + n_eval, unit="runs") if first else _no_bar("", 0) as b:

            def on_run(run, done, total_runs):
                what = run["accuracy"] if run["task"] != "language" else run["loss"]
                b.advance(f"last: {run['phase']} {run['task']} H={run['heads']} seed {run['seed']} {what:.3f}")

            result = run_heads_vs_one(setup, on_run=on_run if first else None, num_threads=o.threads, workers=mode)
    if not first:
        return None
    files = {
        "heads_vs_one.json": json_text(result),
        "heads_vs_one.csv": csv_text(result["tuning_runs"] + result["runs"], CSV_COLUMNS),
    }
    title = (
        f"One head against many at equal width and parameters: {setup.seeds} seeds per head count, "
        "learning rate tuned per head count"
    )
    written = (
        f"wrote {o.out}/ (heads_vs_one.json, .csv, .png) in {result['wall_seconds']:.0f} s "
        f"(training time summed over the runs: {result['seconds']:.0f} s, {shown})"
    )
    return HeadsVsOneResult(o, result, files, title, written, result_lines(result))


@dataclass(frozen=True)
class CircuitsOptions:
    """What ``headwise lab circuits`` runs and writes (its options).

    Attributes:
        out: the folder for circuits.json and circuits.png; seed: seeds every model, its data, probes and prompt
            pairs; tasks: comma-separated task names (``names``: them checked); steps: training steps of every task;
            threads: torch threads while training.
    Raises:
        ValueError: naming the option: a count that is not positive, unknown or repeated task names.
    """

    out: Path
    seed: int = 0
    tasks: str = "offset,retrieve,induction,value"
    steps: int | None = None
    threads: int = 1
    names: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self):
        from headwise.lab.circuit_suite import suite_tasks

        _positive("--steps", self.steps)
        _positive("--threads", self.threads)
        object.__setattr__(self, "names", tuple(suite_tasks("--tasks", self.tasks)))
        object.__setattr__(self, "out", Path(self.out))


@dataclass
class CircuitsResult:
    """What ``headwise lab circuits`` found: the suite's result (``circuits.json``'s), its text, the table's lines and
    whether every task's circuit was confirmed."""

    options: CircuitsOptions
    result: dict
    files: dict[str, str]
    lines: list[str]
    confirmed: bool


@run.register
def _(options: CircuitsOptions, *, stage: Callable[[str, str], None] | None = None) -> CircuitsResult:
    from headwise.commands._folders import out_folder
    from headwise.lab.circuit_suite import run_suite, table_lines
    from headwise.lab.records import json_text

    o = options
    out_folder(o.out)
    result = run_suite(list(o.names), seed=o.seed, steps=o.steps, num_threads=o.threads, stage=stage)
    confirmed = all(r["confirmation"]["confirmed"] for r in result["tasks"].values())
    return CircuitsResult(o, result, {"circuits.json": json_text(result)}, table_lines(result), confirmed)


@dataclass(frozen=True)
class PruneOptions:
    """What ``headwise lab prune`` reads and writes (its options).

    Attributes:
        model: a lab checkpoint folder (from ``headwise lab induction``).
        out: the folder for pruning.csv, pruning.png and importance.json (None: ``MODEL/pruning``).
        sequences: held-out sequences for the importance and for the loss.
        random_orders: random removal orders compared with.
        seed: seeds the probe sequences and the random orders.
        threads: torch threads while it runs.
        ablation: how a head is removed: ``"zero"`` (its output 0) or ``"mean"``.
    Raises:
        ValueError: naming the option: a count that is not positive, a negative seed, an unknown ablation.
    """

    model: Path
    out: Path | None = None
    sequences: int = 256
    random_orders: int = 5
    seed: int = 0
    threads: int = 1
    ablation: str = "zero"

    def __post_init__(self):
        _positive("--sequences", self.sequences)
        _positive("--random-orders", self.random_orders)
        _positive("--threads", self.threads)
        if self.seed < 0:
            raise ValueError(f"--seed: expected a non-negative integer, got {self.seed}")
        if self.ablation not in ("zero", "mean"):
            raise ValueError(f"--ablation: expected one of zero, mean, got {self.ablation!r}")
        object.__setattr__(self, "model", Path(self.model))


@dataclass
class PruneResult:
    """What ``headwise lab prune`` found.

    Attributes:
        options: the options run; hm: the model; out: the output folder (checked, not yet written).
        result: the :class:`~headwise.analysis.importance.ImportanceResult` (curves by importance, ablation, random).
        importance: ``{"L{l}H{h}": importance normalised per layer}``; order: the heads, least important first.
        title: the pruning picture's title; importance_json: ``importance.json``'s text.
    """

    options: PruneOptions
    hm: HeadModel
    out: Path
    result: object
    importance: dict[str, float]
    order: list[str]
    title: str
    importance_json: str = ""


@run.register
def _(options: PruneOptions, *, stages: Callable = contextlib.nullcontext) -> PruneResult:
    """``headwise lab prune``: the checkpoint opened through the one door, the output folder checked, then the
    importance on one stream of held-out induction sequences and the loss on another as heads go
    (:func:`headwise.study.run_importance`: every number of heads removed). ``stages()``: a context manager yielding
    ``progress(stage, done, total)``.

    Raises:
        ValueError: one line naming the option (a folder that is not a lab checkpoint: what it is instead).
    """
    import math

    from headwise.commands._folders import out_folder
    from headwise.lab.prune import prune_batches
    from headwise.lab.trainer import threads as torch_threads
    from headwise.models import open_model
    from headwise.models.lab_checkpoint import read_config
    from headwise.study.importance import run_importance

    o = options
    read_config(o.model)  # a lab checkpoint, or one line saying what the folder is instead
    hm = open_model(o.model)  # the one door: the folder's checks, then the weights, once
    out = out_folder(o.model / "pruning" if o.out is None else o.out)
    lm, n_heads = hm.model, hm.num_layers * hm.num_heads
    title = f"Heads removed from {o.model.name}: loss on the second copy (ln V = {math.log(lm.vocab_size):.2f})"
    with torch_threads(o.threads), stages() as progress:
        result = run_importance(
            hm,
            prune_batches(lm, o.sequences, o.seed, 0),
            seed=o.seed,
            scored="answers",
            eval_batches=prune_batches(lm, o.sequences, o.seed, 1),
            random_orders=o.random_orders,
            points=n_heads + 1,
            mode=o.ablation,
            progress=progress,
        )
    names = [f"L{i // hm.num_heads}H{i % hm.num_heads}" for i in range(n_heads)]
    importance = dict(zip(names, result.importance_norm.ravel().tolist()))
    from headwise.lab.records import json_text

    order = [names[i] for i in result.order]
    return PruneResult(
        o, hm, out, result, importance, order, title, json_text({"importance": importance, "order": order})
    )
