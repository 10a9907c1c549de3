"""Circuit finding on ``torch.distributed``: the prompt pairs split across ranks, every per-pair value gathered
before a mean, rank 0 holding what one process finds.

``torchrun --nproc-per-node P -m headwise circuit …`` runs :func:`circuit_across_ranks` on every rank (the command
line detects torchrun's ``RANK`` / ``WORLD_SIZE``); a library caller calls it on every rank of its own launch.
The group, the timeout (``timeout_s=``, else ``$HEADWISE_DIST_TIMEOUT``, else
:data:`~headwise.distributed.ranks.DEFAULT_TIMEOUT_S`) and the refusals work as in :func:`headwise.study.corpus_heads`.

Shape legend: P prompt pairs, L length, J exact patches, E edges.

**Circuits** (:func:`circuit_across_ranks`): the prompt pairs are split (:func:`~headwise.distributed.ranks.deal`
by tokens: the pairs share one length, so by count), and every rank runs :func:`headwise.circuits.find_circuit` on
all the pairs with its share named (:class:`headwise.circuits.PairShard`): the per-pair values — EAP / EAP-IG
scores ``(P, E)``, the exact patches of the top edges, the faithfulness curve's metrics, each bisection step's —
are all-gathered (float32, exact) before any mean, so every rank chooses the same top edges and the same circuit,
and rank 0 returns the one-process :class:`~headwise.circuits.Circuit`. Resumable by stage: each stage starts from
the previous one's reduced result (the top edges from the scores, the curve's order from the scores, the bisection
from the curve), so what is kept is a stage's gathered result (:data:`CIRCUIT_STAGES`: every pair's scores
``(P, E)``, every pair's exact patches ``(P, J)``, the faithfulness curve, the circuit's size), saved by rank 0 as it
finishes (``OUT/stages/shard-<stage>.safetensors`` beside a manifest naming the weights' SHA-256 and the inputs' and
options'), through :func:`~headwise.circuits.find_circuit`'s ``stages`` seam; a restarted or repeated run loads the
stages every rank can read and computes the rest; a manifest of another run is refused with one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.study.shards import json_sha256

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = ["CIRCUIT_STAGES", "CircuitRun", "circuit_across_ranks"]


@dataclass
class CircuitRun:
    """What :func:`circuit_across_ranks` did on this rank.

    Attributes:
        circuit: rank 0: the :class:`~headwise.circuits.Circuit` (equal to the one-process run's); others: None.
        rank, world_size: this process's place. pairs: this rank's pair indices.
        gathers: the all-gathers run; payload_bytes: bytes every rank received in them (padded rows × ranks).
        seconds: this rank's wall time in :func:`~headwise.circuits.find_circuit`.
        computed, resumed: the stages (:data:`CIRCUIT_STAGES`) run / loaded from ``OUT/stages``.
    """

    circuit: object
    rank: int
    world_size: int
    pairs: list[int]
    gathers: int
    payload_bytes: int
    seconds: float = 0.0
    computed: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)


class _RowGather:
    """``PairShard.gather`` on the default group: each rank's rows ``(P_r, …)`` all-gathered (padded to the most
    rows a rank has) and put in pair order, after a barrier that names a rank that does not arrive within
    ``timeout_s``. Counts the gathers and the bytes each rank receives."""

    def __init__(self, shares: list[list[int]], P: int, timeout_s: float):
        self.shares, self.P, self.timeout_s = shares, P, timeout_s
        self.most = max(len(s) for s in shares)
        self.gathers = self.bytes = 0

    def __call__(self, local):
        import torch
        import torch.distributed as dist

        from headwise.distributed.ranks import barrier

        rank = dist.get_rank()
        if local.shape[0] != len(self.shares[rank]):
            raise RuntimeError(f"gather: rank {rank} holds {local.shape[0]} rows for {len(self.shares[rank])} pairs")
        local = local.detach().to("cpu").contiguous()
        row = torch.zeros((self.most, *local.shape[1:]), dtype=local.dtype)
        row[: local.shape[0]] = local
        rows = [torch.empty_like(row) for _ in self.shares]
        barrier(self.timeout_s)
        dist.all_gather(rows, row)
        self.gathers += 1
        self.bytes += row.numel() * row.element_size() * len(self.shares)
        out = torch.empty((self.P, *local.shape[1:]), dtype=local.dtype)
        for share, got in zip(self.shares, rows):
            out[share] = got[: len(share)]
        return out


#: The circuit stages' format; a manifest of another format is refused.
CIRCUIT_FORMAT = "headwise-circuit-stages/1"
#: The stages of :func:`headwise.circuits.find_circuit`, in order (the store's index of each).
CIRCUIT_STAGES = ("attribution", "exact", "faithfulness", "circuit", "mib")


def _pack_stage(name: str, value) -> dict:
    """A stage's value (every pair's, the same on every rank) as tensors (exact: the same dtypes, floats as float64)."""
    import torch

    if name in ("attribution", "exact"):
        return {"values": value}
    if name == "circuit":
        n, recovered = value
        return {"n": torch.tensor(int(n)), "recovered": torch.tensor(float(recovered), dtype=torch.float64)}
    kept = {} if value.kept is None else {"kept": torch.tensor(list(value.kept), dtype=torch.int64)}
    return {
        **kept,
        "order": torch.tensor(list(value.order), dtype=torch.int64),
        "sizes": torch.tensor(list(value.sizes), dtype=torch.int64),
        "metric": value.metric,
        "recovered": value.recovered,
        "scalars": torch.tensor(
            [value.clean_metric, value.corrupted_metric, value.ablated_metric, value.passes], dtype=torch.float64
        ),
    }


def _unpack_stage(name: str, state: dict, ablation: str):
    """:func:`_pack_stage` undone, or None where ``state`` is not a stage ``name`` of this run (computed again)."""
    from headwise.circuits import Faithfulness

    keys = {"attribution": {"values"}, "exact": {"values"}, "circuit": {"n", "recovered"}}
    curve = {"order", "sizes", "metric", "recovered", "scalars"}
    if set(state) != keys.get(name, curve) and set(state) != keys.get(name, curve | {"kept"}):
        return None
    if name in ("attribution", "exact"):
        return state["values"]
    if name == "circuit":
        return int(state["n"]), float(state["recovered"])
    clean, corrupted, ablated, passes = state["scalars"].tolist()
    return Faithfulness(
        ablation=ablation, order=state["order"].tolist(), sizes=state["sizes"].tolist(), metric=state["metric"],
        clean_metric=clean, corrupted_metric=corrupted, ablated_metric=ablated, recovered=state["recovered"],
        passes=int(passes), kept=state["kept"].tolist() if "kept" in state else None,
    )  # fmt: skip


class _Stages:
    """``find_circuit``'s ``stages``: a stage kept in the store (readable on every rank: the ranks decide together)
    is loaded; else computed, and rank 0 saves it (every rank holds the same gathered value)."""

    def __init__(self, store, ablation: str, progress):
        self.store, self.ablation, self.progress = store, ablation, progress
        self.computed: list[str] = []
        self.resumed: list[str] = []

    def __call__(self, name: str, work):
        import torch.distributed as dist

        from headwise.distributed.ranks import all_gather_json

        k = CIRCUIT_STAGES.index(name)
        state = self.store.load(k) if self.store is not None else None
        value = None if state is None else _unpack_stage(name, state, self.ablation)
        if all(all_gather_json(value is not None)):
            self.resumed.append(name)
        else:
            value = work()
            if self.store is not None and dist.get_rank() == 0:
                self.store.save(k, _pack_stage(name, value))
            self.computed.append(name)
        if self.progress is not None:
            self.progress(name)
        return value


def circuit_across_ranks(
    hm: HeadModel,
    clean,
    corrupted,
    *,
    answer,
    wrong,
    out: Path | None = None,
    stage_done: Callable[[str], None] | None = None,
    timeout_s: float | None = None,
    **options,
) -> CircuitRun:
    """:func:`headwise.circuits.find_circuit` with the prompt pairs split across the ranks of a torchrun launch (see
    the module's text). Call it on every rank with the same model, pairs and options.

    Args:
        hm: the decoder; clean, corrupted: token ids ``(P, L)`` (every rank all P pairs); answer, wrong: P ids (or
            one for every pair); options: :func:`~headwise.circuits.find_circuit`'s other keywords (``progress``
            included); out: where the stages are kept (``OUT/stages``; None: not kept); stage_done: ``fn(stage)``
            after each stage, computed or loaded; timeout_s: the collectives' timeout.
    Returns:
        the :class:`CircuitRun` (its ``circuit`` on rank 0).
    Raises:
        ValueError: on every rank — more ranks than pairs, ranks with different weights or pairs, an unreachable
            rendezvous, a manifest of another run in ``out``; what :func:`~headwise.circuits.find_circuit` refuses.
            CollectiveTimeout: a stalled rank.
    """
    import torch

    from headwise.circuits import PairShard, find_circuit
    from headwise.distributed.ranks import agree, deal, rank_group, refuse_together
    from headwise.study.shards import ShardStore, weights_sha256

    for name in ("pairs", "stages"):
        if name in options:
            raise TypeError(f"circuit_across_ranks: '{name}' is chosen here; do not pass it")
    c = clean if isinstance(clean, torch.Tensor) else torch.tensor(clean)
    x = corrupted if isinstance(corrupted, torch.Tensor) else torch.tensor(corrupted)
    c, x = (c[None] if c.dim() == 1 else c), (x[None] if x.dim() == 1 else x)
    with rank_group(timeout_s) as (rank, world, timeout_s):
        agree("--model (SHA-256 of the weights)", weights_sha256(hm.model))
        inputs = {"clean": c.tolist(), "corrupted": x.tolist(), "answer": _listed(answer), "wrong": _listed(wrong)}
        inputs["options"] = {k: v for k, v in sorted(options.items()) if k != "progress"}
        inputs_hash = json_sha256(inputs)
        agree("--clean / --corrupted / --answer / --wrong / options (SHA-256)", inputs_hash)
        P = c.shape[0]
        problem = None
        if world > P:
            problem = f"WORLD_SIZE: {world} ranks for {P} prompt pair(s); expected at most one rank a pair"
        store = None
        if out is not None:
            manifest = {"format": CIRCUIT_FORMAT, "kind": "circuit", "model_sha256": weights_sha256(hm.model),
                        "inputs_sha256": inputs_hash, "stages": list(CIRCUIT_STAGES)}  # fmt: skip
            store = ShardStore(Path(out) / "stages", manifest)
            if problem is None:
                problem = store.mismatch()
        refuse_together(problem)
        if store is not None and rank == 0:
            store.write_manifest()
        shares = deal([c.shape[1]] * P, world)  # by tokens: one length for every pair
        gather = _RowGather(shares, P, timeout_s)
        stages = _Stages(store, options.get("ablation", "corrupted"), stage_done)
        started = time.perf_counter()
        found = find_circuit(
            hm, c, x, answer=answer, wrong=wrong, pairs=PairShard(tuple(shares[rank]), gather, rank == 0),
            stages=stages, **options,
        )  # fmt: skip
        seconds = time.perf_counter() - started
        found = found if rank == 0 else None
        if store is not None and rank == 0:  # the one writer: its temporary files are its own
            store.clean()
        return CircuitRun(
            found, rank, world, shares[rank], gather.gathers, gather.bytes, seconds, stages.computed, stages.resumed
        )


def _listed(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else value
