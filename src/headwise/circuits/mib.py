"""MIB's circuit format and scores (Mueller et al. 2025, the circuit track): a run's edge scores written as MIB's graph
JSON, MIB's JSON read back as headwise's edge scores, and any MIB-format importance file scored with headwise's
faithfulness at MIB's fractions (CPR and CMD, :mod:`headwise.circuits.areas`).

Shape legend: E headwise edges, M MIB edges, G the most query heads that read one key/value group, K fractions.

MIB's graph (EAP-IG's ``Graph.from_model``, whose ``to_json`` / ``from_json`` read and write the file)::

    {"cfg": {"n_layers", "n_heads", "parallel_attn_mlp", "d_model"},
     "nodes": {"input": {"in_graph"}, "a0.h0": …, "m0": …, …, "logits": …},
     "edges": {"input->a0.h0<q>": {"score", "in_graph"}, "a0.h1->a1.h0<k>": …, "a0.h1->m0": …, "m1->logits": …}}

Every sender (``input``, each head ``a{l}.h{h}``, each MLP ``m{l}``) has an edge into everything that reads the
residual after it writes: each head's q, k and v inputs (``<q>``, ``<k>``, ``<v>``, per query head), each MLP, the
logits; a parallel block's heads do not feed its own MLP (``parallel_attn_mlp``). headwise's names: ``embed`` ↔
``input``, ``L{l}.H{h}`` ↔ ``a{l}.h{h}``, ``L{l}.MLP`` ↔ ``m{l}``, ``logits`` ↔ ``logits``. headwise reads k and v per
key/value group (``L{l}.KV{g}``): a group edge ``u → L{l}.KV{g}.k`` is MIB's H/Hkv edges ``u → a{l}.h{h}<k>``, one per
query head of the group, each with that head's share of the group's score (the shares add up to it); reading a file
back adds the heads' scores up into the group's. A model without GQA has one head per group: the two graphs are the
same edges. MIB's graph has the same heads in every layer and an MLP in every layer; other models are refused.

headwise's MIB numbers (:func:`mib_faithfulness`) follow MIB's ``evaluate_area_under_curve``: for each fraction f the
top ``int(f·E)`` edges by ``|score|``, pruned to the edges on a path from the embeddings to the logits
(``apply_topn(n, absolute=True, prune=True)``; :mod:`headwise.circuits.prune`), every other edge ablated, and the
faithfulness ``(m(circuit) − m(∅)) / (m(clean) − m(∅))``. Where they differ from MIB's: under GQA headwise ranks,
prunes and ablates whole key/value groups (E counts group edges; MIB counts and patches k and v per query head), and
ties in ``|score|`` are broken in edge order (MIB's sort leaves them to ``torch.argsort``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from headwise.checks import one_of
from headwise.circuits.areas import MIB_FRACTIONS, curve_areas, mib_sizes
from headwise.circuits.faithfulness import ABLATIONS, Faithfulness, faithfulness
from headwise.circuits.graph import Graph, build_graph, head_id, kv_id, mlp_id
from headwise.circuits.metrics import METRICS, make_metric
from headwise.circuits.prompts import answer_ids, prompt_ids
from headwise.circuits.prune import prune, top_kept
from headwise.circuits.wiring import Wiring, wiring

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "IMPORTANCES",
    "MIB_CFG",
    "evaluate_mib",
    "from_mib",
    "mib_circuits",
    "mib_faithfulness",
    "mib_layout",
    "mib_report",
    "mib_shares",
    "model_width",
    "read_mib",
    "to_mib",
    "write_mib_dir",
]

#: the keys of MIB's ``cfg`` (EAP-IG's ``Graph.from_model``)
MIB_CFG = ("n_layers", "n_heads", "parallel_attn_mlp", "d_model")
#: the importance file's name in a folder of MIB files (MIB's ``run_evaluation.py`` reads ``…/importances.json``)
IMPORTANCES = "importances.json"


def _check_shape(graph: Graph) -> None:
    """MIB's graph has H heads and an MLP in every layer, all blocks parallel or none; ValueError otherwise."""
    if len(set(graph.heads)) > 1:
        raise ValueError(f"graph: MIB's graph has the same heads in every layer; this model's have {graph.heads}")
    if not all(graph.mlps):
        missing = [layer for layer, m in enumerate(graph.mlps) if not m]
        raise ValueError(f"graph: MIB's graph has an MLP in every layer; layers {missing} of this model have none")
    if len(set(graph.parallel)) > 1:
        raise ValueError(f"graph: MIB states one parallel_attn_mlp for every block; this model has {graph.parallel}")


