"""QK attribution: the parts add up to the score the model used, the weights are transformers' eager weights,
one part equals the weights by hand, the removal effects and centred terms equal their definitions."""

from __future__ import annotations

import math

import pytest
import torch

from _patching_models import Stack, hf_model
from headwise.circuits import QKAttribution, qk_attribution

transformers = pytest.importorskip("transformers")

TOL = 1e-4
IDS = torch.randint(3, 90, (11,), generator=torch.Generator().manual_seed(3))
FAMILIES = ["llama", "gpt2", "gemma2", "qwen3", "olmo2", "gemma3_text", "mistral_window", "phi3"]


def _check_sums(r: QKAttribution) -> None:
    c = r.key_index()
    scale = r.scores.abs().max()
    assert abs(float(r.terms.sum() - r.scores[c])) <= TOL * scale
    torch.testing.assert_close(r.terms.sum(1), r.query_terms[:, c], atol=TOL * scale, rtol=0)
    torch.testing.assert_close(r.terms.sum(0), r.key_terms[:, c], atol=TOL * scale, rtol=0)
    torch.testing.assert_close(r.query_terms.sum(0), r.scores, atol=TOL * scale, rtol=0)
    torch.testing.assert_close(r.key_terms.sum(0), r.scores, atol=TOL * scale, rtol=0)
    centred = r.scores - r.scores.mean()
    torch.testing.assert_close(r.query_centred.sum(0), centred, atol=TOL * scale, rtol=0)
    torch.testing.assert_close(r.key_centred.sum(0), centred, atol=TOL * scale, rtol=0)
    assert r.error <= TOL


@pytest.mark.parametrize("case", FAMILIES)
@pytest.mark.parametrize("layer", [0, 1])
def test_the_parts_add_up_and_the_weights_are_eager_weights(case, layer):
    model, eager = hf_model(case), hf_model(case, "eager")
    H = 4
    head, query = (layer + 2) % H, 9
    r = qk_attribution(model, IDS, layer, head, query)
    _check_sums(r)
    Hkv = model.config.num_key_value_heads if hasattr(model.config, "num_key_value_heads") else H
    assert r.group == head // (H // Hkv)
    # the labels: embeddings, every earlier head, bias and MLP, then the constant parts
    expected = ["embed"] + [
        n for lay in range(layer) for n in [*(f"L{lay}.H{h}" for h in range(H)), f"L{lay}.attn_bias", f"L{lay}.mlp"]
    ]
    assert r.query_labels == expected + ["norm_bias", "q_bias"]
    assert r.key_labels == expected + ["norm_bias", "k_bias"]
    # the keys the model lets the query see, and transformers' own eager weights over them
    with torch.no_grad():
        att = eager(input_ids=IDS[None], output_attentions=True).attentions[layer][0, head, query].double()
    window = getattr(model.config, "sliding_window", None)
    layer_types = getattr(model.config, "layer_types", None)
    if window and (layer_types is None or layer_types[layer] == "sliding_attention"):
        assert r.keys.tolist() == list(range(query - window + 1, query + 1))
    else:
        assert r.keys.tolist() == list(range(query + 1))
    torch.testing.assert_close(r.weights, att[r.keys], atol=1e-5, rtol=0)
    assert float(att.sum() - att[r.keys].sum()) < 1e-6
    cap = getattr(model.config, "attn_logit_softcapping", None)
    if cap:  # Gemma 2: the parts add up before the cap; the softmax sees the capped scores
        assert r.softcap == cap
        torch.testing.assert_close(r.logits, cap * torch.tanh(r.scores / cap))
        assert (r.logits - r.scores).abs().max() > 1e-6  # the cap acts (small scores: tanh nearly linear)
    else:
        torch.testing.assert_close(r.logits, r.scores)


