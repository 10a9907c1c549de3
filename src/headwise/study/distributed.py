"""A decoder's corpus statistics on ``torch.distributed``: documents split across ranks, sums reduced once, resumable.

``torchrun --nproc-per-node P [--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT] -m headwise heads --model M
--corpus FILE --out DIR`` runs :func:`corpus_heads` on every rank (the command line detects torchrun's ``RANK`` /
``WORLD_SIZE``); a library caller calls it on every rank of its own launch.

Shape legend: NL layers, H heads, N = NL · H, D documents (the corpus's non-empty UTF-8 lines), K shards.

How the work is cut. The corpus's D documents are cut into K shards of ``--batch-size`` consecutive documents — the
very batches a one-process run reads (:func:`plan_shards`), so a shard's sums do not depend on the number of ranks.
The shards are dealt to the ranks by token count, the longest first to the least loaded rank (:func:`assign_shards`:
the greedy "longest processing time" rule, within 4/3 of the best balance). Each rank streams its shards through the
one streaming pass (:func:`headwise.analysis.streaming.read_rows`) into a fresh
:class:`~headwise.analysis.DecoderStats` per shard, whose running sums (:meth:`~headwise.analysis.DecoderStats.state`:
float64 tensors) are saved as the shard finishes — atomically, as ``OUT/shards/shard-<k>.safetensors`` beside a
``manifest.json`` naming the model's weights (SHA-256), the corpus's bytes (SHA-256) and the options that change a
number. The ranks then pass one barrier that names a rank that never arrives (``monitored_barrier``) and all-reduce
their summed shards once, as one float64 vector; rank 0 adds the probe's detectors and the example and returns the
report. Every statistic equals the one-process run's up to the order of the float64 additions (tested to 1e-9): the
Jensen–Shannon rows sampled in a sentence depend on that sentence alone (:func:`headwise.analysis.js_sample_rows`),
so the ranks' union is the one-process sample.

Resuming. A shard whose file is in ``OUT/shards`` is loaded instead of computed, whichever rank computed it: after
``torchrun --max-restarts K`` restarts the ranks of a killed one, and on a second run with the same ``--out`` and
options — with any number of ranks, since the shards do not depend on it. A manifest written for another model,
corpus or options is refused with one line (ValueError), before anything is computed or written.

Bad input, refused on every rank together with one line (ValueError): more ranks than documents, fewer shards than
ranks (naming ``--batch-size``), ranks that opened different weights or corpora (their hashes all-gathered), a
rendezvous that cannot be reached within the timeout. A rank that stalls is named by the barrier after the timeout
(:class:`CollectiveTimeout`). The timeout: ``timeout_s=``, else ``$HEADWISE_DIST_TIMEOUT`` seconds, else
:data:`DEFAULT_TIMEOUT_S` (it must cover the ranks' finishing-time spread; balanced shards keep that small).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from headwise.study.options import HeadsOptions

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "FORMAT",
    "IMPORTANCE_FORMAT",
    "CollectiveTimeout",
    "CorpusRun",
    "ImportanceRun",
    "Launch",
    "Shard",
    "ShardStore",
    "agree",
    "all_gather_json",
    "assign_shards",
    "barrier",
    "corpus_heads",
    "deal",
    "encoder_corpus",
    "importance_across_ranks",
    "init_group",
    "launched",
    "plan_shards",
    "rank_group",
    "refuse_together",
    "weights_sha256",
]

#: Seconds a collective (the rendezvous, the barrier before the reduction) waits by default: the spread between the
#: first and the last rank to finish its shards must stay below it.
DEFAULT_TIMEOUT_S = 1800.0
#: The shards' format; a manifest of another format is refused.
FORMAT = "headwise-corpus-shards/1"
MANIFEST = "manifest.json"
_TEXT_BYTES = 512  # bytes of one rank's line in an all-gather of texts (hashes, refusals)


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within the timeout; the message names the ranks that did not arrive."""


