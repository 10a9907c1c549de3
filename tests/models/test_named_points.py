"""The one model view and its named points: the names on Hugging Face families, headwise's BERT and a lab
decoder; the residual points against transformers' own hidden states; a hook by name against ``hf.ablate``;
unknown names refused; nothing hooked that was not asked for; the analysis protocol."""

from __future__ import annotations

import pytest
import torch

import headwise.models as M
from headwise.analysis.protocol import AnalysedModel, GatedModel, RowModel
from headwise.models import HeadModel

pytest.importorskip("transformers")

import headwise.hf  # noqa: E402
from _hf_models import VOCAB, build  # noqa: E402

PER_LAYER = ("resid_pre", "attn.in", "attn.qk", "attn.pattern", "attn.heads", "attn.out", "mlp.in", "mlp.out")
#: the points the anatomy adds on a pre-norm decoder (and ``attn.rotary`` where the family hands its attention
#: the rotary (cos, sin))
ANATOMY = ("attn.q", "attn.k", "attn.v", "mlp.resid")
FULL = ("resid_pre", "attn.in", "attn.q", "attn.k", "attn.v", "attn.rotary", "attn.qk", "attn.pattern")
FULL += ("attn.heads", "attn.out", "mlp.resid", "mlp.in", "mlp.out")
FAMILIES = ["llama", "gpt2", "gemma2", "qwen3"]  # llama: GQA; gemma2: post-norms, soft-capping, windows


def _names(layers: int, per_layer=PER_LAYER, *, head: bool = True) -> list[str]:
    """The names in forward order; ``head``: a language model's ``unembed.in`` last."""
    return [f"layers.{i}.{p}" for i in range(layers) for p in per_layer] + ["resid_final"] + ["unembed.in"] * head


