"""The NumPy reference's modern kinds: sliding windows, soft-capping, sinks, QK-norm, YaRN, latent attention.

Cases whose answers can be written down by hand, plus the pieces Hugging Face computes as pure functions
(YaRN frequencies, GPT-OSS's and Gemma 2's eager attention) compared whole.
"""

import math

import numpy as np
import pytest

import headwise.reference as ref


def test_window_mask_keeps_the_last_w_keys():
    blocked = ref.causal_mask(np.arange(5), np.arange(5), window=2)
    allowed = [list(np.flatnonzero(~row)) for row in blocked]
    assert allowed == [[0], [0, 1], [1, 2], [2, 3], [3, 4]]
    # the window alone (no causality): keys j > i - W
    w = ref.window_mask(np.arange(3), np.arange(3), 1)
    np.testing.assert_array_equal(w, [[False] * 3, [True, False, False], [True, True, False]])


@pytest.mark.parametrize("window", [0, -1, 1.5, True, None])
def test_window_must_be_a_positive_integer(window):
    with pytest.raises(ValueError, match=r"window: expected a positive integer, got"):
        ref.window_mask(np.arange(3), np.arange(3), window)


def test_sliding_window_sdpa_equals_a_banded_bool_mask():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 2, 3, 6, 4))
    band = ref.causal_mask(np.arange(6), np.arange(6), window=3)
    a = ref.scaled_dot_product_attention(q, k, v, is_causal=True, window=3)
    b = ref.scaled_dot_product_attention(q, k, v, mask=band)
    np.testing.assert_array_equal(a[1], b[1])
    assert (a[1][..., 5, :3] == 0).all() and np.allclose(a[1].sum(-1), 1.0)


def test_softcap_by_hand():
    # one query, two keys, scores 2c and 0 before the cap: c·tanh(2) and 0 after.
    c, dh = 5.0, 1
    q, k, v = np.array([[2 * c]]), np.array([[1.0], [0.0]]), np.array([[1.0], [0.0]])
    _, w = ref.scaled_dot_product_attention(q, k, v, scale=1.0, softcap=c)
    e = math.exp(c * math.tanh(2.0))
    np.testing.assert_allclose(w, [[e / (e + 1), 1 / (e + 1)]], rtol=1e-15)
    assert dh == q.shape[-1]


@pytest.mark.parametrize("cap", [0.0, -1.0, float("inf"), "50"])
def test_softcap_must_be_positive(cap):
    with pytest.raises(ValueError, match=r"softcap: expected a positive number"):
        ref.scaled_dot_product_attention(np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 2)), softcap=cap)


def test_sinks_by_hand():
    # equal scores over two keys and a sink logit ln 2: weights 1/4, 1/4 (the sink takes 1/2).
    q = np.zeros((2, 1, 3))  # (H, L, Dh)
    k, v = np.ones((2, 2, 3)), np.array([[[4.0], [8.0]]] * 2)
    out, w = ref.scaled_dot_product_attention(q, k, v, sinks=np.array([math.log(2.0), -np.inf]))
    np.testing.assert_allclose(w[0], [[0.25, 0.25]], rtol=1e-15)
    np.testing.assert_allclose(w[1], [[0.5, 0.5]], rtol=1e-15)  # a -inf sink is no sink
    np.testing.assert_allclose(out[0], [[3.0]], rtol=1e-15)


def test_sinks_leave_a_fully_masked_row_at_zero():
    q, k, v = np.ones((2, 2, 2)), np.ones((2, 2, 2)), np.ones((2, 2, 2))
    out, w = ref.scaled_dot_product_attention(q, k, v, mask=np.array([[True, True], [False, True]]), sinks=np.zeros(2))
    assert (w[:, 0] == 0).all() and (out[:, 0] == 0).all()
    # score q·k/√2 = √2 against the sink's 0
    np.testing.assert_allclose(w[:, 1, 0], 1 / (1 + math.exp(-math.sqrt(2))), rtol=1e-15)


def test_sinks_must_match_the_heads():
    with pytest.raises(ValueError, match=r"sinks: expected shape \(H,\)=\(2,\).*got \(3,\)"):
        ref.scaled_dot_product_attention(np.ones((2, 1, 2)), np.ones((2, 1, 2)), np.ones((2, 1, 2)), sinks=np.ones(3))


def test_rms_norm_by_hand():
    np.testing.assert_allclose(
        ref.rms_norm([3.0, 4.0], [1.0, 2.0], eps=0.0), [3 / math.sqrt(12.5), 8 / math.sqrt(12.5)]
    )


