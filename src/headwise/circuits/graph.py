"""The computational graph of a decoder seen as heads and MLPs writing to, and reading from, the residual stream.

Shape legend: NL layers, H query heads, Hkv key/value groups.

Nodes (ids as strings):

- ``"embed"`` — the embeddings (the first block's input, positions included);
- ``"L{l}.H{h}"`` — query head h of layer l (its output, and its query input);
- ``"L{l}.KV{g}"`` — key/value group g of layer l: the keys and values every query head of the group reads
  (GQA: H/Hkv query heads share one; a model without GQA has one group per head), listed in ``heads``;
- ``"L{l}.MLP"`` — the MLP of layer l (attention-only layers have none);
- ``"logits"``.

Senders are ``embed``, every head and every MLP; receivers are every head's query input (``input="q"``), every
group's key and value inputs (``"k"``, ``"v"``), every MLP's input (``"mlp"``) and the logits (``"logits"``).
An edge joins a sender to every receiver that reads the residual after the sender writes it: a head of layer l
reaches layer l's MLP and everything of later layers; an MLP of layer l reaches layers after l (Hanna et al.
2024's graph, with k and v per key/value group).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headwise.circuits.addresses import RECEIVER_INPUTS, Receiver, Write

__all__ = ["Edge", "Graph", "Node", "build_graph", "RECEIVER_INPUTS", "NODE_KINDS"]

NODE_KINDS = ("embed", "head", "kv", "mlp", "logits")


@dataclass(frozen=True)
class Node:
    """One node: ``id``, ``kind`` (:data:`NODE_KINDS`), ``layer`` (None for embed / logits), ``head`` (heads),
    ``kv_group`` (heads: the group they read; kv nodes: their group), ``heads`` (kv nodes: the query heads
    that read the group)."""

    id: str
    kind: str
    layer: int | None = None
    head: int | None = None
    kv_group: int | None = None
    heads: tuple[int, ...] | None = None

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "layer": self.layer,
            "head": self.head,
            "kv_group": self.kv_group,
            "heads": None if self.heads is None else list(self.heads),
        }


@dataclass(frozen=True)
class Edge:
    """``sender`` node id → ``receiver`` node id along ``input`` (:data:`RECEIVER_INPUTS`)."""

    sender: str
    receiver: str
    input: str

    @property
    def name(self) -> str:
        return f"{self.sender}->{self.receiver}.{self.input}"


class Graph:
    """Nodes, senders, receivers and edges of one model (build with :func:`build_graph`).

    Attributes:
        num_layers: NL. heads: H per layer. kv: Hkv per layer. mlps: whether each layer has an MLP. parallel:
            whether each layer's MLP reads the block's input beside the attention (then no edge from the layer's
            heads into its MLP).
        nodes: every :class:`Node`, in forward order.
        senders: sender node ids, in forward order (index s).
        receivers: ``(node id, input)`` in forward order (index r).
        groups: receiver groups :class:`~headwise.circuits.addresses.Receiver` ``-> slice`` of receiver indices, in
            forward order (``Receiver("q", l)`` H receivers, ``("k", l)`` / ``("v", l)`` Hkv, ``("mlp", l)`` one,
            ``("logits", NL)``).
        sender_groups: :class:`~headwise.circuits.addresses.Write` ``("embed", -1)`` / ``("heads", l)`` /
            ``("mlp", l)`` -> slice of sender indices.
        edges: every :class:`Edge` (index e), ordered by receiver then sender.
        edge_index: ``(E, 2)`` int array of (sender index, receiver index).
    """

    def __init__(self, heads: list[int], kv: list[int], mlps: list[bool], parallel: list[bool] | None = None):
        self.num_layers = len(heads)
        self.heads, self.kv, self.mlps = list(heads), list(kv), list(mlps)
        #: per layer, whether its MLP reads the block's input (a parallel block: its heads do not feed its MLP, as
        #: MIB states GPT-NeoX's graph)
        self.parallel = [False] * len(heads) if parallel is None else [bool(p) for p in parallel]
        self.nodes: list[Node] = [Node("embed", "embed")]
        self.senders: list[str] = ["embed"]
        self.sender_groups: dict[Write, slice] = {Write("embed", -1): slice(0, 1)}
        self.receivers: list[tuple[str, str]] = []
        self.groups: dict[Receiver, slice] = {}
        stage_s = [-1]  # the point of the forward pass where each sender writes
        stage_r = []  # … where each receiver reads
        for layer, (H, G, mlp, par) in enumerate(zip(heads, kv, mlps, self.parallel)):
            if H % G:
                raise ValueError(f"kv: layer {layer} has {H} query heads, not a multiple of {G} key/value groups")
            per = H // G
            for h in range(H):
                self.nodes.append(Node(head_id(layer, h), "head", layer, h, h // per))
            for g in range(G):
                self.nodes.append(Node(kv_id(layer, g), "kv", layer, None, g, tuple(range(g * per, (g + 1) * per))))
            for kind, n, node in (("q", H, head_id), ("k", G, kv_id), ("v", G, kv_id)):
                self.groups[Receiver(kind, layer)] = slice(len(self.receivers), len(self.receivers) + n)
                self.receivers += [(node(layer, i), kind) for i in range(n)]
                stage_r += [2 * layer] * n
            self.sender_groups[Write("heads", layer)] = slice(len(self.senders), len(self.senders) + H)
            self.senders += [head_id(layer, h) for h in range(H)]
            stage_s += [2 * layer] * H
            if mlp:
                self.nodes.append(Node(mlp_id(layer), "mlp", layer))
                self.groups[Receiver("mlp", layer)] = slice(len(self.receivers), len(self.receivers) + 1)
                self.receivers.append((mlp_id(layer), "mlp"))
                stage_r.append(2 * layer if par else 2 * layer + 1)
                self.sender_groups[Write("mlp", layer)] = slice(len(self.senders), len(self.senders) + 1)
                self.senders.append(mlp_id(layer))
                stage_s.append(2 * layer + 1)
        self.nodes.append(Node("logits", "logits"))
        self.groups[Receiver("logits", self.num_layers)] = slice(len(self.receivers), len(self.receivers) + 1)
        self.receivers.append(("logits", "logits"))
        stage_r.append(2 * self.num_layers)
        self.stage_s, self.stage_r = np.array(stage_s), np.array(stage_r)
        #: ``(S, R)`` bool: whether sender s reaches receiver r
        self.reaches = self.stage_s[:, None] < self.stage_r[None, :]
        r_idx, s_idx = np.nonzero(self.reaches.T)
        self.edge_index = np.stack([s_idx, r_idx], 1)  # (E, 2)
        self.edges = [Edge(self.senders[s], *self.receivers[r]) for s, r in self.edge_index]
        self._sender_pos = {s: i for i, s in enumerate(self.senders)}
        self._receiver_pos = {r: i for i, r in enumerate(self.receivers)}
        self._edge_pos = {(int(s), int(r)): e for e, (s, r) in enumerate(self.edge_index)}
        self._node = {n.id: n for n in self.nodes}

    def __repr__(self) -> str:
        return (
            f"Graph({self.num_layers} layers, {len(self.senders)} senders, {len(self.receivers)} receivers, "
            f"{len(self.edges)} edges)"
        )

    def node(self, node_id: str) -> Node:
        return self._node[node_id]

    def sender(self, arg: str, node_id) -> int:
        """The index of sender ``node_id``; ValueError naming ``arg`` otherwise."""
        i = self._sender_pos.get(node_id) if isinstance(node_id, str) else None
        if i is None:
            raise ValueError(
                f"{arg}: {node_id!r} is not a sender of this model (expected 'embed', 'L<layer>.H<head>' or "
                f"'L<layer>.MLP' with layers 0..{self.num_layers - 1})"
            )
        return i

    def receiver(self, arg: str, spec) -> int:
        """The index of a receiver given as ``(node id, input)`` or ``"node.input"`` (``"L3.H1.q"``,
        ``"L3.KV0.k"``, ``"L3.MLP"``, ``"logits"``); ValueError naming ``arg`` otherwise."""
        key = _receiver_key(spec)
        i = self._receiver_pos.get(key) if key is not None else None
        if i is None:
            raise ValueError(
                f"{arg}: {spec!r} is not a receiver of this model (expected 'L<layer>.H<head>.q', "
                f"'L<layer>.KV<group>.k' or '.v', 'L<layer>.MLP' or 'logits')"
            )
        return i

    def edge(self, arg: str, spec) -> int:
        """The index of an edge given as an :class:`Edge`, ``(sender, receiver spec)`` or ``"sender->receiver"``."""
        if isinstance(spec, Edge):
            sender, receiver = spec.sender, (spec.receiver, spec.input)
        elif isinstance(spec, str) and "->" in spec:
            sender, receiver = spec.split("->", 1)
        elif isinstance(spec, (tuple, list)) and len(spec) == 2:
            sender, receiver = spec
        else:
            raise ValueError(f"{arg}: expected an edge 'sender->receiver.input' or (sender, receiver), got {spec!r}")
        s, r = self.sender(arg, sender), self.receiver(arg, receiver)
        e = self._edge_pos.get((s, r))
        if e is None:
            raise ValueError(f"{arg}: {sender} does not write before {self.receivers[r]} reads (no edge)")
        return e


def head_id(layer: int, head: int) -> str:
    return f"L{layer}.H{head}"


def kv_id(layer: int, group: int) -> str:
    return f"L{layer}.KV{group}"


def mlp_id(layer: int) -> str:
    return f"L{layer}.MLP"


def _receiver_key(spec) -> tuple[str, str] | None:
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and all(isinstance(x, str) for x in spec):
        return (spec[0], spec[1])
    if not isinstance(spec, str):
        return None
    if spec == "logits":
        return ("logits", "logits")
    if spec.endswith(".MLP"):
        return (spec, "mlp")
    node, _, side = spec.rpartition(".")
    return (node, side) if node else None


def build_graph(wiring) -> Graph:
    """The :class:`Graph` of a model's :class:`~headwise.circuits.wiring.Wiring`."""
    return Graph(
        [lw.num_heads for lw in wiring.layers],
        [lw.num_kv for lw in wiring.layers],
        [lw.mlp is not None for lw in wiring.layers],
        [lw.parallel for lw in wiring.layers],
    )
