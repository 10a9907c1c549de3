"""``from_hf`` reads the module and its config, not its class name: one sweep over many families.

Each family is a tiny random base model built offline with ``AutoConfig.for_model`` (eager attention, float32,
eval). One forward of the whole model lets Hugging Face's own code build the masks (causal, sliding window per
layer type) and the rotary tables; forward hooks capture what each attention layer received and returned, and
the converted module, fed the same hidden states, must return the same whole ``(B, L, D)`` tensor within
1e-5 on every layer. Sequences (12) are longer than the windows (4).
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _hf_models import CONVERTIBLE, VOCAB, from_config  # noqa: E402
from headwise.interop import from_hf  # noqa: E402

TOL = 1e-5  # float32, absolute
B, L = 2, 12


def _layers(family, model):
    """``[(module to convert, module whose output is compared, causal)]``, one per layer."""
    if family == "gpt2":
        return [(block.attn, block.attn, True) for block in model.h]
    if family == "bert":  # headwise's module ends at output.dense; the residual LayerNorm stays outside
        return [(layer.attention, layer.attention.output.dense, False) for layer in model.encoder.layer]
    return [(layer.self_attn, layer.self_attn, True) for layer in model.layers]


def _run(model, layers):
    """``[(hidden states into the attention module, output of the compared module)]`` from one forward."""
    seen = {}

    def hook(module, args, kwargs, output):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        y = output[0] if isinstance(output, tuple) else output
        seen.setdefault(id(module), []).append((x.detach().clone(), y.detach().clone()))

    watched = {id(m): m for source, target, _ in layers for m in (source, target)}
    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in watched.values()]
    ids = torch.randint(3, VOCAB, (B, L), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=ids)
    for h in handles:
        h.remove()
    return [(seen[id(source)][0][0], seen[id(target)][0][1]) for source, target, _ in layers]


@pytest.mark.parametrize("family", list(CONVERTIBLE))
def test_every_layer_equals_the_hugging_face_module(family):
    model = from_config(family, CONVERTIBLE[family])
    layers = _layers(family, model)
    for i, ((source, _, causal), (x, want)) in enumerate(zip(layers, _run(model, layers))):
        mine = from_hf(source)
        with torch.no_grad():
            got = mine(x, is_causal=causal)[0]
        torch.testing.assert_close(got, want, atol=TOL, rtol=0, msg=lambda s, i=i: f"{family} layer {i}: {s}")


def test_cohere2_rotates_interleaved_pairs_on_local_layers_only():
    model = from_config("cohere2", CONVERTIBLE["cohere2"])
    mine = [from_hf(layer.self_attn) for layer in model.layers]
    assert [m.sliding_window for m in mine] == [4, 4, 4, None]
    assert [m.positional and m.positional.convention for m in mine] == ["interleaved"] * 3 + [None]


def test_layers_without_rope_are_read_from_what_the_layer_computes():
    model = from_config("smollm3", CONVERTIBLE["smollm3"])  # no RoPE on every fourth layer
    assert [from_hf(layer.self_attn).positional is None for layer in model.layers] == [False, False, False, True]


def test_the_probe_leaves_the_callers_hooks_alone():
    attn = from_config("llama", CONVERTIBLE["llama"]).layers[0].self_attn
    calls = []
    attn.register_forward_hook(lambda *args: calls.append(1))
    from_hf(attn)
    assert calls == []


def test_norms_windows_caps_and_sinks_reach_the_module():
    qwen3 = from_hf(from_config("qwen3", CONVERTIBLE["qwen3"]).layers[0].self_attn)
    assert qwen3.qk_norm == "head" and qwen3.positional.convention == "half"
    gemma2 = [from_hf(layer.self_attn) for layer in from_config("gemma2", CONVERTIBLE["gemma2"]).layers]
    assert [(m.sliding_window, m.softcap) for m in gemma2] == [(4, 5.0), (None, 5.0)]
    oss = from_hf(from_config("gpt_oss", CONVERTIBLE["gpt_oss"]).layers[0].self_attn)
    assert oss.sinks.shape == (4,) and oss.sliding_window == 4


def test_exaone4_global_layers_have_neither_rope_nor_window():
    mine = [from_hf(layer.self_attn) for layer in from_config("exaone4", CONVERTIBLE["exaone4"]).layers]
    assert [(m.sliding_window, m.positional is None) for m in mine] == [(4, False)] * 3 + [(None, True)]


def test_olmo3_rotates_each_layer_type_by_its_own_rope_settings():
    mine = [from_hf(layer.self_attn) for layer in from_config("olmo3", CONVERTIBLE["olmo3"]).layers]
    assert [m.sliding_window for m in mine] == [4, 4, 4, None]
    assert [(m.positional.base, m.positional.scaling and m.positional.scaling["rope_type"]) for m in mine] == [
        (1e4, None)
    ] * 3 + [(5e5, "yarn")]


def _deepseek_layer():
    from _hf_models import build

    return build("deepseek_v3").model.layers[0].self_attn


@pytest.mark.parametrize(
    "reader, layer",
    [
        ("from_separate_projections", lambda: from_config("llama", CONVERTIBLE["llama"]).layers[1].self_attn),
        ("from_latent", _deepseek_layer),
        ("from_gpt2", lambda: from_config("gpt2", CONVERTIBLE["gpt2"]).h[1].attn),
        ("from_bert", lambda: from_config("bert", CONVERTIBLE["bert"]).encoder.layer[1].attention),
    ],
)
def test_every_layout_is_checked_against_its_source_and_a_wrong_conversion_refused(monkeypatch, reader, layer):
    """Each reader's result is checked: an output projection off by 1 % is refused, naming layer and family."""
    import headwise.interop.hugging_face as hf

    right = getattr(hf, reader)

    def off_by_one_percent(m):
        mine = right(m)
        with torch.no_grad():
            mine.Wo.weight.mul_(1.01)
        return mine

    module = layer()
    from_hf(module)  # converts as it is
    monkeypatch.setattr(hf, reader, off_by_one_percent)
    with pytest.raises(
        ValueError,
        match=r"module: layer \d of \w+ \(\w+\) converted to a \w+ that differs from it — its output differs by",
    ):
        from_hf(module)