def _hw(name: str) -> str:
    """A MIB node name as headwise's node id (``input`` → ``embed``, ``a2.h1`` → ``L2.H1``, ``m2`` → ``L2.MLP``)."""
    if name in ("input", "logits"):
        return "embed" if name == "input" else "logits"
    if name[0] == "m":
        return mlp_id(int(name[1:]))
    layer, head = name.split(".")
    return head_id(int(layer[1:]), int(head[1:]))


def mib_layout(graph: Graph) -> list[tuple[str, int, int]]:
    """MIB's edges of the model in MIB's order (``Graph.from_model``'s): ``(name, e, j)`` — the MIB edge ``name`` is
    headwise's edge ``e``, share column ``j`` (the head's place in its key/value group for ``<k>`` / ``<v>``, else 0).

    Raises:
        ValueError: a model MIB's graph cannot state (heads differing between layers, a layer without an MLP,
        parallel and sequential blocks mixed).
    """
    _check_shape(graph)
    H, parallel = graph.heads[0], graph.parallel[0]
    pos = {(e.sender, e.receiver, e.input): i for i, e in enumerate(graph.edges)}
    out: list[tuple[str, int, int]] = []

    def head_edges(src: str, layer: int) -> None:
        for h in range(H):
            node = graph.node(head_id(layer, h))
            group = graph.node(kv_id(layer, node.kv_group))
            for side in "qkv":
                receiver = (node.id, "q", 0) if side == "q" else (group.id, side, group.heads.index(h))
                out.append((f"{src}->a{layer}.h{h}<{side}>", pos[(_hw(src), *receiver[:2])], receiver[2]))

    def to(src: str, receiver: str, node: str, side: str) -> None:
        out.append((f"{src}->{receiver}", pos[(_hw(src), node, side)], 0))

    stream = ["input"]
    for layer in range(graph.num_layers):
        heads = [f"a{layer}.h{h}" for h in range(H)]
        for src in stream:
            head_edges(src, layer)
            if parallel:
                to(src, f"m{layer}", mlp_id(layer), "mlp")
        if not parallel:
            for src in stream + heads:
                to(src, f"m{layer}", mlp_id(layer), "mlp")
        stream += [*heads, f"m{layer}"]
    for src in stream:
        to(src, "logits", "logits", "logits")
    return out


def _node_names(graph: Graph) -> list[str]:
    names = ["input"]
    for layer in range(graph.num_layers):
        names += [f"a{layer}.h{h}" for h in range(graph.heads[layer])] + [f"m{layer}"]
    return names + ["logits"]


