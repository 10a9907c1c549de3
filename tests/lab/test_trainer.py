"""The trainer: its schedule, reproducibility, the callback, and that it learns a one-head task."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from headwise.lab import LMConfig, TrainConfig, TransformerLM, train
from headwise.lab.tasks import relation_task
from headwise.lab.trainer import lr_factor, masked_loss


def test_schedule_warms_up_then_decays_to_the_floor():
    c = TrainConfig(steps=100, warmup=10, final_lr_ratio=0.1)
    f = [lr_factor(s, c) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[99] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))


def test_masked_loss_only_counts_scored_positions():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = 100.0  # position 0 is confidently right, the others uniform
    targets = torch.tensor([[2, 1, 1]])
    assert float(masked_loss(logits, targets, torch.tensor([[True, False, False]]))) == pytest.approx(0.0, abs=1e-6)
    assert float(masked_loss(logits, targets, torch.tensor([[False, True, True]]))) == pytest.approx(
        torch.log(torch.tensor(4.0))
    )


def _model(seed=0):
    torch.manual_seed(seed)
    return TransformerLM(LMConfig(vocab_size=8, context_length=16, d_model=16, num_layers=1, num_heads=2, d_ff=32))


@pytest.mark.slow
def test_learns_to_copy_the_previous_token_and_reports_every_step():
    model = _model()
    data = functools.partial(relation_task, batch=32, task="previous", length=16, vocab_size=8)
    seen = []
    result = train(model, data, TrainConfig(steps=300, lr=1e-2, warmup=20, eval_every=100), callback=seen.append)
    assert [p.step for p in seen] == list(range(1, 301)) and all(p.tokens_per_s > 0 for p in seen)
    x, y, scored = relation_task(np.random.default_rng(5), 256, task="previous", length=16, vocab_size=8)
    with torch.no_grad():
        accuracy = float((model(x).argmax(-1) == y)[scored].float().mean())
    assert accuracy > 0.95 and not model.training and result.steps == 300


def test_same_seed_same_weights_other_seed_other_weights():
    data = functools.partial(relation_task, batch=8, task="sum", length=16, vocab_size=8)
    a, b, c = _model(), _model(), _model()
    train(a, data, TrainConfig(steps=5, seed=1))
    train(b, data, TrainConfig(steps=5, seed=1))
    train(c, data, TrainConfig(steps=5, seed=2))
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_bad_configs_name_the_argument():
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="lr"):
        TrainConfig(steps=1, lr=-1.0)
    with pytest.raises(ValueError, match="final_lr_ratio"):
        TrainConfig(steps=1, final_lr_ratio=2)
