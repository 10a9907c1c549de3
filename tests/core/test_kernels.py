"""The compiled decode kernels (``headwise.core.kernels``) against the readable maths, whole tensors.

- the split-key one-query attention: any B, H, Hkv, S (across block boundaries), head widths, float32 or bf16
  entries, strided cache views, masks with fully blocked rows, one or two threads — against
  ``attention_math`` in float64 on the same (bf16-rounded) entries, ≤ 1e-6;
- the few-row linear against ``F.linear`` in float64;
- the compiled decode step of a module (Q/K/V, RoPE, cache write, attention, ``Wo`` in one call) against the
  same module on ``backend="math"``, token by token, ≤ 1e-6, with the caches' contents, positions and ring
  slots equal; the calls it must leave to the usual path.
"""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

import headwise
from _helpers import float32_tol
from headwise.core import decode, kernels, one_query
from headwise.core.functional import attention_math

pytestmark = pytest.mark.skipif(not kernels.available(), reason="Numba is not available here")

TOL = 1e-6


def _reference(q, k, v, blocked, bias, scale):
    """``attention_math`` in float64 on the entries as stored (bf16 rounded), GQA by repeating heads."""
    G = q.shape[1] // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(G, dim=1) for t in (k, v))
    return attention_math(q.double(), k64, v64, blocked=blocked, bias=bias, scale=scale)[0]


