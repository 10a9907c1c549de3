"""The lab's pictures: training curves with head scores; one head against many (measures per head count
and learning curves); circuit methods scored against known circuits (``circuits.png``). Its pruning curves are
:func:`headwise.viz.pruning.plot_pruning`, as ``headwise heads --importance`` draws them.

matplotlib is imported inside each function; every file is written atomically (``save_figure``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from headwise.viz._files import HeatmapFile, save_figure

__all__ = ["plot_training", "plot_heads_vs_one", "plot_circuit_suite"]


def _picture(fig, path, figsize, dpi) -> HeatmapFile:
    out = save_figure(fig, Path(path), dpi=dpi)
    return HeatmapFile(out, round(figsize[0] * dpi), round(figsize[1] * dpi))


def plot_training(
    history: list[dict],
    path: str | os.PathLike,
    *,
    ln_v: float,
    bound: float,
    title: str = "Induction: training",
    figsize: tuple[float, float] = (11.0, 4.2),
    dpi: int = 100,
) -> HeatmapFile:
    """Losses and every head's previous-token and induction scores against the step.

    Args:
        history: dicts with ``step``, ``loss_repeated``, ``loss_unrepeated``, ``train_loss`` and
            ``scores = {"prev": [[…H] …N], "induction": …}`` (``headwise.lab.induction`` records them).
        path: the picture (.png, .svg, .pdf).
        ln_v: ln V, drawn as the loss of a uniform guess.
        bound: the target as a fraction of ln V (drawn as a line).
    Raises:
        ValueError: an empty history.
    """
    from matplotlib.figure import Figure

    if not history:
        raise ValueError("history: expected at least one evaluation, got none")
    steps = np.array([h["step"] for h in history])
    fig = Figure(figsize=figsize, layout="constrained")
    ax_loss, ax_prev, ax_ind = fig.subplots(1, 3)
    ax_loss.plot(steps, [h["loss_unrepeated"] for h in history], label="unrepeated tokens (held out)")
    ax_loss.plot(steps, [h["loss_repeated"] for h in history], label="second copy (held out)")
    ax_loss.plot(steps, [h["train_loss"] for h in history], label="training loss", alpha=0.6)
    ax_loss.axhline(ln_v, color="grey", lw=0.8, ls=":", label="ln V (uniform)")
    ax_loss.axhline(bound * ln_v, color="red", lw=0.8, ls="--", label=f"target {bound} · ln V")
    ax_loss.set(xlabel="step", ylabel="loss (nats)", title="loss")
    ax_loss.legend(fontsize=7)
    for ax, key, name in ((ax_prev, "prev", "previous-token score"), (ax_ind, "induction", "induction score")):
        scores = np.array([h["scores"][key] for h in history])  # (T, N, H)
        for n in range(scores.shape[1]):
            for h in range(scores.shape[2]):
                ax.plot(steps, scores[:, n, h], ls="-" if n == scores.shape[1] - 1 else "--", label=f"L{n}H{h}")
        ax.set(xlabel="step", ylabel=name, title=f"{name} per head", ylim=(-0.02, 1.02))
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(title)
    return _picture(fig, path, figsize, dpi)


def plot_heads_vs_one(
    result: dict,
    path: str | os.PathLike,
    *,
    title: str = "One head against many, equal width and parameters",
    dpi: int = 100,
) -> HeatmapFile:
    """One row per task: the final measure of every seed (dots) with its mean and 95% bootstrap interval
    per head count (accuracy; test loss for the language task), the steps to the target likewise, and
    the learning curves (mean over seeds per head count, the band from the lowest to the highest seed).

    Args:
        result: :func:`headwise.lab.heads_vs_one.run_heads_vs_one`'s result (``table``, ``runs``,
            ``baselines``, ``budgets``, ``verdict``).
    Raises:
        ValueError: no task in ``result``.
    """
    from matplotlib.figure import Figure

    table = result["table"]
    if not table:
        raise ValueError("result: expected at least one task, got none")
    figsize = (13.0, 3.4 * len(table))
    fig = Figure(figsize=figsize, layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(table), 3))
    colours = {}
    for row, (task, by_heads) in zip(axes, table.items()):
        heads = sorted(by_heads, key=int)
        x = np.arange(len(heads))
        language = task == "language"
        measure = "loss" if language else "accuracy"
        outcome = result["verdict"][task]["outcome"]
        for ax, key, label in ((row[0], measure, f"test {measure}"), (row[1], "steps", "steps to target")):
            for i, h in enumerate(heads):
                s = by_heads[h][key]
                vals = s["values"]
                ax.scatter(
                    np.full(len(vals), x[i]) + np.linspace(-0.18, 0.18, len(vals)), vals, color="k", s=9, zorder=3
                )
                lo, hi = s["ci95"]
                ax.errorbar(
                    x[i] + 0.3, s["mean"], yerr=[[s["mean"] - lo], [hi - s["mean"]]], fmt="o", color="C3", capsize=3
                )
            ax.set_xticks(x, heads)
            ax.set(xlabel="heads (H)", ylabel=label, title=f"{task}: {label} ({outcome})")
        base = result["baselines"][task]
        if language:
            row[0].axhline(base["bigram_loss"], color="grey", ls="--", lw=0.8, label="bigram model")
            row[0].legend(fontsize=7)
        else:
            row[0].axhline(0.95, color="grey", ls="--", lw=0.8)
            row[0].set_ylim(-0.02, 1.02)
        row[1].axhline(result["budgets"][task]["steps"], color="grey", ls=":", lw=0.8)
        ax = row[2]
        for h in heads:
            curves = [r["history"] for r in result["runs"] if r["task"] == task and str(r["heads"]) == h]
            steps = [p["step"] for p in curves[0]]
            values = np.array([[p[measure] for p in c] for c in curves])  # (seeds, T)
            colour = colours.setdefault(h, f"C{len(colours)}")
            ax.plot(steps, values.mean(0), color=colour, label=f"H={h}")
            ax.fill_between(steps, values.min(0), values.max(0), color=colour, alpha=0.15)
        if language:
            ax.axhline(base["bigram_loss"], color="grey", ls="--", lw=0.8)
        ax.set(xlabel="step", ylabel=f"probe {measure}", title=f"{task}: learning curves (mean, min–max)")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _picture(fig, path, figsize, dpi)


def plot_circuit_suite(
    result: dict,
    path: str | os.PathLike,
    *,
    title: str = "Circuit methods against circuits known by construction",
    dpi: int = 100,
) -> HeatmapFile:
    """Three panels — AUROC of recovering the known edges, MIB's CPR (higher is better) and CMD (lower is better) —
    with one group of bars per task and one bar per method; a task whose known circuit was not confirmed is marked
    so under its name, its bars hatched.

    Args:
        result: :func:`headwise.lab.circuit_suite.run_suite`'s result (``methods``, ``tasks``).
    Raises:
        ValueError: no task in ``result``.
    """
    from matplotlib.figure import Figure

    tasks = result["tasks"]
    if not tasks:
        raise ValueError("result: expected at least one task, got none")
    methods = result["methods"]
    figsize = (max(9.0, 2.2 * len(tasks) + 4.0), 4.4)
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(1, 3)
    x = np.arange(len(tasks))
    width = 0.8 / max(1, len(methods))
    labels = [name if r["confirmation"]["confirmed"] else f"{name}\n(NOT CONFIRMED)" for name, r in tasks.items()]
    for ax, key, name in zip(axes, ("auroc", "cpr", "cmd"), ("AUROC (known edges)", "CPR ↑", "CMD ↓")):
        for i, method in enumerate(methods):
            values = [r["methods"].get(method, {}).get(key) for r in tasks.values()]
            values = [np.nan if v is None else v for v in values]
            bars = ax.bar(x + (i - (len(methods) - 1) / 2) * width, values, width, label=method, color=f"C{i}")
            for bar, r in zip(bars, tasks.values()):
                if not r["confirmation"]["confirmed"]:
                    bar.set_hatch("//")
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_title(name)
        if key == "auroc":
            ax.set_ylim(0, 1.05)
            ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title} (seed {result.get('seed', '?')})")
    return _picture(fig, path, figsize, dpi)
