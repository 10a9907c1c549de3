"""The layer-by-layer route: a bf16 checkpoint opened with its parameters on the meta device, each layer read in
float32 when it runs, gives the statistics of the whole float32 route on the same weights; the budget's errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from _anatomy_models import tiny
from headwise.analysis import DecoderStats
from headwise.analysis.streaming import read_rows
from headwise.models import open_model
from headwise.models.memory import MIN_WORKING, MemoryBudgetError, format_size, parse_size, plan_memory

FAMILIES = ["llama", "qwen2", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "phi3", "olmo2"]


def _save(family: str, folder, dtype=torch.bfloat16):
    model = tiny(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.to(dtype).save_pretrained(folder)
    return folder


def _statistics(hm, ids, mask):
    stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
    for k in range(0, ids.shape[0], 2):  # two batches: the layers are brought in once per batch
        read_rows(hm, ids[k : k + 2], mask[k : k + 2], head_stats=stats.heads, detector_stats=stats.detectors)
    probe = DecoderStats(hm.num_layers, hm.num_heads)
    read_rows(hm, ids[:, :6].repeat(1, 2), None, detector_stats=probe.detectors)
    return stats.result(probe.detectors.result())


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 128, (4, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # padding
    return ids, mask


def _same(a, b, rtol=1e-5, atol=1e-6):
    for name in a.metrics:
        x, y = np.asarray(a.metrics[name], np.float64), np.asarray(b.metrics[name], np.float64)
        np.testing.assert_array_equal(np.isnan(x), np.isnan(y), err_msg=name)
        np.testing.assert_allclose(x[~np.isnan(x)], y[~np.isnan(y)], rtol=rtol, atol=atol, err_msg=name)
    np.testing.assert_allclose(a.js_divergence, b.js_divergence, rtol=rtol, atol=atol)
    assert (a.roles == b.roles).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_by_layer_equals_the_float32_route(family, tmp_path):
    folder = _save(family, tmp_path / family)
    ids, mask = _batch()
    whole = open_model(folder, by_layer=False)
    layered = open_model(folder, by_layer=True)
    assert whole.memory.route == "whole" and whole.stream is None
    assert layered.memory.route == "layers" and layered.stream is not None
    assert all(p.device.type == "meta" for p in layered.model.parameters())  # nothing held before a pass
    _same(_statistics(whole, ids, mask), _statistics(layered, ids, mask))
    assert all(p.device.type == "meta" for p in layered.model.parameters())  # every layer released after it ran
    head = layered.model.get_output_embeddings()
    units = [u for u, m in layered.stream.units.items() if m is not head]  # a pass of rows runs no unembedding
    assert layered.stream.loads == 3 * len(units)  # each unit once per pass: two batches and the probe
    # the hidden states too, whole tensors
    ref = whole.run_with_cache(ids, mask, names=["resid_final"])["resid_final"]
    got = layered.run_with_cache(ids, mask, names=["resid_final"])["resid_final"]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_large_embeddings_are_read_by_rows(family, tmp_path, monkeypatch):
    """An embedding over SLICE_BYTES is read for the batch's tokens alone, an unembedding a slice of rows at a time
    (Gemma's scaled embedding keeps its scale; GPT-2's position embedding too): the same numbers."""
    from headwise.models import streamed

    monkeypatch.setattr(streamed, "SLICE_BYTES", 2048)
    folder = _save(family, tmp_path / family)
    ids, mask = _batch(2)
    whole = open_model(folder, by_layer=False)
    layered = open_model(folder, by_layer=True)
    assert any("embed" in u or u.endswith("wte") for u in layered.stream.sliced), layered.stream.sliced
    _same(_statistics(whole, ids, mask), _statistics(layered, ids, mask))
    torch.testing.assert_close(layered.logits(ids), whole.logits(ids), rtol=1e-5, atol=1e-5)
    assert all(p.device.type == "meta" for p in layered.model.parameters())
    sizes = layered.stream.sizes()  # the plan counts one slice of a sliced matrix
    assert all(sizes[u][0] <= 2048 < layered.stream.float32_bytes[u] for u in layered.stream.sliced)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_headwise_llama_layer_by_layer(dtype, tmp_path):
    folder = _save("llama", tmp_path / "llama", dtype)
    ids, mask = _batch(1)
    whole = open_model(folder, backend="headwise", by_layer=False)
    layered = open_model(folder, backend="headwise", by_layer=True)
    assert layered.backend == whole.backend == "headwise"
    _same(_statistics(whole, ids, mask), _statistics(layered, ids, mask))
    torch.testing.assert_close(layered.logits(ids), whole.logits(ids), rtol=1e-5, atol=1e-5)  # lm_head, tied or not
    hf = open_model(folder, by_layer=True)  # the Hugging Face route on the same file, layer by layer
    _same(_statistics(whole, ids, mask), _statistics(hf, ids, mask), rtol=1e-4, atol=1e-5)


def test_a_tool_that_reads_every_weight_refuses_by_name(tmp_path):
    hm = open_model(_save("llama", tmp_path / "m"), by_layer=True)
    with pytest.raises(ValueError, match=r"opened layer by layer .* reads every layer's weights at once, which needs"):
        hm.anatomy  # noqa: B018


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1.5GB", 1_500_000_000), ("400MB", 400_000_000), ("2GiB", 2 * 2**30), ("512mib", 512 * 2**20),
     ("1500000000", 1_500_000_000), (" 3 G ", 3_000_000_000), (2048, 2048)],
)  # fmt: skip
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["0", "12XB", "", "-1GB", "GB", "1.5.5GB", 0, True, "0.1"])
def test_parse_size_refuses(bad):
    with pytest.raises(MemoryBudgetError, match=r"^max_memory: expected a size such as 1\.5GB, 400MB or 2GiB"):
        parse_size(bad)


def test_budgets_name_the_smallest_that_works(tmp_path):
    folder = _save("llama", tmp_path / "m")
    for bad in ("0", "12XB", "1MB"):
        smallest_named = r"the smallest budget that works for m(:| is) [0-9.]+ [kMG]?B"
        with pytest.raises(MemoryBudgetError, match=smallest_named) as e:
            open_model(folder, max_memory=bad)
        assert str(e.value).startswith("max_memory: ") and "\n" not in str(e.value)
        assert e.value.worded("--max-memory") == "--max-memory" + str(e.value).removeprefix("max_memory")
        assert e.value.need == e.value.smallest and e.value.budget == (1_000_000 if bad == "1MB" else None)
        assert e.value.route == ("layers" if bad == "1MB" else None)
        smallest = e.value.smallest
    hm = open_model(folder, max_memory=smallest + 2**24)  # the smallest named opens it (the process's memory drifts)
    assert hm.memory.budget == smallest + 2**24


def test_plan_memory_routes():
    plan = plan_memory("100GB", whole=10**9, units={"layers.0": (10**8, 5 * 10**7)})
    assert plan.route == "whole" and plan.budget == 10**11
    held = plan.held
    budget = held + plan.layers + 1
    plan = plan_memory(budget, whole=10**11, units={"layers.0": (10**8, 5 * 10**7)})
    assert plan.route == "layers" and plan.smallest == held + 10**8 + 5 * 10**7 + MIN_WORKING or plan.held != held
    assert "layer by layer within" in plan.line()
    with pytest.raises(MemoryBudgetError, match="the whole model in float32"):
        plan_memory(budget, whole=10**11, units=None)
    assert format_size(1_500_000_000) == "1.50 GB"
