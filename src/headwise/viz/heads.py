"""``heads.png``: a layer × head grid of one sentence's attention heatmaps (the whole model at a glance).

Shape legend: NL layers, H heads per layer, n tokens of the sentence.

Each panel is one head: cell ``(i, j)`` is how much query token i attends to key token j, on one shared
colour scale [0, 1]. Token labels are written when the sentence is short enough to read them (at most
:data:`LABEL_UP_TO` tokens: on the first column and the last row). Drawn with matplotlib's object API
on the Agg canvas as one image of every panel in one axes (each head's title a text above its panel), so a
model of hundreds of heads draws in about a second; written atomically.
"""

from __future__ import annotations

import math
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
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
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
    panel = 1.25 if len(layers) > 1 else max(1.6, min(3.2, 0.12 * n + 1.0))  # inches per panel side
    # One image of every panel (NaN gaps drawn white) in one axes, each head's title a text above its panel:
    # 270 panels draw in under a second where one axes per panel took tens of seconds. Above each row go its
    # panel titles (one or two lines and a 6 pt pad); above the first row, a gap, then the figure's title.
    head_fontsize = 6 if roles is not None else 7
    head_titles = ((2 if roles is not None else 1) * head_fontsize * _LINE + _TITLE_PAD) / 72  # inches
    unit = panel / n  # inches per cell
    gh = max(1, math.ceil(0.15 * n))  # cells between panels across
    gv = math.ceil((head_titles + 0.06) / unit)  # cells above each row of panels: its titles
    rows, cols = len(layers) * (gv + n), num_heads * n + (num_heads - 1) * gh
    mosaic = np.full((rows, cols), np.nan, dtype=np.float32)  # (NL' · (gv + n), H · n + (H − 1) · gh)
    for r, layer in enumerate(layers):
        for h in range(num_heads):
            y, x = r * (gv + n) + gv, h * (n + gh)
            mosaic[y : y + n, x : x + n] = a[layer, h]
    margin_l = margin_b = 1.0 if label else 0.2
    margin_r = 0.9  # the colour bar
    above = _EDGE + ((_TITLE_SIZE * _LINE) / 72 + _GAP if title else 0.0)
    width, height = cols * unit, rows * unit
    figsize = (margin_l + width + margin_r, margin_b + height + above)
    figsize = (round(figsize[0] * dpi) / dpi, round(figsize[1] * dpi) / dpi)  # whole pixels
    fig = Figure(figsize=figsize)
    ax = fig.add_axes((margin_l / figsize[0], margin_b / figsize[1], width / figsize[0], height / figsize[1]))
    cmap = colormaps["viridis"].with_extremes(bad="white")
    scale = ScalarMappable(norm=Normalize(0.0, 1.0), cmap=cmap)  # the colour bar's
    # coloured here (RGBA bytes resample several times faster than floats through a colour map), by the colour map
    # itself: weights lie in [0, 1], where Normalize(0, 1) is the identity, and the bytes are those of
    # scale.to_rgba(mosaic, bytes=True) without its masked-array pass (0.3-0.6 s for 30 × 9 heads)
    ax.imshow(cmap(mosaic, bytes=True), interpolation="nearest", aspect="auto")
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_xticks([])
    ax.set_yticks([])
    pad = _TITLE_PAD / 72 / unit  # cells
    for r, layer in enumerate(layers):
        for h in range(num_heads):
            head_title = f"L{layer} H{h}"
            if roles is not None:
                head_title += f"\n{roles[layer][h]}"
            x, y = h * (n + gh) + (n - 1) / 2, r * (gv + n) + gv - 0.5 - pad
            ax.text(x, y, head_title, ha="center", va="bottom", fontsize=head_fontsize, linespacing=_LINE / 1.2)
    if label:
        size = max(3, 7 - n // 6)
        ax.set_yticks(
            [r * (gv + n) + gv + i for r in range(len(layers)) for i in range(n)], tokens * len(layers), fontsize=size
        )
        ax.set_xticks([h * (n + gh) + j for h in range(num_heads) for j in range(n)], tokens * num_heads,
                      rotation=90, fontsize=size)  # fmt: skip
        ax.tick_params(length=0)
    cax = fig.add_axes((1 - 0.75 / figsize[0], 0.25, 0.15 / figsize[0], 0.5))
    fig.colorbar(scale, cax=cax, label="attention weight")
    if title:
        fig.suptitle(title, fontsize=_TITLE_SIZE, y=1 - _EDGE / figsize[1], va="top")
    out = save_figure(fig, path, dpi=dpi)
    return HeatmapFile(out, round(figsize[0] * dpi), round(figsize[1] * dpi))
