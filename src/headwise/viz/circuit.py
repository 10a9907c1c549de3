"""``circuit.png``: a circuit of heads drawn in layers, and what reads a ``circuit.json``.

Shape legend: NL layers, H query heads per layer, Hkv key/value groups per layer, E edges.

A circuit (:meth:`headwise.circuits.Circuit.to_dict`, the contents of ``circuit.json``) is a graph whose nodes
are the embeddings, every query head's output, every MLP, the logits and — as receivers of keys and values —
the key/value groups, and whose edges carry each method's score (the change of the metric when that one edge
is patched, estimated or exact). The picture stacks the nodes by depth: the embeddings at the bottom, then per
layer the key/value groups (inputs shared by the heads of a group, drawn under them), the query heads and the
MLP, and the logits at the top. An edge is a straight line from sender to receiver, its width proportional to
|score| / max |score| of the edges drawn, red where the score is positive and blue where negative; the edges of
the chosen circuit are drawn opaque and outlined, the others faint. A side panel shows the faithfulness curve
(the metric recovered against the number of edges kept) and the circuit chosen on it.

:func:`check_circuit` is the one schema check of a circuit dict (the page of :mod:`headwise.viz.circuit_page`
reads the same), :func:`circuit_layout` the one placement of its nodes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import numpy as np

from headwise.viz._files import HeatmapFile, save_figure

__all__ = [
    "KINDS",
    "INPUTS",
    "MAX_DRAWN_EDGES",
    "MLP_X",
    "as_circuit_dict",
    "check_circuit",
    "edge_scores",
    "circuit_layout",
    "plot_circuit",
]

#: Node kinds of a circuit dict.
KINDS = ("embed", "head", "mlp", "logits", "kv")
#: What input of its receiver an edge feeds.
INPUTS = ("q", "k", "v", "mlp", "logits")
#: Most edges of the circuit picture besides the circuit's own (the strongest by |score|).
MAX_DRAWN_EDGES = 200
#: Where the MLPs sit across the picture (the heads fill 0…1).
MLP_X = 1.05
#: Most nodes whose every label is written (beyond, only the circuit's nodes and the ends are named).
LABEL_ALL_UP_TO = 60

_TOP_KEYS = ("nodes", "edges")


def as_circuit_dict(circuit) -> dict:
    """A circuit dict from a :class:`headwise.circuits.Circuit` (its ``to_dict()``) or the dict itself.

    Raises:
        TypeError: neither a mapping nor an object with ``to_dict()``.
    """
    if isinstance(circuit, Mapping):
        return dict(circuit)
    to_dict = getattr(circuit, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise TypeError(f"circuit: expected a Circuit or its to_dict() dict, got {type(circuit).__name__}")


def _finite(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ValueError(f"circuit: {where} must be a finite number, got {value!r}")
    return float(value)


def check_circuit(circuit) -> dict:
    """Check a circuit dict's nodes, edges, circuit and details and return it (a dict).

    Checks what the pictures read: node ids unique, kinds among :data:`KINDS`, a layer on every head, MLP and
    key/value node, every edge's sender and receiver a node, its input among :data:`INPUTS`, its scores finite
    numbers, the circuit's edge indices in range, its node ids known, the faithfulness curve's two lists of one
    length, each detail's ``pattern`` a square-or-rectangular list of rows of numbers.

    Raises:
        ValueError: the first problem found, naming the key and the value.
        TypeError: not a circuit (see :func:`as_circuit_dict`).
    """
    d = as_circuit_dict(circuit)
    for key in _TOP_KEYS:
        if not isinstance(d.get(key), list):
            raise ValueError(f"circuit: expected a list under {key!r}, got {type(d.get(key)).__name__}")
    ids: dict[str, dict] = {}
    for i, node in enumerate(d["nodes"]):
        if not isinstance(node, Mapping) or not isinstance(node.get("id"), str):
            raise ValueError(f"circuit: nodes[{i}] must be a dict with a string 'id', got {node!r}")
        if node["id"] in ids:
            raise ValueError(f"circuit: node id {node['id']!r} appears twice")
        if node.get("kind") not in KINDS:
            raise ValueError(f"circuit: node {node['id']!r} has kind {node.get('kind')!r}; expected one of {KINDS}")
        if node["kind"] in ("head", "mlp", "kv"):
            layer = node.get("layer")
            if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
                raise ValueError(f"circuit: node {node['id']!r} needs a layer ≥ 0, got {layer!r}")
        ids[node["id"]] = node
    for i, edge in enumerate(d["edges"]):
        if not isinstance(edge, Mapping):
            raise ValueError(f"circuit: edges[{i}] must be a dict, got {edge!r}")
        for end in ("sender", "receiver"):
            if edge.get(end) not in ids:
                raise ValueError(f"circuit: edges[{i}] has {end} {edge.get(end)!r}, which is not a node")
        if edge.get("input") not in INPUTS:
            raise ValueError(f"circuit: edges[{i}] has input {edge.get('input')!r}; expected one of {INPUTS}")
        scores = edge.get("scores")
        if not isinstance(scores, Mapping) or not scores:
            raise ValueError(f"circuit: edges[{i}] needs a non-empty dict of 'scores', got {scores!r}")
        for name, value in scores.items():
            _finite(value, f"edges[{i}].scores[{name!r}]")
    chosen = d.get("circuit")
    if chosen is not None:
        if not isinstance(chosen, Mapping):
            raise ValueError(f"circuit: 'circuit' must be a dict or null, got {type(chosen).__name__}")
        for j in chosen.get("edges") or []:
            if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < len(d["edges"]):
                raise ValueError(f"circuit: circuit edge index {j!r} is outside 0…{len(d['edges']) - 1}")
        for node_id in chosen.get("nodes") or []:
            if node_id not in ids:
                raise ValueError(f"circuit: circuit node {node_id!r} is not a node")
    faith = d.get("faithfulness")
    if faith is not None:
        sizes, recovered = faith.get("sizes") or [], faith.get("recovered") or []
        if len(sizes) != len(recovered):
            raise ValueError(
                f"circuit: faithfulness has {len(sizes)} sizes but {len(recovered)} recovered values; expected one each"
            )
    for node_id, detail in (d.get("node_details") or {}).items():
        if node_id not in ids:
            raise ValueError(f"circuit: node_details names {node_id!r}, which is not a node")
        pattern = detail.get("pattern") if isinstance(detail, Mapping) else None
        if pattern is not None:
            if not isinstance(pattern, list) or not all(isinstance(row, list) for row in pattern):
                raise ValueError(f"circuit: node_details[{node_id!r}].pattern must be a list of rows")
            if len({len(row) for row in pattern}) > 1:
                raise ValueError(f"circuit: node_details[{node_id!r}].pattern has rows of different lengths")
    return d


def edge_scores(circuit: Mapping, method: str | None = None) -> np.ndarray:
    """``(E,)`` each edge's score by ``method`` (default: the circuit's own ``method``); an edge without that
    method's score takes the first score it has (so an exact score measured only for the top edges does not
    hide the others)."""
    method = method or circuit.get("method")
    out = np.empty(len(circuit["edges"]), dtype=np.float64)
    for i, edge in enumerate(circuit["edges"]):
        scores = edge["scores"]
        out[i] = float(scores[method]) if method in scores else float(next(iter(scores.values())))
    return out


def circuit_layout(nodes) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """Where each node sits: ``({id: (x, y)}, row names bottom to top)``.

    Rows bottom to top: ``embed``; per layer l its key/value groups ``L{l} kv`` (only when the circuit has any),
    its query heads ``L{l} heads`` and its MLP ``L{l} MLP`` (only when it has MLPs); ``logits``. x: a head at
    (h + ½) / H, a key/value group under the mean of its heads, the embeddings and the logits at ½, an MLP at
    :data:`MLP_X`, right of the heads. y is the row's index.
    """
    nodes = list(nodes)
    layers = [n["layer"] for n in nodes if n["kind"] in ("head", "mlp", "kv")]
    num_layers = max(layers) + 1 if layers else 0
    has_kv = any(n["kind"] == "kv" for n in nodes)
    has_mlp = any(n["kind"] == "mlp" for n in nodes)
    heads = [n for n in nodes if n["kind"] == "head"]
    width = max([int(n.get("head") or 0) + 1 for n in heads] or [1])
    rows = ["embed"]
    row_of: dict[tuple[int, str], int] = {}
    for layer in range(num_layers):
        for kind, present in (("kv", has_kv), ("head", True), ("mlp", has_mlp)):
            if present:
                row_of[(layer, kind)] = len(rows)
                rows.append(f"L{layer} " + {"kv": "kv", "head": "heads", "mlp": "MLP"}[kind])
    rows.append("logits")
    head_x = {(n["layer"], int(n.get("head") or 0)): (int(n.get("head") or 0) + 0.5) / width for n in heads}
    pos: dict[str, tuple[float, float]] = {}
    for n in nodes:
        kind = n["kind"]
        if kind == "embed":
            pos[n["id"]] = (0.5, 0.0)
        elif kind == "logits":
            pos[n["id"]] = (0.5, float(len(rows) - 1))
        elif kind == "head":
            pos[n["id"]] = (head_x[(n["layer"], int(n.get("head") or 0))], float(row_of[(n["layer"], "head")]))
        elif kind == "mlp":
            pos[n["id"]] = (MLP_X, float(row_of[(n["layer"], "mlp")]))
        else:  # kv: under the heads that read it
            served = [int(h) for h in (n.get("heads") or [])]
            xs = [(h + 0.5) / width for h in served] or [(int(n.get("kv_group") or 0) + 0.5) / width]
            pos[n["id"]] = (float(np.mean(xs)), float(row_of[(n["layer"], "kv")]))
    return pos, rows


def _drawn(scores: np.ndarray, circuit_edges: set[int], max_edges: int) -> list[int]:
    """The edges drawn, weakest first: the circuit's strongest ``max_edges`` (all of a circuit that small) and
    the strongest ``max_edges`` others."""
    order = [int(i) for i in np.argsort(-np.abs(scores), kind="stable")]
    inside = [i for i in order if i in circuit_edges][: max(0, max_edges)]
    others = [i for i in order if i not in circuit_edges][: max(0, max_edges)]
    return sorted(set(others) | set(inside), key=lambda i: abs(scores[i]))


def _colour(score: float):
    return (0.80, 0.16, 0.14) if score >= 0 else (0.15, 0.35, 0.75)


def _draw_edges(ax, d: dict, pos: dict, scores: np.ndarray, drawn: list[int], circuit_edges: set[int]) -> None:
    """The edges drawn, sender to receiver: width ∝ |score|, red > 0, blue < 0, the circuit's opaque and outlined
    over the faint rest; and each key/value group's thin grey lines to the heads that read it."""
    from matplotlib.collections import LineCollection

    nodes = d["nodes"]
    top = float(np.max(np.abs(scores[drawn]))) if drawn else 0.0
    top = top or 1.0
    for group in (False, True):  # the faint rest first, the circuit on top
        idx = [i for i in drawn if (i in circuit_edges) == group]
        if not idx:
            continue
        segs = [(pos[d["edges"][i]["sender"]], pos[d["edges"][i]["receiver"]]) for i in idx]
        lw = [0.3 + 3.7 * abs(scores[i]) / top for i in idx]
        colours = [(*_colour(scores[i]), 0.9 if group else 0.25) for i in idx]
        if group:
            outline = LineCollection(segs, linewidths=[w + 1.2 for w in lw], colors="black", alpha=0.7, zorder=2)
            ax.add_collection(outline)
        ax.add_collection(LineCollection(segs, linewidths=lw, colors=colours, zorder=3 if group else 1))
    # The key/value groups to the heads that read them (thin grey: one input shared by those heads).
    by_head = {(n["layer"], int(n.get("head") or 0)): n["id"] for n in nodes if n["kind"] == "head"}
    shares = [
        (pos[n["id"]], pos[by_head[(n["layer"], int(h))]])
        for n in nodes
        if n["kind"] == "kv"
        for h in n.get("heads") or []
        if (n["layer"], int(h)) in by_head
    ]
    if shares:
        ax.add_collection(LineCollection(shares, linewidths=0.4, colors="0.75", zorder=0))


