"""``--importance``'s default route across ranks (:func:`headwise.study.estimate_across_ranks`): two gloo ranks, each
with its share of the batches, equal to the one-process :func:`headwise.study.estimate_importance` (the estimate,
Michel et al.'s importance, the measured heads and their values, the curves); and the ``reduce`` seam over two
thread "ranks", whichever way the batches are dealt."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _corpus import make_corpus, make_model  # noqa: E402

#: One process against its batches split over ranks: the float64 sums added in another order, and zero ablation's rows
#: packed into parts within each rank's share (other parts: float32 products of other shapes, measured 8e-8 apart).
TOL = 1e-6
CASES = [{"seed": 1, "top_k": 3, "random_heads": 2}, {"seed": 0, "top_k": 2, "random_heads": 1, "mode": "mean"}]


@pytest.fixture(scope="module")
def decoder(tmp_path_factory, one_thread):  # ranks run one thread each: the reference too
    root = tmp_path_factory.mktemp("est")
    model, corpus = make_model(root / "model"), make_corpus(root / "corpus.txt", lines=12, seed=3)
    lines = [line for line in corpus.read_text(errors="replace").splitlines() if line.strip()][:12]
    return root, model, lines


def _batches(hm, lines):
    from headwise.study import text_batches

    return list(text_batches(hm, lines, 4, lambda m: None))  # 3 batches of 4 lines


def _same(got: dict, want, tol=TOL) -> None:
    for name in ("estimate", "importance", "ablation"):
        np.testing.assert_allclose(got[name], getattr(want, name), rtol=0, atol=tol, err_msg=name)
    np.testing.assert_array_equal(got["measured"], want.measured)
    assert abs(got["base_loss"] - want.base_loss) <= tol
    assert (got["tokens"], got["sequences"]) == (want.num_tokens, want.num_sequences)
    for name, curve in want.curves.items():
        np.testing.assert_allclose(got["curves"][name], curve, rtol=0, atol=tol, err_msg=name)


def _as_dict(r) -> dict:
    names = ("estimate", "importance", "ablation", "measured", "base_loss", "curves")
    return {name: getattr(r, name) for name in names} | {"tokens": r.num_tokens, "sequences": r.num_sequences}


@pytest.mark.slow  # two gloo ranks spawned: 6 s
def test_two_gloo_ranks_equal_one_process(decoder, launch_world):
    import torch

    from headwise.models import open_model
    from headwise.study import estimate_importance

    root, model, lines = decoder
    workdir = root / "world"
    workdir.mkdir()
    torch.save({"model": str(model), "lines": lines, "batch_size": 4, "cases": CASES}, workdir / "cases.pt")
    ranks = launch_world("estimate_worker.py", 2, workdir)
    assert [r["world"] for r in ranks] == [2, 2]
    hm = open_model(model)
    batches = _batches(hm, lines)
    for k, options in enumerate(CASES):
        want = estimate_importance(hm, batches, **options)
        first, second = ranks[0]["runs"][k], ranks[1]["runs"][k]
        assert sorted(first["batches"] + second["batches"]) == [0, 1, 2] and first["batches"] and second["batches"]
        assert first["payload_bytes"] == second["payload_bytes"] > 0
        for got in (first, second):
            _same(got, want)


@pytest.mark.parametrize("split", [[[0, 2], [1]], [[1], [0, 2]]])
def test_reduce_seam_over_two_thread_ranks_equals_one_process(decoder, split):
    import sys
    from pathlib import Path

    from headwise.models import open_model
    from headwise.study import estimate_importance

    sys.path.insert(0, str(Path(__file__).parent))
    import test_importance_ranks as sys_path_ranks

    _, model, lines = decoder
    hm = open_model(model)
    batches = _batches(hm, lines)
    want = estimate_importance(hm, batches, **CASES[0])
    ranks = sys_path_ranks.ThreadRanks(2)
    models = [open_model(model) for _ in range(2)]  # a rank's own model (its hooks are the module's)

    def run(rank):
        mine = [batches[i] for i in split[rank]]
        return estimate_importance(models[rank], mine, reduce=ranks.reduce(rank), **CASES[0])

    got = ranks.run(run)
    # the estimate, the first round's heads with the pruning sets, then one call for each later round of the search
    assert ranks.calls == 2 + want.search["rounds"] - 1
    for rank in range(2):
        _same(_as_dict(got[rank]), want)
    with pytest.raises(AssertionError):  # the comparison can fail: one rank's share alone differs
        _same(_as_dict(estimate_importance(hm, batches[:1], **CASES[0])), want)
