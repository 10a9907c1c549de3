"""The indirect-object prompt of ``docs/patching.md`` on the real SmolLM2-135M-Instruct (slow; skipped when the
safetensors folder is not on this machine — ``HEADWISE_SMOLLM2`` names another)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

FOLDER = Path(
    os.environ.get(
        "HEADWISE_SMOLLM2", "/tmp/hwcache/gguf/b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    )
)
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"


@pytest.mark.slow
@pytest.mark.skipif(not (FOLDER / "model.safetensors").is_file(), reason="the SmolLM2 folder is not here")
def test_the_ioi_prompt_on_smollm2():
    from headwise.models import open_model
    from headwise.patching import direct_logit_attribution, logit_difference, patch_set

    hm = open_model(FOLDER)
    tok = hm.tokenizer
    c, x = torch.tensor([tok.encode(CLEAN).ids]), torch.tensor([tok.encode(CORRUPTED).ids])
    assert c.shape == x.shape == (1, 14)
    (mary,), (john,) = (
        tok.encode(" Mary", add_special_tokens=False).ids,
        tok.encode(" John", add_special_tokens=False).ids,
    )
    metric = logit_difference(mary, john)
    with torch.no_grad():
        clean, corrupted = float(metric(hm.forward(c))), float(metric(hm.forward(x)))
    assert clean == pytest.approx(6.1, abs=0.1) and corrupted == pytest.approx(-5.5, abs=0.1)
    dla = direct_logit_attribution(hm, c, metric)
    assert float(dla.total[0]) == pytest.approx(clean, abs=1e-3)
    assert float(dla.heads[0, 23, 3]) > 1.0  # the strongest name mover writes the answer directly
    # the three heads with the largest denoising effects, patched together, restore most of the answer
    restored = float(patch_set(hm, c, x, metric, [(23, 3), (29, 1), (20, 0)])[0])
    assert (restored - corrupted) / (clean - corrupted) > 0.5
