"""Attribution patching: exact where the metric is affine in the head, a derivative that finite differences
confirm elsewhere."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from _patching_models import Stack, hf_model, pair
from headwise.patching import as_target, attribution_patch, logit_difference, patch_heads, run_with_cache

METRIC = logit_difference([5, 7], [9, 11])


def test_equal_to_exact_patching_where_the_metric_is_affine_in_the_head():
    """No final norm and an attention-only last layer: the last layer's heads reach the logits through Wo and
    the unembedding only, so the first-order estimate is exact for them (and not for earlier heads)."""
    model = Stack(final_norm=False, last_attention_only=True)
    clean, corrupted = pair()
    exact = patch_heads(model, clean, corrupted, METRIC)
    estimate = attribution_patch(model, clean, corrupted, METRIC)
    torch.testing.assert_close(estimate.patched[:, -1], exact.patched[:, -1], atol=1e-4, rtol=0)
    assert (estimate.patched[:, 0] - exact.patched[:, 0]).abs().max() > 1e-3
    torch.testing.assert_close(estimate.metric_clean, exact.metric_clean, atol=1e-5, rtol=0)
    torch.testing.assert_close(estimate.metric_corrupted, exact.metric_corrupted, atol=1e-5, rtol=0)


def _moved(alpha: float, source, layer: int, head: int, out):
    out = out.clone()  # (B, H, L, Dh)
    out[:, head] = out[:, head] + alpha * (source[:, head].to(out.dtype) - out[:, head])
    return out


# (family, finite-difference step, tolerance): GPT-2 runs wholly in float64; Llama's and Gemma 2's RMSNorms
# compute in float32 whatever the model's dtype, so their differences carry float32 noise / step
FD = {"gpt2": (1e-4, 1e-6), "llama": (3e-3, 3e-4), "gemma2": (3e-3, 3e-4)}


@pytest.mark.parametrize("direction", ["denoise", "noise"])
@pytest.mark.parametrize("case", [c if c == "gpt2" else pytest.param(c, marks=pytest.mark.slow) for c in FD])
def test_the_estimate_is_the_derivative_along_the_patch(case, direction):
    """``patched − base`` of head h equals d/dα metric(base with head h moved α of the way to the source), by
    central finite differences on the model in float64."""
    model = hf_model(case, dtype=torch.float64)
    clean, corrupted = pair()
    estimate = attribution_patch(model, clean, corrupted, METRIC, direction=direction)
    base_ids, source_ids = (corrupted, clean) if direction == "denoise" else (clean, corrupted)
    target = as_target(model)
    source = run_with_cache(target, source_ids)
    base_value = METRIC(run_with_cache(target, base_ids).logits)
    step, tol = FD[case]
    for layer in range(2):
        for head in range(4):
            values = []
            for alpha in (step, -step):
                fn = partial(_moved, alpha, source.heads[layer], layer, head)
                with torch.no_grad(), target.hooks({f"layers.{layer}.attn.heads": fn}):
                    values.append(METRIC(target.logits(base_ids)))
            derivative = (values[0] - values[1]) / (2 * step)  # (P,)
            got = estimate.patched[:, layer, head].double() - base_value
            torch.testing.assert_close(got, derivative, atol=tol, rtol=0)


def test_the_positions_share_the_estimate():
    model = hf_model("llama")
    clean, corrupted = pair()
    estimate = attribution_patch(model, clean, corrupted, METRIC)
    shares = estimate.per_position.sum(-1)  # (P, NL, H)
    torch.testing.assert_close(shares, estimate.patched - estimate.metric_corrupted[:, None, None], atol=1e-5, rtol=0)
    # positions before the difference (3) carry nothing: the heads' outputs there are the same in both runs
    assert estimate.per_position[..., :3].abs().max() == 0
    assert estimate.passes == 2
