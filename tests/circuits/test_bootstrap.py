"""The circuit's bootstrap (:func:`headwise.circuits.bootstrap_circuit`) against the resamples done one by one: the
same draws, each resample's scores as the mean over its drawn pairs, its top-n circuits, their Jaccard with the run's
and with each other, each edge's survival and interval — and :func:`~headwise.circuits.find_circuit`'s bootstrap
equal to it on the per-pair scores computed apart; the command's option, its line and its mistakes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from headwise.circuits.bootstrap import STABLE, bootstrap_circuit


def _by_hand(per_pair: np.ndarray, sizes: list[int], size: int, resamples: int, seed: int) -> dict:
    P, E = per_pair.shape
    draws = np.random.default_rng(seed).integers(0, P, size=(resamples, P))
    scores = np.stack([per_pair[d].mean(0) for d in draws])  # (B, E)

    def top(s, n):
        return set(np.argsort(-np.abs(s), kind="stable")[:n].tolist())

    base = per_pair.astype(np.float32).mean(0)
    out = {"jaccard": [], "jaccard_min": [], "jaccard_pairwise": []}
    for n in sorted(set(sizes) | {size}):
        mine = top(base, n)
        sets = [top(s, n) for s in scores]
        jac = [len(s & mine) / len(s | mine) for s in sets]
        out["jaccard"].append(np.mean(jac))
        out["jaccard_min"].append(min(jac))
        out["jaccard_pairwise"].append(
            np.mean([len(a & b) / len(a | b) for i, a in enumerate(sets) for j, b in enumerate(sets) if i != j])
        )
        if n == size:
            out["survival"] = np.array([np.mean([e in s for s in sets]) for e in range(E)])
            out["stable_share"] = np.mean([out["survival"][e] >= STABLE for e in mine])
    out["low"], out["high"] = np.percentile(scores, [2.5, 97.5], axis=0)
    return out


def test_the_bootstrap_equals_the_resamples_one_by_one():
    rng = np.random.default_rng(4)
    P, E = 12, 40
    per_pair = (rng.normal(0, 1, E) * 2 + rng.normal(0, 1.5, (P, E))).astype(np.float32)
    got = bootstrap_circuit(torch.from_numpy(per_pair), [3, 8, 20], 5, resamples=30, seed=7)
    want = _by_hand(per_pair.astype(np.float64), [3, 8, 20], 5, 30, 7)
    assert got["sizes"] == [3, 5, 8, 20] and got["size"] == 5 and got["resamples"] == 30 and got["pairs"] == P
    for key in ("jaccard", "jaccard_min", "jaccard_pairwise"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-12, err_msg=key)
    for key in ("low", "high", "survival"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-9, atol=1e-12, err_msg=key)
    assert got["stable_share"] == pytest.approx(want["stable_share"])
    assert got["circuit_jaccard"] == pytest.approx(want["jaccard"][1])
    assert min(got["jaccard"]) < 1  # noisy pairs: the resamples' circuits differ


def test_identical_pairs_give_one_circuit():
    row = np.linspace(-1, 2, 25)
    got = bootstrap_circuit(torch.tensor(np.tile(row, (6, 1))), [2, 10], 4, resamples=10)
    assert got["jaccard"] == [1.0, 1.0, 1.0] and got["jaccard_pairwise"] == [1.0, 1.0, 1.0]
    assert got["stable_share"] == 1.0
    np.testing.assert_allclose(got["low"], row)
    np.testing.assert_allclose(got["high"], row)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"resamples": 1}, "resamples"),
        ({"resamples": True}, "resamples"),
        ({"size": 0}, "sizes"),
        ({"sizes": [41]}, "sizes"),
        ({"per_pair": torch.ones(40)}, "per_pair"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, named):
    args = {"per_pair": torch.ones(3, 40), "sizes": [2], "size": 2, "resamples": 5} | kwargs
    with pytest.raises(ValueError, match=named):
        bootstrap_circuit(args.pop("per_pair"), args.pop("sizes"), args.pop("size"), **args)


PAIRS = [
    ("the cat sat on the mat and the dog", "the dog sat on the mat and the dog", "cat", "dog"),
    ("a dog ran to the tree and the cat", "a cat ran to the tree and the cat", "dog", "cat"),
    ("a cat ran to the tree and the dog", "a dog ran to the tree and the dog", "cat", "dog"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    pytest.importorskip("transformers")
    from _decoders import save_decoder

    return save_decoder(tmp_path_factory.mktemp("boot") / "llama", "llama", init=0.5)


def _ids(hm):
    c = torch.tensor([hm.tokenizer.encode(p[0]).ids for p in PAIRS])
    x = torch.tensor([hm.tokenizer.encode(p[1]).ids for p in PAIRS])
    return c, x, [hm.tokenizer.token_to_id(p[2]) for p in PAIRS], [hm.tokenizer.token_to_id(p[3]) for p in PAIRS]


@pytest.mark.parametrize("method", ["eap", "atp*"])
def test_find_circuit_bootstraps_the_per_pair_scores(folder, method):
    """find_circuit's bootstrap equals bootstrap_circuit on the per-pair scores of edge_attribution run apart, and
    lands on the edges and in circuit.json."""
    from headwise.circuits import edge_attribution, find_circuit, wiring
    from headwise.circuits.metrics import make_metric
    from headwise.models import open_model

    hm = open_model(folder)
    c, x, answer, wrong = _ids(hm)
    found = find_circuit(hm, c, x, answer=answer, wrong=wrong, method=method, exact_top=0, bootstrap=25, seed=3)
    report = found.to_dict()
    fn = make_metric("logit_diff", torch.tensor(answer), torch.tensor(wrong))
    per_pair = edge_attribution(wiring(hm), c, x, fn, method=method).per_pair
    sizes = [n for n in report["faithfulness"]["sizes"] if n > 0]
    want = bootstrap_circuit(per_pair, sizes, len(report["circuit"]["edges"]),
                             resamples=25, seed=3)  # fmt: skip
    boot = report["bootstrap"]
    for key in ("jaccard", "jaccard_min", "jaccard_pairwise", "sizes"):
        np.testing.assert_allclose(boot[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)
    edges = report["edges"]
    np.testing.assert_allclose([e["interval"][0] for e in edges], want["low"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose([e["survival"] for e in edges], want["survival"], atol=1e-4)
    assert all(e["interval"][0] <= e["interval"][1] for e in edges)
    json.dumps(report, allow_nan=False)
    plain = find_circuit(hm, c, x, answer=answer, wrong=wrong, method=method, exact_top=0).to_dict()
    assert plain["bootstrap"] is None and "interval" not in plain["edges"][0]
    with pytest.raises(ValueError, match="bootstrap: expected 0"):
        find_circuit(hm, c, x, answer=answer, wrong=wrong, bootstrap=1)
