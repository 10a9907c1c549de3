"""Tools that read the attention parts from the weights on a model opened layer by layer: the weights' circuits pin
every layer's attention parts (the stream's pinned parameters stay in through a forward pass while the rest of each
layer streams), QK attribution reads one layer at a time after its pass; both equal the whole float32 route on the
same weights (bf16 safetensors of several families, a GGUF file read without a cache, matrices read by rows); a
budget too small is refused in one line naming the memory needed; afterwards every parameter is back on the meta
device and the kept anatomy holds no weight."""

from __future__ import annotations

import dataclasses
import gc
import warnings
import weakref

import pytest
import torch

from _anatomy_models import tiny
from _helpers import all_meta
from headwise.circuits import composition_scores, copying_scores, head_weights, qk_attribution
from headwise.circuits.qk import qk_activations
from headwise.models import open_model
from headwise.models.layer_walk import walk_need
from headwise.models.memory import MemoryBudgetError, format_size
from headwise.models.pinned import attention_bytes, attention_need, attention_pinned

RESULTS = ("terms", "query_terms", "key_terms", "query_centred", "key_centred", "query_effect", "key_effect",
           "scores", "logits", "weights", "keys")  # fmt: skip


def _save(family: str, folder):
    model = tiny(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.to(torch.bfloat16).save_pretrained(folder)
    return folder


def _ids(seed=0, n=9):
    return torch.randint(3, 100, (n,), generator=torch.Generator().manual_seed(seed))


def _same_qk(a, b):
    assert (a.layer, a.head, a.group, a.query, a.key) == (b.layer, b.head, b.group, b.query, b.key)
    assert a.query_labels == b.query_labels and a.key_labels == b.key_labels
    for name in RESULTS:
        torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=1e-5, atol=1e-7, msg=name)


def _same_weights(a, b):
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        assert len(getattr(a, name)) == len(getattr(b, name))
        for x, y in zip(getattr(a, name), getattr(b, name)):
            torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-9, msg=name)
    assert b.W_E is None and b.W_U is None  # never held whole on the layer route: W_U W_E by slices
    torch.testing.assert_close(b.UE, a.W_U @ a.W_E, rtol=1e-9, atol=1e-9)
    sa, sb = composition_scores(a), composition_scores(b)
    for name in ("q", "k", "v", "k_group", "v_group"):
        torch.testing.assert_close(getattr(sb, name), getattr(sa, name), rtol=1e-5, atol=1e-7, equal_nan=True)
    ca, cb = copying_scores(a), copying_scores(b)
    torch.testing.assert_close(cb.copying, ca.copying, rtol=1e-5, atol=1e-7, equal_nan=True)
    torch.testing.assert_close(cb.positive, ca.positive, equal_nan=True)


@pytest.mark.parametrize("family", ["llama", "gemma2", "olmo2", "gpt2"])
def test_qk_and_composition_layer_by_layer_equal_the_whole_route(family, tmp_path):
    """Llama (GQA), Gemma 2 (norms on the writes, soft-caps), OLMo 2 (a QK-norm over the projection), GPT-2 (a
    fused projection, a tied unembedding)."""
    folder = _save(family, tmp_path / family)
    whole, layered = open_model(folder, by_layer=False), open_model(folder, by_layer=True)
    assert layered.stream is not None and all_meta(layered)
    ids = _ids()
    for layer, head, query in ((1, 1, 8), (0, 2, 5)):
        _same_qk(qk_attribution(whole, ids, layer, head, query), qk_attribution(layered, ids, layer, head, query))
    assert all_meta(layered)
    _same_weights(head_weights(whole), head_weights(layered))
    assert all_meta(layered)
    with pytest.raises(ValueError, match="opened layer by layer"):  # outside the tools' block: refused as before
        layered.anatomy  # noqa: B018


def test_headwise_llama_qk_layer_by_layer(tmp_path):
    folder = _save("llama", tmp_path / "llama")
    whole = open_model(folder, backend="headwise", by_layer=False)
    layered = open_model(folder, backend="headwise", by_layer=True)
    _same_qk(qk_attribution(whole, _ids(1), 1, 3, 7), qk_attribution(layered, _ids(1), 1, 3, 7))
    assert all_meta(layered)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_matrices_read_by_rows(family, tmp_path, monkeypatch):
    """An embedding and unembedding over SLICE_BYTES: read for a batch's tokens and by slices in the pass, and
    ``W_U W_E`` summed over slices of rows (several here) — the same numbers."""
    from headwise.models import streamed

    monkeypatch.setattr(streamed, "SLICE_BYTES", 2048)
    folder = _save(family, tmp_path / family)
    whole, layered = open_model(folder, by_layer=False), open_model(folder, by_layer=True)
    assert layered.stream.sliced
    embed = layered.model.get_input_embeddings()
    slices = list(layered.stream.row_slices([embed]))
    assert len(slices) > 2 and sum(rows.shape[0] for _, [rows] in slices) == embed.weight.shape[0]
    torch.testing.assert_close(torch.cat([rows for _, [rows] in slices]), whole.model.get_input_embeddings().weight)
    _same_qk(qk_attribution(whole, _ids(2), 1, 0, 8), qk_attribution(layered, _ids(2), 1, 0, 8))
    _same_weights(head_weights(whole), head_weights(layered))
    assert all_meta(layered)


