"""Edge attribution: EAP is the gradient-times-difference of each edge, checked against torch.autograd on the
brute force's hand-edited receivers (eager attention, same weights); exact where the metric is linear in the
receiver's input; EAP-IG with one step is EAP, and with many steps approaches the exact edge patch on a
near-linear model."""

from __future__ import annotations

import pytest
import torch

from _circuit_brute import edited_logits, frozen_change, reading_point, receiver_tuple
from _patching_models import Stack, hf_model, pair
from headwise.circuits import EdgeScores, Write, edge_attribution, make_metric, patch_edges, wiring
from headwise.patching import logit_difference

pytest.importorskip("transformers")

METRIC = logit_difference([5, 6], [7, 8])


@pytest.mark.parametrize("case", ["llama", "gpt2", "gemma2", "stack"])
def test_eap_is_the_gradient_times_the_difference(case):
    """score(u → v) per pair = d/dε metric(receiver v's input + ε·(a_u(corrupted) − a_u(clean))) at ε = 0,
    the derivative taken by autograd through the eager model with the input edited by hand."""
    model = Stack() if case == "stack" else hf_model(case)
    eager = model if case == "stack" else hf_model(case, "eager")
    clean, corrupted = pair(P=2, L=7, where=2)
    scores = edge_attribution(model, clean, corrupted, METRIC)
    assert isinstance(scores, EdgeScores) and scores.per_pair.shape == (2, len(scores.graph.edges))
    g = scores.graph
    last = g.num_layers - 1
    picked = [
        ("embed", f"L{last}.H0.q"),
        ("L0.H1", f"L{last}.KV0.k"),
        ("L0.H2", f"L{last}.KV{g.kv[last] - 1}.v"),
        ("L0.MLP", f"L{last}.MLP"),
        (f"L{last}.H3", f"L{last}.MLP"),
        (f"L{last}.H1", "logits"),
        (f"L{last}.MLP", "logits"),
        ("embed", "logits"),
    ]
    for sender, receiver in picked:
        e = g.edge("edges", (sender, receiver))
        change = frozen_change(eager, clean, corrupted, [sender])[reading_point(receiver_tuple(receiver))]
        eps = torch.zeros(2, 1, 1, requires_grad=True)
        value = METRIC(edited_logits(eager, clean, [(receiver_tuple(receiver), eps * change)], grad=True))
        (expected,) = torch.autograd.grad(value.sum(), eps)
        torch.testing.assert_close(
            scores.per_pair[:, e], expected.reshape(2), atol=2e-4, rtol=1e-3, msg=f"{sender} -> {receiver}"
        )
    torch.testing.assert_close(scores.scores, scores.per_pair.mean(0))


def test_eap_is_exact_where_the_metric_is_linear_in_the_receiver():
    """Without a final norm the logit difference is affine in the logits' input: every edge into the logits is
    scored exactly (its exact patch), and no other edge is."""
    model = Stack(final_norm=False, seed=3)
    clean, corrupted = pair(P=2, L=6, where=1)
    scores = edge_attribution(model, clean, corrupted, METRIC)
    g = scores.graph
    into_logits = [e for e, edge in enumerate(g.edges) if edge.input == "logits"]
    exact = patch_edges(model, clean, corrupted, METRIC, [g.edges[e] for e in into_logits])
    torch.testing.assert_close(scores.scores[into_logits], exact.effect, atol=1e-4, rtol=1e-4)
    into_q = [e for e, edge in enumerate(g.edges) if edge.input == "q"][:12]
    exact_q = patch_edges(model, clean, corrupted, METRIC, [g.edges[e] for e in into_q])
    assert (scores.scores[into_q] - exact_q.effect).abs().max() > 1e-3  # a linearisation elsewhere


def test_eap_ig_with_one_step_is_eap():
    model = hf_model("llama")
    clean, corrupted = pair(P=2, L=6, where=2)
    eap = edge_attribution(model, clean, corrupted, METRIC)
    ig = edge_attribution(model, clean, corrupted, METRIC, method="eap-ig", steps=1)
    torch.testing.assert_close(ig.scores, eap.scores, atol=1e-6, rtol=1e-5)


