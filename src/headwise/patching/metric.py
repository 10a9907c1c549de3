"""The metric patching measures: logit(answer) − logit(wrong) at one position (Wang et al. 2022).

Shape legend: N rows of a (patched) batch, P prompt pairs, L length, V vocabulary.

A metric is any ``fn(logits (N, L, V)) -> (N,)``. Patching runs J patched copies of the P prompt pairs as one
batch, rows ordered pair-minor (row ``j·P + p`` is copy j of pair p), so a metric with one answer per pair
repeats its answers over the copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LogitDifference", "logit_difference", "reads_last_position"]


@dataclass(frozen=True)
class LogitDifference:
    """``logits[row, position, answer] − logits[row, position, wrong]`` with one (answer, wrong) per pair.

    Attributes:
        answer, wrong: token ids, one per prompt pair (P of each).
        position: the query position read (negative counts from the end).
    """

    answer: tuple[int, ...]
    wrong: tuple[int, ...]
    position: int = -1

    def __call__(self, logits: Tensor) -> Tensor:
        """``logits (N, L, V)`` with N a multiple of P -> ``(N,)``."""
        N, _, V = logits.shape
        P = len(self.answer)
        if N % P:
            raise ValueError(f"logits: expected a batch of a multiple of {P} rows (one per prompt pair), got {N}")
        a = torch.tensor(self.answer, device=logits.device).repeat(N // P)  # (N,)
        w = torch.tensor(self.wrong, device=logits.device).repeat(N // P)  # (N,)
        last = logits[:, self.position, :]  # (N, V)
        rows = torch.arange(N, device=logits.device)
        return last[rows, a] - last[rows, w]  # (N,)


def _ids(name: str, value) -> tuple[int, ...]:
    if isinstance(value, Tensor):
        value = value.reshape(-1).tolist()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, Sequence) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise TypeError(f"{name}: expected a token id or a non-empty sequence of token ids, got {value!r}")


def logit_difference(answer, wrong, *, position: int = -1) -> LogitDifference:
    """The metric logit(answer) − logit(wrong) at ``position`` (default: the last).

    Args:
        answer, wrong: a token id, or one per prompt pair (sequences or 1-D tensors of equal length).
        position: the query position read.
    Raises:
        TypeError: not ids; ValueError: lengths differ, negative ids, or answer equals wrong for a pair.
    """
    a, w = _ids("answer", answer), _ids("wrong", wrong)
    if len(a) != len(w):
        raise ValueError(f"wrong: expected {len(a)} token ids (one per answer), got {len(w)}")
    if min(a + w) < 0:
        raise ValueError(f"answer / wrong: expected token ids ≥ 0, got {a} and {w}")
    same = [i for i, (x, y) in enumerate(zip(a, w)) if x == y]
    if same:
        raise ValueError(f"wrong: the same token id as the answer ({a[same[0]]}) for pair {same[0]}")
    if isinstance(position, bool) or not isinstance(position, int):
        raise TypeError(f"position: expected an int, got {position!r}")
    return LogitDifference(a, w, position)


def reads_last_position(metric) -> bool:
    """Whether ``metric`` declares that it reads the last position alone (a ``position`` attribute of -1), so
    that a run may compute the last position's logits only."""
    return getattr(metric, "position", None) == -1
