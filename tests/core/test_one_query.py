"""One decoded token's fast routes against the readable math path: ``one_query.attention_one_query`` (the
compiled split-key kernel, or torch's products with ``kernels.enabled = False``) and the compiled decode step
``decode.step`` a module takes where it applies.

float32, whole tensors, ≤ 1e-6: MHA, GQA, MQA, batch > 1, padding and float masks, ALiBi's bias, a sliding
window over a ring cache, fully blocked rows; the routes they must not take (``backend="math"``, autograd,
weights asked for, sinks, soft-capping); and a bf16 cache read as bf16.
"""

from unittest import mock

import pytest
import torch

import headwise
from headwise import functional as HF
from headwise.core import decode, kernels, one_query

TOL = 1e-6


@pytest.fixture(autouse=True, params=[True, False], ids=["compiled", "torch"])
def route(request, monkeypatch):
    """Every test twice: with the compiled kernels (where Numba runs) and with torch's products."""
    if request.param and not kernels.available():
        pytest.skip("Numba is not available here")
    monkeypatch.setattr(kernels, "enabled", request.param)
    return request.param


def _pair(**kw):
    """A module on the fast paths and the same weights on ``backend="math"`` in float64 (the reference)."""
    torch.manual_seed(0)
    fast = headwise.MultiHeadAttention(64, 8, **kw).eval()
    math = headwise.MultiHeadAttention(64, 8, backend="math", **kw).eval()
    math.load_state_dict(fast.state_dict())
    return fast, math.double()


class _Spy:
    """Counts the decoded tokens that took a fast route: the one-query kernel or the compiled decode step."""

    def __init__(self):
        self.call_count = 0

    def __enter__(self):
        self._patches = [
            mock.patch.object(module, name, side_effect=self._counted(getattr(module, name)))
            for module, name in ((one_query, "attention_one_query"), (decode, "step"))
        ]
        for p in self._patches:
            p.start()
        return self

    def _counted(self, fn):
        def call(*args, **kw):
            self.call_count += 1
            return fn(*args, **kw)

        return call

    def __exit__(self, *exc):
        for p in self._patches:
            p.stop()


def _spy():
    return _Spy()


def _decode(m, x, prefill, cache_kw=None, **call):
    """Prefill, then decode the rest of ``x (B, L, D)`` token by token; ``(B, L − prefill, D)``."""
    x = x.to(m.Wq.weight.dtype)
    cache = headwise.KVCache.for_module(m, x.shape[0], x.shape[1], **(cache_kw or {}))
    m(x[:, :prefill], is_causal=True, cache=cache)
    outs = [m(x[:, t : t + 1], is_causal=True, cache=cache, **call)[0] for t in range(prefill, x.shape[1])]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize(
    "hkv",
    [8, pytest.param(2, marks=pytest.mark.slow), pytest.param(1, marks=pytest.mark.slow)],
    ids=["mha", "gqa", "mqa"],
)
@pytest.mark.parametrize("batch", [1, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "kind",
    ["plain", "rope", "alibi", "window", "window-sinks"],
)
def test_decoded_tokens_equal_math_path(hkv, batch, kind):
    kw = {"num_kv_heads": hkv}
    cache_kw = {}
    if kind == "rope":
        kw["positional"] = headwise.RotaryEmbedding(8)
    if kind == "alibi":
        kw["positional"] = headwise.ALiBi(8)
    if kind.startswith("window"):
        kw["sliding_window"] = 4
    if kind == "window-sinks":
        cache_kw["sink_tokens"] = 2
    fast, math = _pair(**kw)
    x = torch.randn(batch, 14, 64)
    with torch.no_grad():
        want = _decode(math, x, 5, cache_kw)
        with _spy() as spy:
            got = _decode(fast, x, 5, cache_kw)
    assert spy.call_count == 9
    torch.testing.assert_close(got, want.float(), rtol=0, atol=TOL)


def test_padding_masks_equal_math_path():
    fast, math = _pair(num_kv_heads=2)
    x = torch.randn(3, 9, 64)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[0, :3] = True  # left padding
    pad[2, 1] = True
    with torch.no_grad():
        outs = {}
        for name, m in (("fast", fast), ("math", math)):
            x = x.to(m.Wq.weight.dtype)
            cache = headwise.KVCache.for_module(m, 3, 9)
            m(x[:, :6], is_causal=True, cache=cache, key_padding_mask=pad[:, :6])
            outs[name] = [
                m(x[:, t : t + 1], is_causal=True, cache=cache, key_padding_mask=pad[:, : t + 1])[0]
                for t in range(6, 9)
            ]
            float_mask = torch.linspace(-2, 2, 27).view(3, 1, 9).to(x.dtype)  # (B, L, S): added to the scores
            cache.crop(8)
            outs[name].append(m(x[:, 8:], is_causal=True, cache=cache, attn_mask=float_mask)[0])
    for got, want in zip(outs["fast"], outs["math"]):
        torch.testing.assert_close(got, want.float(), rtol=0, atol=TOL)


@pytest.mark.slow
@pytest.mark.parametrize("hkv", [4, 1])
def test_functional_one_query_with_blocked_rows_and_bias(hkv):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, hkv, 11, 16), torch.randn(2, hkv, 11, 16)
    blocked = torch.rand(2, 4, 1, 11) < 0.5
    blocked[1, 2] = True  # a row with no key left: zeros
    bias = torch.randn(2, 1, 1, 11)
    with _spy() as spy:
        got, _ = HF.scaled_dot_product_attention(q, k, v, blocked=blocked, bias=bias)
    want, _ = HF.scaled_dot_product_attention(q, k, v, blocked=blocked, bias=bias, backend="math")
    assert spy.call_count == 1
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    assert torch.equal(got[1, 2], torch.zeros(1, 16))


