"""``headwise.hf.ablate`` against the definition: the head's slice of the output projection's input, edited by
a forward pre-hook on ``o_proj`` (GPT-2's ``c_proj``, BERT's ``attention.output.dense``) of the model running
on its own eager attention. Whole logits at the real positions agree ≤ 1e-5."""

import pytest
import torch

import headwise.hf
from _hf_models import CASES, batch

TOL = 1e-5
HEADS = {0: [1, 3], 1: [2]}


def _output_projection(model, layer: int) -> torch.nn.Module:
    attention = headwise.hf.attention_layers(model)[layer]
    for name in ("o_proj", "c_proj", "dense"):  # Falcon: dense
        if hasattr(attention, name):
            return getattr(attention, name)
    return model.encoder.layer[layer].attention.output.dense  # BERT: the projection sits beside self-attention


def _reference(model, inputs, heads, mode):
    """Logits with ``heads`` edited in the output projection's input (B, L, H·Dv) by pre-hooks."""
    real = inputs["attention_mask"].bool()  # (B, L)
    handles = []
    for layer, chosen in heads.items():
        H = headwise.hf.num_heads(headwise.hf.attention_layers(model)[layer])

        def hook(module, args, chosen=chosen, H=H):
            x = args[0]
            x = x.reshape(*x.shape[:-1], H, -1).clone()  # (B, L, H, Dv)
            for h in chosen:
                x[:, :, h] = 0.0 if mode == "zero" else x[:, :, h][real].mean(0)
            return (x.flatten(-2),)

        handles.append(_output_projection(model, layer).register_forward_pre_hook(hook))
    try:
        out = model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize(
    "family", [c if c == "llama" else pytest.param(c, marks=pytest.mark.slow) for c in sorted(CASES)]
)
def test_ablation_equals_editing_the_output_projection_input(tiny, family, mode):
    model = tiny(family, "eager")
    inputs = batch()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        plain = model(**inputs)
        plain = plain.logits if getattr(plain, "logits", None) is not None else plain.last_hidden_state
        expected = _reference(model, inputs, HEADS, mode)
        with headwise.hf.ablate(model, HEADS, mode=mode):
            got = model(**inputs)
        got = got.logits if getattr(got, "logits", None) is not None else got.last_hidden_state
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=TOL)
    assert (got[real] - plain[real]).abs().max() > 1e-2  # the ablation changed something


def test_ablation_and_capture_nest(tiny):
    model = tiny("llama", "sdpa")
    inputs = batch()
    with torch.no_grad(), headwise.hf.capture(model) as attn, headwise.hf.ablate(model, {0: [0]}):
        model(**inputs)
    assert model.config._attn_implementation == "sdpa"
    assert len(attn.weights) == 2  # weights are what each head computed; ablation acts after them


def test_mean_uses_the_mask_given_positionally(tiny):
    model = tiny("gpt2", "eager")
    inputs = batch()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        expected = _reference(model, inputs, {1: [0]}, "mean")
        with headwise.hf.ablate(model, {1: [0]}, mode="mean"):
            got = model(inputs["input_ids"], None, inputs["attention_mask"]).logits  # (input_ids, cache, mask)
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=TOL)


def test_the_model_is_restored_when_the_block_raises(tiny):
    model = tiny("qwen3", "eager")
    inputs = batch()
    with torch.no_grad():
        before = model(**inputs).logits
        with pytest.raises(RuntimeError, match="boom"), headwise.hf.ablate(model, {0: [0, 1, 2, 3]}):
            raise RuntimeError("boom")
        after = model(**inputs).logits
    assert model.config._attn_implementation == "eager"
    assert torch.equal(before, after)


@pytest.mark.parametrize(
    "heads, mode, error, pattern",
    [
        ({2: [0]}, "zero", ValueError, "^heads: layer 2 is out of range: the model has 2 attention layers"),
        ({0: [4]}, "zero", ValueError, r"^heads: head 4 is out of range in layer 0, which has 4 heads \(0..3\)"),
        ({0: [-1]}, "zero", ValueError, "^heads: head -1 is out of range"),
        ({0: 1}, "zero", TypeError, "^heads: expected a list of head numbers for layer 0, got 1"),
        ([0, 1], "zero", TypeError, r"^heads: expected a mapping \{layer: \[head, ...\]\}, got list"),
        ({0: [0]}, "half", ValueError, r"^mode: expected one of \('zero', 'mean'\), got 'half'"),
    ],
)
def test_bad_arguments_are_named(tiny, heads, mode, error, pattern):
    model = tiny("llama", "eager")
    with pytest.raises(error, match=pattern), headwise.hf.ablate(model, heads, mode=mode):
        pass
    assert model.config._attn_implementation == "eager"


def test_mean_refuses_a_mask_it_cannot_read(tiny):
    model = tiny("llama", "eager")
    inputs = batch()
    four_d = torch.ones(3, 1, 9, 9, dtype=torch.bool)
    pattern = "^attention_mask: mode='mean' needs the model's 2-D padding mask"
    with pytest.raises(ValueError, match=pattern), torch.no_grad(), headwise.hf.ablate(model, {0: [0]}, mode="mean"):
        model(input_ids=inputs["input_ids"], attention_mask=four_d)


@pytest.mark.parametrize("family", sorted(CASES))
def test_a_hook_on_the_backends_hook_heads_is_what_ablate_does(tiny, family):
    """Ablation, gates and patching act at one place: a hook of one's own on ``hook_heads`` zeroing the same
    heads gives the same whole tensors as ``ablate``; the model gains no module and no state."""
    from headwise.core.hooks import hooked
    from headwise.hf._model import on_headwise
    from headwise.hf.backend import hook_points

    model = tiny(family, "eager")
    inputs = batch()
    modules_before = [name for name, _ in model.named_modules()]
    state_before = list(model.state_dict())

    def zero(heads):
        return lambda out: out.index_fill(1, torch.tensor(heads), 0.0)  # out (B, H, L, Dv)

    layers = headwise.hf.attention_layers(model)
    with torch.no_grad():
        with headwise.hf.ablate(model, HEADS):
            expected = model(**inputs)
        with hooked((hook_points(layers[k]).hook_heads, zero(h)) for k, h in HEADS.items()), on_headwise(model):
            got = model(**inputs)
    for a, b in zip(expected.values(), got.values()):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert [name for name, _ in model.named_modules()] == modules_before
    assert list(model.state_dict()) == state_before
    assert not any(hook_points(m).hook_heads.active or hook_points(m).hook_pattern.active for m in layers)
