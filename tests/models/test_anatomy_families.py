"""One anatomy, every tool: tiny random decoders of many families on headwise's backend. On each, every tool that
reads a model's structure — circuits (EAP with exact patches), QK attribution, composition scores, direct logit
attribution — either works exactly, or every one of them refuses the model with the anatomy's one sentence.
Activation patching at the heads' point reads no structure: it works on every family, exactly.

Exact: the QK parts add up to the score, the logit attribution's parts to the unembedding's difference (times the
logit scale: the model's own difference), and a head patched along every path out of it equals the head patched in
the eager twin of the model (the same weights on transformers' own attention) by a pre-hook on the output projection
— a brute force that reads no structure but the output projection's module name.
"""

from __future__ import annotations

import pytest
import torch

from _anatomy_models import FAMILIES, REFUSED, V, tiny
from headwise.circuits import (
    Receiver,
    Write,
    composition_scores,
    edge_attribution,
    find_circuit,
    head_weights,
    path_patch,
    qk_attribution,
    wiring,
)
from headwise.circuits.paths import group_change
from headwise.models import HeadModel
from headwise.models.anatomy import AnatomyError
from headwise.patching import direct_logit_attribution, logit_difference, patch_heads
from headwise.points import OUT_PROJ_NAMES


def _models(family: str):
    return tiny(family, "headwise"), tiny(family, "eager")


def _pairs(hm: HeadModel, P: int = 2, L: int = 8):
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(3, V, (P, L), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 7) % (V - 3) + 3
    return clean, corrupted


def _brute_patch(eager, out_proj_name: str, layer_heads: int, head: int, clean, corrupted, metric):
    """The corrupted run of the eager twin with head ``head``'s slice of ``out_proj_name``'s input taken from the
    clean run (denoising), the metric per pair."""
    proj = dict(eager.named_modules())[out_proj_name]
    kept = {}

    def grab(_m, args):
        kept["z"] = args[0].detach().clone()

    def put(_m, args):
        z = args[0].clone()
        Dv = z.shape[-1] // layer_heads
        z[..., head * Dv : (head + 1) * Dv] = kept["z"][..., head * Dv : (head + 1) * Dv]
        return (z, *args[1:])

    with torch.no_grad():
        handle = proj.register_forward_pre_hook(grab)
        try:
            eager(input_ids=clean)
        finally:
            handle.remove()
        handle = proj.register_forward_pre_hook(put)
        try:
            logits = eager(input_ids=corrupted).logits
        finally:
            handle.remove()
    return metric(logits)


#: The families the fast suite runs, one for each structure the anatomy reads: Llama's GQA and rotation, GPT-2's
#: Conv1D, GPT-NeoX's interleaved query_key_value with a parallel residual, Phi-3's fused qkv_proj, Granite's
#: multipliers and logit scale, Gemma 2's soft-capping and extra norms, Qwen3's QK-norm, GPT-BigCode's multi-query
#: c_attn, OPT refused. The other families, variations of these, run in the slow suite.
FAST = {"llama", "gpt2", "gpt_neox", "phi3", "granite", "gemma2", "qwen3", "gpt_bigcode", "opt"}


