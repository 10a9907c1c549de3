"""The shards of a run across ranks: the corpus cut into the batches a one-process run reads, each shard's sums saved
atomically beside a manifest, added on each rank and reduced once over the ranks.

Shape legend: D documents (the corpus's non-empty UTF-8 lines), K shards.

How the work is cut. The corpus's D documents are cut into K shards of ``--batch-size`` consecutive documents — the
very batches a one-process run reads (:func:`plan_shards`), so a shard's sums do not depend on the number of ranks.
The shards are dealt to the ranks by token count (:func:`assign_shards`: :func:`headwise.distributed.ranks.deal`).
A shard's float64 sums are saved as it finishes — atomically, as ``OUT/shards/shard-<k>.safetensors`` beside a
``manifest.json`` naming the model's weights (SHA-256), the corpus's bytes (SHA-256) and the options that change a
number (:class:`ShardStore`). Each rank adds its shards (:func:`shard_sums`); the ranks then pass one monitored
barrier and all-reduce the sums once, as one float64 vector (:func:`reduce_sums`).

The batch size. An explicit ``--batch-size`` is kept (and refused with one line when it leaves a rank without a
shard). Without one (:attr:`~headwise.study.HeadsOptions.batch_size_auto`) the batch is
``min(--batch-size default, ⌈D / ranks⌉)``, so every rank gets a shard; it is recorded in the manifest, and a run
resumed in the same ``--out`` — with any number of ranks — takes the manifest's batch size, so the shards already
saved stay this run's (:func:`open_corpus_store`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headwise.distributed.ranks import agree, barrier, refuse_together
from headwise.study.options import HeadsOptions

__all__ = [
    "FORMAT",
    "MANIFEST",
    "Shard",
    "ShardStore",
    "ShardSums",
    "assign_shards",
    "corpus_batch_size",
    "open_corpus_store",
    "pack_state",
    "plan_shards",
    "reduce_sums",
    "shard_sums",
    "unpack_state",
    "json_sha256",
    "weights_sha256",
]

#: The shards' format; a manifest of another format is refused.
FORMAT = "headwise-corpus-shards/1"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Shard:
    """Documents ``start … stop − 1`` (indices among the corpus's documents) and their tokens (each cut to the
    model's context)."""

    index: int
    start: int
    stop: int
    tokens: int


def plan_shards(tokens: Sequence[int], batch_size: int) -> list[Shard]:
    """Cut documents whose token counts are ``tokens`` ``(D,)`` into shards of ``batch_size`` consecutive documents
    (the last one shorter): the batches of a one-process run, whatever the number of ranks."""
    from headwise import checks

    checks.positive_int("batch_size", batch_size)
    return [
        Shard(k, a, min(a + batch_size, len(tokens)), int(sum(tokens[a : a + batch_size])))
        for k, a in enumerate(range(0, len(tokens), batch_size))
    ]


def assign_shards(shards: Sequence[Shard], world_size: int) -> list[list[int]]:
    """Deal shards to ``world_size`` ranks balanced by token count (:func:`deal` of their tokens). Returns each rank's
    shard indices, ascending.

    Raises:
        ValueError: fewer shards than ranks.
    """
    if len(shards) < world_size:
        raise ValueError(f"WORLD_SIZE: {world_size} ranks for {len(shards)} shard(s); expected at most one a shard")
    from headwise.distributed.ranks import deal

    return deal([s.tokens for s in shards], world_size)


def json_sha256(value) -> str:
    """The SHA-256 of ``value`` as sorted JSON: what a manifest names of a run's inputs and options."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def weights_sha256(module) -> str:
    """SHA-256 over a module's ``state_dict``: every entry's name, dtype, shape and bytes, in name order."""
    import torch

    digest = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


class ShardStore:
    """``folder/manifest.json`` and one ``shard-<k>.safetensors`` per finished shard, each written atomically.

    Args:
        folder: the store (``OUT/shards``); manifest: what the shards were computed from (JSON-ready).
    """

    def __init__(self, folder: Path, manifest: dict):
        self.folder, self.manifest = Path(folder), manifest

    def clean(self) -> None:
        """Remove the temporary files a rank killed mid-write left in the store."""
        from headwise._io import TEMP_PREFIX, TEMP_SUFFIX

        for stale in self.folder.glob(f"{TEMP_PREFIX}shard-*{TEMP_SUFFIX}"):
            stale.unlink(missing_ok=True)

    def existing(self) -> dict | None:
        """The manifest already in the store, or None (none, unreadable, or not a manifest)."""
        try:
            old = json.loads((self.folder / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return old if isinstance(old, dict) else None

    def mismatch(self) -> str | None:
        """Why an existing manifest does not fit this run (one line), or None (none yet, or the same)."""
        path = self.folder / MANIFEST
        if not path.is_file():
            return None
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return f"--out: {path} cannot be read ({e}); delete {self.folder} to start over"
        if not isinstance(old, dict):
            return f"--out: {path} is not a manifest of shards; delete {self.folder} to start over"
        keys = sorted(k for k in set(old) | set(self.manifest) if old.get(k) != self.manifest.get(k))
        if not keys:
            return None
        diff = ", ".join(f"{k} {old.get(k)!r} there, {self.manifest.get(k)!r} now" for k in keys[:3])
        return f"--out: {self.folder} holds shards of another run ({diff}); use another --out or delete {self.folder}"

    def write_manifest(self) -> None:
        from headwise._io import write_text_atomic

        self.folder.mkdir(parents=True, exist_ok=True)
        if (self.folder / MANIFEST).is_file():
            return
        write_text_atomic(self.folder / MANIFEST, json.dumps(self.manifest, indent=1, sort_keys=True) + "\n")

    def path(self, index: int) -> Path:
        return self.folder / f"shard-{index:06d}.safetensors"

    def load(self, index: int) -> dict | None:
        """Shard ``index``'s sums, or None when it is not there (or unreadable: it is computed again)."""
        from safetensors.torch import load

        path = self.path(index)
        if not path.is_file():
            return None
        try:
            return load(path.read_bytes())
        except Exception:  # noqa: BLE001 - a damaged shard is recomputed, never trusted
            return None

    def save(self, index: int, state: dict) -> None:
        from safetensors.torch import save

        from headwise._io import atomic_write

        data = save({k: v.contiguous() for k, v in state.items()}, metadata={"shard": str(index), "format": FORMAT})
        with atomic_write(self.path(index), "wb") as fh:
            fh.write(data)


def pack_state(state: dict):
    """One float64 vector of a state's tensors in key order, and how to cut it back."""
    import torch

    keys = sorted(state)
    return torch.cat([state[k].reshape(-1).double() for k in keys]), [(k, tuple(state[k].shape)) for k in keys]


def unpack_state(vector, layout) -> dict:
    """:func:`pack_state` undone: the vector cut back into ``{key: tensor of its shape}``."""
    out, at = {}, 0
    for k, shape in layout:
        n = int(np.prod(shape)) if shape else 1
        out[k] = vector[at : at + n].reshape(shape)
        at += n
    return out


@dataclass
class ShardSums:
    """One rank's shards added (:func:`shard_sums`), then reduced over the ranks in place (:func:`reduce_sums`)."""

    vector: object  # (n,) float64 torch tensor: the packed sums
    layout: list
    computed: list[int]
    resumed: list[int]
    compute_seconds: float
    slowest_seconds: float = 0.0
    reduce_seconds: float = 0.0


def shard_sums(store: ShardStore, shards, mine, compute, expected: set, widen, progress) -> ShardSums:
    """This rank's shards ``mine`` added: each loaded from ``store`` (when it holds ``expected``'s keys), else
    ``compute(shard)`` and saved; ``widen(state)`` brings every shard to the reduced shape first."""
    started = time.perf_counter()
    total = None
    computed, resumed = [], []
    for done, k in enumerate(mine, start=1):
        state = store.load(k)
        if state is not None and set(state) != expected:  # not this run's sums: computed again, never trusted
            state = None
        if state is None:
            state = compute(shards[k])
            store.save(k, state)
            computed.append(k)
        else:
            resumed.append(k)
        state = widen(state)
        total = state if total is None else {key: total[key] + state[key] for key in total}
        if progress is not None:
            progress(done, len(mine))
    vector, layout = pack_state(total)
    return ShardSums(vector, layout, computed, resumed, time.perf_counter() - started)


def reduce_sums(sums: ShardSums, timeout_s: float) -> None:
    """The monitored barrier, then one float64 all-reduce of ``sums.vector`` (in place) and of the slowest rank's
    compute time."""
    import torch
    import torch.distributed as dist

    reached = time.perf_counter()
    barrier(timeout_s)
    dist.all_reduce(sums.vector, op=dist.ReduceOp.SUM)
    sums.reduce_seconds = time.perf_counter() - reached
    slowest = torch.tensor([sums.compute_seconds], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    sums.slowest_seconds = float(slowest)


def corpus_batch_size(options: HeadsOptions, documents: int, world_size: int, store: ShardStore) -> int:
    """The documents a shard holds on ``world_size`` ranks: an explicit ``--batch-size`` as it is; the automatic one
    (``options.batch_size_auto``) as the batch size of the shards already in ``store`` when its manifest is of the
    same model, corpus and options (a resumed run, whatever its number of ranks), else
    ``min(options.batch_size, ⌈documents / world_size⌉)`` — every rank then gets a shard."""
    if not options.batch_size_auto:
        return options.batch_size
    old = store.existing()
    if old is not None:
        same = {k: v for k, v in old.items() if k not in ("batch_size", "shards")}
        mine = {k: v for k, v in store.manifest.items() if k not in ("batch_size", "shards")}
        if same == mine and isinstance(old.get("batch_size"), int) and old["batch_size"] > 0:
            return old["batch_size"]
    return max(1, min(options.batch_size, -(-documents // world_size)))


def open_corpus_store(model, options: HeadsOptions, docs: list[str], tokens: list[int], kind: str, extra: dict):
    """The checks every rank makes before a corpus run (the same corpus and weights on every rank, at most one rank a
    document and a shard, the store's manifest), refused together; then the store (its manifest written) and the
    shards, cut at :func:`corpus_batch_size` documents (the same on every rank). Returns ``(store, shards)``."""
    import torch.distributed as dist

    from headwise.models.gguf import file_sha256

    world, corpus = dist.get_world_size(), options.corpus_path
    corpus_hash, model_hash = file_sha256(corpus), weights_sha256(model)
    agree("--corpus (SHA-256 of the file)", corpus_hash)
    agree("--model (SHA-256 of the weights)", model_hash)
    manifest = {
        "format": FORMAT,
        "kind": kind,
        "model_sha256": model_hash,
        "corpus_sha256": corpus_hash,
        "documents": len(docs),
        "batch_size": options.batch_size,
        **extra,
    }
    folder = Path(options.out) / "shards"
    batch_size = corpus_batch_size(options, len(docs), world, ShardStore(folder, manifest))
    agree("--batch-size (the shards' documents)", str(batch_size))
    problem = None
    if world > len(docs):
        problem = f"WORLD_SIZE: {world} ranks for {len(docs)} document(s) in '{corpus}'; expected at most one each"
    shards = plan_shards(tokens, batch_size)
    if problem is None and len(shards) < world:
        fit = max(1, len(docs) // world)
        problem = (
            f"--batch-size: {len(shards)} shard(s) of {batch_size} documents for {world} ranks; "
            f"expected --batch-size ≤ {fit}"
        )
        if options.batch_size_auto:  # the batch size of the shards kept in --out: resumed with too many ranks
            problem += f" (the shards in {folder} hold {batch_size}; resume them on at most {len(shards)} ranks)"
    store = ShardStore(folder, manifest | {"batch_size": batch_size, "shards": len(shards)})
    if problem is None:
        problem = store.mismatch()
    refuse_together(problem)
    store.write_manifest()
    return store, shards
