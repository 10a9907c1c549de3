"""``qk.png``: one head's score at (query i, key j) as the matrix of query-side × key-side parts, beside the
row of attention weights over the keys.

Shape legend: A query-side parts, B key-side parts, J keys the query sees, N parts shown per side.

Left: ``terms[a, b] = q_a(i) · k_b(j) · scale`` (:class:`headwise.circuits.QKAttribution`) for the N query-side
and N key-side parts with the largest total ``|term|``, the others summed into a last row and column ("rest"),
so the cells still add up to the score; centred on zero (blue below, red above). Right: the model's weights
of query i over its keys, key j marked. Written atomically.
"""

from __future__ import annotations

import os

import numpy as np

from headwise.viz._files import HeatmapFile, layer_head_axes, save_figure

__all__ = ["plot_composition", "plot_qk", "shown_parts"]


def shown_parts(terms, top: int) -> tuple[np.ndarray, list[int], list[int]]:
    """``terms (A, B)`` -> ``(matrix (n_a, n_b), query indices, key indices)``: the ``top`` parts of each side by
    total ``|term|``, in their original order, plus a last row / column summing the rest (when any is left)."""
    t = np.asarray(terms, dtype=np.float64)
    if top < 1:
        raise ValueError(f"top: expected at least 1 part per side, got {top}")
    A, B = t.shape
    qa = sorted(np.argsort(-np.abs(t).sum(1))[: min(top, A)].tolist())
    kb = sorted(np.argsort(-np.abs(t).sum(0))[: min(top, B)].tolist())
    rest_a = [a for a in range(A) if a not in set(qa)]
    rest_b = [b for b in range(B) if b not in set(kb)]
    rows = [t[a] for a in qa] + ([t[rest_a].sum(0)] if rest_a else [])
    m = np.stack(rows)  # (n_a, B)
    cols = [m[:, b] for b in kb] + ([m[:, rest_b].sum(1)] if rest_b else [])
    return np.stack(cols, 1), qa, kb


def plot_qk(result, path: str | os.PathLike, *, top: int = 12, title: str | None = None, dpi: int = 100) -> HeatmapFile:
    """Write the QK attribution picture of ``result`` (a :class:`~headwise.circuits.QKAttribution`).

    Args:
        result: the attribution; its :attr:`key` is the column pictured.
        path: the picture (.png, .svg, .pdf); its folder must exist.
        top: parts shown per side (the rest summed).
        title: a title over the figure.
        dpi: dots per inch.
    Returns:
        :class:`~headwise.viz._files.HeatmapFile`.
    """
    from matplotlib.figure import Figure

    m, qa, kb = shown_parts(result.terms.numpy(), top)
    q_labels = [result.query_labels[a] for a in qa] + (["rest"] if m.shape[0] > len(qa) else [])
    k_labels = [result.key_labels[b] for b in kb] + (["rest"] if m.shape[1] > len(kb) else [])
    n_a, n_b = m.shape
    width = max(4.0, 0.42 * n_b + 2.4) + 3.2
    height = max(3.6, 0.3 * n_a + 2.0) + (0.4 if title else 0.0)
    fig = Figure(figsize=(width, height), layout="constrained")
    ax, bars = fig.subplots(1, 2, width_ratios=[max(4.0, 0.42 * n_b + 2.4), 3.2])
    lim = float(np.abs(m).max()) or 1.0
    image = ax.imshow(m, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(n_b), k_labels, fontsize=6, rotation=60, ha="right")
    ax.set_yticks(range(n_a), q_labels, fontsize=6)
    ax.set_xlabel(f"key-side parts (key {result.key})", fontsize=7)
    ax.set_ylabel(f"query-side parts (query {result.query})", fontsize=7)
    if n_a * n_b <= 400:
        for i in range(n_a):
            for j in range(n_b):
                ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=4.5, color="black")
    c = result.key_index()
    capped = "" if result.softcap is None else f", capped {float(result.logits[c]):+.3f}"
    ax.set_title(f"L{result.layer}.H{result.head}: score {float(result.scores[c]):+.3f}{capped} = Σ cells", fontsize=8)
    fig.colorbar(image, ax=ax, shrink=0.8).set_label("q_a · k_b · scale", fontsize=7)
    keys = result.keys.tolist()
    w = result.weights.numpy()
    colours = ["#d62728" if k == result.key else "#7f7f7f" for k in keys]
    bars.barh(range(len(keys)), w, color=colours)
    names = [f"{k} {result.tokens[k]}" if result.tokens else str(k) for k in keys]
    step = max(1, len(keys) // 40)
    bars.set_yticks(range(0, len(keys), step), names[::step], fontsize=5)
    bars.invert_yaxis()
    bars.set_xlabel("attention weight", fontsize=7)
    bars.set_title(f"query {result.query}'s weights", fontsize=8)
    bars.tick_params(axis="x", labelsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    out = save_figure(fig, path, dpi=dpi)
    return HeatmapFile(out, round(width * dpi), round(height * dpi))


def plot_composition(
    columns: dict, path: str | os.PathLike, *, title: str | None = None, dpi: int = 100
) -> HeatmapFile:
    """``composition.png``: four layer × head maps — each head's copying score (−1 … 1, centred on zero) and the
    strongest Q-, K- and V-composition score into it from any earlier head (0 … 1).

    Args:
        columns: ``{"copying", "q_composition_max", "k_composition_max", "v_composition_max"}`` → ``(NL, H)``
            (:func:`headwise.study.composition_columns`; NaN: no value).
        path: the picture (.png, .svg, .pdf); its folder must exist.
    Returns:
        :class:`~headwise.viz._files.HeatmapFile`.
    """
    from matplotlib.figure import Figure

    panels = (
        ("copying", "copying score Σ Re λ / Σ |λ|", "RdBu_r", -1.0, 1.0),
        ("q_composition_max", "strongest Q-composition into the head", "viridis", 0.0, None),
        ("k_composition_max", "strongest K-composition into the head", "viridis", 0.0, None),
        ("v_composition_max", "strongest V-composition into the head", "viridis", 0.0, None),
    )
    first = np.asarray(columns["copying"], dtype=np.float64)
    nl, h = first.shape
    cell_w = max(3.2, 0.35 * h + 1.6)
    height = max(3.2, 0.2 * nl + 1.6) + (0.4 if title else 0.0)
    fig = Figure(figsize=(4 * cell_w, height), layout="constrained")
    for ax, (name, label, cmap, vmin, vmax) in zip(fig.subplots(1, 4), panels):
        v = np.asarray(columns[name], dtype=np.float64)
        top = vmax if vmax is not None else (float(np.nanmax(v)) if np.isfinite(v).any() else 1.0)
        image = ax.imshow(v, cmap=cmap, vmin=vmin, vmax=top or 1.0, aspect="auto", interpolation="nearest")
        ax.set_title(label, fontsize=8)
        layer_head_axes(ax, nl, h)
        fig.colorbar(image, ax=ax, shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=10)
    out = save_figure(fig, path, dpi=dpi)
    return HeatmapFile(out, round(4 * cell_w * dpi), round(height * dpi))
