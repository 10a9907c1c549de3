"""The layer walk: a model opened layer by layer, differentiated layer by layer (each block checkpointed, its weights
brought in again for its backward, one block in at a time), gives the gradients of autograd on the whole model —
for a plain pre-norm decoder, a parallel block, norms on the writes, QK-norms; EAP, EAP-IG and atp* scores and a
whole circuit run equal the whole route's; a large unembedding read by rows is differentiated by reading its slices
again; after the walk every weight is back on the meta device."""

from __future__ import annotations

import warnings

import pytest
import torch

from _anatomy_models import tiny
from headwise.models import open_model
from headwise.models.layer_walk import layer_walk
from headwise.points import layer_point

FAMILIES = ["llama", "gemma2", "gpt_neox", "olmo2", "gpt2"]  # plain, norms on the writes, parallel, QK-norm, fused


def _save(family: str, folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny(family).to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """The same bf16 checkpoint opened whole and layer by layer."""
    folder = _save(request.param, tmp_path_factory.mktemp(request.param))
    return open_model(folder, by_layer=False), open_model(folder, by_layer=True)


def _ids(seed=0, P=3, L=9):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, 100, (P, L), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(3, 100, (P,), generator=g)
    return clean, corrupted


def _metric(logits):
    return logits[:, -1, 5] - logits[:, -1, 7]


def _blocks_in(hm) -> int:
    units = hm.stream.block_units()
    return sum(any(p.device.type != "meta" for p in hm.stream.units[u].parameters()) for u in units)


def _gradients(hm, ids, seen: list | None = None):
    """∂metric/∂(a zero added to the residual stream at every layer's input and at the final norm's input)."""
    zeros = {}

    def add(name):
        def hook(x):
            z = zeros[name] = torch.zeros_like(x, requires_grad=True)
            if seen is not None and hm.stream is not None:
                z.register_hook(lambda g: seen.append(_blocks_in(hm)))
            return x + z

        return hook

    names = [layer_point(layer, "resid_pre") for layer in range(hm.num_layers)] + ["resid_final"]
    with torch.enable_grad(), hm.hooks([(n, add(n)) for n in names]):
        value = _metric(hm.logits(ids)).sum()
        grads = torch.autograd.grad(value, [zeros[n] for n in names])
    return dict(zip(names, grads)), value.detach()


def _close(got, ref, rel=1e-5):
    torch.testing.assert_close(got, ref, rtol=rel, atol=rel * float(ref.abs().max()) + 1e-12)


def test_the_walk_gives_autograds_gradients_one_block_at_a_time(pair):
    whole, layered = pair
    ids, _ = _ids()
    ref, value = _gradients(whole, ids)
    seen: list[int] = []
    after: list[int] = []
    with layer_walk(layered):
        got, got_value = _gradients(layered, ids, seen)
        counting = [(layer_point(n, "attn.heads"), lambda z: after.append(_blocks_in(layered)))
                    for n in range(layered.num_layers)]  # fmt: skip
        with torch.no_grad(), layered.hooks(counting):
            layered.logits(ids)  # a forward pass after the backward one
    _close(got_value, value)
    for name in ref:
        _close(got[name], ref[name])
    assert seen and max(seen) <= 1  # during the backward pass at most one block's weights are in
    assert after and max(after) == 1  # and in the forward pass after it (the backward's last block let go)
    assert all(p.device.type == "meta" for p in layered.model.parameters())  # all released after the walk


def test_without_the_walk_a_layered_model_is_not_differentiated_through_its_layers(pair):
    """Outside the walk the anatomy of a model opened layer by layer is refused in one line (the tools that read
    it differentiate inside one)."""
    _, layered = pair
    with pytest.raises(ValueError, match="opened layer by layer"):
        layered.anatomy  # noqa: B018


@pytest.mark.parametrize("method", ["eap", "eap-ig", "atp*"])
def test_edge_attribution_layer_by_layer_equals_the_whole_route(pair, method):
    from headwise.circuits import edge_attribution

    whole, layered = pair
    clean, corrupted = _ids(1)
    ref = edge_attribution(whole, clean, corrupted, _metric, method=method, steps=3)
    with layer_walk(layered):
        got = edge_attribution(layered, clean, corrupted, _metric, method=method, steps=3)
    _close(got.per_pair, ref.per_pair)
    _close(got.metric_clean, ref.metric_clean)


def test_a_circuit_layer_by_layer_equals_the_whole_route(tmp_path):
    from headwise.circuits import find_circuit

    folder = _save("qwen2", tmp_path / "qwen2")
    whole, layered = open_model(folder, by_layer=False), open_model(folder, by_layer=True)
    clean, corrupted = _ids(2)
    kw = dict(answer=5, wrong=7, method="atp*", exact_top=8)
    ref = find_circuit(whole, clean, corrupted, **kw)
    with layer_walk(layered):
        got = find_circuit(layered, clean, corrupted, **kw)
    a, b = ref.to_dict(), got.to_dict()
    scale = max(abs(e["scores"]["atp*"]) for e in a["edges"])
    for x, y in zip(a["edges"], b["edges"]):
        assert (x["sender"], x["receiver"]) == (y["sender"], y["receiver"])
        for key, v in x["scores"].items():
            assert y["scores"][key] == pytest.approx(v, rel=1e-5, abs=1e-5 * scale), (x, y)
    assert a["circuit"]["edges"] == b["circuit"]["edges"]
    assert b["faithfulness"]["recovered"] == pytest.approx(a["faithfulness"]["recovered"], abs=1e-5)
    assert all(p.device.type == "meta" for p in layered.model.parameters())


def test_a_sliced_unembedding_is_differentiated_by_reading_its_slices_again(tmp_path, monkeypatch):
    from headwise.models import streamed

    folder = _save("llama", tmp_path / "llama")
    whole = open_model(folder, by_layer=False)
    monkeypatch.setattr(streamed, "SLICE_BYTES", 4096)  # the unembedding read 16 rows at a time
    layered = open_model(folder, by_layer=True)
    assert set(layered.stream.sliced) == {"model.embed_tokens", "lm_head"}
    reads = []
    load_rows = layered.stream.tensors.load_rows
    monkeypatch.setattr(
        layered.stream.tensors, "load_rows", lambda name, rows: reads.append(name) or load_rows(name, rows)
    )
    ids, _ = _ids(3)
    ref, _ = _gradients(whole, ids)
    with layer_walk(layered):
        got, _ = _gradients(layered, ids)
    for name in ref:
        _close(got[name], ref[name])
    V, slices = layered.model.lm_head.out_features, 0
    slices = -(-V // (4096 // (4 * layered.model.lm_head.in_features)))
    assert reads.count("lm_head.weight") == 2 * slices  # each slice read in the forward and again in the backward


@pytest.mark.parametrize("route", ["estimate", "exact"])
def test_head_importance_layer_by_layer_equals_the_whole_route(pair, route):
    """``--importance``'s estimate (every head's attention-aware estimate, the top heads measured exactly) and its
    exact route (the gates' gradients, every head ablated, the pruning curves) in a walk."""
    import numpy as np

    from headwise.study.importance import run_importance
    from headwise.study.importance_estimate import estimate_importance

    whole, layered = pair
    ids, _ = _ids(4, P=4, L=10)
    batches = [(ids[:2], torch.ones_like(ids[:2])), (ids[2:], torch.ones_like(ids[2:]))]
    if route == "estimate":
        run = lambda hm: estimate_importance(hm, batches, seed=0, mode="zero", top_k=3)  # noqa: E731
    else:
        run = lambda hm: run_importance(hm, batches, seed=0, mode="zero")  # noqa: E731
    ref = run(whole)
    with layer_walk(layered):
        got = run(layered)
    for name in ("importance", "ablation", "estimate"):
        a, b = getattr(ref, name, None), getattr(got, name, None)
        if a is None:
            continue
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * float(np.nanmax(np.abs(a))))
    assert all(p.device.type == "meta" for p in layered.model.parameters())


def test_a_pass_reads_each_block_into_the_buffers_the_last_one_freed(pair):
    """The stream keeps a released block's float32 tensors (at most one block's worth) and reads the next block into
    them; a weight a caller still holds — a detached copy, a view — is never written over."""
    whole, layered = pair
    ids, _ = _ids()
    stream = layered.stream
    stream.drain()
    block = stream.units[stream.block_units()[0]]
    kept, pointers = [], []

    def keep(module, args):  # after the stream's own pre-hook: the block's weights are in
        if not kept:  # the first pass: a view of one weight held past the block's release
            kept.append((next(module.parameters()).detach()[:1], next(module.parameters()).detach()[:1].clone()))
        pointers.append({p.data_ptr() for p in module.parameters()})

    handle = block.register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            first = layered.logits(ids)
            assert 0 < stream.pooled_bytes <= stream._buffers.limit  # at most one block's float32 weights
            pooled = {t.data_ptr() for ts in stream._buffers._free.values() for t in ts}
            second = layered.logits(ids)
    finally:
        handle.remove()
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    _close(second, whole.logits(ids))
    view, values = kept[0]
    torch.testing.assert_close(view, values, rtol=0, atol=0)  # the held weight was not written over
    assert pointers[1] & pooled  # the second pass's block 0 read into buffers the first pass freed
    assert view.data_ptr() not in pointers[1]  # … never into the one a caller still holds
    stream.drain()
    assert stream.pooled_bytes == 0
