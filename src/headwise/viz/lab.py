"""The lab's pictures: training curves with head scores, heads against one (its pruning curves are
:func:`headwise.viz.pruning.plot_pruning`, as ``headwise heads --importance`` draws them).

matplotlib is imported inside each function; every file is written atomically (``save_figure``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from headwise.viz._files import HeatmapFile, save_figure

__all__ = ["plot_training", "plot_heads_vs_one"]


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
    results: dict[str, dict[int, list[float]]],
    path: str | os.PathLike,
    *,
    metric: str = "accuracy",
    title: str = "One head against many, equal width and parameters",
    figsize: tuple[float, float] = (9.0, 4.0),
    dpi: int = 100,
) -> HeatmapFile:
    """Per task, the metric of every seed (dots) and its mean (bar) for each head count.

    Args:
        results: task -> head count -> the metric of each seed.
    """
    from matplotlib.figure import Figure

    if not results:
        raise ValueError("results: expected at least one task, got none")
    fig = Figure(figsize=figsize, layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(results)))
    for ax, (task, by_heads) in zip(axes, results.items()):
        heads = sorted(by_heads)
        x = np.arange(len(heads))
        means = [float(np.mean(by_heads[h])) for h in heads]
        ax.bar(x, means, color="#9ecae1", label="mean")
        for i, h in enumerate(heads):
            vals = by_heads[h]
            ax.scatter(np.full(len(vals), x[i]) + np.linspace(-0.15, 0.15, len(vals)), vals, color="k", s=12, zorder=3)
        ax.set_xticks(x, [str(h) for h in heads])
        ax.set(xlabel="heads (H)", ylabel=metric, title=task, ylim=(0, 1.02))
    fig.suptitle(title)
    return _picture(fig, path, figsize, dpi)
