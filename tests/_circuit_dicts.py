"""Circuit dicts shaped like ``circuit.json`` (``headwise.circuits.Circuit.to_dict()``), built with known contents.

Every edge of the full graph is listed: the embeddings, each head of an earlier layer and each earlier MLP send
into each head's query and each key/value group's keys and values (the head itself where there are no groups),
into each MLP (which also reads its own layer's heads) and into the logits. Scores are drawn from a seeded
generator; the circuit is the ``keep`` strongest edges by the first method.
"""

from __future__ import annotations

import numpy as np


def make_circuit(
    *,
    layers: int = 2,
    heads: int = 4,
    kv_groups: int | None = 2,
    mlp: bool = True,
    tokens: int = 6,
    methods: tuple[str, ...] = ("eap", "exact"),
    keep: int = 5,
    seed: int = 0,
) -> dict:
    """A circuit dict. ``kv_groups=None``: no key/value nodes (keys and values go to the heads themselves)."""
    rng = np.random.default_rng(seed)

    def node(id_, kind, layer=None, head=None, kv_group=None, served=None) -> dict:
        return {"id": id_, "kind": kind, "layer": layer, "head": head, "kv_group": kv_group, "heads": served}

    nodes = [node("embed", "embed")]
    per_group = heads // kv_groups if kv_groups else 1
    for layer in range(layers):
        for h in range(heads):
            g = h // per_group if kv_groups else None
            nodes.append(node(f"L{layer}.H{h}", "head", layer, h, g))
        for g in range(kv_groups or 0):
            served = list(range(g * per_group, (g + 1) * per_group))
            nodes.append(node(f"L{layer}.KV{g}", "kv", layer, kv_group=g, served=served))
        if mlp:
            nodes.append(node(f"L{layer}.MLP", "mlp", layer))
    nodes.append(node("logits", "logits"))

    def senders(before: int, heads_of: int | None = None) -> list[str]:
        out = ["embed"]
        for layer in range(before):
            out += [f"L{layer}.H{h}" for h in range(heads)] + ([f"L{layer}.MLP"] if mlp else [])
        if heads_of is not None:
            out += [f"L{heads_of}.H{h}" for h in range(heads)]
        return out

    receivers = []
    for layer in range(layers):
        for h in range(heads):
            receivers.append((f"L{layer}.H{h}", "q", senders(layer)))
        for g in range(kv_groups or heads):
            target = f"L{layer}.KV{g}" if kv_groups else f"L{layer}.H{g}"
            receivers += [(target, "k", senders(layer)), (target, "v", senders(layer))]
        if mlp:
            receivers.append((f"L{layer}.MLP", "mlp", senders(layer, heads_of=layer)))
    receivers.append(("logits", "logits", senders(layers)))
    edges = []
    for receiver, kind, sent in receivers:
        for sender in sent:
            base = float(rng.normal())
            scores = {m: round(base + 0.1 * float(rng.normal()) * i, 6) for i, m in enumerate(methods)}
            edges.append({"sender": sender, "receiver": receiver, "input": kind, "scores": scores})
    first = np.array([e["scores"][methods[0]] for e in edges])
    order = [int(i) for i in np.argsort(-np.abs(first), kind="stable")]
    chosen = sorted(order[:keep])
    chosen_nodes = sorted({e for i in chosen for e in (edges[i]["sender"], edges[i]["receiver"])})
    sizes = [1, 2, 5, 10, 20, len(edges)]
    recovered = [0.1, 0.3, 0.7, 0.85, 0.95, 1.0]
    details = {}
    for n in nodes:
        if n["kind"] == "head":
            logits = rng.normal(size=(tokens, tokens))
            logits[np.triu_indices(tokens, 1)] = -np.inf
            w = np.exp(logits - logits.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            details[n["id"]] = {"pattern": np.round(w, 4).tolist(), "direct_effect": round(float(rng.normal()), 4)}
        elif n["kind"] in ("mlp", "embed"):
            details[n["id"]] = {"direct_effect": round(float(rng.normal()), 4)}
    return {
        "model": f"tiny-{layers}x{heads}",
        "method": methods[0],
        "metric": "logit_diff",
        "ablation": "corrupted",
        "prompts": [{"clean": "the cat sat", "corrupted": "the dog sat", "answer": " cat", "wrong": " dog"}],
        "tokens": [f"t{i}" for i in range(tokens)],
        "nodes": nodes,
        "edges": edges,
        "agreement": {"spearman": 0.9, "top_k": 10, "overlap": 0.8} if len(methods) > 1 else None,
        "faithfulness": {"sizes": sizes, "recovered": recovered, "clean_metric": 2.0, "corrupted_metric": -1.0},
        "circuit": {"fraction": 0.8, "edges": chosen, "nodes": chosen_nodes, "recovered": 0.85},
        "node_details": details,
    }
