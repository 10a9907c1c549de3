"""The weights' circuits: composition scores against the full (D, D) matrices formed explicitly, the norms'
folding against the model's own queries and writes, the eig(AB) = eig(BA) copying score against the full
(V, V) eigendecomposition, top tokens and token pairs against the full matrices."""

from __future__ import annotations

import pytest
import torch

from _patching_models import Stack, hf_model
from headwise.circuits import (
    composition,
    composition_scores,
    copying_scores,
    head_weights,
    ov_top_tokens,
    qk_top_pairs,
)

pytest.importorskip("transformers")

CASES = ["llama", "gpt2", "gemma2", "qwen3", "olmo2", "phi3"]


def _model(case):
    return Stack() if case == "stack" else hf_model(case)


def _fro_ratio(A, B):
    return torch.linalg.matrix_norm(A @ B) / (torch.linalg.matrix_norm(A) * torch.linalg.matrix_norm(B))


@pytest.mark.parametrize("case", [*CASES, "stack"])
def test_composition_scores_equal_the_full_matrices(case):
    w = head_weights(_model(case))
    NL, H = len(w.W_Q), w.W_Q[0].shape[0]
    fast = composition_scores(w, dtype=torch.float64)
    f32 = composition_scores(w)
    ref = {k: torch.full((NL, H, NL, H), float("nan"), dtype=torch.float64) for k in "qkv"}
    ref_g = {k: torch.full((NL, H, NL, w.W_K[0].shape[0]), float("nan"), dtype=torch.float64) for k in "kv"}
    for ls in range(NL):
        for hs in range(H):
            ov_s = w.W_V[ls][w.group(ls, hs)] @ w.W_O[ls][hs]  # (D, D)
            for lr in range(ls + 1, NL):
                for hr in range(H):
                    g = w.group(lr, hr)
                    qk_r = w.W_Q[lr][hr] @ w.W_K[lr][g].T  # (D, D)
                    ov_r = w.W_V[lr][g] @ w.W_O[lr][hr]
                    ref["q"][ls, hs, lr, hr] = _fro_ratio(ov_s, qk_r)
                    ref["k"][ls, hs, lr, hr] = _fro_ratio(ov_s, qk_r.T)
                    ref["v"][ls, hs, lr, hr] = _fro_ratio(ov_s, ov_r)
                for g in range(w.W_K[lr].shape[0]):
                    ref_g["k"][ls, hs, lr, g] = _fro_ratio(ov_s, w.W_K[lr][g])
                    ref_g["v"][ls, hs, lr, g] = _fro_ratio(ov_s, w.W_V[lr][g])
    for kind in "qkv":
        torch.testing.assert_close(getattr(fast, kind).double(), ref[kind].float().double(), equal_nan=True)
        torch.testing.assert_close(getattr(f32, kind).double(), ref[kind], atol=1e-5, rtol=0, equal_nan=True)
    for kind in "kv":
        torch.testing.assert_close(
            getattr(fast, f"{kind}_group").double(), ref_g[kind].float().double(), equal_nan=True
        )
    assert torch.isnan(fast.k[1, :, 0]).all() and torch.isnan(fast.k[:, :, 0]).all()  # no backwards composition
    top = fast.top("k", 3)
    assert top[0][4] == pytest.approx(float(torch.nan_to_num(fast.k, nan=-1).max()))


@pytest.mark.parametrize("case", ["llama", "qwen3"])
def test_senders_a_block_at_a_time_give_the_same_scores(case, monkeypatch):
    w = head_weights(_model(case))
    whole = composition_scores(w, dtype=torch.float64)
    monkeypatch.setattr(composition, "BLOCK_BYTES", 1)  # one sender per block
    blocks = composition_scores(w, dtype=torch.float64)
    for kind in ("q", "k", "v", "k_group", "v_group"):
        torch.testing.assert_close(getattr(blocks, kind), getattr(whole, kind), rtol=1e-12, atol=0, equal_nan=True)


def _layer_input(model, layer):
    seen = {}
    blocks = model.model.layers if hasattr(model, "model") else model.transformer.h

    def pre(_m, a, k):
        seen["x"] = (a[0] if a else k["hidden_states"]).detach().double()

    h = blocks[layer].register_forward_pre_hook(pre, with_kwargs=True)
    return seen, h


@pytest.mark.parametrize("case", ["llama", "gpt2", "gemma2"])
def test_folded_queries_equal_the_model_queries_at_position_zero(case):
    """At position 0 RoPE is the identity: the model's q is (x / σ(x)) W_Q (folded) plus the constant parts."""
    model = hf_model(case)
    w = head_weights(model)
    from headwise.models import HeadModel

    hm = HeadModel(model)
    layer = 1
    seen, h = _layer_input(model, layer)
    ids = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(5))
    try:
        rows = hm.run_with_cache(ids, names=[f"layers.{layer}.attn.qk"])[f"layers.{layer}.attn.qk"]
    finally:
        h.remove()
    x = seen["x"][0]  # (L, D)
    if case == "gpt2":  # 1/σ of the centred x; x itself uncentred: the centring is folded into W_Q
        inv = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    else:
        inv = 1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    x0, x1 = x[0] * inv[0], x[3] * inv[3]
    for head in range(4):
        q = rows.q[0, head].double()
        linear = torch.stack([x0 @ w.W_Q[layer][head], x1 @ w.W_Q[layer][head]])
        if case == "gpt2":  # no rotation anywhere: the difference of two positions removes the constant parts
            torch.testing.assert_close(q[0] - q[3], linear[0] - linear[1], atol=1e-5, rtol=1e-4)
        else:  # no bias: position 0 is the folded product itself
            torch.testing.assert_close(q[0], linear[0], atol=1e-5, rtol=1e-4)


