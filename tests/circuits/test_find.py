"""find_circuit: the circuit.json contents (every key of the schema, JSON-serialisable, consistent with the parts
computed on their own), each method and metric, texts through a tokenizer, errors naming the argument."""

from __future__ import annotations

import json

import pytest
import torch

from _patching_models import Stack, hf_model, pair
from headwise.circuits import Circuit, edge_attribution, faithfulness, find_circuit, patch_edges
from headwise.models import HeadModel
from headwise.patching import logit_difference

pytest.importorskip("transformers")

KEYS = {"model", "method", "metric", "ablation", "steps", "prompts", "tokens", "nodes", "edges", "agreement"}
KEYS |= {"faithfulness", "circuit", "mib", "bootstrap", "node_details"}


@pytest.mark.parametrize("case", ["llama", "stack"])
def test_the_circuit_json(case):
    model = Stack() if case == "stack" else hf_model(case)
    clean, corrupted = pair(P=2, L=7, where=2)
    stages = []
    circuit = find_circuit(
        model,
        clean,
        corrupted,
        answer=[5, 6],
        wrong=[7, 8],
        exact_top=6,
        progress=lambda stage, done, total: stages.append(stage),
    )
    assert isinstance(circuit, Circuit)
    d = json.loads(json.dumps(circuit.to_dict()))
    assert set(d) == KEYS and d["method"] == "eap" and d["metric"] == "logit_diff" and d["steps"] is None
    assert d["bootstrap"] is None  # no resamples asked
    assert d["prompts"][1] == {
        "clean": clean[1].tolist(),
        "corrupted": corrupted[1].tolist(),
        "answer": 6,
        "wrong": 8,
    }
    assert len(d["tokens"]) == 7 and {"attribution", "exact", "faithfulness"} <= set(stages)
    metric = logit_difference([5, 6], [7, 8])
    est = edge_attribution(model, clean, corrupted, metric)
    assert [e["scores"]["eap"] for e in d["edges"]] == pytest.approx(est.scores.tolist(), abs=1e-5)
    top = est.top(6)
    exact = patch_edges(model, clean, corrupted, metric, [est.graph.edges[e] for e in top]).effect
    assert [d["edges"][e]["scores"]["exact"] for e in top] == pytest.approx(exact.tolist(), abs=1e-5)
    assert sum("exact" in e["scores"] for e in d["edges"]) == 6
    assert d["agreement"]["top_k"] == 3 and -1 <= d["agreement"]["spearman"] <= 1
    curve = faithfulness(model, clean, corrupted, metric, est.scores)
    assert d["faithfulness"]["sizes"] == curve.sizes
    assert d["faithfulness"]["recovered"] == pytest.approx(curve.recovered.tolist(), abs=1e-5)
    chosen = d["circuit"]
    assert chosen["fraction"] == 0.8 and chosen["recovered"] >= 0.8
    assert sorted(chosen["edges"]) == sorted(curve.order[: len(chosen["edges"])])
    touched = {d["edges"][e]["sender"] for e in chosen["edges"]} | {d["edges"][e]["receiver"] for e in chosen["edges"]}
    assert set(chosen["nodes"]) == touched
    ids = {n["id"] for n in d["nodes"]}
    assert {"embed", "logits", "L0.H0", "L0.KV0", "L0.MLP"} <= ids
    head = d["node_details"]["L1.H2"]
    assert len(head["pattern"]) == 7 and all(len(row) == 7 for row in head["pattern"])
    assert sum(head["pattern"][6]) == pytest.approx(1, abs=1e-3) and head["pattern"][0][1] == 0
    assert isinstance(head["direct_effect"], float) and d["node_details"]["L0.MLP"]["pattern"] is None


def test_methods_and_metrics():
    model = hf_model("llama")
    clean, corrupted = pair(P=2, L=6, where=2)
    common = dict(answer=[5, 6], wrong=[7, 8])
    exact = find_circuit(model, clean, corrupted, method="exact", metric="prob", **common).to_dict()
    assert exact["agreement"] is None and all(set(e["scores"]) == {"exact"} for e in exact["edges"])
    ig = find_circuit(model, clean, corrupted, method="eap-ig", steps=3, metric="kl", ablation="mean", **common)
    d = ig.to_dict()
    assert (
        d["steps"] == 3 and d["ablation"] == "mean" and d["faithfulness"]["clean_metric"] == pytest.approx(0, abs=1e-6)
    )
    assert all("eap-ig" in e["scores"] for e in d["edges"])


def test_texts_and_bad_arguments(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = ["a", "b", "c", "d", "Mary", "John", "gave", "to", "the", "bag"]
    tok = Tokenizer(WordLevel({w: i + 3 for i, w in enumerate(words)}, unk_token="a"))
    tok.pre_tokenizer = Whitespace()
    hm = HeadModel(hf_model("llama"), tokenizer=tok)
    clean = ["John gave the bag to", "Mary gave the bag to"]
    corrupted = ["Mary gave the bag to", "John gave the bag to"]
    c = find_circuit(hm, clean, corrupted, answer=["Mary", "John"], wrong=["John", "Mary"], exact_top=0)
    d = c.to_dict()
    assert d["prompts"][0] == {"clean": clean[0], "corrupted": corrupted[0], "answer": "Mary", "wrong": "John"}
    assert d["agreement"] is None and len(d["tokens"]) == 5
    common = dict(answer="Mary", wrong="John")
    with pytest.raises(ValueError, match="clean: every prompt"):
        find_circuit(hm, ["John gave the bag", "Mary gave the bag to"], corrupted, **common)
    with pytest.raises(ValueError, match=r"answer\[0\]: 'Mary John' is 2 tokens"):
        find_circuit(hm, clean, corrupted, answer="Mary John", wrong="John")
    with pytest.raises(ValueError, match="metric: 'kl'"):
        find_circuit(hm, clean, corrupted, metric="kl", **common)
    with pytest.raises(ValueError, match="method"):
        find_circuit(hm, clean, corrupted, method="acdc", **common)
    with pytest.raises(ValueError, match="fraction"):
        find_circuit(hm, clean, corrupted, fraction=0, **common)
    with pytest.raises(ValueError, match="answer: expected one answer per prompt pair"):
        find_circuit(hm, clean, corrupted, answer=["Mary"], wrong="John")
    with pytest.raises(ValueError, match="corrupted: expected the clean prompts' shape"):
        find_circuit(hm, clean, corrupted[:1], **common)
    with pytest.raises(ValueError, match=r"wrong\[0\]: token id 999"):
        find_circuit(hm, clean, corrupted, answer="Mary", wrong=999)
    with pytest.raises(ValueError, match="exact_top"):
        find_circuit(hm, clean, corrupted, exact_top=-1, **common)
    assert torch.is_tensor(c.to_dict()["faithfulness"]["sizes"]) is False
