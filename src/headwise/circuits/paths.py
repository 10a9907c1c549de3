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

Under an RMS norm on the attention's write (Gemma 2/3, OLMo 2) a head's change is computed exactly,
``norm(o_base + o_h(source) − o_h(base)) − norm(o_base)`` (heads of one layer patched together: jointly).

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

from headwise.analysis.batched import CopyJob, run_copies
from headwise.checks import one_of, positive_int
from headwise.circuits.addresses import Write
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
    def per_pair(self) -> Tensor:
        """``(P, J)`` patched − base, each pair's."""
        return self.patched - self.base[:, None]

    @property
    def effect(self) -> Tensor:
        """``(J,)`` patched − base, the mean over pairs."""
        return self.per_pair.mean(0)


def stack_writes(graph: Graph, writes: dict, upto: int | None = None) -> Tensor:
    """Recorded writes as one ``(N, S', L, D)`` tensor in sender order (the first ``upto`` senders' groups)."""
    parts = []
    for key, sl in graph.sender_groups.items():
        if upto is not None and sl.start >= upto:
            break
        parts.append(writes[key])
    return torch.cat(parts, 1)


def sender_writes(w: Wiring, graph: Graph, ids: Tensor, *, last_only: bool = False, raw: bool = False):
    """One run of ``ids (P, L)`` without gradient: ``(logits, writes (P, S, L, D))`` (``raw``: and the
    recorded dict of :meth:`Wiring.run`)."""
    with torch.no_grad():
        logits, writes = w.run(ids, record=True, last_only=last_only)
    return (logits, stack_writes(graph, writes), writes) if raw else (logits, stack_writes(graph, writes))


def _group_of(graph: Graph, s: int):
    for key, sl in graph.sender_groups.items():
        if sl.start <= s < sl.stop:
            return key, s - sl.start
    raise IndexError(s)


def _change(w: Wiring, key: Write, members: list[int], base: dict, source: dict) -> Tensor:
    """The exact change ``(P, L, D)`` of sender group ``key``'s write when ``members`` take the source's: for heads
    under a post-norm ``norm(o_base + Σ (o_h(source) − o_h(base))) − norm(o_base)``, else the difference of the
    writes."""
    if key.kind == "heads" and w.layers[key.layer].attn_post is not None:
        layer = key.layer
        o = base[Write("o", layer)]
        delta = (source[Write("o_heads", layer)][:, members] - base[Write("o_heads", layer)][:, members]).sum(1)
        post, scale = w.layers[layer].attn_post, w.layers[layer].scale
        with torch.no_grad(), w.target.holding(layer):
            return (post(o + delta) - post(o)) * scale
    return (source[key][:, members] - base[key][:, members]).sum(1)


def sender_changes(w: Wiring, graph: Graph, base: dict, source: dict) -> Tensor:
    """``(P, S, L, D)``: each sender's change of write when it alone takes the source's (:func:`group_change` of
    every sender group, in sender order)."""
    return torch.cat([group_change(w, key, base, source) for key in graph.sender_groups], 1)


def group_change(w: Wiring, key: Write, base: dict, source: dict) -> Tensor:
    """``(P, n, L, D)``: the change of write of each sender of the group ``key`` when it alone takes the source's:
    the difference of the writes, but under a post-norm each head's exact change with the layer's other heads at
    the base run (:func:`_change`)."""
    if key.kind == "heads" and w.layers[key.layer].attn_post is not None:
        layer = key.layer
        o = base[Write("o", layer)][:, None]  # (P, 1, L, D)
        delta = source[Write("o_heads", layer)] - base[Write("o_heads", layer)]  # (P, H, L, D)
        post, scale = w.layers[layer].attn_post, w.layers[layer].scale
        with torch.no_grad(), w.target.holding(layer):
            return (post(o + delta) - post(o)) * scale
    return source[key] - base[key]


def _job_deltas(graph: Graph, parts: list, receivers: Tensor):
    """``deltas`` of :meth:`Wiring.run` for J jobs: job j adds the sum of its ``parts[j]`` (``(stage, change
    (P, L, D))`` of each sender group it patches) written before a receiver reads to each receiver of
    ``receivers[j] (R,)``."""
    J = len(parts)

    def deltas(group, _writes):
        sl = graph.groups[group]
        stage = graph.stage_r[sl.start]
        mask = receivers[:, sl]  # (J, n)
        out = None
        for j in range(J):
            if not bool(mask[j].any()):
                continue
            d = [c for st, c in parts[j] if st < stage]
            if not d:
                continue
            total = torch.stack(d).sum(0)  # (P, L, D)
            if out is None:
                out = total.new_zeros(J, total.shape[0], sl.stop - sl.start, *total.shape[1:])
            out[j, :, mask[j]] = total[:, None]
        return None if out is None else out.reshape(-1, *out.shape[2:])  # (J·P, n, L, D)

    return deltas


def _jobs(w: Wiring, graph: Graph, senders: list[list[int]], base: dict, source: dict) -> list:
    """Each job's ``[(stage, change (P, L, D))]``, one per sender group it touches."""
    out = []
    for job in senders:
        groups: dict = {}
        for s in job:
            key, i = _group_of(graph, s)
            groups.setdefault(key, []).append(i)
        out.append(
            [
                (int(graph.stage_s[graph.sender_groups[k].start]), _change(w, k, m, base, source))
                for k, m in groups.items()
            ]
        )
    return out


