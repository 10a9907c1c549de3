"""MIB's format: every edge of MIB's graph named as MIB names it (counted independently), scores back and forth, GQA's
shares, MIB's pruning (its own loop, copied), the files written whole, the curve's areas by MIB's formula, a file
of exact scores beating random ones, and every bad file refused in one line."""

from __future__ import annotations

import json
import math

import pytest
import torch

from _anatomy_models import tiny
from _patching_models import hf_model, pair
from headwise.circuits import build_graph, evaluate_mib, find_circuit, from_mib, to_mib, wiring, write_mib_dir
from headwise.circuits.areas import MIB_FRACTIONS
from headwise.circuits.mib import mib_circuits, mib_layout, model_width, read_mib
from headwise.circuits.prune import prune

from .test_areas import mib_loop

pytest.importorskip("transformers")


def mib_edge_count(n_layers: int, n_heads: int, parallel: bool) -> int:
    """MIB's edges: each layer's q, k, v per head read every sender before the layer, its MLP every sender before it
    (its own heads too unless parallel), the logits every sender."""
    total = 0
    for layer in range(n_layers):
        upstream = 1 + layer * (n_heads + 1)  # input, and every earlier layer's heads and MLP
        total += upstream * 3 * n_heads + upstream + (0 if parallel else n_heads)
    return total + 1 + n_layers * (n_heads + 1)


def mib_names(n_layers: int, n_heads: int, parallel: bool) -> set[str]:
    names, stream = set(), ["input"]
    for layer in range(n_layers):
        heads = [f"a{layer}.h{h}" for h in range(n_heads)]
        names |= {f"{s}->{h}<{x}>" for s in stream for h in heads for x in "qkv"}
        names |= {f"{s}->m{layer}" for s in (stream if parallel else stream + heads)}
        stream += [*heads, f"m{layer}"]
    return names | {f"{s}->logits" for s in stream}


