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
sum). Under an RMS norm on the attention's write (Gemma 2) a head's difference is its exact change with the layer's
other heads at the clean run, ``norm(o + o_h(corrupted) − o_h(clean)) − norm(o)``. The sign convention is the one of
their code: a score estimates ``metric(edge corrupted) − metric(clean)`` — an edge the answer needs scores negative
with the logit difference, positive with KL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from headwise.checks import one_of, positive_int
from headwise.circuits.addresses import Receiver, Write
from headwise.circuits.atp import AttentionTaps, LowRank, atp_scores, head_use_gradients
from headwise.circuits.graph import Graph
from headwise.circuits.paths import group_change, open_pair
from headwise.circuits.wiring import Wiring
from headwise.patching.metric import reads_last_position

__all__ = ["EDGE_METHODS", "EdgeScores", "edge_attribution", "receiver_scores", "sender_group_changes"]

EDGE_METHODS = ("eap", "eap-ig", "atp*")
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
        shares: ``(E, G)`` (``shares=True``; G the most query heads per key/value group): for an edge into a
            group's keys or values, its score split over the group's query heads (``node.heads`` order) — each
            head's use of the shared keys or values — adding up to the score; for any other edge the score in
            column 0 and zeros. None unless asked for. per_pair_shares: ``(P, E, G)`` the same per pair.
    """

    method: str
    steps: int
    graph: Graph
    scores: Tensor
    per_pair: Tensor
    metric_clean: Tensor
    metric_corrupted: Tensor
    seconds: float = 0.0
    shares: Tensor | None = None
    per_pair_shares: Tensor | None = None

    def top(self, n: int) -> list[int]:
        """The indices of the ``n`` edges of largest ``|score|`` (ties in edge order)."""
        order = torch.argsort(self.scores.abs(), descending=True, stable=True)
        return order[:n].tolist()


def receiver_scores(w: Wiring, graph: Graph, ids: Tensor, metric, diff, *, embed=None, extra=()) -> Tensor:
    """``(P, S, R)``: ``Σ_{t,d} diff[p, s] · ∂metric_p/∂in_r`` from one run of ``ids (P, L)`` and its backward
    pass (``embed``: a replacement of the first block's input, as :meth:`Wiring.run`); 0 where sender s does
    not reach receiver r (no edge).

    ``diff``: ``(P, S, L, D)``, or its sender groups' parts ``(P, n_u, L, D)`` in sender order (as
    :func:`sender_group_changes` gives them). The gradients come from :meth:`Wiring.receiver_gradients`: each
    receiver group's gradient ``(P, n, L, D)`` is turned into its scores as the backward pass reaches it,
    against the senders upstream of the group only, and freed — no gradient of all receivers is ever held,
    nor a copy of any receiver's input. ``extra``: more hooks for the pass (:meth:`Wiring.run`)."""
    groups = list(graph.sender_groups.values())
    parts = [diff[:, sl] for sl in groups] if isinstance(diff, Tensor) else list(diff)
    if len(parts) != len(groups):
        raise ValueError(f"diff: expected {len(groups)} sender groups' changes, got {len(parts)}")
    full = parts[0].new_zeros(parts[0].shape[0], len(graph.senders), len(graph.receivers))
    stages = graph.stage_r
    pending: dict = {}  # stage -> [gradients (P, R_stage, L, D), receivers still to come]

    def receive(group, grad: Tensor) -> None:
        # the receivers of one stage (a layer's q, k and v groups) are contiguous and read the same senders: their
        # gradients are gathered and scored in one pass over the upstream senders' changes
        sl = graph.groups[group]
        stage = stages[sl.start]
        first = int(np.searchsorted(stages, stage, "left"))
        last = int(np.searchsorted(stages, stage, "right"))
        if stage not in pending:
            pending[stage] = [grad.new_empty(grad.shape[0], last - first, *grad.shape[2:]), last - first]
        buf = pending[stage]
        buf[0][:, sl.start - first : sl.stop - first] = grad
        buf[1] -= sl.stop - sl.start
        if buf[1]:
            return
        grads = pending.pop(stage)[0].to(full.dtype)
        P = grads.shape[0]
        g_t = grads.reshape(P, grads.shape[1], -1).transpose(1, 2)  # (P, L·D, n): a view, read in place by matmul
        upstream = int(graph.reaches[:, first].sum())  # senders come in stage order: the upstream ones first
        for su, part in zip(groups, parts):
            if su.start >= upstream:
                break
            full[:, su, first:last] += torch.matmul(part.reshape(P, part.shape[1], -1), g_t)  # Σ_{t,d} diff · grad

    w.receiver_gradients(ids, metric, receive, embed=embed, last_only=reads_last_position(metric), extra=extra)
    if pending:
        missing = [g for g, sl in graph.groups.items() if stages[sl.start] in pending]
        raise RuntimeError(f"circuits: the backward pass reached no gradient for part of {missing}")
    return full