def _near_linear(scale: float) -> Stack:
    model = Stack(seed=5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                p.mul_(scale)
    return model


def test_eap_ig_approaches_the_exact_edge_patch_on_a_near_linear_model():
    """Matrices scaled by 0.1 (embeddings and norms left): nearly linear between the two inputs but for the
    norms. EAP's linearisation at the clean run misses the top edges' exact patch by ~70% of the largest effect;
    EAP-IG's error falls with the steps (measured 0.14, 0.043, 0.025 at 4, 16, 64 steps)."""
    model = _near_linear(0.1)
    clean, corrupted = pair(P=2, L=6, where=1)
    eap = edge_attribution(model, clean, corrupted, METRIC)
    top = eap.top(40)
    exact = patch_edges(model, clean, corrupted, METRIC, [eap.graph.edges[e] for e in top]).effect
    scale = exact.abs().max()
    errors = []
    for steps in (4, 16, 64):
        ig = edge_attribution(model, clean, corrupted, METRIC, method="eap-ig", steps=steps)
        errors.append(float((ig.scores[top] - exact).abs().max() / scale))
    err_eap = float((eap.scores[top] - exact).abs().max() / scale)
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.04 and err_eap > 0.3, (errors, err_eap)


def test_kl_needs_integrated_gradients():
    """KL to the clean run is 0 with zero gradient on the clean run: EAP scores vanish, EAP-IG's do not."""
    model = hf_model("llama")
    clean, corrupted = pair(P=2, L=6, where=2)
    with torch.no_grad():
        reference = model(input_ids=clean).logits[:, -1]
    kl = make_metric("kl", [5, 6], [7, 8], reference)
    eap = edge_attribution(model, clean, corrupted, kl)
    ig = edge_attribution(model, clean, corrupted, kl, method="eap-ig", steps=4)
    assert eap.scores.abs().max() < 1e-5 and ig.scores.abs().max() > 1e-3
    torch.testing.assert_close(eap.metric_clean, torch.zeros(2), atol=1e-5, rtol=0)


def test_bad_arguments_are_named():
    model = hf_model("llama")
    clean, corrupted = pair(P=2, L=6)
    with pytest.raises(ValueError, match="method"):
        edge_attribution(model, clean, corrupted, METRIC, method="acdc")
    with pytest.raises(ValueError, match="steps"):
        edge_attribution(model, clean, corrupted, METRIC, method="eap-ig", steps=0)
    with pytest.raises(TypeError, match="metric"):
        edge_attribution(model, clean, corrupted, "logit_diff")
    w = wiring(model)
    with pytest.raises(ValueError, match="edges: .*no edge"):
        patch_edges(w, clean, corrupted, METRIC, [("L1.H0", "L1.H1.q")])


def _scores_by_edited_inputs(w, graph, ids, metric, diff, embed=None):
    """The reference route: a zero ``Δ (P, n, L, D)`` added to every receiver group's input by ``Wiring.run``
    (each query/key/value receiver's projection recomputed from ``norm(r + Δ)``), the scores from its gradient."""
    P, L = ids.shape
    S, D = diff.shape[1], diff.shape[-1]
    full = diff.new_zeros(P, S, len(graph.receivers))
    zero = torch.zeros((), requires_grad=True)

    def deltas(group, _writes):
        sl = graph.groups[group]
        d = zero.expand(P, sl.stop - sl.start, L, D)

        def score(grad):
            full[:, :, sl] += torch.einsum("psld,pnld->psn", diff, grad)

        d.register_hook(score)
        return d

    with torch.enable_grad():
        logits, _ = w.run(ids, deltas=deltas, embed=embed)
        torch.autograd.grad(metric(logits).sum(), [zero])
    return full


@pytest.mark.parametrize("case", ["llama", "gpt2", "gemma2", "stack"])
def test_tapped_gradients_equal_the_edited_inputs_route(case):
    """Every receiver's score, all (P, S, R) of them, from the projections' output gradients (the route edge
    attribution takes) equals the one from a zero added to each receiver's own input, with and without
    interpolated embeddings (EAP-IG's runs); entries of no edge are 0."""
    from headwise.circuits.edges import receiver_scores, sender_group_changes
    from headwise.circuits.paths import open_pair, sender_changes

    model = Stack(seed=2) if case == "stack" else hf_model(case)
    clean, corrupted = pair(P=2, L=8, where=3, seed=4)
    w, graph, c, x, _ = open_pair(model, clean, corrupted, METRIC)
    with torch.no_grad():
        _, clean_raw = w.run(c, record=True)
        _, corr_raw = w.run(x, record=True)
    diff = sender_changes(w, graph, clean_raw, corr_raw)
    base, source = dict(clean_raw), dict(corr_raw)
    parts = sender_group_changes(w, graph, base, source)
    torch.testing.assert_close(torch.cat(parts, 1), diff, atol=0, rtol=0)  # a group at a time
    assert not [k for k in base if k.kind in ("heads", "mlp", "o", "o_heads")]
    e_clean, e_corr = clean_raw[Write("embed", -1)][:, 0], corr_raw[Write("embed", -1)][:, 0]
    point = e_corr + 0.4 * (e_clean - e_corr)
    s_idx, r_idx = torch.from_numpy(graph.edge_index[:, 0]), torch.from_numpy(graph.edge_index[:, 1])
    for embed in (None, lambda _x: point):
        new = receiver_scores(w, graph, c, METRIC, diff, embed=embed)
        torch.testing.assert_close(receiver_scores(w, graph, c, METRIC, parts, embed=embed), new, atol=0, rtol=0)
        old = _scores_by_edited_inputs(w, graph, c, METRIC, diff, embed=embed)
        assert new.shape == old.shape == (2, len(graph.senders), len(graph.receivers))
        scale = float(old[:, s_idx, r_idx].abs().max())
        assert scale > 1e-3
        torch.testing.assert_close(new[:, s_idx, r_idx], old[:, s_idx, r_idx], atol=1e-5 * scale, rtol=1e-5)
        no_edge = ~torch.from_numpy(graph.reaches)
        assert float(new[:, no_edge].abs().max()) == 0.0


class _MarksTheBackward:
    """The metric, noting when it is called on logits with gradients: the pass with gradients ends there."""

    def __init__(self, metric):
        self.metric, self.position, self.backward = metric, metric.position, False

    def __call__(self, logits):
        self.backward = self.backward or logits.requires_grad
        return self.metric(logits)


@pytest.mark.parametrize("case", ["llama", "stack"])
def test_no_length_squared_map_is_kept_for_the_backward_pass(case):
    """Every tensor autograd saves in edge attribution's forward pass with gradients: none is an L × L map (the
    attention runs on torch's kernel with the causal flag), and none holds a copy of the residual per receiver
    (N, n, L, D: the backward hooks make theirs one group at a time and free them). Forced onto torch's math
    path the same run keeps L × L probabilities (the check can fail)."""
    L = 40
    clean, corrupted = pair(P=2, L=L, where=5)

    def saved_shapes(model):
        shapes, metric = [], _MarksTheBackward(METRIC)

        def pack(t):
            if not metric.backward:
                shapes.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            edge_attribution(model, clean, corrupted, metric)
        assert metric.backward
        return shapes

    model = Stack(seed=1) if case == "stack" else hf_model(case)
    shapes = saved_shapes(model)
    assert shapes and not [s for s in shapes if s[-2:] == (L, L)]
    lw = wiring(model).layers[0]
    D = lw.heads_out().shape[-1]
    copies = [s for s in shapes if len(s) == 4 and s[0] == 2 and s[1] in (lw.num_heads, lw.num_kv) and s[-1] == D]
    assert not copies, copies
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):  # torch's math path keeps the probabilities
        assert [s for s in saved_shapes(model) if s[-2:] == (L, L)]
