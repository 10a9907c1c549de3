"""AtP* (attention-aware attribution) against Kramár et al.'s formula written by hand on transformers' eager
attention: the receiving head's queries (or its group's keys) recomputed from the residual plus the sender's
change, its pattern recomputed with the softmax and causal mask by hand, and the metric's derivative along that
change of the pattern taken by autograd through the eager model (the change entered at the output projection's
input as ``ε · ΔA V``, which is what a pattern ``A + ε ΔA`` writes). Shares of key/value groups per query head
against the same derivative with one query head's keys or values recomputed alone."""

from __future__ import annotations

import functools

import pytest
import torch

from _circuit_brute import EagerParts, frozen_change, record
from _patching_models import hf_model, pair
from headwise.circuits import edge_attribution
from headwise.patching import logit_difference

pytest.importorskip("transformers")

METRIC = logit_difference([5, 6], [7, 8])


def _residual(model, ids, layer):
    return record(model, ids)[("attn_in", layer)]


@functools.cache
def _scores(case: str, method: str):
    model = hf_model(case)
    clean, corrupted = pair(P=2, L=7, where=2)
    return edge_attribution(model, clean, corrupted, METRIC, method=method, shares=True), clean, corrupted


@pytest.mark.parametrize("case", ["llama", "gpt2"])
def test_atp_star_is_kramars_formula_by_hand(case):
    """score(u → head h's q) = Σ ∂m/∂A_h · (softmax(q'_h k^T) − A_h), q'_h from norm(r + Δ_u); a key group's
    score the same over its query heads with k'_g; each per pair, against the brute force (2e-4)."""
    est, clean, corrupted = _scores(case, "atp*")
    eager = hf_model(case, "eager")
    hand = EagerParts(eager)
    g = est.graph
    last = g.num_layers - 1
    G = hand.H // hand.Hkv
    picked = [
        ("embed", f"L{last}.H0.q"),
        ("L0.H1", f"L{last}.H3.q"),
        ("L0.MLP", f"L{last}.H2.q"),
        ("embed", f"L{last}.KV0.k"),
        ("L0.H2", f"L{last}.KV{hand.Hkv - 1}.k"),
        ("L0.MLP", f"L{last}.KV0.k"),
    ]
    r = _residual(eager, clean, last)
    with torch.no_grad():
        q0, k0, v0 = hand.sides(last, r)
        A0 = hand.pattern(q0, k0)
    V = v0.repeat_interleave(G, 1)
    for sender, receiver in picked:
        e = g.edge("edges", (sender, receiver))
        delta = frozen_change(eager, clean, corrupted, [sender])[("attn_in", last)]
        with torch.no_grad():
            q1, k1, _ = hand.sides(last, r + delta)
            node, side = receiver.rsplit(".", 1)
            unit = int(node.split(".")[1].lstrip("HKV"))
            heads = [unit] if side == "q" else list(range(unit * G, (unit + 1) * G))
            A1 = hand.pattern(q1, k0) if side == "q" else hand.pattern(q0, k1)
            dA = torch.zeros_like(A0)
            dA[:, heads] = (A1 - A0)[:, heads]
        expected = hand.derivative(clean, last, dA @ V, METRIC)
        torch.testing.assert_close(est.per_pair[:, e], expected, atol=2e-4, rtol=1e-3, msg=f"{sender}->{receiver}")
        if side == "k":  # each query head's share: its own pattern's change alone
            for j, h in enumerate(heads):
                one = torch.zeros_like(dA)
                one[:, h] = dA[:, h]
                share = hand.derivative(clean, last, one @ V, METRIC)
                torch.testing.assert_close(
                    est.per_pair_shares[:, e, j], share, atol=2e-4, rtol=1e-3, msg=f"{sender}->{receiver} head {h}"
                )


