"""``circuit.html``'s data: the columns hold the circuit's edges, the scores each method gave, the details."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from _circuit_dicts import make_circuit
from headwise.viz.circuit import edge_scores
from headwise.viz.circuit_page import DEFAULT_EDGES, circuit_page_payload, render_circuit_page, write_circuit_page


def _embedded(html: str) -> dict:
    blob = re.search(r'<script type="application/json" id="circuit-data">(.*?)</script>', html, re.S).group(1)
    return json.loads(blob)


def test_the_payload_holds_every_edge_as_columns():
    d = make_circuit(layers=2, heads=4, kv_groups=2)
    p = circuit_page_payload(d)
    ids = [n["id"] for n in p["nodes"]]
    assert ids == [n["id"] for n in d["nodes"]]
    got = [(ids[s], ids[r], p["input_names"][i]) for s, r, i in zip(p["senders"], p["receivers"], p["inputs"])]
    assert got == [(e["sender"], e["receiver"], e["input"]) for e in d["edges"]]
    assert p["methods"] == ["eap", "exact"] and p["method"] == "eap"
    for m in p["methods"]:
        assert p["scores"][m] == pytest.approx(edge_scores(d, m).tolist(), rel=1e-5, abs=1e-9)
    assert p["measured"] == {"eap": len(d["edges"]), "exact": len(d["edges"])}
    assert p["circuit_edges"] == d["circuit"]["edges"] and p["circuit"]["nodes"] == d["circuit"]["nodes"]
    assert p["default_edges"] == min(DEFAULT_EDGES, len(d["edges"]))
    assert p["rows"][0] == "embed" and p["rows"][-1] == "logits"
    head = d["node_details"]["L1.H2"]
    np.testing.assert_allclose(p["details"]["L1.H2"]["pattern"], head["pattern"], atol=1e-4, rtol=0)
    assert p["details"]["L1.H2"]["direct_effect"] == pytest.approx(head["direct_effect"])
    assert p["title"] == d["model"] and "eap" in p["subtitle"] and "corrupted ablation" in p["subtitle"]


def test_an_exact_score_on_some_edges_is_counted_and_the_rest_fall_back():
    d = make_circuit(layers=1, heads=2, kv_groups=1, methods=("eap-ig", "exact"))
    for e in d["edges"][3:]:
        del e["scores"]["exact"]
    p = circuit_page_payload(d)
    assert p["measured"] == {"eap-ig": len(d["edges"]), "exact": 3}
    assert p["scores"]["exact"][3:] == p["scores"]["eap-ig"][3:]
    exact = [e["scores"]["exact"] for e in d["edges"][:3]]
    assert p["scores"]["exact"][:3] == pytest.approx(exact, rel=1e-5)  # kept to 6 significant digits


def test_the_circuit_method_is_listed_first_and_qk_terms_are_kept():
    d = make_circuit(layers=1, heads=2, kv_groups=None, methods=("exact", "eap"))
    d["method"] = "eap"
    terms = [
        {"query_part": "L0.H1", "key_part": "embed", "value": 1.5},
        {"query_part": "embed", "key_part": "embed", "value": -0.25},
    ]
    d["node_details"]["L0.H1"]["qk"] = {"query": 4, "key": 2, "terms": terms}
    p = circuit_page_payload(d, title="T", subtitle="S")
    assert p["methods"] == ["eap", "exact"] and p["method"] == "eap"
    assert p["details"]["L0.H1"]["qk"] == {"query": 4, "key": 2, "terms": terms}
    assert (p["title"], p["subtitle"]) == ("T", "S")


def test_the_page_embeds_the_data_safely(tmp_path):
    d = make_circuit(layers=1, heads=2, kv_groups=1)
    d["tokens"][1] = "</script><b>x"
    d["prompts"][0]["clean"] = "<!-- a </script> b"
    html = render_circuit_page(circuit_page_payload(d))
    assert html.lower().count("</script") == 2  # the data block's and the script's own ends, nothing from the data
    assert "http://" not in html and "https://" not in html  # nothing fetched
    back = _embedded(html)
    assert back["tokens"][1] == "</script><b>x" and back["prompts"][0]["clean"] == "<!-- a </script> b"
    path = write_circuit_page(d, tmp_path / "circuit.html")
    assert path.read_text(encoding="utf-8") == html
    assert sorted(p.name for p in tmp_path.iterdir()) == ["circuit.html"]


def test_a_malformed_circuit_writes_nothing(tmp_path):
    d = make_circuit(layers=1, heads=2, kv_groups=1)
    d["edges"][0]["receiver"] = "nowhere"
    with pytest.raises(ValueError, match="receiver 'nowhere', which is not a node"):
        write_circuit_page(d, tmp_path / "circuit.html")
    assert list(tmp_path.iterdir()) == []


def test_a_bootstrap_gives_each_edge_its_survival():
    d = make_circuit(layers=2, heads=4, kv_groups=2)
    assert circuit_page_payload(d)["survival"] is None and circuit_page_payload(d)["bootstrap"] is None
    rng = np.random.default_rng(0)
    for e in d["edges"]:
        e["survival"] = float(rng.uniform())
    d["bootstrap"] = {"resamples": 50, "pairs": 8, "size": 6, "circuit_jaccard": 0.8312345678, "stable_share": 0.5,
                      "jaccard": [0.1]}  # fmt: skip
    p = circuit_page_payload(d)
    assert p["survival"] == pytest.approx([e["survival"] for e in d["edges"]], abs=1e-3)
    assert p["bootstrap"] == {"resamples": 50, "pairs": 8, "size": 6, "circuit_jaccard": 0.831235, "stable_share": 0.5}
