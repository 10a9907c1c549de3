"""``attn_implementation="headwise"`` against Hugging Face's eager attention, family by family.

Tiny random models (float32, eval) built offline from configs; a left-padded batch. Logits are compared on
the real (non-padding) positions only: at a padding query every key is blocked, which headwise answers with
zeros and eager with an even spread over the padding — neither reaches a real position.
"""

import pytest
import torch

import headwise.hf
from _hf_models import CASES, DECODERS, batch, build, family_calls_interface
from headwise import functional
from headwise.hf import backend

TOL_LOGITS = 1e-4  # float32, absolute, as asked of the backend


def _output(model, inputs, **kwargs):
    out = model(**inputs, **kwargs)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "unpadded"])
def test_logits_equal_eager(tiny, case, padded):
    eager, mine = tiny(case, "eager"), tiny(case, "headwise")
    inputs = batch(L=9)
    if not padded:
        inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        expected, got = _output(eager, inputs), _output(mine, inputs)
    assert mine.config._attn_implementation == "headwise"
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=TOL_LOGITS)


@pytest.mark.parametrize(
    "case", [c if c == "llama" else pytest.param(c, marks=pytest.mark.slow) for c in sorted(DECODERS)]
)
def test_generation_with_cache_gives_the_same_tokens(tiny, case):
    eager, mine = tiny(case, "eager"), tiny(case, "headwise")
    inputs = batch(L=7)
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        expected = eager.generate(**inputs, **kwargs)
        got = mine.generate(**inputs, **kwargs)
    assert torch.equal(got, expected)


def test_set_attn_implementation_switches_a_loaded_model(tiny):
    model = build("llama", attn="sdpa")
    eager = tiny("llama", "eager")
    model.set_attn_implementation("headwise")
    inputs = batch()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(_output(model, inputs)[real], _output(eager, inputs)[real], rtol=0, atol=TOL_LOGITS)


def test_output_attentions_returns_weights_on_headwise(tiny):
    eager, mine = tiny("llama", "eager"), tiny("llama", "headwise")
    inputs = batch()
    real = inputs["attention_mask"].bool()[:, None, :, None]  # (B, 1, L, 1): real query rows
    with torch.no_grad():
        expected = eager(**inputs, output_attentions=True).attentions
        got = mine(**inputs, output_attentions=True).attentions
    assert len(got) == len(expected) == 2
    for w, e in zip(got, expected):
        torch.testing.assert_close(w[real.expand_as(w)], e[real.expand_as(e)], rtol=0, atol=1e-5)


# -- the attention function on its own ------------------------------------------------------------------------


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(B=2, H=4, Hkv=2, L=5, S=5, Dh=8):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(B, H, L, Dh, generator=g),
        torch.randn(B, Hkv, S, Dh, generator=g),
        torch.randn(B, Hkv, S, Dh, generator=g),
    )


def test_no_mask_is_causal_as_sdpa_and_matches_the_functional():
    q, k, v = _qkv()
    out, w = backend.attention_forward(_Module(), q, k, v, None, scaling=0.3)
    ref, _ = functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, backend="math")
    assert w is None
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=0, atol=1e-6)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-6)


def test_is_causal_false_and_a_single_query_see_every_key():
    q, k, v = _qkv()
    out, _ = backend.attention_forward(_Module(), q, k, v, None, is_causal=False)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-6)
    out1, _ = backend.attention_forward(_Module(), q[:, :, -1:], k, v, None)  # decode: the last slot
    torch.testing.assert_close(out1, expected.transpose(1, 2)[:, -1:], rtol=0, atol=1e-6)


def test_bool_mask_is_may_attend_and_float_mask_is_added():
    q, k, v = _qkv()
    allowed = torch.rand(2, 1, 5, 5, generator=torch.Generator().manual_seed(1)) > 0.3
    allowed[..., 0] = True
    out, w = backend.attention_forward(_Module(), q, k, v, allowed, output_attentions=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-6)
    assert torch.all(w.masked_select(~allowed.expand_as(w)) == 0)
    additive = torch.randn(2, 1, 5, 5)
    out, _ = backend.attention_forward(_Module(), q, k, v, additive)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=additive, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-6)


