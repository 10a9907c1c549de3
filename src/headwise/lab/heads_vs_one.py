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

Shape legend: B batch, L sequence length, V vocabulary (= number of classes), D width, H heads.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from headwise import checks
from headwise.lab import stats
from headwise.lab.char_lm import load_corpus
from headwise.lab.tasks import RELATIONS, relation_classes, relation_task
from headwise.lab.trainer import TrainConfig, masked_loss, train
from headwise.models.transformer_lm import LMConfig, TransformerLM

__all__ = [
    "BUDGETS",
    "DEFAULT_TASKS",
    "HEAD_COUNTS",
    "HeadsSetup",
    "LEARNABLE",
    "SOLVED",
    "TASKS",
    "TaskBudget",
    "run_heads_vs_one",
    "run_one",
    "summarise",
    "verdict",
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


def sweep_choice(tuning: list[dict], setup: HeadsSetup) -> dict:
    """Per task and H, the learning rate with the lowest mean final validation loss over the tuning seeds
    (ties: the smaller rate): ``{task: {H: {"lr", "validation_loss": {lr: mean}}}}``."""
    out: dict = {}
    for task in setup.tasks:
        out[task] = {}
        for h in setup.heads:
            losses = {}
            for lr in setup.budget(task).lrs:
                mine = [r["loss"] for r in tuning if r["task"] == task and r["heads"] == h and r["lr"] == lr]
                if mine:
                    losses[lr] = float(np.mean(mine))
            best = min(sorted(losses), key=lambda lr: losses[lr])
            out[task][h] = {"lr": best, "validation_loss": {str(lr): v for lr, v in losses.items()}}
    return out


def _measure_values(runs: list[dict], measure: str, steps: int) -> list[float]:
    if measure == "steps":  # never reached: counted as the budget (a lower bound on the true value)
        return [float(r["steps_to_target"] if r["steps_to_target"] is not None else steps) for r in runs]
    return [r[measure] for r in runs]


def _describe(values: list[float], seed: int) -> dict:
    a = np.asarray(values, dtype=np.float64)
    lo, hi = stats.bootstrap_ci(values, seed=seed)
    return {
        "mean": float(a.mean()),
        "ci95": [lo, hi],
        "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
        "min": float(a.min()),
        "max": float(a.max()),
        "values": [float(v) for v in a],
    }


def summarise(runs: list[dict], setup: HeadsSetup) -> dict:
    """Per task and head count: every measure's mean, bootstrap interval, spread and values; solved and
    censored counts (``{task: {H: {...}}}``)."""
    table: dict = {}
    for task in setup.tasks:
        steps = setup.budget(task).steps
        table[task] = {}
        for h in setup.heads:
            mine = [r for r in runs if r["task"] == task and r["heads"] == h]
            if not mine:
                continue
            row = {m: _describe(_measure_values(mine, m, steps), seed=h) for m in MEASURES}
            row["solved"] = sum(r["solved"] for r in mine)
            row["not_reached"] = sum(r["steps_to_target"] is None for r in mine)
            row["seeds"] = len(mine)
            row["lr"] = mine[0]["lr"]
            table[task][h] = row
    return table


def _better(measure: str, diff: float) -> bool:
    """Whether a difference (H minus the reference) favours H."""
    return diff > 0 if measure == "accuracy" else diff < 0


def compare(table: dict, setup: HeadsSetup) -> dict:
    """Per task: whether it is learnable, every H against the reference (one head, else the smallest H) on
    every measure (difference of means, its bootstrap interval, the rank test's p-value, Holm-adjusted
    over the task's comparisons), and the smallest difference the design detects per measure."""
    out = {}
    for task, by_heads in table.items():
        if not by_heads:
            continue
        n = min(r["seeds"] for r in by_heads.values())
        best = max(by_heads, key=lambda h: (by_heads[h]["solved"], -by_heads[h]["loss"]["mean"]))
        need = math.ceil(LEARNABLE * by_heads[best]["seeds"] - 1e-9)
        learnable = by_heads[best]["solved"] >= need
        ref = 1 if 1 in by_heads else min(by_heads)
        rows = []
        for h in sorted(by_heads):
            if h == ref:
                continue
            for m in MEASURES:
                a, b = by_heads[h][m]["values"], by_heads[ref][m]["values"]
                diff = float(np.mean(a) - np.mean(b))
                rows.append(
                    {
                        "heads": h,
                        "measure": m,
                        "difference": diff,
                        "ci95": list(stats.bootstrap_diff_ci(a, b, seed=h)),
                        "p": stats.rank_test(a, b),
                    }
                )
        for row, p in zip(rows, stats.holm([r["p"] for r in rows]) if rows else []):
            row["p_holm"] = p
            lo, hi = row["ci95"]
            row["significant"] = p < ALPHA and (lo > 0 or hi < 0)
            row["favours"] = (
                ("more heads" if _better(row["measure"], row["difference"]) else "reference")
                if row["significant"]
                else None
            )
        k = max(1, len(rows))
        detectable = {}
        for m in MEASURES:
            sd = math.sqrt(float(np.mean([by_heads[h][m]["std"] ** 2 for h in by_heads])))
            detectable[m] = stats.detectable_difference(sd, n, alpha=ALPHA / k)
        out[task] = {
            "learnable": learnable,
            "best_heads": best,
            "best_solved": by_heads[best]["solved"],
            "needed": need,
            "reference": ref,
            "comparisons": rows,
            "detectable": detectable,
        }
    return out


_UNITS = {"accuracy": "{:+.3f}", "loss": "{:+.3f} nats", "steps": "{:+.0f} steps"}


def verdict(table: dict, comparison: dict) -> dict[str, dict]:
    """Per task ``{"outcome", "text"}``, written from the numbers. ``outcome`` is one of ``"void"`` (the best
    H did not solve the task in enough seeds: nothing is compared), ``"more heads better"``, ``"one head
    better"`` (the reference), ``"mixed"``, ``"no detectable difference"``."""
    out = {}
    for task, c in comparison.items():
        by_heads = table[task]
        ref = c["reference"]
        name = "one head" if ref == 1 else f"{ref} heads"
        if not c["learnable"]:
            out[task] = {
                "outcome": "void",
                "text": f"void: the best head count (H={c['best_heads']}) solved {task} in {c['best_solved']} of "
                f"{by_heads[c['best_heads']]['seeds']} seeds, fewer than the {c['needed']} needed — models that "
                "did not learn the task cannot say whether heads help",
            }
            continue
        wins = [r for r in c["comparisons"] if r["favours"] == "more heads"]
        losses = [r for r in c["comparisons"] if r["favours"] == "reference"]
        outcome = "mixed" if wins and losses else "more heads better" if wins else f"{name} better" if losses else None
        detect = ", ".join(
            f"{_UNITS[m].format(v).lstrip('+')} {m}" if m != "steps" else f"{v:.0f} steps"
            for m, v in c["detectable"].items()
        )

        def said(r):
            lo, hi = r["ci95"]
            fmt = _UNITS[r["measure"]]
            return (
                f"H={r['heads']} {r['measure']} {fmt.format(r['difference'])} "
                f"[{fmt.format(lo)}, {fmt.format(hi)}] (p={r['p_holm']:.2g})"
            )

        best = c["best_heads"]
        head = f"learnable (H={best} solved {c['best_solved']}/{by_heads[best]['seeds']}); against {name}: "
        if outcome is None:
            text = head + f"no difference detectable; the design detects about {detect} (80% power, α {ALPHA} Holm)"
            outcome = "no detectable difference"
        else:
            parts = [said(r) for r in wins + losses]
            text = head + f"{outcome}: " + "; ".join(parts)
        out[task] = {"outcome": outcome, "text": text}
    return out


def run_heads_vs_one(
    setup: HeadsSetup = HeadsSetup(),
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
