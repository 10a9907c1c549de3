"""The lab-grown induction model, where the answer is known by construction: the circuit EAP finds is the
previous-token head writing into the induction heads' keys, and path patching confirms it (slow: trains the
lab's 2-layer attention-only model, ~1.5 CPU minutes; the numbers are in docs/circuits.md)."""

from __future__ import annotations

import pytest

from headwise.circuits import edge_attribution, find_circuit, path_patch, wiring
from headwise.lab.induction import circuit_pairs
from headwise.patching import logit_difference


def analyse(model, previous: list[str], induction: list[str]) -> dict:
    """The circuit of ``model`` on :func:`headwise.lab.induction.circuit_pairs`, beside the heads the lab's scores name
    (``previous`` / ``induction``: ``"L0H2"``-style names)."""
    w = wiring(model)
    clean, corrupted, answer, wrong = circuit_pairs(w.target.vocab_size)
    metric = logit_difference(answer, wrong)
    scores = edge_attribution(w, clean, corrupted, metric)
    g = scores.graph
    heads = [h.replace("H", ".H") for h in induction]
    groups = sorted({f"L1.KV{g.node(h).kv_group}" for h in heads})
    into_keys = {}
    for group in groups:
        edges = [e for e, edge in enumerate(g.edges) if edge.receiver == group and edge.input == "k"]
        best = max(edges, key=lambda e: abs(float(scores.scores[e])))
        into_keys[group] = (g.edges[best].sender, float(scores.scores[best]))
    senders = ["embed"] + [f"L0.H{h}" for h in range(g.heads[0])]
    keys = path_patch(w, clean, corrupted, metric, senders, [f"{k}.k" for k in groups], direction="noise")
    queries = path_patch(w, clean, corrupted, metric, senders, [f"{h}.q" for h in heads], direction="noise")
    values = path_patch(w, clean, corrupted, metric, senders, [f"{k}.v" for k in groups], direction="noise")
    circuit = find_circuit(w.target, clean, corrupted, answer=answer, wrong=wrong, exact_top=20).to_dict()
    exact = find_circuit(w.target, clean, corrupted, answer=answer, wrong=wrong, method="exact").to_dict()
    names = [f"{e['sender']}->{e['receiver']}.{e['input']}" for e in exact["edges"]]
    by_exact = sorted(range(len(names)), key=lambda e: -abs(exact["edges"][e]["scores"]["exact"]))
    return {
        "metric_clean": float(keys.metric_clean.mean()),
        "metric_corrupted": float(keys.metric_corrupted.mean()),
        "top_into_keys": into_keys,
        "top_edges": [(g.edges[e].name, float(scores.scores[e])) for e in scores.top(8)],
        "path_keys": dict(zip(senders, keys.effect.tolist())),
        "path_queries": dict(zip(senders, queries.effect.tolist())),
        "path_values": dict(zip(senders, values.effect.tolist())),
        "agreement": circuit["agreement"],
        "faithfulness": circuit["faithfulness"],
        "circuit": circuit["circuit"],
        "circuit_edges": [names[e] for e in circuit["circuit"]["edges"]],
        "exact_top": [(names[e], exact["edges"][e]["scores"]["exact"]) for e in by_exact[:12]],
        "exact_faithfulness": exact["faithfulness"],
        "exact_circuit": exact["circuit"],
        "exact_circuit_edges": [names[e] for e in exact["circuit"]["edges"]],
        "key_edges": {
            n: (exact["edges"][e]["scores"]["exact"], circuit["edges"][e]["scores"]["eap"])
            for e, n in enumerate(names)
            if n.endswith(".k") and n.startswith("L0.")
        },
    }


@pytest.mark.slow
def test_the_induction_circuit_is_previous_token_into_keys():
    from headwise.lab.induction import InductionSetup, run_induction

    run = run_induction(InductionSetup(), seed=0)
    assert run.summary["passed"]
    previous, induction = run.summary["previous_token_heads"], run.summary["induction_heads"]
    assert len(previous) >= 1 and len(induction) >= 1
    prev_id = previous[0].replace("H", ".H")
    out = analyse(run.model, previous, induction)
    groups = sorted(out["top_into_keys"])
    # EAP, a linearisation at a saturated softmax, scores these edges at a small fraction of their effect and need
    # not rank the previous-token head first (trained on an Intel Xeon, it ranked another layer-0 head first for two
    # of the four groups):
    # the claims below are the exact ones. EAP's scores are recorded beside them (out["key_edges"]).
    assert set(out["top_into_keys"]) == set(groups)
    # exact edge patching: the same, by a wide margin, and each such edge alone moves the logit difference by
    # more than a fifth of the clean-corrupted gap (EAP, a linearisation at a saturated softmax, sees far less)
    gap = out["metric_clean"] - out["metric_corrupted"]
    for group in groups:
        into = {e: v for e, v in out["key_edges"].items() if e.endswith(f"->{group}.k")}
        best = max(into, key=lambda e: abs(into[e][0]))
        assert best == f"{prev_id}->{group}.k", into
        assert into[best][0] < -0.2 * gap
        assert all(abs(v[0]) < 0.5 * abs(into[best][0]) for e, v in into.items() if e != best)
    # path patching, exactly: of the layer-0 senders into the induction heads' keys, the previous-token head's
    # path carries most of the effect (the others' together less than half of it)
    path = out["path_keys"]
    others = sum(abs(v) for s, v in path.items() if s != prev_id)
    assert path[prev_id] < -0.3 * gap and abs(path[prev_id]) > 2 * others, path
    # the queries come from the current token (the embeddings), not from the previous-token head
    assert abs(out["path_queries"]["embed"]) > 2 * abs(out["path_queries"][prev_id])
    # the smallest exact circuit recovering 0.8 holds the previous-token head -> every induction key group
    assert out["exact_circuit"]["recovered"] >= 0.8
    for group in groups:
        assert f"{prev_id}->{group}.k" in out["exact_circuit_edges"]
