"""Path patching, exact: a sender's change reaches chosen receivers along one path only (Wang et al. 2022;
Goldowsky-Dill et al. 2023), and the exact patch of single edges.

Shape legend: P prompt pairs, J jobs (sender sets or edges) per batch, N = J·P rows, L length, D model width,
S senders, R receivers (:class:`~headwise.circuits.graph.Graph`).

With everything but the sender frozen at the base run, a receiver's input differs from the base run's by the
sender's change of write, ``Δ = a_sender(source) − a_sender(base)`` — the residual stream is a sum of writes
(:mod:`headwise.circuits.wiring`). A path patch runs the base input with ``Δ`` added to the receivers' inputs
(their query, key or value side, an MLP's input, the logits' input) and lets everything downstream of the
receivers run: the sender's effect through that path alone. This equals Wang et al.'s three runs (sender
patched, everything else frozen, receivers' inputs recorded; then the base run with those inputs) for one
receiver or receivers of one layer; with receivers in several layers, the change an earlier receiver makes
reaches the later ones too (edge patching's convention, Hanna et al. 2024).

GQA: a sender reaches a query head's query input (``"L3.H5.q"``) and a key/value group's key or value input
(``"L3.KV1.k"``): the group's keys are one input shared by every query head that reads it, so patching the
path into "the keys of head 5" means patching them for its whole group.

Directions as :func:`headwise.patching.patch_heads`: ``"denoise"`` (base corrupted, sender from clean: which
paths restore the answer) and ``"noise"`` (base clean, sender from corrupted: which paths it needs). Batched as
the head sweep: J jobs × P pairs as one forward pass, each row's Δ only its job's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from headwise.checks import one_of, positive_int
from headwise.circuits.graph import Graph, build_graph
from headwise.circuits.wiring import Wiring, wiring
from headwise.patching.exact import DIRECTIONS, check_pair
from headwise.patching.metric import reads_last_position

__all__ = ["PathPatching", "patch_edges", "path_patch", "sender_writes", "stack_writes"]

Metric = Callable[[Tensor], Tensor]
Progress = Callable[[int, int], None]


@dataclass
class PathPatching:
    """What :func:`path_patch` / :func:`patch_edges` measured.

    Attributes:
        direction: ``"denoise"`` or ``"noise"``.
        jobs: the sender sets (path patching) or edge names (edge patching), in order.
        receivers: the receivers of path patching (``(node, input)``), empty for edges.
        metric_clean, metric_corrupted: ``(P,)``.
        patched: ``(P, J)`` the metric of each job's run.
        passes: forward passes run (the two cached runs included). seconds: wall time.
    """

    direction: str
    jobs: list
    receivers: list
    metric_clean: Tensor
    metric_corrupted: Tensor
    patched: Tensor
    passes: int = 0
    seconds: float = 0.0

    @property
    def base(self) -> Tensor:
        """``(P,)`` the base run's metric (corrupted when denoising, clean when noising)."""
        return self.metric_corrupted if self.direction == "denoise" else self.metric_clean

    @property
    def effect(self) -> Tensor:
        """``(J,)`` patched − base, the mean over pairs."""
        return (self.patched - self.base[:, None]).mean(0)


def stack_writes(graph: Graph, writes: dict, upto: int | None = None) -> Tensor:
    """Recorded writes as one ``(N, S', L, D)`` tensor in sender order (the first ``upto`` senders' groups)."""
    parts = []
    for key, sl in graph.sender_groups.items():
        if upto is not None and sl.start >= upto:
            break
        parts.append(writes[key])
    return torch.cat(parts, 1)


def sender_writes(w: Wiring, graph: Graph, ids: Tensor, *, last_only: bool = False) -> tuple[Tensor, Tensor]:
    """One run of ``ids (P, L)`` without gradient: ``(logits, writes (P, S, L, D))``."""
    with torch.no_grad():
        logits, writes = w.run(ids, record=True, last_only=last_only)
    return logits, stack_writes(graph, writes)