def test_gguf_without_a_cache(tmp_path):
    pytest.importorskip("gguf")
    from _gguf import gguf_routes

    whole, layered = gguf_routes(tmp_path)
    ids = _ids(3, 11)
    _same_qk(qk_attribution(whole, ids, 1, 3, 10), qk_attribution(layered, ids, 1, 3, 10))
    _same_weights(head_weights(whole), head_weights(layered))
    assert all_meta(layered)


def test_pinned_parameters_stay_through_a_pass(tmp_path):
    folder = _save("llama", tmp_path / "llama")
    whole, hm = open_model(folder, by_layer=False), open_model(folder, by_layer=True)
    stream, ids = hm.stream, _ids(4)[None]
    reference = dict(whole.model.named_parameters())
    chosen = stream.select(lambda full, p: p.dim() <= 1 or ".self_attn." in full)
    names = {f"{unit}.{rel}" for unit, rels in chosen.items() for rel in rels}
    assert any("self_attn.q_proj" in n for n in names) and not any("mlp" in n and "weight" in n for n in names)
    loads = stream.loads
    with stream.pinned(chosen):
        for _ in range(2):
            logits = hm.logits(ids)
            for name, p in hm.model.named_parameters():
                if name in names:  # in, and the float32 route's values
                    torch.testing.assert_close(p, reference[name], rtol=0, atol=0)
                else:
                    assert p.device.type == "meta", name
        with stream.pinned(stream.select(lambda full, p: "mlp.up_proj" in full)):  # blocks nest
            assert all(p.device.type != "meta" for n, p in hm.model.named_parameters() if "up_proj" in n)
        assert all(p.device.type == "meta" for n, p in hm.model.named_parameters() if "up_proj" in n)
        assert all(p.device.type != "meta" for n, p in hm.model.named_parameters() if n in names)
    torch.testing.assert_close(logits, whole.logits(ids), rtol=1e-5, atol=1e-5)
    assert stream.loads > loads  # the layers' MLPs still streamed through each pass
    assert all_meta(hm)  # every parameter back on the meta device


def test_the_kept_anatomy_holds_no_weight(tmp_path):
    hm = open_model(_save("llama", tmp_path / "llama"), by_layer=True)
    with attention_pinned(hm, "a test"):
        parts = hm.anatomy
        refs = [weakref.ref(parts[0].q.module.weight), weakref.ref(parts[1].attn_norm.weight)]
        assert all(r() is not None and r().device.type == "cpu" for r in refs)
        with attention_pinned(hm, "a nested call"):  # nested: the outer block's pins stay
            assert hm.anatomy is parts
        assert parts[0].q.module.weight.device.type == "cpu"
    gc.collect()
    assert all(r() is None for r in refs)  # nothing kept the pinned tensors alive
    assert all_meta(hm) and hm.__dict__["_anatomy"] is parts  # kept: modules, not weights


def test_a_budget_too_small_for_the_attention_parts_is_refused(tmp_path, monkeypatch):
    import headwise.models.memory as memory

    monkeypatch.setattr(memory, "current_rss", lambda: 300 * 10**6)  # a fixed process: the sums are exact
    hm = open_model(_save("llama", tmp_path / "llama"), by_layer=True)
    need = attention_need(hm)
    layers = hm.model.model.layers
    pinned = {id(p): p for layer in layers for p in layer.self_attn.parameters()}
    pinned.update({id(p): p for p in hm.model.parameters() if p.dim() == 1})  # norms (and biases)
    bf16 = 4 + 2  # float32 bytes and the stored bf16 bytes of a parameter's entry
    largest = max([bf16 * sum(p.numel() for p in layer.mlp.parameters()) for layer in layers]
                  + [bf16 * hm.model.get_input_embeddings().weight.numel()])  # fmt: skip
    assert need == 300 * 10**6 + 4 * sum(p.numel() for p in pinned.values()) + largest + memory.MIN_WORKING
    assert attention_bytes(hm) == 4 * sum(p.numel() for p in pinned.values())
    hm.memory = dataclasses.replace(hm.memory, budget=need - 1)
    said = (
        rf"model: {hm.name} was opened layer by layer \(budget {format_size(need - 1)}\); --composition reads every "
        rf"layer's attention weights at once, which needs about"
    )
    with pytest.raises(MemoryBudgetError, match=said) as e:
        head_weights(hm)
    assert (e.value.budget, e.value.route) == (need - 1, "layers") and e.value.need >= need
    assert e.value.worded("--max-memory").endswith("(a --max-memory at least that)")
    # qk reads one layer's weights at a time: weighed on what it keeps of its run
    need = walk_need(hm, activations=qk_activations(hm, _ids().shape[-1]))
    hm.memory = dataclasses.replace(hm.memory, budget=need - 1)
    said = (
        rf"model: {hm.name} was opened layer by layer \(budget {format_size(need - 1)}\); qk reads one layer's "
        rf"weights at a time and what it keeps of every layer's activations, which needs about {format_size(need)} "
        rf"\(a max_memory at least that\)"
    )
    with pytest.raises(MemoryBudgetError, match=said) as e:
        qk_attribution(hm, _ids(), 1, 0, 8)
    assert (e.value.budget, e.value.need, e.value.route) == (need - 1, need, "layers")
    assert all_meta(hm) and "_anatomy" not in hm.__dict__  # refused before anything was read
    hm.memory = dataclasses.replace(hm.memory, budget=need)
    qk_attribution(hm, _ids(), 1, 0, 8)  # the budget that names suffices
