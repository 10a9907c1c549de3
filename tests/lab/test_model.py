"""TransformerLM: PyTorch's own layers give the same logits; causal; head gates; checked inputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headwise.interop import from_torch
from headwise.models.transformer_lm import LMConfig, TransformerLM


def _reference(model: TransformerLM, ids: torch.Tensor) -> torch.Tensor:
    """The same model out of nn.TransformerEncoderLayer (pre-LN, GELU, causal mask) with copied weights."""
    cfg = model.config
    L = ids.shape[1]
    x = model.embed(ids) + model.pos_embed(torch.arange(L))  # (B, L, D)
    causal = nn.Transformer.generate_square_subsequent_mask(L, dtype=x.dtype)
    for layer in model.layers:
        ref = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.num_heads, cfg.d_ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        ).to(x.dtype)
        with torch.no_grad():
            mine = from_torch(ref.self_attn).to(x.dtype)
            mine.load_state_dict(layer.self_attn.state_dict())
            ref.self_attn.in_proj_weight.copy_(torch.cat([mine.Wq.weight, mine.Wk.weight, mine.Wv.weight]))
            ref.self_attn.in_proj_bias.copy_(torch.cat([mine.Wq.bias, mine.Wk.bias, mine.Wv.bias]))
            ref.self_attn.out_proj.load_state_dict(mine.Wo.state_dict())
            ref.linear1.load_state_dict(layer.ff.linear1.state_dict())
            ref.linear2.load_state_dict(layer.ff.linear2.state_dict())
            ref.norm1.load_state_dict(layer.norm1.state_dict())
            ref.norm2.load_state_dict(layer.norm3.state_dict())
        x = ref.eval()(x, src_mask=causal, is_causal=True)
    return model.unembed(model.norm(x))


def test_matches_torch_encoder_layers_with_causal_mask():
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=50, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=48, positional="learned"
    )
    model = TransformerLM(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)  # away from the small initialisation, so every part matters
    ids = torch.randint(0, 50, (3, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), _reference(model, ids), rtol=0, atol=1e-10)


@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_causal_and_any_length(positional):
    torch.manual_seed(1)
    model = TransformerLM(LMConfig(vocab_size=64, context_length=64, d_model=32, num_heads=4, positional=positional))
    model.eval()
    ids = torch.randint(0, 64, (2, 64))
    changed = ids.clone()
    changed[:, 40:] = torch.randint(0, 64, (2, 24))
    with torch.no_grad():
        full = model(ids)
        assert full.shape == (2, 64, 64)
        torch.testing.assert_close(model(changed)[:, :40], full[:, :40], rtol=0, atol=1e-5)
        torch.testing.assert_close(model(ids[:, :10]), full[:, :10], rtol=0, atol=1e-5)


def test_head_mask_gates_each_head():
    torch.manual_seed(2)
    model = TransformerLM(LMConfig(vocab_size=32, context_length=64, d_model=32, num_layers=2, num_heads=4)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    ids = torch.randint(0, 32, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, head_mask=torch.ones(2, 4)), model(ids), rtol=0, atol=0)
        # every head gated off: each layer adds only Wo's bias, by hand
        x = model.embed(ids)
        for layer in model.layers:
            x = x + layer.self_attn.Wo.bias
        torch.testing.assert_close(
            model(ids, head_mask=torch.zeros(2, 4)), model.unembed(model.norm(x)), rtol=0, atol=1e-6
        )
        # one head gated off = its slice of Wo zeroed
        gates = torch.ones(2, 4)
        gates[1, 2] = 0.0
        gated = model(ids, head_mask=gates)
        dh = 8
        model.layers[1].self_attn.Wo.weight[:, 2 * dh : 3 * dh] = 0.0
        torch.testing.assert_close(gated, model(ids), rtol=0, atol=1e-6)


def test_head_mask_with_fast_projections_equals_gating_wo_input_on_plain_linears():
    """The lab keeps the fast projections on: its gates act at ``hook_heads``, and equal the definition —
    head h's slice of ``Wo``'s input scaled by a pre-hook with every projection a plain ``nn.Linear`` call —
    in the forward pass and in the gates' gradient (Michel et al.'s importance)."""
    torch.manual_seed(3)
    model = TransformerLM(LMConfig(vocab_size=32, context_length=64, d_model=32, num_layers=2, num_heads=4)).eval()
    assert all(layer.self_attn.fast_projections for layer in model.layers)
    ids = torch.randint(0, 32, (3, 40))
    gates = torch.rand(2, 4, requires_grad=True)
    got = model(ids, head_mask=gates)
    (got_grad,) = torch.autograd.grad(got.square().sum(), gates)

    reference_gates = gates.detach().clone().requires_grad_(True)
    handles = []
    for n, layer in enumerate(model.layers):
        layer.self_attn.fast_projections = False

        def hook(_m, args, n=n):
            x = args[0]  # (B, L, H·Dh)
            return ((x.reshape(*x.shape[:-1], 4, -1) * reference_gates[n][:, None]).flatten(-2),)

        handles.append(layer.self_attn.Wo.register_forward_pre_hook(hook))
    try:
        expected = model(ids)
        (expected_grad,) = torch.autograd.grad(expected.square().sum(), reference_gates)
    finally:
        for handle in handles:
            handle.remove()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_grad, expected_grad, rtol=1e-4, atol=1e-4)


def test_weights_per_layer_and_bad_inputs():
    model = TransformerLM(LMConfig(vocab_size=64, context_length=64, d_model=32, num_heads=4)).eval()
    ids = torch.randint(0, 64, (1, 9))
    logits, weights = model(ids, need_weights=True)
    assert logits.shape == (1, 9, 64) and len(weights) == 2 and weights[0].shape == (1, 4, 9, 9)
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(1, 4, 9))
    with pytest.raises(ValueError, match="token_ids"):
        model(torch.tensor([[0, 64]]))
    with pytest.raises(ValueError, match="token_ids"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="token_ids"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="head_mask"):
        model(ids, head_mask=torch.ones(4, 2))
    with pytest.raises(ValueError, match="num_heads"):
        LMConfig(d_model=64, num_heads=3)
    with pytest.raises(ValueError, match="positional"):
        LMConfig(positional="alibi")
    with pytest.raises(ValueError, match="unknown keys"):
        LMConfig.from_dict({"vocab_size": 3, "colour": 1})
