"""A circuit pruned to the edges on a path from the embeddings to the logits, as MIB evaluates circuits (EAP-IG's
``Graph.prune``, which ``apply_topn(n, prune=True)`` and ``evaluate_graph`` call).

Shape legend: J circuits, E edges, N nodes, G the most nodes one receiver feeds.

MIB's ``prune`` repeats, until nothing changes: a node stays while it has a kept edge in (the input always has) and
a kept edge out (the logits always have); an edge stays while its two ends stay. On a graph without cycles the fixed
point is the set of kept edges that lie on some path from the input to the logits — what :func:`on_paths` computes in
one forward and one backward sweep over the nodes. A node is a writer (the embeddings, a head, an MLP) or the logits;
an edge runs from its sender's node to the node(s) that read its receiver: a query input or an MLP's input feeds one
node, a key/value group's k or v input every query head of the group (:func:`graph_nodes`), so an edge into a group
stays while any head of the group reaches the logits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headwise.circuits.graph import Graph

__all__ = ["graph_nodes", "on_paths", "prune", "top_kept"]


def on_paths(kept: Tensor, parent: Tensor, children: Tensor, num_nodes: int) -> Tensor:
    """The kept edges that lie on a path from node 0 (the input) to node ``num_nodes − 1`` (the logits).

    Args:
        kept: ``(J, E)`` bool, the edges each circuit keeps.
        parent: ``(E,)`` the node each edge leaves.
        children: ``(E, G)`` the nodes each edge feeds, padded with −1.
        num_nodes: N; nodes are numbered in forward order (every edge goes from a lower to a higher number).
    Returns:
        ``(J, E)`` bool: ``kept`` with every edge off those paths dropped.
    """
    J, E = kept.shape
    valid = children >= 0  # (E, G)
    child = children.clamp(min=0)
    into: list[list[int]] = [[] for _ in range(num_nodes)]
    out_of: list[list[int]] = [[] for _ in range(num_nodes)]
    for e, (p, row) in enumerate(zip(parent.tolist(), children.tolist())):
        out_of[p].append(e)
        for n in row:
            if n >= 0:
                if n <= p:
                    raise ValueError(f"children: edge {e} goes from node {p} back to node {n}; expected forward order")
                into[n].append(e)
    reached = torch.zeros(J, num_nodes, dtype=torch.bool)  # from the input
    reached[:, 0] = True
    for n in range(1, num_nodes):
        if into[n]:
            idx = torch.tensor(into[n])
            reached[:, n] = (kept[:, idx] & reached[:, parent[idx]]).any(1)
    reaches = torch.zeros(J, num_nodes, dtype=torch.bool)  # the logits
    reaches[:, num_nodes - 1] = True
    for n in range(num_nodes - 2, -1, -1):
        if out_of[n]:
            idx = torch.tensor(out_of[n])
            ahead = (reaches[:, child[idx]] & valid[idx]).any(-1)  # (J, e_n)
            reaches[:, n] = (kept[:, idx] & ahead).any(1)
    return kept & reached[:, parent] & (reaches[:, child] & valid).any(-1)


def graph_nodes(graph: Graph) -> tuple[Tensor, Tensor, int]:
    """``(parent (E,), children (E, G), N)`` of the graph's edges over its writers and the logits: node s is sender s
    (``graph.senders``), node S the logits; a k / v receiver feeds the query heads of its group."""
    S = len(graph.senders)
    pos = {s: i for i, s in enumerate(graph.senders)}
    feeds = []
    for node_id, side in graph.receivers:
        if side == "logits":
            feeds.append([S])
        elif side in ("k", "v"):
            layer = graph.node(node_id).layer
            feeds.append([pos[f"L{layer}.H{h}"] for h in graph.node(node_id).heads])
        else:
            feeds.append([pos[node_id]])
    width = max(len(f) for f in feeds)
    table = torch.full((len(feeds), width), -1, dtype=torch.long)
    for r, f in enumerate(feeds):
        table[r, : len(f)] = torch.tensor(f)
    parent = torch.from_numpy(graph.edge_index[:, 0]).long()
    children = table[torch.from_numpy(graph.edge_index[:, 1]).long()]
    return parent, children, S + 1


def prune(graph: Graph, kept: Tensor) -> Tensor:
    """``kept (J, E)`` bool → the same circuits pruned as MIB prunes them (:func:`on_paths` on :func:`graph_nodes`)."""
    if kept.dim() != 2 or kept.shape[1] != len(graph.edges):
        raise ValueError(f"kept: expected (J, {len(graph.edges)}) flags, got {tuple(kept.shape)}")
    return on_paths(kept.bool().cpu(), *graph_nodes(graph))


def top_kept(scores: Tensor, sizes: list[int]) -> Tensor:
    """``(len(sizes), E)`` bool: the top n edges by ``|scores|`` (ties in edge order) for each n of ``sizes``."""
    order = torch.argsort(scores.detach().abs().cpu(), descending=True, stable=True)
    rank = torch.empty(len(order), dtype=torch.long)
    rank[order] = torch.arange(len(order))
    return rank[None, :] < torch.tensor(sizes, dtype=torch.long)[:, None]
