"""Streaming head statistics (rows a block at a time at ``hook_qk``) equal the full-map computation.

Whole arrays compared: every metric of every head, the histogram-based positional columns, the detectors and the
Jensen–Shannon sums, over random layouts, masks, windows, sinks, soft-capping, padding and GQA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import headwise
from headwise.analysis import DetectorStats, HeadStats, TokenInfo
from headwise.analysis.divergence import sentence_js_sums
from headwise.analysis.streaming import RowReader, js_sums_torch, read_rows
from headwise.core.hooks import hooked
from headwise.core.rows import AttentionRows


class _Layers:
    """A stack of MultiHeadAttention modules shaped as the HeadModel parts the streaming pass uses."""

    def __init__(self, modules, *, causal: bool, attn_mask=None, padding=None):
        self.modules, self.causal, self.attn_mask, self.padding = modules, causal, attn_mask, padding
        self.num_layers, self.num_heads = len(modules), modules[0].num_heads
        self.x = None

    def run(self, *, need_weights: bool):
        maps = []
        for m in self.modules:
            _, w = m(
                self.x, is_causal=self.causal, attn_mask=self.attn_mask, key_padding_mask=self.padding,
                need_weights=need_weights, average_weights=False,
            )  # fmt: skip
            maps.append(w)
        return maps

    def read_rows(self, ids, mask, readers):
        with torch.no_grad(), hooked(zip([m.hook_qk for m in self.modules], readers)):
            self.run(need_weights=False)


def _compare(layers: _Layers, ids, info: TokenInfo, *, block_size: int):
    with torch.no_grad():
        maps = [w.double().numpy() for w in layers.run(need_weights=True)]
    NL, H, L = layers.num_layers, layers.num_heads, ids.shape[1]
    full, stream = HeadStats(NL, H, max_length=L), HeadStats(NL, H, max_length=L)
    det_full, det_stream = DetectorStats(NL, H), DetectorStats(NL, H)
    full.update(maps, info)
    det_full.update(maps, ids, info)
    read_rows(
        layers, torch.as_tensor(ids), None, info, head_stats=stream, detector_stats=det_stream, block_size=block_size
    )
    a, b = full.result(), stream.result()
    for name in a.metrics:
        np.testing.assert_allclose(b.metrics[name], a.metrics[name], atol=1e-5, rtol=0, err_msg=name, equal_nan=True)
    np.testing.assert_array_equal(b.positional, a.positional)
    np.testing.assert_allclose(b.js_divergence, a.js_divergence, atol=1e-5, rtol=0)
    np.testing.assert_allclose(b.mds @ b.mds.T, a.mds @ a.mds.T, atol=1e-4)  # MDS up to a reflection
    da, db = det_full.result(), det_stream.result()
    for name in da:
        np.testing.assert_allclose(db[name], da[name], atol=1e-5, rtol=0, err_msg=name, equal_nan=True)
    np.testing.assert_array_equal(stream._hist, full._hist)
    assert (stream.num_sentences, stream.num_tokens) == (full.num_sentences, full.num_tokens)


@st.composite
def layouts(draw):
    hkv = draw(st.sampled_from([1, 2, 3]))
    return {
        "B": draw(st.integers(1, 3)),
        "L": draw(st.integers(2, 24)),
        "hkv": hkv,
        "h": hkv * draw(st.sampled_from([1, 2])),
        "layers": draw(st.integers(1, 2)),
        "causal": draw(st.booleans()),
        "window": draw(st.sampled_from([None, 1, 3, 8])),
        "softcap": draw(st.sampled_from([None, 2.0])),
        "sinks": draw(st.booleans()),
        "rope": draw(st.booleans()),
        "padding": draw(st.sampled_from(["none", "right", "random"])),
        "mask": draw(st.booleans()),
        "block": draw(st.integers(1, 9)),
        "vocab": draw(st.sampled_from([3, 50])),
        "specials": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def _build(c):
    g = torch.Generator().manual_seed(c["seed"])
    rng = np.random.default_rng(c["seed"])
    B, L, h, hkv = c["B"], c["L"], c["h"], c["hkv"]
    dh = 4
    causal = c["causal"] or c["window"] is not None
    modules = []
    for _ in range(c["layers"]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=g)))
        m = headwise.MultiHeadAttention(
            h * dh, h, num_kv_heads=hkv, sliding_window=c["window"], softcap=c["softcap"], sinks=c["sinks"],
            positional=headwise.RotaryEmbedding(dh) if c["rope"] else None, dtype=torch.float64,
        ).eval()  # fmt: skip
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0, 0.7, generator=g)
        modules.append(m)
    lengths = np.full(B, L)
    valid = np.ones((B, L), dtype=bool)
    if c["padding"] == "right":
        lengths = rng.integers(1, L + 1, B)
        valid = np.arange(L)[None] < lengths[:, None]
    elif c["padding"] == "random":
        valid = rng.random((B, L)) < 0.7
        valid[:, 0] = True
    attn_mask = None
    if c["mask"]:
        attn_mask = torch.as_tensor(rng.random((L, L)) < 0.2)
    layers = _Layers(modules, causal=causal, attn_mask=attn_mask, padding=torch.as_tensor(~valid))
    layers.x = torch.randn(B, L, h * dh, generator=g, dtype=torch.float64)
    ids = rng.integers(0, c["vocab"], (B, L))
    marks = [(rng.random((B, L)) < 0.15) & valid if c["specials"] else np.zeros((B, L), bool) for _ in range(3)]
    info = TokenInfo(valid=valid, cls=marks[0], sep=marks[1], punct=marks[2])
    return layers, ids, info


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_streaming_statistics_equal_the_full_maps(c):
    layers, ids, info = _build(c)
    _compare(layers, ids, info, block_size=c["block"])


def test_rows_are_the_weights_the_model_uses():
    """AttentionRows.weights of any block equal the module's own weights (window, sinks, cap, GQA, cache)."""
    torch.manual_seed(0)
    m = headwise.MultiHeadAttention(24, 6, num_kv_heads=2, sliding_window=5, softcap=3.0, sinks=True).eval()
    with torch.no_grad():
        m.sinks.normal_()
    x = torch.randn(2, 13, 24)
    seen = []
    with torch.no_grad(), hooked([(m.hook_qk, seen.append)]):
        _, w = m(x, is_causal=True, need_weights=True, average_weights=False)
    [rows] = seen
    assert isinstance(rows, AttentionRows)
    for start, stop in ((0, 13), (0, 4), (4, 11), (12, 13)):
        got = rows.weights(start, stop, keys=13)
        torch.testing.assert_close(got, w[:, :, start:stop], atol=1e-6, rtol=0)
    heads = torch.tensor([1, 4])
    torch.testing.assert_close(rows.weights(3, 9, heads, keys=13), w[:, heads, 3:9], atol=1e-6, rtol=0)
    # after a cache: the new queries sit at the cache's slots
    cache = headwise.KVCache.for_module(m, 2, 20)
    with torch.no_grad():
        m(x[:, :7], is_causal=True, cache=cache)
        seen.clear()
        with hooked([(m.hook_qk, seen.append)]):
            _, w2 = m(x[:, 7:], is_causal=True, cache=cache, need_weights=True, average_weights=False)
    torch.testing.assert_close(seen[0].weights(0, 6), w2, atol=1e-6, rtol=0)  # a ring: keys at their slots


