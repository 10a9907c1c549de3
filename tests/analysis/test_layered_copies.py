"""The batched engine layer by layer: one pass whose jobs join at their own start layers and whose blocks run a few
copies at a time (``run_copies(..., layered=k)``, :func:`headwise.analysis.batched.staggered`) gives every job's
output equal to the batched pass's, for zero and mean ablation and for patching, on tiny random models of several
families (a parallel block, norms on the writes, a fused projection); a patch sweep on a model opened layer by layer
reads each layer once a pass and equals the sweep on the model opened whole."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch

from _anatomy_models import tiny
from headwise.analysis.batched import CopyJob, run_copies
from headwise.models import HeadModel, open_model
from headwise.patching import patch_heads, run_with_cache
from headwise.patching.exact import Patch

FAMILIES = ["llama", "gemma2", "gpt_neox", "gpt2", "phi", "granite"]


def _close(got, ref, rel=1e-5):
    torch.testing.assert_close(got, ref, rtol=rel, atol=rel * float(ref.abs().max()) + 1e-12)


def _jobs(hm, seed: int) -> list:
    """Jobs over every layer, shuffled: single heads, head sets across layers, positions, and one empty job."""
    rng = random.Random(seed)
    H, NL = hm.heads_per_layer, hm.num_layers
    jobs = [[Patch(layer, rng.randrange(H[layer]))] for layer in range(NL) for _ in range(2)]
    jobs.append([Patch(NL - 1, 0), Patch(0, H[0] - 1)])
    jobs.append([Patch(NL - 1, 1, (0, 3))])
    jobs.append([])
    rng.shuffle(jobs)
    return jobs


@pytest.fixture(scope="module", params=FAMILIES)
def hm(request):
    return HeadModel(tiny(request.param).eval())


@pytest.mark.parametrize("per_call", [3])  # calls of 3 copies: uneven, and a call straddles the joins
@pytest.mark.parametrize("replacement", ["zero", "mean", "patch"])
def test_a_layered_pass_equals_the_batched_pass(hm, per_call, replacement):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (2, 7), generator=g)
    jobs = _jobs(hm, seed=per_call)
    source = replacement
    if replacement == "patch":
        source = run_with_cache(hm, torch.randint(3, 100, (2, 7), generator=g)).heads

    def run(repeat):
        return hm.logits(ids.repeat(repeat, 1))

    ref, _ = run_copies(hm, run, ids, jobs, replacement=source)
    got, low = run_copies(hm, run, ids, jobs, replacement=source, layered=per_call)
    assert got.shape == ref.shape == (len(jobs) * 2, 7, hm.vocab_size)
    assert low == 0  # a job touches layer 0 (and one touches nothing)
    _close(got, ref)


def test_copies_join_at_their_start_layer_and_a_block_runs_per_call_copies(hm):
    """Block l runs on the base and the jobs starting at or below l, ``per_call`` copies a call (as the heads' point
    inside each block sees them)."""
    from headwise.points import attention_point

    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(2))
    NL = hm.num_layers
    jobs = [CopyJob(((NL - 1, 0, None),)), CopyJob(((1, 0, None),)), CopyJob(((1, 1, None),))]
    late = 0 if NL == 2 else 1  # the first job starts at the last layer: with two layers, at layer 1 too
    rows: dict = {}

    def seen(layer):
        def hook(x):
            rows.setdefault(layer, []).append(x.shape[0])

        return hook

    hooks = [(attention_point(i, "heads"), seen(i)) for i in range(NL)]
    with hm.hooks(hooks):
        run_copies(hm, lambda r: hm.logits(ids.repeat(r, 1)), ids, jobs, layered=2)
    assert rows[0] == [2]  # below every job's start: the base alone
    assert rows[1] == ([4, 4] if late == 0 else [4, 2])  # base + the jobs joined at layer 1: calls of 2 copies
    assert rows[NL - 1] == [4, 4]  # all three joined


class _Loose(torch.nn.Module):
    """Two decoder layers held by name, not in a layer list: a model that shows no blocks."""

    def __init__(self):
        super().__init__()
        from headwise.core.layers import DecoderLayer

        torch.manual_seed(3)
        self.embed = torch.nn.Embedding(40, 32)
        self.first, self.second = DecoderLayer(32, 4), DecoderLayer(32, 4)
        self.head = torch.nn.Linear(32, 40)

    def forward(self, ids):
        return self.head(self.second(self.first(self.embed(ids))))


def test_a_model_that_shows_no_blocks_runs_the_batched_pass():
    from headwise.analysis.batched import shows_blocks

    hm = HeadModel(_Loose().eval())
    assert not shows_blocks(hm)
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(3))
    jobs = [[Patch(1, 2)], [Patch(0, 1)]]

    def run(repeat):
        return hm.logits(ids.repeat(repeat, 1))

    ref, _ = run_copies(hm, run, ids, jobs)
    got, _ = run_copies(hm, run, ids, jobs, layered=1)
    _close(got, ref)
    assert not torch.equal(ref[:2], ref[2:])  # the jobs differ


def test_layered_names_a_bad_value(hm):
    ids = torch.randint(3, 100, (1, 4))
    with pytest.raises(ValueError, match="layered"):
        run_copies(hm, lambda r: hm.logits(ids.repeat(r, 1)), ids, [[Patch(0, 0)]], layered=0)


@pytest.fixture(scope="module", params=["llama", "gpt_neox"])
def opened(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny(request.param).to(torch.bfloat16).save_pretrained(folder)
    return open_model(folder, by_layer=False), open_model(folder, by_layer=True)


def _metric(logits):
    return logits[:, -1, 5] - logits[:, -1, 7]


def test_a_sweep_layer_by_layer_reads_each_layer_once_a_pass(opened, monkeypatch):
    whole, layered = opened
    g = torch.Generator().manual_seed(4)
    clean = torch.randint(3, 100, (2, 8), generator=g)
    corrupted = clean.clone()
    corrupted[:, 3] = torch.randint(3, 100, (2,), generator=g)
    ref = patch_heads(whole, clean, corrupted, _metric, batch_size=3)
    heads = sum(layered.heads_per_layer)
    blocks = len(layered.stream.block_units())
    for per_pass in (heads, 5):  # every job in one pass; passes of 5 jobs
        monkeypatch.setattr("headwise.patching.exact.layered_jobs", lambda *a, n=per_pass: (n, 3))
        loads = layered.stream.loads
        got = patch_heads(layered, clean, corrupted, _metric, batch_size=3)
        passes = -(-heads // per_pass)
        assert got.passes == 2 + passes
        # two cached runs and the passes, each reading every block once (and the unembedding's slices)
        read = layered.stream.loads - loads
        assert read >= (2 + passes) * blocks
        assert read <= (2 + passes) * (blocks + 8)
        _close(got.patched, ref.patched)
        _close(got.metric_clean, ref.metric_clean)


def test_the_budget_sets_the_jobs_a_pass_carries(opened, monkeypatch):
    import dataclasses

    from headwise.models.layer_walk import walk_need
    from headwise.patching.exact import layered_jobs

    whole, layered = opened
    assert layered_jobs(whole, (1, 8), True, 4, 100) is None  # opened whole: a pass is a batch
    assert layered_jobs(layered, (1, 8), True, 4, 3)[0] == 3  # never more than the jobs
    base = walk_need(layered)
    counts = {}
    for extra in (0, 2**20, 8 * 2**20, 64 * 2**20):
        monkeypatch.setattr(layered, "memory", dataclasses.replace(layered.memory, budget=base + extra))
        last, every = layered_jobs(layered, (1, 8), True, 4, 10**6), layered_jobs(layered, (1, 8), False, 4, 10**6)
        assert 1 <= last[1] <= 4 and 1 <= every[1] <= 4  # copies a block call: at most the given
        counts[extra] = (last[0], every[0])
    assert counts[0] == (1, 1)  # no room: one job a pass
    lasts, alls = zip(*counts.values())
    assert list(lasts) == sorted(lasts) and list(alls) == sorted(alls)  # more budget, more jobs a pass
    assert lasts[-1] > alls[-1] >= 8  # the last position's logits alone: more a pass


def _padded(P: int, L: int, seed: int):
    """``(ids, mask)`` ``(P, L)``, right padding: row p has ``L - p`` real tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (P, L), generator=g)
    mask = torch.ones(P, L, dtype=torch.long)
    for p in range(P):
        mask[p, L - p :] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablations_layer_by_layer_equal_the_whole_route_in_fewer_passes(opened, mode):
    """Head sets over every layer (single heads and prefix sets, as importance's exact heads and curves): a model
    opened layer by layer runs them in passes of as many jobs as its budget holds, each job from its own start
    layer, with the objective of the whole route's batched passes."""
    from headwise.analysis.ablation import ablation_objectives
    from headwise.analysis.batched import SweepCost

    whole, layered = opened
    batches = [_padded(3, 9, 1), _padded(2, 6, 2)]
    H, NL = layered.heads_per_layer, layered.num_layers
    jobs = [{layer: [h]} for layer in reversed(range(NL)) for h in range(H[layer])]
    jobs += [{0: [0]}, {0: [0, 1], NL - 1: [2]}, {NL - 1: [0, 1, 2]}, {}]
    ref_cost, cost = SweepCost(), SweepCost()
    ref = ablation_objectives(whole, batches, jobs, mode=mode, cost=ref_cost)
    got = ablation_objectives(layered, batches, jobs, mode=mode, cost=cost)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert cost.passes == (2 if mode == "mean" else 1)  # every job in one pass a part (mean: one part a batch)
    assert cost.passes < ref_cost.passes
    assert cost.kept_passes == 0  # the base rides along: no intact forward kept
    # each job from its own start layer, plus the base's rows from the lowest
    starts = [min(j) if j else 0 for j in jobs]
    assert cost.layer_rows == sum(b[0].shape[0] for b in batches) * (sum(NL - s for s in starts) + NL)


