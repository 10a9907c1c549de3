"""One head against many at the same width and parameter count — learnable tasks, tuned settings,
measures that separate, and a verdict that can come out either way or say the comparison is void.

The second article asks what to conclude if 1 head and 8 heads at the same width performed the same, and
answers that several heads give a "genuine representational advantage". This experiment tests it:

- **Tasks** (:data:`BUDGETS`): ``pair`` and ``triple`` (:mod:`headwise.lab.tasks`) — the target names two
  or three earlier tokens at fixed offsets, as one class, so the model has to keep several tokens apart;
  ``language`` — next-character prediction on the bundled public-domain corpus
  (:mod:`headwise.lab.char_lm`), tested on held-out lines. ``difference``, ``sum`` and ``previous`` can
  be asked for too (the first two are not learnt within their budget: the verdict then says "void").
- **Fair settings**: for every task the width D, the feed-forward width and the layers are fixed and only
  H changes (head width D / H), so the parameter count is the same for every H (attention ``4·D² + 4·D``
  whatever H). The learning rate is chosen *per H* by the same sweep (:attr:`TaskBudget.lrs`), judged by
  the final validation loss of runs on tuning seeds (``TUNING_SEED`` + i) that are never evaluation seeds,
  on validation data that is not the test data.
- **Learnable before compared**: a run *solves* a synthetic task at held-out accuracy ≥ :data:`SOLVED`,
  and the language task when its test loss is below the character-bigram model's (it then uses more than
  the current character). A task counts as learnable when its best H solves it in at least
  :data:`LEARNABLE` of the evaluation seeds; otherwise the verdict is "void" and nothing is compared.
- **Measures**: final test accuracy and loss, and the steps to reach the target (accuracy 0.9, or the
  bigram loss) on a probe evaluated every ``eval_every`` steps, per H over the evaluation seeds, with
  bootstrap intervals; every H is compared with one head by an exact rank test (Holm-corrected over the
  task's comparisons) and a bootstrap interval of the difference; the smallest difference the design
  could detect is stated (:func:`headwise.lab.stats.detectable_difference`).

The plan (tasks, budgets, :class:`HeadsSetup`) is :mod:`headwise.lab.heads_setup`'s, the statistics and the
verdict :mod:`headwise.lab.heads_verdict`'s (both re-exported here); this module trains the runs — one arm
(:func:`run_one`: a task, a head count, a seed, a learning rate) and all of them, serially, in worker processes or
across ranks (:func:`run_heads_vs_one`).

Shape legend: B batch, L sequence length, V vocabulary (= number of classes), D width, H heads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict

import numpy as np
import torch

from headwise import checks
from headwise.lab import stats
from headwise.lab.char_lm import load_corpus
from headwise.lab.heads_setup import (
    ALPHA,
    BUDGETS,
    DEFAULT_TASKS,
    HEAD_COUNTS,
    LEARNABLE,
    MEASURES,
    SOLVED,
    TARGET_ACCURACY,
    TASKS,
    TUNING_SEED,
    HeadsSetup,
    TaskBudget,
    baselines,
)
from headwise.lab.heads_verdict import compare, summarise, sweep_choice, verdict
from headwise.lab.tasks import relation_task
from headwise.lab.trainer import TrainConfig, masked_loss, train
from headwise.models.transformer_lm import TransformerLM

__all__ = [
    "ALPHA",
    "BUDGETS",
    "DEFAULT_TASKS",
    "HEAD_COUNTS",
    "HeadsSetup",
    "LEARNABLE",
    "MEASURES",
    "SOLVED",
    "TARGET_ACCURACY",
    "TASKS",
    "TUNING_SEED",
    "TaskBudget",
    "baselines",
    "compare",
    "run_heads_vs_one",
    "run_one",
    "summarise",
    "sweep_choice",
    "verdict",
]


def _data(task: str, setup: HeadsSetup, seed: int, split: str):
    """``(batch(rng), final set, probe set)`` of a task; the held-out sets depend on the seed and split only."""
    b = BUDGETS[task]
    if task == "language":
        c = load_corpus()
        held = c.windows(b.length, split=split)
        return (lambda rng: c.batch(rng, b.batch_size, b.length)), held, held
    stream = 99 if split == "held_out" else 77
    held = relation_task(
        np.random.default_rng([seed, stream]), setup.eval_size, task=task, length=b.length, vocab_size=b.vocab_size
    )
    probe = tuple(t[: setup.probe_size] for t in held)

    def batch(rng):
        return relation_task(rng, b.batch_size, task=task, length=b.length, vocab_size=b.vocab_size)

    return batch, held, probe


def _measure(model, held) -> dict:
    x, y, scored = held
    logits = model(x)  # (B, L, V)
    return {
        "accuracy": float((logits.argmax(-1) == y)[scored].float().mean()),
        "loss": float(masked_loss(logits, y, scored)),
    }


def run_one(
    task: str,
    heads: int,
    seed: int,
    lr: float,
    setup: HeadsSetup,
    *,
    phase: str = "eval",
    callback=None,
    num_threads: int | None = 1,
) -> dict:
    """Train one model and measure it.

    Args:
        phase: ``"eval"`` (measured on the test data) or ``"tune"`` (on the validation data).
    Returns:
        ``{"task", "phase", "heads", "seed", "lr", "accuracy", "loss", "steps_to_target", "solved",
        "diverged", "parameters", "seconds", "history"}``; ``steps_to_target`` is None when the target was
        never reached; ``history`` holds ``{"step", "accuracy", "loss"}`` of the probe. A run whose loss
        became non-finite is recorded as ``diverged`` with a uniform guess's accuracy and loss (1 / V, ln V)
        and an empty history, so that a swept rate that diverges loses the sweep instead of ending it.
    """
    checks.one_of("phase", phase, ("eval", "tune"))
    b = setup.budget(task)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TransformerLM(setup.model_config(task, heads))
    batch, held, probe = _data(task, setup, seed, "held_out" if phase == "eval" else "validation")
    config = TrainConfig(steps=b.steps, lr=lr, warmup=b.warmup, seed=seed, eval_every=b.eval_every)
    start = time.perf_counter()
    try:
        result = train(
            model, batch, config, evaluate=lambda m: _measure(m, probe), callback=callback, num_threads=num_threads
        )
    except ValueError as e:  # a non-finite loss: the run is worth a uniform guess, and says so
        if "diverged" not in str(e):
            raise
        classes = model.vocab_size
        final, history, diverged, seconds = {"accuracy": 1 / classes, "loss": math.log(classes)}, [], True, None
    else:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            final = _measure(model, held)
        history = [{"step": h["step"], "accuracy": h["accuracy"], "loss": h["loss"]} for h in result.history]
        diverged, seconds = False, result.seconds
    if task == "language":
        bigram = load_corpus().bigram_loss()
        reached, solved = stats.steps_to(history, "loss", bigram, above=False), final["loss"] <= bigram
    else:
        reached, solved = stats.steps_to(history, "accuracy", TARGET_ACCURACY), final["accuracy"] >= SOLVED
    return {
        "task": task,
        "phase": phase,
        "heads": heads,
        "seed": seed,
        "lr": lr,
        **final,
        "steps_to_target": reached,
        "solved": bool(solved),
        "diverged": diverged,
        "parameters": model.num_parameters(),
        "seconds": seconds if seconds is not None else time.perf_counter() - start,
        "history": history,
    }


def _run_job(job: tuple, setup: HeadsSetup, num_threads: int | None) -> dict:
    task, heads, seed, lr, phase = job
    return run_one(task, heads, seed, lr, setup, phase=phase, num_threads=num_threads)


def _run_ranks(jobs: list[tuple], setup, *, num_threads, callback, on_run, done0, total) -> list[dict]:
    """Every job, dealt across the ranks of the initialised ``torch.distributed`` group by training cost
    (:meth:`headwise.distributed.ranks.Ranks.map`); each rank trains its share, then every rank gets every result (one
    all-gather of their JSON); results in ``jobs`` order. ``on_run`` is called for this rank's runs."""
    from headwise.distributed.ranks import ranks

    done = 0

    def one(job: tuple) -> dict:
        task, heads, seed, lr, phase = job
        return run_one(task, heads, seed, lr, setup, phase=phase, callback=callback, num_threads=num_threads)

    def finished(_, run: dict) -> None:
        nonlocal done
        done += 1
        if on_run is not None:
            on_run(run, done0 + done, total)

    with ranks(alone=True) as r:
        return r.map(jobs, lambda job: setup.budget(job[0]).steps * _cost(job[0]), one, done=finished)


