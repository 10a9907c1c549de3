"""The positional-encoding heatmap: positions down the side, dimensions along the bottom.

The first article's Figure 2 ("Positional encoding heatmap (50 positions × 64 dimensions)"): the
left columns flicker from row to row (fast frequencies), the right ones drift slowly.
matplotlib is imported inside the function.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from headwise.viz._files import HeatmapFile, save_figure

__all__ = ["plot_positional_encoding"]


def plot_positional_encoding(
    table,
    path: str | os.PathLike,
    *,
    title: str | None = None,
    figsize: tuple[float, float] = (8.0, 5.0),
    dpi: int = 100,
) -> HeatmapFile:
    """Write a heatmap of a positions × dimensions table (e.g. ``headwise.sinusoidal_table(50, 64)``).

    Args:
        table: ``(P, D)`` array-like, P positions and D dimensions. Sinusoidal values lie in [-1, 1]; the
            colour scale is symmetric around 0 and covers ``max(1, max |value|)``.
        path: the picture (.png, .svg or .pdf); its folder must exist. Written atomically.
        title: default ``"Positional encoding (P positions × D dimensions)"``.
        figsize: inches; the picture is ``figsize · dpi`` pixels.
        dpi: dots per inch.
    Returns:
        A :class:`~headwise.viz._files.HeatmapFile`.
    Raises:
        ValueError: ``table`` is not a non-empty finite 2-D array, or an unsupported suffix.
        OSError: the folder cannot be written.
    """
    from matplotlib.figure import Figure

    pe = np.asarray(table, dtype=np.float64)
    if pe.ndim != 2 or 0 in pe.shape:
        raise ValueError(f"table: expected a non-empty (positions, dimensions) array, got shape {pe.shape}")
    if not np.all(np.isfinite(pe)):
        raise ValueError("table: expected finite values, got NaN or inf")
    P, D = pe.shape
    limit = max(1.0, float(np.abs(pe).max()))
    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(pe, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(title or f"Positional encoding ({P} positions × {D} dimensions)")
    fig.colorbar(image, ax=ax, label="value")
    out = save_figure(fig, Path(path), dpi=dpi)
    return HeatmapFile(out, round(figsize[0] * dpi), round(figsize[1] * dpi))