@pytest.mark.parametrize(
    "family", [f if f in FAST else pytest.param(f, marks=pytest.mark.slow) for f in sorted(FAMILIES)]
)
def test_every_tool_works_exactly_or_all_refuse_alike(family):
    mine, eager = _models(family)
    hm = HeadModel(mine)
    clean, corrupted = _pairs(hm)
    answer, wrong = [5, 9], [11, 17]
    metric = logit_difference(answer, wrong)
    tools = {
        "find_circuit": lambda: find_circuit(hm, clean, corrupted, answer=answer, wrong=wrong, exact_top=4),
        "qk_attribution": lambda: qk_attribution(hm, clean[0], 1, 3, 7),
        "composition": lambda: composition_scores(head_weights(hm)),
        "logit_attribution": lambda: direct_logit_attribution(hm, clean, metric),
        "wiring": lambda: wiring(hm),
        "atp*": lambda: edge_attribution(hm, clean, corrupted, metric, method="atp*"),
    }
    if family in REFUSED:
        with pytest.raises(AnatomyError) as first:
            _ = hm.anatomy
        sentence = str(first.value)
        assert sentence.startswith(f"model: headwise cannot read the anatomy of this {family} model: ")
        for name, tool in tools.items():
            with pytest.raises(ValueError) as got:
                tool()
            assert str(got.value) == sentence, name
        heads = patch_heads(hm, clean, corrupted, metric, heads={0: [2]}).patched[:, 0, 2]
        attention = hm.attention_modules[0]
        out_proj = next(getattr(attention, n) for n in OUT_PROJ_NAMES if hasattr(attention, n))
        name = next(n for n, m in mine.named_modules() if m is out_proj)
        want = _brute_patch(eager, name, hm.heads_per_layer[0], 2, clean, corrupted, metric)
        torch.testing.assert_close(heads, want.to(heads.dtype), rtol=0, atol=2e-4)
        return

    anatomy = hm.anatomy
    assert len(anatomy) == 2
    # QK attribution: its own checks (parts against q, k and the score) passed; the terms add up to the score
    r = qk_attribution(hm, clean[0], 1, 3, 7)
    ci = int((r.keys == r.key).nonzero()[0, 0])
    torch.testing.assert_close(r.terms.sum(), r.scores[ci], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r.query_terms.sum(0), r.scores, rtol=1e-5, atol=1e-5)
    # direct logit attribution: the parts add up, and the unembedding's difference is the model's (scaled)
    dla = direct_logit_attribution(hm, clean, metric)
    torch.testing.assert_close(dla.total, dla.unembed_difference, rtol=0, atol=1e-4)
    if anatomy.softcap is None:
        torch.testing.assert_close(
            dla.unembed_difference * anatomy.logit_scale, dla.logit_difference, rtol=1e-4, atol=1e-4
        )
    # composition: every layer's matrices read, every score finite
    scores = composition_scores(head_weights(hm))
    assert all(torch.isfinite(t[0, :, 1]).all() for t in (scores.q, scores.k, scores.v))  # layer 0 into layer 1
    # circuits: EAP, the exact patches of the top edges and the faithfulness curve run
    circuit = find_circuit(hm, clean, corrupted, answer=answer, wrong=wrong, exact_top=4)
    assert circuit.to_dict()["edges"]
    # exact: a layer-0 head patched along every path out of it (every later receiver) equals the head patched in
    # the eager twin
    w = wiring(hm)
    receivers = []
    for layer in range(1, len(anatomy)):
        part = anatomy[layer]
        receivers += [f"L{layer}.H{h}.q" for h in range(part.num_heads)]
        receivers += [f"L{layer}.KV{g}.{s}" for g in range(part.num_kv) for s in "kv"]
    receivers += [f"L{layer}.MLP" for layer in range(len(anatomy)) if anatomy[layer].mlp is not None]
    receivers.append("logits")
    names = {id(m): n for n, m in mine.named_modules()}
    heads = patch_heads(hm, clean, corrupted, metric, heads={0: [0, 2]}).patched  # (P, NL, H)
    for head in (0, 2):
        got = path_patch(w, clean, corrupted, metric, [f"L0.H{head}"], receivers).patched[:, 0]
        want = _brute_patch(eager, names[id(anatomy[0].out_proj)], anatomy[0].num_heads, head, clean, corrupted, metric)
        torch.testing.assert_close(got, want.to(got.dtype), rtol=0, atol=2e-4)
        torch.testing.assert_close(heads[:, 0, head], want.to(heads.dtype), rtol=0, atol=2e-4)
    _check_atp_star(hm, w, clean, corrupted, metric)