@pytest.mark.parametrize("method", ["eap", "atp*"])
def test_value_shares_are_each_query_heads_use(method):
    """A value group's edge split over its query heads: head h's share is the derivative of the metric with the
    sender's change in head h's copy of the values alone (the others' values clean), through eager attention."""
    est, clean, corrupted = _scores("llama", method)
    eager = hf_model("llama", "eager")
    hand = EagerParts(eager)
    g = est.graph
    last = g.num_layers - 1
    G = hand.H // hand.Hkv
    r = _residual(eager, clean, last)
    with torch.no_grad():
        q0, k0, v0 = hand.sides(last, r)
        A0 = hand.pattern(q0, k0)
    for sender, group in [("embed", 0), ("L0.H3", 1)]:
        e = g.edge("edges", (sender, f"L{last}.KV{group}.v"))
        delta = frozen_change(eager, clean, corrupted, [sender])[("attn_in", last)]
        _, dv = torch.func.jvp(  # d v / d ε (P, Hkv, L, Dh) at ε = 0, forward mode through the norm
            lambda t, delta=delta: hand.sides(last, r + t * delta)[2], (torch.zeros(()),), (torch.ones(()),)
        )
        total = torch.zeros(2)
        for j in range(G):
            h = group * G + j
            dz = torch.zeros(2, hand.H, A0.shape[-1], hand.Dh)
            dz[:, h] = A0[:, h] @ dv[:, group]
            share = hand.derivative(clean, last, dz, METRIC)
            torch.testing.assert_close(est.per_pair_shares[:, e, j], share, atol=2e-4, rtol=1e-3)
            total += share
        torch.testing.assert_close(est.per_pair[:, e], total, atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("method", ["eap", "eap-ig", "atp*"])
def test_shares_add_up_and_atp_star_changes_only_queries_and_keys(method):
    est, clean, corrupted = _scores("llama", method)
    torch.testing.assert_close(est.shares.sum(1), est.scores, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(est.per_pair_shares.sum(2), est.per_pair, atol=1e-6, rtol=1e-5)
    g = est.graph
    one = [e for e, edge in enumerate(g.edges) if edge.input not in ("k", "v")]
    assert (est.shares[one, 1:] == 0).all()
    if method == "atp*":
        eap, _, _ = _scores("llama", "eap")
        other = [e for e, edge in enumerate(g.edges) if edge.input not in ("q", "k")]
        torch.testing.assert_close(est.per_pair[:, other], eap.per_pair[:, other], atol=1e-6, rtol=1e-5)
        v = [e for e, edge in enumerate(g.edges) if edge.input == "v"]
        torch.testing.assert_close(est.shares[v], eap.shares[v], atol=1e-6, rtol=1e-5)
        qk = [e for e, edge in enumerate(g.edges) if edge.input in ("q", "k")]
        assert (est.scores[qk] - eap.scores[qk]).abs().max() > 1e-4  # not EAP's linearisation


@pytest.mark.parametrize("case", ["llama", "gpt2", "gemma2"])
def test_factored_changes_project_as_their_dense_sum(case):
    """A head's write change given as factors (its output change times its rows of W_O) projects to the same queries
    and keys as the dense change, the norm taken exactly at r + Δ (RMS, LayerNorm, Gemma's 1 + w)."""
    from headwise.circuits import wiring
    from headwise.circuits.atp import AttentionTaps, LowRank

    model = hf_model(case)
    w = wiring(model)
    ids = torch.randint(3, 90, (3, 40), generator=torch.Generator().manual_seed(1))
    taps = AttentionTaps(w)
    w.receiver_gradients(ids, lambda logits: logits[:, -1, 5], lambda *_: None, extra=taps.hooks())
    lp = taps.layer(1)
    lw = w.layers[0]
    g = torch.Generator().manual_seed(2)
    coef = torch.randn(3, lw.num_heads, 40, lw.heads_out().shape[1], generator=g)
    change = LowRank(coef, lw.heads_out().float())
    for first in (0, 11):
        got = lp._columns_low_rank(change.part(0, lw.num_heads, first), first)
        assert not lp._form.failed
        want = lp.columns(change.part(0, lw.num_heads, first).dense(), first)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