@dataclass(frozen=True)
class Launch:
    """Where this process stands in a torchrun launch (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``)."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_env(cls) -> Launch | None:
        """torchrun's environment, or None outside a launch (no ``RANK`` / ``WORLD_SIZE``).

        Raises:
            ValueError: a variable that is not an integer, or a rank outside ``0 … WORLD_SIZE − 1``.
        """
        if not launched():
            return None
        try:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            local = int(os.environ.get("LOCAL_RANK", rank))
        except ValueError:
            raise ValueError(
                "RANK / WORLD_SIZE / LOCAL_RANK: expected integers (torchrun's environment), got "
                f"{os.environ.get('RANK')!r} / {os.environ.get('WORLD_SIZE')!r} / {os.environ.get('LOCAL_RANK')!r}"
            ) from None
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"RANK: expected 0 … WORLD_SIZE − 1 = {world - 1}, got {rank}")
        return cls(rank, world, local)


def launched() -> bool:
    """Whether this process was started by torchrun (or a launcher that sets its ``RANK`` and ``WORLD_SIZE``)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


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
    return deal([s.tokens for s in shards], world_size)


def deal(costs: Sequence[float], world_size: int) -> list[list[int]]:
    """Deal jobs of ``costs`` to ``world_size`` ranks: the costliest first, each to the rank with the least cost so far
    (ties: fewer jobs, then the lower rank) — the greedy "longest processing time" rule, within 4/3 of the best
    balance. Returns each rank's job indices, ascending (a rank may get none when there are fewer jobs)."""
    from headwise import checks

    checks.positive_int("world_size", world_size)
    load = [0.0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], len(out[r]), r))
        load[r] += costs[i]
        out[r].append(i)
    return [sorted(x) for x in out]


