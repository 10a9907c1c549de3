"""headwise.MultiHeadAttention (float64) against the NumPy reference, whole tensors, ≤ 1e-12."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise
import headwise.reference as ref
from _helpers import np64, ref_params

TOL = 1e-12


@st.composite
def configs(draw):
    hkv = draw(st.sampled_from([1, 2, 3]))
    group = draw(st.sampled_from([1, 2, 4]))
    h = hkv * group
    dh = draw(st.sampled_from([2, 4, 6]))
    d = draw(st.sampled_from([h * dh, 8, 12]))
    B = draw(st.integers(1, 3))
    L = draw(st.integers(1, 7))
    pos = draw(st.sampled_from([None, "rope-half", "rope-interleaved", "alibi"]))
    mask = draw(st.sampled_from([None, "bool", "float", "padding", "bool3", "bool4"]))
    causal = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return dict(h=h, hkv=hkv, dh=dh, d=d, B=B, L=L, pos=pos, mask=mask, causal=causal, seed=seed)


def build(c):
    torch.manual_seed(c["seed"])
    positional, rk = None, {}
    if c["pos"] and c["pos"].startswith("rope"):
        conv = c["pos"].split("-")[1]
        positional, rk = headwise.RotaryEmbedding(c["dh"], convention=conv), {"rope": {"convention": conv}}
    elif c["pos"] == "alibi":
        positional, rk = headwise.ALiBi(c["h"]), {"alibi": True}
    m = headwise.MultiHeadAttention(
        c["d"], c["h"], num_kv_heads=c["hkv"], head_dim=c["dh"], positional=positional
    ).double()
    return m, rk


def make_mask(c, g):
    B, L, H = c["B"], c["L"], c["h"]
    kind = c["mask"]
    if kind is None:
        return {}, None
    if kind == "padding":
        pad = torch.rand(B, L, generator=g) < 0.3
        return {"key_padding_mask": pad}, pad.numpy()[:, None, None, :]
    if kind == "float":
        fm = torch.randn(L, L, generator=g, dtype=torch.float64)
        return {"attn_mask": fm}, fm.numpy()
    shape = {"bool": (L, L), "bool3": (B, L, L), "bool4": (B, H, L, L)}[kind]
    bm = torch.rand(*shape, generator=g) < 0.3
    arr = bm.numpy()
    arr = arr[:, None] if kind == "bool3" else arr
    return {"attn_mask": bm}, arr


@given(configs())
def test_forward_and_weights_equal_reference(c):
    m, rk = build(c)
    g = torch.Generator().manual_seed(c["seed"])
    x = torch.randn(c["B"], c["L"], c["d"], generator=g, dtype=torch.float64)
    kw, rmask = make_mask(c, g)
    out, w = m(x, **kw, is_causal=c["causal"], need_weights=True, average_weights=False)
    r_out, r_w = ref.multi_head_attention(
        np64(x), ref_params(m), c["h"], num_kv_heads=c["hkv"], mask=rmask, causal=c["causal"], **rk
    )
    np.testing.assert_allclose(np64(w), r_w, atol=TOL, rtol=0)
    np.testing.assert_allclose(np64(out), r_out, atol=TOL, rtol=0)
    # the fast path (no weights) gives the same output
    fast, none = m(x, **kw, is_causal=c["causal"])
    assert none is None
    np.testing.assert_allclose(np64(fast), r_out, atol=TOL, rtol=0)


@given(configs())
def test_cross_attention_with_kdim_vdim_equals_reference(c):
    torch.manual_seed(c["seed"])
    m = headwise.MultiHeadAttention(c["d"], c["h"], num_kv_heads=c["hkv"], head_dim=c["dh"], kdim=5, vdim=3)
    m = m.double()
    g = torch.Generator().manual_seed(c["seed"])
    x = torch.randn(c["B"], c["L"], c["d"], generator=g, dtype=torch.float64)
    S = c["L"] + 2
    key = torch.randn(c["B"], S, 5, generator=g, dtype=torch.float64)
    value = torch.randn(c["B"], S, 3, generator=g, dtype=torch.float64)
    out, w = m(x, key, value, need_weights=True, average_weights=True)
    p = ref_params(m)
    # the reference takes one context; project keys and values separately by giving it padded inputs
    r_out, r_w = ref.multi_head_attention(
        np64(x),
        {
            **p,
            "wk": np.concatenate([p["wk"], np.zeros((3, p["wk"].shape[1]))]),
            "wv": np.concatenate([np.zeros((5, p["wv"].shape[1])), p["wv"]]),
        },
        c["h"],
        num_kv_heads=c["hkv"],
        context=np.concatenate([np64(key), np64(value)], axis=-1),
    )
    np.testing.assert_allclose(np64(out), r_out, atol=TOL, rtol=0)
    np.testing.assert_allclose(np64(w), r_w.mean(axis=1), atol=TOL, rtol=0)


def test_hand_checkable_weights():
    # One head, Dh = 2, identity projections: scores are x_i·x_j / sqrt(2).
    m = headwise.MultiHeadAttention(2, 1, bias=False).double()
    with torch.no_grad():
        for lin in (m.Wq, m.Wk, m.Wv, m.Wo):
            lin.weight.copy_(torch.eye(2))
    a = np.sqrt(np.sqrt(2) * np.log(3.0))  # a²/sqrt(2) = ln 3
    x = torch.tensor([[[a, 0.0], [0.0, 0.0]]], dtype=torch.float64)
    out, w = m(x, need_weights=True)
    # row 0: scores (ln 3, 0) -> (3/4, 1/4); row 1: scores (0, 0) -> (1/2, 1/2)
    torch.testing.assert_close(w[0], torch.tensor([[0.75, 0.25], [0.5, 0.5]], dtype=torch.float64), rtol=0, atol=1e-15)
    torch.testing.assert_close(
        out[0], torch.tensor([[0.75 * a, 0.0], [0.5 * a, 0.0]], dtype=torch.float64), rtol=0, atol=1e-15
    )


def test_parameter_counts_of_the_article():
    assert sum(p.numel() for p in headwise.MultiHeadAttention(128, 4).parameters()) == 66_048
    assert sum(p.numel() for p in headwise.AttentionBlock(10_000, 128, 4).parameters()) == 1_346_048


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(backend):
    torch.manual_seed(0)
    m = headwise.MultiHeadAttention(16, 4, backend=backend)
    x = torch.randn(2, 5, 16, requires_grad=True)
    blocked = torch.zeros(5, 5, dtype=torch.bool)
    blocked[2] = True  # query 2 may attend nothing
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1] = True  # item 1: every key is padding
    out, w = m(x, attn_mask=blocked, key_padding_mask=pad, need_weights=backend == "math", average_weights=False)
    if w is not None:
        assert torch.equal(w[0, :, 2], torch.zeros(4, 5))
        assert torch.equal(w[1], torch.zeros(4, 5, 5))
    # zero attention output before Wo: the output is Wo's bias exactly
    torch.testing.assert_close(out[0, 2], m.Wo.bias, rtol=0, atol=0)
    torch.testing.assert_close(out[1], m.Wo.bias.expand(5, 16), rtol=0, atol=0)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_equivariance_without_positions_and_broken_with_sinusoidal():
    torch.manual_seed(0)
    m = headwise.MultiHeadAttention(128, 4)
    x = torch.randn(1, 4, 128)
    perm = [2, 0, 3, 1]
    diff = (m(x[:, perm])[0] - m(x)[0][:, perm]).abs().max().item()
    assert diff < 1e-6
    pe = headwise.SinusoidalPositionalEncoding(128)
    diff_pe = (m(pe(x[:, perm]))[0] - m(pe(x))[0][:, perm]).abs().max().item()
    assert diff_pe > 1e-2


def test_sinusoidal_torch_equals_reference():
    torch.testing.assert_close(
        headwise.sinusoidal_table(50, 64, dtype=torch.float64),
        torch.from_numpy(ref.sinusoidal_table(50, 64)),
        rtol=0,
        atol=TOL,
    )