def _job(hm) -> int:
    from headwise.patching.exact import _job_bytes
    from headwise.patching.metric import reads_last_position

    return _job_bytes(hm, (1, 8), reads_last_position(_metric))


def test_a_whole_model_under_a_given_budget_runs_the_copies_it_holds(opened, monkeypatch):
    """Opened whole under a budget given, a sweep's passes hold no more copies than the budget leaves (and the values
    stay the batched sweep's); no budget given: ``batch_size`` a pass."""
    import dataclasses

    from headwise.models.memory import MIN_WORKING, current_rss
    from headwise.patching.exact import budget_copies

    whole, _ = opened
    assert budget_copies(whole, 1, 8, 10**6, 16) == 16  # no budget given: as asked
    g = torch.Generator().manual_seed(5)
    clean = torch.randint(3, 100, (1, 8), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = 7
    ref = patch_heads(whole, clean, corrupted, _metric, batch_size=16)
    held = current_rss()
    monkeypatch.setattr("headwise.models.memory.current_rss", lambda: held)  # the process held still

    def budget(extra):
        monkeypatch.setattr(whole, "memory", dataclasses.replace(whole.memory, budget=held + MIN_WORKING + extra,
                                                                 given=True))  # fmt: skip

    budget(0)
    assert budget_copies(whole, 1, 8, _job(whole), 16) == 1  # no room: one copy a pass
    budget(2**16)
    per_pass = budget_copies(whole, 1, 8, _job(whole), 16)
    assert 1 <= per_pass < 16
    got = patch_heads(whole, clean, corrupted, _metric, batch_size=16)
    heads = sum(whole.heads_per_layer)
    assert got.passes == 2 + -(-heads // per_pass)
    _close(got.patched, ref.patched)


def test_a_layered_pass_inside_a_layer_walk_leaves_the_walk_in_place(opened):
    """Replaced calls nest: a layered pass inside a layer walk gives the blocks back to the walk (whose backward then
    still equals autograd's), not to their own forward."""
    from headwise.models.layer_walk import layer_walk
    from headwise.points import layer_point

    _, layered = opened
    ids = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(6))
    block = layered.points.point("names", layer_point(0, "resid_pre")).module
    with layer_walk(layered):
        walked = block.__dict__.get("forward")
        assert walked is not None
        run_copies(layered, lambda r: layered.logits(ids.repeat(r, 1)), ids, [[Patch(0, 1)]], layered=1)
        assert block.__dict__.get("forward") is walked
    assert "forward" not in block.__dict__
