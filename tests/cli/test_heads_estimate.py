"""``headwise heads --importance``'s default route: every head estimated, the top ``--top-k`` and a few random heads
measured exactly (equal to one :func:`headwise.hf.ablate` per head), the agreement in heads.json, the pruning curve
at the small grid, the files written whole; ``--exact`` the full sweep; bad options one line, exit 2, nothing
written."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from _cli_helpers import assert_user_error

pytest.importorskip("transformers")

from _decoders import save_decoder  # noqa: E402

LINES = "the cat sat on the mat .\ngod saw the light , and it was good .\none two three red blue\n"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_decoder(tmp_path_factory.mktemp("llama"), "llama", init=0.5)


def _corpus(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text(LINES)
    return path


def test_importance_estimates_every_head_and_measures_the_top(run_cli, tmp_path, llama):
    from headwise.analysis.objective import objective
    from headwise.hf import ablate
    from headwise.models import open_model
    from headwise.study import GRID, importance_batches

    out = tmp_path / "o"
    argv = ["heads", "--model", str(llama), "--corpus", str(_corpus(tmp_path)), "--importance", "--top-k", "3"]
    outcome = run_cli(*argv, "--out", str(out))
    assert outcome.code == 0, outcome.err
    data = json.loads((out / "heads.json").read_text())
    imp = data["importance"]
    assert imp["route"] == "estimate" and "attention-aware" in imp["estimator"]
    search = imp["exact_heads"]
    assert search["top_k"] == 3 and search["why"][:3] == ["estimate"] * 3 and search["stopped"] == "complete"
    assert sum(search["counts"].values()) == len(search["heads"]) == len(set(map(tuple, search["heads"])))
    assert set(imp["agreement"]) >= {"spearman", "top_k_overlap", "largest_error", "random_largest_exact"}
    rows = data["heads"]
    assert all(isinstance(row["ablation_estimate"], float) for row in rows)
    measured = {tuple(x) for x in imp["exact_heads"]["heads"]}
    assert {(r["layer"], r["head"]) for r in rows if r["ablation_delta"] is not None} == measured
    hm = open_model(llama)
    batches = importance_batches(hm, LINES.splitlines(), None, 32, lambda m: None)
    base = objective(hm, batches)[0]
    for row in rows:
        if row["ablation_delta"] is not None:
            with ablate(hm.model, {row["layer"]: [row["head"]]}, mode="zero"):
                want = objective(hm, batches)[0] - base
            assert row["ablation_delta"] == pytest.approx(want, abs=2e-5)
    lines = list(csv.reader((out / "pruning.csv").open()))
    assert lines[0] == ["removed", "importance", "estimate", "random_mean", "random_min", "random_max"]
    n = len(rows)
    assert [int(r[0]) for r in lines[1:]] == np.unique(np.round(np.array(GRID) * n)).astype(int).tolist()
    header = next(csv.reader((out / "heads.csv").open()))
    assert header[-4:] == ["importance", "importance_norm", "ablation_estimate", "ablation_delta"]
    assert (out / "pruning.png").stat().st_size > 10_000
    said = " ".join(outcome.out.split())
    assert f"every head estimated, {len(measured)} measured exactly (3 by |estimate|" in said
    assert "search complete: no other head's bound reaches the 3rd largest exact effect" in said


def test_exact_runs_the_full_sweep(run_cli, tmp_path, llama):
    out = tmp_path / "o"
    argv = ["heads", "--model", str(llama), "--corpus", str(_corpus(tmp_path)), "--importance", "--exact"]
    outcome = run_cli(*argv, "--out", str(out))
    assert outcome.code == 0, outcome.err
    data = json.loads((out / "heads.json").read_text())
    assert data["importance"]["route"] == "exact"
    assert all(row["ablation_delta"] is not None and "ablation_estimate" not in row for row in data["heads"])
    lines = (out / "pruning.csv").read_text().splitlines()
    assert lines[0] == "removed,importance,ablation,random_mean,random_min,random_max" and len(lines) == 1 + 9


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--exact",), ("--exact", "--importance")),
        (("--importance", "--top-k", "0"), ("--top-k", "positive", "0")),
        (("--importance", "--exact", "--top-k", "3"), ("--top-k", "without --exact")),
        (("--top-k", "3"), ("--top-k", "with --importance")),
        (("--importance", "--top-k", "9"), ("--top-k", "at most the model's 8 heads", "9")),
        (("--importance", "--max-exact", "0"), ("--max-exact", "positive", "0")),
        (("--max-exact", "3"), ("--max-exact", "with --importance")),
        (("--importance", "--top-k", "3", "--max-exact", "2"), ("--max-exact", "at least --top-k (3)", "2")),
        (("--importance", "--max-exact", "1"), ("--max-exact", "at least the 2 heads --top-k seeks", "1")),
    ],
)
def test_bad_importance_options_are_one_line(run_cli, tmp_path, llama, args, words):
    out = tmp_path / "o"
    outcome = run_cli("heads", "--model", str(llama), "--corpus", str(_corpus(tmp_path)), "--out", str(out), *args)
    assert_user_error(outcome, *words)
    assert not out.exists() or not any(out.iterdir())


def test_files_are_written_whole_or_not_at_all(run_cli, tmp_path, llama, monkeypatch):
    """The importance runs before any file is written: a failure inside it leaves the folder empty."""
    from headwise.study import importance_estimate

    def broken(*args, **kwargs):
        raise ValueError("--importance: stopped for the test")

    monkeypatch.setattr(importance_estimate, "estimate_importance", broken)
    out = tmp_path / "o"
    argv = ["heads", "--model", str(llama), "--corpus", str(_corpus(tmp_path)), "--importance", "--out", str(out)]
    outcome = run_cli(*argv)
    assert outcome.code == 2 and outcome.err.strip().splitlines()[-1].endswith("stopped for the test")
    assert not any(out.iterdir())