def test_hf_backend_rows_equal_captured_weights():
    """On a Hugging Face model (GQA, padding) the rows at hook_qk equal what hf.capture reads."""
    from tests._hf_models import batch, build

    import headwise.hf
    from headwise.hf.backend import hook_points

    model = build("llama", attn=headwise.hf.NAME)
    inputs = batch()
    seen = []
    modules = headwise.hf.attention_layers(model)
    with torch.no_grad(), hooked([(hook_points(modules[0]).hook_qk, seen.append)]), headwise.hf.capture(model) as attn:
        model(**inputs)
    L = inputs["input_ids"].shape[1]
    got = seen[0].weights(0, L, keys=L)
    torch.testing.assert_close(got, attn.weights[0], atol=1e-6, rtol=0)


def test_js_sums_in_torch_equal_the_numpy_sums():
    rng = np.random.default_rng(0)
    p = rng.random((7, 5, 11))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(js_sums_torch(torch.as_tensor(p, dtype=torch.float32)), sentence_js_sums(p), atol=1e-6)
    # one head's pairs larger than the chunk budget (N · n > budget): chunks of one head, the buffers grown to fit
    small = js_sums_torch(torch.as_tensor(p, dtype=torch.float32), budget=p.shape[0] * p.shape[-1] // 2)
    np.testing.assert_allclose(small, sentence_js_sums(p), atol=1e-6)
    # the chunk changes nothing: a pair's terms are summed alone (bit for bit, any budget)
    wide = torch.as_tensor(rng.random((40, 3, 300)), dtype=torch.float32)
    wide /= wide.sum(-1, keepdim=True)
    sums = [js_sums_torch(wide, budget=b) for b in (1 << 22, 1 << 18, 40 * 300 * 3, 1)]
    for other in sums[1:]:
        np.testing.assert_array_equal(other, sums[0])


def test_a_block_size_below_one_is_refused():
    info = TokenInfo.plain(1, 4)
    with pytest.raises(ValueError, match="block_size"):
        RowReader(1, 2, np.zeros((1, 4), dtype=np.int64), info, block_size=0)


def test_pooled_overview_and_kept_rows_equal_the_full_map():
    """The head view's overview (pooled bins) and full rows of a query range, from the same pass."""
    from headwise.viz.headview import thumbnails

    c = dict(B=2, L=21, hkv=1, h=2, layers=2, causal=True, window=6, softcap=None, sinks=False, rope=True)
    c.update(padding="right", mask=False, block=4, vocab=50, specials=False, seed=3)
    layers, ids, info = _build(c)
    with torch.no_grad():
        maps = np.stack([w.double().numpy() for w in layers.run(need_weights=True)])  # (NL, B, H, L, L)
    n = int(info.valid[0].sum())
    first = maps[:, 0][..., :n, :n]
    first = first / np.maximum(first.sum(-1, keepdims=True), 1e-300)
    reader = read_rows(layers, torch.as_tensor(ids), None, info, block_size=4, pool=5, keep=(3, 11))
    pooled, bounds = reader.pooled_maps()
    want, want_bounds = thumbnails(first, size=5)
    np.testing.assert_array_equal(bounds, want_bounds)
    np.testing.assert_allclose(pooled, want, atol=1e-6)
    np.testing.assert_allclose(reader.kept.numpy(), first[:, :, 3:11, 3:11], atol=1e-6)


@pytest.mark.parametrize("hkv, window, padding", [(1, 6, "right"), (2, None, "none"), (2, None, "right")])
def test_a_pass_of_the_kept_rows_alone_equals_the_full_map(hkv, window, padding):
    """``rows_only``: the bounded pass over the chosen queries forms the same rows as the full map, and no others."""
    c = dict(B=1, L=23, hkv=hkv, h=4, layers=2, causal=True, window=window, softcap=None, sinks=False, rope=True)
    c.update(padding=padding, mask=False, block=3, vocab=50, specials=False, seed=5)
    layers, ids, info = _build(c)
    with torch.no_grad():
        maps = np.stack([w.double().numpy() for w in layers.run(need_weights=True)])  # (NL, B, H, L, L)
    n = int(info.valid[0].sum())
    real = np.flatnonzero(info.valid[0])
    first = maps[:, 0][..., real[:, None], real[None, :]]  # (NL, H, n, n) over the real tokens
    first = first / np.maximum(first.sum(-1, keepdims=True), 1e-300)
    a, b = 2, min(n, 13)
    slots = (int(real[a]), int(real[b - 1]) + 1)  # real tokens a … b − 1 (right padding: the same slots)
    assert slots == (a, b)
    seen = []
    reader = read_rows(
        layers, torch.as_tensor(ids), None, info, block_size=3, keep=slots, rows_only=True,
        progress=lambda layer, done, L: seen.append(done),
    )  # fmt: skip
    np.testing.assert_allclose(reader.kept.numpy(), first[:, :, a:b, a:b], atol=1e-6)
    assert max(seen) == slots[1] and len(seen) == 2 * -(-(slots[1] - slots[0]) // 3)  # only the span's blocks
    with pytest.raises(ValueError, match="rows_only"):
        read_rows(layers, torch.as_tensor(ids), None, info, rows_only=True)  # nothing to keep
    with pytest.raises(ValueError, match="rows_only"):
        read_rows(layers, torch.as_tensor(ids), None, info, keep=slots, rows_only=True, pool=4)


def test_each_reader_alone_gives_what_it_gives_in_a_combined_pass():
    """The pass keeps only the sums of the accumulators it is handed: the detectors alone (the probe's pass) are
    the detectors of a pass with both; a reader asked for sums it was made without says so."""
    from headwise.analysis.streaming import BlockPass, DetectorSums, KeptRows, Layout

    c = dict(B=2, L=17, hkv=2, h=4, layers=2, causal=True, window=None, softcap=None, sinks=False, rope=True)
    c.update(padding="right", mask=False, block=5, vocab=5, specials=False, seed=7)
    layers, ids, info = _build(c)
    NL, H = layers.num_layers, layers.num_heads
    both, alone = DetectorStats(NL, H), DetectorStats(NL, H)
    read_rows(layers, torch.as_tensor(ids), None, info, head_stats=HeadStats(NL, H, max_length=17), detector_stats=both)
    reader = read_rows(layers, torch.as_tensor(ids), None, info, detector_stats=alone, block_size=3)
    assert reader.head_sums is None and reader.detector_sums is not None
    for name, v in both.result().items():
        np.testing.assert_allclose(alone.result()[name], v, atol=1e-12, rtol=0, err_msg=name, equal_nan=True)
    with pytest.raises(ValueError, match="head_stats"):
        reader.add_to(head_stats=HeadStats(NL, H, max_length=17))
    # the same readers on a BlockPass of one's own: detectors and kept rows, one pass
    layout = Layout(ids, info)
    detectors, kept = DetectorSums(layout, NL, H), KeptRows(NL, H, (2, 9))
    own = BlockPass(layout, NL, H, [detectors, kept], block_size=4)
    layers.read_rows(None, None, own.readers())
    mine = DetectorStats(NL, H)
    detectors.add_to(mine)
    for name, v in both.result().items():
        np.testing.assert_allclose(mine.result()[name], v, atol=1e-12, rtol=0, err_msg=name, equal_nan=True)
    np.testing.assert_allclose(kept.kept.numpy(), read_rows(layers, torch.as_tensor(ids), None, info, keep=(2, 9)).kept)
    with pytest.raises(RuntimeError, match="never read"):
        BlockPass(layout, NL, H, [DetectorSums(layout, NL, H)]).check_read()
