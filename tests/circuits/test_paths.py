"""Path patching against a brute force: the sender's change measured by a frozen run, the receiver's input edited by
hand, on transformers' eager attention (Llama with GQA, GPT-2, Gemma 2 with norms on the attention's and the MLP's
writes; same weights as the model on headwise's backend) and on headwise's own decoder stack — every path kind
(q, k, v, MLP, logits), both directions, sets of senders."""

from __future__ import annotations

import pytest
import torch

from _circuit_brute import edited_logits, frozen_change, reading_point, receiver_tuple
from _patching_models import Stack, hf_model, pair
from headwise.circuits import PathPatching, path_patch, wiring
from headwise.patching import logit_difference

pytest.importorskip("transformers")

METRIC = logit_difference([5, 6], [7, 8])
CASES = ["llama", "gpt2", "gemma2", "stack"]


@pytest.fixture(scope="module", params=CASES)
def models(request):
    if request.param == "stack":
        m = Stack()
        return m, m
    return hf_model(request.param), hf_model(request.param, "eager")


def _receivers(model):
    last = wiring(model).layers[-1]
    L = len(wiring(model).layers) - 1
    kv = last.num_kv - 1
    return [f"L{L}.H1.q", f"L{L}.KV{kv}.k", f"L{L}.KV0.v", f"L{L}.MLP", "logits"]


def _brute(eager, base, source, senders, receivers):
    change = frozen_change(eager, base, source, senders)
    edits = [(receiver_tuple(r), change[reading_point(receiver_tuple(r))]) for r in receivers]
    return METRIC(edited_logits(eager, base, edits))


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_every_path_kind_matches_the_brute_force(models, direction):
    model, eager = models
    clean, corrupted = pair(P=2, L=7, where=2)
    base, source = (corrupted, clean) if direction == "denoise" else (clean, corrupted)
    senders = ["embed", "L0.H0", "L0.H3", "L0.MLP", ["L0.H1", "L0.H2"]]
    for receiver in _receivers(model):
        got = path_patch(model, clean, corrupted, METRIC, senders, [receiver], direction=direction, batch_size=2)
        assert isinstance(got, PathPatching) and got.patched.shape == (2, len(senders))
        for j, s in enumerate(senders):
            expected = _brute(eager, base, source, [s] if isinstance(s, str) else s, [receiver])
            torch.testing.assert_close(got.patched[:, j], expected, atol=2e-4, rtol=0, msg=f"{s} -> {receiver}")


def test_receivers_of_one_layer_together(models):
    """q, k, v and the MLP of the last layer at once: the receivers' edits add up as the brute force's."""
    model, eager = models
    clean, corrupted = pair(P=2, L=7, where=3)
    receivers = _receivers(model)[:3]
    got = path_patch(model, clean, corrupted, METRIC, [["L0.H0", "L0.MLP"]], receivers)
    expected = _brute(eager, corrupted, clean, ["L0.H0", "L0.MLP"], receivers)
    torch.testing.assert_close(got.patched[:, 0], expected, atol=2e-4, rtol=0)


def test_every_sender_into_the_logits_restores_the_clean_run(models):
    """The logits' input is the sum of every write: all senders patched along their direct paths = the clean run."""
    model, _ = models
    clean, corrupted = pair(P=2, L=6, where=1)
    w = wiring(model)
    from headwise.circuits import build_graph

    every = build_graph(w).senders
    got = path_patch(w, clean, corrupted, METRIC, [every], ["logits"])
    torch.testing.assert_close(got.patched[:, 0], got.metric_clean, atol=2e-4, rtol=0)
    # a sender that writes after the receiver reads reaches nothing: the base run
    late = path_patch(w, clean, corrupted, METRIC, [f"L{len(w.layers) - 1}.H0"], ["L0.H0.q"])
    torch.testing.assert_close(late.patched[:, 0], late.metric_corrupted, atol=1e-5, rtol=0)


def test_batches_equal_one_job_at_a_time():
    model = hf_model("llama")
    clean, corrupted = pair(P=2, L=6, where=2)
    senders = ["embed", "L0.H0", "L0.H1", "L0.H2", "L0.MLP"]
    together = path_patch(model, clean, corrupted, METRIC, senders, ["L1.KV1.k"], batch_size=5)
    for j, s in enumerate(senders):
        alone = path_patch(model, clean, corrupted, METRIC, [s], ["L1.KV1.k"], batch_size=1)
        torch.testing.assert_close(together.patched[:, j], alone.patched[:, 0], atol=1e-5, rtol=0)
    assert together.passes == 3
    torch.testing.assert_close(together.effect, (together.patched - together.base[:, None]).mean(0))


def test_gqa_groups_name_their_query_heads():
    from headwise.circuits import build_graph

    g = build_graph(wiring(hf_model("llama")))  # 4 query heads, 2 key/value groups
    kv = [n for n in g.nodes if n.kind == "kv" and n.layer == 1]
    assert [n.id for n in kv] == ["L1.KV0", "L1.KV1"] and [n.heads for n in kv] == [(0, 1), (2, 3)]
    assert [n.kv_group for n in g.nodes if n.kind == "head" and n.layer == 0] == [0, 0, 1, 1]


def test_bad_input_names_the_argument():
    model = hf_model("llama")
    clean, corrupted = pair(P=2, L=6)
    with pytest.raises(ValueError, match="senders: 'L9.H0'"):
        path_patch(model, clean, corrupted, METRIC, ["L9.H0"], ["logits"])
    with pytest.raises(ValueError, match="receivers: 'L1.H0.x'"):
        path_patch(model, clean, corrupted, METRIC, ["L0.H0"], ["L1.H0.x"])
    with pytest.raises(ValueError, match="receivers: 'L1.KV2.k'"):
        path_patch(model, clean, corrupted, METRIC, ["L0.H0"], ["L1.KV2.k"])
    with pytest.raises(ValueError, match="direction"):
        path_patch(model, clean, corrupted, METRIC, ["L0.H0"], ["logits"], direction="up")
    with pytest.raises(ValueError, match="corrupted"):
        path_patch(model, clean, corrupted[:, :4], METRIC, ["L0.H0"], ["logits"])
    with pytest.raises(TypeError, match="receivers"):
        path_patch(model, clean, corrupted, METRIC, ["L0.H0"], "logits")


def test_structures_not_traced_are_refused_by_name():
    with pytest.raises(ValueError, match="^model: headwise cannot read the anatomy of this Stack model: .*post-norm"):
        wiring(Stack(norm_first=False))
