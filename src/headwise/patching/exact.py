"""Activation patching per head (Vig et al. 2020, Meng et al. 2022, Wang et al. 2022; TransformerLens's
``patching``): run one input with chosen heads' outputs taken from another input's run, and read a metric.

Shape legend: P prompt pairs, L length, V vocabulary, NL attention layers, H query heads, Dh head width,
J patched copies in one batch, N = J·P rows.

Where: each attention layer's ``hook_heads`` (:mod:`headwise.core.hooks`), the per-head outputs ``(B, H, L, Dh)``
before the heads are merged for the output projection — so patching head h of layer l replaces exactly
head h's slice of ``Wo`` / ``o_proj``'s input (tested equal to editing that input with a forward pre-hook).

Directions (Heimersheim & Nanda 2024's names):

- ``"denoise"``: run the *corrupted* input, head(s) from the *clean* run — which heads restore the answer;
- ``"noise"``: run the *clean* input, head(s) from the *corrupted* run — which heads the answer needs.

The source run's per-head outputs are computed once (:func:`run_with_cache`); each patched run is one row of
a batch: J patched copies of the P pairs run as one forward of N = J·P rows (``batch_size`` = J), each row's
hook replacing only its own heads. A full sweep costs ``2 + ceil(NL·H / J)`` forward passes (the clean and
corrupted runs, then the batches); :class:`Patching` records the passes, the rows and the time.

The inputs must have the same length (the same positions are swapped); they may differ anywhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor

from headwise.analysis.batched import PASS_TOKENS, layered_plan, row_activations, run_copies
from headwise.checks import one_of, positive_int
from headwise.models.head_model import HeadModel
from headwise.patching.metric import reads_last_position
from headwise.patching.target import as_target
from headwise.points import attention_point

__all__ = [
    "DIRECTIONS",
    "HeadCache",
    "Patch",
    "Patching",
    "check_pair",
    "head_jobs",
    "layered_jobs",
    "budget_copies",
    "exact_activations",
    "patch_heads",
    "patch_positions",
    "patch_set",
    "position_jobs",
    "prepare",
    "run_batch",
    "run_patched",
    "run_with_cache",
    "sweep_cost",
]

DIRECTIONS = ("denoise", "noise")
Metric = Callable[[Tensor], Tensor]
Progress = Callable[[int, int], None]


@dataclass
class HeadCache:
    """One run's logits ``(P, L, V)`` and every layer's per-head outputs ``heads[l] (P, H, L, Dh)`` (detached)."""

    logits: Tensor
    heads: list[Tensor]


@dataclass(frozen=True)
class Patch:
    """Replace head ``head`` of layer ``layer`` at ``positions`` (None: every position)."""

    layer: int
    head: int
    positions: tuple[int, ...] | None = None


@dataclass
class Patching:
    """What a patching sweep measured (means over the P prompt pairs).

    Attributes:
        method: ``"exact"`` or ``"attribution"``.
        direction: ``"denoise"`` or ``"noise"``.
        metric_clean, metric_corrupted: the metric of the clean and corrupted runs ``(P,)``.
        patched: ``(P, NL, H)`` the metric with that one head patched (NaN where a layer has fewer heads).
        per_position: ``(P, NL, H, L)`` for attribution patching: each position's share of the estimate
            (they sum to ``patched − base``); None for exact patching.
        passes: forward passes run (a batch counts once; attribution adds one backward pass).
        rows: rows run in all (sequences through the model).
        seconds: wall time of the sweep, the source and base runs included.
        forward_seconds: wall time of one plain forward pass of the P pairs (the base run).
    """

    method: str
    direction: str
    metric_clean: Tensor
    metric_corrupted: Tensor
    patched: Tensor
    per_position: Tensor | None = None
    passes: int = 0
    rows: int = 0
    seconds: float = 0.0
    forward_seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def mean_patched(self) -> Tensor:
        """``(NL, H)``: the patched metric averaged over the pairs."""
        return self.patched.mean(0)

    @property
    def normalised(self) -> Tensor:
        """``(NL, H)``: (patched − corrupted) / (clean − corrupted) of the pair means — 1: the clean metric,
        0: the corrupted one (in either direction)."""
        clean, corrupted = float(self.metric_clean.mean()), float(self.metric_corrupted.mean())
        gap = clean - corrupted
        if gap == 0:
            return torch.full_like(self.mean_patched, float("nan"))
        return (self.mean_patched - corrupted) / gap


# -- inputs ----------------------------------------------------------------------------------------------------


def _as_ids(name: str, ids, device: torch.device) -> Tensor:
    if not isinstance(ids, Tensor):
        ids = torch.tensor(ids)
    if ids.dim() == 1:
        ids = ids[None]  # (1, L)
    if ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool or ids.shape[1] == 0:
        raise ValueError(f"{name}: expected integer token ids (L,) or (P, L), got {ids.dtype} {tuple(ids.shape)}")
    return ids.to(device=device, dtype=torch.long)


def check_pair(target: HeadModel, clean, corrupted) -> tuple[Tensor, Tensor]:
    """``clean`` and ``corrupted`` as ``(P, L)`` long tensors on the model's device.

    Raises:
        ValueError: not integer ids, or shapes that differ (the message gives both lengths).
    """
    c = _as_ids("clean", clean, target.device)
    x = _as_ids("corrupted", corrupted, target.device)
    if c.shape != x.shape:
        raise ValueError(
            f"corrupted: expected the clean input's shape {tuple(c.shape)} (patching swaps the same positions), "
            f"got {tuple(x.shape)}"
        )
    return c, x


def _check_batch_size(batch_size) -> int:
    return positive_int("batch_size", batch_size)


# -- runs ------------------------------------------------------------------------------------------------------


def run_with_cache(target, ids: Tensor, *, last_only: bool = False) -> HeadCache:
    """Run ``ids (P, L)`` once; keep the logits (``last_only``: the last position's alone, ``(P, 1, V)``, where the
    model can form them alone) and every layer's per-head outputs ``(P, H, L, Dh)``."""
    target = as_target(target)
    heads: list[Tensor | None] = [None] * target.num_layers

    def keep(layer: int, out: Tensor) -> None:
        heads[layer] = out.detach().clone()

    hooks = {attention_point(i, "heads"): partial(keep, i) for i in range(target.num_layers)}
    with torch.no_grad(), target.hooks(hooks):
        logits = target.logits(ids, last_only=last_only)  # (P, L or 1, V)
    missing = [i for i, h in enumerate(heads) if h is None]
    if missing:
        raise RuntimeError(f"patching: attention layers {missing} did not run (is the model on headwise's backend?)")
    return HeadCache(logits.detach(), heads)  # type: ignore[arg-type]


