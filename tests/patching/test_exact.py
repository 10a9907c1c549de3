"""Exact activation patching per head, against a brute-force reference that edits the output projection's input
(a forward pre-hook, on transformers' own eager attention for Hugging Face models), and the identities that hold."""

from __future__ import annotations

import pytest
import torch

from _patching_models import Stack, brute_force, hf_model, logits_of, pair
from headwise.patching import (
    Patch,
    logit_difference,
    patch_heads,
    patch_positions,
    patch_set,
    run_patched,
    run_with_cache,
)

METRIC = logit_difference([5, 7], [9, 11])
FAMILIES = ["llama", "gpt2", "gemma2", "qwen2"]


def _metric_of(logits):
    return METRIC(logits)


@pytest.mark.parametrize("case", ["llama", "gpt2"])
def test_a_head_patched_with_its_own_output_changes_nothing(case):
    model = hf_model(case)
    clean, _ = pair()
    cache = run_with_cache(model, clean)
    jobs = [[Patch(layer, head)] for layer in range(2) for head in range(4)]
    logits = run_patched(model, clean, cache, jobs)  # (8·2, L, V)
    expected = cache.logits.repeat(len(jobs), 1, 1)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    sweep = patch_heads(model, clean, clean, METRIC)
    torch.testing.assert_close(sweep.patched, sweep.metric_clean[:, None, None].expand(-1, 2, 4), atol=1e-5, rtol=0)


@pytest.mark.parametrize("direction", ["denoise", "noise"])
@pytest.mark.parametrize("case", [c if c == "llama" else pytest.param(c, marks=pytest.mark.slow) for c in FAMILIES])
def test_every_head_equals_editing_the_output_projections_input(case, direction):
    """Each patched value equals the brute force on transformers' eager attention (same weights)."""
    model, eager = hf_model(case), hf_model(case, "eager")
    clean, corrupted = pair()
    sweep = patch_heads(model, clean, corrupted, METRIC, direction=direction, batch_size=3)
    base, source = (corrupted, clean) if direction == "denoise" else (clean, corrupted)
    expected = torch.empty(2, 2, 4)
    for layer in range(2):
        for head in range(4):
            expected[:, layer, head] = METRIC(brute_force(eager, base, source, [(layer, head, None)]))
    torch.testing.assert_close(sweep.patched, expected, atol=2e-4, rtol=0)
    assert sweep.passes == 2 + 3  # two cached runs, 8 heads in batches of 3
    torch.testing.assert_close(sweep.metric_clean, METRIC(logits_of(eager, clean)), atol=2e-4, rtol=0)
    # the effect is not trivially zero: some head moves the metric
    assert (
        sweep.patched - sweep.metric_corrupted[:, None, None] if direction == "denoise" else sweep.patched
    ).abs().max() > 1e-2


def test_the_batch_size_does_not_change_the_sweep():
    model = hf_model("llama")
    clean, corrupted = pair()
    one = patch_heads(model, clean, corrupted, METRIC, batch_size=1)
    many = patch_heads(model, clean, corrupted, METRIC, batch_size=7)
    torch.testing.assert_close(one.patched, many.patched, atol=1e-5, rtol=0)
    assert (one.passes, many.passes) == (2 + 8, 2 + 2)


def test_gqa_heads_are_patched_per_query_head():
    """Llama with 4 query heads on 2 key/value heads: heads sharing keys and values have their own effects."""
    model = hf_model("llama")
    assert model.config.num_key_value_heads == 2
    clean, corrupted = pair()
    sweep = patch_heads(model, clean, corrupted, METRIC)
    assert sweep.patched.shape == (2, 2, 4)
    # query heads 0 and 1 read the same keys and values, yet differ
    assert (sweep.patched[:, :, 0] - sweep.patched[:, :, 1]).abs().max() > 1e-3


@pytest.mark.parametrize("case", ["llama", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_one_position_at_a_time_equals_the_brute_force(case):
    model, eager = hf_model(case), hf_model(case, "eager")
    clean, corrupted = pair()
    heads = [(1, 2), (0, 3)]
    got = patch_positions(model, clean, corrupted, METRIC, heads, batch_size=5)  # (P, K, L)
    L = clean.shape[1]
    expected = torch.stack(
        [
            torch.stack([METRIC(brute_force(eager, corrupted, clean, [(layer, head, [t])])) for t in range(L)], -1)
            for layer, head in heads
        ],
        1,
    )
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=0)
    # before the corrupted position (3) nothing differs, so patching there changes nothing
    torch.testing.assert_close(
        got[..., :3], METRIC(logits_of(eager, corrupted))[:, None, None].expand(-1, 2, 3), atol=2e-4, rtol=0
    )


@pytest.mark.parametrize("case", ["llama", "gpt2"])
def test_a_set_of_heads_equals_the_brute_force(case):
    model, eager = hf_model(case), hf_model(case, "eager")
    clean, corrupted = pair()
    heads = {0: [1, 3], 1: [0]}
    got = patch_set(model, clean, corrupted, METRIC, heads, positions=[4, 5, 8])
    expected = METRIC(brute_force(eager, corrupted, clean, [(0, 1, [4, 5, 8]), (0, 3, [4, 5, 8]), (1, 0, [4, 5, 8])]))
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=0)


