"""Edge attribution: EAP (Syed, Rager & Conmy 2023) and EAP-IG (Hanna, Pezzelle & Belinkov 2024) over every
edge of the :class:`~headwise.circuits.graph.Graph`.

Shape legend: P prompt pairs, L length, D model width, S senders, R receivers, E edges.

An edge u → v carries the sender's write ``a_u (P, L, D)`` into the receiver's input. Patching that edge alone
from the clean to the corrupted run changes the receiver's input by ``a_u(corrupted) − a_u(clean)``; EAP
estimates the metric's change to first order::

    score(u → v) = Σ_{t, d} (a_u(corrupted) − a_u(clean))[t, d] · ∂metric/∂in_v[t, d]      (mean over pairs)

with the gradient taken on the clean run, through everything downstream of v (one forward pass of each input
and one backward pass, whatever E is). The gradient with respect to a receiver's input comes from a zero
tensor added to that input on its side alone (:mod:`headwise.circuits.wiring`): a query head's query, a key /
value group's keys or values, an MLP's input, the logits' input.

EAP-IG replaces the clean run's gradient by its mean over ``steps`` runs whose input embeddings (the first
block's input) lie on the line from the corrupted to the clean ones, ``e_corrupted + (k/steps)·(e_clean −
e_corrupted)`` for k = 1 … steps (Hanna et al.'s integrated gradients on the input embeddings, right Riemann
sum). The sign convention is the one of their code: a score estimates ``metric(edge corrupted) −
metric(clean)`` — an edge the answer needs scores negative with the logit difference, positive with KL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from headwise.checks import one_of, positive_int
from headwise.circuits.graph import Graph, build_graph
from headwise.circuits.paths import sender_writes
from headwise.circuits.wiring import Wiring, wiring
from headwise.patching.exact import check_pair
from headwise.patching.metric import reads_last_position

__all__ = ["EDGE_METHODS", "EdgeScores", "edge_attribution", "receiver_gradients"]

EDGE_METHODS = ("eap", "eap-ig")
Progress = Callable[[int, int], None]


@dataclass
class EdgeScores:
    """Edge attribution scores.

    Attributes:
        method: ``"eap"`` or ``"eap-ig"``. steps: integrated-gradient steps (1 for EAP).
        graph: the :class:`Graph` (``graph.edges[e]`` is the edge of ``scores[e]``).
        scores: ``(E,)`` the estimate of metric(edge patched to corrupted) − metric(clean), mean over pairs.
        per_pair: ``(P, E)`` the same per pair.
        metric_clean, metric_corrupted: ``(P,)``.
        seconds: wall time.
    """

    method: str
    steps: int
    graph: Graph
    scores: Tensor
    per_pair: Tensor
    metric_clean: Tensor
    metric_corrupted: Tensor
    seconds: float = 0.0

    def top(self, n: int) -> list[int]:
        """The indices of the ``n`` edges of largest ``|score|`` (ties in edge order)."""
        order = torch.argsort(self.scores.abs(), descending=True, stable=True)
        return order[:n].tolist()


def receiver_gradients(w: Wiring, graph: Graph, ids: Tensor, metric, *, embed=None) -> tuple[Tensor, Tensor]:
    """``(metric (P,), ∂metric/∂in_r (P, R, L, D))`` of one run of ``ids (P, L)`` (``embed``: a replacement
    of the first block's input, as :meth:`Wiring.run`)."""
    P, L = ids.shape
    D = w.layers[0].heads_out.shape[-1]
    dtype = w.layers[0].heads_out.dtype
    zeros = {
        group: torch.zeros(P, sl.stop - sl.start, L, D, dtype=dtype, device=ids.device, requires_grad=True)
        for group, sl in graph.groups.items()
    }

    def deltas(group, _writes):
        return zeros[group]

    with torch.enable_grad():
        logits, _ = w.run(ids, deltas=deltas, embed=embed, last_only=reads_last_position(metric))
        value = metric(logits)  # (P,)
        grads = torch.autograd.grad(value.sum(), list(zeros.values()), allow_unused=True)
    G = torch.cat([torch.zeros_like(z) if g is None else g for z, g in zip(zeros.values(), grads)], 1)
    return value.detach().float().cpu(), G.detach()


def edge_attribution(
    model,
    clean,
    corrupted,
    metric,
    *,
    method: str = "eap",
    steps: int = 5,
    progress: Progress | None = None,
) -> EdgeScores:
    """Score every edge of the model's graph by EAP or EAP-IG.

    Args:
        model: a :class:`~headwise.models.HeadModel`, anything :func:`headwise.patching.as_target` accepts, or a
            :class:`~headwise.circuits.wiring.Wiring`.
        clean, corrupted: token ids ``(L,)`` or ``(P, L)`` of the same shape.
        metric: ``fn(logits (N, L, V)) -> (N,)``, differentiable (:mod:`headwise.circuits.metrics`). KL to the
            clean run has no gradient on the clean run: use ``"eap-ig"`` with it.
        method: ``"eap"`` or ``"eap-ig"``.
        steps: EAP-IG's interpolation steps (ignored by EAP).
        progress: ``fn(done, total)`` after each gradient pass.
    Returns:
        :class:`EdgeScores`.
    Raises:
        ValueError / TypeError: a bad method or steps, inputs of different shapes, a structure not traced.
    """
    one_of("method", method, EDGE_METHODS)
    steps = positive_int("steps", steps) if method == "eap-ig" else 1
    if not callable(metric):
        raise TypeError(f"metric: expected a callable logits (N, L, V) -> (N,), got {type(metric).__name__}")
    t0 = time.perf_counter()
    w = model if isinstance(model, Wiring) else wiring(model)
    graph = build_graph(w)
    c, x = check_pair(w.target, clean, corrupted)
    last_only = reads_last_position(metric)
    clean_logits, a_clean = sender_writes(w, graph, c, last_only=last_only)  # (P, S, L, D)
    corr_logits, a_corr = sender_writes(w, graph, x, last_only=last_only)
    m_clean = metric(clean_logits).detach().float().cpu()
    m_corr = metric(corr_logits).detach().float().cpu()
    if method == "eap":
        _, G = receiver_gradients(w, graph, c, metric)
        if progress is not None:
            progress(1, 1)
    else:
        e_clean, e_corr = a_clean[:, 0], a_corr[:, 0]  # (P, L, D): the first block's inputs
        G = None
        for k in range(1, steps + 1):
            alpha = k / steps
            point = e_corr + alpha * (e_clean - e_corr)
            _, g = receiver_gradients(w, graph, c, metric, embed=lambda _x, point=point: point.to(_x.dtype))
            G = g if G is None else G + g
            if progress is not None:
                progress(k, steps)
        G = G / steps
    diff = (a_corr - a_clean).to(G.dtype)  # (P, S, L, D)
    s_idx = torch.from_numpy(graph.edge_index[:, 0]).to(G.device)
    r_idx = torch.from_numpy(graph.edge_index[:, 1]).to(G.device)
    full = torch.einsum("psld,prld->psr", diff, G)  # (P, S, R)
    per_pair = full[:, s_idx, r_idx].float().cpu()  # (P, E)
    return EdgeScores(
        method=method,
        steps=steps,
        graph=graph,
        scores=per_pair.mean(0),
        per_pair=per_pair,
        metric_clean=m_clean,
        metric_corrupted=m_corr,
        seconds=time.perf_counter() - t0,
    )