def test_position_bias_is_added_to_the_scores():
    q, k, v = _qkv(Hkv=4)
    bias = torch.randn(1, 4, 5, 5)
    out, _ = backend.attention_forward(_Module(), q, k, v, None, position_bias=bias, is_causal=False)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-6)


def test_a_fully_masked_row_gives_zeros_not_nan():
    q, k, v = _qkv()
    allowed = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    allowed[0, 0, 1] = False
    out, w = backend.attention_forward(_Module(), q, k, v, allowed, output_attentions=True)
    assert torch.all(out[0, 1] == 0) and torch.all(w[0, :, 1] == 0) and not out.isnan().any()


@pytest.mark.parametrize(
    "name, value",
    [
        ("cu_seq_lens_q", torch.tensor([0, 5])),
        ("max_length_k", 5),
        ("indices", torch.zeros(2, 5, 2, dtype=torch.long)),
        ("sinks", torch.zeros(4)),
        ("deterministic", True),
        ("something_new", 1.0),
    ],
)
def test_unsupported_keywords_are_refused_by_name(name, value):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=f"^{name}: "):
        backend.attention_forward(_Module(), q, k, v, None, **{name: value})


def test_keywords_without_effect_or_none_are_accepted():
    q, k, v = _qkv()
    expected, _ = backend.attention_forward(_Module(), q, k, v, None)
    got, _ = backend.attention_forward(
        _Module(),
        q,
        k,
        v,
        None,
        position_ids=torch.arange(5)[None],
        use_cache=True,
        cu_seq_lens_q=None,
        softcap=None,
        s_aux=None,
        sliding_window=None,
        deterministic=False,
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def _allowed(L, S, window=None):
    """Bool (1, 1, L, S), True = may attend: transformers' own mask for queries at the last L of S slots."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function

    rule = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    return sdpa_mask(
        batch_size=1, q_length=L, kv_length=S, q_offset=S - L, mask_function=rule, allow_is_causal_skip=False
    )


def _eager_mask(allowed):
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)  # eager's additive form


class _HFModule(torch.nn.Module):
    """What transformers' eager functions read from the attention module."""

    is_causal = True
    num_key_value_groups = 2

    def __init__(self, sinks=None):
        super().__init__()
        self.sinks = sinks
        self.eval()


def test_softcap_equals_gemma2_eager():
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    q, k, v = _qkv(L=6, S=6)
    q = 4 * q  # scores large enough for the cap to bite
    allowed = _allowed(6, 6)
    expected, expected_w = eager_attention_forward(_HFModule(), q, k, v, _eager_mask(allowed), scaling=0.5, softcap=3.0)
    got, got_w = backend.attention_forward(
        _Module(), q, k, v, allowed, scaling=0.5, softcap=3.0, output_attentions=True
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_w, expected_w, rtol=0, atol=1e-6)
    uncapped, _ = backend.attention_forward(_Module(), q, k, v, allowed, scaling=0.5)
    assert (uncapped - expected).abs().max() > 1e-2


def test_sinks_equal_gpt_oss_eager():
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    q, k, v = _qkv(L=6, S=6)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    allowed = _allowed(6, 6)
    expected, expected_w = eager_attention_forward(_HFModule(sinks), q, k, v, _eager_mask(allowed), scaling=0.4)
    got, got_w = backend.attention_forward(
        _Module(), q, k, v, allowed, scaling=0.4, s_aux=sinks, output_attentions=True
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_w, expected_w, rtol=0, atol=1e-6)
    assert (got_w.sum(-1) < 1).all()  # a sink takes its share of every row


@pytest.mark.parametrize("L", [6, 1], ids=["prefill", "decode"])
def test_a_window_with_no_mask_equals_transformers_window_mask(L):
    q, k, v = _qkv(L=L, S=6)
    expected, _ = backend.attention_forward(_Module(), q, k, v, _allowed(L, 6, window=2))
    got, got_w = backend.attention_forward(_Module(), q, k, v, None, sliding_window=2, output_attentions=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    last = got_w[..., -1, :]  # the last query sees its own slot and the one before
    assert torch.all(last[..., :4] == 0) and torch.all(last[..., 4:] > 0)
    full, _ = backend.attention_forward(_Module(), q, k, v, None)
    assert (full - got).abs().max() > 1e-2


def test_a_window_with_no_mask_on_a_non_causal_call_is_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="^sliding_window: no mask arrived for a non-causal call"):
        backend.attention_forward(_Module(), q, k, v, None, sliding_window=2, is_causal=False)


@pytest.mark.parametrize("name, value", [("softcap", -1.0), ("s_aux", torch.zeros(3))])
def test_bad_softcap_and_sinks_are_named(name, value):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="^(softcap|sinks): "):
        backend.attention_forward(_Module(), q, k, v, None, **{name: value})


