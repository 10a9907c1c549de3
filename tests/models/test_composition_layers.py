"""The weights' circuits on a model opened layer by layer, a group of sender layers at a time
(:func:`headwise.circuits.composition_layers.weights_circuits`): every composition score (Q, K, V, per key/value group)
and every copying score equal the whole float32 route's for groups of one layer, two and every layer, on tiny random
models of several families stored as bf16 (a GGUF file read without a cache and matrices read by rows too); at most
one layer's attention parts are in at a time and no MLP matrix is read by the groups' reads; the group follows the
budget, and a budget too small for one sender layer beside its receiver is refused in one line naming the memory
needed."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from _anatomy_models import tiny
from _helpers import all_meta
from headwise.circuits import composition, composition_layers
from headwise.circuits.composition_layers import composition_group, composition_need, weights_circuits
from headwise.models import open_model
from headwise.models.memory import MemoryBudgetError, format_size

pytest.importorskip("transformers")

LAYERS = 5
KINDS = ("q", "k", "v", "k_group", "v_group")


def _save(family: str, folder, layers: int = LAYERS):
    model = tiny(family, num_hidden_layers=layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.to(torch.bfloat16).save_pretrained(folder)
    return folder


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest relative difference of ``b`` from ``a`` where ``a`` has a score (NaN where both have none)."""
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    f = ~torch.isnan(a)
    return float(((a[f] - b[f]).abs() / a[f].abs().clamp_min(1e-30)).max()) if f.any() else 0.0


def _same(whole, layered) -> float:
    (sa, ca), (sb, cb) = whole, layered
    worst = 0.0
    for kind in KINDS:
        a, b = getattr(sa, kind), getattr(sb, kind)
        assert a.shape == b.shape, kind
        assert torch.isfinite(a).any(), kind
        worst = max(worst, _relative(a, b))
    for name in ("copying", "positive"):
        worst = max(worst, _relative(getattr(ca, name), getattr(cb, name)))
    for x, y in zip(ca.eigenvalues, cb.eigenvalues):
        torch.testing.assert_close(y, x, rtol=1e-9, atol=1e-12)
    assert worst <= 1e-5, worst
    return worst


def _watch(monkeypatch, hm) -> list[int]:
    """Record, at each layer's read for the groups, how many layers have a parameter in (the one read included),
    and check that no 2-D MLP parameter is in."""
    seen: list[int] = []
    read = composition._layer_weights
    blocks = [hm.stream.units[u] for u in hm.stream.block_units()]

    def watched(anatomy, cache, layer):
        seen.append(sum(any(p.device.type != "meta" for p in b.parameters()) for b in blocks))
        for name, p in blocks[layer].named_parameters():
            if p.dim() >= 2 and "attn" not in name and "attention" not in name:
                assert p.device.type == "meta", name
        return read(anatomy, cache, layer)

    monkeypatch.setattr(composition, "_layer_weights", watched)
    return seen


@pytest.mark.parametrize("family", ["llama", "gemma2", "olmo2", "gpt2", "qwen3", "phi3"])
def test_groups_of_layers_equal_the_whole_route(family, tmp_path, monkeypatch):
    """Llama (GQA), Gemma 2 (norms on the writes, soft-caps), OLMo 2 (a QK-norm over the projection), GPT-2 (a fused
    projection, a tied unembedding), Qwen 3 (a per-head QK-norm), Phi-3 (a fused qkv_proj)."""
    folder = _save(family, tmp_path / family)
    whole, layered = open_model(folder, by_layer=False), open_model(folder, by_layer=True)
    assert layered.stream is not None and all_meta(layered)
    reference = weights_circuits(whole)
    seen = _watch(monkeypatch, layered)
    for group in (1, 2, LAYERS):
        seen.clear()
        steps: list[tuple[int, int]] = []
        got = weights_circuits(
            layered, group=group, progress=lambda done, total, steps=steps: steps.append((done, total))
        )
        _same(reference, got)
        assert all_meta(layered)
        assert seen and max(seen) == 1  # one layer's attention parts in at a time
        starts = range(0, LAYERS, group)  # each group's layers once, then every later layer as a receiver
        total = LAYERS + sum(LAYERS - min(LAYERS, a + group) for a in starts)
        assert steps == [(k, total) for k in range(1, total + 1)] and len(seen) == total
    with pytest.raises(ValueError, match="opened layer by layer"):  # outside the tool: refused as before
        layered.anatomy  # noqa: B018


