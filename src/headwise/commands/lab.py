"""``headwise lab``'s flows: small transformers trained on the CPU and their heads watched — each subcommand's options
checked in one place (errors naming the option), its run, and what it writes, for the command line to write and print.

- :class:`PruneOptions` → :class:`PruneResult`: ``headwise lab prune``, Michel et al.'s head importance on a lab
  checkpoint and the loss as heads go (:func:`headwise.study.run_importance`: the one importance run, on the lab's
  held-out induction batches, :func:`headwise.lab.prune.prune_batches`).

:func:`run` takes the options and returns the result; progress goes to callbacks.

Shape legend: N layers, H heads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PruneOptions", "PruneResult", "run"]


def _positive(option: str, value: int | None) -> None:
    if value is not None and (value <= 0):
        raise ValueError(f"{option}: expected a positive integer, got {value}")


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
        title: the pruning picture's title.
    """

    options: PruneOptions
    hm: object
    out: Path
    result: object
    importance: dict[str, float]
    order: list[str]
    title: str


def run(options: PruneOptions, *, stages: Callable = contextlib.nullcontext) -> PruneResult:
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
    return PruneResult(o, hm, out, result, importance, [names[i] for i in result.order], title)
