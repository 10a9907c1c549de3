"""The graph of heads, key/value groups and MLPs: its nodes, which sender reaches which receiver, its edges."""

from __future__ import annotations

import pytest

from _patching_models import Stack, hf_model
from headwise.circuits import Edge, Graph, Receiver, build_graph, wiring

pytest.importorskip("transformers")


def test_counts_follow_the_forward_order():
    g = Graph(heads=[4, 4, 4], kv=[2, 2, 2], mlps=[True, True, False])
    S = 1 + 3 * 4 + 2  # embed, heads, two MLPs
    R = 3 * (4 + 2 + 2) + 2 + 1  # q, k, v per layer, two MLP inputs, logits
    assert len(g.senders) == S and len(g.receivers) == R
    # brute force: a sender of layer l (stage 2l; an MLP 2l+1; embed -1) reaches a receiver of a later stage
    stage = {"embed": -1}
    for layer in range(3):
        for h in range(4):
            stage[f"L{layer}.H{h}"] = 2 * layer
        stage[f"L{layer}.MLP"] = 2 * layer + 1

    def read_stage(node, side):
        if node == "logits":
            return 6
        layer = int(node[1:].split(".")[0])
        return 2 * layer + (side == "mlp")

    expected = [(s, r) for r in g.receivers for s in g.senders if stage[s] < read_stage(*r)]
    assert [(e.sender, (e.receiver, e.input)) for e in g.edges] == expected
    assert len(g.edges) == len(expected) == g.edge_index.shape[0]
    assert g.edges[0] == Edge("embed", "L0.H0", "q") and g.edges[-1] == Edge("L2.H3", "logits", "logits")
    assert "L2.MLP" not in [n.id for n in g.nodes]


def test_nodes_of_a_model():
    g = build_graph(wiring(hf_model("llama")))
    ids = [n.id for n in g.nodes]
    assert ids[0] == "embed" and ids[-1] == "logits"
    assert ids[1:10] == ["L0.H0", "L0.H1", "L0.H2", "L0.H3", "L0.KV0", "L0.KV1", "L0.MLP", "L1.H0", "L1.H1"]
    d = g.node("L1.KV1").to_dict()
    assert d == {"id": "L1.KV1", "kind": "kv", "layer": 1, "head": None, "kv_group": 1, "heads": [2, 3]}
    assert g.receivers[g.groups[Receiver("k", 1)]] == [("L1.KV0", "k"), ("L1.KV1", "k")]
    assert g.receiver("r", "L1.KV1.v") == g.groups[Receiver("v", 1)].start + 1
    assert g.receiver("r", ("L1.MLP", "mlp")) == g.receiver("r", "L1.MLP")
    e = g.edge("e", "L0.H2->L1.KV1.k")
    assert g.edges[e] == Edge("L0.H2", "L1.KV1", "k") and g.edges[e].name == "L0.H2->L1.KV1.k"
    # without GQA every head has its own group
    g2 = build_graph(wiring(Stack()))
    assert [n.heads for n in g2.nodes if n.kind == "kv" and n.layer == 0] == [(0,), (1,), (2,), (3,)]


def test_bad_ids_are_named():
    g = Graph(heads=[2, 2], kv=[1, 1], mlps=[True, True])
    with pytest.raises(ValueError, match="senders: 'L2.H0'"):
        g.sender("senders", "L2.H0")
    with pytest.raises(ValueError, match="receivers: 'L0.H0'"):
        g.receiver("receivers", "L0.H0")
    with pytest.raises(ValueError, match="edges: L1.MLP does not write"):
        g.edge("edges", ("L1.MLP", "L1.H0.q"))
    with pytest.raises(ValueError, match="kv: layer 0"):
        Graph(heads=[3], kv=[2], mlps=[False])
