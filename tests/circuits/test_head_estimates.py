"""Every head's ablation effect estimated at once (AtP* at the node level) against its formula written by hand on
transformers' eager attention: attribution patching's ``∂m/∂z_h · Δz_h`` by autograd with the head's output edited
at the output projection's input, the linear part through each later layer's queries and keys by autograd with
those projections' inputs edited by hand, and each later pattern recomputed by hand (softmax, causal mask) from
the residual plus the head's write change, its effect taken as the derivative along ``ΔA V``."""

from __future__ import annotations

import pytest
import torch

from _circuit_brute import EagerParts, edited_logits, record
from _patching_models import hf_model
from headwise.circuits.head_estimates import head_ablation_estimates
from headwise.patching import logit_difference

pytest.importorskip("transformers")

METRIC = logit_difference([5, 6], [7, 8])


def _ids(seed=0, N=2, L=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, 90, (N, L), generator=g)


def _brute(case: str, ids, layer: int, head: int, mode: str, aware: bool):
    eager = hf_model(case, "eager")
    hand = EagerParts(eager)
    rec = record(eager, ids)
    Dh, H = hand.Dh, hand.H
    z = rec[("z", layer)].reshape(*ids.shape, H, Dh).transpose(1, 2)  # (N, H, L, Dh)
    zh = z[:, head]
    dzh = -zh if mode == "zero" else zh.mean((0, 1), keepdim=True) - zh
    dz = torch.zeros_like(z)
    dz[:, head] = dzh
    est = float(hand.derivative(ids, layer, dz, METRIC).sum())
    if not aware:
        return est
    W_O = hand.o_proj(layer).weight  # (D, H·Dh) (GPT-2's Conv1D: (H·Dh, D))
    cols = W_O[:, head * Dh : (head + 1) * Dh] if not hand.gpt2 else W_O[head * Dh : (head + 1) * Dh].T
    dw = dzh @ cols.T.detach()  # (N, L, D)
    G = H // hand.Hkv
    for later in range(layer + 1, len(hand.blocks)):
        eps = torch.zeros(ids.shape[0], 1, 1, requires_grad=True)
        edits = [(("q", later, i), eps * dw) for i in range(H)] + [(("k", later, g), eps * dw) for g in range(hand.Hkv)]
        (linear,) = torch.autograd.grad(METRIC(edited_logits(eager, ids, edits, grad=True)).sum(), eps)
        r = rec[("attn_in", later)]
        with torch.no_grad():
            q0, k0, v0 = hand.sides(later, r)
            q1, k1, _ = hand.sides(later, r + dw)
            dA = hand.pattern(q1, k1) - hand.pattern(q0, k0)
        exact = hand.derivative(ids, later, dA @ v0.repeat_interleave(G, 1), METRIC)
        est += float(exact.sum()) - float(linear.sum())
    return est


@pytest.mark.parametrize("case", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_estimates_are_the_formula_by_hand(case, mode):
    ids = _ids()
    aware = head_ablation_estimates(hf_model(case), ids, METRIC, mode=mode)
    plain = head_ablation_estimates(hf_model(case), ids, METRIC, mode=mode, attention_aware=False)
    NL, H = aware.shape
    for layer, head in [(0, 1), (0, 3), (NL - 1, 2)]:
        for est, on in ((aware, True), (plain, False)):
            expected = _brute(case, ids, layer, head, mode, on)
            assert float(est[layer, head]) == pytest.approx(expected, abs=3e-4, rel=1e-3), (layer, head, on)
    # the last layer's heads write after every pattern: the QK fix changes nothing there, and something before
    torch.testing.assert_close(aware[NL - 1], plain[NL - 1])
    assert (aware[0] - plain[0]).abs().max() > 1e-4


@pytest.mark.parametrize("case", ["llama", "gpt2"])
def test_estimates_equal_one_sender_a_chunk(case, monkeypatch):
    """The attention-aware terms taken one sender at a time (the smallest chunk a memory bound allows) equal the
    default chunks', every head."""
    import headwise.circuits.atp as atp

    ids = _ids(N=2, L=9)
    wide = head_ablation_estimates(hf_model(case), ids, METRIC)
    monkeypatch.setattr(atp, "CHUNK_BYTES", 1)
    narrow = head_ablation_estimates(hf_model(case), ids, METRIC)
    torch.testing.assert_close(narrow, wide, rtol=1e-5, atol=1e-6)


def test_chunk_holds_its_senders_within_the_bound(monkeypatch):
    """A layer's chunk of senders is as many as :data:`~headwise.circuits.atp.CHUNK_BYTES` holds by
    :func:`~headwise.circuits.atp.sender_bytes`, at least one; the bytes grow with the rows and the length."""
    import headwise.circuits.atp as atp

    args = (4, 576, 9, 3, 64)
    assert atp.sender_bytes(2, *args) == 2 * atp.sender_bytes(1, *args)
    assert atp.sender_bytes(1, 8, 576, 9, 3, 64) > atp.sender_bytes(1, *args)
    lp = type("P", (), {})()  # the chunk reads the record's shapes alone
    lp.N, lp.L, lp.H, lp.Hkv = 5, 39, 9, 3
    lp.rec = type("R", (), {})()
    lp.rec.r = torch.zeros(5, 39, 576)
    lp.rec.rows = type("Rows", (), {"q": torch.zeros(5, 9, 39, 64)})()
    each = atp.sender_bytes(5, 39, 576, 9, 3, 64)
    assert atp.LayerPatterns.chunk(lp, 10_000) == atp.CHUNK_BYTES // each
    assert atp.LayerPatterns.chunk(lp, 3) == 3
    monkeypatch.setattr(atp, "CHUNK_BYTES", 1)
    assert atp.LayerPatterns.chunk(lp, 10_000) == 1
