"""Attention heatmaps: one panel per head, query tokens down the side, key tokens along the bottom.

Shape legend: H heads, L query length (rows), S key length (columns).

Drawn with matplotlib's object API (``matplotlib.figure.Figure`` on the Agg canvas): no pyplot, no
global backend switch, safe to call from a library. matplotlib is imported inside the functions.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from headwise.viz._files import HeatmapFile, save_figure

__all__ = ["HeatmapFile", "attention_layout", "plot_attention_heads"]

#: Most heads side by side before the panels wrap to a new row.
MAX_COLUMNS = 4
#: Largest panel side, in inches (about 20 tokens); longer texts get smaller labels.
MAX_PANEL = 10.0
#: Tokens up to which every cell is written in its panel.
ANNOTATE_UP_TO = 12


def attention_layout(num_heads: int, num_tokens: int) -> tuple[int, int, float]:
    """``(rows, columns, panel inches)`` of the grid for ``num_heads`` panels of ``num_tokens`` tokens.

    At most :data:`MAX_COLUMNS` panels per row; a panel grows with the number of tokens so that the
    labels stay legible (0.45 in per token, at least 2.8 in, at most :data:`MAX_PANEL` in, where the
    labels shrink instead).
    """
    cols = min(num_heads, MAX_COLUMNS)
    rows = math.ceil(num_heads / cols)
    panel = min(MAX_PANEL, max(2.8, 0.45 * num_tokens + 1.0))
    return rows, cols, panel


def _as_weights(weights) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 2:
        w = w[None]  # (1, L, S): a single head
    if w.ndim != 3 or 0 in w.shape:
        raise ValueError(f"weights: expected a non-empty array (H, L, S) or (L, S), got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("weights: expected finite attention weights, got NaN or inf")
    return w


def plot_attention_heads(
    weights,
    tokens: Sequence[str],
    path: str | os.PathLike,
    *,
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
    head_labels: Sequence[str] | None = None,
    dpi: int = 100,
) -> HeatmapFile:
    """Write one heatmap per head to ``path``: cell ``(i, j)`` is how much query token i attends to key token j.

    Args:
        weights: ``(H, L, S)`` (or ``(L, S)`` for one head), rows summing to 1 (a fully masked row
            may be all 0). Any array-like NumPy accepts (a CPU tensor without grad works).
        tokens: the L query tokens (row labels).
        path: the picture (.png, .svg or .pdf); its folder must exist. Written atomically.
        key_tokens: the S key tokens (column labels); default ``tokens``.
        title: a title over the whole figure.
        head_labels: H panel titles; default ``"head 0" … "head H-1"``.
        dpi: dots per inch.
    Returns:
        A :class:`HeatmapFile` with the path and the pixel size.
    Raises:
        ValueError: weights not ``(H, L, S)`` or not finite, token counts that differ from L or S,
            ``head_labels`` of the wrong length, an unsupported suffix.
        OSError: the folder cannot be written.
    """
    from matplotlib.figure import Figure

    w = _as_weights(weights)  # (H, L, S)
    H, L, S = w.shape
    tokens = [str(t) for t in tokens]
    key_tokens = tokens if key_tokens is None else [str(t) for t in key_tokens]
    if len(tokens) != L:
        raise ValueError(f"tokens: expected {L} query tokens for weights of shape {w.shape}, got {len(tokens)}")
    if len(key_tokens) != S:
        raise ValueError(f"key_tokens: expected {S} key tokens for weights of shape {w.shape}, got {len(key_tokens)}")
    labels = [f"head {h}" for h in range(H)] if head_labels is None else [str(t) for t in head_labels]
    if len(labels) != H:
        raise ValueError(f"head_labels: expected {H} labels, got {len(labels)}")

    rows, cols, panel = attention_layout(H, max(L, S))
    label_size = min(8.0, 0.8 * 72 * (panel - 1.0) / max(L, S))  # points: at most 80% of a cell's height
    top = 0.6 if title else 0.2
    figsize = (cols * panel + 1.0, rows * panel + top)  # + a colour bar column, + the title
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= H:
            ax.set_axis_off()
            continue
        image = ax.imshow(w[h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
        ax.set_title(labels[h], fontsize=10)
        ax.set_xticks(range(S), key_tokens, rotation=60, ha="right", rotation_mode="anchor", fontsize=label_size)
        ax.set_yticks(range(L), tokens, fontsize=label_size)
        if h % cols == 0:
            ax.set_ylabel("query")
        if h // cols == rows - 1 or h + cols >= H:
            ax.set_xlabel("key (attended to)")
        if max(L, S) <= ANNOTATE_UP_TO:
            for i in range(L):
                for j in range(S):
                    value = w[h, i, j]
                    ax.text(
                        j, i, f"{value:.2f}", ha="center", va="center", fontsize=6,
                        color="black" if value > 0.6 else "white", in_layout=False,  # inside the axes: no need
                    )  # fmt: skip
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    if title:
        fig.suptitle(title)
    out = save_figure(fig, path, dpi=dpi)
    return HeatmapFile(out, round(figsize[0] * dpi), round(figsize[1] * dpi))
