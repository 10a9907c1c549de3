"""``headwise.interop.from_hf`` against tiny random Hugging Face models, built offline from configs.

Each test runs a whole Hugging Face model (eager attention, float32, eval) so that its own code builds the
masks, the positions and the cache; forward hooks capture what one attention module received and returned,
and the converted headwise module is fed the same hidden states. Whole outputs agree within 1e-5.
"""

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    BertConfig,
    BertModel,
    DynamicCache,
    GPT2Config,
    GPT2Model,
    LlamaConfig,
    LlamaModel,
    MistralConfig,
    MistralModel,
    Qwen2Config,
    Qwen2Model,
)

import headwise  # noqa: E402
from _hf_models import randomise  # noqa: E402
from headwise.interop import from_hf  # noqa: E402

TOL = 1e-5  # float32, absolute
D, H, B, L = 64, 4, 2, 12


# -- helpers ------------------------------------------------------------------------------------------------


class _Capture:
    """Records (hidden_states in, first output) of every call of ``module``."""

    def __init__(self, module: nn.Module):
        self.calls = []
        self._handle = module.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        y = output[0] if isinstance(output, tuple) else output
        self.calls.append((x.detach().clone(), y.detach().clone()))

    def remove(self):
        self._handle.remove()


def _x(batch=B, length=L, seed=1):
    return torch.randn(batch, length, D, generator=torch.Generator().manual_seed(seed))


def _pad_mask(kind: str, length: int = L) -> torch.Tensor:
    """HF ``attention_mask`` (B, L): 1 = real token. Item 1 has 3 pads, item 0 none."""
    am = torch.ones(B, length, dtype=torch.long)
    if kind == "left":
        am[1, :3] = 0
    elif kind == "right":
        am[1, -3:] = 0
    return am


def _positions(am: torch.Tensor) -> torch.Tensor:
    """Token positions that skip left padding, as ``generate`` computes them: (B, L)."""
    return (am.cumsum(-1) - 1).clamp(min=0)


def _assert_close(mine: torch.Tensor, theirs: torch.Tensor, rows: torch.Tensor | None = None, tol: float = TOL):
    """Whole tensors (B, L, D), or only the (B, L) ``rows`` that are True (real tokens)."""
    assert mine.shape == theirs.shape
    if rows is not None:
        mine, theirs = mine[rows], theirs[rows]
    torch.testing.assert_close(mine, theirs, atol=tol, rtol=0)


