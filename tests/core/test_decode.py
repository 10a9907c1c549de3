"""Cached decoding equals the full causal forward (float32, ≤ 1e-6) for MHA, GQA, MQA × positions."""

import pytest
import torch

import headwise

POSITIONS = {
    "none": lambda h, dh: None,
    "rope": lambda h, dh: headwise.RotaryEmbedding(dh),
    "rope-interleaved": lambda h, dh: headwise.RotaryEmbedding(dh, convention="interleaved"),
    "alibi": lambda h, dh: headwise.ALiBi(h),
}


@pytest.mark.parametrize(
    "hkv",
    [8, pytest.param(2, marks=pytest.mark.slow), pytest.param(1, marks=pytest.mark.slow)],
    ids=["mha", "gqa", "mqa"],
)
@pytest.mark.parametrize("pos", list(POSITIONS))
@pytest.mark.parametrize("prefill", [0, pytest.param(5, marks=pytest.mark.slow)])
def test_decode_equals_full_causal_forward(hkv, pos, prefill):
    torch.manual_seed(0)
    d, h, L = 64, 8, 12
    m = headwise.MultiHeadAttention(d, h, num_kv_heads=hkv, positional=POSITIONS[pos](h, d // h)).eval()
    x = torch.randn(3, L, d)
    with torch.no_grad():
        full, _ = m(x, is_causal=True)
        cache = headwise.KVCache.for_module(m, batch_size=3, capacity=16)
        outs = [m(x[:, :prefill], is_causal=True, cache=cache)[0]] if prefill else []
        outs += [m(x[:, t : t + 1], is_causal=True, cache=cache)[0] for t in range(prefill, L)]
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=0, atol=1e-6)
    assert cache.length == L


def test_decode_with_explicit_position_ids_and_weights():
    torch.manual_seed(1)
    m = headwise.MultiHeadAttention(32, 4, num_kv_heads=2, positional=headwise.ALiBi(4)).eval()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        full, w_full = m(x, is_causal=True, need_weights=True, average_weights=False)
        cache = headwise.KVCache.for_module(m, 2, 6)
        m(x[:, :4], is_causal=True, cache=cache)
        pos = torch.tensor([[4], [4]])
        out, w = m(x[:, 4:5], is_causal=True, cache=cache, position_ids=pos, need_weights=True, average_weights=False)
    torch.testing.assert_close(out, full[:, 4:5], rtol=0, atol=1e-6)
    torch.testing.assert_close(w, w_full[:, :, 4:5, :5], rtol=0, atol=1e-6)


def test_cache_overflow_is_an_error():
    m = headwise.MultiHeadAttention(16, 2)
    cache = headwise.KVCache.for_module(m, 1, 4)
    x = torch.randn(1, 3, 16)
    m(x, is_causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"cache: appending 3 tokens to 3 cached ones exceeds its capacity of 4"):
        m(x, is_causal=True, cache=cache)
    assert cache.length == 3  # nothing was half-appended


def test_cache_shape_mismatch_is_an_error():
    m = headwise.MultiHeadAttention(16, 2)
    cache = headwise.KVCache(2, 8, 2, 8)
    with pytest.raises(ValueError, match="cache: expected keys and values of shape"):
        m(torch.randn(1, 3, 16), cache=cache)


def test_a_rejected_call_leaves_the_cache_as_it_was():
    m = headwise.MultiHeadAttention(16, 2, positional=headwise.ALiBi(2))
    cache = headwise.KVCache.for_module(m, 1, 8)
    x = torch.randn(1, 3, 16)
    with torch.no_grad():
        m(x, is_causal=True, cache=cache)
        with pytest.raises(ValueError, match=r"key_padding_mask: expected shape \(B, S\)=\(1, 4\)"):
            m(x[:, :1], is_causal=True, cache=cache, key_padding_mask=torch.zeros(1, 3, dtype=torch.bool))
        assert cache.length == 3
        # and decoding goes on exactly as if the bad call never happened
        full, _ = m(torch.cat([x, x[:, :1]], 1), is_causal=True)
        step, _ = m(x[:, :1], is_causal=True, cache=cache)
    torch.testing.assert_close(step, full[:, 3:], rtol=0, atol=1e-6)
