"""``headwise.hf.capture``: per-head weights from a model loaded with any implementation, against eager's
``output_attentions`` (≤ 1e-5 on the real query rows; a padding row is zeros here, spread evenly in eager)."""

import pytest
import torch

import headwise.hf
from _hf_models import CASES, ENCODERS, batch, build

TOL = 1e-5


def _real_rows(inputs, w):
    return inputs["attention_mask"].bool()[:, None, :, None].expand_as(w)  # (B, H, L, S): real query rows


@pytest.mark.parametrize("family", sorted(CASES))
def test_weights_equal_eager_output_attentions(tiny, family):
    model = tiny(family, "eager")
    inputs = batch()
    with torch.no_grad():
        expected = model(**inputs, output_attentions=True).attentions
        with headwise.hf.capture(model) as attn:
            model(**inputs)
    assert model.config._attn_implementation == "eager"
    assert len(attn.weights) == len(expected) == 2
    for got, want in zip(attn.weights, expected):
        assert got.shape == want.shape
        torch.testing.assert_close(got[_real_rows(inputs, got)], want[_real_rows(inputs, want)], rtol=0, atol=TOL)
        padding = ~_real_rows(inputs, got)
        if family in ENCODERS:  # bidirectional: a padding query still sees the real keys, as in eager
            torch.testing.assert_close(got, want, rtol=0, atol=TOL)
        else:  # causal with left padding: a padding query has every key blocked, so zero weights
            assert torch.all(got[padding] == 0)


def test_a_model_loaded_with_sdpa_is_captured_and_restored(tiny):
    eager = tiny("qwen2", "eager")
    model = build("qwen2", attn="sdpa")
    inputs = batch()
    with torch.no_grad():
        expected = eager(**inputs, output_attentions=True).attentions
        with headwise.hf.capture(model, layers=[1]) as attn:
            model(**inputs)
    assert model.config._attn_implementation == "sdpa"
    assert attn.layers == [1] and len(attn.weights) == 1
    w = attn.weights[0]
    torch.testing.assert_close(w[_real_rows(inputs, w)], expected[1][_real_rows(inputs, w)], rtol=0, atol=TOL)


def test_the_implementation_is_restored_when_the_block_raises(tiny):
    model = tiny("llama", "eager")
    with pytest.raises(KeyError, match="boom"), headwise.hf.capture(model):
        assert model.config._attn_implementation == "headwise"
        raise KeyError("boom")
    assert model.config._attn_implementation == "eager"


def test_generate_records_one_step_per_forward(tiny):
    model = tiny("llama", "eager")
    inputs = batch(L=6)
    with torch.no_grad(), headwise.hf.capture(model) as attn:
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert out.shape[1] == 9
    assert [tuple(s[0].shape) for s in attn.steps] == [(3, 4, 6, 6), (3, 4, 1, 7), (3, 4, 1, 8)]
    assert attn.weights[0].shape == (3, 4, 1, 8)  # the last forward pass
    for step in attn.steps:  # each real query row sums to one
        torch.testing.assert_close(step[1][:, :, -1].sum(-1), torch.ones(3, 4), rtol=0, atol=1e-6)


def test_no_forward_pass_is_an_error(tiny):
    model = tiny("gpt2", "eager")
    with headwise.hf.capture(model) as attn:
        pass
    with pytest.raises(RuntimeError, match="no forward pass"):
        _ = attn.weights


@pytest.mark.parametrize(
    "layers, error, pattern",
    [
        ([2], ValueError, "^layers: layer 2 is out of range: the model has 2 attention layers"),
        ([-1], ValueError, "^layers: layer -1 is out of range"),
        (["0"], TypeError, "^layers: expected layer numbers as ints, got '0'"),
        (1, TypeError, "^layers: expected an iterable of layer numbers or None, got 1"),
    ],
)
def test_layer_numbers_out_of_range_are_named(tiny, layers, error, pattern):
    model = tiny("llama", "eager")
    with pytest.raises(error, match=pattern), headwise.hf.capture(model, layers=layers):
        pass
    assert model.config._attn_implementation == "eager"


def test_attention_layers_are_the_blocks_in_order(tiny):
    model = tiny("llama", "eager")
    assert headwise.hf.attention_layers(model) == [block.self_attn for block in model.model.layers]
    bert = tiny("bert", "eager")
    assert headwise.hf.attention_layers(bert) == [block.attention.self for block in bert.encoder.layer]
    assert [headwise.hf.num_heads(m) for m in headwise.hf.attention_layers(bert)] == [4, 4]


def test_captured_weights_carry_gradients_as_eager_output_attentions():
    model = build("llama", attn="eager")
    inputs = batch()
    probe = model.model.layers[0].self_attn.q_proj.weight

    def gradient(weights):
        model.zero_grad()
        sum(w[_real_rows(inputs, w)].pow(2).sum() for w in weights).backward()
        return probe.grad.clone()

    expected = gradient(model(**inputs, output_attentions=True).attentions)
    with headwise.hf.capture(model) as attn:
        model(**inputs)
    got = gradient(attn.weights)
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
