"""Faithfulness: every edge kept is the clean run, none kept the corrupted run (or the mean-ablated run), a
circuit's ablation equals the brute force's hand-edited receivers, and the smallest circuit recovers what it
claims."""

from __future__ import annotations

import pytest
import torch

from _circuit_brute import edited_logits, frozen_change, reading_point, receiver_tuple, record
from _patching_models import Stack, hf_model, pair
from headwise.circuits import Faithfulness, build_graph, edge_attribution, faithfulness, smallest_circuit, wiring
from headwise.circuits.faithfulness import size_grid
from headwise.patching import logit_difference

pytest.importorskip("transformers")

METRIC = logit_difference([5, 6], [7, 8])


@pytest.fixture(scope="module", params=["llama", "gpt2", "gemma2", "stack"])
def model(request):
    return Stack() if request.param == "stack" else hf_model(request.param)


def test_all_edges_is_the_clean_run_and_none_the_corrupted(model):
    clean, corrupted = pair(P=2, L=7, where=2)
    scores = edge_attribution(model, clean, corrupted, METRIC).scores
    E = len(scores)
    f = faithfulness(model, clean, corrupted, METRIC, scores, sizes=[0, 3, E], batch_size=2)
    assert isinstance(f, Faithfulness) and f.sizes == [0, 3, E] and f.metric.shape == (2, 3)
    with torch.no_grad():
        m_clean = METRIC(wiring(model).target.logits(clean))
        m_corrupted = METRIC(wiring(model).target.logits(corrupted))
    torch.testing.assert_close(f.metric[:, 2], m_clean, atol=1e-6, rtol=0)  # nothing ablated: no edit at all
    torch.testing.assert_close(f.metric[:, 0], m_corrupted, atol=2e-5, rtol=0)
    assert f.recovered[0] == 0 and abs(float(f.recovered[-1]) - 1) < 1e-5
    assert f.ablated_metric == pytest.approx(f.corrupted_metric, abs=2e-5)


def test_mean_ablation_with_nothing_kept_is_the_mean_run():
    """Every edge ablated to the mean writes: every receiver reads the mean residual, so the logits are those of
    the reference's mean residual at the final norm."""
    model = hf_model("llama")
    clean, corrupted = pair(P=2, L=7, where=2)
    reference = torch.cat([clean, corrupted])
    scores = edge_attribution(model, clean, corrupted, METRIC).scores
    f = faithfulness(model, clean, corrupted, METRIC, scores, sizes=[0], ablation="mean", reference=reference)
    mean_final = record(hf_model("llama", "eager"), reference)["final_in"].mean(0)  # (L, D)
    base = record(hf_model("llama", "eager"), clean)["final_in"]
    expected = METRIC(edited_logits(hf_model("llama", "eager"), clean, [(("logits",), mean_final - base)]))
    torch.testing.assert_close(f.metric[:, 0], expected, atol=2e-4, rtol=0)


def test_a_partial_circuit_equals_the_hand_edited_receivers():
    """Keep every edge but the ones into one query head's and one MLP's inputs from one sender: those receivers
    read the clean residual minus that sender's change (corrupted − clean), everything else clean."""
    model, eager = hf_model("llama"), hf_model("llama", "eager")
    clean, corrupted = pair(P=2, L=7, where=2)
    g = build_graph(wiring(model))
    dropped = [g.edge("e", ("L0.H2", "L1.H3.q")), g.edge("e", ("L0.H2", "L0.MLP"))]
    scores = torch.ones(len(g.edges))
    scores[dropped] = 0  # ranked last
    f = faithfulness(model, clean, corrupted, METRIC, scores, sizes=[len(g.edges) - 2])
    change = frozen_change(eager, clean, corrupted, ["L0.H2"])
    edits = [(receiver_tuple(r), change[reading_point(receiver_tuple(r))]) for r in ("L1.H3.q", "L0.MLP")]
    torch.testing.assert_close(f.metric[:, 1], METRIC(edited_logits(eager, clean, edits)), atol=2e-4, rtol=0)


def test_smallest_circuit_recovers_the_fraction(model):
    clean, corrupted = pair(P=2, L=7, where=2)
    scores = edge_attribution(model, clean, corrupted, METRIC).scores
    f = faithfulness(model, clean, corrupted, METRIC, scores)
    assert f.sizes == size_grid(len(scores))
    n, rec = smallest_circuit(model, clean, corrupted, METRIC, f, 0.8)
    check = faithfulness(model, clean, corrupted, METRIC, scores, sizes=[n - 1, n])
    assert float(check.recovered[-1]) == pytest.approx(rec, abs=1e-5) and rec >= 0.8
    hit = next(k for k, r in enumerate(f.recovered.tolist()) if r >= 0.8)
    assert f.sizes[hit - 1] < n <= f.sizes[hit] and float(check.recovered[-2]) < 0.8


def test_size_grid_and_bad_input():
    assert size_grid(7) == [0, 1, 2, 5, 7] and size_grid(120) == [0, 1, 2, 5, 10, 20, 50, 100, 120]
    model = hf_model("llama")
    clean, corrupted = pair(P=2, L=6)
    scores = edge_attribution(model, clean, corrupted, METRIC).scores
    with pytest.raises(ValueError, match="ablation"):
        faithfulness(model, clean, corrupted, METRIC, scores, ablation="zero")
    with pytest.raises(ValueError, match="scores"):
        faithfulness(model, clean, corrupted, METRIC, scores[:3])
    with pytest.raises(ValueError, match="sizes"):
        faithfulness(model, clean, corrupted, METRIC, scores, sizes=[len(scores) + 1])
    f = faithfulness(model, clean, corrupted, METRIC, scores, sizes=[0, 5])
    with pytest.raises(ValueError, match="fraction"):
        smallest_circuit(model, clean, corrupted, METRIC, f, 1.5)


def test_ablation_a_sender_group_at_a_time_equals_all_senders_stacked(model):
    """The ablated inputs built a sender group at a time (what runs) give the metric of the formula on all
    upstream senders' writes stacked into one (J, P, S', L, D) difference, for random circuits, both ablations."""
    from headwise.circuits.faithfulness import _Ablator, _setup
    from headwise.circuits.paths import stack_writes

    class Stacked(_Ablator):
        def _ablation(self, group, writes, m, upstream, J, P):
            cur = stack_writes(self.graph, writes, upstream)  # (N, S', L, D)
            diff = cur.reshape(J, P, *cur.shape[1:]) - self.ablated[:, :upstream].to(cur.dtype)[None]
            return -torch.einsum("jsn,jpsld->jpnld", m.to(cur.dtype), diff).reshape(J * P, -1, *cur.shape[2:])

    clean, corrupted = pair(P=2, L=7, where=2)
    g = torch.Generator().manual_seed(3)
    for ablation in ("corrupted", "mean"):
        ab, _, _ = _setup(model, clean, corrupted, METRIC, ablation, None)
        kept = torch.rand(4, len(ab.graph.edges), generator=g) < torch.tensor([[0.0], [0.1], [0.5], [0.9]])
        ref = Stacked(ab.w, ab.graph, ab.clean, ab.ablated, METRIC).run(kept)
        got = ab.run(kept)
        assert float((ref[:, 0] - ref[:, -1]).abs().max()) > 1e-3  # the circuits differ
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
