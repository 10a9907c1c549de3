"""Each bad input raises ValueError / TypeError naming the argument, the value and what was expected."""

import pytest
import torch

import headwise
from headwise import MultiHeadAttention as MHA

CONSTRUCT = [
    (lambda: MHA(100, 3), ValueError, r"num_heads: expected a divisor of d_model=100 .*got 3"),
    (lambda: MHA(0, 4), ValueError, r"d_model: expected a positive integer, got 0"),
    (lambda: MHA(64, -2), ValueError, r"num_heads: expected a positive integer, got -2"),
    (lambda: MHA(64, 8, num_kv_heads=3), ValueError, r"num_kv_heads: expected a divisor of num_heads=8, got 3"),
    (lambda: MHA(64, 8, dropout=1.0), ValueError, r"dropout: expected a probability in \[0, 1\), got 1.0"),
    (lambda: MHA(64, 8, dropout=-0.1), ValueError, r"dropout: .* got -0.1"),
    (lambda: MHA(64, 8, backend="flash"), ValueError, r"backend: expected one of .* got 'flash'"),
    (lambda: MHA(64, 8, positional="rope"), TypeError, r"positional: expected a PositionalPart"),
    (lambda: MHA(64, 8, positional=headwise.ALiBi(4)), ValueError, r"ALiBi\(num_heads=4\) .* num_heads=8"),
    (lambda: MHA(64, 8, positional=headwise.RotaryEmbedding(16)), ValueError, r"head_dim=16\) .* head_dim=8"),
    (lambda: headwise.RotaryEmbedding(7), ValueError, r"head_dim: RoPE needs a positive even head width, got 7"),
    (lambda: headwise.RotaryEmbedding(8, convention="x"), ValueError, r"convention: expected one of"),
    (lambda: headwise.sinusoidal_table(10, 7), ValueError, r"d_model: expected an even width .* got 7"),
    (lambda: headwise.sinusoidal_table(0, 8), ValueError, r"max_len: expected a positive integer, got 0"),
    (lambda: headwise.EmbeddingWithPE(100, 8, positional="rotary"), ValueError, r"positional: expected one of"),
    (lambda: headwise.KVCache(0, 8, 2, 4), ValueError, r"batch_size: expected a positive integer, got 0"),
]


@pytest.mark.parametrize("make, exc, pattern", CONSTRUCT)
def test_bad_construction(make, exc, pattern):
    with pytest.raises(exc, match=pattern) as e:
        make()
    assert type(e.value) is exc


m = MHA(16, 4)
x = torch.randn(2, 5, 16)

CALLS = [
    (lambda: m(torch.randn(5, 16)), ValueError, r"query: expected a rank-3 tensor \(B, L, 16\), got shape \(5, 16\)"),
    (lambda: m(torch.randn(2, 5, 12)), ValueError, r"query: expected last dimension 16, got shape \(2, 5, 12\)"),
    (lambda: m(x, torch.randn(3, 5, 16)), ValueError, r"batch sizes differ: 2, 3, 3"),
    (lambda: m(x, torch.randn(2, 5, 16), torch.randn(2, 4, 16)), ValueError, r"sequence lengths differ: 5 and 4"),
    (lambda: m(x.long()), TypeError, r"query: expected a floating-point tensor, got dtype torch.int64"),
    (
        lambda: m(x, attn_mask=torch.zeros(5, 4, dtype=torch.bool)),
        ValueError,
        r"attn_mask: expected shape \(L, S\)=\(5, 5\), .* got \(5, 4\)",
    ),
    (
        lambda: m(x, attn_mask=torch.zeros(5, 5, dtype=torch.int32)),
        TypeError,
        r"attn_mask: expected a bool or floating-point tensor, got dtype torch.int32",
    ),
    (
        lambda: m(x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)),
        ValueError,
        r"key_padding_mask: expected shape \(B, S\)=\(2, 5\), got \(2, 4\)",
    ),
    (
        lambda: m(x, key_padding_mask=torch.zeros(2, 5, dtype=torch.long)),
        TypeError,
        r"key_padding_mask: expected a bool",
    ),
    (lambda: m(x, position_ids=torch.arange(4)), ValueError, r"position_ids: expected shape \(L,\)=\(5,\)"),
    (lambda: m(x, position_ids=torch.zeros(5)), TypeError, r"position_ids: expected an integer tensor"),
    (
        lambda: headwise.SinusoidalPositionalEncoding(16, max_len=4)(x),
        ValueError,
        r"sequence length: positions 0..4 exceed max_len=4",
    ),
    (
        lambda: headwise.EmbeddingWithPE(10, 16, max_len=4)(torch.zeros(1, 5, dtype=torch.long)),
        ValueError,
        r"exceed max_len=4",
    ),
    (
        lambda: headwise.EmbeddingWithPE(10, 16)(torch.full((1, 3), 10)),
        ValueError,
        r"token_ids: expected ids in \[0, 10\), got values in \[10, 10\]",
    ),
]


@pytest.mark.parametrize("call, exc, pattern", CALLS)
def test_bad_call(call, exc, pattern):
    with pytest.raises(exc, match=pattern) as e:
        call()
    assert type(e.value) is exc
