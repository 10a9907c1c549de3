"""The metrics a circuit is measured by: logit difference, answer probability, KL divergence to the clean run.

Shape legend: N rows of a (patched) batch — J copies of the P prompt pairs, pair-minor (row ``j·P + p``) —,
L length, V vocabulary.

Each is ``fn(logits (N, L, V)) -> (N,)`` at one position (the last by default), as
:class:`headwise.patching.LogitDifference` (Wang et al. 2022's logit difference). The answer probability is
``softmax(logits)[answer]``; the KL divergence is ``KL(p_clean ‖ p) = Σ_v p_clean (log p_clean − log p)`` with
``p_clean`` the clean run's distribution of the same pair (Conmy et al. 2023; Hanna et al. 2024): 0 on the
clean run itself, where its gradient vanishes too, so edge attribution with KL needs integrated gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from headwise.checks import one_of
from headwise.patching.metric import LogitDifference

__all__ = ["METRICS", "AnswerProbability", "KLToClean", "make_metric"]

METRICS = ("logit_diff", "prob", "kl")


def _rows(values: Tensor, N: int) -> Tensor:
    P = values.shape[0]
    if N % P:
        raise ValueError(f"logits: expected a batch of a multiple of {P} rows (one per prompt pair), got {N}")
    return values.repeat(N // P, *([1] * (values.dim() - 1)))


@dataclass(frozen=True)
class AnswerProbability:
    """``softmax(logits[row, position])[answer]`` with one answer id per pair."""

    answer: tuple[int, ...]
    position: int = -1

    def __call__(self, logits: Tensor) -> Tensor:
        N = logits.shape[0]
        a = _rows(torch.tensor(self.answer, device=logits.device), N)  # (N,)
        p = torch.softmax(logits[:, self.position].float(), -1)  # (N, V)
        return p[torch.arange(N, device=logits.device), a]


class KLToClean:
    """``KL(p_clean ‖ p)`` at ``position``; ``clean_logits (P, V)`` the clean run's logits there."""

    def __init__(self, clean_logits: Tensor, position: int = -1):
        self.reference = torch.log_softmax(clean_logits.detach().float(), -1)  # (P, V)
        self.position = position

    def __call__(self, logits: Tensor) -> Tensor:
        ref = _rows(self.reference.to(logits.device), logits.shape[0])  # (N, V)
        logp = torch.log_softmax(logits[:, self.position].float(), -1)  # (N, V)
        return (ref.exp() * (ref - logp)).sum(-1)


def make_metric(name: str, answer, wrong, clean_logits: Tensor | None = None, *, position: int = -1):
    """The metric named ``name`` (:data:`METRICS`) for one (answer, wrong) id per pair; ``clean_logits (P, V)``
    at ``position`` for ``"kl"``."""
    one_of("metric", name, METRICS)
    if name == "logit_diff":
        return LogitDifference(tuple(answer), tuple(wrong), position)
    if name == "prob":
        return AnswerProbability(tuple(answer), position)
    if clean_logits is None:
        raise ValueError("clean_logits: the KL metric needs the clean run's logits")
    return KLToClean(clean_logits, position)
