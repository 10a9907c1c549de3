"""The ranks of a ``torchrun`` launch, in one place: where this process stands, the group, the collectives' timeout,
and jobs dealt to the ranks by cost with their results gathered in job order.

Every run that splits work across processes goes through here — a decoder's or an encoder's corpus statistics and
``--importance`` (:mod:`headwise.study`), the patching and circuit sweeps, the lab's induction seeds and its
heads-vs-one runs::

    with ranks() as r:                     # the default gloo group from torchrun's environment (or the one there is)
        results = r.map(jobs, cost, fn)    # this rank runs its share; every rank gets every result, in job order

- **Where this process stands** is read from the environment here and nowhere else: :func:`launched` (torchrun's
  ``RANK`` and ``WORLD_SIZE`` are set), :class:`Launch` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` checked),
  :func:`first_rank` (the process that prints and writes: rank 0, or the only one).
- **The timeout** of every collective (the rendezvous, the barriers, the all-reduces and all-gathers):
  ``timeout_s=``, else ``$HEADWISE_DIST_TIMEOUT`` seconds, else :data:`DEFAULT_TIMEOUT_S` —
  :func:`resolve_timeout` resolves it for every caller, :func:`headwise.distributed.init_from_env` included.
- **Dealing** (:func:`deal`): the costliest job first, each to the least loaded rank — the greedy "longest processing
  time" rule (Graham 1969), within 4/3 of the best balance.
- **Agreeing**: a check whose answer could differ between ranks is made after an all-gather of what each rank holds
  (:func:`agree`, :func:`refuse_together`), so every rank raises the same one-line ValueError together instead of
  one rank raising alone and the others waiting in the next collective until the timeout.

torch is imported at the first call, not with the module: the command line asks :func:`launched` at start-up.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
    "CollectiveTimeout",
    "Launch",
    "Ranks",
    "agree",
    "attempt_store",
    "all_gather_json",
    "barrier",
    "deal",
    "first_rank",
    "init_group",
    "launched",
    "rank_group",
    "ranks",
    "refuse_together",
    "resolve_timeout",
]

#: Seconds a collective waits by default (the rendezvous, a barrier, a reduction). One value for every run across
#: ranks: it must cover the spread between the first and the last rank to reach a collective — for the corpus run,
#: about one shard's time when the shards are balanced; for ring attention and tensor parallelism, a step's.
DEFAULT_TIMEOUT_S = 1800.0
#: The environment variable that overrides :data:`DEFAULT_TIMEOUT_S` (seconds).
TIMEOUT_ENV = "HEADWISE_DIST_TIMEOUT"
_TEXT_BYTES = 512  # bytes of one rank's line in an all-gather of texts (hashes, refusals)


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within the timeout; the message names the ranks that did not arrive."""


def resolve_timeout(value: float | None = None) -> float:
    """The collectives' timeout in seconds: ``value``, else ``$HEADWISE_DIST_TIMEOUT``, else
    :data:`DEFAULT_TIMEOUT_S`.

    Raises:
        ValueError: not a positive number (naming ``timeout_s`` or the variable).
    """
    name = "timeout_s"
    if value is None:
        name, text = TIMEOUT_ENV, os.environ.get(TIMEOUT_ENV)
        try:
            value = DEFAULT_TIMEOUT_S if text is None else float(text)
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV}: expected a positive number of seconds, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"{name}: expected a positive number of seconds, got {value}")
    return float(value)


def launched() -> bool:
    """Whether this process was started by torchrun (or a launcher that sets its ``RANK`` and ``WORLD_SIZE``)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


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


def first_rank() -> bool:
    """Whether this process is the one that prints and writes: rank 0 of a launch, or a process outside one."""
    return not launched() or os.environ["RANK"].strip() == "0"


def deal(costs: Sequence[float], world_size: int) -> list[list[int]]:
    """Deal jobs of ``costs`` ``(J,)`` to ``world_size`` ranks: the costliest first, each to the rank with the least
    cost so far (ties: fewer jobs, then the lower rank) — the greedy "longest processing time" rule, within 4/3 of the
    best balance. Returns each rank's job indices, ascending (a rank may get none when there are fewer jobs)."""
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
    return _gather_json(value)[0]


def _gather_json(value) -> tuple[list, int]:
    """:func:`all_gather_json`, and the bytes each rank received (the longest rank's bytes × the ranks)."""
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
    return [json.loads(bytes(r[: int(n)].tolist())) for r, n in zip(rows, lengths)], longest * world


def barrier(timeout_s: float, *, before: str = "the reduction") -> None:
    """Every rank arrives within ``timeout_s`` seconds, or :class:`CollectiveTimeout` naming the ones that did not
    (gloo's monitored barrier); ``before`` names what the barrier guards, for the message."""
    import torch.distributed as dist

    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
    except RuntimeError as e:
        text = " ".join(str(e).split())
        first = text.split(" Original exception")[0][:300]
        raise CollectiveTimeout(
            f"rank {dist.get_rank()}: the barrier before {before} failed after at most {timeout_s:g} s: {first}"
        ) from None


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