def _fixed_deltas(graph: Graph, masks: Tensor, D: Tensor):
    """``deltas`` of :meth:`Wiring.run` adding ``Σ_s masks[j, s, r] · D[p, s]`` to receiver r of row (j, p).

    ``masks (J, S, R)`` float, ``D (P, S, L, D)``."""
    J = masks.shape[0]

    def deltas(group, _writes):
        sl = graph.groups[group]
        m = masks[:, :, sl]  # (J, S, n)
        if not bool(m.any()):
            return None
        out = torch.einsum("jsn,psld->jpnld", m.to(D.dtype), D)  # (J, P, n, L, D)
        return out.reshape(J * D.shape[0], *out.shape[2:])

    return deltas


def _run_jobs(w: Wiring, graph: Graph, base: Tensor, D: Tensor, masks: Tensor, metric, batch_size, progress):
    """The metric ``(P, J)`` of every job (``masks (J, S, R)``), ``batch_size`` jobs per forward pass."""
    P = base.shape[0]
    last_only = reads_last_position(metric)
    values, passes = [], 0
    J = masks.shape[0]
    for start in range(0, J, batch_size):
        m = masks[start : start + batch_size]
        with torch.no_grad():
            logits, _ = w.run(base.repeat(m.shape[0], 1), deltas=_fixed_deltas(graph, m, D), last_only=last_only)
        values.append(metric(logits).detach().float().reshape(m.shape[0], P).cpu())
        passes += 1
        if progress is not None:
            progress(min(start + batch_size, J), J)
    return (torch.cat(values).T if values else torch.empty(P, 0)), passes


def _prepare(model, clean, corrupted, metric, direction):
    one_of("direction", direction, DIRECTIONS)
    if not callable(metric):
        raise TypeError(f"metric: expected a callable logits (N, L, V) -> (N,), got {type(metric).__name__}")
    w = model if isinstance(model, Wiring) else wiring(model)
    graph = build_graph(w)
    c, x = check_pair(w.target, clean, corrupted)
    last_only = reads_last_position(metric)
    clean_logits, clean_w = sender_writes(w, graph, c, last_only=last_only)
    corr_logits, corr_w = sender_writes(w, graph, x, last_only=last_only)
    m_clean = metric(clean_logits).detach().float().cpu()
    m_corr = metric(corr_logits).detach().float().cpu()
    if m_clean.shape != (c.shape[0],):
        raise ValueError(f"metric: expected one value per prompt pair ({c.shape[0]},), got {tuple(m_clean.shape)}")
    if direction == "denoise":
        base, D = x, clean_w - corr_w
    else:
        base, D = c, corr_w - clean_w
    return w, graph, base, D, m_clean, m_corr


