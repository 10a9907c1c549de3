"""One head against many at the same width and parameter count.

The second article asks what to expect if 1 head and 8 heads at the same width performed the same, and
answers that several heads give a "genuine representational advantage". This experiment tests it on
tasks chosen so that the answer could go either way:

- ``difference``: the target at t is ``(x[t−1] − x[t−5]) mod V``. One softmax head that reads both
  tokens returns a weighted mean of their values; at equal weights that mean is symmetric in the two
  tokens and cannot say which came first — the difference needs the two kept apart (two heads, or one
  head with unequal weights that the feed-forward network then has to undo).
- ``sum``: ``(x[t−1] + x[t−5]) mod V``, symmetric — the control, which one averaging head can solve.

Every model is one pre-LN decoder layer (attention + feed-forward, RoPE), width D and feed-forward F
fixed; only H changes, and the head width is D / H, so the parameter count is the same for every H
(attention ``4·D² + 4·D`` whatever H). Each (task, H, seed) trains for the same number of steps on the
same data stream; accuracy and loss are measured on held-out sequences.

Shape legend: B batch, L sequence length, V vocabulary (= number of classes), D width, H heads.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from headwise import checks
from headwise.lab.tasks import RELATIONS, relation_task
from headwise.lab.trainer import TrainConfig, masked_loss, train
from headwise.models.transformer_lm import LMConfig, TransformerLM

__all__ = ["HeadsSetup", "HEAD_COUNTS", "run_one", "run_heads_vs_one", "verdict", "SOLVED"]

HEAD_COUNTS = (1, 2, 4, 8)
#: accuracy at which a run counts as having solved its task
SOLVED = 0.95


@dataclass(frozen=True)
class HeadsSetup:
    """Sizes and budgets (defaults: the measured set-up of ``docs/lab.md``)."""

    tasks: tuple[str, ...] = ("difference", "sum")
    heads: tuple[int, ...] = HEAD_COUNTS
    seeds: int = 5
    steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 100
    vocab_size: int = 16
    length: int = 32
    d_model: int = 32
    d_ff: int = 64
    eval_size: int = 512

    def __post_init__(self):
        if not self.tasks:
            raise ValueError("tasks: expected at least one task, got none")
        for task in self.tasks:
            checks.one_of("task", task, tuple(RELATIONS))
        for h in self.heads:
            checks.positive_int("heads", h)
            if self.d_model % h or (self.d_model // h) % 2:
                raise ValueError(f"heads: expected divisors of d_model={self.d_model} with an even head width, got {h}")
        for name in ("seeds", "steps", "batch_size", "vocab_size", "length", "d_model", "d_ff", "eval_size"):
            checks.positive_int(name, getattr(self, name))

    def model_config(self, heads: int) -> LMConfig:
        return LMConfig(
            vocab_size=self.vocab_size,
            context_length=self.length,
            d_model=self.d_model,
            num_layers=1,
            num_heads=heads,
            d_ff=self.d_ff,
            positional="rope",
        )


@torch.no_grad()
def _evaluate(model, task: str, setup: HeadsSetup, seed: int) -> dict:
    x, y, scored = relation_task(
        np.random.default_rng([seed, 99]), setup.eval_size, task=task, length=setup.length, vocab_size=setup.vocab_size
    )
    logits = model(x)  # (B, L, V)
    accuracy = float((logits.argmax(-1) == y)[scored].float().mean())
    return {"accuracy": accuracy, "loss": float(masked_loss(logits, y, scored))}


def run_one(task: str, heads: int, seed: int, setup: HeadsSetup, *, callback=None, num_threads: int | None = 1) -> dict:
    """Train one model; returns ``{"task", "heads", "seed", "accuracy", "loss", "parameters", "seconds"}``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TransformerLM(setup.model_config(heads))
    data = functools.partial(relation_task, task=task, length=setup.length, vocab_size=setup.vocab_size)
    config = TrainConfig(steps=setup.steps, lr=setup.lr, warmup=min(setup.warmup, setup.steps // 2), seed=seed)
    result = train(model, lambda rng: data(rng, setup.batch_size), config, callback=callback, num_threads=num_threads)
    return {
        "task": task,
        "heads": heads,
        "seed": seed,
        **_evaluate(model, task, setup, seed),
        "parameters": model.num_parameters(),
        "seconds": result.seconds,
    }


def _stats(values: list[float]) -> dict:
    a = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(a.mean()),
        "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
        "min": float(a.min()),
        "max": float(a.max()),
    }


def summarise(runs: list[dict], setup: HeadsSetup) -> dict:
    """Per task and head count: accuracy and loss statistics, and how many seeds solved the task."""
    table = {}
    for task in setup.tasks:
        table[task] = {}
        for h in setup.heads:
            mine = [r for r in runs if r["task"] == task and r["heads"] == h]
            if not mine:
                continue
            acc = [r["accuracy"] for r in mine]
            table[task][h] = {
                "accuracy": _stats(acc),
                "loss": _stats([r["loss"] for r in mine]),
                "solved": sum(a >= SOLVED for a in acc),
                "seeds": len(mine),
                "accuracies": acc,
            }
    return table


def verdict(table: dict, vocab_size: int) -> dict[str, str]:
    """A sentence per task, written from the numbers: which head count did best, by how much, how reliably.

    "Clearly" is said only when the gap between the best and the worst mean accuracy is larger than
    twice the larger of their seed-to-seed standard deviations.
    """
    chance = 1 / vocab_size
    out = {}
    for task, by_heads in table.items():
        if not by_heads:
            continue
        means = {h: s["accuracy"]["mean"] for h, s in by_heads.items()}
        best, worst = max(means, key=means.get), min(means, key=means.get)
        one = by_heads.get(1)
        spread = max(by_heads[best]["accuracy"]["std"], by_heads[worst]["accuracy"]["std"])
        gap = means[best] - means[worst]
        clear = gap > 2 * spread
        parts = [
            f"best: {best} head{'s' * (best > 1)} at mean accuracy {means[best]:.2f} "
            f"({by_heads[best]['solved']}/{by_heads[best]['seeds']} seeds ≥ {SOLVED})",
            f"worst: {worst} head{'s' * (worst > 1)} at {means[worst]:.2f}",
        ]
        if one is not None and best != 1:
            parts.append(f"one head: {means[1]:.2f}, {means[best] - means[1]:+.2f} behind the best")
        judgement = "a clear difference" if clear else "no difference larger than the seed-to-seed spread"
        parts.append(f"{judgement} (gap {gap:.2f}, largest std {spread:.2f}; chance {chance:.3f})")
        out[task] = "; ".join(parts)
    return out


def run_heads_vs_one(
    setup: HeadsSetup = HeadsSetup(),
    *,
    on_run: Callable[[dict, int, int], None] | None = None,
    callback=None,
    num_threads: int | None = 1,
    workers: int = 1,
) -> dict:
    """Every (task, H, seed) of ``setup``, then the table and the verdict.

    Args:
        on_run: called after each run with ``(run, done, total)``.
        callback: the trainer's per-step callback, passed to every run (only with ``workers=1``).
        num_threads: torch threads per run.
        workers: runs trained at once, each in its own process (``spawn``); 2 uses both cores of a
            2-core machine. The results do not depend on it (each run is seeded on its own).
    Returns:
        ``{"setup", "runs", "table", "verdict", "parameters", "seconds"}``; ``runs`` in (task, H, seed) order.
    """
    checks.positive_int("workers", workers)
    jobs = [(task, h, seed) for task in setup.tasks for h in setup.heads for seed in range(setup.seeds)]
    runs = []
    if workers == 1:
        for task, h, seed in jobs:
            runs.append(run_one(task, h, seed, setup, callback=callback, num_threads=num_threads))
            if on_run is not None:
                on_run(runs[-1], len(runs), len(jobs))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        try:
            futures = [pool.submit(run_one, task, h, seed, setup, num_threads=num_threads) for task, h, seed in jobs]
            for future in as_completed(futures):
                runs.append(future.result())
                if on_run is not None:
                    on_run(runs[-1], len(runs), len(jobs))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        order = {job: i for i, job in enumerate(jobs)}
        runs.sort(key=lambda r: order[(r["task"], r["heads"], r["seed"])])
    table = summarise(runs, setup)
    params = sorted({r["parameters"] for r in runs})
    return {
        "experiment": "heads-vs-one",
        "setup": asdict(setup),
        "chance_accuracy": 1 / setup.vocab_size,
        "chance_loss": math.log(setup.vocab_size),
        "parameters": params[0] if len(params) == 1 else params,
        "runs": runs,
        "table": {task: {str(h): s for h, s in t.items()} for task, t in table.items()},
        "verdict": verdict(table, setup.vocab_size),
        "seconds": sum(r["seconds"] for r in runs),
    }
