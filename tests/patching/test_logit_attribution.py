"""Direct logit attribution: the parts add up to the logit difference, and each head's part equals a reference
computed from the weights by hand."""

from __future__ import annotations

import pytest
import torch

from _patching_models import Stack, hf_model, pair
from headwise.patching import direct_logit_attribution, logit_difference

METRIC = logit_difference([5, 7], [9, 11])
TOL = 1e-4


@pytest.mark.parametrize("case", ["llama", "gpt2", "gemma", "gemma2", "gemma3_text", "qwen2", "olmo2", "phi3"])
def test_the_parts_add_up_to_the_logit_difference(case):
    model = hf_model(case)
    clean, _ = pair()
    dla = direct_logit_attribution(model, clean, METRIC)
    parts = (
        dla.heads.nansum((1, 2)) + dla.head_bias.sum(1) + dla.mlp.sum(1) + dla.embed + dla.norm_bias + dla.unembed_bias
    )
    torch.testing.assert_close(parts, dla.total)
    torch.testing.assert_close(dla.total, dla.unembed_difference, atol=TOL, rtol=0)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # Gemma 2: the parts add up before the cap; the model's difference is that of the capped logits
        logits = model(input_ids=clean).logits[:, -1].double()
        pre = torch.atanh(logits / cap) * cap  # the logits before c·tanh(x/c)
        torch.testing.assert_close(
            dla.unembed_difference, pre[[0, 1], [5, 7]] - pre[[0, 1], [9, 11]], atol=1e-3, rtol=0
        )
        assert (dla.logit_difference - dla.unembed_difference).abs().max() > 1e-5
    else:
        torch.testing.assert_close(dla.total, dla.logit_difference, atol=TOL, rtol=0)
    assert dla.heads.shape == (2, 2, 4)


def test_the_headwise_stack_adds_up():
    model = Stack()
    clean, _ = pair()
    dla = direct_logit_attribution(model, clean, METRIC)
    logits = model(clean)[:, -1].double()
    torch.testing.assert_close(dla.total, logits[[0, 1], [5, 7]] - logits[[0, 1], [9, 11]], atol=TOL, rtol=0)
    assert dla.heads.shape == (2, 3, 4)
    assert dla.unembed_bias.abs().min() > 0  # the stack's unembedding has a bias: its own part


def _inputs(module, store, key):
    def pre(_m, args, kwargs):
        store[key] = (args[0] if args else kwargs["hidden_states"]).detach()

    return module.register_forward_pre_hook(pre, with_kwargs=True)


def test_llama_heads_equal_the_weights_by_hand():
    """head h's part = (W_O[:, h] z_h) · g / rms(x) · (U[a] − U[w]), x the final norm's input (RMSNorm, w·x/rms)."""
    model = hf_model("llama")
    clean, _ = pair()
    dla = direct_logit_attribution(model, clean, METRIC)
    seen = {}
    layers = model.model.layers
    handles = [_inputs(layer.self_attn.o_proj, seen, i) for i, layer in enumerate(layers)]
    handles.append(_inputs(model.model.norm, seen, "final"))
    with torch.no_grad():
        model(input_ids=clean)
    for h in handles:
        h.remove()
    norm = model.model.norm
    x = seen["final"][:, -1].double()  # (P, D)
    inv = 1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)  # (P, 1)
    U = model.lm_head.weight.double()
    d = U[[5, 7]] - U[[9, 11]]  # (P, D)
    expected = torch.empty(2, 2, 4, dtype=torch.float64)
    for layer in range(2):
        W = layers[layer].self_attn.o_proj.weight.double()  # (D, H·Dh)
        z = seen[layer][:, -1].double()  # (P, H·Dh)
        for head in range(4):
            cols = slice(head * 8, (head + 1) * 8)
            write = z[:, cols] @ W[:, cols].T  # (P, D)
            expected[:, layer, head] = (write * norm.weight.double() * inv * d).sum(-1)
    torch.testing.assert_close(dla.heads, expected, atol=1e-5, rtol=0)


def test_gpt2_heads_and_biases_equal_the_weights_by_hand():
    """GPT-2: Conv1D c_proj (weight (in, out)) with a bias, LayerNorm ln_f (centred, w/σ, + b)."""
    model = hf_model("gpt2")
    clean, _ = pair()
    dla = direct_logit_attribution(model, clean, METRIC)
    seen = {}
    blocks = model.transformer.h
    handles = [_inputs(b.attn.c_proj, seen, i) for i, b in enumerate(blocks)]
    handles.append(_inputs(model.transformer.ln_f, seen, "final"))
    with torch.no_grad():
        model(input_ids=clean)
    for h in handles:
        h.remove()
    ln = model.transformer.ln_f
    x = seen["final"][:, -1].double()
    inv = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + ln.eps)  # (P, 1)
    U = model.lm_head.weight.double()
    d = U[[5, 7]] - U[[9, 11]]

    def through(v):  # (P, D) -> (P,)
        return ((v - v.mean(-1, keepdim=True)) * ln.weight.double() * inv * d).sum(-1)

    for layer in range(2):
        W = blocks[layer].attn.c_proj.weight.double()  # (H·Dh, D)
        z = seen[layer][:, -1].double()
        for head in range(4):
            rows = slice(head * 8, (head + 1) * 8)
            torch.testing.assert_close(dla.heads[:, layer, head], through(z[:, rows] @ W[rows]), atol=1e-5, rtol=0)
        bias = blocks[layer].attn.c_proj.bias.double().expand(2, -1)
        torch.testing.assert_close(dla.head_bias[:, layer], through(bias), atol=1e-5, rtol=0)
    torch.testing.assert_close(dla.norm_bias, (ln.bias.double() * d).sum(-1), atol=1e-5, rtol=0)


def test_gemma_embeddings_are_scaled():
    """Gemma multiplies the embeddings by √D before the first block: the embedding part sees them scaled."""
    model = hf_model("gemma")
    clean, _ = pair()
    dla = direct_logit_attribution(model, clean, METRIC)
    norm = model.model.norm
    seen = {}
    handle = _inputs(norm, seen, "final")
    with torch.no_grad():
        model(input_ids=clean)
    handle.remove()
    x = seen["final"][:, -1].double()
    inv = 1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    e = model.model.embed_tokens.weight[clean[:, -1]].double() * (model.config.hidden_size**0.5)
    U = model.lm_head.weight.double()
    d = U[[5, 7]] - U[[9, 11]]
    expected = (e * (1 + norm.weight.double()) * inv * d).sum(-1)
    torch.testing.assert_close(dla.embed, expected, atol=1e-4, rtol=0)


def test_a_structure_it_cannot_read_is_refused():
    """Post-LN blocks (norm after the residual sum): a block's writes are not its change of the residual."""
    with pytest.raises(ValueError, match="^model: headwise cannot read the anatomy of this Stack model: .*post-norm"):
        direct_logit_attribution(Stack(norm_first=False), pair()[0], METRIC)
    with pytest.raises(TypeError, match="metric: expected a LogitDifference"):
        direct_logit_attribution(Stack(), pair()[0], lambda x: x)
