"""Faithfulness: how much of the model's behaviour a circuit of n edges alone recovers (Hanna, Pezzelle &
Belinkov 2024, "Have Faith in Faithfulness"; Wang et al. 2022's "completeness" in spirit).

Shape legend: P prompt pairs, J circuits per batch, N = J·P rows, L length, D model width, S senders,
R receivers, E edges.

A circuit keeps some edges. Every other edge is ablated: the clean input runs, and each receiver's input
replaces the write of every sender whose edge to it is not kept by that sender's ablated write::

    in_v = r_v − Σ_{u → v not kept} (a_u − ã_u)

where ``r_v`` is the residual the receiver reads in this run, ``a_u`` the sender's write in this run (the
circuit's own, computed as the pass goes) and ``ã_u`` its write on the corrupted input of the same pair
(``ablation="corrupted"``) or its mean over a reference set, position by position (``ablation="mean"``). With
every edge kept nothing changes (the clean run); with none kept every receiver reads the ablated run's
residual, so the output is the corrupted run's (or the mean-ablated run's). ``recovered(n) = (m(n) − m(∅)) /
(m(clean) − m(∅))`` with ``m`` the metric averaged over the pairs and ``∅`` no edge kept.

The curve keeps the top n edges by ``|score|`` for n on a grid; :func:`smallest_circuit` bisects between grid
points for the fewest top edges recovering a chosen fraction. With ``prune=True`` each top-n circuit is first pruned
to the edges on a path from the embeddings to the logits, as MIB's evaluation prunes it
(:func:`headwise.circuits.prune.prune`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from headwise.checks import one_of, positive_int
from headwise.circuits.graph import Graph
from headwise.circuits.paths import open_pair, sender_writes
from headwise.circuits.prune import prune as prune_circuits
from headwise.circuits.wiring import Wiring
from headwise.patching.exact import check_pair
from headwise.patching.metric import reads_last_position

__all__ = ["ABLATIONS", "Faithfulness", "faithfulness", "size_grid", "smallest_circuit"]

ABLATIONS = ("corrupted", "mean")
Progress = Callable[[int, int], None]


@dataclass
class Faithfulness:
    """The faithfulness curve.

    Attributes:
        ablation: ``"corrupted"`` or ``"mean"``.
        order: ``(E,)`` edge indices, most important first (by ``|score|``).
        sizes: the circuit sizes n run (top-n edges kept).
        metric: ``(P, len(sizes))`` the metric with each circuit.
        clean_metric, corrupted_metric, ablated_metric: means over pairs (clean run, corrupted run, no edge kept).
        recovered: ``(len(sizes),)`` ``(m(n) − m(∅)) / (m(clean) − m(∅))``.
        kept: the edges each circuit kept (``sizes`` itself unless pruned; None where not recorded).
    """

    ablation: str
    order: list[int]
    sizes: list[int]
    metric: Tensor
    clean_metric: float
    corrupted_metric: float
    ablated_metric: float
    recovered: Tensor
    passes: int = 0
    kept: list[int] | None = None


class _Ablator:
    """Runs circuits given as kept-edge masks ``(J, E)`` on the clean input with every other edge ablated."""

    def __init__(self, w: Wiring, graph: Graph, clean: Tensor, ablated: Tensor, metric):
        self.w, self.graph, self.clean, self.metric = w, graph, clean, metric
        self.ablated = ablated  # (P or 1, S, L, D)
        self.passes = 0

    def run(self, kept: Tensor) -> Tensor:
        """``kept (J, E)`` bool -> the metric ``(P, J)``."""
        g = self.graph
        J, P = kept.shape[0], self.clean.shape[0]
        drop = torch.zeros(J, len(g.senders), len(g.receivers), dtype=torch.bool)
        s_idx, r_idx = torch.from_numpy(g.edge_index[:, 0]), torch.from_numpy(g.edge_index[:, 1])
        drop[:, s_idx, r_idx] = ~kept
        drop = drop.to(self.clean.device)

        def deltas(group, writes):
            sl = g.groups[group]
            upstream = int(g.reaches[:, sl.start].sum())
            m = drop[:, :upstream, sl]  # (J, S', n)
            if not bool(m.any()):
                return None
            return self._ablation(group, writes, m, upstream, J, P)

        with torch.no_grad():
            logits, _ = self.w.run(
                self.clean.repeat(J, 1), deltas=deltas, record=True, last_only=reads_last_position(self.metric)
            )
        self.passes += 1
        return self.metric(logits).detach().float().reshape(J, P).T.cpu()

    def _ablation(self, group, writes: dict, m: Tensor, upstream: int, J: int, P: int) -> Tensor:
        """``(J·P, n, L, D)``: ``−Σ_{u dropped} (a_u − ã_u)`` for the group's n receivers, a sender group at a time
        (its ``(J, P, n_u, L, D)`` difference, never all S' senders' at once), groups with nothing dropped
        skipped."""
        out = None
        for key, su in self.graph.sender_groups.items():
            if su.start >= upstream:
                break
            mu = m[:, su]  # (J, n_u, n)
            if not bool(mu.any()):
                continue
            if key not in writes:
                raise RuntimeError(f"circuits: sender {key} had not written before {group}")
            cur = writes[key]  # (N, n_u, L, D)
            diff = cur.reshape(J, P, *cur.shape[1:]) - self.ablated[None, :, su].to(cur.dtype)  # (J, P, n_u, L, D)
            part = torch.einsum("jsn,jpsld->jpnld", mu.to(cur.dtype), diff)
            out = part if out is None else out.add_(part)
        if out is None:  # unreachable: m.any() held for some group
            raise RuntimeError(f"circuits: no dropped sender before {group}")
        return -out.reshape(J * P, *out.shape[2:])


def size_grid(num_edges: int) -> list[int]:
    """0, 1, 2, 5, 10, 20, 50, … (1-2-5 steps) and ``num_edges``."""
    sizes, k = [0], 0
    while True:
        for m in (1, 2, 5):
            n = m * 10**k
            if n >= num_edges:
                return sorted(set(sizes + [num_edges]))
            sizes.append(n)
        k += 1


def _order(scores: Tensor) -> list[int]:
    return torch.argsort(scores.abs(), descending=True, stable=True).tolist()


def _all_pairs(values: Tensor) -> Tensor:
    return values


def _setup(model, clean, corrupted, metric, ablation, reference, gather_pairs=_all_pairs):
    one_of("ablation", ablation, ABLATIONS)
    w, graph, c, x, last_only = open_pair(model, clean, corrupted, metric)
    clean_logits, _ = sender_writes(w, graph, c, last_only=last_only)
    corr_logits, a_corr = sender_writes(w, graph, x, last_only=last_only)
    if ablation == "corrupted":
        ablated = a_corr
    else:
        ref = torch.cat([c, x]) if reference is None else check_pair(w.target, reference, reference)[0]
        if ref.shape[1] != c.shape[1]:
            raise ValueError(f"reference: expected inputs of {c.shape[1]} tokens (the prompts'), got {ref.shape[1]}")
        ablated = sender_writes(w, graph, ref)[1].mean(0, keepdim=True)  # (1, S, L, D)
    m_clean = float(gather_pairs(metric(clean_logits).float()).mean())
    m_corr = float(gather_pairs(metric(corr_logits).float()).mean())
    return _Ablator(w, graph, c, ablated, metric), m_clean, m_corr


def faithfulness(
    model,
    clean,
    corrupted,
    metric,
    scores: Tensor,
    *,
    sizes: Sequence[int] | None = None,
    ablation: str = "corrupted",
    reference=None,
    batch_size: int = 8,
    progress: Progress | None = None,
    gather_pairs: Callable[[Tensor], Tensor] = _all_pairs,
    prune: bool = False,
) -> Faithfulness:
    """The metric recovered by the top-n edges (by ``|scores|``) alone, for each n of ``sizes``.

    Args:
        model, clean, corrupted, metric: as :func:`headwise.circuits.edge_attribution`.
        scores: ``(E,)`` one score per edge of the model's graph (an :class:`EdgeScores`' ``scores``).
        sizes: circuit sizes n (default :func:`size_grid`).
        ablation: ``"corrupted"`` (each pair's corrupted run) or ``"mean"`` (the mean over ``reference``).
        reference: token ids ``(R, L)`` for the mean (default: the clean and corrupted inputs together).
        batch_size: circuits per forward pass.
        progress: ``fn(done, total)`` after each batch.
        gather_pairs: ``fn(values (P', …)) -> (P, …)``: this call's pairs' values → every pair's, in pair order
            (default: as they are). A run whose prompt pairs are split across processes passes the gathering of
            every process's share (:class:`headwise.circuits.PairShard`), so that every mean over the pairs — the
            clean, corrupted and ablated metrics, the curve — is the mean over all of them.
        prune: drop the edges of each top-n circuit that lie on no path from the embeddings to the logits before it
            runs, as MIB's ``apply_topn(n, prune=True)`` (:mod:`headwise.circuits.prune`); ``kept`` counts what stays.
    Returns:
        :class:`Faithfulness` (``metric``: every pair's, ``(P, len(sizes))``).
    """
    batch_size = positive_int("batch_size", batch_size)
    ab, m_clean, m_corr = _setup(model, clean, corrupted, metric, ablation, reference, gather_pairs)
    E = len(ab.graph.edges)
    if not isinstance(scores, Tensor) or scores.shape != (E,):
        got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"scores: expected a tensor of one score per edge ({E},), got {got}")
    order = _order(scores)
    sizes = size_grid(E) if sizes is None else [int(n) for n in sizes]
    for n in sizes:
        if not 0 <= n <= E:
            raise ValueError(f"sizes: {n} is outside 0..{E} (the graph's edges)")
    if 0 not in sizes:
        sizes = [0, *sizes]
    rank = torch.empty(E, dtype=torch.long)
    rank[torch.tensor(order)] = torch.arange(E)
    values, counts = [], []
    for start in range(0, len(sizes), batch_size):
        chunk = torch.tensor(sizes[start : start + batch_size])
        kept = rank[None, :] < chunk[:, None]  # (J, E)
        if prune:
            kept = prune_circuits(ab.graph, kept)
        counts += kept.sum(1).tolist()
        values.append(ab.run(kept))
        if progress is not None:
            progress(min(start + batch_size, len(sizes)), len(sizes))
    metric_n = gather_pairs(torch.cat(values, 1))  # (P, len(sizes))
    means = metric_n.mean(0)
    ablated = float(means[sizes.index(0)])
    gap = m_clean - ablated
    recovered = (means - ablated) / gap if gap != 0 else torch.full_like(means, math.nan)
    return Faithfulness(
        ablation, order, list(sizes), metric_n, m_clean, m_corr, ablated, recovered, ab.passes, [int(k) for k in counts]
    )


def smallest_circuit(
    model,
    clean,
    corrupted,
    metric,
    curve: Faithfulness,
    fraction: float,
    *,
    reference=None,
    gather_pairs: Callable[[Tensor], Tensor] = _all_pairs,
) -> tuple[int, float]:
    """The fewest top edges (in ``curve.order``) whose circuit recovers at least ``fraction``: the first grid
    size of ``curve`` that does, then bisection between it and the grid size before (assumes the recovered
    fraction grows with n between those two sizes; ``gather_pairs`` as :func:`faithfulness`). Returns
    ``(n, recovered)``; ``(E, 1.0)``-like when only the whole graph does.

    Raises:
        ValueError: ``fraction`` not in (0, 1].
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"fraction: expected a number in (0, 1], got {fraction!r}")
    rec = curve.recovered.tolist()
    hit = next((k for k, r in enumerate(rec) if r >= fraction), None)
    if hit is None:
        return curve.sizes[-1], rec[-1]
    if hit == 0:
        return curve.sizes[0], rec[0]
    ab, _, _ = _setup(model, clean, corrupted, metric, curve.ablation, reference, gather_pairs)
    E = len(ab.graph.edges)
    rank = torch.empty(E, dtype=torch.long)
    rank[torch.tensor(curve.order)] = torch.arange(E)
    lo, hi, best = curve.sizes[hit - 1], curve.sizes[hit], rec[hit]
    gap = curve.clean_metric - curve.ablated_metric
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = (float(gather_pairs(ab.run(rank[None, :] < mid)).mean()) - curve.ablated_metric) / gap
        if r >= fraction:
            hi, best = mid, r
        else:
            lo = mid
    return hi, best
