"""How stable a circuit is across its prompt pairs: the pairs resampled with replacement, every edge's score and every
circuit re-formed from the per-pair scores the run already holds (no pass of the model).

Shape legend: P prompt pairs, E edges, B resamples, K circuit sizes.

An edge's score is the mean of its per-pair scores, so a resample of the pairs (P draws with replacement) is a weight
per pair — how often it was drawn, ``(B, P)`` — and every resample's scores are one product ``(B, P) @ (P, E)``.
For each resample and each circuit size n the circuit is the top n edges by |score| — the rule the run's faithfulness
curve ranks by; the size a resample's own faithfulness would choose is not re-measured (that needs passes of the
model). Reported, as in the published bootstrap of IOI circuits (Jaccard 0.67 on GPT-2 small, 0.39 on Llama-3.2-1B;
≥ 0.8 proposed as the bar for calling a circuit stable):

- each edge's percentile interval of its score over the resamples;
- at every size: the mean (and least) Jaccard of a resample's circuit with the run's own top n, and the mean
  Jaccard between resamples (every pair of them);
- each edge's survival — the share of resamples whose circuit of the chosen size holds it — and the share of the
  chosen circuit's edges that survive in at least :data:`STABLE` of the resamples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["STABLE", "BootstrapReport", "bootstrap_circuit"]

#: An edge is stable when at least this share of the resamples' circuits hold it.
STABLE = 0.9
#: The interval's percentiles (a 95 % percentile interval).
INTERVAL = (2.5, 97.5)


class BootstrapReport(dict):
    """:func:`bootstrap_circuit`'s result (a dict; ``circuit.json``'s ``"bootstrap"`` without the per-edge lists).

    Keys: ``resamples``, ``pairs``, ``seed``, ``interval`` (the percentiles), ``sizes`` (K), ``jaccard`` (K, mean of
    each resample's circuit with the run's), ``jaccard_min`` (K), ``jaccard_pairwise`` (K, mean over pairs of
    resamples), ``size`` (the chosen circuit's), ``circuit_jaccard`` (at that size), ``stable_share`` (the chosen
    circuit's edges that survive in ≥ :data:`STABLE` of the resamples), and, kept apart for the edges' records,
    ``low`` / ``high`` (E,) and ``survival`` (E,)."""


def bootstrap_circuit(
    per_pair: Tensor, sizes: Sequence[int], size: int, *, resamples: int, seed: int = 0
) -> BootstrapReport:
    """The run's circuits re-formed on ``resamples`` resamples of its pairs (see the module's text).

    Args:
        per_pair: ``(P, E)`` every pair's score of every edge (the run's score of an edge is their mean over P).
        sizes: the circuit sizes (edges) to compare at, e.g. the faithfulness curve's.
        size: the chosen circuit's size (its survival and stable share are measured there; added to ``sizes``).
        resamples: B ≥ 2; seed: the resamples' seed (numpy's ``default_rng``).
    Returns:
        :class:`BootstrapReport`.
    Raises:
        ValueError: naming the argument: fewer than 2 resamples, no pair, a size outside 1 … E.
    """
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 2:
        raise ValueError(f"resamples: expected at least 2, got {resamples!r}")
    if per_pair.dim() != 2 or per_pair.shape[0] < 1:
        raise ValueError(f"per_pair: expected (pairs, edges) with at least one pair, got {tuple(per_pair.shape)}")
    P, E = per_pair.shape
    every = sorted({int(n) for n in [*sizes, size]})
    if every[0] < 1 or every[-1] > E:
        raise ValueError(f"sizes: expected circuit sizes in 1 … {E} edges, got {every}")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, P, size=(resamples, P))
    counts = np.zeros((resamples, P))
    np.add.at(counts, (np.arange(resamples)[:, None], draws), 1.0)
    scores = torch.from_numpy(counts / P) @ per_pair.double()  # (B, E) each resample's mean over its pairs
    lo, hi = np.percentile(scores.numpy(), INTERVAL, axis=0)
    order = torch.argsort(scores.abs(), dim=1, descending=True, stable=True)  # (B, E)
    # the run's own ranking, as find_circuit's faithfulness curve makes it (the mean in the scores' dtype)
    base_order = torch.argsort(per_pair.mean(0).abs(), descending=True, stable=True)
    report = BootstrapReport(
        resamples=resamples, pairs=P, seed=seed, interval=list(INTERVAL), sizes=every, jaccard=[], jaccard_min=[],
        jaccard_pairwise=[], size=int(size),
    )  # fmt: skip
    for n in every:
        member = torch.zeros(resamples, E)
        member.scatter_(1, order[:, :n], 1.0)  # (B, E) each resample's circuit of n edges
        mine = torch.zeros(E)
        mine[base_order[:n]] = 1.0
        inter = (member @ mine).double()  # (B,) shared edges: whole numbers, exact in float32 below 2^24 edges
        jac = inter / (2 * n - inter)
        report["jaccard"].append(float(jac.mean()))
        report["jaccard_min"].append(float(jac.min()))
        both = (member @ member.T).double()  # (B, B) shared edges of every two resamples
        pair = both / (2 * n - both)
        off = ~torch.eye(resamples, dtype=torch.bool)
        report["jaccard_pairwise"].append(float(pair[off].mean()))
        if n == size:
            survival = member.double().mean(0)  # (E,)
            report["circuit_jaccard"] = report["jaccard"][-1]
            report["stable_share"] = float((survival[base_order[:n]] >= STABLE).double().mean())
    report["low"], report["high"], report["survival"] = lo, hi, survival.numpy()
    return report