def _run_all(jobs: list[tuple], setup, *, workers, num_threads, callback, on_run, done0, total) -> list[dict]:
    """Every job, serially, ``workers`` at a time in spawned processes, or (``workers="ranks"``) across the ranks of
    a ``torch.distributed`` launch; results in ``jobs`` order."""
    if workers == "ranks":
        return _run_ranks(jobs, setup, num_threads=num_threads, callback=callback, on_run=on_run, done0=done0,
                          total=total)  # fmt: skip
    if workers == 1:
        out = []
        for job in jobs:
            task, heads, seed, lr, phase = job
            out.append(run_one(task, heads, seed, lr, setup, phase=phase, callback=callback, num_threads=num_threads))
            if on_run is not None:
                on_run(out[-1], done0 + len(out), total)
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: dict[int, dict] = {}
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        # the longest runs first, so that the two workers finish together
        order = sorted(range(len(jobs)), key=lambda i: -setup.budget(jobs[i][0]).steps * _cost(jobs[i][0]))
        futures = {pool.submit(_run_job, jobs[i], setup, num_threads): i for i in order}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            if on_run is not None:
                on_run(results[futures[future]], done0 + len(results), total)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [results[i] for i in range(len(jobs))]


def _cost(task: str) -> float:
    """Relative cost of one step (tokens × width²)."""
    b = BUDGETS[task]
    return b.batch_size * b.length * b.d_model**2


