"""headwise vs torch.nn.MultiheadAttention with the same weights: outputs, weights (≤ 1e-6) and gradients (≤ 1e-5)."""

import itertools

import pytest
import torch
from torch import nn

import headwise
from headwise.interop import from_torch, to_torch

B, L, S, D, H = 2, 5, 6, 32, 4


def masks_for(kind, g):
    """(headwise kwargs, nn.MultiheadAttention kwargs) for one mask kind."""
    if kind == "none":
        return {}, {}
    if kind == "bool2":
        m = torch.rand(L, S, generator=g) < 0.3
        return {"attn_mask": m}, {"attn_mask": m}
    if kind == "float2":
        m = torch.randn(L, S, generator=g)
        return {"attn_mask": m}, {"attn_mask": m}
    if kind == "bool4":  # nn.MultiheadAttention takes (B·H, L, S)
        m = torch.rand(B, H, L, S, generator=g) < 0.3
        return {"attn_mask": m}, {"attn_mask": m.reshape(B * H, L, S)}
    if kind == "float4":
        m = torch.randn(B, H, L, S, generator=g)
        return {"attn_mask": m}, {"attn_mask": m.reshape(B * H, L, S)}
    if kind == "padding":
        p = torch.zeros(B, S, dtype=torch.bool)
        p[1, 3:] = True
        return {"key_padding_mask": p}, {"key_padding_mask": p}
    if kind == "padding+bool2":
        p = torch.zeros(B, S, dtype=torch.bool)
        p[0, 4:] = True
        m = torch.rand(L, S, generator=g) < 0.2
        return {"key_padding_mask": p, "attn_mask": m}, {"key_padding_mask": p, "attn_mask": m}
    if kind == "causal":  # nn.MultiheadAttention insists on being given the mask with is_causal
        m = torch.ones(L, S, dtype=torch.bool).triu(1)
        return {"is_causal": True}, {"attn_mask": m, "is_causal": True}
    raise AssertionError(kind)


KINDS = ["none", "bool2", "float2", "bool4", "float4", "padding", "padding+bool2", "causal"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "batch_first, kv_dims, bias", list(itertools.product([True, False], [None, 24], [True, False]))
)
def test_outputs_weights_and_gradients_match(kind, batch_first, kv_dims, bias):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    theirs = nn.MultiheadAttention(D, H, bias=bias, kdim=kv_dims, vdim=kv_dims, batch_first=batch_first).eval()
    mine = from_torch(theirs).eval()
    x = torch.randn(B, L, D, generator=g, requires_grad=True)
    kv = torch.randn(B, S, kv_dims or D, generator=g, requires_grad=True)
    hw, tw = masks_for(kind, g)
    t_in = (x, kv, kv) if batch_first else (x.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1))
    for average in (True, False):
        t_out, t_w = theirs(*t_in, need_weights=True, average_attn_weights=average, **tw)
        t_out = t_out if batch_first else t_out.transpose(0, 1)
        m_out, m_w = mine(x, kv, kv, need_weights=True, average_weights=average, **hw)
        torch.testing.assert_close(m_out, t_out, rtol=0, atol=1e-6)
        torch.testing.assert_close(m_w, t_w, rtol=0, atol=1e-6)
    fast, _ = mine(x, kv, kv, **hw)  # the SDPA path
    torch.testing.assert_close(fast, t_out, rtol=0, atol=1e-6)
    gt = torch.autograd.grad(t_out.square().sum(), [x, kv, *theirs.parameters()])
    gm = torch.autograd.grad(fast.square().sum(), [x, kv, *mine.parameters()])
    torch.testing.assert_close(gm[0], gt[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(gm[1], gt[1], rtol=0, atol=1e-5)
    # parameter gradients, mapped back to nn.MultiheadAttention's packing
    back = to_torch_grads(mine, gm[2:])
    for name, g_t in zip([n for n, _ in theirs.named_parameters()], gt[2:]):
        torch.testing.assert_close(back[name], g_t, rtol=0, atol=1e-5, msg=name)


def to_torch_grads(mine, grads):
    g = dict(zip([n for n, _ in mine.named_parameters()], grads))
    out = {"out_proj.weight": g["Wo.weight"]}
    if mine.kdim == mine.d_model:
        out["in_proj_weight"] = torch.cat([g["Wq.weight"], g["Wk.weight"], g["Wv.weight"]])
    else:
        out.update({"q_proj_weight": g["Wq.weight"], "k_proj_weight": g["Wk.weight"], "v_proj_weight": g["Wv.weight"]})
    if "Wq.bias" in g:
        out["in_proj_bias"] = torch.cat([g["Wq.bias"], g["Wk.bias"], g["Wv.bias"]])
        out["out_proj.bias"] = g["Wo.bias"]
    return out


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kv_dims", [None, 24])
def test_to_torch_roundtrip(batch_first, kv_dims):
    torch.manual_seed(2)
    mine = headwise.MultiHeadAttention(D, H, kdim=kv_dims, vdim=kv_dims).eval()
    theirs = to_torch(mine, batch_first=batch_first).eval()
    assert theirs.batch_first is batch_first
    x, kv = torch.randn(B, L, D), torch.randn(B, S, kv_dims or D)
    t_in = (x, kv, kv) if batch_first else (x.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1))
    t_out, t_w = theirs(*t_in)
    t_out = t_out if batch_first else t_out.transpose(0, 1)
    m_out, m_w = mine(x, kv, kv, need_weights=True)
    torch.testing.assert_close(m_out, t_out, rtol=0, atol=1e-6)
    torch.testing.assert_close(m_w, t_w, rtol=0, atol=1e-6)
    again = from_torch(theirs)
    for (n1, p1), (n2, p2) in zip(mine.named_parameters(), again.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)


def test_fully_masked_row_nn_mha_gives_nan_headwise_zero():
    torch.manual_seed(3)
    theirs = nn.MultiheadAttention(D, H, batch_first=True).eval()
    mine = from_torch(theirs)
    x = torch.randn(1, L, D)
    pad = torch.ones(1, L, dtype=torch.bool)
    t_out, _ = theirs(x, x, x, key_padding_mask=pad)
    m_out, _ = mine(x, key_padding_mask=pad)
    assert torch.isnan(t_out).all()  # pytorch#41508: if this starts failing, upstream fixed it
    torch.testing.assert_close(m_out, mine.Wo.bias.expand(1, L, D), rtol=0, atol=0)


def test_unsupported_conversions():
    with pytest.raises(TypeError, match="m: expected a torch.nn.MultiheadAttention, got Linear"):
        from_torch(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="add_bias_kv"):
        from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="num_kv_heads=1"):
        to_torch(headwise.MultiHeadAttention(8, 2, num_kv_heads=1))
    with pytest.raises(ValueError, match="positional"):
        to_torch(headwise.MultiHeadAttention(8, 2, positional=headwise.ALiBi(2)))
