"""Shared benchmark helpers: side-by-side timing, machine facts, FLOP counts, JSON output.

Timing discipline (the machine is shared): every contender of one comparison runs in the same process on
the same inputs, the contenders alternate round after round (the order rotating), each round times each
contender with ``torch.utils.benchmark.Timer.timeit``; a contender's time is the median over rounds, and a
ratio is the median over rounds of the per-round ratio (paired, so a burst of load elsewhere hits both
sides of one ratio alike).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.utils.benchmark as tb

ROOT = Path(__file__).resolve().parent.parent


def flops_mha(B: int, L: int, D: int, S: int | None = None, causal: bool = False) -> float:
    """Forward FLOPs of multi-head self-attention: 8·B·L·D² (four projections) + 4·B·L·S·D (q kᵀ and p v).

    A causal mask halves the attention term (the kernels skip the blocks above the diagonal).
    """
    S = L if S is None else S
    att = 4 * B * L * S * D
    return 8 * B * L * D * D + (att / 2 if causal else att)


def gemm_call(n: int = 2048, dtype=torch.float32) -> Callable[[], object]:
    """A zero-argument ``a @ b`` on random ``(n, n)`` matrices: the GEMM rate timed beside the contenders."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return lambda: a @ b


def _time_once(fn: Callable[[], object], number: int) -> float:
    return tb.Timer(stmt="fn()", globals={"fn": fn}).timeit(number).median


def compare(
    contenders: dict[str, Callable[[], object]],
    *,
    rounds: int,
    target_s: float = 0.3,
    warmup: int = 1,
) -> dict:
    """Time ``contenders`` side by side, alternating; see the module docstring.

    Args:
        contenders: name -> zero-argument callable (ratios are taken afterwards with :func:`ratio`).
        rounds: how many alternating rounds.
        target_s: seconds each contender is timed per round (``number`` calls, fixed after a warm-up).
        warmup: untimed calls of each contender before the first round (at least one; the fastest of them
            sets how many calls a round makes).
    Returns:
        ``{"rounds": rounds, "number": {name: n}, "times_s": {name: [per-round seconds per call]},
        "median_s": {name: median}}``.
    """
    number = {}
    for name, fn in contenders.items():
        one = float("inf")
        for _ in range(max(1, warmup)):  # the warm-up calls also size the rounds
            t0 = time.perf_counter()
            fn()
            one = min(one, time.perf_counter() - t0)
        number[name] = max(1, min(1000, int(target_s / max(one, 1e-6))))
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(_time_once(contenders[name], number[name]))
    return {
        "rounds": rounds,
        "number": number,
        "times_s": times,
        "median_s": {n: statistics.median(t) for n, t in times.items()},
    }


def ratio(result: dict, a: str, b: str) -> float:
    """Median over rounds of ``time(a) / time(b)`` from one :func:`compare` result."""
    ta, tb_ = result["times_s"][a], result["times_s"][b]
    return statistics.median(x / y for x, y in zip(ta, tb_))


def ratio_spread(result: dict, a: str, b: str) -> tuple[float, float]:
    """(lowest, highest) per-round ratio ``time(a) / time(b)``: how noisy the rounds were."""
    rs = [x / y for x, y in zip(result["times_s"][a], result["times_s"][b])]
    return min(rs), max(rs)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma")))
    except OSError:
        pass
    return []


def machine() -> dict:
    """Facts about this machine and the software, for every result file."""
    import numpy

    try:
        import transformers

        tv = transformers.__version__
    except ImportError:  # pragma: no cover
        tv = None
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):  # pragma: no cover
        mem_gb = None
    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": None if mem_gb is None else round(mem_gb, 1),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "transformers": tv,
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def command() -> str:
    """The command line that produced a result, as typed from the repository root."""
    argv = [os.path.relpath(sys.argv[0], ROOT) if sys.argv[0].endswith(".py") else sys.argv[0], *sys.argv[1:]]
    return " ".join([".venv/bin/python", *argv])


def write_json(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically (temporary name in the same folder, then ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def log(msg: str) -> None:
    print(msg, flush=True)