@torch.no_grad()
def test_llama_embedding_part_equals_the_weights_by_hand():
    """q_embed(i) = RoPE_i(W_Q[h] (e_i · g / rms(x_i))), x the layer's input; k(j) formed from the whole input."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = hf_model("llama", "eager")
    layer, head, query = 1, 3, 9
    r = qk_attribution(hf_model("llama"), IDS, layer, head, query, key=4)
    seen = {}
    block = model.model.layers[layer]
    h = block.register_forward_pre_hook(
        lambda m, a, k: seen.update(x=(a[0] if a else k["hidden_states"])), with_kwargs=True
    )
    with torch.no_grad():
        model(input_ids=IDS[None])
    h.remove()
    x = seen["x"][0].double()  # (L, D)
    att = block.self_attn
    norm = block.input_layernorm
    inv = 1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)  # (L, 1)
    g = norm.weight.double()
    Dh, G = 8, 2
    Wq = att.q_proj.weight.double()[head * Dh : (head + 1) * Dh]  # (Dh, D)
    Wk = att.k_proj.weight.double()[(head // G) * Dh : (head // G + 1) * Dh]
    with torch.no_grad():
        e = model.model.embed_tokens(IDS).double()  # (L, D)
    pos = torch.arange(len(IDS))[None]
    cos, sin = model.model.rotary_emb(x[None].float(), pos)
    q_e = (e * g * inv) @ Wq.T  # (L, Dh)
    k_all = (x * g * inv) @ Wk.T
    k_e = (e * g * inv) @ Wk.T
    q_e, k_all = apply_rotary_pos_emb(q_e[None, None], k_all[None, None], cos.double(), sin.double())
    _, k_e = apply_rotary_pos_emb(k_e[None, None], k_e[None, None], cos.double(), sin.double())
    q_e, k_all, k_e = q_e[0, 0, query], k_all[0, 0], k_e[0, 0]
    scale = 1 / math.sqrt(Dh)
    torch.testing.assert_close(r.query_terms[0], (k_all[: query + 1] @ q_e) * scale, atol=1e-5, rtol=1e-5)
    assert abs(float(r.terms[0, 0] - (q_e @ k_e[4]) * scale)) < 1e-5


def test_removal_effects_are_the_softmax_without_the_part():
    r = qk_attribution(hf_model("gemma2"), IDS, 1, 1, 8)
    cap = r.softcap
    for side_terms, effect in ((r.query_terms, r.query_effect), (r.key_terms, r.key_effect)):
        for a in (0, 3, side_terms.shape[0] - 1):
            without = torch.softmax(cap * torch.tanh((r.scores - side_terms[a]) / cap), 0)
            torch.testing.assert_close(effect[a], r.weights - without, atol=1e-9, rtol=0)


def test_learned_sinks_enter_the_weights_and_the_effects():
    r = qk_attribution(hf_model("gpt_oss"), IDS, 1, 2, 10)
    _check_sums(r)
    assert float(r.weights.sum()) < 0.999  # the sink takes its share


def test_headwise_decoder_with_rope():
    model = Stack()
    for layer in range(3):
        r = qk_attribution(model, IDS, layer, 1, 10)
        _check_sums(r)
        assert len(r.query_labels) == 1 + 6 * layer + 2  # embed, per layer 4 heads + bias + mlp, constants


def test_to_page_and_top_terms():
    r = qk_attribution(hf_model("llama"), IDS, 1, 0, 7, key=2)
    page = r.to_page(5)
    assert set(page) == {"query", "key", "terms"} and page["query"] == 7 and page["key"] == 2
    assert [set(t) for t in page["terms"]] == [{"query_part", "key_part", "value"}] * 5
    values = [abs(t["value"]) for t in page["terms"]]
    assert values == sorted(values, reverse=True)
    assert values[0] == pytest.approx(float(r.terms.abs().max()))
    a, b = r.query_labels.index(page["terms"][0]["query_part"]), r.key_labels.index(page["terms"][0]["key_part"])
    assert page["terms"][0]["value"] == pytest.approx(float(r.terms[a, b]))
    doc = r.to_json(3)
    assert doc["top_terms"] == r.to_page(3)["terms"] and len(doc["query_parts"]) == len(r.query_labels)
    assert r.key == 2 and r.keys.tolist() == list(range(8))


def test_default_key_is_the_heaviest():
    r = qk_attribution(hf_model("qwen3"), IDS, 1, 3, 10)
    assert r.key == int(r.keys[r.weights.argmax()])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(layer=2, head=0, query=3), "layer"),
        (dict(layer=0, head=4, query=3), "head"),
        (dict(layer=0, head=0, query=11), "query"),
        (dict(layer=0, head=0, query=-1), "query"),
        (dict(layer=0, head=0, query=3, key=4), "key"),
        (dict(layer=0, head=0, query=True), "query"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        qk_attribution(hf_model("llama"), IDS, **kwargs)


def test_more_than_one_sequence_is_refused():
    with pytest.raises(ValueError, match="ids"):
        qk_attribution(hf_model("llama"), IDS.expand(2, -1), 0, 0, 3)


def test_a_window_masked_key_is_refused():
    with pytest.raises(ValueError, match="key"):
        qk_attribution(hf_model("mistral_window"), IDS, 0, 0, 9, key=1)


@pytest.mark.slow
def test_smollm2_adds_up():
    from headwise.models import open_model

    hm = open_model("smollm2")
    ids = hm.encode(["When Mary and John went to the store, John gave a drink to"]).ids[0]
    L = len(ids)
    for layer, head in ((0, 0), (15, 4), (29, 8)):
        r = qk_attribution(hm, ids, layer, head, L - 1)
        _check_sums(r)
        assert r.group == head // 3 and len(r.tokens) == L
        assert len(r.query_labels) == 1 + 11 * layer + 2
