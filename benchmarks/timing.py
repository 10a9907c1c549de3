"""Side-by-side timing on a shared machine.

Every contender of one comparison runs in the same process on the same inputs; the contenders alternate
round after round (the order rotating), each round times each contender with
``torch.utils.benchmark.Timer.timeit``. A contender's time is the median over rounds, and a ratio is the
median over rounds of the per-round ratio (paired, so a burst of load elsewhere hits both sides of one
ratio alike); the lowest and highest per-round ratio say how noisy the rounds were.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.utils.benchmark as tb


@dataclass(frozen=True)
class Timing:
    """Per-round seconds per call of each contender of one comparison."""

    rounds: int
    number: dict[str, int]
    times_s: dict[str, list[float]]

    @property
    def median_s(self) -> dict[str, float]:
        return {n: statistics.median(t) for n, t in self.times_s.items()}

    def __contains__(self, name: str) -> bool:
        return name in self.times_s

    def ratio(self, a: str, b: str) -> float:
        """Median over rounds of ``time(a) / time(b)``."""
        return statistics.median(x / y for x, y in zip(self.times_s[a], self.times_s[b]))

    def spread(self, a: str, b: str) -> tuple[float, float]:
        """(lowest, highest) per-round ratio ``time(a) / time(b)``."""
        rs = [x / y for x, y in zip(self.times_s[a], self.times_s[b])]
        return min(rs), max(rs)

    def paired(self, a: str, b: str, f: Callable[[float, float], float]) -> float:
        """Median over rounds of ``f(time(a), time(b))`` (a figure that takes both times of one round)."""
        return statistics.median(f(x, y) for x, y in zip(self.times_s[a], self.times_s[b]))

    def only(self, names: Iterable[str]) -> Timing:
        keep = [n for n in self.times_s if n in set(names)]
        return Timing(self.rounds, {n: self.number[n] for n in keep}, {n: self.times_s[n] for n in keep})

    def table(self, against: Iterable[str], flops: float | None = None, names: Iterable[str] | None = None) -> list:
        """One row per contender (``names``, default all): median time, GFLOP/s and ratios to ``against``."""
        against = list(against)
        rows = []
        for name in names or self.times_s:
            t = self.median_s[name]
            row = {"contender": name, "median_ms": t * 1e3}
            if flops:
                row["gflops"] = flops / t / 1e9
            for peer in against:
                if peer != name and peer in self:
                    row[f"ratio_vs_{peer}"] = self.ratio(name, peer)
                    row[f"spread_vs_{peer}"] = self.spread(name, peer)
            rows.append(row)
        return rows

    def to_json(self) -> dict:
        return {"rounds": self.rounds, "number": self.number, "times_s": self.times_s, "median_s": self.median_s}

    @classmethod
    def from_json(cls, d: dict) -> Timing:
        return cls(d["rounds"], d["number"], d["times_s"])


def _time_once(fn: Callable[[], object], number: int) -> float:
    # torch.utils.benchmark.Timer runs its statement with ONE torch thread unless told otherwise: pass the
    # count in force (the caller's, or the one ``threads`` set), so that a comparison runs as it is called
    return tb.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads()).timeit(number).median


def compare(
    contenders: dict[str, Callable[[], object]], *, rounds: int, target_s: float = 0.3, warmup: int = 1
) -> Timing:
    """Time ``contenders`` (name -> zero-argument callable) side by side, alternating; see the module docstring.

    Args:
        rounds: how many alternating rounds.
        target_s: seconds each contender is timed per round (``number`` calls, fixed after the warm-up).
        warmup: untimed calls of each contender first (at least one; the fastest sets ``number``).
    """
    number = {}
    for name, fn in contenders.items():
        one = float("inf")
        for _ in range(max(1, warmup)):
            t0 = time.perf_counter()
            fn()
            one = min(one, time.perf_counter() - t0)
        number[name] = max(1, min(1000, int(target_s / max(one, 1e-6))))
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(_time_once(contenders[name], number[name]))
    return Timing(rounds, number, times)


@contextlib.contextmanager
def threads(n: int):
    """Run the block with ``n`` torch threads, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
