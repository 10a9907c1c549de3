"""One head against many: the statistics by hand, steps to a target from a known curve, the sweep on
tuning seeds, equal parameters, the void verdict, verdicts that go either way, and the parallel runner."""

from __future__ import annotations

import json

import pytest
import torch

from headwise.lab import stats
from headwise.lab.char_lm import load_corpus
from headwise.lab.heads_vs_one import (
    TASKS,
    TUNING_SEED,
    HeadsSetup,
    compare,
    run_heads_vs_one,
    summarise,
    sweep_choice,
    verdict,
)
from headwise.models.transformer_lm import TransformerLM


def test_bootstrap_interval_by_hand():
    # resampling [0, 1] gives a mean of 0 (1/4), 0.5 (1/2) or 1 (1/4): the 95% interval is [0, 1]
    assert stats.bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    assert stats.bootstrap_ci([0.7, 0.7, 0.7]) == pytest.approx((0.7, 0.7))
    lo, hi = stats.bootstrap_diff_ci([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    assert (lo, hi) == (1.0, 1.0)
    lo, hi = stats.bootstrap_ci([0.0, 0.0, 0.0, 1.0])  # means in {0, .25, .5, .75, 1}
    assert lo == 0.0 and hi == 0.75


def test_rank_test_exact_by_hand():
    # 3 against 3, completely separated: 2 of the C(6, 3) = 20 splits are as extreme (both tails)
    assert stats.rank_test([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)
    assert stats.rank_test(range(8), range(8, 16)) == pytest.approx(2 / 12870)
    assert stats.rank_test([1, 2, 3], [1, 2, 3]) == 1.0
    # one swap: rank sums 7 or 14 are as far from the mean 10.5 as 7 … 4 of 20 splits
    assert stats.rank_test([1, 2, 4], [3, 5, 6]) == pytest.approx(4 / 20)


def test_holm_and_detectable_difference_by_hand():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # (1.95996 + 0.84162) · 1 · √(2/8)
    assert stats.detectable_difference(1.0, 8) == pytest.approx(1.40079, abs=1e-4)
    assert stats.detectable_difference(0.0, 8) == 0.0


def test_steps_to_target_from_a_known_curve():
    curve = [{"step": s, "accuracy": a, "loss": 3 - a} for s, a in ((25, 0.1), (50, 0.89), (75, 0.9), (100, 0.99))]
    assert stats.steps_to(curve, "accuracy", 0.9) == 75
    assert stats.steps_to(curve, "accuracy", 0.995) is None
    assert stats.steps_to(curve, "loss", 2.105, above=False) == 75


@pytest.mark.parametrize("task", TASKS)
def test_parameters_equal_for_every_head_count(task):
    setup = HeadsSetup(tasks=(task,))
    counts = {h: TransformerLM(setup.model_config(task, h)).num_parameters() for h in (1, 2, 4, 8)}
    assert len(set(counts.values())) == 1, counts


def test_head_counts_must_divide_the_width():
    with pytest.raises(ValueError, match="heads.*d_model=32"):
        HeadsSetup(tasks=("pair",), heads=(1, 3))
    with pytest.raises(ValueError, match="task"):
        HeadsSetup(tasks=("product",))


def test_corpus_splits_are_disjoint_and_the_baselines_ordered():
    c = load_corpus()
    assert c.lines == {"train": 960, "held_out": 120, "validation": 120}
    text = c.chars
    train = "".join(text[i] for i in c.train).split("\n")
    held = "".join(text[i] for i in c.held_out).split("\n")
    assert not set(train) & set(held) - {""}
    x, y, scored = c.windows(64)
    assert x.shape == y.shape == ((c.held_out.size - 1) // 64, 64)
    assert torch.equal(x[0, 1:], y[0, :-1]) and bool(scored.all())
    assert c.bigram_loss() < c.unigram_loss() < torch.log(torch.tensor(float(c.vocab_size)))


def _fake(task, per_heads):
    """Evaluation runs with given accuracies, losses and steps per head count."""
    return [
        {
            "task": task,
            "heads": h,
            "seed": s,
            "lr": 1e-3,
            "accuracy": a,
            "loss": loss,
            "steps_to_target": st,
            "solved": a >= 0.95,
        }
        for h, rows in per_heads.items()
        for s, (a, loss, st) in enumerate(rows)
    ]


def test_verdicts_can_go_either_way_or_be_void():
    setup = HeadsSetup(tasks=("pair",), heads=(1, 4), seeds=8)
    fast = [(1.0, 0.01, 100 + s) for s in range(8)]
    slow = [(1.0, 0.01, 400 + s) for s in range(8)]
    failed = [(0.2, 2.5, None) for _ in range(8)]
    cases = {
        "more heads better": {1: slow, 4: fast},
        "one head better": {1: fast, 4: slow},
        "no detectable difference": {1: fast, 4: list(reversed(fast))},
        "void": {1: failed, 4: failed},
    }
    for expected, per_heads in cases.items():
        table = summarise(_fake("pair", per_heads), setup)
        comparison = compare(table, setup)
        said = verdict(table, comparison)["pair"]
        assert said["outcome"] == expected, said
    assert said["text"].startswith("void: the best head count")
    # the steps comparison: −300 steps, every one of the 8 against 8 apart
    table = summarise(_fake("pair", cases["more heads better"]), setup)
    (steps,) = [r for r in compare(table, setup)["pair"]["comparisons"] if r["measure"] == "steps"]
    assert steps["difference"] == -300 and steps["p"] == pytest.approx(2 / 12870)
    assert steps["ci95"][0] < -300 < steps["ci95"][1] < -290
    # not reached counts as the budget
    assert table["pair"][1]["steps"]["values"][0] == 400
    assert summarise(_fake("pair", {1: failed}), setup)["pair"][1]["steps"]["values"] == [600.0] * 8


def test_sweep_picks_each_head_counts_rate_on_its_own():
    setup = HeadsSetup(tasks=("pair",), heads=(1, 2), lrs=(1e-3, 1e-2))
    tuning = [
        {"task": "pair", "heads": h, "lr": lr, "loss": loss, "seed": TUNING_SEED}
        for h, lr, loss in ((1, 1e-3, 0.5), (1, 1e-2, 2.0), (2, 1e-3, 0.9), (2, 1e-2, 0.1))
    ]
    chosen = sweep_choice(tuning, setup)
    assert chosen["pair"][1]["lr"] == 1e-3 and chosen["pair"][2]["lr"] == 1e-2


@pytest.mark.slow
def test_tiny_run_tunes_on_other_seeds_and_is_void_and_parallel_equals_serial():
    setup = HeadsSetup(tasks=("pair",), heads=(1, 2), seeds=2, steps=3, lrs=(1e-3, 3e-2), eval_size=32, probe_size=16)
    one = run_heads_vs_one(setup)
    json.dumps(one)
    tuning_seeds = {r["seed"] for r in one["tuning_runs"]}
    eval_seeds = {r["seed"] for r in one["runs"]}
    assert tuning_seeds == {TUNING_SEED} and eval_seeds == {0, 1}
    assert {(r["heads"], r["lr"]) for r in one["tuning_runs"]} == {(h, lr) for h in (1, 2) for lr in (1e-3, 3e-2)}
    for h in (1, 2):
        losses = {r["lr"]: r["loss"] for r in one["tuning_runs"] if r["heads"] == h}
        best = min(losses, key=losses.get)
        assert {r["lr"] for r in one["runs"] if r["heads"] == h} == {best}
    assert one["parameters"] == {"pair": 12704}
    assert one["verdict"]["pair"]["outcome"] == "void"  # three steps learn nothing
    two = run_heads_vs_one(setup, workers=2)

    def strip(runs):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in runs]

    assert strip(one["runs"]) == strip(two["runs"]) and strip(one["tuning_runs"]) == strip(two["tuning_runs"])


@pytest.mark.slow
def test_default_run_every_task_learnable_and_parameters_equal():
    """The default experiment (about 6 minutes on 2 free cores): every task is learnable within its budget,
    so each verdict compares models that learnt, and the parameters are equal across H."""
    result = run_heads_vs_one(workers=2)
    for task, said in result["verdict"].items():
        print(f"\n{task}: {said['text']}")
        assert said["outcome"] != "void", said
        assert isinstance(result["parameters"][task], int)