def _graph(model):
    return build_graph(wiring(model))


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_every_edge_of_mibs_graph_by_mibs_name(family):
    model = hf_model("gpt2") if family == "gpt2" else tiny("gpt_neox")
    graph = _graph(model)
    parallel = family == "gpt_neox"
    assert graph.parallel == [parallel] * 2
    scores = torch.randn(len(graph.edges), generator=torch.Generator().manual_seed(0))
    data = to_mib(graph, scores, None, torch.zeros(len(graph.edges), dtype=torch.bool), d_model=model_width(model))
    assert len(data["edges"]) == mib_edge_count(2, 4, parallel) == len(graph.edges)
    assert set(data["edges"]) == mib_names(2, 4, parallel)
    width = 64 if parallel else 32
    assert data["cfg"] == {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": parallel, "d_model": width}
    assert list(data["nodes"]) == ["input", *[f"a0.h{h}" for h in range(4)], "m0", *[f"a1.h{h}" for h in range(4)],
                                   "m1", "logits"]  # fmt: skip
    assert all(set(v) == {"score", "in_graph"} for v in data["edges"].values())
    torch.testing.assert_close(from_mib(json.loads(json.dumps(data)), graph), scores, rtol=0, atol=0)
    # the names point at the same edges: a head's q, a group's k, an MLP, the logits
    got = {name: data["edges"][name]["score"] for name in ("input->a0.h2<q>", "a0.h1->a1.h3<k>", "m0->m1")}
    want = {
        "input->a0.h2<q>": graph.edge("e", "embed->L0.H2.q"),
        "a0.h1->a1.h3<k>": graph.edge("e", "L0.H1->L1.KV3.k"),
        "m0->m1": graph.edge("e", "L0.MLP->L1.MLP"),
    }
    assert got == {k: float(scores[e]) for k, e in want.items()}


def fake_shares(graph, scores: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """``(E, G)`` as ``EdgeScores.shares`` will be: a k / v edge's score split at random among its group's heads."""
    g = torch.Generator().manual_seed(seed)
    G = max(h // k for h, k in zip(graph.heads, graph.kv))
    shares = torch.zeros(len(graph.edges), G)
    for e, edge in enumerate(graph.edges):
        if edge.input in ("k", "v"):
            w = torch.rand(G, generator=g)
            shares[e] = scores[e] * w / w.sum()
        else:
            shares[e, 0] = scores[e]
    return shares


def test_gqa_edges_carry_each_heads_share():
    model = hf_model("llama")  # 4 heads, 2 key/value groups
    graph = _graph(model)
    E = len(graph.edges)
    scores = torch.randn(E, generator=torch.Generator().manual_seed(1))
    shares = fake_shares(graph, scores)
    flags = torch.zeros(E, dtype=torch.bool)
    with pytest.raises(ValueError, match="shares: None"):
        to_mib(graph, scores, None, flags, d_model=32)
    data = to_mib(graph, scores, shares, flags, d_model=32)
    assert len(data["edges"]) == mib_edge_count(2, 4, False) > E
    assert set(data["edges"]) == mib_names(2, 4, False)
    e = graph.edge("e", "L0.H3->L1.KV0.v")  # group 0 of layer 1: heads 0 and 1
    assert [data["edges"][f"a0.h3->a1.h{h}<v>"]["score"] for h in (0, 1)] == pytest.approx(shares[e].tolist())
    torch.testing.assert_close(from_mib(data, graph), scores, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="add up"):
        to_mib(graph, scores, shares * 1.5, flags, d_model=32)
    with pytest.raises(ValueError, match=r"shares: expected \(82, 2\)"):
        to_mib(graph, scores, shares[:, :1], flags, d_model=32)


def mib_prune(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """EAP-IG's ``Graph.prune`` on (parent, child) edges: drop nodes without a kept edge in (the input excepted) or out,
    then edges whose ends were dropped (the logits always kept), until nothing changes."""
    while True:
        outgoing = {p for p, _ in edges}
        ingoing = {c for _, c in edges} | {"input"}
        nodes = outgoing & ingoing
        kept = {(p, c) for p, c in edges if p in nodes and (c in nodes or c == "logits")}
        if kept == edges:
            return kept
        edges = kept


@pytest.mark.parametrize("seed", range(4))
def test_pruning_is_mibs(seed):
    graph = _graph(hf_model("gpt2"))
    layout = mib_layout(graph)
    g = torch.Generator().manual_seed(seed)
    kept = torch.rand(6, len(graph.edges), generator=g) < torch.tensor([0.05, 0.1, 0.2, 0.3, 0.5, 0.8])[:, None]
    pruned = prune(graph, kept)
    ends = {e: (name.split("->")[0], name.split("->")[1].split("<")[0]) for name, e, _ in layout}
    for j in range(kept.shape[0]):
        want = mib_prune({ends[e] for e in kept[j].nonzero().flatten().tolist()})
        assert {ends[e] for e in pruned[j].nonzero().flatten().tolist()} == want
    assert bool(pruned.any()) and bool((kept & ~pruned).any())  # the test saw both kinds


def test_the_files_appear_whole(tmp_path):
    graph = _graph(hf_model("gpt2"))
    scores = torch.randn(len(graph.edges), generator=torch.Generator().manual_seed(2))
    names = write_mib_dir(tmp_path / "mib", graph, scores, None, d_model=32)
    assert names == ["importances.json", *[f"circuit_{f:g}.json" for f in MIB_FRACTIONS]]
    assert sorted(p.name for p in (tmp_path / "mib").iterdir()) == sorted(names)
    circuits = mib_circuits(graph, scores)
    for f, kept in zip(MIB_FRACTIONS, circuits):
        data = json.loads((tmp_path / "mib" / f"circuit_{f:g}.json").read_text())
        flags = [data["edges"][name]["in_graph"] for name, _, _ in mib_layout(graph)]
        assert flags == [bool(kept[e]) for _, e, _ in mib_layout(graph)]
        assert sum(flags) <= int(f * len(graph.edges))
    torch.testing.assert_close(read_mib(tmp_path / "mib" / "importances.json", graph), scores, rtol=0, atol=0)
    llama = _graph(hf_model("llama"))
    with pytest.raises(ValueError, match="shares"):  # refused before anything is written
        write_mib_dir(tmp_path / "gqa", llama, torch.zeros(len(llama.edges)), None, d_model=32)
    assert not (tmp_path / "gqa").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mib"]


def _answers(model, clean, corrupted):
    """The tokens the corruption moves most (answer up, wrong down): a behaviour with a gap worth recovering."""
    with torch.no_grad():
        moved = model(clean).logits[:, -1] - model(corrupted).logits[:, -1]
    return moved.argmax(-1).tolist(), moved.argmin(-1).tolist()


def test_find_circuits_mib_curve_and_exact_scores_beat_random_ones():
    model = hf_model("gpt2")
    graph = _graph(model)
    clean, corrupted = pair(P=3, L=8, where=4)
    answer, wrong = _answers(model, clean, corrupted)
    found = find_circuit(model, clean, corrupted, answer=answer, wrong=wrong, method="exact", exact_top=0)
    mib = found.to_dict()["mib"]
    assert mib["fractions"] == list(MIB_FRACTIONS) and mib["sizes"] == [0, 0, 0, 1, 2, 5, 11, 22, 55, 110]
    assert mib["edges"][-1] == 110 and all(k <= n for k, n in zip(mib["edges"], mib["sizes"]))
    assert mib["faithfulness"][-1] == pytest.approx(1.0, abs=1e-5) and mib["faithfulness"][0] == 0.0
    # CPR and CMD from the stated curve by MIB's own formula
    assert (mib["cpr"], mib["cmd"]) == pytest.approx(mib_loop(mib["faithfulness"], MIB_FRACTIONS), abs=1e-12)
    own = to_mib(graph, found.scores(), None, torch.zeros(110, dtype=torch.bool), d_model=32)
    evaluated = evaluate_mib(model, clean, corrupted, answer=answer, wrong=wrong, data=own)
    assert evaluated["mib"]["faithfulness"] == pytest.approx(mib["faithfulness"], abs=1e-5)
    assert evaluated["mib"]["cpr"] > 0.8
    for seed in range(4):
        noise = torch.randn(110, generator=torch.Generator().manual_seed(seed))
        random_file = to_mib(graph, noise, None, torch.zeros(110, dtype=torch.bool), d_model=32)
        other = evaluate_mib(model, clean, corrupted, answer=answer, wrong=wrong, data=random_file)
        assert other["mib"]["cpr"] < evaluated["mib"]["cpr"] - 0.2, seed


def _file(graph):
    E = len(graph.edges)
    return to_mib(graph, torch.ones(E), None, torch.zeros(E, dtype=torch.bool), d_model=32)


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda d: d.pop("edges"), "cfg, nodes, edges"),
        (lambda d: d["cfg"].update(n_layers=12), "cfg n_layers is 12, but the model has 2"),
        (lambda d: d["cfg"].update(n_heads=8), "cfg n_heads is 8, but the model has 4"),
        (lambda d: d["cfg"].update(parallel_attn_mlp=True), "parallel_attn_mlp"),
        (lambda d: d["edges"].update({"a9.h0->logits": {"score": 1.0, "in_graph": False}}), "'a9.h0->logits'"),
        (lambda d: d["nodes"].update({"a9.h0": {"in_graph": False}}), "node 'a9.h0'"),
        (lambda d: d["edges"].pop("m0->m1"), "1 of the 110 edges"),
        (lambda d: d["edges"]["m0->m1"].update(score=math.inf), "'m0->m1' has score inf"),
        (lambda d: d["edges"]["m0->m1"].update(score="1"), "expected a finite number"),
    ],
)
def test_bad_files_are_one_line(edit, words):
    graph = _graph(hf_model("gpt2"))
    data = _file(graph)
    edit(data)
    with pytest.raises(ValueError, match="^the file: ") as caught:
        from_mib(data, graph, source="the file")
    message = str(caught.value)
    assert words in message and "\n" not in message


def test_a_file_that_is_not_json(tmp_path):
    graph = _graph(hf_model("gpt2"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"cfg": {', encoding="utf-8")
    with pytest.raises(ValueError, match=r"'.*bad.json': not JSON"):
        read_mib(bad, graph)
    with pytest.raises(ValueError, match="cannot read"):
        read_mib(tmp_path / "absent.json", graph)


@pytest.mark.parametrize("case", ["gpt2", "llama"])
def test_atp_star_files_split_groups_by_shares_and_beat_random_scores(case):
    """atp*'s own MIB file (GQA llama: k and v edges per query head, from the run's shares) reads back to its group
    scores, and scores a higher CPR than files of random scores on the same pairs."""
    model = hf_model(case)
    graph = _graph(model)
    E = len(graph.edges)
    clean, corrupted = pair(P=3, L=8, where=4)
    answer, wrong = _answers(model, clean, corrupted)
    found = find_circuit(model, clean, corrupted, answer=answer, wrong=wrong, method="atp*", exact_top=0, shares=True)
    assert found.shares is not None and found.shares.shape[0] == E
    torch.testing.assert_close(found.shares.sum(1), found.scores(), atol=1e-5, rtol=1e-5)
    width = model.config.hidden_size if case == "llama" else 32
    own = to_mib(graph, found.scores(), found.shares, torch.zeros(E, dtype=torch.bool), d_model=width)
    torch.testing.assert_close(from_mib(json.loads(json.dumps(own)), graph), found.scores(), atol=1e-5, rtol=1e-5)
    mine = evaluate_mib(model, clean, corrupted, answer=answer, wrong=wrong, data=own)["mib"]["cpr"]
    for seed in range(4):
        noise = torch.randn(E, generator=torch.Generator().manual_seed(seed))
        random_file = to_mib(graph, noise, None if case == "gpt2" else fake_shares(graph, noise, seed),
                             torch.zeros(E, dtype=torch.bool), d_model=width)  # fmt: skip
        other = evaluate_mib(model, clean, corrupted, answer=answer, wrong=wrong, data=random_file)["mib"]["cpr"]
        assert other < mine, (seed, other, mine)
