"""Michel et al.'s head importance across the ranks of a ``torchrun`` launch: ``--importance``'s batches dealt to the
ranks, each batch's sums saved as a shard, reduced once per phase, resumable batch by batch
(:func:`importance_across_ranks`).

The collectives live here so that :mod:`headwise.analysis` imports no ``torch.distributed``: the analysis hands each
batch's sums to one seam (``head_importance(reduce=)``) and each piece of work to another (``stages=``).

Shape legend: NL layers, H heads, N = NL · H, B batch, L length.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from headwise.distributed.ranks import agree, barrier, ranks, refuse_together
from headwise.study.shards import ShardStore, reduce_sums, shard_sums, unpack_state, weights_sha256

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = ["IMPORTANCE_FORMAT", "ImportanceRun", "estimate_across_ranks", "importance_across_ranks"]


#: The importance shards' format; a manifest of another format is refused.
IMPORTANCE_FORMAT = "headwise-importance-shards/1"


@dataclass
class ImportanceRun:
    """What :func:`importance_across_ranks` did on this rank.

    Attributes:
        result: the :class:`~headwise.analysis.importance.ImportanceResult` of every rank's batches (the same on
            every rank; its ``sweep`` counts this rank's passes, with ``ranks`` and ``shards`` added).
        rank, world_size: this process's place; batches: this rank's batch indices.
        computed, resumed: this rank's shards ``(phase, batch)`` computed / loaded from the store (phase 1: the
            gates' pass, the intact objective and the single-head ablations of a batch; phase 2: its pruning sets).
        payload_bytes: bytes of the two float64 vectors all-reduced (phase 1: 2 N + 3; phase 2: the distinct pruning
            sets; N = NL · H).
        seconds: this rank's time in the call (waiting included).
    """

    result: object
    rank: int
    world_size: int
    batches: list[int]
    payload_bytes: int
    seconds: float
    computed: list[tuple[int, int]] = field(default_factory=list)
    resumed: list[tuple[int, int]] = field(default_factory=list)


class _Stop(Exception):
    """Ends a :func:`~headwise.analysis.head_importance` call once the sums it was run for are taken."""


def _tensors_sha256(batches: Sequence) -> str:
    """SHA-256 over every tensor of every batch: its dtype, shape and bytes, in order."""
    import torch

    digest = hashlib.sha256()
    for batch in batches:
        for t in batch:
            t = t.detach().to("cpu").contiguous()
            digest.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def importance_across_ranks(
    hm: HeadModel,
    batches: Sequence,
    *,
    seed: int,
    scored: str | None = None,
    random_orders: int = 3,
    points: int = 33,
    mode: str = "zero",
    copies: int | None = None,
    memory: int | None = None,
    out: Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    timeout_s: float | None = None,
) -> ImportanceRun:
    """Michel et al.'s importance, each head's ablation and the pruning curves
    (:func:`headwise.analysis.head_importance`) with ``batches`` dealt across the ranks of a torchrun launch,
    resumable batch by batch.

    Call it on every rank with the same model and the same ``batches`` (the one-process run's: each rank measures
    whole batches, dealt by padded size ``B · L``, the largest first to the least loaded rank). Two phases, each cut
    into one shard a batch. Phase 1: the gates' pass, the intact objective and every single-head ablation of the
    batch, its sums (float64: importance × sequences, sequences, objective × tokens, tokens; each ablation's
    objective × tokens) saved as the shard finishes; the ranks' shards are added and all-reduced once. Phase 2:
    every rank orders the heads by the same reduced numbers and measures the pruning curves' distinct head sets on
    its batches, one shard a batch, all-reduced once. Each reduction waits at a monitored barrier first (a stalled
    rank is named: :class:`~headwise.distributed.ranks.CollectiveTimeout`). Equal to the one-process run up to the
    order of the float64 additions (each batch's sums are added, then the ranks').

    The shards are kept (each written atomically, :class:`~headwise.study.shards.ShardStore`) in
    ``OUT/importance-shards`` beside a manifest naming the weights' and the batches' SHA-256 and the options; phase 2's
    in ``OUT/importance-shards/pruning-<hash>`` whose manifest adds the SHA-256 of the head sets (the orders depend on
    phase 1's reduced numbers: other orders, another folder). A finished shard is loaded, not computed again, after
    ``torchrun --max-restarts K`` restarts a killed rank and on a second run with the same ``out`` (with any number of
    ranks: a shard is one batch); a manifest of another run is refused with one line before anything is computed.
    ``out`` None: each rank keeps its shards in a temporary folder for the call alone. The default gloo group is
    initialised from torchrun's environment when none is (and destroyed at the end).

    Args:
        hm: a :class:`~headwise.models.HeadModel`; batches: as :func:`~headwise.analysis.head_importance` (the
            objective is measured on them too).
        seed, scored, random_orders, points, mode, copies, memory, progress: as
            :func:`~headwise.analysis.head_importance` (``progress``: ``"importance"`` in this rank's batches,
            ``"ablation"`` and ``"pruning"`` in the passes of the batch at hand).
        out: where the shards are kept (see above).
        timeout_s: the collectives' timeout (see the module's text).
    Returns:
        the :class:`ImportanceRun`.
    Raises:
        ValueError: on every rank: fewer batches than ranks, ranks that opened different weights or batches, a
            manifest of another run in ``out``.
    """
    import tempfile

    started = time.perf_counter()
    options = {"scored": scored, "seed": seed, "random_orders": random_orders, "points": points, "mode": mode,
               "copies": copies, "memory": memory}  # fmt: skip
    with ranks(timeout_s) as r, contextlib.ExitStack() as stack:
        model_hash, batches_hash, problem = _agreed(r, hm, batches)
        root = Path(out) if out is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        manifest = {"format": IMPORTANCE_FORMAT, "kind": "importance", "model_sha256": model_hash,
                    "batches_sha256": batches_hash, "batches": len(batches), **options}  # fmt: skip
        first = ShardStore(root / "importance-shards", manifest)
        refuse_together(problem or first.mismatch())
        first.write_manifest()
        mine = r.share([float(b[0].numel()) for b in batches])
        calls, every = _BatchCalls(hm, batches, mine, options, progress), list(range(len(batches)))
        one = shard_sums(first, every, mine, calls.phase_one, {"phase1", "ablation"}, dict, None)
        reduce_sums(one, r.timeout_s)
        reduced = unpack_state(one.vector, one.layout)
        g1, g2 = reduced["phase1"], reduced["ablation"]
        orders = calls.pruning_sets(g1, g2)  # the pruning sets, from the reduced numbers alone
        second = ShardStore(first.folder / f"pruning-{orders[:16]}", manifest | {"orders_sha256": orders})
        second.write_manifest()
        two = shard_sums(second, every, mine, lambda k: calls.phase_two(k, first, g1, g2), {"pruning"}, dict, None)
        reduce_sums(two, r.timeout_s)
        first.clean()
        second.clean()
        g3 = unpack_state(two.vector, two.layout)["pruning"]
        result = calls.call(mine[0], _replay(g1, g2, g3), calls.skip({}))
        computed = [(1, k) for k in one.computed] + [(2, k) for k in two.computed]
        resumed = [(1, k) for k in one.resumed] + [(2, k) for k in two.resumed]
        result.sweep = {"mode": mode, "head_sets": calls.n + len(g3), "ranks": r.world_size,
                        "shards": {"computed": len(computed), "resumed": len(resumed)},
                        "seconds_total": time.perf_counter() - started}  # fmt: skip
        sent = (one.vector.numel() + two.vector.numel()) * 8
        return ImportanceRun(result, r.rank, r.world_size, mine, sent, time.perf_counter() - started, computed, resumed)


def _agreed(r, hm: HeadModel, batches: Sequence) -> tuple[str, str, str | None]:
    """Every rank's weights and batches checked equal (their SHA-256 agreed, else ValueError on every rank);
    ``(weights' SHA-256, batches' SHA-256, a problem to refuse together or None)`` — fewer batches than ranks."""
    model_hash, batches_hash = weights_sha256(hm.model), _tensors_sha256(batches)
    agree("--model (SHA-256 of the weights)", model_hash)
    agree("--importance-sentences / --batch-size (SHA-256 of the batches)", batches_hash)
    problem = None
    if len(batches) < r.world_size:
        problem = (
            f"--importance-sentences / --batch-size: {len(batches)} batch(es) for {r.world_size} ranks; expected at "
            "least one a rank (a smaller --batch-size)"
        )
    return model_hash, batches_hash, problem


def _replay(*vectors):
    """A ``reduce`` that hands back ``vectors`` (the reduced sums, or functions of this call's sums) in turn; past
    them it stops the call (:class:`_Stop`)."""
    given = iter(vectors)

    def reduce(values):
        got = next(given, None)
        if got is None:
            raise _Stop
        return got(values) if callable(got) else got.numpy().copy()

    return reduce


class _BatchCalls:
    """:func:`~headwise.analysis.head_importance` on one batch at a time, its sums taken at the ``reduce=`` seam and
    its work skipped or run at the ``stages=`` seam: phase 1's sums, the pruning sets, phase 2's sums."""

    def __init__(self, hm: HeadModel, batches: Sequence, mine: list[int], options: dict, progress):
        self.hm, self.batches, self.mine, self.options, self.progress = hm, batches, mine, options, progress
        self.nl, self.h = hm.num_layers, hm.num_heads
        self.n = self.nl * self.h

    def shown(self, k: int):
        """``progress`` of batch ``k``'s call: the gates' pass counted in this rank's batches, the passes of the
        ablations and the pruning sets in the batch's own."""
        progress, mine = self.progress, self.mine
        if progress is None:
            return None

        def report(stage: str, done: int, total: int) -> None:
            if stage != "importance":
                progress(stage, done, total)
            elif done == total:
                progress(stage, mine.index(k) + 1, len(mine))

        return report

    def call(self, k: int, reduce, stages=None):
        """head_importance on batch ``k`` alone, until ``reduce`` or ``stages`` stops it (:class:`_Stop`)."""
        from headwise.analysis import head_importance

        try:
            return head_importance(self.hm, [self.batches[k]], progress=self.shown(k), reduce=reduce, stages=stages,
                                   **self.options)  # fmt: skip
        except _Stop:
            return None

    def skip(self, given: dict):
        """``stages`` that compute only the stages named in ``given`` as None, else return ``given[name]``."""

        def stages(name, work, sets):
            value = given.get(name, 0.0)
            if value is None:
                return work()
            if name == "importance":
                return np.zeros((self.nl, self.h)), 0, 0.0, 1  # replaced by the reduced sums (tokens 1: values as sums)
            return np.full(len(sets), value)

        return stages

    def phase_one(self, k: int) -> dict:
        """Batch ``k``'s phase-1 sums: the gates' pass and the intact objective, then the single-head ablations."""
        import torch

        taken: list = []

        def take(values):
            taken.append(torch.from_numpy(np.array(values, dtype=np.float64)))
            if len(taken) == 2:  # the single-head ablations taken: the pruning sets are phase 2's
                raise _Stop
            return values

        self.call(k, _replay(take, take))
        return {"phase1": taken[0], "ablation": taken[1]}

    def pruning_sets(self, g1, g2) -> str:
        """The pruning curves' head sets that phase 1's reduced sums ``g1``, ``g2`` order: their SHA-256 (the name of
        phase 2's store)."""
        found: list = []

        def find_sets(name, work, sets):
            if name == "pruning":
                found.append(sets)
                raise _Stop
            return self.skip({})(name, work, sets)

        self.call(self.mine[0], _replay(g1, g2), find_sets)
        return hashlib.sha256(json.dumps([list(s) for s in found[0]]).encode()).hexdigest()

    def phase_two(self, k: int, first: ShardStore, g1, g2) -> dict:
        """Batch ``k``'s phase-2 sums: the pruning sets' objectives × its tokens (saved by phase 1 in ``first``)."""
        import torch

        tokens = float(first.load(k)["phase1"][self.n + 2])
        taken: list = []

        def take(values):
            taken.append(torch.from_numpy(np.array(values, dtype=np.float64) * tokens))
            raise _Stop

        self.call(k, _replay(g1, g2, take), self.skip({"pruning": None}))
        return {"pruning": taken[0]}


def estimate_across_ranks(
    hm: HeadModel,
    batches: Sequence,
    *,
    timeout_s: float | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    **options,
) -> ImportanceRun:
    """``--importance``'s default route (:func:`~headwise.study.estimate_importance`) with ``batches`` dealt across
    the ranks of a torchrun launch: each rank estimates and measures its own batches (whole batches, dealt by padded
    size ``B · L``), and the float64 sums go through one all-reduce at each of the route's reductions (the estimate
    with Michel et al.'s importance and the intact objective; the first round's heads with the pruning sets; each
    later round of the exact heads' search), each after a monitored barrier. Every rank then picks the same heads and
    orders from the same reduced numbers; the
    result equals the one-process run's up to the order of the float64 additions. Not resumable (the route's passes
    are minutes).

    Args:
        hm, batches: as :func:`~headwise.study.estimate_importance`, the same on every rank.
        timeout_s: the collectives' timeout; progress: this rank's ``(stage, done, total)``.
        options: :func:`~headwise.study.estimate_importance`'s (``seed``, ``mode``, ``top_k``, …).
    Returns:
        the :class:`ImportanceRun` (``computed``, ``resumed``: empty).
    Raises:
        ValueError: on every rank: fewer batches than ranks, ranks that opened different weights or batches.
    """
    import torch
    import torch.distributed as dist

    from headwise.study.importance_estimate import estimate_importance

    started = time.perf_counter()
    with ranks(timeout_s) as r:
        refuse_together(_agreed(r, hm, batches)[2])
        mine = r.share([float(b[0].numel()) for b in batches])
        sent = [0]

        def reduce(values: np.ndarray) -> np.ndarray:
            t = torch.from_numpy(np.array(values, dtype=np.float64))
            barrier(r.timeout_s)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            sent[0] += t.numel() * 8
            return t.numpy()

        result = estimate_importance(hm, [batches[k] for k in mine], progress=progress, reduce=reduce, **options)
        result.sweep |= {"ranks": r.world_size}
        return ImportanceRun(result, r.rank, r.world_size, mine, sent[0], time.perf_counter() - started)