def _llama(**overrides):
    kw = dict(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=48,
        vocab_size=32,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    kw.update(overrides)
    return randomise(LlamaModel(LlamaConfig(**kw)))


def _gpt2(**overrides):
    kw = dict(n_embd=D, n_head=H, n_layer=2, n_positions=64, vocab_size=32, bos_token_id=0, eos_token_id=0)
    kw.update(overrides)
    return randomise(GPT2Model(GPT2Config(attn_implementation="eager", **kw)))


def _bert(**overrides):
    kw = dict(hidden_size=D, num_attention_heads=H, num_hidden_layers=2, intermediate_size=48, vocab_size=32)
    kw.update(overrides)
    return randomise(BertModel(BertConfig(attn_implementation="eager", **kw)))


def _run_layers(model, attn_modules, **forward_kwargs):
    caps = [_Capture(m) for m in attn_modules]
    with torch.no_grad():
        model(**forward_kwargs)
    for c in caps:
        c.remove()
    return [c.calls for c in caps]


# -- Llama family ------------------------------------------------------------------------------------------

LLAMA_CASES = {
    "gqa": {},
    "mha-bias-headdim-theta": dict(
        num_key_value_heads=4, attention_bias=True, head_dim=32, rope_parameters={"rope_theta": 500.0}
    ),
    "mqa-linear": dict(num_key_value_heads=1, rope_parameters={"rope_type": "linear", "factor": 4.0}),
    "llama3": dict(
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 50.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
    ),
}


@pytest.mark.parametrize("case", list(LLAMA_CASES))
def test_llama_causal_equals_hf(case):
    model = _llama(**LLAMA_CASES[case])
    x = _x()
    attns = [layer.self_attn for layer in model.layers]
    calls = _run_layers(model, attns, inputs_embeds=x)
    for attn, [(h, theirs)] in zip(attns, calls):
        mine = from_hf(attn)
        with torch.no_grad():
            out, _ = mine(h, is_causal=True)
        _assert_close(out, theirs)


def test_llama_structure_is_read_from_the_module():
    model = _llama(**LLAMA_CASES["mha-bias-headdim-theta"])
    mine = from_hf(model.layers[0].self_attn)
    assert (mine.d_model, mine.num_heads, mine.num_kv_heads, mine.head_dim) == (D, H, 4, 32)
    assert mine.Wo.bias is not None
    assert isinstance(mine.positional, headwise.RotaryEmbedding)
    assert (mine.positional.convention, mine.positional.base) == ("half", 500.0)
    assert not mine.training
    mqa = from_hf(_llama(**LLAMA_CASES["mqa-linear"]).layers[1].self_attn)
    assert mqa.num_kv_heads == 1 and mqa.Wq.bias is None


@pytest.mark.parametrize("padding", ["left", "right"])
def test_llama_padding_equals_hf(padding):
    model = _llama()
    x, am = _x(), _pad_mask(padding)
    pos = _positions(am)
    attns = [layer.self_attn for layer in model.layers]
    calls = _run_layers(model, attns, inputs_embeds=x, attention_mask=am, position_ids=pos)
    real = am.bool()
    for attn, [(h, theirs)] in zip(attns, calls):
        with torch.no_grad():
            out, _ = from_hf(attn)(h, key_padding_mask=~real, is_causal=True, position_ids=pos)
        _assert_close(out, theirs, rows=real)


def test_llama_cached_decode_equals_hf_dynamic_cache():
    """Left-padded prefill of 5 tokens, then 4 tokens one at a time: HF DynamicCache vs headwise KVCache."""
    model = _llama()
    prefill, steps = 5, 4
    total = prefill + steps
    x = _x(length=total, seed=2)
    am = torch.ones(B, total, dtype=torch.long)
    am[1, :2] = 0
    pos = _positions(am)
    attns = [layer.self_attn for layer in model.layers]
    caps = [_Capture(m) for m in attns]
    hf_cache = DynamicCache(config=model.config)
    chunks = [(0, prefill)] + [(t, t + 1) for t in range(prefill, total)]
    with torch.no_grad():
        for a, b in chunks:
            model(
                inputs_embeds=x[:, a:b],
                attention_mask=am[:, :b],
                position_ids=pos[:, a:b],
                cache=hf_cache,
                use_cache=True,
            )
    for c in caps:
        c.remove()
    assert hf_cache.get_seq_length() == total

    real = am.bool()
    for attn, cap in zip(attns, caps):
        mine = from_hf(attn)
        cache = headwise.KVCache.for_module(mine, B, total)
        assert len(cap.calls) == len(chunks)
        for (a, b), (h, theirs) in zip(chunks, cap.calls):
            with torch.no_grad():
                out, _ = mine(h, cache=cache, is_causal=True, key_padding_mask=~real[:, :b], position_ids=pos[:, a:b])
            _assert_close(out, theirs, rows=real[:, a:b])
        assert cache.length == total


def test_mistral_equals_hf():
    model = randomise(
        MistralModel(
            MistralConfig(
                hidden_size=D,
                num_attention_heads=H,
                num_key_value_heads=2,
                num_hidden_layers=1,
                intermediate_size=48,
                vocab_size=32,
                sliding_window=None,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                attn_implementation="eager",
            )
        )
    )
    x = _x()
    [[(h, theirs)]] = _run_layers(model, [model.layers[0].self_attn], inputs_embeds=x)
    with torch.no_grad():
        out, _ = from_hf(model.layers[0].self_attn)(h, is_causal=True)
    _assert_close(out, theirs)


def test_qwen2_equals_hf_with_qkv_biases_only():
    model = randomise(
        Qwen2Model(
            Qwen2Config(
                hidden_size=D,
                num_attention_heads=H,
                num_key_value_heads=2,
                num_hidden_layers=1,
                intermediate_size=48,
                vocab_size=32,
                attn_implementation="eager",
            )
        )
    )
    attn = model.layers[0].self_attn
    mine = from_hf(attn)
    assert mine.Wq.bias is not None and mine.Wo.bias is None
    x, am = _x(), _pad_mask("right")
    [[(h, theirs)]] = _run_layers(model, [attn], inputs_embeds=x, attention_mask=am)
    with torch.no_grad():
        out, _ = mine(h, is_causal=True, key_padding_mask=am == 0)
    _assert_close(out, theirs, rows=am.bool())


# -- GPT-2 -------------------------------------------------------------------------------------------------

GPT2_CASES = {
    "default": {},
    "unscaled": dict(scale_attn_weights=False),
    "inverse-layer-idx": dict(scale_attn_by_inverse_layer_idx=True),
}


@pytest.mark.parametrize("case", list(GPT2_CASES))
def test_gpt2_causal_equals_hf(case):
    model = _gpt2(**GPT2_CASES[case])
    x = _x()
    attns = [block.attn for block in model.h]
    calls = _run_layers(model, attns, inputs_embeds=x)
    for attn, [(h, theirs)] in zip(attns, calls):
        with torch.no_grad():
            out, _ = from_hf(attn)(h, is_causal=True)
        _assert_close(out, theirs)


def test_gpt2_conv1d_weights_are_transposed():
    attn = _gpt2().h[0].attn
    mine = from_hf(attn)
    w = attn.c_attn.weight  # (D, 3D), Conv1D: y = x @ w + b
    torch.testing.assert_close(torch.cat([mine.Wq.weight, mine.Wk.weight, mine.Wv.weight]), w.T, atol=0, rtol=0)
    torch.testing.assert_close(mine.Wo.weight, attn.c_proj.weight.T, atol=0, rtol=0)
    x = _x()
    torch.testing.assert_close(
        torch.cat([mine.Wq(x), mine.Wk(x), mine.Wv(x)], dim=-1), attn.c_attn(x), atol=TOL, rtol=0
    )


@pytest.mark.parametrize("padding", ["left", "right"])
def test_gpt2_padding_equals_hf(padding):
    model = _gpt2()
    x, am = _x(), _pad_mask(padding)
    attns = [block.attn for block in model.h]
    calls = _run_layers(model, attns, inputs_embeds=x, attention_mask=am, position_ids=_positions(am))
    real = am.bool()
    for attn, [(h, theirs)] in zip(attns, calls):
        with torch.no_grad():
            out, _ = from_hf(attn)(h, key_padding_mask=~real, is_causal=True)
        _assert_close(out, theirs, rows=real)


@pytest.mark.slow
def test_gpt2_cached_decode_equals_hf_dynamic_cache():
    model = _gpt2()
    prefill, total = 4, 8
    x = _x(length=total, seed=3)
    attns = [block.attn for block in model.h]
    caps = [_Capture(m) for m in attns]
    hf_cache = DynamicCache(config=model.config)
    chunks = [(0, prefill)] + [(t, t + 1) for t in range(prefill, total)]
    with torch.no_grad():
        for a, b in chunks:
            model(
                inputs_embeds=x[:, a:b],
                position_ids=torch.arange(a, b).expand(B, -1),
                cache=hf_cache,
                use_cache=True,
            )
    for c in caps:
        c.remove()
    for attn, cap in zip(attns, caps):
        mine = from_hf(attn)
        cache = headwise.KVCache.for_module(mine, B, total)
        for h, theirs in (c for c in cap.calls):
            with torch.no_grad():
                out, _ = mine(h, cache=cache, is_causal=True)
            _assert_close(out, theirs)


def test_gpt2_cross_attention_equals_hf():
    model = _gpt2(add_cross_attention=True)
    x, enc = _x(), _x(length=7, seed=4)
    enc_am = torch.ones(B, 7, dtype=torch.long)
    enc_am[0, -2:] = 0
    attn = model.h[0].crossattention
    [[(h, theirs)]] = _run_layers(
        model, [attn], inputs_embeds=x, encoder_hidden_states=enc, encoder_attention_mask=enc_am
    )
    with torch.no_grad():
        out, _ = from_hf(attn)(h, enc, enc, key_padding_mask=enc_am == 0)
    _assert_close(out, theirs)


# -- BERT --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_bert_equals_hf_self_attention_then_output_dense(padding):
    """``mine(x)`` = ``output.dense(self(x))``; ``output.LayerNorm(mine(x) + x)`` = the whole ``BertAttention``."""
    model = _bert()
    x, am = _x(), _pad_mask(padding)
    attns = [layer.attention for layer in model.encoder.layer]
    denses = [a.output.dense for a in attns]
    calls = _run_layers(model, attns + denses, inputs_embeds=x, attention_mask=am)
    pad = am == 0
    for attn, [(h, whole)], [(_, dense_out)] in zip(attns, calls[: len(attns)], calls[len(attns) :]):
        with torch.no_grad():
            out, _ = from_hf(attn)(h, key_padding_mask=pad)
            block = attn.output.LayerNorm(out + h)
        _assert_close(out, dense_out)  # every row: padded queries still attend to the real keys
        _assert_close(block, whole)


def test_bert_decoder_and_cross_attention_equal_hf():
    model = _bert(is_decoder=True, add_cross_attention=True)
    x, enc = _x(), _x(length=6, seed=5)
    enc_am = torch.ones(B, 6, dtype=torch.long)
    enc_am[1, -2:] = 0
    layer = model.encoder.layer[0]
    self_dense, cross_dense = layer.attention.output.dense, layer.crossattention.output.dense
    caps = _run_layers(
        model,
        [layer.attention, layer.crossattention, self_dense, cross_dense],
        inputs_embeds=x,
        encoder_hidden_states=enc,
        encoder_attention_mask=enc_am,
    )
    [[(h_self, _)], [(h_cross, _)], [(_, self_out)], [(_, cross_out)]] = caps
    with torch.no_grad():
        out_self, _ = from_hf(layer.attention)(h_self, is_causal=True)
        out_cross, _ = from_hf(layer.crossattention)(h_cross, enc, enc, key_padding_mask=enc_am == 0)
    _assert_close(out_self, self_out)
    _assert_close(out_cross, cross_out)


# -- dtype, training flag ----------------------------------------------------------------------------------


def test_dtype_device_and_training_mode_follow_the_source():
    attn = _llama().layers[0].self_attn.to(torch.float64).train()
    mine = from_hf(attn)
    assert mine.Wq.weight.dtype == torch.float64 and mine.training
    assert mine.Wq.weight.data_ptr() != attn.q_proj.weight.data_ptr()  # a copy, not shared storage


# -- bad input ---------------------------------------------------------------------------------------------


def test_unsupported_module_type_lists_the_supported_ones():
    with pytest.raises(TypeError, match=r"LlamaAttention.*GPT2Attention.*BertAttention.*got torch\.nn.*Linear"):
        from_hf(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="MultiheadAttention"):
        from_hf(nn.MultiheadAttention(8, 2))


def test_bert_self_attention_alone_points_to_its_parent():
    with pytest.raises(TypeError, match="BertSelfAttention.*pass its parent BertAttention"):
        from_hf(_bert().encoder.layer[0].attention.self)


def test_a_lookalike_outside_transformers_is_rejected():
    LlamaAttention = type("LlamaAttention", (nn.Module,), {})
    with pytest.raises(TypeError, match="LlamaAttention"):
        from_hf(LlamaAttention())


def test_gpt2_reorder_and_upcast_is_rejected_by_name():
    with pytest.raises(ValueError, match="reorder_and_upcast_attn"):
        from_hf(_gpt2(reorder_and_upcast_attn=True).h[0].attn)


@pytest.mark.parametrize("rope", [{"rope_type": "dynamic", "factor": 2.0}])
def test_llama_unsupported_rope_type_is_rejected_by_name(rope):
    model = _llama(num_hidden_layers=1, rope_parameters=dict(rope))
    match = rf"rope_parameters.*rope_type '{rope['rope_type']}'.*default, linear, llama3, yarn"
    with pytest.raises(ValueError, match=match):
        from_hf(model.layers[0].self_attn)


def test_llama_partial_rotary_is_rejected_by_name():
    attn = _llama(num_hidden_layers=1).layers[0].self_attn
    attn.config.rope_parameters["partial_rotary_factor"] = 0.5
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5"):
        from_hf(attn)


def test_llama_rope_parameters_per_layer_type_are_rejected():
    attn = _llama(num_hidden_layers=1).layers[0].self_attn
    attn.config.rope_parameters = {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}
    with pytest.raises(ValueError, match=r"rope_parameters: RoPE settings per layer type \(full_attention\)"):
        from_hf(attn)


def test_sliding_windows_reach_the_module():
    # equality with the Hugging Face modules, windows exercised: tests/interop/test_hugging_face_kinds.py
    small = dict(hidden_size=D, num_attention_heads=H, num_key_value_heads=2, num_hidden_layers=1, intermediate_size=48)
    mistral = MistralModel(MistralConfig(vocab_size=32, sliding_window=16, **small))
    assert from_hf(mistral.layers[0].self_attn).sliding_window == 16
    windowed = dict(use_sliding_window=True, sliding_window=8, max_window_layers=0)
    qwen = Qwen2Model(Qwen2Config(vocab_size=32, **windowed, **small))
    assert from_hf(qwen.layers[0].self_attn).sliding_window == 8