def test_post_norm_gain_folded_into_w_o():
    """Gemma 2: the attention's write is post_norm(o_proj(z)) = (z W_O, gain folded) / rms — same direction."""
    model = hf_model("gemma2")
    w = head_weights(model)
    att = model.model.layers[0]
    z = torch.randn(1, 1, 4 * 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = att.post_attention_layernorm(att.self_attn.o_proj(z))[0, 0].double()
    folded = sum(z[0, 0, h * 8 : (h + 1) * 8].double() @ w.W_O[0][h] for h in range(4))
    torch.testing.assert_close(out / out.norm(), folded / folded.norm(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["llama", "gpt2", "gemma2", "olmo2"])
def test_w_u_w_e_by_slices_of_the_vocabulary_equals_the_whole_product(case, monkeypatch):
    model = _model(case)
    whole = head_weights(model)
    monkeypatch.setattr(composition, "SLICE_BYTES", 4 * whole.W_E.shape[1] * 7)  # 7 rows a slice: many slices
    sliced = head_weights(model, tokens=False)
    assert sliced.W_E is None and sliced.W_U is None
    torch.testing.assert_close(sliced.UE, whole.W_U @ whole.W_E, rtol=1e-12, atol=1e-12)
    a, b = copying_scores(whole), copying_scores(sliced)
    torch.testing.assert_close(b.copying, a.copying, rtol=1e-9, atol=1e-9, equal_nan=True)
    with pytest.raises(
        ValueError,
        match=r"weights: they hold W_U W_E alone \(read from a model opened layer by layer, or with tokens=False\)",
    ):
        ov_top_tokens(sliced, 0, 0, 1)


@pytest.mark.parametrize("case", ["llama", "gpt2", "stack"])
def test_copying_scores_equal_the_full_eigendecomposition(case):
    w = head_weights(_model(case))
    c = copying_scores(w)
    for layer in range(len(w.W_Q)):
        for head in range(w.W_Q[layer].shape[0]):
            M = w.W_E @ w.W_V[layer][w.group(layer, head)] @ w.W_O[layer][head] @ w.W_U  # (V, V)
            lam = torch.linalg.eigvals(M)
            expected = float(lam.real.sum() / lam.abs().sum())
            assert float(c.copying[layer, head]) == pytest.approx(expected, abs=1e-6)
            big = lam[lam.abs() > 1e-8 * lam.abs().max()]  # the Dh nonzero ones
            small = c.eigenvalues[layer][head]
            assert big.numel() == small.numel()
            key = lambda t: t[torch.argsort(t.real * 1e6 + t.imag)]  # noqa: E731
            torch.testing.assert_close(key(big), key(small), atol=1e-8, rtol=1e-6)
            assert float(c.positive[layer, head]) == pytest.approx(float((big.real > 0).float().mean()))


def test_top_tokens_and_pairs_equal_the_full_matrices():
    w = head_weights(hf_model("llama"))
    layer, head = 1, 3
    M = w.W_E @ w.W_V[layer][w.group(layer, head)] @ w.W_O[layer][head] @ w.W_U
    for token in (5, 40):
        got = ov_top_tokens(w, layer, head, token, 6)
        values, ids = M[token].topk(6)
        assert [i for i, _ in got] == ids.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in got], dtype=torch.float64), values)
    S = w.W_E @ w.W_Q[layer][head] @ w.W_K[layer][w.group(layer, head)].T @ w.W_E.T  # (V, V)
    values, flat = S.flatten().topk(8)
    got = qk_top_pairs(w, layer, head, 8, block=7)  # blocks that do not divide V
    assert [(q, k) for q, k, _ in got] == [(int(f) // S.shape[1], int(f) % S.shape[1]) for f in flat]
    torch.testing.assert_close(torch.tensor([v for *_, v in got], dtype=torch.float64), values)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda w: ov_top_tokens(w, 2, 0, 1), "layer"),
        (lambda w: ov_top_tokens(w, 0, 4, 1), "head"),
        (lambda w: ov_top_tokens(w, 0, 0, 96), "token"),
        (lambda w: qk_top_pairs(w, 0, -1), "head"),
        (lambda w: composition_scores(w).top("x"), "kind"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    w = head_weights(hf_model("llama"))
    with pytest.raises(ValueError, match=match):
        call(w)


@pytest.mark.slow
def test_smollm2_composition_and_copying():
    from headwise.models import open_model

    w = head_weights(open_model("smollm2"))
    c = composition_scores(w)
    assert c.k.shape == (30, 9, 30, 9) and c.k_group.shape == (30, 9, 30, 3)
    later = torch.ones(30, 30, dtype=torch.bool).triu(1)[:, None, :, None].expand(30, 9, 30, 9)
    assert torch.isfinite(c.k[later]).all() and torch.isnan(c.k[~later]).all()
    assert ((c.k[later] > 0) & (c.k[later] < 1)).all()
    cp = copying_scores(w)
    assert cp.copying.shape == (30, 9) and (cp.copying.abs() <= 1).all()