def _run_jobs(w: Wiring, graph: Graph, base_ids: Tensor, parts: list, receivers: Tensor, metric, batch_size, progress):
    """The metric ``(P, J)`` of every job, ``batch_size`` jobs per forward pass of the batched engine
    (:func:`headwise.analysis.batched.run_copies`): each job's edits start at its lowest receiver's layer, so a pass
    runs the layers below its jobs' lowest receiver once on the P rows."""
    P = base_ids.shape[0]
    last_only = reads_last_position(metric)
    values, passes = [], 0
    J = len(parts)
    layer_of = graph.stage_r // 2  # (R,): the layer each receiver reads in (the logits': NL)
    for start in range(0, J, batch_size):
        chunk, r = parts[start : start + batch_size], receivers[start : start + batch_size]
        deltas = _job_deltas(graph, chunk, r)
        jobs = [CopyJob(edits=int(layer_of[m.cpu().numpy()].min()) if bool(m.any()) else None) for m in r]

        def run(repeat: int, deltas=deltas) -> Tensor:
            return w.run(base_ids.repeat(repeat, 1), deltas=deltas, last_only=last_only)[0]

        logits, _ = run_copies(w.target, run, base_ids, jobs)
        values.append(metric(logits).detach().float().reshape(len(chunk), P).cpu())
        passes += 1
        if progress is not None:
            progress(min(start + batch_size, J), J)
    return (torch.cat(values).T if values else torch.empty(P, 0)), passes


def open_pair(model, clean, corrupted, metric) -> tuple[Wiring, Graph, Tensor, Tensor, bool]:
    """What every circuit tool starts from: ``(wiring, graph, clean (P, L), corrupted (P, L), last_only)`` — the
    model's :class:`Wiring` (given, or traced by :func:`wiring`), its :class:`Graph`, the pair checked
    (:func:`headwise.patching.exact.check_pair`) and whether ``metric`` reads the last position alone.

    Raises:
        TypeError: ``metric`` not callable; ValueError / TypeError: the pair (:func:`check_pair`), a structure not
        traced (:func:`wiring`).
    """
    if not callable(metric):
        raise TypeError(f"metric: expected a callable logits (N, L, V) -> (N,), got {type(metric).__name__}")
    w = model if isinstance(model, Wiring) else wiring(model)
    c, x = check_pair(w.target, clean, corrupted)
    return w, build_graph(w), c, x, reads_last_position(metric)


def _prepare(model, clean, corrupted, metric, direction):
    one_of("direction", direction, DIRECTIONS)
    w, graph, c, x, last_only = open_pair(model, clean, corrupted, metric)
    clean_logits, _, clean_w = sender_writes(w, graph, c, last_only=last_only, raw=True)
    corr_logits, _, corr_w = sender_writes(w, graph, x, last_only=last_only, raw=True)
    m_clean = metric(clean_logits).detach().float().cpu()
    m_corr = metric(corr_logits).detach().float().cpu()
    if m_clean.shape != (c.shape[0],):
        raise ValueError(f"metric: expected one value per prompt pair ({c.shape[0]},), got {tuple(m_clean.shape)}")
    if direction == "denoise":
        return w, graph, x, (corr_w, clean_w), m_clean, m_corr
    return w, graph, c, (clean_w, corr_w), m_clean, m_corr


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
    w, graph, base, (base_w, source_w), m_clean, m_corr = _prepare(model, clean, corrupted, metric, direction)
    if isinstance(receivers, str) or not isinstance(receivers, Sequence) or not receivers:
        raise TypeError(f"receivers: expected a non-empty list of receivers, got {receivers!r}")
    if isinstance(senders, str) or not isinstance(senders, Sequence) or not senders:
        raise TypeError(f"senders: expected a non-empty list of senders or sender sets, got {senders!r}")
    r_idx = [graph.receiver("receivers", r) for r in receivers]
    jobs, sender_idx = [], []
    for j, job in enumerate(senders):
        ids = [job] if isinstance(job, str) else list(job)
        if not ids:
            raise ValueError(f"senders: job {j} is empty")
        sender_idx.append(sorted({graph.sender("senders", s) for s in ids}))
        jobs.append(ids)
    receiver_mask = torch.zeros(len(jobs), len(graph.receivers), dtype=torch.bool)
    receiver_mask[:, r_idx] = True
    parts = _jobs(w, graph, sender_idx, base_w, source_w)
    patched, passes = _run_jobs(w, graph, base, parts, receiver_mask, metric, batch_size, progress)
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
    w, graph, base, (base_w, source_w), m_clean, m_corr = _prepare(model, clean, corrupted, metric, direction)
    if isinstance(edges, str) or not isinstance(edges, Sequence):
        raise TypeError(f"edges: expected a list of edges, got {edges!r}")
    e_idx = [graph.edge("edges", e) for e in edges]
    receiver_mask = torch.zeros(len(e_idx), len(graph.receivers), dtype=torch.bool)
    for j, e in enumerate(e_idx):
        receiver_mask[j, graph.edge_index[e, 1]] = True
    parts = _jobs(w, graph, [[int(graph.edge_index[e, 0])] for e in e_idx], base_w, source_w)
    patched, passes = _run_jobs(w, graph, base, parts, receiver_mask, metric, batch_size, progress)
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