def run_heads_vs_one(
    setup: HeadsSetup = HeadsSetup(),  # noqa: B008 - a frozen dataclass
    *,
    on_run: Callable[[dict, int, int], None] | None = None,
    callback=None,
    num_threads: int | None = 1,
    workers: int | str = 1,
) -> dict:
    """The sweep on the tuning seeds, then every (task, H, evaluation seed) at its H's learning rate, then
    the table, the comparisons and the verdict.

    Args:
        on_run: called after each run (tuning runs included) with ``(run, done, total)``.
        callback: the trainer's per-step callback, passed to every run (only with ``workers=1``).
        num_threads: torch threads per run.
        workers: runs trained at once, each in its own process (``spawn``); 2 uses both cores of a
            2-core machine; ``"ranks"``: the runs dealt across the ranks of an initialised ``torch.distributed``
            group (``torchrun``: one process a rank, on one machine or many), every rank returning the whole
            result. The results do not depend on it (each run is seeded on its own).
    Returns:
        ``{"experiment", "setup", "budgets", "baselines", "parameters", "sweep", "tuning_runs", "runs",
        "table", "comparison", "verdict", "seconds", "wall_seconds"}``; ``runs`` in (task, H, seed) order.
    """
    if workers == "ranks":
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError("workers: 'ranks' expects an initialised torch.distributed group (launch with torchrun)")
    else:
        checks.positive_int("workers", workers)
    start = time.perf_counter()
    tune_jobs = [
        (task, h, TUNING_SEED + s, lr, "tune")
        for task in setup.tasks
        for h in setup.heads
        for lr in setup.budget(task).lrs
        for s in range(setup.tuning_seeds)
    ]
    total = len(tune_jobs) + len(setup.tasks) * len(setup.heads) * setup.seeds
    common = dict(workers=workers, num_threads=num_threads, callback=callback, on_run=on_run, total=total)
    tuning = _run_all(tune_jobs, setup, done0=0, **common)
    chosen = sweep_choice(tuning, setup)
    eval_jobs = [
        (task, h, seed, chosen[task][h]["lr"], "eval")
        for task in setup.tasks
        for h in setup.heads
        for seed in range(setup.seeds)
    ]
    runs = _run_all(eval_jobs, setup, done0=len(tuning), **common)
    table = summarise(runs, setup)
    comparison = compare(table, setup)
    params = {task: sorted({r["parameters"] for r in runs if r["task"] == task}) for task in setup.tasks}
    return {
        "experiment": "heads-vs-one",
        "setup": asdict(setup),
        "budgets": {task: asdict(setup.budget(task)) for task in setup.tasks},
        "baselines": {task: baselines(task) for task in setup.tasks},
        "parameters": {task: p[0] if len(p) == 1 else p for task, p in params.items()},
        "sweep": {task: {str(h): v for h, v in by.items()} for task, by in chosen.items()},
        "tuning_runs": [{k: v for k, v in r.items() if k != "history"} for r in tuning],
        "runs": runs,
        "table": {task: {str(h): s for h, s in t.items()} for task, t in table.items()},
        "comparison": comparison,
        "verdict": verdict(table, comparison),
        "seconds": sum(r["seconds"] for r in tuning + runs),
        "wall_seconds": time.perf_counter() - start,
    }