def _check_atp_star(hm, w, clean, corrupted, metric):
    """atp* on an edge into layer 1's queries and one into its keys equals the metric's derivative along the
    heads' output change ``ΔA V`` of the receiver patched exactly (the wiring's exact edit, checked against the
    eager twin above; ``z' − z`` at ``attn.heads`` is ``(A' − A) V``, the values untouched), and the key/value
    groups' per-query-head shares add up to their scores."""
    est = edge_attribution(w, clean, corrupted, metric, method="atp*", shares=True)
    torch.testing.assert_close(est.per_pair_shares.sum(2), est.per_pair, atol=1e-5, rtol=1e-5)
    g = est.graph
    with torch.no_grad():
        _, base = w.run(clean, record=True)
        _, source = w.run(corrupted, record=True)
    for sender, group, index, receiver in [
        ("L0.H1", Receiver("q", 1), 0, "L1.H0.q"),
        ("embed", Receiver("k", 1), 0, "L1.KV0.k"),
    ]:
        key = Write("embed", -1) if sender == "embed" else Write("heads", 0)
        change = group_change(w, key, base, source)[:, 0 if sender == "embed" else 1]  # (P, L, D)
        kept = {}

        def edit(grp, _writes, grp0=group, change=change, index=index):
            if grp != grp0:
                return None
            n = g.groups[grp].stop - g.groups[grp].start
            delta = change.new_zeros(change.shape[0], n, *change.shape[1:])
            delta[:, index] = change
            return delta

        def keep(z, name=None, kept=kept):
            kept[name] = z.detach().clone()

        with torch.no_grad(), hm.hooks([("layers.1.attn.heads", lambda z: keep(z, "clean"))]):
            hm.logits(clean)
        with torch.no_grad():
            w.run(clean, deltas=edit, extra=[("layers.1.attn.heads", lambda z: keep(z, "edited"))])
        dz = kept["edited"] - kept["clean"]
        eps = torch.zeros(clean.shape[0], 1, 1, 1, requires_grad=True)
        with torch.enable_grad(), hm.hooks([("layers.1.attn.heads", lambda z, e=eps, d=dz: z + e * d.to(z.dtype))]):
            (want,) = torch.autograd.grad(metric(hm.logits(clean)).sum(), eps)
        e = g.edge("edges", (sender, receiver))
        torch.testing.assert_close(est.per_pair[:, e], want.reshape(-1).to(est.per_pair.dtype), atol=2e-4, rtol=1e-3)


def test_a_parallel_block_is_stated_as_mib_states_it():
    """GPT-NeoX's parallel residual: a layer's heads do not feed its own MLP (no such edge in the graph)."""
    mine, _ = _models("gpt_neox")
    hm = HeadModel(mine)
    assert all(part.parallel for part in hm.anatomy.layers)
    from headwise.circuits import build_graph

    g = build_graph(wiring(hm))
    edges = {f"{e.sender}->{e.receiver}.{e.input}" for e in g.edges}
    assert "L0.H0->L0.MLP.mlp" not in edges and "L0.H0->L1.MLP.mlp" in edges
    assert "L0.MLP->L1.H0.q" in edges
    mine, _ = _models("llama")
    g = build_graph(wiring(HeadModel(mine)))
    assert "L0.H0->L0.MLP.mlp" in {f"{e.sender}->{e.receiver}.{e.input}" for e in g.edges}


def test_the_probe_avoids_special_and_zero_embedded_tokens():
    """The structure is read on tokens that cannot hide it (token 0 is the pad token with a zero embedding in
    these configs: a zero residual made the MLP's norm look like a norm on the attention's write)."""
    from headwise.models.anatomy_probe import probe_ids

    mine, _ = _models("llama")
    hm = HeadModel(mine)
    ids = probe_ids(hm)[0].tolist()
    emb = mine.get_input_embeddings().weight
    assert len(set(ids)) == len(ids) >= 2
    assert all(emb[i].abs().sum() > 0 for i in ids)
    config = mine.config
    assert not {config.pad_token_id, config.bos_token_id, config.eos_token_id} & set(ids)
