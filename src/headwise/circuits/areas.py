"""How good a ranking of edges is, as the circuit benchmarks score it: MIB's CPR and CMD (Mueller et al. 2025, the
circuit track's ``evaluation.py``) from a faithfulness curve, and the AUROC of recovering a known circuit's edges
(InterpBench, Gupta et al. 2024).

Shape legend: E edges, K fractions.

MIB keeps the top ``int(f · E)`` edges for each fraction ``f`` of :data:`MIB_FRACTIONS` and measures each circuit's
faithfulness ``(m(circuit) − m(∅)) / (m(clean) − m(∅))``. Over the fractions (trapezoids on a linear axis)::

    CPR = Σ_k (f_{k+1} − f_k) · (F_k + F_{k+1}) / 2                  (the area under the curve: higher is better)
    CMD = Σ_k (f_{k+1} − f_k) · (|1 − F_k| + |1 − F_{k+1}|) / 2      (the area between the curve and 1: lower)

The AUROC is the probability that an edge of the known circuit outranks one outside it by ``|score|`` (ties count
one half): Mann–Whitney's U over the two sets' sizes. Spearman's rank correlation compares an estimate's order with
the exact one's; both rest on :func:`mean_ranks`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["MIB_FRACTIONS", "auroc", "curve_areas", "mean_ranks", "mib_sizes", "spearman"]

#: the fractions of the graph's edges MIB's circuit track keeps (``evaluate_area_under_curve``'s ``percentages``)
MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def mib_sizes(num_edges: int, fractions: Sequence[float] = MIB_FRACTIONS) -> list[int]:
    """The number of top edges MIB keeps at each fraction: ``int(f · num_edges)`` (rounded down, as MIB)."""
    return [int(f * num_edges) for f in fractions]


def curve_areas(faithfulness: Sequence[float], fractions: Sequence[float] = MIB_FRACTIONS) -> tuple[float, float]:
    """``(CPR, CMD)``: MIB's trapezoid areas of a faithfulness curve measured at ``fractions`` (see the module
    docstring).

    Raises:
        ValueError: the curve and the fractions of different lengths, fewer than two points, fractions not
        increasing.
    """
    F = [float(v) for v in faithfulness]
    x = [float(f) for f in fractions]
    if len(F) != len(x):
        raise ValueError(f"faithfulness: expected one value per fraction ({len(x)}), got {len(F)}")
    if len(x) < 2 or any(b <= a for a, b in zip(x, x[1:])):
        raise ValueError(f"fractions: expected at least two increasing fractions, got {list(fractions)}")
    cpr = cmd = 0.0
    for k in range(len(x) - 1):
        width = x[k + 1] - x[k]
        cpr += width * (F[k] + F[k + 1]) / 2
        cmd += width * (abs(1.0 - F[k]) + abs(1.0 - F[k + 1])) / 2
    return cpr, cmd


def auroc(scores: Tensor, truth: Tensor) -> float:
    """The area under the ROC curve of ranking edges by ``|scores|`` against the known circuit ``truth``.

    Args:
        scores: ``(E,)`` edge scores (any sign; ranked by magnitude).
        truth: ``(E,)`` bool, True for the known circuit's edges.
    Returns:
        AUROC in [0, 1] (NaN when either set is empty).
    """
    s = scores.detach().abs().double().reshape(-1)
    t = truth.reshape(-1).bool()
    if s.shape != t.shape:
        raise ValueError(f"truth: expected one flag per score ({s.numel()},), got {tuple(truth.shape)}")
    pos, neg = int(t.sum()), int((~t).sum())
    if pos == 0 or neg == 0:
        return math.nan
    ranks = mean_ranks(s)
    u = float(ranks[t].sum()) - pos * (pos + 1) / 2
    return u / (pos * neg)


def mean_ranks(x: Tensor) -> Tensor:
    """``(n,)`` float64: the ranks 1 … n of the values of a 1-D tensor, ties given their mean rank."""
    x = x.detach().double().reshape(-1)
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(1, len(x) + 1, dtype=torch.float64, device=x.device)
    for v in torch.unique(x):
        tie = x == v
        if int(tie.sum()) > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's rank correlation of two 1-D tensors (ties get their mean rank); NaN when either side is
    constant."""
    ra, rb = mean_ranks(a), mean_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / den if den > 0 else float("nan")
