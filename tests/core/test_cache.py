"""Every cache through the one protocol (``headwise.core.cache.Cache``).

By hand: ``length`` (tokens seen), ``held``, ``nbytes``, ``crop``, ``reset``, overflow, the ring's slots and
sinks, what an update returns. Against the full causal forward: decoding with each kind of cache, compared
as whole tensors (float64, ≤ 1e-12 — the same maths in another order; the latent's absorbed path
reassociates products, ≤ 1e-10).
"""

import pytest
import torch

import headwise
from headwise.core import masks
from headwise.core.cache import Cache, CacheRead, KVCache, LatentCache, SlidingWindowCache
from headwise.core.latent import LatentAttention

TOL = 1e-12
F64 = torch.float64


def mha(**kw):
    torch.manual_seed(0)
    return headwise.MultiHeadAttention(16, 4, num_kv_heads=2, positional=headwise.RotaryEmbedding(4), **kw).to(F64)


def mla(**kw):
    torch.manual_seed(0)
    rope = headwise.RotaryEmbedding(4, convention="interleaved")
    m = LatentAttention(16, 2, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=3, positional=rope)
    return m.to(F64)


def x_of(L, d=16, seed=1):
    return torch.randn(2, L, d, dtype=F64, generator=torch.Generator().manual_seed(seed))


# (name, module factory, cache factory, full-forward kwargs, tolerance)
KINDS = {
    "kv": (mha, lambda m: KVCache.for_module(m, 2, 10), {}, TOL),
    "ring": (lambda: mha(sliding_window=3), lambda m: KVCache.for_module(m, 2, 10), {}, TOL),
    # a module window narrower than its ring: the module's own window decides
    "ring-wider": (lambda: mha(sliding_window=2), lambda m: SlidingWindowCache(2, 4, 2, 4, dtype=F64), {}, TOL),
    "streaming": (
        mha,
        lambda m: SlidingWindowCache(2, 3, 2, 4, sink_tokens=2, dtype=F64),
        {"attn_mask": masks.causal(torch.arange(10), torch.arange(10), 3, sink_tokens=2)},
        TOL,
    ),
    "latent": (mla, lambda m: Cache.for_module(m, 2, 10), {}, 1e-10),
}


def full_forward(m, x, extra):
    if extra:  # StreamingLLM's rule as an explicit mask over the whole sequence
        return m(x, **extra)[0]
    return m(x, is_causal=True)[0]