def _init(launch: Launch, timeout_s: float) -> None:
    """The default gloo group from torchrun's environment; an unreachable rendezvous → ValueError (one line).

    The group's keys live under ``headwise/attempt-<TORCHELASTIC_RESTART_COUNT>`` of the launch's store
    (:func:`attempt_store`: restarts of a static rendezvous do not read a dead attempt's
    addresses).
    """
    import torch.distributed as dist

    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise ValueError(f"{' / '.join(missing)}: not set; launch with torchrun (it sets the rendezvous address)")
    host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"MASTER_PORT: expected a port number 1 … 65535, got {port!r}")
    delta = datetime.timedelta(seconds=timeout_s)
    try:
        with _quiet_fd2():  # c10d logs each failed connection with a C++ stack to fd 2; the one line below says it
            rank, world = launch.rank, launch.world_size
            store = attempt_store(host, int(port), rank, world, delta)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=delta)
    except Exception as e:  # noqa: BLE001 - DistStoreError, RuntimeError, TimeoutError: the rendezvous failed
        reason = " ".join(str(e).split())[:200]
        raise ValueError(
            f"MASTER_ADDR:MASTER_PORT: rank {launch.rank} of {launch.world_size} could not meet the others at "
            f"{host}:{port} within {timeout_s:g} s ({type(e).__name__}: {reason})"
        ) from None


def attempt_store(host: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The launch's TCP store, its keys under ``headwise/attempt-<TORCHELASTIC_RESTART_COUNT>``.

    torchrun's static rendezvous (``--master-port``) keeps one store across ``--max-restarts``, where a dead
    attempt's addresses would otherwise be read by the restarted ranks (gloo then fails to connect); each attempt's
    group therefore keeps its keys apart. Under torchrun the agent serves the store
    (``TORCHELASTIC_USE_AGENT_STORE=True``); launched by hand, rank 0 serves it (as ``init_method="env://"`` does).
    """
    import torch.distributed as dist

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0 and not agent, timeout=timeout)
    return dist.PrefixStore(f"headwise/attempt-{attempt}", store)


def init_group(timeout_s: float | None = None) -> Launch:
    """Initialise the default gloo group from torchrun's environment. Returns this process's :class:`Launch`.

    Raises:
        ValueError: not launched (no ``RANK`` / ``WORLD_SIZE``), or the rendezvous cannot be reached (one line).
    """
    launch = Launch.from_env()
    if launch is None:
        raise ValueError("RANK / WORLD_SIZE: not set; launch with torchrun")
    _init(launch, resolve_timeout(timeout_s))
    return launch


class Ranks:
    """This process's place among the ranks and the work it shares with them (see :func:`ranks`).

    Attributes:
        rank, world_size: this process's place (0 and 1 for a process alone).
        timeout_s: the collectives' timeout in seconds.
        payload_bytes: bytes this rank received in :meth:`map`'s gathers so far (padded rows × ranks).
    """

    def __init__(self, rank: int, world_size: int, timeout_s: float, *, group: bool):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.payload_bytes = 0
        self._group = group

    def share(self, costs: Sequence[float]) -> list[int]:
        """This rank's job indices, ascending, of jobs of ``costs`` ``(J,)`` dealt by :func:`deal`."""
        return deal(costs, self.world_size)[self.rank]

    def map(
        self,
        jobs: Sequence,
        cost: Callable[[object], float],
        fn: Callable[[object], object],
        *,
        done: Callable[[int, object], None] | None = None,
        before: str = "the gather",
    ) -> list:
        """``[fn(job) for job in jobs]`` with the jobs dealt to the ranks by ``cost(job)`` (:meth:`share`): this
        rank runs its share in job order (``done(index, result)`` after each), then — after a monitored barrier
        (:func:`barrier`) — every rank gets every result (one :func:`all_gather_json`; results must be what
        :mod:`json` writes), in ``jobs`` order. A process alone runs every job and returns the results as they are.

        Raises:
            CollectiveTimeout: a rank did not reach the gather within the timeout.
        """
        mine = self.share([float(cost(job)) for job in jobs])
        local = {}
        for i in mine:
            local[i] = fn(jobs[i])
            if done is not None:
                done(i, local[i])
        if not self._group:
            return [local[i] for i in range(len(jobs))]
        barrier(self.timeout_s, before=before)
        parts, received = _gather_json({str(i): v for i, v in local.items()})
        self.payload_bytes += received
        merged = {int(k): v for part in parts for k, v in part.items()}
        return [merged[i] for i in range(len(jobs))]


@contextlib.contextmanager
def ranks(timeout_s: float | None = None, *, alone: bool = False) -> Iterator[Ranks]:
    """The ranks of this launch for the block, as a :class:`Ranks`.

    An initialised default group is used as it is (and kept). Otherwise, under torchrun, the default gloo group is
    initialised from its environment (the timeout :func:`resolve_timeout` gives) and destroyed after
    the block.
    ``alone=True`` starts no group: without an initialised one it yields a world of this process alone (rank 0 of
    1, no collective) — for library calls that share their work only when their caller set up the ranks.

    Raises:
        ValueError: not launched and no group (without ``alone``), a bad timeout, an unreachable rendezvous (one
            line).
    """
    import torch.distributed as dist

    resolved = resolve_timeout(timeout_s)
    initialised = dist.is_available() and dist.is_initialized()
    if not initialised and alone:
        yield Ranks(0, 1, resolved, group=False)
        return
    own = not initialised
    if own:
        launch = Launch.from_env()
        if launch is None:
            raise ValueError("RANK / WORLD_SIZE: not set; launch with torchrun (or initialise a process group)")
        _init(launch, resolved)
    try:
        yield Ranks(dist.get_rank(), dist.get_world_size(), resolved, group=True)
    finally:
        if own and dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def rank_group(timeout_s: float | None = None):
    """:func:`ranks` as ``(rank, world size, timeout in seconds)``."""
    with ranks(timeout_s) as r:
        yield r.rank, r.world_size, r.timeout_s
