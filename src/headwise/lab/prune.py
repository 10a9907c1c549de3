"""Head importance and pruning on a lab model, after Michel et al. 2019 ("Are Sixteen Heads Really
Better than One?"), through the one implementation (:func:`headwise.analysis.head_importance`).

Each head h's output is multiplied by a gate ξ_h (1 = kept) where the heads meet ``Wo``. Its importance
is the expected absolute sensitivity of the loss to the gate, ``I_h = E_x |∂L(x)/∂ξ_h|`` (their eq. 2),
estimated on batches — every sequence's gradient from one backward pass — and normalised by the ℓ2 norm
of the importances within each layer (their §4.1). Heads are then removed (ξ_h = 0) in order of
increasing importance, and the loss measured after each removal — against random orders. The lab scores
its answer tokens only (``scored="answers"``: the second copy of an induction sequence).

Shape legend: B batch, L sequence length, N layers, H heads.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headwise.analysis.importance import ImportanceResult, gate_importance
from headwise.analysis.importance import head_importance as michel_importance
from headwise.models.sources import lab_head_model
from headwise.models.transformer_lm import TransformerLM

__all__ = ["head_importance", "prune_batches", "pruning_curves"]

Batch = tuple[Tensor, Tensor, Tensor]


def head_importance(model: TransformerLM, batches: list[Batch], *, normalise: bool = True) -> Tensor:
    """Michel et al.'s importance ``(N, H)``: mean over examples of ``|∂L/∂ξ_h|`` on the scored tokens.

    Args:
        model: a lab model.
        batches: ``(inputs (B, L), targets (B, L), scored (B, L))`` triples; every example (row) is
            one ``x`` of the expectation.
        normalise: divide each layer's importances by their ℓ2 norm (Michel et al. §4.1).
    """
    was_training = model.training
    model.eval()
    try:
        importance, _ = gate_importance(lab_head_model(model), batches, scored="answers")
    finally:
        model.train(was_training)
    importance = torch.from_numpy(importance)
    if normalise:
        importance = importance / importance.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return importance.float()


def pruning_curves(
    model: TransformerLM,
    importance_batches: list[Batch],
    eval_batches: list[Batch],
    *,
    random_orders: int = 5,
    seed: int = 0,
    points: int = 1 << 30,
) -> ImportanceResult:
    """Importance on ``importance_batches``; losses on ``eval_batches`` (held out) as heads go.

    Args:
        random_orders: how many random removal orders to compare with (seeds ``seed``, ``seed + 1``, …).
        seed: seeds the random orders.
        points: most points per curve (default: every number of heads removed, 0 … N·H).
    Returns:
        the :class:`~headwise.analysis.importance.ImportanceResult` (``curves["importance"]`` the loss as
        heads go least important first; ``random_curves`` one curve per random order).
    """
    was_training = model.training
    model.eval()
    try:
        return michel_importance(
            lab_head_model(model),
            importance_batches,
            scored="answers",
            eval_batches=eval_batches,
            random_orders=random_orders,
            seed=seed,
            points=points,
        )
    finally:
        model.train(was_training)


def prune_batches(lm: TransformerLM, sequences: int, seed: int, stream: int, *, size: int = 64) -> list[Batch]:
    """``sequences`` held-out induction sequences (:func:`headwise.lab.tasks.induction_probe`, stream ``stream`` of
    ``seed``) in batches of ``size``: ``(inputs (B, L), targets (B, L), scored (B, L))``, the targets the next
    tokens, scored where the next token is in the second copy (tokens 2…n)."""
    import numpy as np

    from headwise.lab.tasks import induction_probe

    ids, copy, _ = induction_probe(
        np.random.default_rng([seed, 1000 + stream]), sequences, length=lm.context_length, vocab_size=lm.vocab_size
    )
    targets = ids.roll(-1, dims=1)  # position t predicts token t + 1
    scored = copy.roll(-1, dims=1)  # … scored where token t + 1 is in the second copy (tokens 2…n)
    scored[:, -1] = False
    return [(ids[i : i + size], targets[i : i + size], scored[i : i + size]) for i in range(0, sequences, size)]
