"""``--ablation zero|mean`` of ``headwise heads --importance`` and ``headwise lab prune``: the CLI's numbers equal the
library's with that mode, and a bad value is one line, exit 2, nothing written."""

from __future__ import annotations

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


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_heads_ablation_mode_equals_the_library(run_cli, tmp_path, llama, mode):
    from headwise import study
    from headwise.analysis import head_importance
    from headwise.models import open_model

    corpus = tmp_path / "c.txt"
    corpus.write_text(LINES)
    out = tmp_path / "o"
    outcome = run_cli(
        "heads",
        "--model",
        str(llama),
        "--corpus",
        str(corpus),
        "--importance",
        "--exact",
        "--ablation",
        mode,
        "--out",
        str(out),
    )
    assert outcome.code == 0, outcome.err
    data = json.loads((out / "heads.json").read_text())
    assert data["importance"]["sweep"]["mode"] == mode
    hm = open_model(llama, backend=study.heads_backend(study.HeadsOptions(importance=True)))  # the command's route
    batches = study.importance_batches(hm, LINES.splitlines(), None, 32, lambda m: None)
    want = head_importance(hm, batches, seed=0, mode=mode)
    got = np.array([row["ablation_delta"] for row in data["heads"]]).reshape(want.ablation.shape)
    np.testing.assert_allclose(got, want.ablation, rtol=0, atol=1e-9)
    other = head_importance(hm, batches, seed=0, mode="zero" if mode == "mean" else "mean")
    assert np.abs(other.ablation - want.ablation).max() > 1e-4  # the option changes what is measured


def test_bad_ablation_is_one_line(run_cli, tmp_path):
    """Checked before any model is opened (the folder named need not exist)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(LINES)
    out = tmp_path / "o"
    argv = ["heads", "--model", str(tmp_path / "unopened"), "--corpus", str(corpus), "--importance", "--out", str(out)]
    outcome = run_cli(*argv, "--ablation", "resample")
    assert_user_error(outcome, "--ablation", "resample", "zero", "mean")
    assert not out.exists()
    outcome = run_cli("lab", "prune", "--model", str(tmp_path / "missing"), "--ablation", "half")
    assert_user_error(outcome, "--ablation", "half")
