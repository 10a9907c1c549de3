"""Part 5 layers: the same numbers as PyTorch's own encoder and decoder layers, and the article's 8,544."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headwise.core.layers import DecoderLayer, EncoderLayer, FeedForward, encoder_layer_params
from headwise.interop import from_torch

D, H, F = 32, 4, 64


def _copy(ours, theirs, attention_pairs, norms) -> None:
    with torch.no_grad():
        for mine, torch_mha in attention_pairs:
            mine.load_state_dict(from_torch(torch_mha).state_dict())
        ours.ff.linear1.load_state_dict(theirs.linear1.state_dict())
        ours.ff.linear2.load_state_dict(theirs.linear2.state_dict())
        for name in norms:
            getattr(ours, name).load_state_dict(getattr(theirs, name).state_dict())
            getattr(ours, name).weight.normal_()  # non-trivial affine parameters, copied to both
            getattr(theirs, name).weight.copy_(getattr(ours, name).weight)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(norm_first, activation):
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(
        D, H, F, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first, dtype=torch.float64
    ).eval()
    ours = EncoderLayer(D, H, F, activation=activation, norm_first=norm_first).double().eval()
    _copy(ours, theirs, [(ours.self_attn, theirs.self_attn)], ["norm1", "norm2"])
    x = torch.randn(3, 7, D, dtype=torch.float64)  # (B, L, D)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(ours(x, key_padding_mask=pad), theirs(x, src_key_padding_mask=pad), rtol=0, atol=1e-12)
    causal = nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64)
    torch.testing.assert_close(ours(x, is_causal=True), theirs(x, src_mask=causal, is_causal=True), rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_with_cross_attention_matches_torch(norm_first):
    torch.manual_seed(1)
    theirs = nn.TransformerDecoderLayer(
        D, H, F, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=torch.float64
    ).eval()
    ours = DecoderLayer(D, H, F, cross_attention=True, norm_first=norm_first).double().eval()
    _copy(
        ours,
        theirs,
        [(ours.self_attn, theirs.self_attn), (ours.cross_attn, theirs.multihead_attn)],
        ["norm1", "norm2", "norm3"],
    )
    x = torch.randn(2, 6, D, dtype=torch.float64)  # (B, L, D)
    memory = torch.randn(2, 9, D, dtype=torch.float64)  # (B, S, D)
    mem_pad = torch.zeros(2, 9, dtype=torch.bool)
    mem_pad[0, 7:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)
    expected = theirs(x, memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=mem_pad)
    torch.testing.assert_close(ours(x, memory, memory_key_padding_mask=mem_pad), expected, rtol=0, atol=1e-12)


def test_decoder_only_layer_is_causal_and_attention_only_when_asked():
    torch.manual_seed(2)
    layer = DecoderLayer(D, H, None).double().eval()
    assert layer.ff is None and layer.cross_attn is None
    x = torch.randn(1, 8, D, dtype=torch.float64)
    y, w = layer(x, need_weights=True, average_weights=False)
    assert w.shape == (1, H, 8, 8)
    torch.testing.assert_close(w.triu(1), torch.zeros_like(w), rtol=0, atol=0)
    # pre-LN attention-only by hand: x + MHA(LN(x)) with a causal mask
    by_hand, _ = layer.self_attn(layer.norm1(x), is_causal=True)
    torch.testing.assert_close(y, x + by_hand, rtol=0, atol=1e-12)
    # the future does not change the past
    x2 = x.clone()
    x2[:, 5:] = torch.randn(1, 3, D, dtype=torch.float64)
    torch.testing.assert_close(layer(x2)[:, :5], y[:, :5], rtol=0, atol=1e-12)


@pytest.mark.parametrize("heads", [1, 2, 4, 8, 16, 32])
def test_article_8544_parameter_encoder_layer(heads):
    for norm_first in (False, True):
        layer = EncoderLayer(32, heads, 64, norm_first=norm_first)
        assert sum(p.numel() for p in layer.parameters()) == 8544
    assert encoder_layer_params(32, 64) == {
        "attention": 4224,
        "feed_forward": 4192,
        "layer_norm": 128,
        "total": 8544,
    }
    torch_layer = nn.TransformerEncoderLayer(32, heads, 64, batch_first=True)
    assert sum(p.numel() for p in torch_layer.parameters()) == 8544


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="d_ff"):
        EncoderLayer(32, 4, 0)
    with pytest.raises(ValueError, match="activation"):
        FeedForward(32, 64, activation="tanh")
    with pytest.raises(TypeError, match="norm_first"):
        EncoderLayer(32, 4, 64, norm_first="pre")
    with pytest.raises(ValueError, match="dropout"):
        DecoderLayer(32, 4, 64, dropout=1.5)
    with pytest.raises(ValueError, match="memory"):
        DecoderLayer(32, 4, 64)(torch.randn(1, 3, 32), torch.randn(1, 3, 32))
    with pytest.raises(ValueError, match="memory"):
        DecoderLayer(32, 4, 64, cross_attention=True)(torch.randn(1, 3, 32))