def test_qk_norm_head_and_full_differ_by_where_they_normalise():
    rng = np.random.default_rng(2)
    D, H, Dh = 8, 2, 4
    p = {n: rng.normal(size=(D, H * Dh)) for n in ("wq", "wk", "wv")} | {"wo": rng.normal(size=(H * Dh, D))}
    x = rng.normal(size=(5, D))
    head = dict(p, q_norm=np.ones(Dh), k_norm=np.ones(Dh))
    full = dict(p, q_norm=np.ones(H * Dh), k_norm=np.ones(H * Dh))
    _, w_head = ref.multi_head_attention(x, head, H, qk_norm="head", norm_eps=0.0)
    _, w_full = ref.multi_head_attention(x, full, H, qk_norm="full", norm_eps=0.0)
    # per head, every q and k has norm sqrt(Dh): scores q·k/sqrt(Dh) lie in [-sqrt(Dh), sqrt(Dh)]
    q = ref.split_heads(ref.rms_norm(ref.split_heads(x @ p["wq"], H), eps=0.0).swapaxes(-2, -3).reshape(5, -1), H)
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), math.sqrt(Dh), rtol=1e-14)
    assert not np.allclose(w_head, w_full)
    with pytest.raises(ValueError, match=r"qk_norm: expected one of \(None, 'head', 'full'\), got 'layer'"):
        ref.multi_head_attention(x, head, H, qk_norm="layer")


# -- YaRN --------------------------------------------------------------------------------------------------

YARN_CASES = [
    dict(factor=4.0, original_max_position_embeddings=32),
    dict(factor=8.0, original_max_position_embeddings=64, beta_fast=16, beta_slow=2, truncate=False),
    dict(factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0),  # DeepSeek-V3
    dict(factor=32.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0, truncate=False),  # GPT-OSS
    dict(factor=2.0, original_max_position_embeddings=16, attention_factor=0.7),
]


@pytest.mark.parametrize("case", YARN_CASES)
@pytest.mark.parametrize("head_dim,base", [(16, 10000.0), (64, 150000.0)])
def test_yarn_equals_hugging_face(case, head_dim, base):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "yarn", "rope_theta": base, **case}
    config = transformers.LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        rope_parameters=params,
        max_position_embeddings=4 * case["original_max_position_embeddings"],
    )
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    scaling = {"rope_type": "yarn", **case}
    np.testing.assert_allclose(ref.rope_frequencies(head_dim, base, scaling), inv.double().numpy(), rtol=2e-6)
    assert ref.rope_attention_factor(scaling) == pytest.approx(factor, rel=1e-12)


def test_yarn_by_hand():
    # truncate: low = floor(d(32)), high = ceil(d(1)); pairs below low keep θ, above high get θ / s.
    dh, base, s, L0 = 32, 10000.0, 4.0, 4096
    scaling = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0}
    theta = ref.rope_frequencies(dh, base)
    d = [dh * math.log(L0 / (r * 2 * math.pi)) / (2 * math.log(base)) for r in (32, 1)]
    low, high = math.floor(d[0]), math.ceil(d[1])
    assert 0 < low < high < dh // 2  # (5, 12): three bands
    got = ref.rope_frequencies(dh, base, scaling)
    np.testing.assert_allclose(got[: low + 1], theta[: low + 1], rtol=1e-15)
    np.testing.assert_allclose(got[high:], theta[high:] / s, rtol=1e-15)
    assert ref.rope_attention_factor(scaling) == pytest.approx(0.1 * math.log(s) + 1)
    # the attention factor multiplies the rotated vector: |rope(x)| = factor · |x|
    x = np.random.default_rng(0).normal(size=(3, dh))
    y = ref.apply_rope(x, np.arange(3), base, scaling=scaling)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), (0.1 * math.log(s) + 1) * np.linalg.norm(x, axis=-1))


def test_unknown_rope_type_is_refused():
    with pytest.raises(ValueError, match=r"scaling: expected rope_type one of .*got 'longrope'"):
        ref.rope_frequencies(8, scaling={"rope_type": "longrope"})


# -- hugging face's eager functions ------------------------------------------------------------------------


def test_sinks_and_window_equal_gpt_oss_eager():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    rng = np.random.default_rng(3)
    B, H, Hkv, L, Dh, W = 2, 4, 2, 7, 8, 3
    q, k, v = rng.normal(size=(B, H, L, Dh)), rng.normal(size=(B, Hkv, L, Dh)), rng.normal(size=(B, Hkv, L, Dh))
    sinks = rng.normal(size=H)
    blocked = ref.causal_mask(np.arange(L), np.arange(L), window=W)

    class M(torch.nn.Module):
        num_key_value_groups, training = H // Hkv, False

    m = M()
    m.sinks = torch.tensor(sinks)
    t = [torch.tensor(a) for a in (q, k, v)]
    out, w = eager_attention_forward(m, *t, torch.tensor(np.where(blocked, -np.inf, 0.0)), scaling=Dh**-0.5)
    mine_out, mine_w = ref.scaled_dot_product_attention(
        q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), is_causal=True, window=W, sinks=sinks
    )
    np.testing.assert_allclose(mine_w, w.numpy(), atol=1e-14)
    np.testing.assert_allclose(mine_out, out.transpose(1, 2).numpy(), atol=1e-14)