def _draw_nodes(ax, nodes: list, pos: dict, circuit_nodes: set) -> None:
    """The nodes, a marker per kind (the circuit's larger, in orange), and their names: every node's in a small
    picture, past :data:`LABEL_ALL_UP_TO` nodes only the circuit's and the ends'."""
    many = len(nodes) > LABEL_ALL_UP_TO
    size = 10 if many else 60
    styles = {
        "embed": ("s", "0.35"),
        "logits": ("s", "0.35"),
        "head": ("o", "#8fb3d9"),
        "mlp": ("D", "#9ccc9c"),
        "kv": ("v", "#d9c38f"),
    }
    for kind, (marker, face) in styles.items():
        group = [n for n in nodes if n["kind"] == kind]
        if not group:
            continue
        xy = np.array([pos[n["id"]] for n in group])
        inside = np.array([n["id"] in circuit_nodes for n in group])
        ax.scatter(xy[~inside, 0], xy[~inside, 1], s=size, marker=marker, c=face, edgecolors="0.5", zorder=4)
        if inside.any():
            big = size * 2.5 if many else size * 1.6
            ax.scatter(xy[inside, 0], xy[inside, 1], s=big, marker=marker, c="#f2a541", edgecolors="black", zorder=5)
    for n in nodes:
        if not many or n["id"] in circuit_nodes or n["kind"] in ("embed", "logits"):
            x, y = pos[n["id"]]
            ax.annotate(n["id"], (x, y), xytext=(4, 3), textcoords="offset points", fontsize=5 if many else 6, zorder=6)


