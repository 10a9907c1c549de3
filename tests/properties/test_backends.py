"""Every attention backend ≡ every other, under generated inputs (hypothesis; profiles in tests/conftest.py).

The backends, all on the same ``q (B, H, L, Dh)``, ``k, v (B, Hkv, S, Dh)``:

- ``headwise.core.functional.scaled_dot_product_attention`` with ``backend="math"`` (the readable softmax),
  ``"sdpa"`` (``F.scaled_dot_product_attention``) and ``"auto"`` + ``need_weights`` (the blocked
  weights path);
- the NumPy reference ``headwise.reference.scaled_dot_product_attention``, plain and blocked
  (``block_size=N``, FlashAttention's online softmax);
- the ring-attention block kernels of ``headwise.distributed.kernels`` (``MathKernel``,
  ``CpuFlashKernel``) in one process, forward (output and log-sum-exp) and backward (the flash backward
  from the global log-sum-exp, against autograd through the math path).

And what non-finite inputs do (documented in docs/reliability.md): headwise never scans inputs for NaN;
a NaN reaches exactly the outputs that depend on it, and is never turned into a finite number.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise.reference as ref
from headwise import functional
from headwise.distributed.kernels import CpuFlashKernel, MathKernel

ATOL = 1e-12  # float64, every path against every other


@st.composite
def sdpa_inputs(draw, masks=True, max_len=9):
    hkv = draw(st.sampled_from([1, 2, 3]))
    h = hkv * draw(st.sampled_from([1, 2, 3]))
    B, L, S = draw(st.integers(1, 3)), draw(st.integers(1, max_len)), draw(st.integers(1, max_len))
    dh = draw(st.sampled_from([1, 2, 4, 8]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, L, dh, generator=g, dtype=torch.float64)
    k = torch.randn(B, hkv, S, dh, generator=g, dtype=torch.float64)
    v = torch.randn(B, hkv, S, dh, generator=g, dtype=torch.float64)
    blocked = bias = None
    if masks:
        kind = draw(st.sampled_from(["none", "blocked", "bias", "both"]))
        # broadcastable shapes: (L, S), (B, 1, L, S), (1, H, L, S) or a key-padding (B, 1, 1, S)
        shape = draw(st.sampled_from([(L, S), (B, 1, L, S), (1, h, L, S), (B, 1, 1, S)]))
        if kind in ("blocked", "both"):
            blocked = torch.rand(*shape, generator=g) < draw(st.sampled_from([0.2, 0.5, 0.9]))
        if kind in ("bias", "both"):
            bias = torch.randn(*shape, generator=g, dtype=torch.float64)
    scale = draw(st.sampled_from([None, 0.1, 1.0]))
    causal = draw(st.booleans())
    return q, k, v, blocked, bias, scale, causal


def reference_mask(blocked, bias, causal, L, S):
    """One mask for the NumPy reference: float (bias, −inf where blocked) or bool, causal folded in."""
    stop = None if blocked is None else blocked.numpy()
    if causal:
        c = np.triu(np.ones((L, S), dtype=bool), 1)  # top-left aligned: key j > query i is blocked
        stop = c if stop is None else (stop | c)
    if bias is None:
        return stop
    b = bias.numpy()
    return b if stop is None else np.where(stop, -np.inf, b)


def repeat_heads(x, h):
    return np.repeat(x.numpy(), h // x.shape[1], axis=1)  # (B, Hkv, S, Dh) -> (B, H, S, Dh)


@pytest.mark.slow
@given(sdpa_inputs(), st.integers(1, 10))
def test_every_functional_backend_equals_the_plain_and_the_blocked_reference(inputs, block_size):
    q, k, v, blocked, bias, scale, causal = inputs
    L, S, h = q.shape[2], k.shape[2], q.shape[1]
    kw = {"blocked": blocked, "bias": bias, "is_causal": causal, "scale": scale}
    mask = reference_mask(blocked, bias, causal, L, S)
    kr, vr = repeat_heads(k, h), repeat_heads(v, h)
    r_out, r_w = ref.scaled_dot_product_attention(q.numpy(), kr, vr, mask=mask, scale=scale)
    rb_out, _ = ref.scaled_dot_product_attention(q.numpy(), kr, vr, mask=mask, scale=scale, block_size=block_size)
    np.testing.assert_allclose(rb_out, r_out, rtol=0, atol=ATOL)

    m_out, m_w = functional.scaled_dot_product_attention(q, k, v, backend="math", need_weights=True, **kw)
    a_out, a_w = functional.scaled_dot_product_attention(q, k, v, backend="auto", need_weights=True, **kw)
    outs = [("math", m_out), ("auto+weights", a_out)]
    outs.append(("sdpa", functional.scaled_dot_product_attention(q, k, v, backend="sdpa", **kw)[0]))
    for name, out in outs:
        np.testing.assert_allclose(out.numpy(), r_out, rtol=0, atol=ATOL, err_msg=name)
    np.testing.assert_allclose(m_w.numpy(), r_w, rtol=0, atol=ATOL)
    np.testing.assert_allclose(a_w.numpy(), r_w, rtol=0, atol=ATOL)


@given(sdpa_inputs(), st.sampled_from(["sdpa", "auto"]))
def test_sdpa_backend_keeps_causality_alongside_a_mask(inputs, backend):
    q, k, v, blocked, bias, scale, _ = inputs
    blocked = torch.zeros(q.shape[2], k.shape[2], dtype=torch.bool) if blocked is None and bias is None else blocked
    kw = {"blocked": blocked, "bias": bias, "is_causal": True, "scale": scale}
    mask = reference_mask(blocked, bias, True, q.shape[2], k.shape[2])
    h = q.shape[1]
    r_out, _ = ref.scaled_dot_product_attention(
        q.numpy(), repeat_heads(k, h), repeat_heads(v, h), mask=mask, scale=scale
    )
    out, _ = functional.scaled_dot_product_attention(q, k, v, backend=backend, **kw)
    np.testing.assert_allclose(out.numpy(), r_out, rtol=0, atol=ATOL)


def _reference_lse(q, k, scale, causal):
    s = q.numpy() @ np.swapaxes(repeat_heads(k, q.shape[1]), -1, -2) * scale  # (B, H, L, S)
    if causal:
        s = np.where(np.triu(np.ones(s.shape[-2:], dtype=bool), 1), -np.inf, s)
    m = s.max(-1, keepdims=True)
    return (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]  # (B, H, L)


@pytest.mark.slow
@given(sdpa_inputs(masks=False), st.sampled_from(["math", "flash"]))
def test_ring_block_kernels_equal_functional_forward_and_backward(inputs, which):
    q, k, v, _, _, scale, causal = inputs
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kernel = MathKernel() if which == "math" else CpuFlashKernel()
    out, lse = kernel.forward(q, k, v, causal=causal, scale=scale)
    q_, k_, v_ = (t.clone().requires_grad_() for t in (q, k, v))
    expected, _ = functional.scaled_dot_product_attention(q_, k_, v_, is_causal=causal, scale=scale, backend="math")
    torch.testing.assert_close(out, expected.detach(), rtol=0, atol=ATOL)
    np.testing.assert_allclose(lse.numpy(), _reference_lse(q, k, scale, causal), rtol=0, atol=1e-11)

    dout = torch.randn(expected.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    grads = torch.autograd.grad(expected, (q_, k_, v_), dout)
    mine = kernel.backward(dout, q, k, v, out, lse, causal=causal, scale=scale)
    for name, a, b in zip("qkv", mine, grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11, msg=lambda m, name=name: f"d{name}: {m}")


# ----------------------------------------------------------------------------------------------------
# non-finite inputs: the documented behaviour (docs/reliability.md, "NaN and inf")


@pytest.mark.slow
@given(sdpa_inputs(masks=False), st.data(), st.sampled_from(["math", "sdpa", "auto+weights"]))
def test_nan_in_a_query_row_reaches_that_row_only(inputs, data, backend):
    """math and the weights path: the row is NaN. sdpa (PyTorch's CPU kernels): NaN, or — for small
    shapes — all zeros (torch 2.13's behaviour, documented; headwise does not scan for NaN)."""
    q, k, v, _, _, scale, causal = inputs
    i = data.draw(st.integers(0, q.shape[2] - 1))
    bad = q.clone()
    bad[:, :, i, data.draw(st.integers(0, q.shape[3] - 1))] = float("nan")
    kw = {"is_causal": causal, "scale": scale, "backend": "auto" if backend == "auto+weights" else backend}
    kw["need_weights"] = backend != "sdpa"
    clean, _ = functional.scaled_dot_product_attention(q, k, v, **kw)
    out, w = functional.scaled_dot_product_attention(bad, k, v, **kw)
    row = out[:, :, i]
    assert row.isnan().all() or (backend == "sdpa" and (row == 0).all()), row
    rest = [j for j in range(q.shape[2]) if j != i]
    torch.testing.assert_close(out[:, :, rest], clean[:, :, rest], rtol=0, atol=ATOL)
    if w is not None:
        assert w[:, :, i].isnan().all() and not w[:, :, rest].isnan().any()


@given(sdpa_inputs(masks=False), st.data(), st.sampled_from(["math", "sdpa"]))
def test_nan_in_a_key_reaches_every_row_that_may_attend_it(inputs, data, backend):
    """math: every row that may attend the key is NaN. sdpa: each such row is NaN or — for small
    shapes — all zeros (PyTorch's CPU kernel, as for NaN queries; documented)."""
    q, k, v, _, _, scale, causal = inputs
    j = data.draw(st.integers(0, k.shape[2] - 1))
    bad = k.clone()
    bad[:, :, j] = float("nan")
    out, _ = functional.scaled_dot_product_attention(q, bad, v, is_causal=causal, scale=scale, backend=backend)
    clean, _ = functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, backend=backend)
    rows = torch.arange(q.shape[2])
    sees = rows >= j if causal else torch.ones_like(rows, dtype=torch.bool)  # (L,) rows that may attend key j
    for r in rows[sees].tolist():
        row = out[:, :, r]
        assert row.isnan().all() or (backend == "sdpa" and (row == 0).all()), (r, row)
    torch.testing.assert_close(out[:, :, ~sees], clean[:, :, ~sees], rtol=0, atol=ATOL)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_minus_inf_float_mask_is_fine_and_plus_inf_or_nan_gives_nan_rows(backend):
    """−inf in a float mask = blocked (equal to the bool mask, property above); +inf or NaN entries are
    not checked for (it would cost a pass over the mask) and make their rows NaN."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    all_blocked = torch.full((4, 4), float("-inf"), dtype=torch.float64)
    out, _ = functional.scaled_dot_product_attention(q, k, v, bias=all_blocked, backend=backend)
    assert (out == 0).all()  # every key blocked: zero output, no NaN
    for value in (float("inf"), float("nan")):
        bias = torch.zeros(4, 4, dtype=torch.float64)
        bias[2, 1] = value
        out, _ = functional.scaled_dot_product_attention(q, k, v, bias=bias, backend=backend)
        assert out[:, :, 2].isnan().all() and not out[:, :, [0, 1, 3]].isnan().any()
