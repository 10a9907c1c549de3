"""Per-head previous-token and induction scores of a lab model, measured while it trains.

The detectors are :mod:`headwise.analysis.detectors`' (TransformerLens's patterns, the share of a head's
attention on the pattern over the queries that have a target): ``prev`` — query i → key i − 1;
``induction`` — query i → the token *after* an earlier copy of the current token ("[A][B] … [A] → [B]",
Olsson et al. 2022). Here each sequence's score is averaged over the batch (sequences without a target
left out).

Shape legend: B batch, N layers, H heads, L sequence length.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

from headwise.analysis.detectors import induction_pattern, pattern_score, previous_token_pattern

__all__ = ["head_scores"]


def head_scores(weights: list[Tensor], ids: Tensor) -> dict[str, list[list[float]]]:
    """Previous-token and induction scores of every head: ``{"prev": [[…H] …N], "induction": …}``.

    Args:
        weights: per layer ``(B, H, L, L)`` (as ``TransformerLM(..., need_weights=True)`` returns).
        ids: ``(B, L)`` the token ids they were computed on.
    """
    t = ids.detach().cpu().numpy()
    patterns = {"prev": previous_token_pattern(np.ones(t.shape, dtype=bool)), "induction": induction_pattern(t)}
    out = {}
    for name, pattern in patterns.items():
        per_layer = []
        for w in weights:
            scores = pattern_score(w.detach().cpu().numpy(), pattern)  # (B, H), NaN where no target
            per_layer.append(
                np.nanmean(scores, axis=0).tolist() if np.isfinite(scores).any() else [float("nan")] * scores.shape[1]
            )
        out[name] = per_layer
    return out