def path_patch(
    model,
    clean,
    corrupted,
    metric: Metric,
    senders: Sequence,
    receivers: Sequence,
    *,
    direction: str = "denoise",
    batch_size: int = 16,
    progress: Progress | None = None,
) -> PathPatching:
    """Patch each sender (or set of senders) along its paths into ``receivers`` only.

    Args:
        model: a :class:`~headwise.models.HeadModel`, anything :func:`headwise.patching.as_target` accepts, or
            a :class:`~headwise.circuits.wiring.Wiring` already read.
        clean, corrupted: token ids ``(L,)`` or ``(P, L)`` of the same shape.
        metric: ``fn(logits (N, L, V)) -> (N,)`` (:func:`headwise.patching.logit_difference`,
            :mod:`headwise.circuits.metrics`).
        senders: J jobs, each a sender id (``"embed"``, ``"L2.H1"``, ``"L2.MLP"``) or a list of them patched
            together.
        receivers: receiver specs, all patched in every job: ``"L3.H0.q"``, ``"L3.KV1.k"``, ``"L3.KV1.v"``,
            ``"L3.MLP"``, ``"logits"`` (or ``(node, input)`` pairs). A sender that writes after a receiver reads
            does not reach it (no path: nothing added).
        direction: ``"denoise"`` or ``"noise"``.
        batch_size: jobs per forward pass.
        progress: ``fn(done, total)`` after each batch.
    Returns:
        :class:`PathPatching` with ``patched (P, J)``.
    Raises:
        ValueError / TypeError: an unknown sender or receiver (named), inputs of different shapes, a bad
        direction or batch size, a model structure paths cannot be traced in.
    """
    batch_size = positive_int("batch_size", batch_size)
    t0 = time.perf_counter()
    w, graph, base, D, m_clean, m_corr = _prepare(model, clean, corrupted, metric, direction)
    if isinstance(receivers, str) or not isinstance(receivers, Sequence) or not receivers:
        raise TypeError(f"receivers: expected a non-empty list of receivers, got {receivers!r}")
    if isinstance(senders, str) or not isinstance(senders, Sequence) or not senders:
        raise TypeError(f"senders: expected a non-empty list of senders or sender sets, got {senders!r}")
    r_idx = [graph.receiver("receivers", r) for r in receivers]
    jobs = []
    masks = torch.zeros(len(senders), len(graph.senders), len(graph.receivers), dtype=torch.bool)
    reaches = torch.from_numpy(graph.reaches)
    for j, job in enumerate(senders):
        ids = [job] if isinstance(job, str) else list(job)
        if not ids:
            raise ValueError(f"senders: job {j} is empty")
        s_idx = [graph.sender("senders", s) for s in ids]
        masks[j][torch.tensor(s_idx)[:, None], torch.tensor(r_idx)[None, :]] = True
        jobs.append(ids)
    masks &= reaches
    patched, passes = _run_jobs(w, graph, base, D, masks, metric, batch_size, progress)
    return PathPatching(
        direction=direction,
        jobs=jobs,
        receivers=[graph.receivers[r] for r in r_idx],
        metric_clean=m_clean,
        metric_corrupted=m_corr,
        patched=patched,
        passes=2 + passes,
        seconds=time.perf_counter() - t0,
    )


def patch_edges(
    model,
    clean,
    corrupted,
    metric: Metric,
    edges: Sequence,
    *,
    direction: str = "noise",
    batch_size: int = 16,
    progress: Progress | None = None,
) -> PathPatching:
    """Patch each edge alone, exactly: the receiver's input takes the sender's change and nothing else does.

    Args:
        edges: J edges: :class:`~headwise.circuits.graph.Edge` s, ``"sender->receiver.input"`` or
            ``(sender, receiver spec)``.
        direction: ``"noise"`` (default: base clean, the sender's corrupted write along the edge — what edge
            attribution estimates) or ``"denoise"``.
        others: as :func:`path_patch`.
    Returns:
        :class:`PathPatching` with ``patched (P, J)`` and ``jobs`` the edge names.
    """
    batch_size = positive_int("batch_size", batch_size)
    t0 = time.perf_counter()
    w, graph, base, D, m_clean, m_corr = _prepare(model, clean, corrupted, metric, direction)
    if isinstance(edges, str) or not isinstance(edges, Sequence):
        raise TypeError(f"edges: expected a list of edges, got {edges!r}")
    e_idx = [graph.edge("edges", e) for e in edges]
    masks = torch.zeros(len(e_idx), len(graph.senders), len(graph.receivers), dtype=torch.bool)
    for j, e in enumerate(e_idx):
        s, r = graph.edge_index[e]
        masks[j, s, r] = True
    patched, passes = _run_jobs(w, graph, base, D, masks, metric, batch_size, progress)
    return PathPatching(
        direction=direction,
        jobs=[graph.edges[e].name for e in e_idx],
        receivers=[],
        metric_clean=m_clean,
        metric_corrupted=m_corr,
        patched=patched,
        passes=2 + passes,
        seconds=time.perf_counter() - t0,
    )
