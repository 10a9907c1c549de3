"""``roles.png``: one layer × head heatmap per metric, the role map, and the MDS map of the heads.

Shape legend: NL layers, H heads per layer, N = NL · H.

The per-metric panels show what Clark et al. 2019 plot per layer (their Figures 2 and 4: attention to
[CLS], [SEP] and punctuation, entropies) as a grid with layers down and heads across, each cell written
out. The last two panels are the role labels (:mod:`headwise.analysis.roles`) and the heads placed by
classical MDS of their Jensen–Shannon distances, coloured by layer (their Figure 6).
"""

from __future__ import annotations

import os

import numpy as np

from headwise.viz._files import HeatmapFile, save_figure

__all__ = ["CELL_TEXT_UP_TO", "ROLE_PANELS", "DECODER_PANELS", "plot_role_maps"]

#: Most heads whose values are written in their cells (a 12 × 12 model; beyond, heads.csv holds the numbers and
#: thousands of cell texts would dominate the drawing time).
CELL_TEXT_UP_TO = 144
#: Most layers numbered one by one down a panel (beyond, every k-th so that at most this many are).
LAYER_TICKS_UP_TO = 16
#: (metric, panel title, colour scale maximum or None for the data's maximum).
ROLE_PANELS = (
    ("cls", "attention to [CLS]", 1.0),
    ("sep", "attention to [SEP]", 1.0),
    ("punct", "attention to . and ,", 1.0),
    ("self", "attention to self", 1.0),
    ("prev", "attention to previous token", 1.0),
    ("next", "attention to next token", 1.0),
    ("entropy", "entropy (nats)", None),
    ("entropy_cls", "entropy of [CLS] row (nats)", None),
    ("distance", "mean distance |i−j| (tokens)", None),
    ("confidence", "confidence (mean max weight)", 1.0),
)
#: The panels of a decoder's report (:class:`~headwise.analysis.DecoderReport`).
DECODER_PANELS = (
    ("prev", "attention to previous token", 1.0),
    ("first", "attention to first token (BOS sink)", 1.0),
    ("duplicate_probe", "duplicate-token score (probe)", 1.0),
    ("induction_probe", "induction score (probe)", 1.0),
    ("self", "attention to self", 1.0),
    ("induction", "induction score (text)", 1.0),
    ("entropy", "entropy (nats)", None),
    ("entropy_ratio_causal", "entropy / ln(keys it may see)", 1.0),
    ("distance", "mean distance |i−j| (tokens)", None),
    ("confidence", "confidence (mean max weight)", 1.0),
)