def run_patched(
    target,
    base: Tensor,
    source: HeadCache,
    jobs: Sequence[Sequence[Patch]],
    *,
    last_only: bool = False,
    layered: int | None = None,
) -> Tensor:
    """Run J patched copies of ``base (P, L)`` as one batch; copy j takes ``jobs[j]``'s heads from ``source``
    (the batched engine, :func:`headwise.analysis.batched.run_copies`).

    The layers below the lowest one any job patches run once on the P rows and the residual stream is copied J
    times at that layer's input (where the model shows its blocks).

    ``layered``: the pass runs each block on ``layered`` copies at a time, each job's copy joining at its lowest
    layer (:func:`headwise.analysis.batched.staggered`): every layer read once for all J jobs.

    Returns:
        logits ``(J·P, L, V)``, row ``j·P + p`` = pair p patched by ``jobs[j]`` (``last_only``: a Hugging Face
        model's last position alone, ``(J·P, 1, V)``).
    Raises:
        ValueError / TypeError: a layer, head or position out of range (named).
    """
    target = as_target(target)
    L = base.shape[1]
    for job in jobs:
        for patch in job:
            target.check_layer_head(patch.layer, patch.head)
            for pos in patch.positions or ():
                if isinstance(pos, bool) or not isinstance(pos, int) or not -L <= pos < L:
                    raise ValueError(f"positions: {pos!r} is out of range for inputs of {L} tokens")

    def run(repeat: int) -> Tensor:
        return target.logits(base.repeat(repeat, 1), last_only=last_only)  # (J·P, L, V)

    try:
        logits, _ = run_copies(target, run, base, jobs, replacement=source.heads, layered=layered)
    except RuntimeError as e:
        if str(e).startswith("layer "):
            raise RuntimeError(f"patching: {e}") from None
        raise
    return logits


