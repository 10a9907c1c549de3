"""Per-head previous-token and induction scores of a lab model, measured while it trains.

A head's score for a pattern is the share of its attention that falls on the pattern, averaged over the
queries that have a target (as TransformerLens's ``detect_head``, "mul" mode, without the queries that
have no target):

- previous-token: query i → key i − 1 (queries i ≥ 1);
- induction: query i → every key j with ``x[j − 1] = x[i]`` and ``j ≤ i`` — the token *after* an earlier
  copy of the current token ("[A][B] … [A] → [B]", Olsson et al. 2022); queries without such a j are
  left out.

Shape legend: B batch, N layers, H heads, L sequence length.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["previous_token_pattern", "induction_pattern", "pattern_score", "head_scores"]


def previous_token_pattern(length: int) -> Tensor:
    """``(L, L)`` bool: query i → key i − 1."""
    return torch.ones(length, length, dtype=torch.bool).tril(-1).triu(-1)


def induction_pattern(ids: Tensor) -> Tensor:
    """``(B, L, L)`` bool: query i → key j when ``ids[j − 1] == ids[i]`` and ``1 ≤ j ≤ i``."""
    B, L = ids.shape
    same = ids[:, :, None] == ids[:, None, :]  # (B, L, L): x[i] == x[j']
    earlier = torch.ones(L, L, dtype=torch.bool).tril(-1)  # j' < i
    dup = same & earlier  # key j' is an earlier copy of query i
    p = torch.zeros_like(dup)
    p[:, :, 1:] = dup[:, :, :-1]  # key j = j' + 1 (≤ i since j' < i)
    return p


def pattern_score(weights: Tensor, pattern: Tensor) -> Tensor:
    """The share of attention on ``pattern``, mean over queries with a target.

    Args:
        weights: ``(B, H, L, L)`` attention weights (rows sum to 1).
        pattern: ``(L, L)`` or ``(B, L, L)`` bool.
    Returns:
        ``(H,)``: for each head, the mean over (batch, query) pairs with a target of the attention mass
        on the pattern; NaN when no query has a target.
    """
    p = pattern.expand(weights.shape[0], *pattern.shape[-2:])  # (B, L, L)
    rows = p.any(dim=-1)  # (B, L) queries with a target
    mass = (weights * p[:, None]).sum(dim=-1)  # (B, H, L)
    count = rows.sum()
    if count == 0:
        return torch.full(weights.shape[1:2], float("nan"))
    return (mass * rows[:, None]).sum(dim=(0, 2)) / count  # (H,)


def head_scores(weights: list[Tensor], ids: Tensor) -> dict[str, list[list[float]]]:
    """Previous-token and induction scores of every head: ``{"prev": [[…H] …N], "induction": …}``.

    Args:
        weights: per layer ``(B, H, L, L)`` (as ``TransformerLM(..., need_weights=True)`` returns).
        ids: ``(B, L)`` the token ids they were computed on.
    """
    prev = previous_token_pattern(ids.shape[1])
    ind = induction_pattern(ids)
    return {
        "prev": [pattern_score(w, prev).tolist() for w in weights],
        "induction": [pattern_score(w, ind).tolist() for w in weights],
    }