def test_the_check_refuses_the_window_exaone4_used_to_get(monkeypatch):
    """The global layer converted with the module's own sliding_window (the config's, on every layer) is refused."""
    import headwise.interop.hf_layouts as layouts

    monkeypatch.setattr(layouts, "window_of", lambda m, config: m.sliding_window)
    layers = from_config("exaone4", CONVERTIBLE["exaone4"]).layers
    from_hf(layers[0].self_attn)  # a local layer: right either way
    with pytest.raises(
        ValueError,
        match=r"layer 3 of exaone4 \(Exaone4Attention\) converted to a MultiHeadAttention that differs from it — "
        r"the module asks its attention for sliding_window=None, the converted module has sliding_window=4",
    ):
        from_hf(layers[3].self_attn)


def test_the_check_refuses_rope_frequencies_that_differ_from_the_models(monkeypatch):
    """The rotation probe finds the layout on its own tables; the check runs the model's: YaRN dropped is refused."""
    import headwise.interop.hf_config as config

    def without_scaling(head_dim, *, scaling=None, **kwargs):
        return config.RotaryEmbedding.__wrapped__(head_dim, **kwargs)

    without_scaling.__wrapped__ = config.RotaryEmbedding
    monkeypatch.setattr(config, "RotaryEmbedding", without_scaling)
    layers = from_config("olmo3", CONVERTIBLE["olmo3"]).layers
    from_hf(layers[0].self_attn)  # no scaling there
    with pytest.raises(ValueError, match=r"layer 3 of olmo3 \(Olmo3Attention\)"):
        from_hf(layers[3].self_attn)


@pytest.mark.parametrize(
    "family, overrides, match",
    [
        ("olmo", dict(clip_qkv=0.5), r"config\.clip_qkv=0\.5: OlmoAttention uses clipped queries, keys and values"),
        (
            "cohere",
            dict(use_qk_norm=True),
            r"q_norm: CohereLayerNorm: CohereAttention uses a q_norm that is not an RMSNorm",
        ),
        ("llama4_text", dict(num_local_experts=2, head_dim=8), r"Llama4TextAttention uses chunked attention"),
        (
            "stablelm",
            dict(partial_rotary_factor=0.25),
            r"partial_rotary_factor=0\.25: StableLmAttention uses partial rotary",
        ),
    ],
)
def test_what_headwise_cannot_compute_is_refused_by_class_and_kind(family, overrides, match):
    model = from_config(family, {"num_key_value_heads": 2, **overrides})
    with pytest.raises(ValueError, match=match):
        from_hf(model.layers[0].self_attn)