def _frame_layers(ax, rows: list[str]) -> None:
    """The graph's limits, one tick per row of the layout (at most about 40 named) and no box but the left."""
    ax.set_xlim(-0.05, MLP_X + 0.12)
    ax.set_ylim(-0.8, len(rows) - 0.2)
    step = 1 if len(rows) <= 40 else -(-len(rows) // 40)
    ticks = sorted(set(range(0, len(rows), step)) | {len(rows) - 1})
    ax.set_yticks(ticks, [rows[i] for i in ticks], fontsize=6)
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)


def _edges_title(d: dict, method: str | None, drawn: list[int], circuit_edges: set[int]) -> str:
    """How many edges are drawn, by whose score, and how many of the circuit's."""
    n_edges = len(d["edges"])
    what = method or d.get("method") or "score"
    shown = sum(i in circuit_edges for i in drawn)
    of_circuit = f"{shown} of the circuit's {len(circuit_edges)}" if shown < len(circuit_edges) else f"{shown}"
    return (
        f"{len(drawn)} of {n_edges} edges by |{what}| ({of_circuit} in the circuit, outlined); "
        "width ∝ |score|, red > 0, blue < 0"
    )


def _draw_faithfulness(fx, d: dict, faith: dict, fraction, circuit_edges: set[int]) -> None:
    """The side panel: the metric recovered against the edges kept, the chosen fraction and the circuit's size
    marked (a log scale past one edge where the sizes span more than 50×)."""
    sizes = np.asarray(faith["sizes"], dtype=np.float64)
    recovered = np.asarray([np.nan if r is None else r for r in faith["recovered"]], dtype=np.float64)
    fx.plot(sizes, recovered, marker="o", markersize=2.5, lw=1.2, color="#444")
    if isinstance(fraction, (int, float)):
        fx.axhline(float(fraction), color="#f2a541", lw=1, ls="--", label=f"fraction {float(fraction):g}")
    if circuit_edges:
        fx.axvline(len(circuit_edges), color="black", lw=0.8, ls=":", label=f"circuit: {len(circuit_edges)} edges")
    positive = sizes[sizes > 0]
    if positive.size > 1 and positive.max() / positive.min() > 50:  # 0, 1, 2, 5, … E: log past 1, 0 kept
        if (sizes == 0).any():
            fx.set_xscale("symlog", linthresh=1)
            fx.set_xlim(left=0)
        else:
            fx.set_xscale("log")
    fx.set_xlabel("edges kept (top by score)", fontsize=7)
    fx.set_ylabel("metric recovered (1 = clean, 0 = ablated)", fontsize=7)
    fx.set_title(f"faithfulness ({d.get('ablation') or 'ablation'} ablation)", fontsize=8)
    fx.tick_params(labelsize=6)
    fx.legend(fontsize=6, loc="lower right")
    fx.grid(alpha=0.3)