def test_routes_that_do_not_take_the_kernel():
    x = torch.randn(2, 7, 64)
    for kw, grad, weights in (
        ({"backend": "math"}, False, False),  # the readable path meets no fast path
        ({}, True, False),  # autograd records: the differentiable kernels
        ({}, False, True),  # weights asked for
        ({"sinks": True}, False, False),
        ({"softcap": 30.0}, False, False),
    ):
        torch.manual_seed(0)
        m = headwise.MultiHeadAttention(64, 8, **kw).eval()
        ref = headwise.MultiHeadAttention(64, 8, **{**kw, "backend": "math"}).eval()
        ref.load_state_dict(m.state_dict())
        with torch.set_grad_enabled(grad), _spy() as spy:
            got = _decode(m, x, 4, need_weights=weights)
        with torch.no_grad():
            want = _decode(ref.double(), x, 4)
        assert spy.call_count == 0, kw
        assert got.requires_grad == grad
        torch.testing.assert_close(got.detach(), want.float(), rtol=0, atol=TOL)


def test_gradients_flow_through_the_fallback():
    m, ref = _pair(num_kv_heads=2)
    x = torch.randn(2, 6, 64)
    for mod in (m, ref):
        _decode(mod, x, 5).sum().backward()
    torch.testing.assert_close(m.Wq.weight.grad, ref.Wq.weight.grad.float(), rtol=0, atol=1e-5)


def test_bf16_cache_is_read_as_bf16(route):
    fast, math = _pair(num_kv_heads=2, positional=headwise.RotaryEmbedding(8))
    x = torch.randn(2, 12, 64)
    seen = []
    real = one_query.attention_one_query

    def spy(q, k, v, **kw):
        seen.append((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, **kw)

    with torch.no_grad(), mock.patch.object(one_query, "attention_one_query", spy), _spy() as fused:
        got = _decode(fast, x, 6, {"dtype": torch.bfloat16})
    with torch.no_grad():
        want = _decode(math, x, 6)
    if route:  # the compiled step reads the bf16 buffers itself
        assert seen == [] and fused.call_count == 6
    else:
        assert seen == [(torch.float32, torch.bfloat16, torch.bfloat16)] * 6
    assert got.dtype == torch.float32
    want = want.float()
    assert float((got - want).abs().max() / want.abs().max()) < 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_bf16_view_of_a_larger_buffer_reads_only_its_keys(batch):
    torch.manual_seed(3)
    buf_k, buf_v = torch.randn(batch, 2, 12, 16).bfloat16(), torch.randn(batch, 2, 12, 16).bfloat16()
    buf_k[:, :, 7:] = 1e4  # slots past the keys: large, and they must get no weight
    q = torch.randn(batch, 4, 1, 16)
    k, v = buf_k[:, :, :7], buf_v[:, :, :7]  # (B, Hkv, 7, Dh) strided by the buffer's 12 slots
    got = one_query.attention_one_query(q, k, v)
    want = one_query.attention_one_query(q, k.contiguous(), v.contiguous())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