def run_batch(
    target,
    base: Tensor,
    source: HeadCache,
    metric: Metric,
    jobs: Sequence[Sequence[Patch]],
    *,
    layered: int | None = None,
) -> Tensor:
    """One batch of a sweep: ``jobs`` (J) run as one pass (:func:`run_patched`, the last position alone where the
    metric reads no other; ``layered``: its blocks run that many copies at a time) and the metric of each,
    ``(J, P)`` float32 on the CPU. A sweep cut into batches of ``batch_size`` consecutive jobs
    (:func:`patch_heads`, :func:`patch_positions`) is these batches in order; a run that deals the batches to
    several processes (:func:`headwise.study.patch_across_ranks`) calls it on each."""
    last_only = reads_last_position(metric)
    logits = run_patched(target, base, source, jobs, last_only=last_only, layered=layered)  # (J·P, L or 1, V)
    return metric(logits).detach().float().reshape(len(jobs), base.shape[0]).cpu()


def head_jobs(target: HeadModel, heads=None) -> list[list[Patch]]:
    """The jobs of a sweep of heads patched alone at every position: every query head of every layer in layer order
    (``heads`` None), or the ``(layer, head)`` pairs / ``{layer: [head, …]}`` of ``heads``, in the order given."""
    pairs = (
        [(layer, head) for layer in range(target.num_layers) for head in range(target.heads_per_layer[layer])]
        if heads is None
        else _head_list(target, heads)
    )
    return [[Patch(layer, head)] for layer, head in pairs]


def position_jobs(target: HeadModel, heads, length: int) -> list[list[Patch]]:
    """The jobs of :func:`patch_positions`: each of ``heads`` (K, in the order given) at position 0 … ``length`` − 1
    alone — K·L jobs, head-major."""
    return [[Patch(layer, head, (t,))] for layer, head in _head_list(target, heads) for t in range(length)]