def test_softcap_equals_gemma2_eager():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    rng = np.random.default_rng(4)
    q, k, v = 6 * rng.normal(size=(3, 1, 2, 5, 8))
    blocked = ref.causal_mask(np.arange(5), np.arange(5))

    class M(torch.nn.Module):
        num_key_value_groups, training, head_dim = 1, False, 8

    t = [torch.tensor(a) for a in (q, k, v)]
    out, w = eager_attention_forward(M(), *t, torch.tensor(np.where(blocked, -np.inf, 0.0)), scaling=0.3, softcap=2.0)
    mine_out, mine_w = ref.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, softcap=2.0)
    # Gemma 2's eager path takes its softmax in float32 whatever the input: float32 round-off
    np.testing.assert_allclose(mine_w, w.numpy(), atol=1e-6)
    np.testing.assert_allclose(mine_out, out.transpose(1, 2).numpy(), atol=1e-6)
    uncapped = ref.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)[1]
    assert np.abs(mine_w - uncapped).max() > 0.1  # the cap is active (6σ inputs, cap 2)


# -- latent attention ---------------------------------------------------------------------------------------


def _mla_params(rng, D, H, Rq, R, Dn, Dr, Dv, bias=False):
    p = {
        "wkv_a": rng.normal(size=(D, R + Dr)) / math.sqrt(D),
        "kv_norm": 1 + 0.1 * rng.normal(size=R),
        "wkv_b": rng.normal(size=(R, H * (Dn + Dv))) / math.sqrt(R),
        "wo": rng.normal(size=(H * Dv, D)) / math.sqrt(H * Dv),
    }
    if Rq:
        p |= {
            "wq_a": rng.normal(size=(D, Rq)) / math.sqrt(D),
            "q_norm": 1 + 0.1 * rng.normal(size=Rq),
            "wq_b": rng.normal(size=(Rq, H * (Dn + Dr))),
        }
    else:
        p["wq"] = rng.normal(size=(D, H * (Dn + Dr)))
    if bias:
        p |= {"bq_a": rng.normal(size=Rq), "bkv_a": rng.normal(size=R + Dr), "bo": rng.normal(size=D)}
    return p


@pytest.mark.parametrize("Rq,bias", [(6, False), (0, False), (6, True)])
def test_latent_absorbed_equals_plain(Rq, bias):
    rng = np.random.default_rng(5)
    D, H, R, Dn, Dr, Dv = 16, 3, 5, 4, 2, 6
    sizes = dict(kv_lora_rank=R, qk_nope_head_dim=Dn, qk_rope_head_dim=Dr, v_head_dim=Dv)
    p = _mla_params(rng, D, H, Rq, R, Dn, Dr, Dv, bias)
    x = rng.normal(size=(2, 7, D))
    rope = {
        "convention": "interleaved",
        "scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4},
    }
    for kw in (
        {},
        {"causal": True, "rope": rope},
        {"causal": True, "sliding_window": 3, "positions": np.arange(3, 10)},
    ):
        a = ref.latent_attention(x, p, H, **sizes, **kw)
        b = ref.latent_attention(x, p, H, **sizes, absorbed=True, **kw)
        np.testing.assert_allclose(b[0], a[0], atol=1e-12)
        np.testing.assert_allclose(b[1], a[1], atol=1e-13)


def test_latent_attention_is_mha_with_expanded_weights():
    # With rope dims only (Dn = 0 is not allowed in practice, but R = full rank makes the latent invertible):
    # latent attention equals multi-head attention whose W_K, W_V are the composed products.
    rng = np.random.default_rng(6)
    D, H, R, Dn, Dr, Dv = 8, 2, 8, 4, 2, 3
    p = _mla_params(rng, D, H, 0, R, Dn, Dr, Dv)
    p["kv_norm"] = np.ones(R)
    x = rng.normal(size=(5, D))
    out, w = ref.latent_attention(
        x, p, H, kv_lora_rank=R, qk_nope_head_dim=Dn, qk_rope_head_dim=Dr, v_head_dim=Dv, causal=True, norm_eps=0.0
    )
    # by hand: normalised latent, keys = [c W_UK_h, k_pe], values c W_UV_h
    kv = x @ p["wkv_a"]
    c = kv[:, :R] / np.sqrt(np.mean(kv[:, :R] ** 2, axis=-1, keepdims=True))
    up = (c @ p["wkv_b"]).reshape(5, H, Dn + Dv)
    q = (x @ p["wq"]).reshape(5, H, Dn + Dr)
    scores = np.einsum("lhd,shd->hls", q[..., :Dn], up[..., :Dn]) + np.einsum("lhd,sd->hls", q[..., Dn:], kv[:, R:])
    scores = scores / math.sqrt(Dn + Dr) + np.where(np.triu(np.ones((5, 5)), 1) > 0, -np.inf, 0.0)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    weights = e / e.sum(-1, keepdims=True)
    o = np.einsum("hls,shv->lhv", weights, up[..., Dn:]).reshape(5, H * Dv) @ p["wo"]
    np.testing.assert_allclose(w, weights, atol=1e-14)
    np.testing.assert_allclose(out, o, atol=1e-13)
