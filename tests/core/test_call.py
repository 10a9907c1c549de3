"""The one record of an attention call (``AttentionCall``), the dispatcher that reads it, the hooked step every
module calls (``attend_hooked``), and the caches modules make for themselves (``new_cache``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import headwise
from headwise import functional
from headwise.core import masks
from headwise.core.cache import CacheRead, KVCache, LatentCache, SlidingWindowCache
from headwise.core.call import AttentionCall
from headwise.core.dispatch import attend
from headwise.core.hooks import HookPoint, attend_hooked, hooked
from headwise.core.rows import AttentionRows

TOL = 1e-12
F64 = torch.float64


def _qkv(L=6, S=6, H=4, Hkv=2, Dh=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, h, n, Dh, generator=g, dtype=F64) for h, n in ((H, L), (Hkv, S), (Hkv, S)))


def test_the_record_is_frozen_and_replace_copies():
    call = AttentionCall(is_causal=True, window=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.window = 4
    other = call.replace(q_offset=2)
    assert (call.q_offset, other.q_offset, other.window, other.is_causal) == (0, 2, 3, True)


def test_causality_of_the_call_is_masks_causality():
    slots = torch.tensor([0, 5, 6, 7])
    call = AttentionCall(is_causal=True, q_offset=7, window=2, key_slots=slots, sink_tokens=1)
    flag, blocked = call.causality(1, 4)
    want = masks.causality(True, 1, 4, q_offset=7, window=2, key_slots=slots, sink_tokens=1)[1]
    assert not flag and torch.equal(blocked, want)
    assert torch.equal(blocked, torch.tensor([[False, True, False, False]]))  # sink, out of the window, in it
    assert AttentionCall(is_causal=True).causality(3, 3, as_flag=True) == (True, None)
    assert AttentionCall().blocked_with_causality(3, 3) is None


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (AttentionCall(backend="fast"), ValueError, "backend"),
        (AttentionCall(window=2), ValueError, "window: a sliding window needs is_causal=True"),
        (AttentionCall(softcap=-1.0), ValueError, "softcap"),
        (AttentionCall(sinks=torch.zeros(3, dtype=F64)), ValueError, r"sinks: expected a float tensor of shape \(H,\)"),
        (AttentionCall(blocked=torch.zeros(6, 6)), TypeError, "blocked: expected a bool tensor"),
        (AttentionCall(bias=torch.zeros(6, 6, dtype=torch.long)), TypeError, "bias: expected a floating-point"),
    ],
)
def test_check_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call.check(*_qkv())


@pytest.mark.parametrize("backend", ["math", "auto"])
def test_attend_with_a_record_equals_the_keyword_entry(backend):
    q, k, v = _qkv()
    blocked = torch.rand(6, 6, generator=torch.Generator().manual_seed(1)) < 0.3
    kw = {"blocked": blocked, "is_causal": True, "window": 4, "scale": 0.4, "softcap": 5.0, "need_weights": True}
    want_out, want_w = functional.scaled_dot_product_attention(q, k, v, backend="math", **kw)
    out, w = attend(q, k, v, AttentionCall(backend=backend, **kw))
    torch.testing.assert_close(out, want_out, rtol=0, atol=TOL)
    torch.testing.assert_close(w, want_w, rtol=0, atol=TOL)


def test_a_ring_read_places_the_call_on_its_slots():
    slots = torch.tensor([4, 1, 2, 3])
    read = CacheRead((), torch.zeros(1, 4), key_slots=slots, window=3, sink_tokens=1)
    placed = read.place(AttentionCall(is_causal=True, q_offset=4, window=5, scale=0.5))
    assert placed.key_slots is slots and (placed.window, placed.sink_tokens, placed.scale) == (3, 1, 0.5)
    plain = CacheRead((), torch.zeros(1, 4))
    call = AttentionCall(is_causal=True, q_offset=3)
    assert plain.place(call) is call


class _Points:
    def __init__(self):
        self.hook_qk, self.hook_pattern, self.hook_heads = HookPoint(), HookPoint(), HookPoint()


def test_the_hooked_step_keeps_the_contract():
    """hook_qk sees the rows of the call, hook_pattern every head's weights, hook_heads may replace the output;
    the caller gets the weights it asked for."""
    q, k, v = _qkv()
    call = AttentionCall(is_causal=True, need_weights=True, average_heads=True)
    want_out, want_w = attend(q, k, v, call.replace(average_heads=False))
    points, seen = _Points(), []
    order = []
    hooks = [
        (points.hook_qk, lambda rows: order.append("qk") or seen.append(rows)),
        (points.hook_pattern, lambda w: order.append("pattern") or seen.append(w)),
        (points.hook_heads, lambda out: order.append("heads") or out * 0),
    ]
    with hooked(hooks):
        out, w = attend_hooked(points, q, k, v, call)
    assert order == ["qk", "pattern", "heads"]
    rows, pattern = seen
    assert isinstance(rows, AttentionRows) and rows.call is call and rows.is_causal
    torch.testing.assert_close(rows.weights(0, 6), want_w, rtol=0, atol=TOL)
    torch.testing.assert_close(pattern, want_w, rtol=0, atol=TOL)
    torch.testing.assert_close(w, want_w.mean(dim=1), rtol=0, atol=TOL)
    assert (out == 0).all()
    out, w = attend_hooked(None, q, k, v, call.replace(need_weights=False))  # no points: the attention alone
    torch.testing.assert_close(out, want_out, rtol=0, atol=TOL)
    assert w is None


def test_latent_attention_hands_its_rows_to_hook_qk():
    torch.manual_seed(0)
    m = headwise.LatentAttention(
        32, 4, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, dtype=F64
    ).eval()
    x = torch.randn(2, 7, 32, dtype=F64)
    for absorbed in (False, True):
        seen = []
        with torch.no_grad(), hooked([(m.hook_qk, seen.append)]):
            _, w = m(x, is_causal=True, need_weights=True, average_weights=False, absorbed=absorbed)
        (rows,) = seen
        torch.testing.assert_close(rows.weights(0, 7, keys=7), w, rtol=0, atol=TOL)


def test_modules_make_their_own_caches():
    mha = headwise.MultiHeadAttention(32, 4, num_kv_heads=2)
    cache = mha.new_cache(3, 10, dtype=torch.bfloat16)
    assert type(cache) is KVCache and cache.k.shape == (3, 2, 10, 8) and cache.k.dtype == torch.bfloat16
    ring = headwise.MultiHeadAttention(32, 4, sliding_window=3).new_cache(1, 10, sink_tokens=1)
    assert type(ring) is SlidingWindowCache and (ring.window, ring.sink_tokens) == (3, 1)
    mla = headwise.LatentAttention(32, 4, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)
    latent = mla.new_cache(2, 5)
    assert type(latent) is LatentCache and type(KVCache.for_module(mla, 2, 5)) is LatentCache
    with pytest.raises(ValueError, match="sink_tokens: a LatentCache keeps every token"):
        mla.new_cache(2, 5, sink_tokens=1)
    with pytest.raises(TypeError, match="module: expected an attention module with new_cache"):
        KVCache.for_module(torch.nn.Linear(2, 2), 1, 4)


def test_decodes_compiled_is_the_module_s_answer():
    m = headwise.MultiHeadAttention(32, 4).eval()
    cache = m.new_cache(1, 8)
    x = torch.randn(1, 1, 32)
    with torch.no_grad():
        assert m.decodes_compiled(x, cache, True) == headwise.core.kernels.available()
        m.softcap = 5.0
        assert not m.decodes_compiled(x, cache, True)