def plot_circuit(
    circuit,
    path: str | os.PathLike,
    *,
    method: str | None = None,
    max_edges: int = MAX_DRAWN_EDGES,
    title: str | None = None,
    dpi: int = 100,
) -> HeatmapFile:
    """Draw a circuit in layers (and its faithfulness curve) to ``path``, atomically.

    Args:
        circuit: a :class:`headwise.circuits.Circuit` or its ``to_dict()`` (``circuit.json``'s contents).
        path: the picture (.png, .svg, .pdf); its folder must exist.
        method: whose scores set the widths and choose the edges drawn (default: the circuit's ``method``).
        max_edges: the most edges drawn of the circuit and, besides, of the rest — the strongest by |score| of
            each (a model of 30 layers has tens of thousands of edges, and a faithful circuit thousands; a
            picture of all of them is ink). The title says how many of the circuit's are drawn.
        title: over the figure (default: the model, the method and the metric).
        dpi: dots per inch.
    Returns:
        :class:`~headwise.viz._files.HeatmapFile`.
    Raises:
        ValueError: a malformed circuit (see :func:`check_circuit`), a negative ``max_edges``, an unsupported
            suffix. OSError: the folder is missing or not writable.
    """
    from matplotlib.figure import Figure

    d = check_circuit(circuit)
    if isinstance(max_edges, bool) or not isinstance(max_edges, int) or max_edges < 0:
        raise ValueError(f"max_edges: expected an integer ≥ 0, got {max_edges!r}")
    nodes = d["nodes"]
    pos, rows = circuit_layout(nodes)
    scores = edge_scores(d, method) if d["edges"] else np.zeros(0)
    chosen = d.get("circuit") or {}
    circuit_edges = {int(i) for i in chosen.get("edges") or []}
    circuit_nodes = set(chosen.get("nodes") or [])
    if not circuit_nodes:
        for i in circuit_edges:
            circuit_nodes |= {d["edges"][i]["sender"], d["edges"][i]["receiver"]}
    drawn = _drawn(scores, circuit_edges, max_edges)
    faith = d.get("faithfulness") or {}
    panels = 2 if faith.get("sizes") else 1

    height = min(40.0, max(4.0, 0.16 * len(rows) + 1.5))
    widths = [7.5, 3.2][:panels]
    fig = Figure(figsize=(sum(widths), height), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, panels, width_ratios=widths))
    ax = axes[0]
    _draw_edges(ax, d, pos, scores, drawn, circuit_edges)
    _draw_nodes(ax, nodes, pos, circuit_nodes)
    _frame_layers(ax, rows)
    ax.set_title(_edges_title(d, method, drawn, circuit_edges), fontsize=7)
    if panels == 2:
        _draw_faithfulness(axes[1], d, faith, chosen.get("fraction"), circuit_edges)
    if title is None:
        title = " · ".join(str(x) for x in (d.get("model"), d.get("method"), d.get("metric")) if x)
    if title:
        fig.suptitle(title, fontsize=9)
    out = save_figure(fig, path, dpi=dpi)
    return HeatmapFile(out, round(sum(widths) * dpi), round(height * dpi))