def sender_group_changes(w: Wiring, graph: Graph, base: dict, source: dict) -> list[Tensor]:
    """:func:`~headwise.circuits.paths.sender_changes` as its sender groups' parts ``(P, n_u, L, D)`` in sender
    order (:func:`~headwise.circuits.paths.group_change`), each group's records dropped from ``base`` and
    ``source`` once used: the freed records make room for the next parts, so the peak is the two runs' records
    (no stacked copy)."""
    parts = []
    for key in graph.sender_groups:
        parts.append(group_change(w, key, base, source))
        used = [key, Write("o", key.layer), Write("o_heads", key.layer)] if key.kind == "heads" else [key]
        for k in used:
            base.pop(k, None)
            source.pop(k, None)
    return parts


def edge_attribution(
    model,
    clean,
    corrupted,
    metric,
    *,
    method: str = "eap",
    steps: int = 5,
    shares: bool = False,
    progress: Progress | None = None,
) -> EdgeScores:
    """Score every edge of the model's graph by EAP, EAP-IG or AtP*.

    Args:
        model: a :class:`~headwise.models.HeadModel`, anything :func:`headwise.patching.as_target` accepts, or a
            :class:`~headwise.circuits.wiring.Wiring`.
        clean, corrupted: token ids ``(L,)`` or ``(P, L)`` of the same shape.
        metric: ``fn(logits (N, L, V)) -> (N,)``, differentiable (:mod:`headwise.circuits.metrics`). KL to the
            clean run has no gradient on the clean run: use ``"eap-ig"`` with it.
        method: ``"eap"``, ``"eap-ig"`` or ``"atp*"`` (EAP with every query and key receiver's pattern
            recomputed exactly: :mod:`headwise.circuits.atp`).
        steps: EAP-IG's interpolation steps (ignored otherwise).
        shares: also split every key/value group edge over the group's query heads (:attr:`EdgeScores.shares`).
        progress: ``fn(done, total)`` after each gradient pass.
    Returns:
        :class:`EdgeScores`.
    Raises:
        ValueError / TypeError: a bad method or steps, inputs of different shapes, a structure not traced.
    """
    one_of("method", method, EDGE_METHODS)
    steps = positive_int("steps", steps) if method == "eap-ig" else 1
    t0 = time.perf_counter()
    w, graph, c, x, last_only = open_pair(model, clean, corrupted, metric)
    with torch.no_grad():
        clean_logits, clean_raw = w.run(c, record=True, last_only=last_only)
        corr_logits, corr_raw = w.run(x, record=True, last_only=last_only)
    m_clean = metric(clean_logits).detach().float().cpu()
    m_corr = metric(corr_logits).detach().float().cpu()
    e_clean, e_corr = clean_raw[Write("embed", -1)][:, 0], corr_raw[Write("embed", -1)][:, 0]  # (P, L, D)
    factors = {  # a head's write change as its output change times its rows of W_O (no norm on the write)
        Write("heads", layer): LowRank(
            corr_raw[Write("z", layer)] - clean_raw[Write("z", layer)], lw.heads_out() * lw.scale
        )
        for layer, lw in enumerate(w.layers)
        if lw.attn_post is None and method == "atp*" and w.target.stream is None  # layer by layer: W_O not held
    }
    diff = sender_group_changes(w, graph, clean_raw, corr_raw)  # a_u(corrupted) − a_u(clean) per group
    del clean_raw, corr_raw
    P = c.shape[0]
    heads = None  # per layer (P, S, H): each query head's share of its key and value groups' edges
    if shares:
        heads = {
            side: [diff[0].new_zeros(P, len(graph.senders), graph.heads[layer]) for layer in range(graph.num_layers)]
            for side in ("k", "v")
        }
    if method in ("eap", "atp*"):
        taps = AttentionTaps(w) if heads is not None or method == "atp*" else None
        full = receiver_scores(w, graph, c, metric, diff, extra=taps.hooks() if taps else ())
        if heads is not None:
            _head_shares(taps, graph, diff, heads, sides=("k", "v") if method == "eap" else ("v",))
        if method == "atp*":
            atp_scores(taps, graph, diff, full, None if heads is None else heads["k"], factors)
        if progress is not None:
            progress(1, 1)
    else:  # the scores are linear in the gradient: the mean of the steps' scores is the mean gradient's
        full = None
        for k in range(1, steps + 1):
            point = e_corr + (k / steps) * (e_clean - e_corr)
            taps = AttentionTaps(w) if heads is not None else None
            f = receiver_scores(
                w, graph, c, metric, diff, embed=lambda _x, point=point: point.to(_x.dtype),
                extra=taps.hooks() if taps else (),
            )  # fmt: skip
            if taps is not None:
                _head_shares(taps, graph, diff, heads, sides=("k", "v"))
            full = f if full is None else full + f
            if progress is not None:
                progress(k, steps)
        full = full / steps
        if heads is not None:
            heads = {side: [t / steps for t in parts] for side, parts in heads.items()}
    s_idx = torch.from_numpy(graph.edge_index[:, 0]).to(full.device)
    r_idx = torch.from_numpy(graph.edge_index[:, 1]).to(full.device)
    per_pair = full[:, s_idx, r_idx].float().cpu()  # (P, E)
    pair_shares = _edge_shares(graph, per_pair, heads) if shares else None
    return EdgeScores(
        method=method,
        steps=steps,
        graph=graph,
        scores=per_pair.mean(0),
        per_pair=per_pair,
        metric_clean=m_clean,
        metric_corrupted=m_corr,
        seconds=time.perf_counter() - t0,
        shares=None if pair_shares is None else pair_shares.mean(0),
        per_pair_shares=pair_shares,
    )