@pytest.mark.parametrize("chunks", [(1,) * 10, (4, 1, 1, 4), (5, 5)], ids=["tokens", "mixed", "halves"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_decoding_with_every_cache_equals_the_full_forward(kind, chunks):
    make, make_cache, extra, tol = KINDS[kind]
    m = make().eval()
    x = x_of(10)
    cache = make_cache(m)
    want = full_forward(m, x, extra)
    with torch.no_grad():
        outs, t = [], 0
        for n in chunks:
            outs.append(m(x[:, t : t + n], is_causal=True, cache=cache)[0])
            t += n
    torch.testing.assert_close(torch.cat(outs, dim=1), want, atol=tol, rtol=0)
    assert cache.length == 10  # tokens seen, whatever the cache holds


@pytest.mark.parametrize("kind", list(KINDS))
def test_one_protocol(kind):
    make, make_cache, _, _ = KINDS[kind]
    cache = make_cache(make())
    assert isinstance(cache, Cache)
    for name in ("length", "held", "capacity", "nbytes", "keys_after", "update", "crop", "reset", "for_module"):
        assert hasattr(cache, name), name
    assert (cache.length, cache.held, cache.nbytes) == (0, 0, 0)


def test_the_old_call_picks_the_cache_a_module_needs():
    assert type(KVCache.for_module(mha(), 2, 10)) is KVCache
    ring = KVCache.for_module(mha(sliding_window=3), 2, 10, sink_tokens=1)
    assert type(ring) is SlidingWindowCache and (ring.window, ring.sink_tokens, ring.capacity) == (3, 1, 4)
    assert type(KVCache.for_module(mla(), 2, 10)) is LatentCache
    assert type(LatentCache.for_module(mla(), 2, 10)) is LatentCache
    with pytest.raises(ValueError, match="sink_tokens: StreamingLLM's sinks need a window"):
        KVCache.for_module(mha(), 2, 10, sink_tokens=2)


def test_kv_update_returns_views_and_its_books():
    cache = KVCache(2, 5, 3, 4, dtype=F64)  # B=2, C=5, Hkv=3, Dh=4
    k = torch.randn(2, 3, 2, 4, dtype=F64)
    assert cache.keys_after(2) == 2
    read = cache.update(k, -k)
    assert isinstance(read, CacheRead) and read.key_slots is None and read.window is None and read.sink_tokens == 0
    rk, rv = read.tensors
    assert rk.data_ptr() == cache.k.data_ptr() and rk.shape == (2, 3, 2, 4)  # a view of the buffer
    assert torch.equal(rk, k) and torch.equal(rv, -k)
    assert read.positions.tolist() == [[0, 1], [0, 1]]
    read = cache.update(k[:, :, :1], k[:, :, :1], torch.tensor([7]))  # explicit token positions
    assert read.positions.tolist() == [[0, 1, 7], [0, 1, 7]]
    assert (cache.length, cache.held) == (3, 3)
    assert cache.nbytes == 3 * 2 * 3 * 4 * 2 * 8  # held · B · Hkv · Dh · (K and V) · 8 bytes


def test_overflow_is_an_error_and_nothing_is_half_appended():
    cache = KVCache(1, 4, 2, 4)
    cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    msg = r"cache: appending 2 tokens to 3 cached ones exceeds its capacity of 4"
    with pytest.raises(ValueError, match=msg):
        cache.keys_after(2)
    with pytest.raises(ValueError, match=msg):
        cache.update(torch.ones(1, 2, 2, 4), torch.ones(1, 2, 2, 4))
    assert cache.length == 3 and cache.k[:, :, 3].abs().sum() == 0
    latent = LatentCache(1, 2, 3, 2)
    latent.update(torch.zeros(1, 2, 3), torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match=r"cache: appending 1 tokens to 2 cached ones exceeds its capacity of 2"):
        latent.update(torch.zeros(1, 1, 3), torch.zeros(1, 1, 2))
    assert latent.length == 2
    with pytest.raises(ValueError, match=r"cache: expected keys and values of shape \(B, Hkv, n, Dh\)=\(1, 2, n, 4\)"):
        KVCache(1, 4, 2, 4).update(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(ValueError, match=r"cache: expected latent \(B, n, R\)=\(1, n, 3\)"):
        LatentCache(1, 4, 3, 2).update(torch.zeros(1, 1, 4), torch.zeros(1, 1, 2))


def test_a_module_checks_the_call_before_the_cache_changes():
    m = mha()
    cache = KVCache.for_module(m, 2, 4)
    m(x_of(3), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match="exceeds its capacity of 4"):
        m(x_of(2), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"key_padding_mask: expected shape \(B, S\)=\(2, 4\)"):
        m(x_of(1), is_causal=True, cache=cache, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))
    assert cache.length == 3
    ring = SlidingWindowCache(2, 2, 2, 4, dtype=F64)
    with pytest.raises(ValueError, match=r"cache: a SlidingWindowCache\(window=2\) serves causal calls"):
        m(x_of(1), cache=ring)  # not causal
    with pytest.raises(ValueError, match=r"got is_causal=True, sliding_window=3"):
        mha(sliding_window=3)(x_of(1), is_causal=True, cache=ring)  # a window wider than the ring
    assert ring.length == 0


def test_ring_slots_window_and_sinks_by_hand():
    ring = SlidingWindowCache(1, 3, 1, 2, sink_tokens=1, dtype=F64)  # holds the first token and the last 3
    assert ring.capacity == 4
    seen = []
    for t in range(7):
        k = torch.full((1, 1, 1, 2), float(t), dtype=F64)
        read = ring.update(k, k)
        seen.append((read.key_slots.tolist(), read.tensors[0][0, 0, :, 0].tolist()))
        assert (read.window, read.sink_tokens) == (3, 1)
        assert torch.equal(read.positions[0], read.key_slots)  # default positions: the stream indices
    # each read: the held keys in stream order, then the new one; a key's value is its stream index
    assert seen[2] == ([0, 1, 2], [0.0, 1.0, 2.0])
    assert seen[4] == ([0, 1, 2, 3, 4], [0.0, 1.0, 2.0, 3.0, 4.0])
    assert seen[6] == ([0, 3, 4, 5, 6], [0.0, 3.0, 4.0, 5.0, 6.0])
    assert (ring.length, ring.held) == (7, 4)
    assert ring.nbytes == 4 * 1 * 1 * 2 * 2 * 8
    assert ring.keys_after(2) == 6  # held + new
    # a chunk longer than the window: the read holds all of it, the ring keeps the sink and the last 3
    read = ring.update(torch.zeros(1, 1, 5, 2, dtype=F64), torch.zeros(1, 1, 5, 2, dtype=F64))
    assert read.key_slots.tolist() == [0, 4, 5, 6, 7, 8, 9, 10, 11]
    assert sorted(ring.key_slots(0).tolist()) == [0, 9, 10, 11]


def test_crop_and_reset():
    cache = KVCache(1, 6, 1, 2)
    cache.update(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))
    cache.crop(3)
    assert (cache.length, cache.held, cache.nbytes) == (3, 3, 3 * 2 * 2 * 4)
    cache.crop(-1)  # Hugging Face's negative crop: drop one from the end
    assert cache.length == 2
    for bad in (3, -3, 1.0, True):
        with pytest.raises(ValueError, match=r"length: expected an integer in \[-2, 2\]"):
            cache.crop(bad)
    cache.reset()
    assert (cache.length, cache.nbytes) == (0, 0)
    ring = SlidingWindowCache(1, 3, 1, 2)
    ring.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    ring.crop(1)  # nothing evicted yet: rewinding is exact
    assert ring.length == 1 and ring.key_slots(0).tolist() == [0]
    ring.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))  # 5 seen, 3 held
    with pytest.raises(ValueError, match="cannot rewind to 4"):
        ring.crop(4)
    ring.crop(5)  # to where it is: allowed
    ring.reset()
    assert (ring.length, ring.held, ring.key_slots(0).tolist()) == (0, 0, [])
    latent = LatentCache(1, 4, 3, 2)
    latent.update(torch.zeros(1, 3, 3), torch.zeros(1, 3, 2))
    latent.crop(-2)
    assert (latent.length, latent.nbytes) == (1, 1 * (3 + 2) * 4)


@pytest.mark.parametrize("kind", ["kv", "ring", "latent"])
def test_crop_then_decode_again_equals_the_full_forward(kind):
    make, make_cache, _, tol = KINDS[kind]
    m = make().eval()
    x, other = x_of(6), x_of(6, seed=9)
    cache = make_cache(m)
    with torch.no_grad():
        m(x[:, :2], is_causal=True, cache=cache)
        m(other[:, 2:3], is_causal=True, cache=cache)  # a token to take back (the ring has evicted nothing)
        cache.crop(2)
        got = torch.cat([m(x[:, t : t + 1], is_causal=True, cache=cache)[0] for t in range(2, 6)], dim=1)
        cache.reset()
        again = m(x, is_causal=True, cache=cache)[0]
    want = m(x, is_causal=True)[0]
    torch.testing.assert_close(got, want[:, 2:], atol=tol, rtol=0)
    torch.testing.assert_close(again, want, atol=tol, rtol=0)
