"""Head gates, importance, ablation and pruning curves against independent computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwise.analysis import gates as G
from headwise.analysis import importance as I
from headwise.analysis import objective as O

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _decoders import save_decoder  # noqa: E402

TEXTS = ["the cat sat on the mat .", "god saw the light , and it was good .", "one two three red blue"]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def decoder(request, tmp_path_factory):
    from headwise.models import open_model

    folder = save_decoder(tmp_path_factory.mktemp(request.param), request.param, init=0.5)
    return request.param, open_model(folder)


def _out_proj(hm, family, layer):
    """The module whose input is the concatenated heads, found by the family's own names (independent)."""
    if family == "gpt2":
        return hm.model.transformer.h[layer].attn.c_proj
    return hm.model.model.layers[layer].self_attn.o_proj


def _with_head_scale(hm, family, scales):
    """Pre-hooks multiplying each head's slice of the output projection's input by ``scales[layer][head]``."""
    handles = []
    for layer in range(hm.num_layers):

        def hook(_m, args, layer=layer):
            x = args[0]
            dh = x.shape[-1] // hm.num_heads
            s = torch.repeat_interleave(scales[layer], dh)
            return (x * s,)

        handles.append(_out_proj(hm, family, layer).register_forward_pre_hook(hook))
    return handles


def _hf_loss(hm, ids, mask):
    """Token-weighted next-token loss from Hugging Face's own ``labels=`` loss, one sequence at a time."""
    total, count = 0.0, 0
    for i, m in zip(ids, mask):
        n = int(m.sum())
        out = hm.model(input_ids=i[None, :n], labels=i[None, :n])
        total += float(out.loss) * (n - 1)
        count += n - 1
    return total / count


def test_gates_are_exact_and_importance_matches_independent_gradients(decoder):
    family, hm = decoder
    enc = hm.encode(TEXTS)
    batches = [(enc.ids, enc.mask)]
    with torch.no_grad():
        plain = hm.forward(enc.ids, enc.mask)
        with hm.gated(torch.ones(hm.num_layers, hm.num_heads)):
            ones = hm.forward(enc.ids, enc.mask)
    assert torch.equal(plain, ones)
    result = I.head_importance(hm, batches, random_orders=2, points=5)
    with torch.no_grad():
        assert result.base_loss == pytest.approx(_hf_loss(hm, enc.ids, enc.mask), rel=1e-5)
    # Michel et al.: E_x |∂L(x)/∂ξ|, here with gates in pre-hooks on the family's own output projection.
    grads = []
    for i, m in zip(enc.ids, enc.mask):
        n = int(m.sum())
        scales = torch.ones(hm.num_layers, hm.num_heads, requires_grad=True)
        handles = _with_head_scale(hm, family, scales)
        try:
            hm.model(input_ids=i[None, :n], labels=i[None, :n]).loss.backward()
        finally:
            for h in handles:
                h.remove()
        grads.append(scales.grad.abs())
    np.testing.assert_allclose(result.importance, torch.stack(grads).mean(0).numpy(), rtol=1e-4, atol=1e-7)
    norm = result.importance / np.linalg.norm(result.importance, axis=1, keepdims=True)
    np.testing.assert_allclose(result.importance_norm, norm, rtol=1e-12)
    # Measured ablation: the same head zeroed at the output projection's input.
    for layer, head in ((0, 1), (hm.num_layers - 1, hm.num_heads - 1)):
        scales = torch.ones(hm.num_layers, hm.num_heads)
        scales[layer, head] = 0.0
        handles = _with_head_scale(hm, family, scales)
        try:
            with torch.no_grad():
                ablated = _hf_loss(hm, enc.ids, enc.mask)
        finally:
            for h in handles:
                h.remove()
        assert result.ablation[layer, head] == pytest.approx(ablated - result.base_loss, abs=2e-6)
    # Every curve starts at the intact loss and ends with every head removed (the same model).
    assert result.removed[0] == 0 and result.removed[-1] == hm.num_layers * hm.num_heads
    ends = {name: curve[-1] for name, curve in result.curves.items()}
    assert len({round(v, 6) for v in ends.values()}) == 1
    assert all(curve[0] == result.base_loss for curve in result.curves.values())
    assert np.all(result.curves["random_min"] <= result.curves["random_mean"] + 1e-12)
    rows = result.csv_rows()
    assert rows[0]["removed"] == 0 and set(rows[0]) == {"removed", *result.curves}


