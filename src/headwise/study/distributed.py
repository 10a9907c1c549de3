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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headwise.study.options import HeadsOptions

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "FORMAT",
    "CollectiveTimeout",
    "CorpusRun",
    "Launch",
    "Shard",
    "ShardStore",
    "agree",
    "all_gather_json",
    "assign_shards",
    "barrier",
    "corpus_heads",
    "deal",
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
        heads: rank 0: the :class:`~headwise.study.DecoderHeads` (report and example); other ranks: None.
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

    The group's keys live under ``headwise/attempt-<TORCHELASTIC_RESTART_COUNT>`` of the launch's store: torchrun's
    static rendezvous (``--master-port``) keeps one store across ``--max-restarts``, where the dead attempt's
    addresses would otherwise be read by the restarted ranks. Under torchrun the agent serves the store
    (``TORCHELASTIC_USE_AGENT_STORE``); launched by hand, rank 0 serves it.
    """
    import torch.distributed as dist

    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise ValueError(f"{' / '.join(missing)}: not set; launch with torchrun (it sets the rendezvous address)")
    host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"MASTER_PORT: expected a port number 1 … 65535, got {port!r}")
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        with _quiet_fd2():  # c10d logs each failed connection with a C++ stack to fd 2; the one line below says it
            store = dist.TCPStore(
                host, int(port), launch.world_size, is_master=launch.rank == 0 and not agent, timeout=timeout
            )
            dist.init_process_group(
                "gloo", store=dist.PrefixStore(f"headwise/attempt-{attempt}", store), rank=launch.rank,
                world_size=launch.world_size, timeout=timeout,
            )  # fmt: skip
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


def _agree(what: str, value: str) -> None:
    """ValueError on every rank unless every rank holds the same ``value`` (naming each rank's)."""
    values = _gather_texts(value)
    if len(set(values)) > 1:
        shown = "; ".join(f"rank {r}: {v[:12]}" for r, v in enumerate(values))
        raise ValueError(f"{what}: the ranks differ ({shown}); every rank must read the same")


def _refuse_together(problem: str | None) -> None:
    """Raise the first rank's refusal on every rank (so no rank waits alone in the next collective)."""
    problems = _gather_texts(problem or "")
    for r, p in enumerate(problems):
        if p:
            raise ValueError(p if p == (problem or "") else f"rank {r}: {p}")


@contextlib.contextmanager
def rank_group(timeout_s: float | None = None):
    """For the other runs on the launcher (the sweeps of :mod:`headwise.study.dist_sweeps`): the default gloo group
    initialised from torchrun's environment unless one is (then used as it is, and kept), destroyed at the end.
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


def agree(what: str, value: str) -> None:
    """ValueError on every rank unless every rank holds the same ``value`` (a hash: the message names each rank's
    first 12 characters and ``what``)."""
    _agree(what, value)


def refuse_together(problem: str | None) -> None:
    """Every rank raises the first rank's refusal (ValueError, one line), so no rank waits alone in a collective;
    nothing when no rank has one."""
    _refuse_together(problem)


def barrier(timeout_s: float) -> None:
    """Every rank arrives, or :class:`CollectiveTimeout` naming the ranks that did not (gloo's monitored barrier)."""
    _barrier(timeout_s)


def _barrier(timeout_s: float) -> None:
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
    import torch.distributed as dist

    from headwise._io import TEMP_PREFIX, TEMP_SUFFIX
    from headwise.analysis import CorpusFile, DecoderStats
    from headwise.analysis.streaming import read_rows
    from headwise.models import TruncationWarning
    from headwise.models.gguf import file_sha256
    from headwise.study.decoder import DecoderHeads, example_view, probe_detectors
    from headwise.study.inputs import text_batches

    if options.corpus is None:
        raise ValueError("--corpus: expected a corpus file (a distributed run splits its documents)")
    if hm.kind != "decoder":
        raise ValueError(f"--model: a distributed corpus run reads a decoder's heads, got a {hm.kind}")
    timeout_s = _timeout(timeout_s)
    own_group = not dist.is_initialized()
    if own_group:
        launch = Launch.from_env()
        if launch is None:
            raise ValueError("RANK / WORLD_SIZE: not set; launch with torchrun (or initialise a process group)")
        _init(launch, timeout_s)  # as init_group, with the message naming the other way in
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        corpus = options.corpus_path
        docs = list(CorpusFile(corpus))
        corpus_hash, model_hash = file_sha256(corpus), weights_sha256(hm.model)
        _agree("--corpus (SHA-256 of the file)", corpus_hash)
        _agree("--model (SHA-256 of the weights)", model_hash)
        problem = None
        if world > len(docs):
            problem = f"WORLD_SIZE: {world} ranks for {len(docs)} document(s) in '{corpus}'; expected at most one each"
        tokens = [min(len(e.ids), hm.max_length) for e in hm.tokenizer.encode_batch(docs)] if docs else []
        shards = plan_shards(tokens, options.batch_size)
        if problem is None and len(shards) < world:
            fit = max(1, len(docs) // world)
            problem = (
                f"--batch-size: {len(shards)} shard(s) of {options.batch_size} documents for {world} ranks; "
                f"expected --batch-size ≤ {fit}"
            )
        manifest = {
            "format": FORMAT,
            "kind": "decoder-heads",
            "model_sha256": model_hash,
            "corpus_sha256": corpus_hash,
            "documents": len(docs),
            "batch_size": options.batch_size,
            "block_size": options.block_size,
            "max_length": hm.max_length,
            "shards": len(shards),
        }
        store = ShardStore(Path(options.out) / "shards", manifest)
        if problem is None:
            problem = store.mismatch()
        _refuse_together(problem)
        store.write_manifest()
        mine = assign_shards(shards, world)[rank]
        longest = max(tokens) if tokens else 1  # the histogram's width all-reduced: ±(longest − 1)
        started = time.perf_counter()
        total = None
        computed, resumed = [], []
        expected = set(DecoderStats(hm.num_layers, hm.num_heads, max_length=1).state()) | {"truncated"}
        for done, k in enumerate(mine, start=1):
            state = store.load(k)
            if state is not None and set(state) != expected:  # not this run's sums: computed again, never trusted
                state = None
            if state is None:
                s = shards[k]
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
                store.save(k, state)
                computed.append(k)
            else:
                resumed.append(k)
            state = _widen(state, longest)
            total = state if total is None else {key: total[key] + state[key] for key in total}
            if progress is not None:
                progress(done, len(mine))
        vector, layout = _pack(total)
        computed_at = time.perf_counter()
        _barrier(timeout_s)
        dist.all_reduce(vector, op=dist.ReduceOp.SUM)
        reduced_at = time.perf_counter()
        slowest = torch.tensor([computed_at - started], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        for stale in store.folder.glob(f"{TEMP_PREFIX}shard-*{TEMP_SUFFIX}"):  # left by a rank killed mid-write
            stale.unlink(missing_ok=True)
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
            heads, rank, world, mine, computed, resumed, len(docs), truncated, vector.numel() * vector.element_size(),
            computed_at - started, float(slowest), reduced_at - computed_at,
        )  # fmt: skip
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()
