"""A module built or deep-copied under ``torch.inference_mode()`` works at its first call (its weights are
inference tensors, which carry no version counter), as ``nn.MultiheadAttention`` does there."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import headwise
from headwise.core import decode

TOL = 1e-5


def _math_twin(m: headwise.MultiHeadAttention) -> headwise.MultiHeadAttention:
    """The same weights on ``backend="math"``, built outside inference mode."""
    twin = headwise.MultiHeadAttention(64, 8, num_kv_heads=2, backend="math").eval()
    with torch.no_grad():
        for name, p in twin.named_parameters():
            p.copy_(m.get_parameter(name).clone())
    return twin


def _built_inside():
    torch.manual_seed(0)
    with torch.inference_mode():
        return headwise.MultiHeadAttention(64, 8, num_kv_heads=2).eval()


def _copied_inside():
    torch.manual_seed(0)
    m = headwise.MultiHeadAttention(64, 8, num_kv_heads=2).eval()
    with torch.inference_mode():
        return copy.deepcopy(m)


@pytest.mark.parametrize("make", [_built_inside, _copied_inside], ids=["built", "deep-copied"])
@pytest.mark.parametrize("length", [5, 1100], ids=["short", "stacked per call"])
def test_module_made_under_inference_mode_works_inside_and_outside(make, length):
    m = make()
    assert m.Wq.weight.is_inference()
    ref = _math_twin(m)
    x = torch.randn(2, length, 64)
    want = ref(x, is_causal=True)[0]
    with torch.inference_mode():
        got_inside = m(x, is_causal=True)[0]
        again = m(x, is_causal=True)[0]  # nothing kept from the first call goes stale
    with torch.no_grad():  # outside inference mode torch allows inference weights where no gradient is recorded
        got_outside = m(x, is_causal=True)[0]
    for got in (got_inside, again, got_outside):
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)


def test_in_place_change_under_inference_mode_is_seen():
    """No stacked weight is kept for inference tensors: a weight changed in place is used at the next call."""
    m = _built_inside()
    x = torch.randn(1, 4, 64)
    with torch.inference_mode():
        m(x, is_causal=True)
        m.Wk.weight.mul_(2.0)
        got = m(x, is_causal=True)[0]
    torch.testing.assert_close(got, _math_twin(m)(x, is_causal=True)[0], rtol=0, atol=TOL)


@pytest.mark.parametrize("make", [_built_inside, _copied_inside], ids=["built", "deep-copied"])
def test_decoding_under_inference_mode_equals_math(make):
    m = make()
    ref = _math_twin(m)
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        want = ref(x, is_causal=True)[0]
    with torch.inference_mode():
        cache = m.new_cache(2, 9)
        m(x[:, :5], is_causal=True, cache=cache)
        assert not m.decodes_compiled(x[:, 5:6], cache, True)  # no kept stacked weight: the usual route
        steps = [m(x[:, t : t + 1], is_causal=True, cache=cache)[0] for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), want[:, 5:], rtol=0, atol=TOL)


def test_nn_multihead_attention_works_there_too():
    """The reference behaviour this follows."""
    with torch.inference_mode():
        ref = nn.MultiheadAttention(64, 8, batch_first=True)
        x = torch.randn(2, 5, 64)
        assert ref(x, x, x)[0].shape == (2, 5, 64)


def test_decode_applies_refuses_inference_weights():
    m = _built_inside()
    cache = m.new_cache(1, 4)
    linears = (m.Wq, m.Wk, m.Wv, m.Wo)
    assert not decode.applies(torch.randn(1, 1, 64), cache, linears, 2, 8, None)
