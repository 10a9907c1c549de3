"""``circuit.html``: one self-contained, offline page of a circuit of heads — the graph, its nodes' patterns.

Shape legend: N nodes, E edges, n tokens of the first clean prompt.

The page draws the graph of a circuit (:meth:`headwise.circuits.Circuit.to_dict`, ``circuit.json``'s contents)
in layers, as :func:`headwise.viz.circuit.circuit_layout` places it (the embeddings at the bottom, per layer the
key/value groups, the query heads and the MLP, the logits at the top), on one ``<canvas>``. Only the strongest
edges by |score| are drawn — a number box and a slider say how many (a model of 30 layers has tens of
thousands); a selector chooses whose scores rank them (each method the circuit holds), a box shows the chosen
circuit's edges alone. Line width is proportional to |score|, red positive, blue negative; the circuit's edges
are outlined.

Clicking a node (or typing its id, e.g. ``L3.H5``) shows its details: its direct effect on the metric, its
strongest incoming and outgoing edges, and for a head its attention pattern over the first clean prompt's
tokens (queries down, keys across) and, where the circuit carries it (``node_details[id]["qk"]``), the
attribution of one query–key score to the parts of the query and the key that make it. Below the graph: the
faithfulness curve, the agreement of the methods, the prompts.

The script (``circuit_page.js``) and the data (JSON in a ``<script type="application/json">`` block) are
inlined: no CDN, no network; the page opens straight from disk.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from headwise._io import write_text_atomic
from headwise.viz._files import inline_page
from headwise.viz.circuit import INPUTS, check_circuit, circuit_layout, edge_scores

__all__ = ["DEFAULT_EDGES", "circuit_page_payload", "render_circuit_page", "write_circuit_page"]

#: Edges drawn when the page opens (the strongest by |score|; the page's control changes it).
DEFAULT_EDGES = 150


def _round(x, digits: int = 6):
    """A float to ``digits`` significant digits (JSON stays short), None for NaN or None."""
    if x is None:
        return None
    x = float(x)
    return None if not math.isfinite(x) else float(f"{x:.{digits}g}")


def _pattern(rows) -> list[list[float]]:
    return [[round(float(v), 4) for v in row] for row in rows]


def _detail(detail: Mapping) -> dict:
    out = {}
    if detail.get("pattern") is not None:
        out["pattern"] = _pattern(detail["pattern"])
    if detail.get("direct_effect") is not None:
        out["direct_effect"] = _round(detail["direct_effect"])
    qk = detail.get("qk")
    if isinstance(qk, Mapping):
        out["qk"] = {
            "query": qk.get("query"),
            "key": qk.get("key"),
            "terms": [
                {"query_part": str(t.get("query_part")), "key_part": str(t.get("key_part")), "value": _round(v)}
                for t in qk.get("terms") or []
                for v in (t.get("value"),)
            ],
        }
    return out


def circuit_page_payload(circuit, *, title: str | None = None, subtitle: str | None = None) -> dict:
    """The JSON the page reads: nodes placed, edges as columns, each method's scores, the details.

    Args:
        circuit: a :class:`headwise.circuits.Circuit` or its ``to_dict()``.
        title, subtitle: the page's heading (text, never parsed as HTML; default: the model; the method, the
            metric and the ablation).
    Returns:
        ``{"title", "subtitle", "model", "method", "metric", "ablation", "methods", "tokens", "prompts", "nodes"
        (N × {id, kind, layer, head, kv_group, heads, x, y}), "rows", "senders", "receivers" (E node indices),
        "inputs" (E indices into "input_names"), "input_names", "scores" ({method: E scores; an edge the method
        did not score takes the circuit method's}), "measured" ({method: edges it scored}), "circuit", "circuit_edges",
        "faithfulness", "agreement", "bootstrap" (its summary, or None), "survival" (each edge's share of the
        resamples' circuits holding it, or None), "details", "default_edges"}``.
    Raises:
        ValueError / TypeError: a malformed circuit (:func:`headwise.viz.circuit.check_circuit`).
    """
    d = check_circuit(circuit)
    pos, rows = circuit_layout(d["nodes"])
    index = {n["id"]: i for i, n in enumerate(d["nodes"])}
    nodes = [
        {
            "id": n["id"],
            "kind": n["kind"],
            "layer": n.get("layer"),
            "head": n.get("head"),
            "kv_group": n.get("kv_group"),
            "heads": n.get("heads"),
            "x": round(pos[n["id"]][0], 5),
            "y": pos[n["id"]][1],
        }
        for n in d["nodes"]
    ]
    methods: list[str] = []
    for e in d["edges"]:
        for m in e["scores"]:
            if m not in methods:
                methods.append(m)
    main = d.get("method") if d.get("method") in methods else (methods[0] if methods else d.get("method"))
    methods.sort(key=lambda m: m != main)  # the circuit's own method first
    scores = {m: [_round(v) for v in edge_scores(d, m).tolist()] for m in methods}
    measured = {m: sum(m in e["scores"] for e in d["edges"]) for m in methods}
    chosen = dict(d.get("circuit") or {})
    circuit_edges = sorted({int(i) for i in chosen.get("edges") or []})
    faith = d.get("faithfulness")
    if faith is not None:
        faith = {
            "sizes": [int(s) for s in faith.get("sizes") or []],
            "recovered": [_round(r) for r in faith.get("recovered") or []],
            "clean_metric": _round(faith.get("clean_metric")),
            "corrupted_metric": _round(faith.get("corrupted_metric")),
        }
    agreement = d.get("agreement")
    if agreement is not None:
        agreement = {k: (_round(v) if isinstance(v, float) else v) for k, v in dict(agreement).items()}
    boot = d.get("bootstrap")
    survival = None
    if boot is not None:
        keys = ("resamples", "pairs", "size", "circuit_jaccard", "stable_share")
        boot = {k: (_round(boot[k]) if isinstance(boot.get(k), float) else boot.get(k)) for k in keys}
        survival = [_round(e.get("survival"), 3) for e in d["edges"]]
    heading = [str(x) for x in (d.get("method"), d.get("metric"), f"{d.get('ablation')} ablation") if x]
    return {
        "title": str(title if title is not None else d.get("model") or "circuit"),
        "subtitle": str(subtitle if subtitle is not None else " · ".join(heading)),
        "model": d.get("model"),
        "method": main,
        "metric": d.get("metric"),
        "ablation": d.get("ablation"),
        "methods": methods,
        "tokens": [str(t) for t in d.get("tokens") or []],
        "prompts": [
            {k: str(p.get(k, "")) for k in ("clean", "corrupted", "answer", "wrong")} for p in d.get("prompts") or []
        ],
        "nodes": nodes,
        "rows": rows,
        "senders": [index[e["sender"]] for e in d["edges"]],
        "receivers": [index[e["receiver"]] for e in d["edges"]],
        "inputs": [INPUTS.index(e["input"]) for e in d["edges"]],
        "input_names": list(INPUTS),
        "scores": scores,
        "measured": measured,
        "circuit": {
            "fraction": _round(chosen.get("fraction")),
            "recovered": _round(chosen.get("recovered")),
            "nodes": [str(x) for x in chosen.get("nodes") or []],
        },
        "circuit_edges": circuit_edges,
        "faithfulness": faith,
        "agreement": agreement,
        "bootstrap": boot,
        "survival": survival,
        "details": {str(k): _detail(v) for k, v in (d.get("node_details") or {}).items() if isinstance(v, Mapping)},
        "default_edges": min(DEFAULT_EDGES, len(d["edges"])),
    }


def render_circuit_page(payload: dict) -> str:
    """The whole HTML page for a :func:`circuit_page_payload` (template and script inlined)."""
    return inline_page("circuit_page", "CIRCUIT", payload)


def write_circuit_page(
    circuit, path: str | os.PathLike, *, title: str | None = None, subtitle: str | None = None
) -> Path:
    """Write the self-contained page of ``circuit`` to ``path`` (atomically).

    Args:
        circuit: a :class:`headwise.circuits.Circuit` or its ``to_dict()``.
        path: the ``.html`` file; its folder must exist.
        title, subtitle: the heading (see :func:`circuit_page_payload`).
    Returns:
        ``path``.
    Raises:
        ValueError / TypeError: a malformed circuit. OSError: the folder is not writable.
    """
    return write_text_atomic(path, render_circuit_page(circuit_page_payload(circuit, title=title, subtitle=subtitle)))
