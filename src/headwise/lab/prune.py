"""Head importance and pruning on a lab model, after Michel et al. 2019 ("Are Sixteen Heads Really
Better than One?").

Each head h's output is multiplied by a gate ξ_h (1 = kept). Its importance is the expected absolute
sensitivity of the loss to the gate, ``I_h = E_x |∂L(x)/∂ξ_h|`` (their eq. 2), estimated on batches,
and normalised by the ℓ2 norm of the importances within each layer (their §4.1). Heads are then removed
(ξ_h = 0) in order of increasing importance, and the loss measured after each removal — against the
same curve for random orders.

Shape legend: B batch, L sequence length, N layers, H heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from headwise.lab.trainer import masked_loss
from headwise.models.transformer_lm import TransformerLM

__all__ = ["head_importance", "masked_loss_with_heads", "PruningCurves", "pruning_curves"]

Batch = tuple[Tensor, Tensor, Tensor]


def head_importance(model: TransformerLM, batches: list[Batch], *, normalise: bool = True) -> Tensor:
    """Michel et al.'s importance ``(N, H)``: mean over examples of ``|∂L/∂ξ_h|``.

    Args:
        model: a lab model.
        batches: ``(inputs (B, L), targets (B, L), scored (B, L))`` triples; every example (row) is
            one ``x`` of the expectation.
        normalise: divide each layer's importances by their ℓ2 norm (Michel et al. §4.1).
    """
    N, H = model.config.num_layers, model.config.num_heads
    total, count = torch.zeros(N, H, dtype=torch.float64), 0
    was_training = model.training
    model.eval()
    try:
        for inputs, targets, scored in batches:
            for b in range(inputs.shape[0]):
                gates = torch.ones(N, H, requires_grad=True)
                logits = model(inputs[b : b + 1], head_mask=gates)  # (1, L, V)
                loss = masked_loss(logits, targets[b : b + 1], scored[b : b + 1])
                (grad,) = torch.autograd.grad(loss, gates)
                total += grad.abs().double()
                count += 1
    finally:
        model.train(was_training)
    importance = total / max(count, 1)
    if normalise:
        importance = importance / importance.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return importance.float()


@torch.no_grad()
def masked_loss_with_heads(model: TransformerLM, batches: list[Batch], gates: Tensor) -> float:
    """The mean loss over ``batches`` (weighted by scored tokens) with heads gated by ``gates (N, H)``."""
    total, tokens = 0.0, 0
    for inputs, targets, scored in batches:
        n = int(scored.sum())
        total += float(masked_loss(model(inputs, head_mask=gates), targets, scored)) * n
        tokens += n
    return total / max(tokens, 1)


@dataclass
class PruningCurves:
    """Loss after removing 0 … N·H heads.

    Attributes:
        importance: ``(N, H)`` normalised importances.
        order: heads ``(layer, head)`` in removal order, least important first.
        by_importance: loss after removing the first k heads of ``order``, k = 0 … N·H.
        random: one such curve per random order.
    """

    importance: list[list[float]]
    order: list[tuple[int, int]]
    by_importance: list[float]
    random: list[list[float]]

    @property
    def random_mean(self) -> list[float]:
        return np.mean(np.array(self.random), axis=0).tolist()


def _curve(model, batches, order) -> list[float]:
    N, H = model.config.num_layers, model.config.num_heads
    gates = torch.ones(N, H)
    losses = [masked_loss_with_heads(model, batches, gates)]
    for n, h in order:
        gates[n, h] = 0.0
        losses.append(masked_loss_with_heads(model, batches, gates))
    return losses


def pruning_curves(
    model: TransformerLM,
    importance_batches: list[Batch],
    eval_batches: list[Batch],
    *,
    random_orders: int = 5,
    seed: int = 0,
) -> PruningCurves:
    """Importance on ``importance_batches``; losses on ``eval_batches`` (held out) as heads go.

    Args:
        random_orders: how many random removal orders to compare with.
        seed: seeds the random orders.
    """
    importance = head_importance(model, importance_batches)
    N, H = importance.shape
    flat = importance.flatten().argsort().tolist()  # least important first
    order = [(i // H, i % H) for i in flat]
    rng = np.random.default_rng(seed)
    randoms = []
    for _ in range(random_orders):
        perm = rng.permutation(N * H).tolist()
        randoms.append(_curve(model, eval_batches, [(i // H, i % H) for i in perm]))
    return PruningCurves(
        importance=importance.tolist(), order=order, by_importance=_curve(model, eval_batches, order), random=randoms
    )
