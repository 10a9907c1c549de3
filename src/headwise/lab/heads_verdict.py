"""The statistics and the verdict of the heads-vs-one experiment (:mod:`headwise.lab.heads_vs_one`): the learning
rate chosen per head count, each measure described over the evaluation seeds with bootstrap intervals, every head
count compared with one head (exact rank tests, Holm-corrected; the smallest detectable difference), the verdict in
words — and the rows and lines the command writes and prints.
"""

from __future__ import annotations

import math

import numpy as np

from headwise.lab import stats
from headwise.lab.heads_setup import ALPHA, LEARNABLE, MEASURES, HeadsSetup

__all__ = ["CSV_COLUMNS", "compare", "result_lines", "summarise", "sweep_choice", "verdict"]


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


#: The columns of ``heads_vs_one.csv`` (one row per run, tuning runs first).
CSV_COLUMNS = [
    "task", "phase", "heads", "seed", "lr", "accuracy", "loss", "steps_to_target", "solved", "diverged", "parameters",
    "seconds",
]  # fmt: skip


def result_lines(result: dict) -> list[str]:
    """What :func:`~headwise.lab.heads_vs_one.run_heads_vs_one`'s result says, for the terminal: per task its
    parameters, each head count's measure and steps to target with their intervals, and the verdict."""
    lines = []
    for task, by in result["table"].items():
        key = "loss" if task == "language" else "accuracy"
        lines.append(f"{task} ({result['parameters'][task]:,} parameters for every H):")
        for h, s in by.items():
            m, st = s[key], s["steps"]
            lines.append(
                f"  H={h}: lr {s['lr']:g}, {key} {m['mean']:.3f} [{m['ci95'][0]:.3f}, {m['ci95'][1]:.3f}], "
                f"steps to target {st['mean']:.0f} [{st['ci95'][0]:.0f}, {st['ci95'][1]:.0f}] "
                f"({s['not_reached']} never), solved {s['solved']}/{s['seeds']}"
            )
        lines.append(f"  verdict: {result['verdict'][task]['text']}")
    return lines
