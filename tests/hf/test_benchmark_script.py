"""``benchmarks/hf_backend.py`` runs end to end on a tiny model (its numbers are not checked here: speed
lives in the benchmark, never in timed tests) and its agreement check holds."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hf_backend.py"


@pytest.mark.slow
def test_the_benchmark_runs_and_checks_agreement(tmp_path):
    spec = importlib.util.spec_from_file_location("hf_backend_bench", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "hf.json"
    args = ["--layers", "1", "--width", "32", "--length", "12", "--batch", "2", "--rounds", "1", "--target", "0.01"]
    results = bench.main([*args, "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert list(results["batches"]) == [
        "no padding",
        "no padding, attention call alone",
        "left padding",
        "left padding, attention call alone",
    ]
    for name, batch in results["batches"].items():
        if name.endswith("alone"):
            assert set(batch["timing"]) == {*bench.PLAIN, "headwise + weights"}
            assert all(row["out"] <= 1e-5 for row in batch["agreement"].values())
        else:
            assert set(batch["timing"]) == set(bench.PLAIN) | set(bench.WEIGHTS)
            assert all(row["logits"] <= 1e-4 for row in batch["agreement"].values())
            assert all(batch["agreement"][n]["weights"] <= 1e-5 for n in bench.WEIGHTS)
