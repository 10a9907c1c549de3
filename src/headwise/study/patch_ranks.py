"""Activation patching on ``torch.distributed``: the sweep's batches split across ranks, the values gathered once,
rank 0 holding what one process finds.

``torchrun --nproc-per-node P -m headwise patch …`` runs :func:`patch_across_ranks` on every rank (the command line
detects torchrun's ``RANK`` / ``WORLD_SIZE``); a library caller calls it on every rank of its own launch.
The group, the timeout (``timeout_s=``, else ``$HEADWISE_DIST_TIMEOUT``, else
:data:`~headwise.distributed.ranks.DEFAULT_TIMEOUT_S`) and the refusals work as in :func:`headwise.study.corpus_heads`.

Shape legend: P prompt pairs, L length, NL layers, H query heads, NH = Σ H over the layers, K heads patched per
position, J jobs of a shard.

**Patching** (:func:`patch_across_ranks`): the jobs are split, not the pairs. The jobs are the ones a one-process
run makes — every head alone in layer order (:func:`headwise.patching.patch_heads`), then each chosen head at one
position at a time (:func:`headwise.patching.patch_positions`) — cut into shards of ``batch_size`` consecutive jobs:
the very batches a one-process run forms, so each value is computed in the same batch as there and does not depend
on the number of ranks. The shards are dealt to the ranks by their work (jobs × layers run above the batch's lowest
layer, :meth:`~headwise.distributed.ranks.Ranks.map`). Every rank runs the clean and corrupted inputs once (the source
cache), then its shards; the values ``(J, P)`` of every shard are gathered once, in shard order (the map's one
all-gather of JSON: floats exact). With ``out`` each shard's values are saved as it finishes
(``OUT/shards/shard-<k>.safetensors`` beside a manifest naming the weights' SHA-256, the token ids, the metric and the
options), so a restarted or repeated run computes only the missing shards, with any number of ranks; a manifest of
another run is refused with one line. Splitting the jobs rather than the pairs serves the command's one pair as well as
many, and keeps each shard's batch the one-process batch (the pairs of a patching run are one batch of one length, so a
split by pairs would balance by count alone).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.study.shards import json_sha256

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = ["PatchRun", "SweepShard", "patch_across_ranks", "plan_sweep"]

#: The patching shards' format; a manifest of another format is refused.
PATCH_FORMAT = "headwise-patch-shards/1"


@dataclass(frozen=True)
class SweepShard:
    """A batch of patching jobs: ``jobs`` are ``(layer, head, position or None)`` (None: every position);
    ``kind`` ``"heads"`` (the sweep of every head) or ``"positions"`` (chosen heads, one position at a time);
    ``cost`` the layer-rows it runs per pair (jobs × the layers above the batch's lowest)."""

    index: int
    kind: str
    jobs: tuple[tuple[int, int, int | None], ...]
    cost: int


def plan_sweep(target, length: int, chosen: Sequence[tuple[int, int]], batch_size: int) -> list[SweepShard]:
    """The shards of a patching run: every head of ``target`` alone in layer order, then each of ``chosen``'s K
    heads at each of ``length`` positions, cut into batches of ``batch_size`` consecutive jobs (the batches of
    :func:`headwise.patching.patch_heads` and :func:`headwise.patching.patch_positions`)."""
    from headwise import checks
    from headwise.analysis.batched import start_layer
    from headwise.patching import head_jobs, position_jobs

    checks.positive_int("batch_size", batch_size)
    heads = [(p.layer, p.head, None) for [p] in head_jobs(target)]
    positions = [(p.layer, p.head, p.positions[0]) for [p] in position_jobs(target, chosen, length)] if chosen else []
    shards: list[SweepShard] = []
    for kind, jobs in (("heads", heads), ("positions", positions)):
        for a in range(0, len(jobs), batch_size):
            chunk = tuple(jobs[a : a + batch_size])
            low = start_layer(target, [{layer: [0]} for layer, _, _ in chunk]) if len(chunk) > 1 else 0
            shards.append(SweepShard(len(shards), kind, chunk, len(chunk) * (target.num_layers - low)))
    return shards


@dataclass
class PatchRun:
    """What :func:`patch_across_ranks` did on this rank.

    Attributes:
        patching: rank 0: the :class:`~headwise.patching.Patching` of every head (``passes``: the two cached runs
            and the sweep's batches, as one process counts them; every rank runs the two); other ranks: None.
        positions: rank 0, with heads chosen: ``(P, K, L)`` as :func:`~headwise.patching.patch_positions`; else None.
        rank, world_size: this process's place. shards: this rank's shard indices; computed / resumed: those it
            computed / loaded from ``OUT/shards``.
        payload_bytes: bytes every rank received in the one gather (each rank's JSON of its shards' values,
            padded to the longest, times the ranks). compute_seconds / gather_seconds: this rank's time on its
            shards (the cached runs included) / in the barrier and the gather (waiting included).
    """

    patching: object
    positions: object
    rank: int
    world_size: int
    shards: list[int]
    computed: list[int]
    resumed: list[int]
    payload_bytes: int
    compute_seconds: float = 0.0
    gather_seconds: float = 0.0


def _metric_key(metric) -> str | None:
    """The metric as the manifest names it (a dataclass's repr), or None where its repr names the object alone."""
    text = repr(metric)
    return None if " at 0x" in text else text


def _fit(heads: int, positions: int, world: int) -> int:
    """The largest batch size that cuts ``heads`` and ``positions`` jobs into at least ``world`` shards (≥ 1)."""
    best = 1
    for b in range(1, max(heads, positions, 1) + 1):
        if -(-heads // b) + -(-positions // b) >= world:
            best = b
    return best


def patch_across_ranks(
    hm: HeadModel,
    clean,
    corrupted,
    metric,
    *,
    heads: Sequence[tuple[int, int]] = (),
    direction: str = "denoise",
    batch_size: int = 16,
    out: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    timeout_s: float | None = None,
) -> PatchRun:
    """Every head patched alone (and ``heads`` one position at a time) with the jobs split across the ranks of a
    torchrun launch (see the module's text). Call it on every rank with the same model, inputs and options.

    Args:
        hm: the decoder (anything :func:`headwise.patching.as_target` accepts); clean, corrupted: token ids
            ``(L,)`` or ``(P, L)``; metric: ``fn(logits) -> (P,)``; heads: the K ``(layer, head)`` patched per
            position; direction, batch_size: as :func:`~headwise.patching.patch_heads`; out: where the shards are
            kept (``OUT/shards``; None: not kept); progress: ``(shards done, shards of this rank)``;
            timeout_s: the collectives' timeout.
    Returns:
        the :class:`PatchRun` (its ``patching`` and ``positions`` on rank 0).
    Raises:
        ValueError: on every rank — more ranks than heads, fewer shards than ranks (naming ``--batch-size``), ranks
            with different weights or inputs, a manifest of another run, an unreachable rendezvous; what
            :func:`~headwise.patching.patch_heads` refuses. CollectiveTimeout: a stalled rank.
    """
    from headwise.checks import one_of
    from headwise.distributed.ranks import ranks
    from headwise.patching import DIRECTIONS, as_target
    from headwise.patching.exact import check_pair

    one_of("direction", direction, DIRECTIONS)
    if not callable(metric):
        raise TypeError(f"metric: expected a callable logits (N, L, V) -> (N,), got {type(metric).__name__}")
    target = as_target(hm)
    c, x = check_pair(target, clean, corrupted)
    chosen = [target.check_layer_head(layer, head) for layer, head in heads]
    shards = plan_sweep(target, c.shape[1], chosen, batch_size)
    with ranks(timeout_s) as r:
        store = _checked_store(r, target, c, x, metric, direction=direction, batch_size=batch_size, chosen=chosen,
                               shards=shards, out=out)  # fmt: skip
        started = computed_at = time.perf_counter()
        sweep = _ShardValues(target, c, x, metric, direction, store)
        share, mine = r.share([s.cost for s in shards]), []

        def finished(k: int, _) -> None:
            nonlocal computed_at
            mine.append(k)
            computed_at = time.perf_counter()
            if progress is not None:
                progress(len(mine), len(share))

        every = r.map(shards, lambda s: s.cost, sweep.values, done=finished)  # every shard's values, in shard order
        gathered_at = time.perf_counter()
        if r.rank == 0:
            sweep.prepare()
        if store is not None:
            store.clean()
        patching = positions = None
        if r.rank == 0:
            patching, positions = _assembled(sweep, chosen, shards, every, seconds=gathered_at - started)
        return PatchRun(
            patching, positions, r.rank, r.world_size, share, sweep.computed, sweep.resumed, r.payload_bytes,
            computed_at - started, gathered_at - computed_at,
        )  # fmt: skip


def _checked_store(r, target, c, x, metric, *, direction, batch_size, chosen, shards, out):
    """Every rank's weights, inputs and options agreed (their SHA-256), the sweep's shards checked against the ranks,
    and the store of ``OUT/shards`` (None: ``out`` None, or a metric its manifest cannot name) checked against its
    manifest — any problem refused on every rank in one line — then its manifest written."""
    from headwise.distributed.ranks import agree, refuse_together
    from headwise.study.shards import ShardStore, weights_sha256

    world = r.world_size
    model_hash = weights_sha256(target.model)
    agree("--model (SHA-256 of the weights)", model_hash)
    manifest = {
        "format": PATCH_FORMAT,
        "kind": "patch-heads",
        "model_sha256": model_hash,
        "inputs_sha256": json_sha256({"clean": c.tolist(), "corrupted": x.tolist()}),
        "metric": _metric_key(metric),
        "direction": direction,
        "batch_size": batch_size,
        "heads": [list(h) for h in chosen],
        "shards": len(shards),
    }
    agree("--clean / --corrupted / --answer / --wrong / options (SHA-256)", json_sha256(manifest))
    n_heads = _head_jobs(shards)
    n_positions = sum(len(s.jobs) for s in shards) - n_heads
    problem = None
    if world > n_heads:
        problem = f"WORLD_SIZE: {world} ranks for {n_heads} heads to patch; expected at most one rank a head"
    elif len(shards) < world:
        problem = (
            f"--batch-size: {len(shards)} shard(s) of {batch_size} patches for {world} ranks; expected "
            f"--batch-size ≤ {_fit(n_heads, n_positions, world)}"
        )
    store = None
    if out is not None and manifest["metric"] is not None:
        store = ShardStore(Path(out) / "shards", manifest)
        if problem is None:
            problem = store.mismatch()
    refuse_together(problem)
    if store is not None:
        store.write_manifest()
    return store


def _head_jobs(shards: list[SweepShard]) -> int:
    """The sweep's jobs that patch a head alone (the rest patch one position)."""
    return sum(1 for s in shards if s.kind == "heads" for _ in s.jobs)


class _ShardValues:
    """One rank's shards of the sweep: each shard's values loaded from the store, else patched in the one-process
    batch (the source cache prepared once, when first needed); which were computed and which resumed."""

    def __init__(self, target, c, x, metric, direction: str, store):
        self.target, self.c, self.x, self.metric, self.direction, self.store = target, c, x, metric, direction, store
        self.prepared = None
        self.computed: list[int] = []
        self.resumed: list[int] = []

    def prepare(self):
        """The clean and corrupted runs (:func:`headwise.patching.exact.prepare`), once."""
        from headwise.patching.exact import prepare

        if self.prepared is None:
            self.prepared = prepare(self.target, self.c, self.x, self.metric, self.direction)
        return self.prepared

    def values(self, shard: SweepShard) -> list:
        """One shard's values ``(J, P)`` as lists: loaded from the store, else patched in the one-process batch."""
        from headwise.patching import Patch, run_batch

        store, P = self.store, self.c.shape[0]
        got = store.load(shard.index) if store is not None else None
        if got is not None and (set(got) != {"values"} or tuple(got["values"].shape) != (len(shard.jobs), P)):
            got = None  # not this run's values: computed again, never trusted
        if got is None:
            _, base, source = self.prepare()[:3]
            jobs = [[Patch(layer, head, None if t is None else (t,))] for layer, head, t in shard.jobs]
            got = {"values": run_batch(self.target, base, source, self.metric, jobs)}  # (J, P): a one-process batch
            if store is not None:
                store.save(shard.index, got)
            self.computed.append(shard.index)
        else:
            self.resumed.append(shard.index)
        return got["values"].tolist()


def _assembled(sweep: _ShardValues, chosen, shards: list[SweepShard], every: list, *, seconds: float):
    """Rank 0's :class:`~headwise.patching.Patching` of every shard's gathered values, and the chosen heads' values
    per position ``(P, K, L)`` (None without chosen heads): what one process finds."""
    import torch

    from headwise.patching import Patching

    target, c, prepared = sweep.target, sweep.c, sweep.prepare()
    P, L = c.shape
    every = [torch.tensor(v, dtype=torch.float32) for v in every]
    m_clean, m_corrupted = prepared[4]
    patched = torch.full((P, target.num_layers, target.max_heads), float("nan"))
    at = {}
    for s in shards:
        for j, (layer, head, t) in enumerate(s.jobs):
            if s.kind == "heads":
                patched[:, layer, head] = every[s.index][j]
            else:
                at[layer, head, t] = every[s.index][j]
    positions = None
    if chosen:
        positions = torch.stack(
            [torch.stack([at[layer, head, t] for t in range(L)], 1) for layer, head in chosen], 1
        )  # (P, K, L)
    head_batches = sum(1 for s in shards if s.kind == "heads")
    patching = Patching(
        method="exact",
        direction=sweep.direction,
        metric_clean=m_clean,
        metric_corrupted=m_corrupted,
        patched=patched,
        passes=2 + head_batches,
        rows=2 * P + _head_jobs(shards) * P,
        seconds=seconds,
        forward_seconds=prepared[5],
    )
    return patching, positions
