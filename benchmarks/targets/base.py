"""What every target shares: the run mode, the :class:`Target` interface, FLOP counts, table rendering."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from row import Result


@dataclass(frozen=True)
class Mode:
    """How hard to measure: ``make bench`` (quick) or ``make bench-full`` (full)."""

    full: bool

    @property
    def rounds(self) -> int:
        return 9 if self.full else 2

    @property
    def target_s(self) -> float:
        """Seconds each contender is timed per round."""
        return 0.4 if self.full else 0.1

    @property
    def name(self) -> str:
        return "full" if self.full else "quick"


class Target:
    """One concern measured side by side: it measures itself and renders its own section of the report.

    Subclasses set ``name`` and ``title`` and implement :meth:`measure`; :meth:`render` defaults to the
    contender table under ``data["table"]``; :meth:`notes` explains a missed goal from the measured figures.
    """

    name: str
    title: str

    def measure(self, mode: Mode) -> Result:
        raise NotImplementedError

    def render(self, r: Result) -> list[str]:
        return contender_table(r.data["table"]) + [""]

    def notes(self, r: Result, results: dict[str, Result]) -> list[str]:
        return []

    def figures(self, r: Result) -> list:
        """Write the target's pictures (paths returned); none by default."""
        return []

    def result(self, rows, **data) -> Result:
        return Result(self.name, self.title, list(rows), data)


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


def fmt(v, digits: int = 3) -> str:
    """A figure as the report prints it."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != 0 and abs(v) < 1e-3:
            return f"{v:.2e}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(v)


def md_row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def contender_table(table: list[dict]) -> list[str]:
    """Markdown for :meth:`timing.Timing.table` rows: time, GFLOP/s, ratio (lowest–highest round) to each peer."""
    peers = []
    for row in table:
        for k in row:
            if k.startswith("ratio_vs_") and k[9:] not in peers:
                peers.append(k[9:])
    has_gf = any("gflops" in r for r in table)
    head = ["contender", "median time"] + (["GFLOP/s"] if has_gf else []) + [f"÷ {p}" for p in peers]
    lines = [md_row(head), "|" + "---|" * len(head)]
    for row in table:
        t = row["median_ms"]
        cells = [row["contender"], f"{t:.1f} ms" if t >= 1 else f"{t * 1e3:.0f} µs"]
        if has_gf:
            cells.append(f"{row['gflops']:.0f}" if "gflops" in row else "")
        for p in peers:
            r, lo_hi = row.get(f"ratio_vs_{p}"), row.get(f"spread_vs_{p}")
            cells.append("" if r is None else f"{r:.3f} ({lo_hi[0]:.2f}–{lo_hi[1]:.2f})")
        lines.append(md_row(cells))
    return lines
