"""The batched ablation sweep and pruning curves against one forward per head set, on three Hugging Face families,
an encoder and the lab's model; the prefix reuse against a plain batch; the batch size from the memory budget."""

from __future__ import annotations

import contextlib
from functools import partial

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import headwise.hf  # noqa: E402
from _hf_models import VOCAB, build  # noqa: E402
from headwise.analysis import batched as B  # noqa: E402
from headwise.analysis import gates as G  # noqa: E402
from headwise.analysis import importance as I  # noqa: E402
from headwise.analysis import objective as O  # noqa: E402
from headwise.analysis import sweep_plan as SP  # noqa: E402
from headwise.models import HeadModel, LMConfig, TransformerLM, lab_head_model  # noqa: E402

FAMILIES = ("llama", "gpt2", "gemma2")


def _padded(P: int, L: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` ``(P, L)``, right padding: row p has ``L - p`` real tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (P, L), generator=g)
    mask = torch.ones(P, L, dtype=torch.long)
    for p in range(P):
        mask[p, L - p :] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.fixture(scope="module", params=FAMILIES)
def hf_decoder(request):
    model = build(request.param, attn=headwise.hf.NAME, seed=3)
    return HeadModel(model)


def _hf_reference(hm, mode):
    return lambda spec: headwise.hf.ablate(hm.model, spec, mode=mode)


def _assert_same(batched, reference):
    assert batched.base_loss == reference.base_loss or abs(batched.base_loss - reference.base_loss) < 1e-6
    np.testing.assert_allclose(batched.ablation, reference.ablation, rtol=0, atol=1e-5)
    assert set(batched.curves) == set(reference.curves)
    for name in reference.curves:
        np.testing.assert_allclose(batched.curves[name], reference.curves[name], rtol=0, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(batched.random_curves, reference.random_curves, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(batched.removed, reference.removed)


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("copies", [3, None])
def test_hf_sweep_equals_one_forward_per_head_set(hf_decoder, mode, copies):
    """Two padded batches of different shapes; 3 copies a pass (8 heads: a short last pass) or as many as memory
    allows; against :func:`headwise.hf.ablate` one head set per forward."""
    hm = hf_decoder
    batches = [_padded(3, 9, 1), _padded(2, 6, 2)]
    kw = dict(random_orders=2, points=9, seed=4)
    reference = I.head_importance(hm, batches, ablate=_hf_reference(hm, mode), **kw)
    got = I.head_importance(hm, batches, mode=mode, copies=copies, **kw)
    _assert_same(got, reference)
    # not the trivial case: heads matter, and mean ablation differs from zero ablation
    assert np.abs(got.ablation).max() > 1e-3
    assert got.sweep["mode"] == mode and got.sweep["copies"] >= (3 if copies == 3 else 1)
    n = hm.num_layers * hm.num_heads
    # single heads + distinct pruning sets (the full set shared by every order)
    assert got.sweep["head_sets"] < n + 4 * (len(got.removed) - 1)
    per_pass = got.sweep["copies"]
    if copies == 3:
        assert got.sweep["passes"] == sum(2 * -(-k // 3) for k in (n, got.sweep["head_sets"] - n))
    assert per_pass >= 1


def test_mean_is_not_zero(hf_decoder):
    from headwise.analysis.protocol import AnalysedModel, SweptModel

    hm = hf_decoder
    assert isinstance(hm, SweptModel) and isinstance(hm, AnalysedModel)
    batches = [_padded(3, 9, 1)]
    zero = I.head_importance(hm, batches, random_orders=1, points=3, mode="zero")
    mean = I.head_importance(hm, batches, random_orders=1, points=3, mode="mean")
    assert np.abs(zero.ablation - mean.ablation).max() > 1e-4


@pytest.mark.parametrize("P", [1, 3])
def test_prefix_reuse_is_a_plain_batch(hf_decoder, P):
    """Copies started at layer 1's input (layer 0 run once on the P rows) give the rows of the plain batch."""
    hm = hf_decoder
    ids, mask = _padded(P, 9, 5)
    jobs = [{1: [0]}, {1: [2, 3]}, {1: [1]}]

    def run(repeat):
        return hm.forward(ids.repeat(repeat, 1), mask.repeat(repeat, 1))

    for mode in B.MODES:
        fast, low = B.run_copies(hm, run, ids, jobs, replacement=mode, real=mask > 0)
        plain, low0 = B.run_copies(hm, run, ids, jobs, replacement=mode, real=mask > 0, prefix=False)
        assert (low, low0) == (1, 0)
        real = mask.repeat(3, 1) > 0
        torch.testing.assert_close(fast[real], plain[real], rtol=0, atol=1e-5)
        # and each copy is its own job run alone
        for j, job in enumerate(jobs):
            alone, _ = B.run_copies(hm, run, ids, [job], replacement=mode, real=mask > 0)
            torch.testing.assert_close(fast[j * P : (j + 1) * P][mask > 0], alone[mask > 0], rtol=0, atol=1e-5)
    assert B.start_layer(hm, [{1: [0]}, {0: [1]}]) == 0 and B.start_layer(hm, [{}]) == 0


def test_encoder_sweep_equals_one_forward_per_head_set():
    hm = HeadModel(build("bert", attn=headwise.hf.NAME, seed=2))
    assert hm.kind == "encoder"
    batches = [_padded(3, 8, 7)]
    kw = dict(random_orders=1, points=5)
    for mode in ("zero", "mean"):
        reference = I.head_importance(hm, batches, ablate=_hf_reference(hm, mode), **kw)
        got = I.head_importance(hm, batches, mode=mode, copies=5, **kw)
        _assert_same(got, reference)
        assert got.ablation.max() > 1e-4


@contextlib.contextmanager
def _lab_mean(hm, spec):
    """Mean ablation written out for the lab model: each removed head's output replaced by its mean over every
    row and position of the forward (the lab's batches have no padding)."""
    hooks = {}
    for layer, heads in spec.items():

        def hook(out, heads=tuple(heads)):
            out = out.clone()
            for h in heads:
                out[:, h] = out[:, h].mean(dim=(0, 1), keepdim=True)
            return out

        hooks[f"layers.{layer}.attn.heads"] = hook
    with hm.hooks(hooks):
        yield


def _lab_batches(seed, L=10):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for P in (4, 3):
        ids = torch.randint(0, 20, (P, L), generator=g)
        scored = torch.zeros(P, L, dtype=torch.bool)
        scored[:, L // 2 :] = True
        batches.append((ids, torch.randint(0, 20, (P, L), generator=g), scored))
    return batches


def test_lab_model_sweep_equals_one_forward_per_head_set():
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=20, context_length=16, d_model=24, num_layers=3, num_heads=3)).eval()
    hm = lab_head_model(model)
    batches, held_out = _lab_batches(0), _lab_batches(1)
    kw = dict(scored="answers", eval_batches=held_out, random_orders=3, points=1 << 30)

    def zero(spec):
        gates = torch.ones(hm.num_layers, hm.num_heads)
        for layer, heads in spec.items():
            gates[layer, heads] = 0.0
        return hm.gated(gates)

    for mode, ablate in (("zero", zero), ("mean", lambda spec: _lab_mean(hm, spec))):
        reference = I.head_importance(hm, batches, ablate=ablate, **kw)
        for copies in (4, None):
            got = I.head_importance(hm, batches, mode=mode, copies=copies, **kw)
            _assert_same(got, reference)
            np.testing.assert_array_equal(got.importance, reference.importance)
        # memory for 4 rows of 10 tokens a pass: zero ablation runs 4 copies of 1 row (the batch split), mean
        # ablation 1 copy of the whole batch (its mean is over the batch); beside one chunk of the loss's exponentials
        four_rows = 4 * 10 * SP.bytes_per_token(hm, 20) + 4 * O.LOSS_CHUNK * 20
        got = I.head_importance(hm, batches, mode=mode, memory=four_rows, **kw)
        _assert_same(got, reference)
        assert got.sweep["copies"] == (4 if mode == "zero" else 1)
    # every k of 0 … 9 on the curves; the last point (all heads gone) measured once for all five orders
    assert len(got.removed) == 10 and got.sweep["head_sets"] <= 9 + 5 * 8 + 1


def test_gates_forward_gives_the_intact_objective():
    """The intact objective read off the gates' forward equals a separate no-gradient forward."""
    torch.manual_seed(1)
    model = TransformerLM(LMConfig(vocab_size=20, context_length=16, d_model=16, num_layers=2, num_heads=2)).eval()
    hm = lab_head_model(model)
    batches = _lab_batches(3)
    _, _, loss, tokens = G.decoder_importance(hm, batches, "answers", lambda *a: None)
    alone, count = I.objective(hm, batches, scored="answers")
    assert tokens == count and loss == pytest.approx(alone, rel=1e-6)


def test_batch_size_from_the_memory_budget():
    assert B.choose_copies(270, 8, 100, 1000, budget=8 * 100 * 1000 * 5) == 5
    assert B.choose_copies(270, 8, 100, 1000, budget=10) == 1
    assert B.choose_copies(3, 1, 10, 10, budget=1 << 40) == 3
    assert B.choose_copies(270, 1, 10, 10, budget=1 << 40, most=64) == 64
    assert B.choose_copies(270, 8, 100, 1, budget=1 << 40, pass_tokens=4096) == 5  # 5 × 800 tokens ≤ 4,096
    assert B.choose_copies(270, 1, 8192, 1, budget=1 << 40, pass_tokens=4096) == 1
    assert B.choose_split(270, 64, 64, 1, budget=1 << 40, pass_tokens=4096) == (64, 1)  # 64 copies of 1 row
    assert B.choose_split(8, 64, 64, 1, budget=1 << 40, pass_tokens=4096) == (8, 8)
    assert B.choose_split(8, 64, 64, 1, budget=1 << 40, pass_tokens=4096, split=False) == (1, 64)
    assert B.free_memory() > 0
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=20, context_length=16, d_model=16, num_layers=2, num_heads=2)).eval()
    hm = lab_head_model(model)
    small = I.head_importance(hm, _lab_batches(0), scored="answers", random_orders=1, points=3, memory=1)
    large = I.head_importance(hm, _lab_batches(0), scored="answers", random_orders=1, points=3, memory=1 << 34)
    assert small.sweep["copies"] == 1 and small.sweep["memory_budget"] == 1
    assert large.sweep["copies"] > 1 and large.sweep["passes"] < small.sweep["passes"]
    np.testing.assert_allclose(small.ablation, large.ablation, rtol=0, atol=1e-6)
    assert large.to_dict()["sweep"]["copies"] == large.sweep["copies"]
    with pytest.raises(ValueError, match="mode"):
        I.head_importance(hm, _lab_batches(0), scored="answers", mode="resample")
    with pytest.raises(ValueError, match="copies"):
        I.head_importance(hm, _lab_batches(0), scored="answers", copies=0)


def test_an_interrupted_sweep_leaves_the_model_unhooked(hf_decoder):
    """Ctrl-C in the middle of the sweep (from the progress callback): the hooks and the copies' block hooks are
    gone, and the model runs as it did before."""
    hm = hf_decoder
    ids, mask = _padded(3, 9, 6)
    with torch.no_grad():
        before = hm.forward(ids, mask)
    calls = []

    def progress(stage, done, total):
        calls.append((stage, done, total))
        if stage == "ablation" and done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        I.head_importance(hm, [(ids, mask)], copies=2, progress=progress)
    assert calls[-1] == ("ablation", 2, 4)  # 8 heads, 2 a pass: passes done of passes in all
    blocks = [hm.points[f"layers.{i}.resid_pre"].module for i in range(hm.num_layers)]
    assert all(not b._forward_pre_hooks for b in blocks)
    with torch.no_grad():
        torch.testing.assert_close(hm.forward(ids, mask), before, rtol=0, atol=0)


def test_gradient_pass_recomputed_equals_kept(hf_decoder):
    """Blocks recomputed in the backward pass (activation checkpointing) give the same gradients and loss."""
    hm = hf_decoder
    batches = [_padded(3, 9, 8), _padded(2, 6, 9)]
    kept = G.decoder_importance(hm, batches, "next_token", lambda *a: None, recompute=False)
    again = G.decoder_importance(hm, batches, "next_token", lambda *a: None, recompute=True)
    np.testing.assert_allclose(again[0], kept[0], rtol=0, atol=1e-7)
    assert again[1:] == kept[1:] or abs(again[2] - kept[2]) < 1e-7
    blocks = [hm.points[f"layers.{i}.resid_pre"].module for i in range(hm.num_layers)]
    assert all("forward" not in b.__dict__ for b in blocks)  # the blocks' own forward back
    # and the gradient pass's importance against the reference (one full-logits loss, F.cross_entropy)
    ids, mask = batches[0]
    gates = torch.ones((3, hm.num_layers, hm.num_heads), requires_grad=True)
    ids_, mask_, targets, chosen = O.decoder_targets((ids, mask), "next_token")
    with hm.gated(gates):
        losses, n = O.decoder_losses(hm.forward(ids_, mask_), targets, chosen)
    losses.sum().backward()
    one = G.decoder_importance(hm, batches[:1], "next_token", lambda *a: None, recompute=True)
    np.testing.assert_allclose(one[0], gates.grad.abs().double().mean(dim=0).numpy(), rtol=0, atol=1e-6)


def test_scored_rows_and_chunked_loss(monkeypatch):
    """The LM head on the scored positions alone (Gemma 2's final soft-capping after it included) equals the full
    logits at those positions; the loss by chunks equals ``F.cross_entropy``."""
    hm = HeadModel(build("gemma2", attn=headwise.hf.NAME, seed=5))
    ids, mask = _padded(3, 9, 10)
    _, _, targets, chosen = O.decoder_targets((ids, mask), "next_token")
    index = chosen.reshape(-1).nonzero()[:, 0]
    with torch.no_grad():
        full = hm.forward(ids, mask)
        some = O.scored_logits(hm, lambda: hm.forward(ids, mask), index)
    assert some.shape == (len(index), VOCAB)
    torch.testing.assert_close(some, full.reshape(-1, VOCAB)[index], rtol=0, atol=1e-5)
    monkeypatch.setattr(O, "LOSS_CHUNK", 4)
    want = torch.nn.functional.cross_entropy(some, targets.reshape(-1)[index], reduction="none")
    torch.testing.assert_close(O.token_losses(some, targets.reshape(-1)[index]), want, rtol=0, atol=1e-5)


def test_rows_packed_by_length_keep_every_scored_position():
    batches = [_padded(4, 9, 11), _padded(3, 12, 12)]
    whole = sum(int(O.decoder_targets(b, "next_token")[3].sum()) for b in batches)
    parts, count = SP.row_parts(batches, "next_token", None, True, 20)
    assert count == whole == sum(len(p.index) for p in parts)
    lengths = [p.ids.shape[1] for p in parts]
    assert lengths == sorted(lengths, reverse=True) and all(p.tokens <= 20 or p.ids.shape[0] == 1 for p in parts)
    # no part runs the last token of its longest row (it has no target) nor padding past it
    assert all(int(p.mask[:, -1].sum()) >= 1 for p in parts)
    parts, count = SP.row_parts(batches, "next_token", None, False, 20)  # mean ablation: the batches as given
    assert [p.ids.shape for p in parts] == [(4, 9), (3, 12)] and count == whole


def test_passes_start_at_their_layer_from_the_kept_stream(hf_decoder):
    """A pass started from the blocks' kept outputs (layers below not run) equals a plain batch, for one copy and
    several; jobs are grouped by start layer."""
    hm = hf_decoder
    ids, mask = _padded(3, 9, 13)
    run = partial(_run_rep, hm, ids, mask)
    with torch.no_grad():
        _, kept = B.keep_blocks(hm, lambda: hm.forward(ids, mask))
    assert len(kept) == hm.num_layers
    calls = []
    blocks = [hm.points[f"layers.{i}.resid_pre"].module for i in range(hm.num_layers)]
    handle = hm.attention_modules[0].register_forward_hook(lambda *a: calls.append(1))
    try:
        for jobs in ([{1: [2]}], [{1: [0]}, {1: [1, 3]}]):
            for mode in B.MODES:
                fast, low = B.run_copies(hm, run, ids, jobs, replacement=mode, real=mask > 0, kept=kept)
                assert low == 1 and not calls  # layer 0 did not run
                plain, _ = B.run_copies(hm, run, ids, jobs, replacement=mode, real=mask > 0, prefix=False)
                calls.clear()
                real = mask.repeat(len(jobs), 1) > 0
                torch.testing.assert_close(fast[real], plain[real], rtol=0, atol=1e-5)
    finally:
        handle.remove()
    assert all("forward" not in b.__dict__ for b in blocks)
    groups = B.start_groups(hm, [{1: [0]}, {0: [1]}, {1: [2]}, {}, {0: [0], 1: [1]}])
    assert groups == [(1, [0, 2]), (0, [1, 3, 4])]
    assert B.start_groups(hm, [{1: [0]}, {0: [1]}], prefix=False) == [(0, [0, 1])]


def _run_rep(hm, ids, mask, repeat):
    return hm.forward(ids.repeat(repeat, 1), mask.repeat(repeat, 1))


def test_hooked_heads_keep_the_sdpa_kernel(monkeypatch):
    """With only ``attn.heads`` hooked (the sweep), every attention call of an unpadded batch goes to the SDPA kernel
    with the causal flag — no ``L × S`` weights nor mask formed."""
    from headwise.core import dispatch

    hm = HeadModel(build("llama", attn=headwise.hf.NAME, seed=6))
    seen = []
    real_sdpa = dispatch.attention_sdpa

    def sdpa(q, k, v, **kw):
        seen.append((kw.get("blocked"), kw.get("is_causal"), q.shape[0]))
        return real_sdpa(q, k, v, **kw)

    def math(*a, **k):
        raise AssertionError("the readable path formed the weights")

    monkeypatch.setattr(dispatch, "attention_sdpa", sdpa)
    monkeypatch.setattr(dispatch, "attention_math", math)
    ids = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    batches = [(ids, torch.ones_like(ids))]
    I.ablation_objectives(hm, batches, [{1: [0]}, {0: [1]}, {1: [1, 2]}])
    assert seen and all(blocked is None and causal for blocked, causal, _ in seen)


def test_packing_is_the_cheapest_partition():
    """The dynamic programme against every contiguous partition of small sorted lengths."""
    import itertools

    rng = np.random.default_rng(0)
    for _ in range(20):
        lengths = sorted(rng.integers(1, 30, size=int(rng.integers(1, 8))).tolist(), reverse=True)
        cap = int(rng.integers(20, 80))

        def cost(cuts, lengths=lengths, cap=cap):
            bounds = [0, *cuts, len(lengths)]
            parts = list(zip(bounds, bounds[1:]))
            if any(b - a > 1 and (b - a) * lengths[a] > cap for a, b in parts):
                return None
            return sum((b - a) * lengths[a] + SP.PART_TOKENS for a, b in parts)

        costs = [
            c
            for k in range(len(lengths))
            for cuts in itertools.combinations(range(1, len(lengths)), k)
            if (c := cost(cuts)) is not None
        ]
        got = SP.packing(lengths, cap)
        assert got[0][0] == 0 and got[-1][1] == len(lengths)
        assert all(a < b for a, b in got) and all(x[1] == y[0] for x, y in zip(got, got[1:]))
        assert cost([b for _, b in got[:-1]]) == min(costs)


def test_chunked_loss_with_a_gradient(monkeypatch):
    """The gradient path of the chunked loss (logsumexp) equals ``F.cross_entropy``, values and gradients."""
    monkeypatch.setattr(O, "LOSS_CHUNK", 5)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 30, generator=g, requires_grad=True)
    targets = torch.randint(0, 30, (12,), generator=g)
    got = O.token_losses(logits, targets)
    (grad,) = torch.autograd.grad(got.sum(), logits)
    want = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    (ref,) = torch.autograd.grad(want.sum(), logits)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad, ref, rtol=0, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(O.token_losses(logits, targets), want.detach(), rtol=0, atol=1e-6)
