"""The residual stream's parts at every position (what QK attribution projects): they add up to each block's
input, and the projected parts formed per head through W_O,h equal the D-space parts projected afterwards."""

from __future__ import annotations

import pytest
import torch

from _patching_models import Stack, hf_model
from headwise.patching import residual_parts

IDS = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("case", ["llama", "gpt2", "gemma2", "olmo2", "stack"])
def test_parts_add_up_and_projecting_first_is_the_same(case):
    model = Stack() if case == "stack" else hf_model(case)
    last = 2 if case == "stack" else 1
    rp = residual_parts(model, IDS, last)
    plain = list(rp.parts())
    labels = [n for names, _ in plain for n in names]
    assert labels == rp.labels
    total = sum(w.sum(0) for _, w in plain)  # (P, L, D)
    torch.testing.assert_close(total, rp.residual, atol=1e-4, rtol=1e-4)
    D = rp.residual.shape[-1]
    M = torch.randn(D, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    projected = list(rp.parts(project=M))
    for (names, w), (names_p, wp) in zip(plain, projected):
        assert names == names_p
        # the D-space heads come from the module in float32 (others zeroed), the projected ones from float64 weights
        torch.testing.assert_close(wp, w @ M, atol=1e-5, rtol=1e-5)


def test_a_layer_out_of_range_is_refused():
    with pytest.raises(ValueError, match="layer"):
        residual_parts(hf_model("llama"), IDS, 2)