def test_matrices_read_by_rows(tmp_path, monkeypatch):
    """An embedding and unembedding over SLICE_BYTES: ``W_U W_E`` summed over several slices of rows."""
    from headwise.models import streamed

    monkeypatch.setattr(streamed, "SLICE_BYTES", 2048)
    folder = _save("llama", tmp_path / "llama", layers=3)
    whole, layered = open_model(folder, by_layer=False), open_model(folder, by_layer=True)
    assert layered.stream.sliced
    _same(weights_circuits(whole), weights_circuits(layered, group=2))
    assert all_meta(layered)


def test_gguf_without_a_cache(tmp_path):
    pytest.importorskip("gguf")
    from _gguf import gguf_routes

    whole, layered = gguf_routes(tmp_path)
    _same(weights_circuits(whole), weights_circuits(layered, group=1))
    assert all_meta(layered)


def test_the_group_follows_the_budget_and_too_small_a_budget_is_refused(tmp_path, monkeypatch):
    import headwise.models.memory as memory

    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    monkeypatch.setattr(composition, "BLOCK_BYTES", 2**16)  # the products' share, near the senders'
    folder = _save("llama", tmp_path / "llama")
    whole, hm = open_model(folder, by_layer=False), open_model(folder, by_layer=True)
    reference = weights_circuits(whole)
    first, fixed, sender, layers = composition_layers._need_parts(hm)
    assert layers == LAYERS and sender == 4 * 64 * 64  # W_O's (H·Dh, D) entries: the sender factors' (H, Dh, D)
    needs = [composition_need(hm, g) for g in range(1, LAYERS + 1)]
    assert needs == [300 * 10**6 + memory.MIN_WORKING + max(first, fixed + g * sender) for g in range(1, LAYERS + 1)]
    assert composition_need(whole) == 0 and composition_group(whole) == LAYERS
    assert first < fixed + sender  # a group's work, not the probe pass, sets the budget: every group apart
    for group in range(1, LAYERS + 1):
        for budget in (needs[group - 1], needs[group - 1] + sender - 1):
            hm.memory = dataclasses.replace(hm.memory, budget=budget)
            assert composition_group(hm) == group
    hm.memory = dataclasses.replace(hm.memory, budget=10**12)
    assert composition_group(hm) == LAYERS  # never more than every layer
    hm.memory = dataclasses.replace(hm.memory, budget=needs[1])
    _same(reference, weights_circuits(hm))  # the budget's group
    need = needs[0]
    hm.memory = dataclasses.replace(hm.memory, budget=need - 1)
    said = (
        rf"model: {hm.name} was opened layer by layer \(budget {format_size(need - 1)}\); --composition reads the "
        rf"attention weights of a receiver layer and a group of its senders' layers at a time, which needs about "
        rf"{format_size(need)} \(a max_memory at least that\)"
    )
    with pytest.raises(MemoryBudgetError, match=said) as e:
        weights_circuits(hm)
    assert (e.value.budget, e.value.need, e.value.route) == (need - 1, need, "layers")
    assert e.value.worded("--max-memory").endswith("(a --max-memory at least that)")
    assert all_meta(hm)
    with pytest.raises(ValueError, match=r"group: expected a positive number of layers, got 0"):
        weights_circuits(hm, group=0)


def test_a_held_layer_reads_its_attention_parts_alone(tmp_path):
    """``attention_held``: the attention module's parameters and the 1-D ones in, the MLP's matrices on the meta
    device, every parameter back on it after; a model opened whole: nothing changes."""
    from headwise.models.pinned import attention_held, layer_attention_bytes

    folder = _save("llama", tmp_path / "llama", layers=2)
    whole, hm = open_model(folder, by_layer=False), open_model(folder, by_layer=True)
    reference = dict(whole.model.named_parameters())
    loads = hm.stream.loads
    with attention_held(hm, 1):
        for name, p in hm.model.named_parameters():
            inside = name.startswith("model.layers.1.") and (".self_attn." in name or p.dim() == 1)
            if inside:
                torch.testing.assert_close(p, reference[name], rtol=0, atol=0)
            else:
                assert p.device.type == "meta", name
    assert hm.stream.loads == loads + 1 and all_meta(hm)
    layer = hm.model.model.layers[1]
    attn = sum(4 * p.numel() for p in layer.self_attn.parameters())
    ones = sum(4 * p.numel() for n, p in layer.named_parameters() if p.dim() == 1 and ".self_attn." not in f".{n}")
    assert layer_attention_bytes(hm)[1][0] == attn + ones and layer_attention_bytes(whole) == []
    with attention_held(whole, 0, 1):
        pass
