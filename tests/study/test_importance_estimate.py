"""``--importance``'s default route (:func:`headwise.study.estimate_importance`) against independent references: the
measured heads against one :func:`headwise.hf.ablate` per head (so a verification that read the estimate's numbers
fails), the estimate against the attention-aware estimator called by hand (so a route that dropped the QK fix
fails), Michel et al.'s importance against the gates' pass, the agreement block by hand, and the encoder's estimate
against the forward-mode turning rate."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from _decoders import save_decoder  # noqa: E402

LINES = [
    "the cat sat on the mat .",
    "god saw the light , and it was good .",
    "one two three red blue",
    "in the beginning god created the earth .",
    "the mat sat on the cat",
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama with sharp heads (init 0.5): its estimate is far from exact, and the QK fix changes it."""
    from headwise.models import open_model
    from headwise.study import importance_batches

    hm = open_model(save_decoder(tmp_path_factory.mktemp("llama"), "llama", init=0.5))
    return hm, importance_batches(hm, LINES, None, 2, lambda m: None)  # 3 batches, padded


def _brute(hm, batches, layer: int, head: int, mode: str) -> float:
    """The objective with one head removed by Hugging Face's own module hooks, minus the intact one."""
    from headwise.analysis.objective import objective
    from headwise.hf import ablate

    base = objective(hm, batches)[0]
    with ablate(hm.model, {layer: [head]}, mode=mode):
        return objective(hm, batches)[0] - base


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_measured_heads_are_measured_not_estimated(llama, mode):
    """Every measured head equals a one-head-at-a-time ablation through hf.ablate; the others are NaN. The estimate is
    far from those values here, so reading it instead of measuring fails this test."""
    from headwise.study import estimate_importance

    hm, batches = llama
    r = estimate_importance(hm, batches, mode=mode, top_k=3, random_heads=2, seed=1)
    h = hm.num_heads
    assert len(r.measured) >= 5 and len(set(r.measured.tolist())) == len(r.measured)
    exact = r.ablation.ravel()
    assert np.isnan(np.delete(exact, r.measured)).all() and not np.isnan(exact[r.measured]).any()
    brute = np.array([_brute(hm, batches, int(f) // h, int(f) % h, mode) for f in r.measured])
    np.testing.assert_allclose(exact[r.measured], brute, rtol=0, atol=2e-5)
    assert np.abs(r.estimate.ravel()[r.measured] - brute).max() > 1e-2  # the mutation would be caught
    # the top k by |estimate| come first, then Michel et al.'s top k among the rest
    order = np.argsort(-np.abs(r.estimate.ravel()), kind="stable")[:3]
    np.testing.assert_array_equal(r.measured[:3], order)
    assert set(np.argsort(-r.importance.ravel(), kind="stable")[:3].tolist()) <= set(r.measured.tolist())
    assert r.search["why"][:3] == ["estimate"] * 3 and r.search["counts"]["random"] == 2


def _estimate_by_hand(hm, batches, aware: bool) -> np.ndarray:
    """Σ over the batches of the attention-aware estimator of each row's summed next-token loss, ÷ the scored
    tokens: the route's estimate, computed on the padded batches as given."""
    import torch

    from headwise.analysis.objective import decoder_targets, token_losses
    from headwise.circuits.head_estimates import head_ablation_estimates

    total, count = 0.0, 0
    for batch in batches:
        ids, _, targets, chosen = decoder_targets(batch, "next_token")
        count += int(chosen.sum())

        def metric(logits, chosen=chosen, targets=targets):
            N, L, V = logits.shape
            index = chosen.reshape(-1).nonzero()[:, 0]
            ce = token_losses(logits.reshape(-1, V)[index], targets.reshape(-1)[index])
            return torch.zeros(N, dtype=ce.dtype).index_add(0, index // L, ce)

        with torch.no_grad():
            total = total + head_ablation_estimates(hm, ids, metric, attention_aware=aware).double().numpy()
    return total / count


def _check_attention_aware(result, hm, batches) -> None:
    aware, plain = _estimate_by_hand(hm, batches, True), _estimate_by_hand(hm, batches, False)
    assert np.abs(aware - plain).max() > 1e-3  # the QK fix matters on this model
    np.testing.assert_allclose(result.estimate, aware, rtol=1e-4, atol=1e-5)


def test_the_default_route_is_attention_aware(llama, monkeypatch):
    """The route's estimate is the attention-aware one; with the estimator swapped for plain attribution patching
    (the QK fix removed) the same check fails."""
    from headwise.study import estimate_importance
    from headwise.study import importance_estimate as route

    hm, batches = llama
    _check_attention_aware(estimate_importance(hm, batches, top_k=1, random_heads=0, grid=(0.0,)), hm, batches)

    def plain(estimates, wired, hm, ids, metric, **kwargs):
        return estimates(wired, ids, metric, attention_aware=False, **kwargs)

    monkeypatch.setattr(route, "_attention_aware", plain)
    mutated = estimate_importance(hm, batches, top_k=1, random_heads=0, grid=(0.0,))
    with pytest.raises(AssertionError):
        _check_attention_aware(mutated, hm, batches)


def test_michel_importance_and_the_intact_loss_come_from_the_same_pass(llama):
    """Michel et al.'s importance from the estimator's per-row gate gradients equals the gates' own pass; the intact
    loss equals the objective."""
    from headwise.analysis import head_importance
    from headwise.analysis.objective import objective
    from headwise.study import estimate_importance

    hm, batches = llama
    r = estimate_importance(hm, batches, top_k=2, random_heads=1)
    want = head_importance(hm, batches, seed=0, points=3, random_orders=1)
    np.testing.assert_allclose(r.importance, want.importance, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(r.importance_norm, want.importance_norm, rtol=1e-4, atol=1e-6)
    assert r.base_loss == pytest.approx(objective(hm, batches)[0], abs=1e-5)
    assert (r.num_sequences, r.num_tokens) == (want.num_sequences, want.num_tokens)
    # the curve: the grid's points, the first the intact loss, the last every head removed (one set for all orders)
    from headwise.study import GRID

    n = hm.num_layers * hm.num_heads
    np.testing.assert_array_equal(r.removed, np.unique(np.round(np.array(GRID) * n)))
    last = [c[-1] for c in r.curves.values()]
    assert max(last) - min(last) < 1e-9 and r.curves["estimate"][0] == r.base_loss


def test_agreement_by_hand():
    from headwise.study import agreement

    estimate = np.array([0.5, -0.2, 0.1, 0.0, 0.3])
    exact = np.array([0.4, -0.5, np.nan, 0.05, 0.35])
    measured = np.array([0, 4, 1, 3])  # top 2 by |estimate| (0, 4), then two "random" heads
    a = agreement(estimate, exact, measured, 2)
    # ranks of the estimate (0.5, 0.3, -0.2, 0.0) = (3, 2, 0, 1); of exact (0.4, 0.35, -0.5, 0.05) = (3, 2, 0, 1)
    assert a["spearman"] == pytest.approx(1.0)
    # the two largest |exact| among the measured: heads 1 (0.5) and 0 (0.4); the estimate's top 2: 0 and 4
    assert a["top_k_overlap"] == 0.5
    assert a["largest_error"]["flat"] == 1 and a["largest_error"]["error"] == pytest.approx(0.3)
    assert a["random_largest_exact"] == pytest.approx(0.5)
    assert a["random_mean_abs_error"] == pytest.approx((0.3 + 0.05) / 2)


def test_bad_arguments_name_themselves(llama):
    from headwise.study import estimate_importance

    hm, batches = llama
    with pytest.raises(ValueError, match=r"top_k: expected 1 … 8 \(the model's heads\), got 9"):
        estimate_importance(hm, batches, top_k=9)
    with pytest.raises(ValueError, match="random_heads: expected ≥ 0, got -1"):
        estimate_importance(hm, batches, random_heads=-1)
    with pytest.raises(ValueError, match=r"max_exact: expected at least top_k \(3\) heads, got 2"):
        estimate_importance(hm, batches, top_k=3, max_exact=2)
    with pytest.raises(ValueError, match="mode"):
        estimate_importance(hm, batches, mode="resample")
    with pytest.raises(ValueError, match="batches: expected at least one batch"):
        estimate_importance(hm, [])