def mib_shares(graph: Graph, scores: Tensor, shares: Tensor | None) -> Tensor:
    """``(E, G)``: each edge's score split among the query heads that read it — MIB's score of edge e's MIB edge with
    share column j (:func:`mib_layout`). The one place a run's shares become MIB's scores.

    Args:
        scores: ``(E,)`` the edges' scores (a k / v edge's: its group's).
        shares: ``(E, G)`` as ``EdgeScores.shares`` (each row adds up to its score; a k / v edge's column j the share of
            its group's j-th query head, every other edge's score in column 0), or None — then every group must be one
            query head (no GQA), and the scores are column 0.
    Raises:
        ValueError: shares None under GQA, shares of another shape, rows that do not add up to the scores.
    """
    E = len(graph.edges)
    if not isinstance(scores, Tensor) or scores.shape != (E,):
        got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"scores: expected one score per edge of the model's graph ({E},), got {got}")
    G = max(h // k for h, k in zip(graph.heads, graph.kv))
    if shares is None:
        if G > 1:
            raise ValueError(
                f"shares: None, but this model's key/value groups are read by {G} query heads each; MIB scores k and v "
                "per query head, so a group's score needs its heads' shares (edge_attribution(..., shares=True))"
            )
        return scores.detach().double().cpu()[:, None]
    if not isinstance(shares, Tensor) or shares.shape != (E, G):
        got = tuple(shares.shape) if isinstance(shares, Tensor) else type(shares).__name__
        raise ValueError(f"shares: expected ({E}, {G}) (an edge's score per query head of its group), got {got}")
    table = shares.detach().double().cpu()
    gap = float((table.sum(1) - scores.detach().double().cpu()).abs().max()) if E else 0.0
    if not gap <= 1e-5 * max(1.0, float(scores.detach().abs().max())):
        raise ValueError(f"shares: each row must add up to its edge's score; the largest difference is {gap:.3g}")
    return table


def to_mib(graph: Graph, scores: Tensor, shares: Tensor | None, in_graph: Tensor, *, d_model: int) -> dict:
    """MIB's graph JSON of the model: every MIB edge with its ``score`` and ``in_graph``, every node with ``in_graph``.

    Args:
        graph: the model's :class:`~headwise.circuits.graph.Graph`.
        scores: ``(E,)`` the edges' scores; shares: ``(E, G)`` or None (:func:`mib_shares`).
        in_graph: ``(E,)`` bool, the circuit (a group edge's flag serves each of its query heads' MIB edges).
        d_model: D, the model's width (MIB's ``cfg``).
    Returns:
        ``{"cfg", "nodes", "edges"}`` as EAP-IG's ``Graph.to_json`` writes it (a node is in the graph when it sends
        or receives an edge of the circuit; the logits always are).
    """
    table = mib_shares(graph, scores, shares)
    flags = torch.as_tensor(in_graph).reshape(-1)
    if flags.shape != (len(graph.edges),) or flags.is_floating_point():
        raise ValueError(f"in_graph: expected ({len(graph.edges)},) flags, got {flags.dtype} {tuple(flags.shape)}")
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
        raise ValueError(f"d_model: expected a positive whole number, got {d_model!r}")
    flags = flags.bool().tolist()
    values = table.tolist()
    edges, touched = {}, {"logits"}
    for name, e, j in mib_layout(graph):
        edges[name] = {"score": float(values[e][j]), "in_graph": flags[e]}
        if flags[e]:
            src, dst = name.split("->")
            touched |= {src, dst.split("<")[0]}
    cfg = {"n_layers": graph.num_layers, "n_heads": graph.heads[0], "parallel_attn_mlp": graph.parallel[0]}
    return {
        "cfg": {**cfg, "d_model": d_model},
        "nodes": {n: {"in_graph": n in touched} for n in _node_names(graph)},
        "edges": edges,
    }


def from_mib(data, graph: Graph, *, source: str = "data") -> Tensor:
    """``(E,)`` headwise's edge scores from MIB's graph JSON (a group edge's: the sum of its query heads' scores).

    Args:
        data: the parsed JSON (``{"cfg", "nodes", "edges"}``). graph: the model's graph.
        source: what the errors call ``data`` (a file's name).
    Raises:
        ValueError (one line naming ``source``): not MIB's layout, a ``cfg`` of another model, an unknown node or edge
        name, an edge of the model's graph missing, a score that is not a finite number.
    """
    if not isinstance(data, dict) or not all(isinstance(data.get(k), dict) for k in ("cfg", "nodes", "edges")):
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{source}: expected MIB's graph JSON, an object of the objects cfg, nodes, edges; got {got}")
    layout = mib_layout(graph)
    cfg = data["cfg"]
    for key, want in (("n_layers", graph.num_layers), ("n_heads", graph.heads[0])):
        if cfg.get(key) != want or isinstance(cfg.get(key), bool):
            raise ValueError(f"{source}: cfg {key} is {cfg.get(key)!r}, but the model has {want}; expected its graph's")
    if "parallel_attn_mlp" in cfg and cfg["parallel_attn_mlp"] != graph.parallel[0]:
        raise ValueError(
            f"{source}: cfg parallel_attn_mlp is {cfg['parallel_attn_mlp']!r}, but the model's blocks have "
            f"{graph.parallel[0]}"
        )
    nodes = set(_node_names(graph))
    unknown = [n for n in data["nodes"] if n not in nodes]
    if unknown:
        raise ValueError(
            f"{source}: node {unknown[0]!r} is not a node of MIB's graph of this model (expected 'input', 'a0.h0', "
            "'m0', 'logits', …)"
        )
    where = {name: (e, j) for name, e, j in layout}
    total = np.zeros(len(graph.edges), dtype=np.float64)
    for name, entry in data["edges"].items():
        if name not in where:
            raise ValueError(
                f"{source}: edge {name!r} is not an edge of MIB's graph of this model (expected names such as "
                f"{layout[0][0]!r} or {layout[-1][0]!r})"
            )
        score = entry.get("score") if isinstance(entry, dict) else None
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise ValueError(f"{source}: edge {name!r} has score {score!r}; expected a finite number")
        total[where[name][0]] += score
    missing = [name for name, _, _ in layout if name not in data["edges"]]
    if missing:
        raise ValueError(
            f"{source}: {len(missing)} of the {len(layout)} edges of MIB's graph of this model are missing, first "
            f"{missing[0]!r}"
        )
    return torch.from_numpy(total).float()


def read_mib(path, graph: Graph, *, source: str | None = None) -> Tensor:
    """:func:`from_mib` of a JSON file; ``(E,)``. Errors (one line) start with ``source`` (default: the file's name)."""
    source = source or f"'{path}'"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{source}: cannot read the file ({getattr(e, 'strerror', None) or e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not JSON ({e.msg} at line {e.lineno}); expected MIB's graph JSON") from None
    return from_mib(data, graph, source=source)


def mib_circuits(graph: Graph, scores: Tensor, fractions: Sequence[float] = MIB_FRACTIONS) -> Tensor:
    """``(K, E)`` bool: for each fraction f the top ``int(f·E)`` edges by ``|scores|``, pruned as MIB prunes them."""
    return prune(graph, top_kept(scores, mib_sizes(len(graph.edges), fractions)))


def _name(fraction: float) -> str:
    return f"circuit_{fraction:g}.json"


def write_mib_dir(
    folder,
    graph: Graph,
    scores: Tensor,
    shares: Tensor | None,
    *,
    d_model: int,
    in_graph: Tensor | None = None,
    fractions: Sequence[float] = MIB_FRACTIONS,
) -> list[str]:
    """A run's MIB files in ``folder``, which appears whole or not at all (:func:`headwise._io.atomic_folder`):
    ``importances.json`` (every edge's score; ``in_graph`` the run's circuit, or none) and ``circuit_<f>.json`` for
    each fraction f (:func:`mib_circuits`: the circuits headwise's MIB curve measured, as MIB's "multiple circuits").

    Args: as :func:`to_mib`. Returns: the file names written.
    Raises:
        ValueError: as :func:`to_mib` (nothing written); OSError: the folder cannot be written.
    """
    from headwise._io import atomic_folder, write_text_atomic

    E = len(graph.edges)
    docs = {IMPORTANCES: to_mib(graph, scores, shares, torch.zeros(E, dtype=torch.bool) if in_graph is None
                                else in_graph, d_model=d_model)}  # fmt: skip
    for f, kept in zip(fractions, mib_circuits(graph, scores, fractions)):
        docs[_name(f)] = to_mib(graph, scores, shares, kept, d_model=d_model)
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with atomic_folder(folder) as tmp:
        for name, doc in docs.items():
            write_text_atomic(tmp / name, json.dumps(doc) + "\n")
    return list(docs)


def mib_faithfulness(
    model,
    clean,
    corrupted,
    metric,
    scores: Tensor,
    *,
    ablation: str = "corrupted",
    reference=None,
    batch_size: int = 8,
    progress: Callable[[int, int], None] | None = None,
    gather_pairs: Callable[[Tensor], Tensor] | None = None,
    fractions: Sequence[float] = MIB_FRACTIONS,
) -> Faithfulness:
    """:func:`~headwise.circuits.faithfulness` at MIB's sizes (each distinct ``int(f·E)`` once, and 0), every circuit
    pruned as MIB prunes it; arguments as there. :func:`mib_report` reads it."""
    E = len(build_graph(_wiring(model)).edges)
    sizes = sorted(set(mib_sizes(E, fractions)) | {0})
    extra = {} if gather_pairs is None else {"gather_pairs": gather_pairs}
    return faithfulness(
        model, clean, corrupted, metric, scores, sizes=sizes, ablation=ablation, reference=reference,
        batch_size=batch_size, progress=progress, prune=True, **extra,
    )  # fmt: skip


def mib_report(curve: Faithfulness, num_edges: int, fractions: Sequence[float] = MIB_FRACTIONS) -> dict:
    """``{"fractions", "sizes", "edges", "faithfulness", "cpr", "cmd"}``: MIB's curve read from a
    :func:`mib_faithfulness` curve — the sizes ``int(f·E)``, the edges each pruned circuit kept, its faithfulness
    (null where the clean and ablated metrics are equal) and the areas :func:`~headwise.circuits.areas.curve_areas`
    (null then too)."""
    sizes = mib_sizes(num_edges, fractions)
    at = [curve.sizes.index(n) for n in sizes]
    values = [float(curve.recovered[k]) for k in at]
    finite = all(math.isfinite(v) for v in values)
    cpr, cmd = curve_areas(values, fractions) if finite else (None, None)
    return {
        "fractions": [float(f) for f in fractions],
        "sizes": sizes,
        "edges": None if curve.kept is None else [curve.kept[k] for k in at],
        "faithfulness": [v if math.isfinite(v) else None for v in values],
        "cpr": cpr,
        "cmd": cmd,
    }


def _wiring(model) -> Wiring:
    return model if isinstance(model, Wiring) else wiring(model)


def model_width(model) -> int:
    """D, the width of the model's residual stream (its token embedding's)."""
    target = _wiring(model).target
    for part in (target.anatomy.embed, target.anatomy.unembed):
        weight = getattr(part, "weight", None)
        if isinstance(weight, Tensor) and weight.dim() == 2:
            return int(weight.shape[-1])
    raise ValueError(f"model: {target.name} has no token embedding whose width could be read")


def evaluate_mib(
    hm: HeadModel,
    clean,
    corrupted,
    *,
    answer,
    wrong,
    data,
    metric: str = "logit_diff",
    ablation: str = "corrupted",
    batch_size: int = 8,
    progress: Callable[[int, int], None] | None = None,
    source: str | None = None,
) -> dict:
    """Score a MIB-format importance file (from any tool) with headwise's faithfulness on a model and prompt pairs.

    Args:
        hm, clean, corrupted, answer, wrong, metric, ablation, batch_size: as :func:`~headwise.circuits.find_circuit`.
        data: MIB's graph JSON of this model (parsed; :func:`from_mib`), or a path to it.
        progress: ``fn(done, total)`` after each batch of circuits. source: what errors call ``data`` (default: the
            file's name, or "data").
    Returns:
        ``{"model", "metric", "ablation", "num_edges", "clean_metric", "corrupted_metric", "ablated_metric", "mib"}``
        — ``"mib"`` as :func:`mib_report` (the curve at MIB's fractions, CPR, CMD).
    Raises:
        ValueError / TypeError (one line): the file (as :func:`from_mib`), the prompts or the options.
    """
    one_of("metric", metric, METRICS)
    one_of("ablation", ablation, ABLATIONS)
    w = _wiring(hm)
    target, graph = w.target, build_graph(w)
    if isinstance(data, (str, os.PathLike)):
        scores = read_mib(data, graph, source=source)
    else:
        scores = from_mib(data, graph, source=source or "data")
    c, _ = prompt_ids("clean", clean, target)
    x, _ = prompt_ids("corrupted", corrupted, target)
    if c.shape != x.shape:
        raise ValueError(f"corrupted: expected the clean prompts' shape {tuple(c.shape)}, got {tuple(x.shape)}")
    a_ids, _ = answer_ids("answer", answer, c.shape[0], target)
    w_ids, _ = answer_ids("wrong", wrong, c.shape[0], target)
    c, x = c.to(target.device), x.to(target.device)
    clean_last = None
    if metric == "kl":
        with torch.no_grad():
            clean_last = target.logits(c, last_only=True)[:, -1]  # (P, V)
    fn = make_metric(metric, a_ids, w_ids, clean_last)
    curve = mib_faithfulness(w, c, x, fn, scores, ablation=ablation, batch_size=batch_size, progress=progress)
    return {
        "model": target.name,
        "metric": metric,
        "ablation": ablation,
        "num_edges": len(graph.edges),
        "clean_metric": curve.clean_metric,
        "corrupted_metric": curve.corrupted_metric,
        "ablated_metric": curve.ablated_metric,
        "mib": mib_report(curve, len(graph.edges)),
    }
