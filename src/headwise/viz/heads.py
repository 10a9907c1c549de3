"""``heads.png``: a layer × head grid of one sentence's attention heatmaps (the whole model at a glance).

Shape legend: NL layers, H heads per layer, n tokens of the sentence.

Each panel is one head: cell ``(i, j)`` is how much query token i attends to key token j, on one shared
colour scale [0, 1]. Token labels are written when the sentence is short enough to read them (at most
:data:`LABEL_UP_TO` tokens: on the first column and the last row). Drawn with matplotlib's object API
on the Agg canvas; written atomically.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from headwise.viz._files import HeatmapFile, save_figure

__all__ = ["LABEL_UP_TO", "plot_head_grid"]

#: Longest sentence whose tokens label the panels.
LABEL_UP_TO = 24
#: Layout, in points or (``_EDGE``, ``_GAP``) inches: the figure title's size, a text line's height per
#: point of font size, the pad between a panel and its title, the margin at the top, the gap between
#: the figure's title and the first row's panel titles.
_TITLE_SIZE, _LINE, _TITLE_PAD, _EDGE, _GAP = 10, 1.3, 6, 0.08, 0.1


def plot_head_grid(
    attentions,
    tokens: Sequence[str],
    path: str | os.PathLike,
    *,
    layers: Sequence[int] | None = None,
    roles=None,
    title: str | None = None,
    dpi: int = 100,
) -> HeatmapFile:
    """Write a grid of heatmaps, one row per layer and one column per head.

    Args:
        attentions: ``(NL, H, n, n)`` weights of one sentence (real tokens only), or a sequence of NL
            arrays ``(H, n, n)`` (or ``(1, H, n, n)``).
        tokens: the n tokens.
        path: the picture (.png, .svg, .pdf); its folder must exist.
        layers: the layer numbers to draw (default all); e.g. ``[3]`` for ``--layer 3``.
        roles: optional ``(NL, H)`` role labels written under each panel's title.
        title: a title over the figure.
        dpi: dots per inch.
    Returns:
        :class:`~headwise.viz._files.HeatmapFile`.
    Raises:
        ValueError: maps that are not ``(NL, H, n, n)``, a token count other than n, a layer out of range.
    """
    from matplotlib.figure import Figure

    a = np.asarray([np.asarray(x, dtype=np.float32).reshape(np.shape(x)[-3:]) for x in attentions])
    if a.ndim != 4 or a.shape[-1] != a.shape[-2] or 0 in a.shape:
        raise ValueError(f"attentions: expected shape (NL, H, n, n), got {a.shape}")
    num_layers, num_heads, n, _ = a.shape
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"tokens: expected {n} tokens for maps of shape {a.shape}, got {len(tokens)}")
    layers = list(range(num_layers)) if layers is None else [int(x) for x in layers]
    bad = [x for x in layers if not 0 <= x < num_layers]
    if bad or not layers:
        raise ValueError(f"layers: expected layer numbers in 0 … {num_layers - 1}, got {layers}")
    label = n <= LABEL_UP_TO
    panel = 1.25 if len(layers) > 1 else max(1.6, min(3.2, 0.12 * n + 1.0))
    extra = 1.2 if label else 0.3
    # Fixed margins (constrained layout costs seconds with 72 panels), in inches: above the first row
    # go its panel titles (one or two lines and matplotlib's 6 pt pad), then a gap, then the figure's
    # title, so the two never meet.
    head_fontsize = 6 if roles is not None else 7
    head_titles = ((2 if roles is not None else 1) * head_fontsize * _LINE + _TITLE_PAD) / 72
    above = _EDGE + head_titles + ((_TITLE_SIZE * _LINE) / 72 + _GAP if title else 0.0)
    figsize = (num_heads * panel + extra + 0.8, len(layers) * (panel + 0.25) + extra + above - 0.2)
    fig = Figure(figsize=figsize)
    left = (1.0 if label else 0.2) / figsize[0]
    bottom = (1.0 if label else 0.2) / figsize[1]
    fig.subplots_adjust(
        left=left, right=1 - 0.9 / figsize[0], bottom=bottom, top=1 - above / figsize[1],
        wspace=0.15, hspace=0.45 if roles is not None else 0.3,
    )  # fmt: skip
    axes = fig.subplots(len(layers), num_heads, squeeze=False)
    image = None
    for r, layer in enumerate(layers):
        for h in range(num_heads):
            ax = axes[r][h]
            image = ax.imshow(a[layer, h], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            head_title = f"L{layer} H{h}"
            if roles is not None:
                head_title += f"\n{roles[layer][h]}"
            ax.set_title(head_title, fontsize=head_fontsize, pad=_TITLE_PAD)
            ax.set_xticks([])
            ax.set_yticks([])
            if label and h == 0:
                ax.set_yticks(range(n), tokens, fontsize=max(3, 7 - n // 6))
            if label and r == len(layers) - 1:
                ax.set_xticks(range(n), tokens, rotation=90, fontsize=max(3, 7 - n // 6))
    cax = fig.add_axes((1 - 0.75 / figsize[0], 0.25, 0.15 / figsize[0], 0.5))
    fig.colorbar(image, cax=cax, label="attention weight")
    if title:
        fig.suptitle(title, fontsize=_TITLE_SIZE, y=1 - _EDGE / figsize[1], va="top")
    out = save_figure(fig, path, dpi=dpi)
    return HeatmapFile(out, round(figsize[0] * dpi), round(figsize[1] * dpi))
