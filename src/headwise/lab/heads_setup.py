"""The plan of the heads-vs-one experiment (:mod:`headwise.lab.heads_vs_one`): the tasks, each task's budget (the
same width, layers and steps for every head count), what a run must reach to count as solved, the seeds, and
:class:`HeadsSetup`, what to run — checked in one place; :func:`setup_from_options` reads it from the command line's
strings.

Shape legend: L sequence length, V vocabulary (= number of classes), D width, H heads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from headwise import checks
from headwise.lab.char_lm import load_corpus
from headwise.lab.tasks import RELATIONS, relation_classes
from headwise.models.transformer_lm import LMConfig

__all__ = [
    "ALPHA",
    "BUDGETS",
    "DEFAULT_TASKS",
    "HEAD_COUNTS",
    "LEARNABLE",
    "MEASURES",
    "SOLVED",
    "TARGET_ACCURACY",
    "TASKS",
    "TUNING_SEED",
    "HeadsSetup",
    "TaskBudget",
    "baselines",
    "setup_from_options",
]

HEAD_COUNTS = (1, 2, 4, 8)
#: accuracy at which a run counts as having solved a synthetic task
SOLVED = 0.95
#: accuracy at which steps-to-target is counted on a synthetic task
TARGET_ACCURACY = 0.9
#: share of evaluation seeds the best H must solve for the task to count as learnable
LEARNABLE = 0.8
#: the first tuning seed; tuning seeds are TUNING_SEED, TUNING_SEED + 1, … (never evaluation seeds)
TUNING_SEED = 1000
#: the comparisons' level (family-wise, Holm over a task's comparisons)
ALPHA = 0.05
TASKS = (*RELATIONS, "language")
DEFAULT_TASKS = ("pair", "triple", "language")
MEASURES = ("accuracy", "loss", "steps")


@dataclass(frozen=True)
class TaskBudget:
    """How one task is set up and trained (the same for every H).

    Attributes:
        vocab_size: input tokens V of a synthetic task (the language task uses the corpus's characters).
        length: sequence length L.
        d_model, d_ff, num_layers: the model (pre-LN decoder layers with RoPE).
        steps, batch_size, warmup: AdamW steps, sequences per step, warmup steps (cosine decay after).
        lrs: the learning rates swept for every H.
        eval_every: steps between probe evaluations (the resolution of steps-to-target).
    """

    vocab_size: int
    length: int
    d_model: int
    d_ff: int
    num_layers: int
    steps: int
    batch_size: int
    warmup: int
    lrs: tuple[float, ...]
    eval_every: int


_RELATION = dict(d_model=32, d_ff=64, num_layers=1, batch_size=32, lrs=(1e-3, 3e-3, 1e-2))
#: every task's budget (measured on 2 cores: see docs/lab.md)
BUDGETS = {
    "pair": TaskBudget(vocab_size=8, length=16, steps=600, warmup=50, eval_every=25, **_RELATION),
    "triple": TaskBudget(vocab_size=4, length=16, steps=600, warmup=50, eval_every=25, **_RELATION),
    "difference": TaskBudget(vocab_size=16, length=32, steps=1500, warmup=100, eval_every=50, **_RELATION),
    "sum": TaskBudget(vocab_size=16, length=32, steps=1500, warmup=100, eval_every=50, **_RELATION),
    "previous": TaskBudget(vocab_size=16, length=32, steps=600, warmup=50, eval_every=25, **_RELATION),
    "language": TaskBudget(
        vocab_size=0,
        length=64,
        d_model=64,
        d_ff=256,
        num_layers=1,
        steps=500,
        batch_size=16,
        warmup=50,
        lrs=(5e-3, 1e-2, 2e-2, 4e-2),
        eval_every=25,
    ),
}


@dataclass(frozen=True)
class HeadsSetup:
    """What to run.

    Attributes:
        tasks: names from :data:`TASKS`.
        heads: head counts compared (each must divide every task's D with an even head width).
        seeds: evaluation seeds 0 … seeds − 1 per (task, H).
        tuning_seeds: seeds per (task, H, learning rate) of the sweep: ``TUNING_SEED`` + 0 … .
        steps: every task's steps (None: each task's budget).
        step_scale: multiplies every task's steps (``full()``: 2).
        lrs: the swept learning rates for every task (None: each task's grid).
        eval_size: held-out sequences of a synthetic task for the final measurement.
        probe_size: held-out sequences evaluated every ``eval_every`` steps (steps-to-target).
    """

    tasks: tuple[str, ...] = DEFAULT_TASKS
    heads: tuple[int, ...] = HEAD_COUNTS
    seeds: int = 8
    tuning_seeds: int = 1
    steps: int | None = None
    step_scale: float = 1.0
    lrs: tuple[float, ...] | None = None
    eval_size: int = 1024
    probe_size: int = 256

    def __post_init__(self):
        if not self.tasks:
            raise ValueError("tasks: expected at least one task, got none")
        for task in self.tasks:
            checks.one_of("task", task, TASKS)
        if not self.heads:
            raise ValueError("heads: expected at least one head count, got none")
        for h in self.heads:
            checks.positive_int("heads", h)
            for task in self.tasks:
                d = BUDGETS[task].d_model
                if d % h or (d // h) % 2:
                    raise ValueError(
                        f"heads: expected divisors of d_model={d} ({task}) with an even head width, got {h}"
                    )
        for name in ("seeds", "tuning_seeds", "eval_size", "probe_size"):
            checks.positive_int(name, getattr(self, name))
        if self.steps is not None:
            checks.positive_int("steps", self.steps)
        checks.positive_number("step_scale", self.step_scale)
        if self.lrs is not None:
            if not self.lrs:
                raise ValueError("lrs: expected at least one learning rate, got none")
            for lr in self.lrs:
                checks.positive_number("lrs", lr)

    @classmethod
    def full(cls, **overrides) -> HeadsSetup:
        """The long version: 16 evaluation seeds, 2 tuning seeds, twice the steps."""
        return cls(**{"seeds": 16, "tuning_seeds": 2, "step_scale": 2.0, **overrides})

    def budget(self, task: str) -> TaskBudget:
        """``task``'s budget with this setup's steps and learning rates applied."""
        b = BUDGETS[task]
        steps = self.steps if self.steps is not None else max(1, round(b.steps * self.step_scale))
        return dataclasses.replace(
            b,
            steps=steps,
            warmup=min(b.warmup, steps // 2),
            eval_every=min(b.eval_every, steps),
            lrs=self.lrs if self.lrs is not None else b.lrs,
        )

    def run_counts(self) -> tuple[int, int]:
        """``(tuning runs, evaluation runs)`` of this setup."""
        tuning = sum(len(self.budget(t).lrs) for t in self.tasks) * len(self.heads) * self.tuning_seeds
        return tuning, len(self.tasks) * len(self.heads) * self.seeds

    def model_config(self, task: str, heads: int) -> LMConfig:
        b = BUDGETS[task]
        vocab = load_corpus().vocab_size if task == "language" else relation_classes(task, b.vocab_size)
        return LMConfig(
            vocab_size=max(vocab, b.vocab_size),
            context_length=b.length,
            d_model=b.d_model,
            num_layers=b.num_layers,
            num_heads=heads,
            d_ff=b.d_ff,
            positional="rope",
        )


def baselines(task: str) -> dict:
    """What a model that learnt nothing reaches: chance accuracy and loss (synthetic: uniform over the
    classes; language: the unigram and bigram models' test losses)."""
    if task == "language":
        c = load_corpus()
        return {"unigram_loss": c.unigram_loss(), "bigram_loss": c.bigram_loss(), "target": "loss ≤ bigram loss"}
    classes = relation_classes(task, BUDGETS[task].vocab_size)
    return {
        "chance_accuracy": 1 / classes,
        "chance_loss": math.log(classes),
        "target": f"accuracy ≥ {TARGET_ACCURACY} (steps), ≥ {SOLVED} (solved)",
    }


def setup_from_options(
    tasks: str, heads: str, *, seeds: int | None = None, steps: int | None = None, full: bool = False
) -> HeadsSetup:
    """The :class:`HeadsSetup` of ``headwise lab heads-vs-one``: ``tasks`` and ``heads`` comma-separated (``--tasks``,
    ``--heads``), ``seeds`` and ``steps`` when given, ``full`` the long version (:meth:`HeadsSetup.full`).

    Raises:
        ValueError: one line naming the option (``--tasks``, ``--heads``, …).
    """
    names = tuple(t.strip() for t in tasks.split(",") if t.strip())
    unknown = [t for t in names if t not in TASKS]
    if not names or unknown:
        raise ValueError(f"--tasks: expected some of {', '.join(TASKS)}, got {tasks!r}")
    try:
        counts = tuple(int(h) for h in heads.split(",") if h.strip())
    except ValueError:
        raise ValueError(f"--heads: expected comma-separated positive integers, got {heads!r}") from None
    if not counts or min(counts) <= 0:
        raise ValueError(f"--heads: expected comma-separated positive integers, got {heads!r}")
    options: dict = {"tasks": names, "heads": counts}
    if seeds is not None:
        options["seeds"] = seeds
    if steps is not None:
        options["steps"] = steps
    try:
        return HeadsSetup.full(**options) if full else HeadsSetup(**options)
    except ValueError as e:
        message = str(e)
        raise ValueError("--" + message if message.startswith("heads: ") else message) from None
