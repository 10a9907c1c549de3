"""Sliding windows, soft-capping and sinks in ``functional``: every path equals the readable one.

The readable path (``backend="math"``, :func:`attention_math`) is checked by hand on small cases here and
against the NumPy reference elsewhere; the kernel path (``F.scaled_dot_product_attention`` for windows)
and the blocked path (weights, soft-capping, sinks) must equal it: float64, ≤ 1e-12, outputs, weights and
gradients, with GQA, padding, offsets and fully masked rows.
"""

import math

import pytest
import torch

import headwise
from headwise import functional
from headwise.core import blocked as blocked_path
from headwise.core import masks
from headwise.core.call import AttentionCall

TOL = 1e-12


def _qkv(B=2, H=4, Hkv=2, L=7, S=7, Dh=8, Dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, Dh, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, Dh, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, Dv or Dh, generator=g, dtype=torch.float64)
    return q, k, v


def test_window_mask_by_hand():
    got = masks.causal(torch.arange(5), torch.arange(5), window=2)
    want = torch.tensor(
        [
            [0, 1, 1, 1, 1],
            [0, 0, 1, 1, 1],
            [1, 0, 0, 1, 1],
            [1, 1, 0, 0, 1],
            [1, 1, 1, 0, 0],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(got, want)
    assert masks.causal_slots(1, 4, offset=3) is None  # one token after a cache sees every key
    assert masks.causal_slots(1, 4, offset=3, window=4) is None
    assert torch.equal(masks.causal_slots(1, 4, offset=3, window=2), torch.tensor([[1, 1, 0, 0]], dtype=torch.bool))


def test_sinks_and_softcap_by_hand():
    q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)  # (1, 1, 1, 2)
    k = torch.tensor([[[[2.0, 0.0], [0.0, 0.0]]]], dtype=torch.float64)  # scores 2/√2 and 0
    v = torch.tensor([[[[1.0], [3.0]]]], dtype=torch.float64)
    sink = torch.tensor([0.5], dtype=torch.float64)
    s = [2 / math.sqrt(2), 0.0]
    z = math.exp(s[0]) + math.exp(s[1]) + math.exp(0.5)
    out, w = functional.scaled_dot_product_attention(q, k, v, sinks=sink, need_weights=True, backend="math")
    torch.testing.assert_close(w[0, 0, 0], torch.tensor([math.exp(s[0]) / z, math.exp(s[1]) / z], dtype=torch.float64))
    torch.testing.assert_close(
        out[0, 0, 0, 0], torch.tensor((math.exp(s[0]) + 3 * math.exp(s[1])) / z, dtype=torch.float64)
    )
    c = 1.0
    _, w = functional.scaled_dot_product_attention(q, k, v, softcap=c, need_weights=True, backend="math")
    capped = [c * math.tanh(x / c) for x in s]
    e = [math.exp(x) for x in capped]
    torch.testing.assert_close(w[0, 0, 0], torch.tensor([e[0] / sum(e), e[1] / sum(e)], dtype=torch.float64))


KINDS = {
    "window": {"is_causal": True, "window": 3},
    "softcap": {"softcap": 1.5},
    "sinks": {"sinks": True},
    "window+sinks": {"is_causal": True, "window": 2, "sinks": True},  # GPT-OSS
    "window+softcap": {"is_causal": True, "window": 4, "softcap": 2.0},  # Gemma 2 local layers
    "causal+softcap+sinks": {"is_causal": True, "softcap": 0.7, "sinks": True},
}


def _kw(kind, H):
    kw = dict(KINDS[kind])
    if kw.get("sinks"):
        kw["sinks"] = torch.linspace(-1.0, 2.0, H, dtype=torch.float64)
    return kw


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("hkv", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("padded", [False, True])
def test_every_path_equals_the_math_path(kind, hkv, padded, monkeypatch):
    monkeypatch.setattr(blocked_path, "WEIGHTS_CHUNK", 20)  # blocks split heads and query rows
    q, k, v = _qkv(Hkv=hkv, L=9, S=9, Dv=5)
    kw = _kw(kind, 4)
    blocked = None
    if padded:
        blocked = torch.zeros(2, 1, 1, 9, dtype=torch.bool)
        blocked[1, ..., :4] = True  # left padding: item 1's first rows see no key under causality
    want, w_want = functional.scaled_dot_product_attention(
        q, k, v, blocked=blocked, need_weights=True, backend="math", **kw
    )
    for backend in ("auto", "sdpa"):
        got, w_got = functional.scaled_dot_product_attention(
            q, k, v, blocked=blocked, need_weights=True, backend=backend, **kw
        )
        torch.testing.assert_close(got, want, atol=TOL, rtol=0)
        torch.testing.assert_close(w_got, w_want, atol=TOL, rtol=0)
        got, none = functional.scaled_dot_product_attention(q, k, v, blocked=blocked, backend=backend, **kw)
        assert none is None
        torch.testing.assert_close(got, want, atol=TOL, rtol=0)
        _, w_avg = functional.scaled_dot_product_attention(
            q, k, v, blocked=blocked, need_weights=True, average_heads=True, backend=backend, **kw
        )
        torch.testing.assert_close(w_avg, w_want.mean(1), atol=TOL, rtol=0)
    assert not want.isnan().any()
    if padded and kw.get("is_causal"):
        assert (want[1, :, :4] == 0).all() and (w_want[1, :, :4] == 0).all()  # rows with no key left


@pytest.mark.parametrize("kind", list(KINDS))
def test_gradients_of_every_path_equal_the_math_path(kind, monkeypatch):
    monkeypatch.setattr(blocked_path, "WEIGHTS_CHUNK", 20)
    q, k, v = _qkv(Hkv=2, L=6, S=6)
    kw = _kw(kind, 4)
    blocked = torch.zeros(2, 1, 1, 6, dtype=torch.bool)
    blocked[0, ..., :2] = True
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    if "sinks" in kw:
        leaves.append(kw["sinks"].requires_grad_(True))
    grads = {}
    for backend in ("math", "auto"):
        out, w = functional.scaled_dot_product_attention(
            q, k, v, blocked=blocked, need_weights=True, backend=backend, **kw
        )
        loss = (out**2).sum() + (w * torch.arange(6.0, dtype=torch.float64)).sum()
        grads[backend] = torch.autograd.grad(loss, leaves)
    for a, b in zip(grads["auto"], grads["math"]):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def test_windowed_decoding_after_a_cache_equals_full_rows():
    q, k, v = _qkv(L=10, S=10)
    full, _ = functional.attend(q, k, v, AttentionCall(is_causal=True, window=3, backend="math"))
    for backend in ("math", "auto"):
        for t in range(10):
            row, _ = functional.attend(
                q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1],
                AttentionCall(is_causal=True, q_offset=t, window=3, backend=backend),
            )  # fmt: skip
            torch.testing.assert_close(row, full[:, :, t : t + 1], atol=TOL, rtol=0)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"is_causal": True, "window": 0}, "window: expected a positive integer, got 0"),
        ({"window": 3}, "window: a sliding window needs is_causal=True"),
        ({"softcap": 0.0}, "softcap: expected a positive number, got 0.0"),
        ({"softcap": -2}, "softcap: expected a positive number, got -2"),
        ({"sinks": torch.zeros(3)}, r"sinks: expected a float tensor of shape \(H,\)=\(4,\)"),
        ({"backend": "flash"}, "backend: expected one of"),
    ],
)
def test_bad_kind_arguments_name_themselves(kw, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        functional.scaled_dot_product_attention(q, k, v, **kw)


def test_dead_rows_equal_torch_all_on_every_layout():
    g = torch.Generator().manual_seed(3)
    base = torch.rand(3, 1, 6, 5, generator=g) < 0.7
    base[0, 0, 2] = True  # one row fully blocked
    for m in (base, base.transpose(-1, -2), base.expand(3, 4, 6, 5), base[..., ::2]):
        bias = torch.where(torch.rand(m.shape, generator=g) < 0.5, float("-inf"), 0.0)
        for blocked, b in ((m, None), (None, bias), (m, bias)):
            full = (blocked if blocked is not None else torch.zeros_like(m)) | (
                torch.isneginf(b) if b is not None else torch.zeros_like(m)
            )
            want = full.all(-1, keepdim=True)
            got = masks.dead_rows(blocked, b)
            assert torch.equal(got if got is not None else torch.zeros_like(want), want)


@pytest.mark.parametrize("backend", ["math", "auto"])
def test_a_bias_in_another_dtype_is_read_in_the_queries_dtype(backend):
    """A float64 bias (ALiBi's table) under float32 queries: every path computes the scores in float32 and
    agrees with the float64 reference."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 4, 5, 8) for _ in range(3))
    bias = headwise.ALiBi(4).score_bias(torch.arange(5), torch.arange(5)).double()
    out, _ = functional.scaled_dot_product_attention(q, k, v, bias=bias, is_causal=True, backend=backend)
    want, _ = functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), bias=bias, is_causal=True, backend="math"
    )
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-6)
