"""``pruning.png`` and ``pruning.csv``: head importance, single-head ablation and the pruning curves.

Shape legend: NL layers, H heads per layer, K points of a curve.

The picture has three panels: Michel et al.'s importance of every head (layer × head heatmap), the
measured change of the objective when that head alone is removed, and the objective against the
number of heads removed — least important first by importance (Michel et al.'s order), by measured
ablation, and in random orders (mean, with the min–max band). Written atomically.
"""

from __future__ import annotations

import csv
import io
import os

import numpy as np

from headwise._io import write_text_atomic
from headwise.viz._files import HeatmapFile, save_figure

__all__ = ["pruning_csv", "write_pruning_csv", "plot_pruning"]


def pruning_csv(result) -> str:
    """One row per point of the curves: ``removed`` and the objective of every order."""
    rows = result.csv_rows()
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def write_pruning_csv(result, path: str | os.PathLike):
    """Write :func:`pruning_csv` to ``path`` atomically; returns the path."""
    return write_text_atomic(path, pruning_csv(result))


def _grid(fig, ax, values: np.ndarray, title: str, cmap: str, centred: bool) -> None:
    v = np.asarray(values, dtype=np.float64)
    top = float(np.nanmax(np.abs(v))) if np.isfinite(v).any() else 1.0
    top = top or 1.0
    image = ax.imshow(v, cmap=cmap, vmin=-top if centred else 0.0, vmax=top, aspect="auto", interpolation="nearest")
    nl, h = v.shape
    ax.set_title(title, fontsize=9)
    ax.set_xticks(range(h), [str(x) for x in range(h)], fontsize=6)
    ax.set_yticks(range(nl), [str(x) for x in range(nl)], fontsize=6)
    ax.set_xlabel("head", fontsize=7)
    ax.set_ylabel("layer", fontsize=7)
    if nl * h <= 200:
        for i in range(nl):
            for j in range(h):
                ax.text(j, i, f"{v[i, j]:.2g}", ha="center", va="center", fontsize=5, color="black")
    fig.colorbar(image, ax=ax, shrink=0.8)


def plot_pruning(result, path: str | os.PathLike, *, title: str | None = None, dpi: int = 100) -> HeatmapFile:
    """Write the importance / ablation heatmaps and the pruning curves of an
    :class:`~headwise.analysis.importance.ImportanceResult` — the one picture of ``headwise heads
    --importance`` and ``headwise lab prune``.

    Args:
        result: the result.
        path: the picture (.png, .svg, .pdf); its folder must exist.
        title: a title over the figure.
        dpi: dots per inch.
    Returns:
        :class:`~headwise.viz._files.HeatmapFile`.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    nl, h = result.importance.shape
    cell_w = max(3.4, 0.3 * h + 1.2)
    figsize = (2 * cell_w + 5.0, max(3.4, 0.3 * nl + 1.6) + (0.4 if title else 0.0))
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(1, 3, width_ratios=[cell_w, cell_w, 5.0])
    what = "|∂L/∂ξ|" if result.kind == "decoder" else "embedding turn rate"
    _grid(fig, axes[0], result.importance, f"importance ({what}, Michel et al.)", "viridis", False)
    estimate = getattr(result, "estimate", None)
    if estimate is None:
        _grid(fig, axes[1], result.ablation, "Δ objective, head removed alone", "RdBu_r", True)
    else:  # every head estimated; the measured ones framed
        _grid(fig, axes[1], estimate, "Δ objective, head removed alone (estimate; □ measured)", "RdBu_r", True)
        for flat in result.measured:
            axes[1].add_patch(Rectangle((flat % h - 0.5, flat // h - 0.5), 1, 1, fill=False, lw=0.8, ec="black"))
    ax = axes[2]
    k = result.removed
    c = result.curves
    ax.plot(k, c["importance"], label="least important first (importance)", color="C0", lw=1.6)
    if "ablation" in c:
        ax.plot(k, c["ablation"], label="least important first (measured ablation)", color="C2", lw=1.2, ls="--")
    if "estimate" in c:
        ax.plot(k, c["estimate"], label="least important first (estimated ablation)", color="C2", lw=1.2, ls="--",
                marker="o", ms=3)  # fmt: skip
    ax.plot(k, c["random_mean"], label=f"random order (mean of {len(result.random_seeds)})", color="C3", lw=1.2)
    ax.fill_between(k, c["random_min"], c["random_max"], color="C3", alpha=0.15, lw=0)
    ax.axhline(result.base_loss, color="0.5", lw=0.8, ls=":")
    ax.set_xlabel(f"heads removed (of {nl * h})", fontsize=8)
    ax.set_ylabel(result.objective, fontsize=8)
    ax.set_title("pruning curve", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    out = save_figure(fig, path, dpi=dpi)
    return HeatmapFile(out, round(figsize[0] * dpi), round(figsize[1] * dpi))