def all_gather_json(value) -> list:
    """Every rank's ``value`` (anything :mod:`json` writes: NaN included, floats exact), in rank order, through the
    default group (two all-gathers: the lengths, then the bytes padded to the longest)."""
    import torch
    import torch.distributed as dist

    raw = json.dumps(value).encode()
    world = dist.get_world_size()
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(raw)], dtype=torch.int64))
    longest = max(int(n) for n in lengths)
    row = torch.zeros(longest, dtype=torch.uint8)
    if raw:
        row[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    rows = [torch.zeros_like(row) for _ in range(world)]
    dist.all_gather(rows, row)
    return [json.loads(bytes(r[: int(n)].tolist())) for r, n in zip(rows, lengths)]


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


@dataclass
class CorpusRun:
    """What :func:`corpus_heads` did on this rank.

    Attributes:
        heads: rank 0: the :class:`~headwise.study.DecoderHeads` (report and example; :func:`encoder_corpus`: the
            :class:`~headwise.analysis.HeadReport`); other ranks: None.
        rank, world_size: this process's place.
        shards: this rank's shard indices; computed / resumed: those it computed / loaded from the store.
        documents: the corpus's D documents; truncated: those cut to the context (every rank's).
        payload_bytes: bytes of the one all-reduced vector (each rank sends about 2 (P − 1) / P of it, ring).
        compute_seconds: this rank's time on its shards (loading the resumed ones included); slowest_seconds: the
            slowest rank's; reduce_seconds: this rank's time in the barrier and the all-reduce (waiting included).
    """

    heads: object
    rank: int
    world_size: int
    shards: list[int]
    computed: list[int]
    resumed: list[int]
    documents: int
    truncated: int
    payload_bytes: int
    compute_seconds: float = 0.0
    slowest_seconds: float = 0.0
    reduce_seconds: float = 0.0


def _timeout(timeout_s: float | None) -> float:
    if timeout_s is None:
        timeout_s = float(os.environ.get("HEADWISE_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s}")
    return timeout_s


def _init(launch: Launch, timeout_s: float) -> None:
    """The default gloo group from torchrun's environment; an unreachable rendezvous → ValueError (one line).

    The group's keys live under ``headwise/attempt-<TORCHELASTIC_RESTART_COUNT>`` of the launch's store
    (:func:`headwise.distributed.attempt_store`: restarts of a static rendezvous do not read a dead attempt's
    addresses).
    """
    import torch.distributed as dist

    from headwise.distributed import attempt_store

    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise ValueError(f"{' / '.join(missing)}: not set; launch with torchrun (it sets the rendezvous address)")
    host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"MASTER_PORT: expected a port number 1 … 65535, got {port!r}")
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        with _quiet_fd2():  # c10d logs each failed connection with a C++ stack to fd 2; the one line below says it
            rank, world = launch.rank, launch.world_size
            store = attempt_store(host, int(port), rank, world, timeout)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - DistStoreError, RuntimeError, TimeoutError: the rendezvous failed
        reason = " ".join(str(e).split())[:200]
        raise ValueError(
            f"MASTER_ADDR:MASTER_PORT: rank {launch.rank} of {launch.world_size} could not meet the others at "
            f"{host}:{port} within {timeout_s:g} s ({type(e).__name__}: {reason})"
        ) from None


def init_group(timeout_s: float | None = None) -> Launch:
    """Initialise the default gloo group from torchrun's environment (as :func:`corpus_heads` does for itself), for
    the other runs that share the launcher (the lab's ``workers="ranks"``, :func:`headwise.lab.induction.
    run_induction_seeds`). Returns this process's :class:`Launch`.

    Raises:
        ValueError: not launched (no ``RANK`` / ``WORLD_SIZE``), or the rendezvous cannot be reached (one line).
    """
    launch = Launch.from_env()
    if launch is None:
        raise ValueError("RANK / WORLD_SIZE: not set; launch with torchrun")
    _init(launch, _timeout(timeout_s))
    return launch


@contextlib.contextmanager
def _quiet_fd2():
    """File descriptor 2 (where C++ code logs) sent to /dev/null for the block (``sys.stderr`` flushed first)."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _gather_texts(text: str) -> list[str]:
    """Every rank's ``text`` (UTF-8, at most :data:`_TEXT_BYTES` bytes), in rank order."""
    import torch
    import torch.distributed as dist

    raw = text.encode()[:_TEXT_BYTES]
    row = torch.zeros(_TEXT_BYTES + 2, dtype=torch.uint8)
    row[:2] = torch.tensor([len(raw) // 256, len(raw) % 256], dtype=torch.uint8)
    row[2 : 2 + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else row[2:2]
    rows = [torch.zeros_like(row) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, row)
    out = []
    for r in rows:
        n = int(r[0]) * 256 + int(r[1])
        out.append(bytes(r[2 : 2 + n].tolist()).decode(errors="replace"))
    return out


def agree(what: str, value: str) -> None:
    """ValueError on every rank unless every rank holds the same ``value`` (naming each rank's)."""
    values = _gather_texts(value)
    if len(set(values)) > 1:
        shown = "; ".join(f"rank {r}: {v[:12]}" for r, v in enumerate(values))
        raise ValueError(f"{what}: the ranks differ ({shown}); every rank must read the same")


def refuse_together(problem: str | None) -> None:
    """Raise the first rank's refusal on every rank (so no rank waits alone in the next collective)."""
    problems = _gather_texts(problem or "")
    for r, p in enumerate(problems):
        if p:
            raise ValueError(p if p == (problem or "") else f"rank {r}: {p}")


@contextlib.contextmanager
def rank_group(timeout_s: float | None = None):
    """For every run on the launcher (corpus, encoder, importance, :mod:`headwise.study.dist_sweeps`): the default
    gloo group initialised from torchrun's environment unless one is (then used as it is, and kept), destroyed at the
    end.
    Yields ``(rank, world size, timeout in seconds)`` (the timeout resolved as :func:`corpus_heads` does).

    Raises:
        ValueError: not launched and no group, a bad timeout, an unreachable rendezvous (one line).
    """
    import torch.distributed as dist

    timeout_s = _timeout(timeout_s)
    own = not dist.is_initialized()
    if own:
        launch = Launch.from_env()
        if launch is None:
            raise ValueError("RANK / WORLD_SIZE: not set; launch with torchrun (or initialise a process group)")
        _init(launch, timeout_s)
    try:
        yield dist.get_rank(), dist.get_world_size(), timeout_s
    finally:
        if own and dist.is_initialized():
            dist.destroy_process_group()


def barrier(timeout_s: float) -> None:
    """Every rank arrives, or :class:`CollectiveTimeout` naming the ones that did not (gloo's monitored barrier)."""
    import torch.distributed as dist

    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
    except RuntimeError as e:
        text = " ".join(str(e).split())
        first = text.split(" Original exception")[0][:300]
        raise CollectiveTimeout(
            f"rank {dist.get_rank()}: the barrier before the reduction failed after at most {timeout_s:g} s: {first}"
        ) from None


def _widen(state: dict, max_length: int) -> dict:
    """``state`` with its argmax-offset histograms (keys ending in ``hist``, ``(N, 2m − 1)``: offsets −(m − 1) …
    m − 1) zero-padded to ``max_length`` (``(N, 2·max_length − 1)``), the offsets kept in place."""
    import torch

    out = dict(state)
    for key, h in state.items():
        if key.endswith("hist"):
            pad = max_length - (h.shape[-1] + 1) // 2
            if pad < 0:
                raise ValueError(f"state: '{key}' is wider ({h.shape[-1]}) than max_length={max_length} allows")
            out[key] = torch.nn.functional.pad(h, (pad, pad)) if pad else h
    return out


def _pack(state: dict):
    """One float64 vector of a state's tensors in key order, and how to cut it back."""
    import torch

    keys = sorted(state)
    return torch.cat([state[k].reshape(-1).double() for k in keys]), [(k, tuple(state[k].shape)) for k in keys]


def _unpack(vector, layout) -> dict:
    out, at = {}, 0
    for k, shape in layout:
        n = int(np.prod(shape)) if shape else 1
        out[k] = vector[at : at + n].reshape(shape)
        at += n
    return out


@dataclass
class _Sums:
    """One rank's shards added (:func:`_shard_sums`), then reduced over the ranks in place (:func:`_reduce_sums`)."""

    vector: object  # (n,) float64 torch tensor: the packed sums
    layout: list
    computed: list[int]
    resumed: list[int]
    compute_seconds: float
    slowest_seconds: float = 0.0
    reduce_seconds: float = 0.0


def _shard_sums(store: ShardStore, shards, mine, compute, expected: set, widen, progress) -> _Sums:
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
    vector, layout = _pack(total)
    return _Sums(vector, layout, computed, resumed, time.perf_counter() - started)


def _reduce_sums(sums: _Sums, timeout_s: float) -> None:
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


def _open_store(model, options: HeadsOptions, docs: list[str], tokens: list[int], kind: str, extra: dict):
    """The checks every rank makes before a corpus run (the same corpus and weights on every rank, at most one rank a
    document and a shard, the store's manifest), refused together; then the store (its manifest written) and the
    shards. Returns ``(store, shards)``."""
    import torch.distributed as dist

    from headwise.models.gguf import file_sha256

    world, corpus = dist.get_world_size(), options.corpus_path
    corpus_hash, model_hash = file_sha256(corpus), weights_sha256(model)
    agree("--corpus (SHA-256 of the file)", corpus_hash)
    agree("--model (SHA-256 of the weights)", model_hash)
    problem = None
    if world > len(docs):
        problem = f"WORLD_SIZE: {world} ranks for {len(docs)} document(s) in '{corpus}'; expected at most one each"
    shards = plan_shards(tokens, options.batch_size)
    if problem is None and len(shards) < world:
        fit = max(1, len(docs) // world)
        problem = (
            f"--batch-size: {len(shards)} shard(s) of {options.batch_size} documents for {world} ranks; "
            f"expected --batch-size ≤ {fit}"
        )
    manifest = {
        "format": FORMAT,
        "kind": kind,
        "model_sha256": model_hash,
        "corpus_sha256": corpus_hash,
        "documents": len(docs),
        "batch_size": options.batch_size,
        **extra,
        "shards": len(shards),
    }
    store = ShardStore(Path(options.out) / "shards", manifest)
    if problem is None:
        problem = store.mismatch()
    refuse_together(problem)
    store.write_manifest()
    return store, shards


def corpus_heads(
    hm,
    options: HeadsOptions,
    plan,
    *,
    warn: Callable[[str], None],
    progress: Callable[[int, int], None] | None = None,
    timeout_s: float | None = None,
) -> CorpusRun:
    """A decoder's statistics over ``options.corpus`` on every rank of a torchrun launch (see the module's text).

    Call it on every rank, with the same model, options and corpus. The default gloo group is initialised from
    torchrun's environment when none is (and destroyed at the end); an initialised group is used as it is.

    Args:
        hm: the decoder (:class:`~headwise.models.HeadModel`); options: with ``corpus`` set (``out``: where the shards
            are kept, ``OUT/shards``); plan: :func:`~headwise.study.plan_decoder`'s.
        warn: one line per warning (rank 0 only: documents cut to the context, over all ranks).
        progress: ``(shards done, shards of this rank)`` after every shard.
        timeout_s: the collectives' timeout (see the module's text).
    Returns:
        the :class:`CorpusRun` (its ``heads`` on rank 0).
    Raises:
        ValueError: on every rank, naming what is wrong (see the module's text). CollectiveTimeout: a stalled rank.
    """
    import torch

    from headwise.analysis import CorpusFile, DecoderStats
    from headwise.analysis.streaming import read_rows
    from headwise.models import TruncationWarning
    from headwise.study.decoder import DecoderHeads, example_view, probe_detectors
    from headwise.study.inputs import text_batches

    if options.corpus is None:
        raise ValueError("--corpus: expected a corpus file (a distributed run splits its documents)")
    if hm.kind != "decoder":
        raise ValueError(f"--model: a distributed corpus run reads a decoder's heads, got a {hm.kind}")
    timeout_s = _timeout(timeout_s)
    with rank_group(timeout_s) as (rank, world, timeout_s):
        corpus = options.corpus_path
        docs = list(CorpusFile(corpus))
        tokens = [min(len(e.ids), hm.max_length) for e in hm.tokenizer.encode_batch(docs)] if docs else []
        extra = {"block_size": options.block_size, "max_length": hm.max_length}
        store, shards = _open_store(hm.model, options, docs, tokens, "decoder-heads", extra)
        mine = assign_shards(shards, world)[rank]
        longest = max(tokens) if tokens else 1  # the histogram's width all-reduced: ±(longest − 1)
        expected = set(DecoderStats(hm.num_layers, hm.num_heads, max_length=1).state()) | {"truncated"}

        def compute(s: Shard) -> dict:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TruncationWarning)  # counted, reported once by rank 0
                enc = hm.encode(docs[s.start : s.stop])  # the batch a one-process run reads
            # the offset histogram as wide as the shard's longest document (widened when the shards are added)
            stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=enc.ids.shape[1])
            read_rows(
                hm, enc.ids, enc.mask, head_stats=stats.heads, detector_stats=stats.detectors,
                block_size=options.block_size,
            )  # fmt: skip
            state = stats.state()
            state["truncated"] = torch.tensor(float(sum(enc.truncated)), dtype=torch.float64)
            return state

        sums = _shard_sums(store, shards, mine, compute, expected, lambda st: _widen(st, longest), progress)
        vector, layout = sums.vector, sums.layout
        _reduce_sums(sums, timeout_s)
        store.clean()
        summed = _unpack(vector, layout)
        truncated = int(round(float(summed.pop("truncated"))))
        heads = None
        if rank == 0:
            stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
            stats.add_state(_widen(summed, hm.max_length))
            if truncated:
                warn(f"TEXT / --corpus: {truncated} text(s) longer than {hm.max_length} tokens were cut to it")
            report = stats.result(probe_detectors(hm, plan.probe, block_size=options.block_size), plan.probe)
            shown = options.text if options.text is not None else docs[0]
            [(ids, mask)] = list(text_batches(hm, [shown], 1, lambda m: None))
            example = example_view(hm, ids, mask, queries=plan.queries, block_size=options.block_size)
            heads = DecoderHeads(report, example)
        return CorpusRun(
            heads, rank, world, mine, sums.computed, sums.resumed, len(docs), truncated,
            vector.numel() * vector.element_size(), sums.compute_seconds, sums.slowest_seconds, sums.reduce_seconds,
        )  # fmt: skip


def encoder_corpus(
    enc,
    model,
    tokenizer,
    options: HeadsOptions,
    *,
    warn: Callable[[str], None],
    progress: Callable[[int, int], None] | None = None,
    timeout_s: float | None = None,
) -> CorpusRun:
    """An encoder's corpus statistics (:func:`headwise.study.encoder_report`'s) on every rank of a torchrun launch.

    As :func:`corpus_heads`: the corpus's documents cut into the shards of ``--batch-size`` consecutive documents a
    one-process run reads, dealt by token count, each shard's :class:`~headwise.analysis.HeadStats` sums saved as it
    finishes (``OUT/shards``, resumed on a restart), one float64 all-reduce; rank 0 adds the sums and computes the
    report (the Jensen–Shannon rows of a sentence depend on that sentence alone, so the union over ranks is the
    one-process sample). The same refusals, with the manifest's ``kind`` ``"encoder-heads"``.

    Args:
        enc: the :class:`~headwise.study.EncoderAttend` (``attend``, NL, H, ``max_length``); model: its module (the
            weights hashed); tokenizer: a ``tokenizers.Tokenizer`` (token counts, for the balance only).
        options, warn, progress, timeout_s: as :func:`corpus_heads` (``warn``, rank 0: lines truncated, all ranks).
    Returns:
        the :class:`CorpusRun`, its ``heads`` the :class:`~headwise.analysis.HeadReport` on rank 0 (None elsewhere).
    """
    import torch

    from headwise.analysis import CorpusFile, HeadStats
    from headwise.models import TruncationWarning

    if options.corpus is None:
        raise ValueError("--corpus: expected a corpus file (a distributed run splits its documents)")
    timeout_s = _timeout(timeout_s)
    n = enc.max_length
    with rank_group(timeout_s) as (rank, world, timeout_s):
        docs = list(CorpusFile(options.corpus_path))
        tokens = [min(len(e.ids), n) for e in tokenizer.encode_batch(docs)] if docs else []
        store, shards = _open_store(model, options, docs, tokens, "encoder-heads", {"max_length": n})
        mine = assign_shards(shards, world)[rank]
        expected = set(HeadStats(enc.num_layers, enc.num_heads, max_length=n).state()) | {"truncated"}

        def compute(s: Shard) -> dict:
            stats = HeadStats(enc.num_layers, enc.num_heads, max_length=n)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", TruncationWarning)
                stats.update(*enc.attend(docs[s.start : s.stop]))  # the batch a one-process run reads
            cut = sum(issubclass(w.category, TruncationWarning) for w in caught)
            for w in caught:
                if not issubclass(w.category, TruncationWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            return stats.state() | {"truncated": torch.tensor(float(cut), dtype=torch.float64)}

        sums = _shard_sums(store, shards, mine, compute, expected, lambda state: state, progress)
        _reduce_sums(sums, timeout_s)
        store.clean()
        summed = _unpack(sums.vector, sums.layout)
        truncated = int(round(float(summed.pop("truncated"))))
        report = None
        if rank == 0:
            stats = HeadStats(enc.num_layers, enc.num_heads, max_length=n)
            stats.add_state(summed)
            if truncated:
                warn(f"--corpus: {truncated} line(s) longer than {n} tokens were truncated to {n}")
            report = stats.result()
        return CorpusRun(
            report, rank, world, mine, sums.computed, sums.resumed, len(docs), truncated,
            sums.vector.numel() * sums.vector.element_size(), sums.compute_seconds, sums.slowest_seconds,
            sums.reduce_seconds,
        )  # fmt: skip


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
    hm,
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
    rank is named: :class:`CollectiveTimeout`). Equal to the one-process run up to the order of the float64
    additions (each batch's sums are added, then the ranks').

    The shards are kept (each written atomically, :class:`ShardStore`) in ``OUT/importance-shards`` beside a
    manifest naming the weights' and the batches' SHA-256 and the options; phase 2's in
    ``OUT/importance-shards/pruning-<hash>`` whose manifest adds the SHA-256 of the head sets (the orders depend on
    phase 1's reduced numbers: other orders, another folder). A finished shard is loaded, not computed again, after
    ``torchrun --max-restarts K`` restarts a killed rank and on a second run with the same ``out`` (with any number
    of ranks: a shard is one batch); a manifest of another run is refused with one line before anything is
    computed. ``out`` None: each rank keeps its shards in a temporary folder for the call alone.
    The default gloo group is initialised from torchrun's environment when none is (and destroyed at the end).

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

    import torch

    from headwise.analysis import head_importance

    timeout_s = _timeout(timeout_s)
    started = time.perf_counter()
    nl, h = hm.num_layers, hm.num_heads
    n = nl * h
    options = {"scored": scored, "seed": seed, "random_orders": random_orders, "points": points, "mode": mode,
               "copies": copies, "memory": memory}  # fmt: skip
    with rank_group(timeout_s) as (rank, world, timeout_s), contextlib.ExitStack() as stack:
        model_hash, batches_hash = weights_sha256(hm.model), _tensors_sha256(batches)
        agree("--model (SHA-256 of the weights)", model_hash)
        agree("--importance-sentences / --batch-size (SHA-256 of the batches)", batches_hash)
        problem = None
        if len(batches) < world:
            problem = (
                f"--importance-sentences / --batch-size: {len(batches)} batch(es) for {world} ranks; expected at "
                "least one a rank (a smaller --batch-size)"
            )
        root = Path(out) if out is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        manifest = {"format": IMPORTANCE_FORMAT, "kind": "importance", "model_sha256": model_hash,
                    "batches_sha256": batches_hash, "batches": len(batches), **options}  # fmt: skip
        first = ShardStore(root / "importance-shards", manifest)
        if problem is None:
            problem = first.mismatch()
        refuse_together(problem)
        first.write_manifest()
        mine = deal([float(b[0].numel()) for b in batches], world)[rank]
        run = {"computed": [], "resumed": [], "sent": 0}

        def shown(k: int):
            """``progress`` of batch ``k``'s call: the gates' pass counted in this rank's batches, the passes of the
            ablations and the pruning sets in the batch's own."""
            if progress is None:
                return None

            def report(stage: str, done: int, total: int) -> None:
                if stage != "importance":
                    progress(stage, done, total)
                elif done == total:
                    progress(stage, mine.index(k) + 1, len(mine))

            return report

        def call(k: int, reduce, stages=None):
            """head_importance on batch ``k`` alone, until ``reduce`` or ``stages`` stops it (:class:`_Stop`)."""
            try:
                return head_importance(
                    hm, [batches[k]], scored=scored, random_orders=random_orders, seed=seed, points=points,
                    mode=mode, copies=copies, memory=memory, progress=shown(k), reduce=reduce, stages=stages,
                )  # fmt: skip
            except _Stop:
                return None

        def replay(*vectors):
            """A reduce that hands back ``vectors`` (the reduced sums) in turn; past them it stops the call."""
            given = iter(vectors)

            def reduce(values):
                got = next(given, None)
                if got is None:
                    raise _Stop
                return got(values) if callable(got) else got.numpy().copy()

            return reduce

        def phase_one(k: int) -> dict:
            taken: list = []

            def take(values):
                taken.append(torch.from_numpy(np.array(values, dtype=np.float64)))
                if len(taken) == 2:  # the single-head ablations taken: the pruning sets are phase 2's
                    raise _Stop
                return values

            call(k, replay(take, take))
            return {"phase1": taken[0], "ablation": taken[1]}

        def skip(given: dict):
            """``stages`` that compute only the stages named in ``given`` as None, else return ``given[name]``."""

            def stages(name, work, sets):
                value = given.get(name, 0.0)
                if value is None:
                    return work()
                if name == "importance":
                    return np.zeros((nl, h)), 0, 0.0, 1  # replaced by the reduced sums (tokens 1: values as sums)
                return np.full(len(sets), value)

            return stages

        one = _shard_sums(first, list(range(len(batches))), mine, phase_one, {"phase1", "ablation"}, dict, None)
        run["computed"] += [(1, k) for k in one.computed]
        run["resumed"] += [(1, k) for k in one.resumed]
        _reduce_sums(one, timeout_s)
        run["sent"] += one.vector.numel() * 8
        reduced = _unpack(one.vector, one.layout)
        g1, g2 = reduced["phase1"], reduced["ablation"]

        found: list = []

        def find_sets(name, work, sets):
            if name == "pruning":
                found.append(sets)
                raise _Stop
            return skip({})(name, work, sets)

        call(mine[0], replay(g1, g2), find_sets)  # the pruning sets, from the reduced numbers alone
        orders = hashlib.sha256(json.dumps([list(s) for s in found[0]]).encode()).hexdigest()
        second = ShardStore(first.folder / f"pruning-{orders[:16]}", manifest | {"orders_sha256": orders})
        second.write_manifest()

        def phase_two(k: int) -> dict:
            tokens = float(first.load(k)["phase1"][n + 2])  # the batch's tokens (saved by phase 1)
            taken: list = []

            def take(values):
                taken.append(torch.from_numpy(np.array(values, dtype=np.float64) * tokens))
                raise _Stop

            call(k, replay(g1, g2, take), skip({"pruning": None}))
            return {"pruning": taken[0]}

        two = _shard_sums(second, list(range(len(batches))), mine, phase_two, {"pruning"}, dict, None)
        run["computed"] += [(2, k) for k in two.computed]
        run["resumed"] += [(2, k) for k in two.resumed]
        _reduce_sums(two, timeout_s)
        run["sent"] += two.vector.numel() * 8
        first.clean()
        second.clean()
        g3 = _unpack(two.vector, two.layout)["pruning"]
        result = call(mine[0], replay(g1, g2, g3), skip({}))
        result.sweep = {"mode": mode, "head_sets": n + len(g3), "ranks": world,
                        "shards": {"computed": len(run["computed"]), "resumed": len(run["resumed"])},
                        "seconds_total": time.perf_counter() - started}  # fmt: skip
        return ImportanceRun(
            result, rank, world, mine, run["sent"], time.perf_counter() - started, run["computed"], run["resumed"]
        )