@pytest.mark.parametrize(
    "mask, error, pattern",
    [
        (torch.ones(2, 5, dtype=torch.bool), ValueError, "attention_mask: expected a shape"),
        (torch.ones(2, 1, 5, 4, dtype=torch.bool), ValueError, r"attention_mask: .*\(2, 1, 5, 4\)"),
        (torch.ones(2, 1, 5, 5, dtype=torch.long), TypeError, "attention_mask: .*int64"),
        ("causal", TypeError, "attention_mask: .*str"),
    ],
)
def test_masks_it_cannot_read_are_refused(mask, error, pattern):
    q, k, v = _qkv()
    with pytest.raises(error, match=pattern):
        backend.attention_forward(_Module(), q, k, v, mask)


# -- families off the interface -----------------------------------------------------------------------------------

# Candidates for a family that writes its own attention; the tests use those that still do on the installed
# transformers (5.25 moved Falcon onto the interface: it is then a supported family, see DECODERS).
_OFF_CANDIDATES = {
    "bloom": dict(hidden_size=32, n_head=4, n_layer=2, vocab_size=96),
    "mpt": dict(d_model=32, n_heads=4, n_layers=2, vocab_size=96),
    "xglm": dict(d_model=32, attention_heads=4, num_layers=2, ffn_dim=48, vocab_size=96),
    "falcon": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=96),
}
OFF_INTERFACE = {f: kw for f, kw in _OFF_CANDIDATES.items() if not family_calls_interface(f)}


def test_some_family_is_off_the_interface():
    assert OFF_INTERFACE, "no candidate family writes its own attention on this transformers: add one"


@pytest.mark.parametrize("family", sorted(OFF_INTERFACE)[:2])
def test_a_family_off_the_interface_is_refused_when_it_runs(family):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, **OFF_INTERFACE[family])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    with pytest.raises(ValueError, match=f"^model: the '{family}' family writes its own attention"):
        model(input_ids=torch.randint(0, 96, (1, 4)))


@pytest.mark.parametrize("family", sorted(OFF_INTERFACE))
@pytest.mark.parametrize("use", ["capture", "ablate"])
def test_capture_and_ablate_refuse_a_family_off_the_interface(family, use):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **OFF_INTERFACE[family])).eval()
    before = model.config._attn_implementation
    block = headwise.hf.capture(model) if use == "capture" else headwise.hf.ablate(model, {0: [0]})
    with pytest.raises(ValueError, match=f"^model: the '{family}' family writes its own attention"), block:
        pass
    assert model.config._attn_implementation == before


def test_not_a_transformers_model_is_refused():
    pattern = "^model: expected a transformers PreTrainedModel, got Linear"
    with pytest.raises(TypeError, match=pattern), headwise.hf.capture(torch.nn.Linear(2, 2)):
        pass