def _hooks_registered(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.fixture(scope="module", params=FAMILIES)
def hf(request):
    return request.param, HeadModel(build(request.param, attn="headwise"))


def _ids(B=2, L=7, seed=0):
    return torch.randint(3, VOCAB, (B, L), generator=torch.Generator().manual_seed(seed))


# -- names ---------------------------------------------------------------------------------------------------------


def test_every_point_of_a_hugging_face_family_is_named(hf):
    family, hm = hf
    per_layer = FULL if family != "gpt2" else tuple(p for p in FULL if p != "attn.rotary")  # GPT-2: no RoPE
    assert hm.point_names() == _names(2, per_layer)
    assert (hm.backend, hm.num_layers, hm.num_heads, hm.heads_per_layer) == ("hf+headwise", 2, 4, [4, 4])


def test_headwise_bert_and_a_lab_decoder_have_the_same_names(tiny_checkpoint):
    bert = M.open_model(tiny_checkpoint)
    assert bert.point_names() == _names(2, head=False)  # post-norm: no anatomy, so none of its points
    assert bert.points["layers.1.mlp.in"].module is bert.model.layers[1].ffn_in
    torch.manual_seed(0)
    config = dict(vocab_size=32, context_length=16, d_model=16, num_layers=3, num_heads=2)
    lm = M.TransformerLM(M.LMConfig(**config, d_ff=24))
    lab = M.lab_head_model(lm)
    assert lab.point_names() == _names(3, tuple(p for p in FULL if p != "attn.rotary"))
    assert lab.points["layers.2.attn.heads"].module is lm.layers[2].self_attn.hook_heads
    attention_only = M.lab_head_model(M.TransformerLM(M.LMConfig(**config)))  # no MLP: no MLP points
    assert attention_only.point_names() == _names(3, FULL[:5] + FULL[6:10])


def test_a_hugging_face_bert_has_no_write_points():
    """Its output projections sit with the residual's LayerNorm (post-norm): no attention or MLP write."""
    hm = HeadModel(build("bert", attn="headwise"))
    assert hm.point_names() == _names(2, ("resid_pre", "attn.in", "attn.qk", "attn.pattern", "attn.heads"), head=False)


# -- values --------------------------------------------------------------------------------------------------------


def _final_norm(model):
    return model.model.norm if hasattr(model, "model") else model.transformer.ln_f


def test_the_residual_points_are_transformers_hidden_states(hf):
    family, hm = hf
    ids = _ids()
    names = [f"layers.{i}.resid_pre" for i in range(2)] + ["resid_final"]
    cache = hm.run_with_cache(ids, names=names)
    with torch.no_grad():
        hidden = hm.model(input_ids=ids, output_hidden_states=True).hidden_states  # NL + 1 of (B, L, D)
        final = _final_norm(hm.model)(cache["resid_final"])
    assert list(cache) == names
    for i in range(2):
        torch.testing.assert_close(cache[f"layers.{i}.resid_pre"], hidden[i], atol=1e-6, rtol=0)
    torch.testing.assert_close(final, hidden[-1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_pre_norm_block_adds_its_two_writes_to_the_residual(family):
    hm = HeadModel(build(family, attn="headwise"))
    cache = hm.run_with_cache(_ids())
    for i in range(2):
        after = cache["layers.1.resid_pre"] if i == 0 else cache["resid_final"]
        parts = cache[f"layers.{i}.resid_pre"] + cache[f"layers.{i}.attn.out"] + cache[f"layers.{i}.mlp.out"]
        torch.testing.assert_close(parts, after, atol=1e-5, rtol=0)
    assert cache["layers.0.attn.heads"].shape == (2, 4, 7, 8)  # (B, H, L, Dh)
    assert cache["layers.0.attn.pattern"].shape == (2, 4, 7, 7)  # (B, H, L, S)


def test_headwise_bert_residual_points_are_its_hidden_states(tiny_checkpoint):
    bert = M.open_model(tiny_checkpoint)
    ids = torch.randint(5, bert.vocab_size, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    cache = bert.run_with_cache(ids, mask, names=["layers.0.resid_pre", "layers.1.resid_pre", "resid_final"])
    with torch.no_grad():
        hidden = bert.model(ids, mask).hidden_states
    for name, want in zip(cache, hidden):
        torch.testing.assert_close(cache[name], want, atol=1e-6, rtol=0)


def test_a_lab_decoder_final_residual_gives_its_logits():
    torch.manual_seed(0)
    lm = M.TransformerLM(M.LMConfig(vocab_size=32, context_length=16, d_model=16, num_layers=2, num_heads=2)).eval()
    hm = M.lab_head_model(lm)
    ids = torch.randint(0, 32, (2, 9))
    names = ["layers.0.attn.pattern", "layers.1.attn.pattern", "resid_final"]
    cache = hm.run_with_cache(ids, names=names)
    with torch.no_grad():
        torch.testing.assert_close(lm.unembed(lm.norm(cache["resid_final"])), lm(ids), atol=1e-6, rtol=0)
    for name, weights in zip(names, hm.attentions(ids)):  # (B, H, L, L) each
        torch.testing.assert_close(cache[name].numpy(), weights, atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_zeroing_a_head_by_name_equals_hf_ablate(family):
    model = build(family, attn="headwise")
    hm = HeadModel(model)
    ids = _ids()

    def zero_head_1(out):  # (B, H, L, Dh)
        out = out.clone()
        out[:, 1] = 0
        return out

    with torch.no_grad():
        with hm.hooks({"layers.1.attn.heads": zero_head_1}):
            named = hm.logits(ids)
        with headwise.hf.ablate(model, {1: [1]}):
            ablated = model(input_ids=ids, use_cache=False).logits
        intact = hm.logits(ids)
    torch.testing.assert_close(named, ablated, atol=1e-6, rtol=0)
    assert (named - intact).abs().max() > 1e-3


def test_a_hook_on_a_residual_point_replaces_the_tensor(hf):
    _, hm = hf
    ids = _ids()
    with torch.no_grad():
        intact = hm.logits(ids)
        with hm.hooks({"layers.1.resid_pre": lambda x: x}):  # a replacement equal to the input
            same = hm.logits(ids)
        with hm.hooks({"layers.1.resid_pre": torch.zeros_like}):
            zeroed = hm.logits(ids)
    torch.testing.assert_close(same, intact, atol=0, rtol=0)
    assert (zeroed - intact).abs().max() > 1e-3


# -- mistakes and costs ------------------------------------------------------------------------------------------


def test_unknown_names_are_refused_with_the_close_ones(hf):
    _, hm = hf
    before = _hooks_registered(hm.model)  # transformers keeps its own output recorders once a pass asked
    close = r"^hooks: no point named 'layers\.0\.attn\.head'.*layers\.0\.attn\.heads"
    with pytest.raises(ValueError, match=close), hm.hooks({"layers.0.attn.head": print}):
        pass
    with pytest.raises(ValueError, match=r"'layers\.7\.attn\.heads'.*has 2 attention layers \(0\.\.1\)"):
        hm.run_with_cache(_ids(), names=["layers.7.attn.heads"])
    with pytest.raises(ValueError, match=r"no point named 'blocks\.0\.hook_z'"):
        hm.run_with_cache(_ids(), names=["blocks.0.hook_z"])
    with (
        pytest.raises(TypeError, match=r"^layers\.0\.resid_pre: expected a callable"),
        hm.hooks({"layers.0.resid_pre": 3}),
    ):
        pass
    assert _hooks_registered(hm.model) == before


def test_nothing_is_hooked_that_was_not_asked_for(hf):
    family, _ = hf
    hm = HeadModel(build(family, attn="headwise"))
    hm.point_names()
    assert _hooks_registered(hm.model) == 0
    with hm.hooks({"layers.0.mlp.out": lambda x: None}):
        assert _hooks_registered(hm.model) == 1
    assert _hooks_registered(hm.model) == 0


def test_a_model_off_headwise_attention_is_refused():
    with pytest.raises(ValueError, match="^model: runs on 'eager' attention.*attn_implementation='headwise'"):
        HeadModel(build("llama", attn="eager"))
    with pytest.raises(TypeError, match="^model: expected an nn.Module"):
        HeadModel("llama")


# -- the protocol ---------------------------------------------------------------------------------------------------


def test_the_view_satisfies_the_analysis_protocol(tiny_checkpoint, hf):
    for hm in (M.open_model(tiny_checkpoint), hf[1]):
        assert isinstance(hm, AnalysedModel) and isinstance(hm, RowModel) and isinstance(hm, GatedModel)

    def members(protocol) -> set[str]:
        methods = {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
        return set(protocol.__annotations__) | methods

    assert members(RowModel) == {"num_layers", "num_heads", "read_rows"}
    assert members(GatedModel) == {"kind", "num_layers", "num_heads", "model", "forward", "gated"}


def test_the_view_satisfies_what_the_anatomy_finder_reads(tiny_checkpoint, hf):
    """The anatomy finder takes a ``ProbedView`` (the view finds its anatomy lazily, so the two do not import each
    other): every view is one, and a module is not."""
    from headwise.models.anatomy_recording import ProbedView

    for hm in (M.open_model(tiny_checkpoint), hf[1]):
        assert isinstance(hm, ProbedView)
    assert not isinstance(hf[1].model, ProbedView)


def test_patching_gets_the_same_view():
    from headwise.patching import as_target

    model = build("llama", attn="headwise")
    view = as_target(model)
    assert isinstance(view, HeadModel) and view.model is model and as_target(view) is view
    with pytest.raises(ValueError, match="has no language-model head"):
        as_target(build("bert", attn="headwise"))


# -- the anatomy's points ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "phi3"])
def test_a_fused_projections_heads_are_points_of_their_own(family):
    """``attn.q`` / ``attn.k`` / ``attn.v`` give each side's heads out of a fused projection (GPT-2's c_attn,
    GPT-NeoX's interleaved query_key_value, Phi-3's qkv_proj); a replacement changes those columns alone —
    against a forward hook that edits the projection's output by hand at the anatomy's columns."""
    from _anatomy_models import tiny

    hm = HeadModel(tiny(family))
    part = hm.anatomy[0]
    ids = _ids(B=1, L=5)
    cache = hm.run_with_cache(ids, names=["layers.0.attn.q", "layers.0.attn.k", "layers.0.attn.v", "layers.0.attn.qk"])
    q, k = cache["layers.0.attn.q"], cache["layers.0.attn.k"]  # (B, L, n, Dh), before rotation
    assert q.shape[2] == part.num_heads and k.shape[2] == part.num_kv
    torch.testing.assert_close(q[0, 0], cache["layers.0.attn.qk"].q[0, :, 0], atol=1e-5, rtol=0)  # position 0

    def by_hand(_m, _args, out):
        out = out.clone()
        out[..., part.v.columns[1].reshape(-1)] = 0.0
        return out

    handle = part.v.module.register_forward_hook(by_hand)
    try:
        want = hm.logits(ids)
    finally:
        handle.remove()

    def zero_group(t):
        t = t.clone()
        t[:, :, 1] = 0.0
        return t

    with hm.hooks({"layers.0.attn.v": zero_group}):
        got = hm.logits(ids)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert not torch.allclose(got, hm.logits(ids))


def test_the_mlps_residual_is_replaced_for_the_mlp_alone_where_the_norm_is_shared():
    """Phi-2's MLP reads the attention's input norm: ``mlp.resid`` changes the MLP's input to norm(r') and leaves
    the attention's input as it was."""
    from _anatomy_models import tiny

    hm = HeadModel(tiny("phi"))
    part = hm.anatomy[1]
    assert part.shared_norm and part.parallel
    ids = _ids(B=1, L=5)
    delta = torch.randn(1, 5, hm.model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    names = ["layers.1.attn.in", "layers.1.mlp.in"]
    with hm.hooks({"layers.1.mlp.resid": lambda r: r + delta}):
        got = hm.run_with_cache(ids, names=names)
    plain = hm.run_with_cache(ids, names=names + ["layers.1.resid_pre"])
    torch.testing.assert_close(got["layers.1.attn.in"], plain["layers.1.attn.in"], atol=0, rtol=0)
    with torch.no_grad():
        want = part.mlp_norm(plain["layers.1.resid_pre"] + delta)
    torch.testing.assert_close(got["layers.1.mlp.in"], want, atol=1e-6, rtol=0)


def test_point_names_come_from_one_helper_that_knows_every_layer_point(hf):
    """``layer_point`` names every layer's point the view lists, in its order, and refuses a kind no layer has (the
    one place a point's name is assembled: a misspelt kind fails where it is written, not as an unknown point)."""
    from headwise.points import POINT_ORDER, attention_point, layer_point

    hm = hf[1]
    names = set(hm.point_names())
    for layer in range(hm.num_layers):
        listed = [k for k in POINT_ORDER if layer_point(layer, k) in names]
        assert [n for n in hm.point_names() if n.startswith(f"layers.{layer}.")] == [
            layer_point(layer, k) for k in listed
        ]
    assert attention_point(1, "heads") == layer_point(1, "attn.heads") == "layers.1.attn.heads"
    with pytest.raises(ValueError, match=r"kind: expected one of resid_pre, .*got 'attn.head'"):
        layer_point(0, "attn.head")