def _head_shares(taps: AttentionTaps, graph: Graph, diff: list, heads: dict, sides: tuple) -> None:
    """Add each sender's change times each query head's use of its key/value group (:func:`head_use_gradients`)
    to ``heads[side][layer] (P, S, H)``."""
    groups = list(graph.sender_groups.values())
    for layer in range(graph.num_layers):
        first = graph.groups[Receiver("q", layer)].start
        for side in sides:
            with taps.w.target.holding(layer):  # the layer's weights in (a model opened layer by layer)
                grad = head_use_gradients(taps, layer, side)  # (P, H, L, D)
            P, H = grad.shape[:2]
            g_t = grad.reshape(P, H, -1).transpose(1, 2).to(heads[side][layer].dtype)  # (P, L·D, H)
            for su, part in zip(groups, diff):
                if not graph.reaches[su.start, first]:
                    break
                heads[side][layer][:, su] += torch.matmul(part.reshape(P, part.shape[1], -1).to(g_t.dtype), g_t)


def _edge_shares(graph: Graph, per_pair: Tensor, heads: dict) -> Tensor:
    """``(P, E, G)``: every edge's score split over the query heads of its receiver (see :attr:`EdgeScores.shares`)."""
    G = max(h // k for h, k in zip(graph.heads, graph.kv))
    P, E = per_pair.shape
    out = per_pair.new_zeros(P, E, G)
    out[:, :, 0] = per_pair
    s_idx, r_idx = graph.edge_index[:, 0], graph.edge_index[:, 1]
    for layer in range(graph.num_layers):
        per = graph.heads[layer] // graph.kv[layer]
        for side in ("k", "v"):
            sl = graph.groups[Receiver(side, layer)]
            e = np.nonzero((r_idx >= sl.start) & (r_idx < sl.stop))[0]
            if not len(e):
                continue
            g = r_idx[e] - sl.start  # the edge's group
            cols = torch.from_numpy(g[:, None] * per + np.arange(per)[None, :])  # (e, per): the group's heads
            t = heads[side][layer].float().cpu()  # (P, S, H)
            out[:, torch.from_numpy(e), :per] = t[:, torch.from_numpy(s_idx[e])[:, None], cols]
            if per < G:
                out[:, torch.from_numpy(e), per:] = 0
    return out
