"""``patching.png``: a layer × head map of activation patching beside one of direct logit attribution.

Shape legend: NL layers, H query heads.

Left: each head's normalised patching effect, (patched − corrupted) / (clean − corrupted) — 1 where patching
that head alone gives the clean metric, 0 where it changes nothing (denoising); for noising the same scale
reads 1 = unchanged. Right (when given): each head's direct contribution to the logit difference on the clean
input. Both centred on zero (blue below, red above). Written atomically.
"""

from __future__ import annotations

import os

import numpy as np

from headwise.viz._files import HeatmapFile, layer_head_axes, save_figure

__all__ = ["plot_patching"]


def _panel(fig, ax, values: np.ndarray, title: str, label: str) -> None:
    v = np.asarray(values, dtype=np.float64)
    top = float(np.nanmax(np.abs(v))) if np.isfinite(v).any() else 1.0
    top = top or 1.0
    image = ax.imshow(v, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto", interpolation="nearest")
    nl, h = v.shape
    ax.set_title(title, fontsize=9)
    layer_head_axes(ax, nl, h)
    if nl * h <= 300:
        for i in range(nl):
            for j in range(h):
                if np.isfinite(v[i, j]):
                    ax.text(j, i, f"{v[i, j]:.2f}", ha="center", va="center", fontsize=5, color="black")
    bar = fig.colorbar(image, ax=ax, shrink=0.8)
    bar.set_label(label, fontsize=7)


def plot_patching(
    normalised,
    path: str | os.PathLike,
    *,
    logit_attribution=None,
    title: str | None = None,
    method: str = "exact",
    direction: str = "denoise",
    dpi: int = 100,
) -> HeatmapFile:
    """Write the patching heatmap (and the direct logit attribution's, when given).

    Args:
        normalised: ``(NL, H)`` normalised patching effects (NaN: no such head).
        path: the picture (.png, .svg, .pdf); its folder must exist.
        logit_attribution: ``(NL, H)`` each head's direct contribution, or None.
        title: a title over the figure.
        method, direction: named in the panel's title.
        dpi: dots per inch.
    Returns:
        :class:`~headwise.viz._files.HeatmapFile`.
    """
    from matplotlib.figure import Figure

    normalised = np.asarray(normalised, dtype=np.float64)
    nl, h = normalised.shape
    panels = 1 if logit_attribution is None else 2
    cell_w = max(3.4, 0.45 * h + 1.6)
    height = max(3.4, 0.22 * nl + 1.6) + (0.4 if title else 0.0)
    figsize = (panels * cell_w, height)
    fig = Figure(figsize=figsize, layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, panels))
    what = "clean head into corrupted run" if direction == "denoise" else "corrupted head into clean run"
    _panel(fig, axes[0], normalised, f"{method} patching, {what}", "(patched − corrupted) / (clean − corrupted)")
    if logit_attribution is not None:
        _panel(fig, axes[1], logit_attribution, "direct logit attribution (clean input)", "logit difference")
    if title:
        fig.suptitle(title, fontsize=10)
    out = save_figure(fig, path, dpi=dpi)
    return HeatmapFile(out, round(figsize[0] * dpi), round(figsize[1] * dpi))
