"""The modern kinds in ``MultiHeadAttention``: sliding windows, soft-capping, sinks, QK-norm, YaRN.

Against the NumPy reference (float64, ≤ 1e-12, generated cases), decoding token by token against the full
causal forward (float32, ≤ 1e-6; a ring cache decoding past its window, StreamingLLM), fully masked rows,
and bad input.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise.reference as ref
from _helpers import np64, ref_params
from headwise.core import masks
from headwise.core.attention import MultiHeadAttention
from headwise.core.cache import KVCache, SlidingWindowCache
from headwise.positional.rope import RotaryEmbedding

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}


def build(c, dtype=torch.float64, backend="auto"):
    torch.manual_seed(c["seed"])
    rope = RotaryEmbedding(c["dh"], scaling=YARN if c.get("yarn") else None) if c.get("rope", True) else None
    m = MultiHeadAttention(
        c["d"], c["h"], num_kv_heads=c["hkv"], head_dim=c["dh"], positional=rope, backend=backend,
        sliding_window=c["window"], softcap=c["softcap"], sinks=c["sinks"], qk_norm=c["qk_norm"],
    )  # fmt: skip
    with torch.no_grad():
        if m.sinks is not None:
            m.sinks.normal_()
        if m.qk_norm is not None:
            m.q_norm.weight.uniform_(0.5, 1.5)
            m.k_norm.weight.uniform_(0.5, 1.5)
    return m.to(dtype).eval()


def params_of(m):
    p = ref_params(m)
    if m.sinks is not None:
        p["sinks"] = np64(m.sinks)
    if m.qk_norm is not None:
        p["q_norm"], p["k_norm"] = np64(m.q_norm.weight), np64(m.k_norm.weight)
    return p


@st.composite
def configs(draw):
    hkv = draw(st.sampled_from([1, 2]))
    h = hkv * draw(st.sampled_from([1, 2, 3]))
    dh = draw(st.sampled_from([2, 4]))
    return dict(
        h=h, hkv=hkv, dh=dh, d=draw(st.sampled_from([h * dh, 8])), B=draw(st.integers(1, 2)),
        L=draw(st.integers(1, 8)), window=draw(st.sampled_from([None, 1, 2, 3])),
        softcap=draw(st.sampled_from([None, 0.5, 3.0])), sinks=draw(st.booleans()),
        qk_norm=draw(st.sampled_from([None, "head", "full"])), yarn=draw(st.booleans()),
        pad=draw(st.booleans()), backend=draw(st.sampled_from(["auto", "math"])), seed=draw(st.integers(0, 2**16)),
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(configs())
def test_equals_the_reference(c):
    m = build(c, backend=c["backend"])
    g = torch.Generator().manual_seed(c["seed"])
    x = 2 * torch.randn(c["B"], c["L"], c["d"], generator=g, dtype=torch.float64)
    pad = None
    if c["pad"]:
        pad = torch.rand(c["B"], c["L"], generator=g) < 0.3
    out, w = m(x, is_causal=True, key_padding_mask=pad, need_weights=True, average_weights=False)
    mask = None if pad is None else np64(pad)[:, None, None, :].astype(bool)
    want, want_w = ref.multi_head_attention(
        np64(x), params_of(m), c["h"], num_kv_heads=c["hkv"], causal=True, mask=mask,
        rope={"scaling": YARN if c["yarn"] else None}, sliding_window=c["window"], softcap=c["softcap"],
        qk_norm=c["qk_norm"], norm_eps=1e-6,
    )  # fmt: skip
    np.testing.assert_allclose(np64(out), want, atol=1e-12, rtol=0)
    np.testing.assert_allclose(np64(w), want_w, atol=1e-12, rtol=0)
    fast = m(x, is_causal=True, key_padding_mask=pad)[0]  # no weights: the kernel where it can
    np.testing.assert_allclose(np64(fast), want, atol=1e-12, rtol=0)


KINDS = {
    "window": dict(window=3, softcap=None, sinks=False, qk_norm=None),
    "gpt-oss": dict(window=3, softcap=None, sinks=True, qk_norm=None, yarn=True),
    "gemma2": dict(window=4, softcap=2.0, sinks=False, qk_norm=None),
    "qwen3": dict(window=None, softcap=None, sinks=False, qk_norm="head"),
    "olmo2": dict(window=None, softcap=None, sinks=False, qk_norm="full"),
    "yarn": dict(window=None, softcap=None, sinks=False, qk_norm=None, yarn=True),
}


@pytest.mark.parametrize("prefill", [0, 2, 5])
@pytest.mark.parametrize("kind", list(KINDS))
def test_decode_equals_full_causal_forward(kind, prefill):
    c = dict(h=4, hkv=2, dh=8, d=32, seed=7, **KINDS[kind])
    m = build(c, torch.float32)
    x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(3))
    full = m(x, is_causal=True)[0]
    cache = KVCache.for_module(m, 2, capacity=6)  # a windowed module's ring ignores the capacity: 11 > 6
    assert isinstance(cache, SlidingWindowCache) == (c["window"] is not None)
    if c["window"] is None:
        cache = KVCache.for_module(m, 2, capacity=11)
    steps = [m(x[:, :prefill], is_causal=True, cache=cache)[0]] if prefill else []
    for t in range(prefill, 11):
        steps.append(m(x[:, t : t + 1], is_causal=True, cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-6, rtol=0)
    held = c["window"] or 11
    assert cache.nbytes == 2 * 2 * held * 8 * 2 * 4  # B · Hkv · held · Dh · (K and V) · 4 bytes


def test_ring_in_chunks_and_weights():
    c = dict(h=2, hkv=1, dh=4, d=8, seed=1, window=3, softcap=None, sinks=True, qk_norm=None)
    m = build(c, torch.float64)
    x = torch.randn(1, 10, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    full_out, full_w = m(x, is_causal=True, need_weights=True)
    cache = KVCache.for_module(m, 1, capacity=10)
    outs = []
    for a, b in ((0, 4), (4, 5), (5, 9), (9, 10)):  # chunks longer than the window too
        out, w = m(x[:, a:b], is_causal=True, cache=cache, need_weights=True)
        outs.append(out)
        slots = cache.key_slots(0)  # what the ring holds now
        assert slots.tolist() == list(range(max(0, b - 3), b))
        held_before = w.shape[-1] - (b - a)
        torch.testing.assert_close(w[..., held_before:], full_w[:, a:b, a:b], atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.cat(outs, 1), full_out, atol=1e-12, rtol=0)
    assert cache.held == 3 and cache.length == 10


def test_streaming_llm_keeps_the_first_tokens():
    # A full-attention module decoded through a ring of 4 + 2 sink tokens equals its full forward under
    # the StreamingLLM mask: causal, the window, and the first two tokens always visible.
    c = dict(h=2, hkv=2, dh=4, d=8, seed=2, window=None, softcap=None, sinks=False, qk_norm=None)
    m = build(c, torch.float32)
    x = torch.randn(1, 12, 8, generator=torch.Generator().manual_seed(1))
    slots = torch.arange(12)
    want = m(x, attn_mask=masks.causal(slots, slots, 4, sink_tokens=2))[0]
    cache = SlidingWindowCache(1, 4, 2, 4, sink_tokens=2)
    got = torch.cat([m(x[:, t : t + 1], is_causal=True, cache=cache)[0] for t in range(12)], dim=1)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert sorted(cache.key_slots(0).tolist()) == [0, 1, 8, 9, 10, 11]
    assert cache.nbytes == 6 * 2 * 4 * 2 * 4


def test_fully_masked_rows_are_zero_forward_and_backward():
    c = dict(h=2, hkv=1, dh=4, d=8, seed=3, window=2, softcap=1.0, sinks=True, qk_norm="head")
    for backend in ("auto", "math"):
        m = build(c, torch.float64, backend=backend)
        x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
        pad = torch.zeros(2, 5, dtype=torch.bool)
        pad[0, :3] = True  # item 0, queries 0..2: their window holds only padding
        out, w = m(x, is_causal=True, key_padding_mask=pad, need_weights=True, average_weights=False)
        assert torch.isfinite(out).all() and (w[0, :, :2] == 0).all()
        bias = m.Wo.bias
        torch.testing.assert_close(out[0, :2], bias.expand(2, -1).detach(), atol=1e-12, rtol=0)
        out.sum().backward()
        assert torch.isfinite(x.grad).all() and torch.isfinite(m.sinks.grad).all()


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"sliding_window: expected a positive integer, got 0"):
        MultiHeadAttention(8, 2, sliding_window=0)
    with pytest.raises(ValueError, match=r"softcap: expected a positive number, got -1"):
        MultiHeadAttention(8, 2, softcap=-1)
    with pytest.raises(ValueError, match=r"qk_norm: expected one of \(None, 'head', 'full'\), got 'rms'"):
        MultiHeadAttention(8, 2, qk_norm="rms")
    with pytest.raises(TypeError, match=r"sinks: expected True .* or False, got 2"):
        MultiHeadAttention(8, 2, sinks=2)
    with pytest.raises(ValueError, match=r"scaling: rope_type 'yarn' needs original_max_position_embeddings"):
        RotaryEmbedding(8, scaling={"rope_type": "yarn", "factor": 2.0})
    m = MultiHeadAttention(8, 2, sliding_window=2)
    with pytest.raises(ValueError, match=r"is_causal: a module with sliding_window=2 attends causally"):
        m(torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match=r"window: expected a positive integer, got 0"):
        SlidingWindowCache(1, 0, 2, 4)
    with pytest.raises(ValueError, match=r"cache: a SlidingWindowCache\(window=1\) serves causal calls"):
        m(torch.zeros(1, 3, 8), is_causal=True, cache=SlidingWindowCache(1, 1, 2, 4))
    from headwise import functional

    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"sinks: expected a float tensor of shape \(H,\)=\(2,\)"):
        functional.scaled_dot_product_attention(q, q, q, sinks=torch.zeros(3))
