"""The anatomy's algebra, each operation once against the module's own forward pass, on tiny random decoders whose
parts differ: separate and fused projections (GPT-2's Conv1D, Phi-3's qkv_proj), QK-norms per head (Qwen 3) and over
the projection (OLMo 2), norms on the writes (OLMo 2, Gemma 2), norms stored as ``1 + w`` (Gemma, Nemotron's
LayerNorm), a parameter-free LayerNorm (OLMo), the interleaved rotation (Cohere)."""

from __future__ import annotations

import pytest
import torch

from _anatomy_models import V, tiny
from headwise.models import HeadModel
from headwise.models.anatomy import LAYOUTS
from headwise.models.norms import freeze
from headwise.points import output_tensor
from headwise.positional.rope import CONVENTIONS

FAMILIES = ["llama", "gpt2", "phi3", "qwen3", "olmo2", "gemma2", "gemma", "nemotron", "olmo", "cohere"]


def _run(family: str):
    hm = HeadModel(tiny(family))
    ids = torch.randint(3, V, (2, 7), generator=torch.Generator().manual_seed(1))
    names = []
    for i in range(len(hm.anatomy)):
        names += [f"layers.{i}.{p}" for p in ("resid_pre", "attn.in", "attn.q", "attn.k", "attn.v", "attn.qk")]
        names += [f"layers.{i}.attn.heads", f"layers.{i}.attn.out"]
        names += [f"layers.{i}.attn.rotary"] if f"layers.{i}.attn.rotary" in hm.points else []
    names.append("resid_final")
    with torch.no_grad():
        return hm, hm.run_with_cache(ids, names=names)


@pytest.fixture(scope="module", params=FAMILIES)
def run(request):
    return _run(request.param)


def test_a_sides_weights_in_every_layout_give_the_projection(run):
    hm, cache = run
    part = hm.anatomy[1]
    x = cache["layers.1.attn.in"]  # (B, L, D): what the projections read
    for side in (part.q, part.k, part.v):
        want = cache[f"layers.1.attn.{side.name}"]  # (B, L, n, Dh) as projected
        for layout in LAYOUTS:
            W, b = side.weights(layout)
            if layout == "heads":
                got = torch.einsum("bld,nwd->blnw", x, W)
            else:
                got = (x @ (W.T if layout == "rows" else W)).reshape(want.shape)
            got = got if b is None else got + b.reshape(want.shape[-2:])
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_input_norm_frozen_at_a_run_is_the_norm_and_linear_in_parts(run):
    hm, cache = run
    part = hm.anatomy[1]
    r = cache["layers.1.resid_pre"].reshape(-1, hm.anatomy[1].q.weights("columns")[0].shape[0])  # (N, D)
    frozen = part.attn_norm_frozen(r)
    want = cache["layers.1.attn.in"].reshape(r.shape).double()
    if frozen is None:
        torch.testing.assert_close(r.double(), want)
        return
    torch.testing.assert_close(frozen(r.double()) + frozen.bias, want, rtol=1e-5, atol=1e-5)
    a = torch.randn(r.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    torch.testing.assert_close(frozen(a) + frozen(r.double() - a), frozen(r.double()), rtol=1e-9, atol=1e-9)
    # the vector–Jacobian product is the module's own
    u = torch.randn(1, 1, *r.shape, generator=torch.Generator().manual_seed(3))
    x = r[None].clone().requires_grad_(True)
    with torch.enable_grad():
        (want_grad,) = torch.autograd.grad(output_tensor(part.attn_norm(x)), x, u[:, 0])
    torch.testing.assert_close(part.attn_norm_vjp(r[None], u)[:, 0], want_grad, rtol=1e-5, atol=1e-6)


def test_qk_norm_factor_and_rotation_give_the_attention_s_queries_and_keys(run):
    hm, cache = run
    part = hm.anatomy[1]
    rows = cache["layers.1.attn.qk"]
    pe = None
    if part.rotation.kind == "tables":
        assert part.rotation.convention in CONVENTIONS
        pe = cache["layers.1.attn.rotary"]
    for side, used in ((part.q, rows.q), (part.k, rows.k)):
        t = side.apply_norm(cache[f"layers.1.attn.{side.name}"]) * side.scale  # (B, L, n, Dh)
        L = t.shape[1]
        for b in range(t.shape[0]):
            got = part.rotation(t[b].transpose(0, 1), torch.arange(L), pe)  # (n, L, Dh)
            torch.testing.assert_close(got, used[b, :, :L], rtol=1e-4, atol=1e-5)


def test_the_heads_writes_and_the_norm_on_them_give_the_attention_s_output(run):
    hm, cache = run
    part = hm.anatomy[1]
    z = cache["layers.1.attn.heads"]  # (B, H, L, Dv)
    o = cache["layers.1.attn.out"]  # (B, L, D): the output projection's output
    bias = output_tensor(part.out_proj(z.new_zeros(1, 1, z.shape[1] * z.shape[-1])))  # (1, 1, D)
    torch.testing.assert_close(part.head_writes(z).sum(1) + bias[0], o, rtol=1e-4, atol=1e-5)
    if part.attn_post is not None:
        want = output_tensor(part.attn_post(o))
        torch.testing.assert_close(o * part.attn_post_scale(o), want, rtol=1e-4, atol=1e-5)
        rows = o.reshape(-1, o.shape[-1])
        frozen = part.attn_post_frozen(rows)
        got = frozen(rows.double()) + frozen.bias
        torch.testing.assert_close(got, want.reshape(rows.shape).double(), rtol=1e-5, atol=1e-5)


def test_the_final_norm_frozen_is_the_module(run):
    hm, cache = run
    x = cache["resid_final"].reshape(-1, cache["resid_final"].shape[-1])
    frozen = hm.anatomy.final_norm_frozen(x)
    want = output_tensor(hm.anatomy.final_norm(x)).double()
    torch.testing.assert_close(frozen(x.double()) + frozen.bias, want, rtol=1e-5, atol=1e-5)


def test_a_norm_stored_as_one_plus_w_is_read_as_it_acts():
    """Nemotron's LayerNorm1P is an nn.LayerNorm whose weight is not its gain (it applies 1 + weight): probed, not
    read from the class; a plain nn.LayerNorm reads exactly its stored parameters."""
    hm = HeadModel(tiny("nemotron"))
    norm = hm.anatomy[0].attn_norm
    assert isinstance(norm, torch.nn.LayerNorm)
    x = torch.randn(5, norm.weight.shape[0], generator=torch.Generator().manual_seed(4))
    frozen = hm.anatomy[0].attn_norm_frozen(x)
    assert frozen.centred
    torch.testing.assert_close(frozen.gain, 1.0 + norm.weight.detach().double(), rtol=1e-5, atol=1e-6)
    plain = torch.nn.LayerNorm(8)
    with torch.no_grad():
        plain.weight.uniform_(0.5, 1.5)
        plain.bias.uniform_(-0.5, 0.5)
    got = freeze(plain, torch.randn(4, 8), what="plain")
    assert torch.equal(got.gain, plain.weight.detach().double()) and torch.equal(got.bias, plain.bias.detach().double())


def test_the_rotation_speaks_the_positional_vocabulary():
    from headwise.models.rotation import Rotation

    assert {r.convention for r in Rotation.candidates()} == set(CONVENTIONS)
    with pytest.raises(ValueError, match="convention"):
        Rotation("tables", convention="pairs", tables="full")
