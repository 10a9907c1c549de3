"""areas: CPR and CMD equal MIB's own loop (copied from its ``evaluate_area_under_curve``), the AUROC equals the share
of (positive, negative) pairs ranked right counted one by one, MIB's sizes round down, bad inputs are refused."""

from __future__ import annotations

import math
import random

import pytest
import torch

from headwise.circuits.areas import MIB_FRACTIONS, auroc, curve_areas, mib_sizes


def mib_loop(faithfulnesses, percentages):
    """MIB's ``evaluate_area_under_curve`` after its faithfulness loop (``log_scale=False``), as written there."""
    area_under = 0.0
    area_from_1 = 0.0
    for i in range(len(faithfulnesses) - 1):
        i_1, i_2 = i, i + 1
        x_1 = percentages[i_1]
        x_2 = percentages[i_2]
        trapezoidal = (x_2 - x_1) * (((abs(1.0 - faithfulnesses[i_1])) + (abs(1.0 - faithfulnesses[i_2]))) / 2)
        area_from_1 += trapezoidal
        trapezoidal = (x_2 - x_1) * ((faithfulnesses[i_1] + faithfulnesses[i_2]) / 2)
        area_under += trapezoidal
    return area_under, area_from_1


@pytest.mark.parametrize("seed", range(5))
def test_curve_areas_are_mibs_loop(seed):
    rng = random.Random(seed)
    curve = [rng.uniform(-1.5, 2.0) for _ in MIB_FRACTIONS]
    cpr, cmd = curve_areas(curve)
    want = mib_loop(curve, (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1))
    assert (cpr, cmd) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_curve_areas_by_hand():
    # a perfect circuit at every size: CPR is the fractions' span, CMD 0; nothing recovered: CPR 0, CMD the span
    span = MIB_FRACTIONS[-1] - MIB_FRACTIONS[0]
    assert curve_areas([1.0] * 10) == pytest.approx((span, 0.0), abs=1e-15)
    assert curve_areas([0.0] * 10) == pytest.approx((0.0, span), abs=1e-15)
    assert curve_areas([0.5, 1.5], [0.0, 1.0]) == pytest.approx((1.0, 0.5), abs=1e-15)


def test_mib_sizes_round_down():
    assert mib_sizes(32491) == [32, 64, 162, 324, 649, 1624, 3249, 6498, 16245, 32491]
    assert mib_sizes(110) == [0, 0, 0, 1, 2, 5, 11, 22, 55, 110]


def brute_auroc(scores, truth) -> float:
    pos = [abs(s) for s, t in zip(scores, truth) if t]
    neg = [abs(s) for s, t in zip(scores, truth) if not t]
    right = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return right / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(6))
def test_auroc_counts_every_pair(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(-4, 5, (40,), generator=g).float()  # ties, and both signs of one magnitude
    truth = torch.rand(40, generator=g) < 0.3
    assert auroc(scores, truth) == pytest.approx(brute_auroc(scores.tolist(), truth.tolist()), abs=1e-12)


def test_auroc_by_hand():
    assert auroc(torch.tensor([3.0, -2.0, 1.0, 0.5]), torch.tensor([True, True, False, False])) == 1.0
    assert auroc(torch.tensor([0.1, 2.0, 3.0]), torch.tensor([True, False, False])) == 0.0
    assert auroc(torch.tensor([1.0, -1.0]), torch.tensor([True, False])) == 0.5
    assert math.isnan(auroc(torch.tensor([1.0, 2.0]), torch.tensor([True, True])))


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: curve_areas([1.0, 0.5], [0.1]), "faithfulness"),
        (lambda: curve_areas([1.0], [0.1]), "fractions"),
        (lambda: curve_areas([1.0, 0.5], [0.2, 0.1]), "fractions"),
        (lambda: auroc(torch.ones(3), torch.ones(4, dtype=torch.bool)), "truth"),
    ],
)
def test_bad_inputs(call, words):
    with pytest.raises(ValueError, match=words):
        call()