# Each head width, group size and entry dtype is compiled once per machine (Numba's cache): few of them here.
@settings(max_examples=30, deadline=None)
@given(
    B=st.integers(1, 3),
    Hkv=st.sampled_from([1, 2, 4]),
    G=st.sampled_from([1, 3]),
    S=st.integers(1, 700),
    Dh=st.sampled_from([8, 64]),
    Dv=st.sampled_from([None, None, 24]),
    spare=st.integers(0, 5),
    bf16=st.booleans(),
    masked=st.sampled_from(["none", "blocked", "bias", "both"]),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
@example(B=1, Hkv=2, G=3, S=497, Dh=64, Dv=None, spare=5, bf16=True, masked="none", threads=1, seed=1)  # 3.3e-6
@pytest.mark.slow
def test_one_query_attention_equals_the_maths(B, Hkv, G, S, Dh, Dv, spare, bf16, masked, threads, seed):
    torch.manual_seed(seed)
    H, Dv = Hkv * G, Dv or Dh
    dtype = torch.bfloat16 if bf16 else torch.float32
    q = torch.randn(B, H, 1, Dh)
    buf_k = torch.randn(B, Hkv, S + spare, Dh).to(dtype)  # a cache's buffer; its first S slots are the keys
    buf_v = torch.randn(B, Hkv, S + spare, Dv).to(dtype)
    buf_k[:, :, S:] = 1e4  # slots past the keys must get no weight
    k, v = buf_k[:, :, :S], buf_v[:, :, :S]
    blocked = bias = None
    if masked in ("blocked", "both"):
        blocked = torch.rand(B, H, 1, S) < 0.4
        blocked[0, 0] = True  # a row with no key left: zeros
    if masked in ("bias", "both"):
        bias = torch.randn(B, 1, 1, S)
    scale = 0.3
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        add = one_query.kernel_bias(blocked, bias, H, k)
        got = kernels.attention_one_query(q, k, v, add, scale)
    finally:
        torch.set_num_threads(before)
    want = _reference(q, k, v, blocked, bias, scale)
    assert got.shape == (B, H, 1, Dv) and got.dtype == torch.float32
    # float32 sums over S keys: round-off grows as √S (measured 3.3e-6 at S = 497); 4·ε·√S bounds it, well below any
    # error of the maths (a wrong mask or scale moves the outputs by 1e-2 and more)
    tol = float32_tol(S)
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    if blocked is not None:
        assert torch.equal(got[0, 0], torch.zeros(1, Dv))


@pytest.mark.slow
def test_long_prefix_and_blocks_cover_every_key():
    torch.manual_seed(0)
    for S, Hkv, G in ((5000, 1, 12), (4096, 12, 1), (257, 4, 3)):
        q, k, v = torch.randn(1, Hkv * G, 1, 64), torch.randn(1, Hkv, S, 64), torch.randn(1, Hkv, S, 64)
        got = kernels.attention_one_query(q, k, v, None, 0.125)
        torch.testing.assert_close(got.double(), _reference(q, k, v, None, None, 0.125), rtol=TOL, atol=TOL)
    for S in (1, 255, 256, 4097, 100_000):
        for heads, G, threads in ((1, 12, 2), (12, 1, 2), (4, 3, 1), (64, 1, 16)):
            block = kernels.keys_per_block(S, heads, G, threads)
            tasks = heads * -(-S // block)
            assert block >= 1 and G * block * 4 <= max(kernels.SCORE_BYTES, G * kernels.MIN_BLOCK * 4)
            assert tasks >= min(kernels.TASKS_PER_THREAD * threads, heads * -(-S // kernels.MIN_BLOCK))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_linear_rows_equals_f_linear(rows, bias):
    torch.manual_seed(rows)
    w, b = torch.randn(300, 130), torch.randn(300) if bias else None
    x = torch.randn(rows, 1, 130)
    assert not kernels.linear_rows_applies(x, w, b)  # a small weight stays with oneDNN
    big = torch.randn(kernels.PARALLEL_BYTES // (4 * 130) + 1, 130)
    assert kernels.linear_rows_applies(x, big, None)
    got = kernels.linear_rows(x, w, b)
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert got.shape == (rows, 1, 300)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(
        kernels.linear_rows(x, big).double(), F.linear(x.double(), big.double()), rtol=1e-6, atol=1e-5
    )
    assert not kernels.linear_rows_applies(torch.randn(9, 130), big, None)  # more rows: a GEMM
    assert not kernels.linear_rows_applies(x.double(), big.double(), None)


def _against_math(m, x, prefill, caches):
    """``m`` and a copy of it on ``backend="math"`` decode ``x`` after ``prefill`` tokens into ``caches[0]``
    and ``caches[1]``: ``(got, want, calls of the compiled step)``."""
    ref = copy.deepcopy(m)
    ref.backend = "math"
    with mock.patch.object(decode, "step", wraps=decode.step) as spy:
        got = _decode(m, x, prefill, caches[0])
    return got, _decode(ref, x, prefill, caches[1]), spy.call_count


def _decode(m, x, prefill, cache):
    with torch.no_grad():
        m(x[:, :prefill], is_causal=True, cache=cache)
        return torch.cat([m(x[:, t : t + 1], is_causal=True, cache=cache)[0] for t in range(prefill, x.shape[1])], 1)


CASES = {
    "mha": {},
    "gqa-rope": {"num_kv_heads": 2, "positional": "half"},
    "mqa-interleaved": {"num_kv_heads": 1, "positional": "interleaved"},
    "yarn": {"num_kv_heads": 2, "positional": "yarn"},
    "no-bias-scale": {"bias": False, "scale": 0.2, "positional": "half"},
    "window": {"sliding_window": 3, "positional": "half"},
}


def _module(positional=None, **kw):
    rope = {
        None: None,
        "half": headwise.RotaryEmbedding(8),
        "interleaved": headwise.RotaryEmbedding(8, convention="interleaved"),
        "yarn": headwise.RotaryEmbedding(
            8, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
        ),
    }[positional]
    return headwise.MultiHeadAttention(32, 4, positional=rope, **kw).eval()


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_decode_step_equals_the_math_path(case, dtype, batch):
    torch.manual_seed(7)
    m = _module(**CASES[case])
    x = torch.randn(batch, 13, 32)
    caches = [headwise.KVCache(batch, 13, m.num_kv_heads, 8, dtype=dtype) for _ in range(2)]
    got, want, calls = _against_math(m, x, 4, caches)
    assert calls == 9
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    a, b = caches
    assert a.length == b.length and torch.equal(a.positions, b.positions)
    for got_t, want_t in ((a.k, b.k), (a.v, b.v)):  # the cached keys and values: equal up to round-off
        tol = 1e-6 if dtype == torch.float32 else 2**-7 * float(want_t.abs().max())  # one bf16 step at most
        torch.testing.assert_close(got_t.float(), want_t.float(), rtol=0, atol=tol)


@pytest.mark.parametrize("window, ring, sinks", [(5, 5, 0), (5, 5, 2), (3, 6, 0), (None, 4, 1)])
def test_decode_step_over_a_ring_equals_the_math_path(window, ring, sinks):
    torch.manual_seed(1)
    m = _module(num_kv_heads=2, positional="half", sliding_window=window)
    x = torch.randn(2, 17, 32)
    caches = [headwise.SlidingWindowCache(2, ring, 2, 8, sink_tokens=sinks) for _ in range(2)]
    got, want, calls = _against_math(m, x, 3, caches)
    assert calls == 14
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    a, b = caches
    assert a.length == b.length and torch.equal(a.slots, b.slots) and torch.equal(a.positions, b.positions)
    torch.testing.assert_close(a.k, b.k, rtol=0, atol=TOL)
    torch.testing.assert_close(a.v, b.v, rtol=0, atol=TOL)


def test_calls_the_decode_step_leaves_to_the_usual_path():
    torch.manual_seed(2)
    x = torch.randn(2, 6, 32)
    hooked = _module()
    hooked.hook_heads.add_hook(lambda t: t * 0.5)
    alibi = headwise.MultiHeadAttention(32, 4, positional=headwise.ALiBi(4)).eval()
    cases = {
        "math backend": (_module(backend="math"), {}, {}),
        "hooked heads": (hooked, {}, {}),
        "qk-norm": (_module(qk_norm="head"), {}, {}),
        "softcap": (_module(softcap=20.0), {}, {}),
        "sinks": (_module(sinks=True), {}, {}),
        "alibi": (alibi, {}, {}),
        "padding mask": (_module(), {"key_padding_mask": torch.zeros(2, 6, dtype=torch.bool)}, {}),
        "positions given": (_module(), {"position_ids": torch.tensor([5])}, {}),
        "weights asked for": (_module(), {"need_weights": True}, {}),
        "bf16 ring": (_module(sliding_window=3), {}, {"ring": torch.bfloat16}),
    }
    for name, (m, call, how) in cases.items():
        if "ring" in how:
            cache = headwise.SlidingWindowCache(2, 3, m.num_kv_heads, 8, dtype=how["ring"])
        else:
            cache = headwise.KVCache(2, 6, m.num_kv_heads, 8)
        with torch.no_grad(), mock.patch.object(decode, "step", wraps=decode.step) as spy:
            m(x[:, :5], is_causal=True, cache=cache)
            m(x[:, 5:], is_causal=True, cache=cache, **call)
        assert spy.call_count == 0, name
    m = _module()  # autograd records: the differentiable path
    cache = headwise.KVCache(2, 6, 4, 8)
    with mock.patch.object(decode, "step", wraps=decode.step) as spy:
        m(x[:, :5], is_causal=True, cache=cache)
        out = m(x[:, 5:], is_causal=True, cache=cache)[0]
    assert spy.call_count == 0 and out.requires_grad


def test_a_full_cache_still_raises_its_error():
    m = _module()
    cache = headwise.KVCache(1, 3, 4, 8)
    x = torch.randn(1, 4, 32)
    with torch.no_grad():
        m(x[:, :3], is_causal=True, cache=cache)
        with pytest.raises(ValueError, match="exceeds its capacity of 3"):
            m(x[:, 3:], is_causal=True, cache=cache)
    assert cache.length == 3


def test_kernels_use_torchs_thread_count():
    """Torch's thread count; one thread for a kernel on its own over little data (``kernels.PARALLEL_BYTES``).
    (Two threads where Numba has them: ``HEADWISE_TEST_THREADS=2``; the suite gives it torch's one, conftest.py.)"""
    import numba

    small = torch.randn(1, 4, 30, 8)
    big = torch.randn(1, 4, kernels.PARALLEL_BYTES // (4 * 8 * 4) + 1, 8)  # K alone past PARALLEL_BYTES
    q = torch.randn(1, 4, 1, 8)
    m = _module()
    before = torch.get_num_threads()
    try:
        for n in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            torch.set_num_threads(n)
            kernels.attention_one_query(q, small, small, None, 1.0)
            assert numba.get_num_threads() == 1
            kernels.attention_one_query(q, big, big, None, 1.0)
            assert numba.get_num_threads() == n
            kernels.attention_one_query(q, small, small, None, 1.0)
            cache = headwise.KVCache(1, 4, 4, 8)
            with torch.no_grad():
                m(torch.randn(1, 1, 32), is_causal=True, cache=cache)  # the compiled decode step: torch's count
            assert numba.get_num_threads() == n
    finally:
        torch.set_num_threads(before)