def _ticks(ax, nl: int, h: int) -> None:
    """Head numbers across; layer numbers down, every one up to :data:`LAYER_TICKS_UP_TO` layers, else evenly
    spaced (every tick is an artist: 30 layers × 11 panels of them took most of a second)."""
    ax.set_xticks(range(h), [str(x) for x in range(h)], fontsize=6)
    step = 1 if nl <= LAYER_TICKS_UP_TO else -(-nl // LAYER_TICKS_UP_TO)
    ax.set_yticks(range(0, nl, step), [str(x) for x in range(0, nl, step)], fontsize=6)


def _heatmap(fig, ax, values: np.ndarray, title: str, vmax: float | None) -> None:
    v = np.asarray(values, dtype=np.float64)
    top = vmax if vmax is not None else (float(np.nanmax(v)) if np.isfinite(v).any() else 1.0)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    image = ScalarMappable(norm=Normalize(0.0, top or 1.0), cmap="magma")
    # coloured here: RGBA bytes resample several times faster than floats through a colour map (NaN: clear)
    ax.imshow(image.to_rgba(v, bytes=True), aspect="auto", interpolation="nearest")
    ax.set_title(title, fontsize=9)
    nl, h = v.shape
    _ticks(ax, nl, h)
    ax.set_xlabel("head", fontsize=7)
    ax.set_ylabel("layer", fontsize=7)
    if nl * h <= CELL_TEXT_UP_TO:
        size = 5 if h <= 12 else 4
        for i in range(nl):
            for j in range(h):
                x = v[i, j]
                text = "–" if not np.isfinite(x) else (f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}")
                dark = np.isfinite(x) and x > 0.6 * (top or 1.0)
                ax.text(j, i, text, ha="center", va="center", fontsize=size, color="black" if dark else "white")
    fig.colorbar(image, ax=ax, shrink=0.8)


def plot_role_maps(report, path: str | os.PathLike, *, title: str | None = None, dpi: int = 100) -> HeatmapFile:
    """Write the per-metric layer × head heatmaps of a :class:`~headwise.analysis.HeadReport`.

    An encoder's report gets the :data:`ROLE_PANELS`, a decoder's (no ``cls`` metric) the :data:`DECODER_PANELS`.

    Args:
        report: the corpus (or sentence) report.
        path: the picture (.png, .svg, .pdf); its folder must exist. Written atomically.
        title: a title over the figure.
        dpi: dots per inch.
    Returns:
        :class:`~headwise.viz._files.HeatmapFile`.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from headwise.analysis.roles import ROLES

    nl, h = report.num_layers, report.num_heads
    chosen = ROLE_PANELS if "cls" in report.metrics else DECODER_PANELS
    cols = 4
    panels = len(chosen) + 2
    rows = -(-panels // cols)
    cell_w = max(3.2, 0.32 * h + 0.9)
    cell_h = max(2.4, 0.32 * nl + 1.0) + 1.0  # the panel and the gap below it
    top = 0.6 if title else 0.3  # inches above the first row's panel titles
    figsize = (cols * cell_w, rows * cell_h + top)
    fig = Figure(figsize=figsize)
    # fixed margins: constrained layout measured every one of the figure's texts twice (seconds for 30 × 9 heads)
    # between rows: the row above's tick labels and axis label, the role map's legend, this row's titles (inches)
    gap, bottom = 1.5, 1.3
    axes_h = (figsize[1] - top - bottom - (rows - 1) * gap) / rows
    fig.subplots_adjust(
        left=0.55 / figsize[0], right=1 - 0.6 / figsize[0], bottom=bottom / figsize[1], top=1 - top / figsize[1],
        wspace=0.45, hspace=gap / axes_h,
    )  # fmt: skip
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (metric, label, vmax) in zip(axes, chosen):
        _heatmap(fig, ax, report.metrics[metric], label, vmax)

    # Role map: a categorical grid.
    ax = axes[len(chosen)]
    palette = colormaps["tab10"]
    index = {r: k for k, r in enumerate(ROLES)}
    codes = np.vectorize(index.get)(report.roles)
    colours = np.array([palette(k % 10) for k in range(len(ROLES))])
    ax.imshow(np.rint(colours[codes] * 255).astype(np.uint8), aspect="auto", interpolation="nearest")  # RGBA bytes
    ax.set_title("role (thresholds in headwise.analysis.roles)", fontsize=9)
    _ticks(ax, nl, h)
    ax.set_xlabel("head", fontsize=7)
    ax.set_ylabel("layer", fontsize=7)
    present = [r for r in ROLES if (report.roles == r).any()]
    ax.legend(
        handles=[Patch(color=colours[index[r]], label=r) for r in present],
        fontsize=6,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.45 / axes_h),  # under the axis label
        ncol=3,
        frameon=False,
    )

    # MDS map of the heads, coloured by layer.
    ax = axes[len(chosen) + 1]
    if report.mds is not None:
        xy = report.mds
        layer_of = np.repeat(np.arange(nl), h)
        scatter = ax.scatter(xy[:, 0], xy[:, 1], c=layer_of, cmap="viridis", s=18, edgecolors="none")
        for n, (x, y) in enumerate(xy):
            ax.annotate(f"{n // h}-{n % h}", (x, y), fontsize=4, alpha=0.7, xytext=(2, 2), textcoords="offset points")
        fig.colorbar(scatter, ax=ax, shrink=0.8, label="layer")
        ax.set_title("heads by Jensen–Shannon distance (classical MDS)", fontsize=9)
        ax.tick_params(labelsize=6)
    else:
        ax.set_axis_off()
    for ax in axes[panels:]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=11, y=1 - 0.1 / figsize[1], va="top")
    out = save_figure(fig, path, dpi=dpi)
    return HeatmapFile(out, round(figsize[0] * dpi), round(figsize[1] * dpi))
