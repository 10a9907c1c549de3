"""``torch.compile(fullgraph=True)`` and ``torch.export`` of ``MultiHeadAttention`` equal eager.

Compiled: inference (``no_grad`` and ``inference_mode``, with and without weights, GQA, RoPE, a cache) and
training (outputs and gradients). Tolerances: float32, outputs ≤ 1e-6 absolute on O(1) values, gradients
≤ 1e-5 (Inductor reorders sums).
"""

import pytest
import torch

import headwise

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _module(**kw):
    torch.manual_seed(0)
    return headwise.MultiHeadAttention(64, 4, num_kv_heads=2, **kw).eval()


@pytest.mark.slow
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_compiled_inference_equals_eager(mode):
    m = _module(positional=headwise.RotaryEmbedding(16))
    compiled = torch.compile(m, fullgraph=True)
    x = torch.randn(2, 600, 64)  # 1,200 tokens: eager takes the fused projection
    pad = torch.zeros(2, 600, dtype=torch.bool)
    pad[1, :5] = True
    with mode():
        for kw in ({"is_causal": True}, {"need_weights": True, "key_padding_mask": pad}):
            want, w_want = m(x, **kw)
            got, w_got = compiled(x, **kw)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
            if w_want is not None:
                torch.testing.assert_close(w_got, w_want, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_compiled_decoding_with_a_cache_equals_eager():
    m = _module()
    compiled = torch.compile(m, fullgraph=True, dynamic=False)
    x = torch.randn(1, 6, 64)
    caches = [headwise.KVCache.for_module(m, 1, 8) for _ in range(2)]
    with torch.no_grad():
        want, _ = m(x[:, :5], is_causal=True, cache=caches[0])
        got, _ = compiled(x[:, :5], is_causal=True, cache=caches[1])
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        want, _ = m(x[:, 5:], is_causal=True, cache=caches[0])
        got, _ = compiled(x[:, 5:], is_causal=True, cache=caches[1])
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert caches[0].length == caches[1].length == 6


@pytest.mark.slow
def test_compiled_decoding_of_twenty_tokens_compiles_three_times():
    # The prompt, the first token (the offset becomes symbolic), then one graph for every later step: the
    # cache's views grow, and automatic dynamic shapes follow them (docs/architecture.md, "Caches").
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    m = _module(positional=headwise.RotaryEmbedding(16))
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(m, backend=counter, fullgraph=True)
    x = torch.randn(1, 25, 64)
    caches = [headwise.KVCache.for_module(m, 1, 25) for _ in range(2)]
    with torch.no_grad():
        want = [m(x[:, :5], is_causal=True, cache=caches[0])[0]]
        got = [compiled(x[:, :5], is_causal=True, cache=caches[1])[0]]
        for t in range(5, 25):
            want.append(m(x[:, t : t + 1], is_causal=True, cache=caches[0])[0])
            got.append(compiled(x[:, t : t + 1], is_causal=True, cache=caches[1])[0])
    torch.testing.assert_close(torch.cat(got, 1), torch.cat(want, 1), atol=1e-6, rtol=0)
    assert counter.frame_count <= 3
    assert caches[1].length == 25


@pytest.mark.slow
def test_compiled_training_step_equals_eager():
    m = _module(dropout=0.0).train()
    compiled = torch.compile(m, fullgraph=True)
    x = torch.randn(2, 600, 64, requires_grad=True)
    params = [x, *m.parameters()]
    want, _ = m(x, is_causal=True)
    g_want = torch.autograd.grad((want**2).sum(), params)
    got, _ = compiled(x, is_causal=True)
    g_got = torch.autograd.grad((got**2).sum(), params)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_exported_module_equals_eager():
    m = _module(positional=headwise.ALiBi(4))
    x = torch.randn(2, 9, 64)
    program = torch.export.export(m, (x,), {"is_causal": True})
    got, _ = program.module()(x, is_causal=True)
    want, _ = m(x, is_causal=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
