"""The plan of a run layer by layer (``headwise size --memory``): the formulas by hand on Llama 3 8B, the shards
kept or streamed by the machines' memory, and the command's table."""

from __future__ import annotations

import pytest

from headwise.sizing import get_arch
from headwise.sizing.layers import HELD, MIN_WORKING, Costs, measure_costs, plan_layers


def test_the_plan_of_llama_3_8b_by_hand():
    arch = get_arch("llama-3-8b")
    costs = Costs(convert_rate=1e9, flops=1e11, where="by hand")
    plan = plan_layers(arch, costs, tokens=512, batches=32, memory=64 * 10**9)
    layer = (1_342_177_280 + 5_637_144_576 + 2 * 4096 * 32) // 32  # attention, gated MLP, two RMSNorms per block
    assert plan.layer_params == layer == 218_112_000 and plan.layer_bytes == 4 * layer
    working = max(MIN_WORKING, 512 * (6 * 4096 + 3 * 14336) * 4 + 2 * 32 * 512 * 512 * 4)
    assert plan.peak == HELD + 6 * layer + working  # float32 and the bf16 read to make it
    assert plan.read_seconds == pytest.approx(32 * layer * 2 / 1e9)
    assert plan.compute_seconds == pytest.approx(32 * (2 * layer * 512 + 4 * 512 * 512 * 32 * 128) / 1e11)
    assert plan.machines[1] == (plan.peak, pytest.approx(32 * plan.pass_seconds), False)
    held, seconds, kept = plan.machines[2]  # 16 layers each: 14 GB fits 64 GB, read once, 33 pipelined steps
    assert kept and held == HELD + 16 * 4 * layer + working
    assert seconds == pytest.approx(plan.read_seconds / 2 + 33 * plan.compute_seconds / 2)
    small = plan_layers(arch, costs, memory=4 * 10**9)  # a shard that does not fit streams its layers
    held, seconds, kept = small.machines[4]
    assert not kept and held == small.peak and seconds == pytest.approx(35 * small.pass_seconds / 4)


@pytest.mark.parametrize("bad", [{"tokens": 0}, {"batches": -1}, {"machines": (1, 0)}])
def test_bad_sizes_are_named(bad):
    with pytest.raises(ValueError, match=f"^{next(iter(bad))}: expected a positive integer"):
        plan_layers(get_arch("llama-3-8b"), Costs(1e9, 1e11, ""), **bad)


def test_measured_costs_are_rates():
    costs = measure_costs(size=256, tokens=32, repeats=1)
    assert costs.convert_rate > 1e6 and costs.flops > 1e6 and "load average" in costs.where
