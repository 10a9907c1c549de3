"""``LatentAttention`` against the NumPy reference (float64, ≤ 1e-12), its absorbed path against its plain one,
and decoding through a ``LatentCache`` against the full causal forward (float32, ≤ 1e-6)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise.reference as ref
from _helpers import np64
from headwise.core.cache import KVCache, LatentCache
from headwise.core.latent import LatentAttention
from headwise.positional.rope import RotaryEmbedding

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "mscale": 1.0, "mscale_all_dim": 0.8}


def build(c, dtype=torch.float64):
    torch.manual_seed(c["seed"])
    rope = None
    if c["rope"]:
        rope = RotaryEmbedding(c["Dr"], convention=c["rope"], scaling=YARN if c["yarn"] else None)
    m = LatentAttention(
        c["D"], c["H"], kv_lora_rank=c["R"], qk_nope_head_dim=c["Dn"], qk_rope_head_dim=c["Dr"], v_head_dim=c["Dv"],
        q_lora_rank=c["Rq"], bias=c["bias"], positional=rope,
    )  # fmt: skip
    with torch.no_grad():  # norm weights away from 1, so that a forgotten norm weight shows
        for p in (m.kv_norm.weight, *([] if c["Rq"] is None else [m.q_norm.weight])):
            p.uniform_(0.5, 1.5)
    return m.to(dtype).eval(), rope


def ref_params(m):
    p = {
        "wkv_a": np64(m.Wkv_a.weight).T,
        "kv_norm": np64(m.kv_norm.weight),
        "wkv_b": np64(m.Wkv_b.weight).T,
        "wo": np64(m.Wo.weight).T,
    }
    if m.q_lora_rank is None:
        p["wq"] = np64(m.Wq.weight).T
    else:
        p |= {"wq_a": np64(m.Wq_a.weight).T, "q_norm": np64(m.q_norm.weight), "wq_b": np64(m.Wq_b.weight).T}
        if m.Wq_a.bias is not None:
            p["bq_a"] = np64(m.Wq_a.bias)
    for name, lin in (("bkv_a", m.Wkv_a), ("bo", m.Wo)):
        if lin.bias is not None:
            p[name] = np64(lin.bias)
    return p


@st.composite
def configs(draw):
    return dict(
        D=draw(st.sampled_from([8, 12, 16])),
        H=draw(st.integers(1, 3)),
        R=draw(st.sampled_from([2, 4, 8])),
        Rq=draw(st.sampled_from([None, 3, 6])),
        Dn=draw(st.sampled_from([2, 4])),
        Dr=draw(st.sampled_from([2, 4])),
        Dv=draw(st.sampled_from([2, 3, 5])),
        bias=draw(st.booleans()),
        rope=draw(st.sampled_from([None, "half", "interleaved"])),
        yarn=draw(st.booleans()),
        B=draw(st.integers(1, 2)),
        L=draw(st.integers(1, 7)),
        causal=draw(st.booleans()),
        absorbed=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=40, deadline=None)
@given(configs())
def test_equals_the_reference(c):
    m, rope = build(c)
    x = torch.randn(c["B"], c["L"], c["D"], generator=torch.Generator().manual_seed(c["seed"]), dtype=torch.float64)
    out, w = m(x, is_causal=c["causal"], need_weights=True, average_weights=False, absorbed=c["absorbed"])
    rk = None if rope is None else {"convention": c["rope"], "scaling": YARN if c["yarn"] else None}
    want, want_w = ref.latent_attention(
        np64(x), ref_params(m), c["H"], kv_lora_rank=c["R"], qk_nope_head_dim=c["Dn"], qk_rope_head_dim=c["Dr"],
        v_head_dim=c["Dv"], causal=c["causal"], rope=rk, norm_eps=1e-6,
    )  # fmt: skip
    np.testing.assert_allclose(np64(out), want, atol=1e-12, rtol=0)
    np.testing.assert_allclose(np64(w), want_w, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_absorbed_equals_plain_in_float32(backend):
    c = dict(D=32, H=4, R=8, Rq=12, Dn=8, Dr=4, Dv=6, bias=True, rope="interleaved", yarn=True, seed=3)
    m, _ = build(c, torch.float32)
    m.backend = backend
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(0))
    mask = torch.rand(2, 9, generator=torch.Generator().manual_seed(1)) < 0.2
    mask[:, 0] = False
    for kw in (
        {"is_causal": True},
        {"key_padding_mask": mask},
        {"is_causal": True, "position_ids": torch.arange(5, 14)},
    ):
        plain = m(x, absorbed=False, **kw)[0]
        absorbed = m(x, absorbed=True, **kw)[0]
        torch.testing.assert_close(absorbed, plain, atol=1e-5, rtol=0)


@pytest.mark.parametrize("prefill", [0, 1, 4])
@pytest.mark.parametrize("absorbed", [True, False])
def test_decode_equals_full_causal_forward(prefill, absorbed):
    c = dict(D=24, H=3, R=6, Rq=None, Dn=4, Dr=4, Dv=5, bias=False, rope="interleaved", yarn=True, seed=5)
    m, _ = build(c, torch.float32)
    x = torch.randn(2, 10, 24, generator=torch.Generator().manual_seed(2))
    full = m(x, is_causal=True)[0]
    cache = KVCache.for_module(m, 2, 10)
    assert isinstance(cache, LatentCache)
    steps = []
    if prefill:
        steps.append(m(x[:, :prefill], is_causal=True, cache=cache, absorbed=absorbed)[0])
    for t in range(prefill, 10):
        steps.append(m(x[:, t : t + 1], is_causal=True, cache=cache, absorbed=absorbed)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-6, rtol=0)
    # only the latent and the rope key: (R + Dr) numbers per position, not H·(Dn + Dr + Dv)
    assert cache.nbytes == 2 * 10 * (6 + 4) * 4
    assert cache.length == 10


def test_bad_input_names_the_argument():
    kw = dict(kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)
    with pytest.raises(ValueError, match=r"kv_lora_rank: expected a rank of at most d_model=16, got 32"):
        LatentAttention(16, 2, **{**kw, "kv_lora_rank": 32})
    with pytest.raises(ValueError, match=r"q_lora_rank: expected a rank of at most d_model=16, got 17"):
        LatentAttention(16, 2, q_lora_rank=17, **kw)
    with pytest.raises(ValueError, match=r"qk_rope_head_dim: expected an even width"):
        LatentAttention(16, 2, **{**kw, "qk_rope_head_dim": 3})
    with pytest.raises(
        ValueError, match=r"positional: RotaryEmbedding\(head_dim=8\) given to a module with head_dim=4"
    ):
        LatentAttention(16, 2, positional=RotaryEmbedding(8), **kw)
    m = LatentAttention(16, 2, **kw)
    with pytest.raises(ValueError, match=r"x: expected a floating-point tensor \(B, L, 16\)"):
        m(torch.zeros(1, 3, 15))
    cache = LatentCache(1, 2, 4, 4)
    m(torch.zeros(1, 2, 16), cache=cache)
    with pytest.raises(ValueError, match=r"cache: appending 1 tokens to 2 cached ones exceeds its capacity of 2"):
        m(torch.zeros(1, 1, 16), cache=cache)
