"""The exact heads' search (:class:`headwise.study.importance_search.HeadSearch`) against its rule worked by hand on
made-up scores and effects — the first round, the bounds and the stop — and, on a tiny decoder, against every head
ablated by hand: the exact top k among the heads measured where the search says it is complete."""

from __future__ import annotations

import numpy as np
import pytest

from headwise.study.importance_search import HeadSearch, default_budget


def _run(search: HeadSearch, exact: np.ndarray) -> HeadSearch:
    heads = search.first()
    while heads:
        heads = search.record(heads, exact[heads])
    return search


def _bounds_by_hand(score: np.ndarray, exact: np.ndarray, measured: np.ndarray, margin: float) -> np.ndarray:
    s = np.abs(score)
    return margin * max(abs(exact[f]) / s[f] for f in measured if s[f] > 0) * s


def test_the_first_round_is_each_scores_top_k_then_random_heads():
    est = np.array([0.9, 0.1, 0.8, 0.0, 0.3, 0.2, 0.05, 0.01])
    mic = np.array([0.1, 0.9, 0.85, 0.2, 0.0, 0.3, 0.4, 0.02])
    s = HeadSearch({"estimate": est, "michel": mic}, top_k=2, random=2, seed=3)
    first = s.first()
    assert first[:2] == [0, 2] and first[4] == 1  # michel's top 2 are 1 and 2; 2 is in already
    assert len(first) == 5 and len(set(first)) == 5 and not {0, 1, 2} & set(first[2:4])  # random: in no top 2
    assert [s.why[f] for f in first] == ["estimate", "estimate", "random", "random", "michel"]
    again = HeadSearch({"estimate": est, "michel": mic}, top_k=2, random=2, seed=3).first()
    assert again == first  # seeded
    cut = HeadSearch({"estimate": est, "michel": mic}, top_k=2, random=2, seed=3, budget=4).first()
    assert cut == first[:4]  # a budget below the round cuts Michel's pick, the same random heads drawn


def test_the_search_measures_by_bound_and_stops_when_none_can_enter():
    rng = np.random.default_rng(0)
    n = 60
    mic = rng.uniform(0.01, 1.0, n)
    exact = mic * rng.uniform(0.5, 1.5, n) * rng.choice([-1, 1], n)  # within 1.5 × Michel's score
    est = exact * rng.uniform(-0.2, 1.2, n)  # the estimate's magnitudes often wrong
    scores = {"estimate": est, "michel": mic}
    s = _run(HeadSearch(scores, top_k=5, random=4, seed=1, budget=n, bound="michel"), exact)
    m = s.measured
    assert s.stopped == "complete"
    np.testing.assert_array_equal(s.exact[m], exact[m])
    assert np.isnan(np.delete(s.exact, m)).all()
    bounds = _bounds_by_hand(mic, exact, m, s.margin)
    np.testing.assert_allclose(s.bounds(), bounds, rtol=1e-12)
    t = np.sort(np.abs(exact[m]))[::-1][4]
    assert s.threshold() == pytest.approx(t)
    assert (np.delete(bounds, m) < t).all()  # no unmeasured head can enter, as the factors say
    assert (np.abs(exact[m]) <= bounds[m] + 1e-12).all()  # every measured head within its bound
    assert s.summary(10)["factors"]["michel"] == pytest.approx(max(abs(exact[f]) / mic[f] for f in m))
    top = set(np.argsort(-np.abs(exact))[:5].tolist())
    assert top <= set(m.tolist())
    assert len(m) < n  # it stopped before measuring every head
    assert set(s.why[f] for f in m) >= {"estimate", "michel", "random", "bound"}


def test_a_head_the_estimate_misses_is_found_through_michels_score():
    n = 40
    exact = np.full(n, 0.01)
    exact[:5] = [0.5, 0.4, 0.3, 0.2, 0.1]
    exact[30] = 0.45  # large, but its first-order terms cancel: estimated near 0
    est = exact.copy()
    est[30] = 1e-4
    mic = np.abs(exact) * 1.1
    only_estimate = _run(HeadSearch({"estimate": est}, top_k=3, random=0, budget=n), exact)
    both = _run(HeadSearch({"estimate": est, "michel": mic}, top_k=3, random=0, budget=n, bound="michel"), exact)
    assert 30 not in only_estimate.measured.tolist()
    assert 30 in both.measured.tolist() and both.why[30] == "michel" and both.stopped == "complete"


def test_the_budget_ends_the_search_and_says_so():
    n = 50
    exact = np.linspace(1.0, 0.5, n)
    scores = {"michel": np.ones(n)}  # nothing tells the heads apart: every bound reaches the threshold
    s = _run(HeadSearch(scores, top_k=3, random=2, budget=12, round=4), exact)
    summary = s.summary(10)
    assert len(s.measured) == 12 and summary["stopped"] == "budget" and summary["budget"] == 12
    assert summary["next_bound"] >= summary["threshold"] and summary["candidates_left"] == n - 12
    assert summary["counts"] == {"estimate": 0, "michel": 3, "random": 2, "bound": 7}
    assert summary["heads"][0] == [0, 0] and len(summary["why"]) == 12
    assert summary["rounds"] == 3  # 5 first, then 4 and 3 (the budget's rest)


def test_the_default_budget():
    assert default_budget(270, 10) == 40 and default_budget(72, 10) == 40 and default_budget(6, 2) == 6


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"scores": {}}, "scores"),
        ({"scores": {"a": np.ones(3), "b": np.ones(4)}}, "scores"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 9}, "top_k"),
        ({"random": -1}, "random_heads"),
        ({"budget": 1, "top_k": 2}, "max_exact"),
        ({"bound": "michel"}, "bound"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, named):
    args = {"scores": {"a": np.ones(8)}, "top_k": 2} | kwargs
    with pytest.raises(ValueError, match=named):
        HeadSearch(**args)


@pytest.mark.parametrize("family", ["llama", "gpt2", "mistral", "qwen2"])
def test_on_a_decoder_the_exact_top_k_are_measured(tmp_path, family):
    """A tiny decoder's every head ablated by hand (:func:`headwise.hf.ablate`): where the search stops complete, the
    heads with the k largest |effect| are among those it measured, each value equal to the hand's."""
    pytest.importorskip("transformers")
    from _decoders import save_decoder
    from headwise.analysis.objective import objective
    from headwise.hf import ablate
    from headwise.models import open_model
    from headwise.study import estimate_importance, importance_batches

    hm = open_model(save_decoder(tmp_path, family, init=0.5, layers=4))
    lines = ["the cat sat on the mat .", "god saw the light , and it was good .", "one two three red blue"]
    batches = importance_batches(hm, lines, None, 2, lambda m: None)
    base = objective(hm, batches)[0]
    h = hm.num_heads
    brute = np.zeros(hm.num_layers * h)
    for f in range(brute.size):
        with ablate(hm.model, {f // h: [f % h]}, mode="zero"):
            brute[f] = objective(hm, batches)[0] - base
    r = estimate_importance(hm, batches, top_k=2, random_heads=1, seed=0, grid=(0.0,), max_exact=brute.size)
    m = r.measured
    np.testing.assert_allclose(r.ablation.ravel()[m], brute[m], rtol=0, atol=2e-5)
    assert r.search["stopped"] == "complete" and len(m) < brute.size, r.search  # it stopped before every head
    assert set(np.argsort(-np.abs(brute), kind="stable")[:2].tolist()) <= set(m.tolist())
