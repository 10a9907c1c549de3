"""The hook points of headwise's attention modules: ``hook_heads`` (per-head outputs where the heads meet
``Wo``) and ``hook_pattern`` (the weights). A gate there equals the definition — each head's slice of
``Wo``'s input scaled by a pre-hook on ``Wo`` — as whole tensors; the pattern read there equals the weights
the module returns when asked; an unhooked point changes nothing."""

import pytest
import torch

from headwise.core.attention import MultiHeadAttention
from headwise.core.hooks import HookPoint, hooked
from headwise.core.latent import LatentAttention
from headwise.positional.rope import RotaryEmbedding

B, L, D, H = 2, 7, 32, 4


def _modules():
    torch.manual_seed(0)
    return {
        "mha": MultiHeadAttention(D, H, num_kv_heads=2, positional=RotaryEmbedding(D // H)).eval(),
        "mha-math": MultiHeadAttention(D, H, backend="math").eval(),
        "latent": LatentAttention(
            D, H, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, q_lora_rank=12
        ).eval(),
    }


def _run(module, x, **kw):
    return module(x, is_causal=True, **kw)


def _gate_by_wo_prehook(module, gates):
    """The definition: head h's slice of ``Wo``'s input (B, L, H·Dh) multiplied by gates[h]."""

    def hook(_m, args):
        x = args[0]
        return ((x.reshape(*x.shape[:-1], H, -1) * gates[:, None]).flatten(-2),)

    return module.Wo.register_forward_pre_hook(hook)


@pytest.mark.parametrize("name", ["mha", "mha-math", "latent"])
def test_a_gate_at_hook_heads_equals_scaling_wo_input(name):
    module = _modules()[name]
    x = torch.randn(B, L, D)
    gates = torch.tensor([1.0, 0.0, 0.5, -2.0])
    handle = _gate_by_wo_prehook(module, gates)
    try:
        with torch.no_grad():
            expected, _ = _run(module, x)
    finally:
        handle.remove()
    with torch.no_grad(), hooked([(module.hook_heads, lambda out: out * gates[:, None, None])]):
        got, _ = _run(module, x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert not module.hook_heads.active


@pytest.mark.parametrize("name", ["mha", "mha-math", "latent"])
def test_hook_heads_sees_each_heads_output_before_the_merge(name):
    module = _modules()[name]
    x = torch.randn(B, L, D)
    seen = []
    with torch.no_grad(), hooked([(module.hook_heads, seen.append)]):
        out, _ = _run(module, x)
    (heads,) = seen
    assert heads.shape[:3] == (B, H, L)
    merged = heads.transpose(1, 2).reshape(B, L, -1)  # (B, L, H·Dh)
    torch.testing.assert_close(module.Wo(merged), out, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["mha", "mha-math", "latent"])
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_hook_pattern_reads_the_weights_and_the_caller_gets_what_it_asked(name, need_weights, average):
    module = _modules()[name]
    x = torch.randn(B, L, D)
    with torch.no_grad():
        plain_out, _ = _run(module, x)
        _, per_head = _run(module, x, need_weights=True, average_weights=False)  # (B, H, L, S)
        asked_out, asked = _run(module, x, need_weights=need_weights, average_weights=average)
    seen = []
    with torch.no_grad(), hooked([(module.hook_pattern, seen.append)]):
        out, weights = _run(module, x, need_weights=need_weights, average_weights=average)
    torch.testing.assert_close(seen[0], per_head, rtol=0, atol=0)
    torch.testing.assert_close(out, plain_out, rtol=0, atol=1e-5)  # the weights path: same numbers up to round-off
    if need_weights:
        torch.testing.assert_close(weights, asked, rtol=0, atol=0)
        torch.testing.assert_close(out, asked_out, rtol=0, atol=0)
    else:
        assert weights is None


def test_an_unhooked_point_is_the_identity_and_hooks_come_off():
    point = HookPoint()
    x = torch.randn(3, 4)
    assert point(x) is x and not point.active
    handle = point.add_hook(lambda t: t * 2)
    assert point.active
    torch.testing.assert_close(point(x), 2 * x)
    handle.remove()
    assert not point.active and point(x) is x
    with pytest.raises(RuntimeError, match="boom"), hooked([(point, lambda t: t + 1)]):
        assert point.active
        raise RuntimeError("boom")
    assert not point.active


def test_hook_points_hold_no_state():
    module = _modules()["mha"]
    names = set(module.state_dict())
    assert not any("hook" in n for n in names)
    with pytest.raises(TypeError, match="HookPoint"), hooked([(module.Wo, lambda t: t)]):
        pass
    with pytest.raises(TypeError, match="callable"):
        module.hook_heads.add_hook(3)