@pytest.mark.parametrize(
    "model",
    [pytest.param("llama", id="llama"), pytest.param("gpt2", id="gpt2"), pytest.param("stack", id="headwise-stack")],
)
def test_every_head_after_the_difference_gives_the_clean_logits(model):
    """The inputs differ at position k only. Embeddings, MLPs and norms act per position, so a later position
    hears of position k only through attention; with every head of every layer at positions > k taken from the
    clean run, the residual stream there is the clean one: the logits at positions > k are the clean logits
    (and before k they never differed). At k itself they stay corrupted — the identity is not trivial."""
    model = Stack() if model == "stack" else hf_model(model)
    k, L = 3, 9
    clean, corrupted = pair(where=k, L=L)
    cache = run_with_cache(model, clean)
    after = tuple(range(k + 1, L))
    from headwise.patching import as_target

    target = as_target(model)
    job = [
        Patch(layer, head, after) for layer in range(target.num_layers) for head in range(target.heads_per_layer[layer])
    ]
    logits = run_patched(model, corrupted, cache, [job])
    torch.testing.assert_close(logits[:, k + 1 :], cache.logits[:, k + 1 :], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[:, :k], cache.logits[:, :k], atol=1e-5, rtol=0)
    assert (logits[:, k] - cache.logits[:, k]).abs().max() > 1e-2
    # without the heads of the last layer, the last position is not restored
    partial = [p for p in job if p.layer < target.num_layers - 1]
    logits = run_patched(model, corrupted, cache, [partial])
    assert (logits[:, -1] - cache.logits[:, -1]).abs().max() > 1e-3


def test_headwise_modules_equal_the_brute_force():
    model = Stack()
    clean, corrupted = pair()
    sweep = patch_heads(model, clean, corrupted, METRIC, batch_size=5)
    expected = torch.empty(2, 3, 4)
    for layer in range(3):
        for head in range(4):
            expected[:, layer, head] = METRIC(brute_force(model, corrupted, clean, [(layer, head, None)]))
    torch.testing.assert_close(sweep.patched, expected, atol=1e-5, rtol=0)
    assert sweep.normalised.shape == (3, 4)


def test_the_normalised_effect():
    model = hf_model("llama")
    clean, corrupted = pair()
    sweep = patch_heads(model, clean, corrupted, METRIC)
    clean_m, corrupt_m = float(sweep.metric_clean.mean()), float(sweep.metric_corrupted.mean())
    expected = (sweep.patched.mean(0) - corrupt_m) / (clean_m - corrupt_m)
    torch.testing.assert_close(sweep.normalised, expected)


# -- mistakes ------------------------------------------------------------------------------------------------


def test_mistakes_are_named():
    model = hf_model("llama")
    clean, corrupted = pair()
    with pytest.raises(ValueError, match=r"corrupted: expected the clean input's shape \(2, 9\).*\(2, 8\)"):
        patch_heads(model, clean, corrupted[:, :8], METRIC)
    with pytest.raises(ValueError, match="direction: expected one of"):
        patch_heads(model, clean, corrupted, METRIC, direction="sideways")
    with pytest.raises(ValueError, match=r"layer: 2 is out of range: the model has 2 attention layers \(0..1\)"):
        patch_set(model, clean, corrupted, METRIC, [(2, 0)])
    with pytest.raises(ValueError, match=r"head: 4 is out of range in layer 1, which has 4 heads \(0..3\)"):
        patch_positions(model, clean, corrupted, METRIC, {1: [4]})
    with pytest.raises(ValueError, match="positions: 9 is out of range for inputs of 9 tokens"):
        patch_set(model, clean, corrupted, METRIC, [(0, 0)], positions=[9])
    with pytest.raises(ValueError, match="batch_size"):
        patch_heads(model, clean, corrupted, METRIC, batch_size=0)
    with pytest.raises(ValueError, match="attn_implementation='headwise'"):
        patch_heads(hf_model("llama", "eager"), clean, corrupted, METRIC)
    with pytest.raises(ValueError, match="wrong: the same token id as the answer"):
        logit_difference(5, 5)