def test_pruning_steps():
    np.testing.assert_array_equal(I.pruning_steps(8), np.arange(9))
    steps = I.pruning_steps(144, 33)
    assert steps[0] == 0 and steps[-1] == 144 and len(steps) == 33
    with pytest.raises(ValueError, match="batches"):
        I.head_importance(None, [])


def test_encoder_importance_is_the_embedding_turning_rate():
    """The bundled MiniLM: forward-mode derivatives against central differences in float64."""
    from headwise.models import open_model

    hm = open_model(None)
    hm.model.double()
    enc = hm.encode(["God saw the light, and it was good."])
    with torch.no_grad():
        e = O.mean_pooled(hm.forward(enc.ids, enc.mask, math_path=True), enc.mask)
    got, sequences = G.encoder_importance(hm, [(enc.ids, enc.mask)], [e], lambda *a: None)
    assert sequences == 1 and got.shape == (6, 12)
    unit = e / e.norm(dim=-1, keepdim=True)
    for layer, head in ((0, 0), (3, 7), (5, 11)):
        d, sides = 1e-5, []
        for s in (1 + d, 1 - d):
            g = torch.ones(6, 12, dtype=torch.float64)
            g[layer, head] = s
            with torch.no_grad(), hm.gated(g):
                sides.append(O.mean_pooled(hm.forward(enc.ids, enc.mask, math_path=True), enc.mask))
        de = (sides[0] - sides[1]) / (2 * d)
        turn = de - (de * unit).sum(-1, keepdim=True) * unit
        assert got[layer, head] == pytest.approx(float(turn.norm() / e.norm()), rel=1e-6)
    # Removing a head: the same as zeroing its columns of Wo.
    with torch.no_grad():
        wo = hm.attention_modules[2].Wo
        saved = wo.weight.clone()
        dh = wo.weight.shape[1] // 12
        wo.weight[:, 4 * dh : 5 * dh] = 0.0
        zeroed = hm.forward(enc.ids, enc.mask)
        wo.weight.copy_(saved)
        g = torch.ones(6, 12, dtype=torch.float64)
        g[2, 4] = 0.0
        with hm.gated(g):
            gated = hm.forward(enc.ids, enc.mask)
    torch.testing.assert_close(gated, zeroed, rtol=0, atol=1e-12)


def test_which_tokens_are_scored_is_one_argument_of_one_implementation():
    """``scored="answers"`` with every next-token position chosen is ``scored="next_token"``, as whole arrays;
    scoring fewer tokens changes the objective; a choice that does not fit the model's kind is refused."""
    from headwise.models import LMConfig, TransformerLM, lab_head_model

    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=24, context_length=16, d_model=16, num_layers=2, num_heads=2)).eval()
    hm = lab_head_model(model)
    ids = torch.randint(0, 24, (5, 12))
    mask = torch.ones_like(ids)
    everything = torch.ones_like(ids, dtype=torch.bool)
    everything[:, -1] = False
    answers = [(ids, ids.roll(-1, dims=1), everything)]
    a = I.head_importance(hm, [(ids, mask)], random_orders=2, points=5)
    b = I.head_importance(hm, answers, scored="answers", random_orders=2, points=5)
    assert a.objective != b.objective
    for name in ("importance", "importance_norm", "ablation"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-6, atol=1e-9)
    for name in a.curves:
        np.testing.assert_allclose(b.curves[name], a.curves[name], rtol=1e-6, atol=1e-9)
    fewer = everything.clone()
    fewer[:, :6] = False
    c = I.head_importance(hm, [(ids, ids.roll(-1, dims=1), fewer)], scored="answers", random_orders=1, points=3)
    assert c.num_tokens == 5 * 5 < a.num_tokens and c.base_loss != pytest.approx(a.base_loss)
    with pytest.raises(ValueError, match="scored: 'embedding' does not fit a model of kind 'decoder'"):
        I.head_importance(hm, [(ids, mask)], scored="embedding")