def _sweep(target: HeadModel, base: Tensor, source: HeadCache, metric: Metric, jobs: list, batch_size: int, progress):
    """The metric of every job, ``(len(jobs), P)``; returns it with the number of passes run. On a model opened
    layer by layer a pass carries as many jobs as the budget holds (:func:`layered_jobs`), its blocks run at least
    ``batch_size`` copies at a time, up to 4,096 tokens a call where the budget holds them; elsewhere a pass is
    ``batch_size`` jobs, or as many as a budget given holds
    (:func:`budget_copies`)."""
    P, L = base.shape
    last_only = reads_last_position(metric)
    per_call = max(batch_size, PASS_TOKENS["cpu"] // max(1, P * L))  # a block call of up to 4,096 tokens
    plan = layered_jobs(target, base.shape, last_only, per_call, len(jobs))
    if plan is None:  # opened whole: batches of batch_size, fewer where a budget given holds fewer
        size, layered = budget_copies(target, *base.shape, _job_bytes(target, base.shape, last_only), batch_size), None
    else:
        size, layered = plan
    values = []
    batches = 0
    for start in range(0, len(jobs), size):
        values.append(run_batch(target, base, source, metric, jobs[start : start + size], layered=layered))
        batches += 1
        if progress is not None:
            progress(min(start + size, len(jobs)), len(jobs))
    return torch.cat(values) if values else torch.empty(0, P), batches


def layered_jobs(target: HeadModel, shape, last_only: bool, per_call: int, jobs: int) -> tuple[int, int] | None:
    """``(jobs a pass, copies a block call)`` of a sweep on a model opened layer by layer (None: opened whole, a
    pass is a batch of ``batch_size``): as many jobs as the budget holds
    (:func:`headwise.analysis.batched.layered_plan`), each holding the residual stream of its rows twice (a block's
    input and output) and its logits twice (the model's and the metric's copy), float32; a block call runs at most
    ``per_call`` copies.

    Args:
        shape: the input's ``(P, L)``.
        last_only: the logits are the last position's alone.
    """
    if getattr(target, "stream", None) is None:
        return None
    from headwise.models.layer_walk import walk_need

    P, L = shape
    room = target.memory.budget - walk_need(target)
    return layered_plan(target, P, L, _job_bytes(target, shape, last_only), jobs, room=room, per_call=per_call)


def budget_copies(model, rows: int, length: int, per_job: int, most: int) -> int:
    """Copies a pass holds on a model opened whole within the budget it was opened under, where one was given
    (``model.memory.given``; else ``most``): what the budget leaves beside what the process holds now and
    :data:`~headwise.models.memory.MIN_WORKING`, per copy its activations
    (:func:`~headwise.analysis.batched.row_activations`) and ``per_job`` bytes; at least 1, at most ``most``."""
    memory = getattr(model, "memory", None)
    if memory is None or not memory.given:
        return most
    per_copy = per_job + row_activations(model, rows, length)
    return max(1, min(most, memory.left() // max(1, per_copy)))


def exact_activations(target: HeadModel, shape, last_only: bool, per_call: int = 1) -> int:
    """Bytes of activations an exact sweep of ``shape`` ``(P, L)`` holds at least, on a model opened layer by layer:
    both cached runs' per-head outputs and logits, the base copy and one job (:func:`_job_bytes`) and one block call of
    ``per_call`` copies (:func:`headwise.analysis.batched.layered_plan`'s row) — what a budget must leave for one job a
    pass (:func:`headwise.models.layer_walk.check_walk` weighs it before the sweep)."""
    P, L = shape
    heads = 4 * P * L * sum(target.heads_per_layer) * (target.width // max(1, max(target.heads_per_layer)))
    logits = 4 * P * (1 if last_only else L) * int(target.vocab_size or 0)
    return 2 * (heads + logits) + 2 * _job_bytes(target, shape, last_only) + per_call * row_activations(target, P, L)


def _job_bytes(target: HeadModel, shape, last_only: bool) -> int:
    """Bytes a patched copy of ``shape`` ``(P, L)`` holds through a pass: its residual stream twice and its logits
    twice (the model's and the metric's copy), float32."""
    P, L = shape
    return 4 * P * (2 * L * target.width + 2 * (1 if last_only else L) * int(target.vocab_size or 0))


def prepare(target, clean, corrupted, metric: Metric, direction: str):
    """Check the inputs and run both once: ``(target, base ids, source cache, (clean run, corrupted run),
    (metric clean (P,), metric corrupted (P,)), seconds of the clean forward)``."""
    target = as_target(target)
    one_of("direction", direction, DIRECTIONS)
    if not callable(metric):
        raise TypeError(f"metric: expected a callable logits (N, L, V) -> (N,), got {type(metric).__name__}")
    c, x = check_pair(target, clean, corrupted)
    last_only = reads_last_position(metric)  # the metric reads the last position: no other position's logits kept
    t0 = time.perf_counter()
    if getattr(target, "stream", None) is not None:  # layer by layer: both runs in one pass, each layer read once
        both = run_with_cache(target, torch.cat([c, x]), last_only=last_only)
        forward = (time.perf_counter() - t0) / 2
        P = c.shape[0]
        clean_run = HeadCache(both.logits[:P], [h[:P] for h in both.heads])
        corrupted_run = HeadCache(both.logits[P:], [h[P:] for h in both.heads])
    else:
        clean_run = run_with_cache(target, c, last_only=last_only)
        forward = time.perf_counter() - t0
        corrupted_run = run_with_cache(target, x, last_only=last_only)
    m_clean = metric(clean_run.logits).detach().float().cpu()
    m_corrupted = metric(corrupted_run.logits).detach().float().cpu()
    if m_clean.shape != (c.shape[0],):
        raise ValueError(f"metric: expected one value per prompt pair ({c.shape[0]},), got {tuple(m_clean.shape)}")
    base, source = (x, clean_run) if direction == "denoise" else (c, corrupted_run)
    return target, base, source, (clean_run, corrupted_run), (m_clean, m_corrupted), forward


def patch_heads(
    model,
    clean,
    corrupted,
    metric: Metric,
    *,
    direction: str = "denoise",
    batch_size: int = 16,
    progress: Progress | None = None,
    heads=None,
) -> Patching:
    """Patch every query head of every layer (or the heads of ``heads``), one at a time, at all positions.

    Args:
        model: see :func:`headwise.patching.as_target`.
        clean, corrupted: token ids ``(L,)`` or ``(P, L)`` of the same shape.
        metric: ``fn(logits (N, L, V)) -> (N,)`` (e.g. :func:`headwise.patching.logit_difference`).
        direction: ``"denoise"`` (corrupted run, clean head) or ``"noise"`` (clean run, corrupted head).
        batch_size: patched copies per forward pass (J).
        progress: ``fn(done, total)`` after each batch (heads done, NL·H).
        heads: None (every head), or a subset — ``[(layer, head), …]`` or ``{layer: [head, …]}`` — patched in the
            order given, in batches of ``batch_size`` of them (the others NaN in ``patched``; ``passes`` and ``rows``
            count the subset's batches).
    Returns:
        :class:`Patching` with ``patched (P, NL, H)``.
    Raises:
        ValueError / TypeError: inputs of different shapes, not ids, an unknown direction, a bad batch size.
    """
    batch_size = _check_batch_size(batch_size)
    t0 = time.perf_counter()
    target, base, source, _, (m_clean, m_corrupted), forward = prepare(model, clean, corrupted, metric, direction)
    jobs = head_jobs(target, heads)
    values, batches = _sweep(target, base, source, metric, jobs, batch_size, progress)  # (NL·H, P)
    P = base.shape[0]
    patched = torch.full((P, target.num_layers, target.max_heads), float("nan"))
    for [patch], v in zip(jobs, values):
        patched[:, patch.layer, patch.head] = v
    return Patching(
        method="exact",
        direction=direction,
        metric_clean=m_clean,
        metric_corrupted=m_corrupted,
        patched=patched,
        passes=2 + batches,
        rows=2 * P + len(jobs) * P,
        seconds=time.perf_counter() - t0,
        forward_seconds=forward,
    )


def _head_list(target: HeadModel, heads) -> list[tuple[int, int]]:
    """``[(layer, head), …]`` from pairs or ``{layer: [head, …]}``, each checked."""
    if isinstance(heads, Mapping):
        items = [(layer, head) for layer, hs in heads.items() for head in _iterable("heads", hs)]
    else:
        items = []
        for item in _iterable("heads", heads):
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise TypeError(f"heads: expected (layer, head) pairs or {{layer: [head, ...]}}, got {item!r}")
            items.append(tuple(item))
    if not items:
        raise ValueError("heads: expected at least one (layer, head)")
    return [target.check_layer_head(layer, head) for layer, head in items]


def _iterable(name: str, value) -> Iterable:
    if isinstance(value, (str, bytes, int)) or not isinstance(value, Iterable):
        raise TypeError(f"{name}: expected a list, got {value!r}")
    return value


def patch_positions(
    model,
    clean,
    corrupted,
    metric: Metric,
    heads,
    *,
    direction: str = "denoise",
    batch_size: int = 16,
    progress: Progress | None = None,
) -> Tensor:
    """Patch each chosen head at one position at a time.

    Args:
        heads: ``[(layer, head), …]`` or ``{layer: [head, …]}`` (K heads).
        others: as :func:`patch_heads`.
    Returns:
        ``(P, K, L)``: the metric with head k patched at position t only (the heads in the order given).
    """
    batch_size = _check_batch_size(batch_size)
    target, base, source, _, _, _ = prepare(model, clean, corrupted, metric, direction)
    L = base.shape[1]
    jobs = position_jobs(target, heads, L)
    values, _ = _sweep(target, base, source, metric, jobs, batch_size, progress)  # (K·L, P)
    return values.reshape(len(jobs) // L, L, -1).permute(2, 0, 1).contiguous()  # (P, K, L)


def patch_set(
    model,
    clean,
    corrupted,
    metric: Metric,
    heads,
    *,
    positions: Sequence[int] | None = None,
    direction: str = "denoise",
) -> Tensor:
    """Patch a set of heads together (at ``positions``, None: all) in one run.

    Returns:
        ``(P,)``: the metric of that one patched run.
    """
    target, base, source, _, _, _ = prepare(model, clean, corrupted, metric, direction)
    pos = None if positions is None else tuple(_iterable("positions", positions))
    job = [Patch(layer, head, pos) for layer, head in _head_list(target, heads)]
    values, _ = _sweep(target, base, source, metric, [job], 1, None)
    return values[0]


def sweep_cost(num_heads: int, batch_size: int) -> int:
    """Forward passes of a full sweep of ``num_heads`` heads: the two cached runs and the batches."""
    return 2 + math.ceil(num_heads / batch_size)
