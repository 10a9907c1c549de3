"""The lab's trainer: AdamW, linear warmup then cosine decay, gradient clipping, seeds, a thread count.

It draws no terminal UI: it reports every step to a ``callback`` (the command line turns that into a
progress bar) and writes no file (saving is the caller's, after training — so Ctrl-C during training
leaves nothing on disk).

A task is a function ``batch(rng) -> (inputs (B, L), targets (B, L), scored (B, L) bool)``: the model
reads ``inputs`` and is scored with cross-entropy on the positions where ``scored`` is True (logits at
position t against ``targets[:, t]``). :func:`lm_batches` makes next-token prediction one such task.

Shape legend: B batch, L sequence length, V vocabulary (or number of classes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headwise import checks

__all__ = ["TrainConfig", "Progress", "TrainResult", "train", "lm_batches", "masked_loss", "lr_factor", "threads"]

Batch = tuple[Tensor, Tensor, Tensor]


@dataclass(frozen=True)
class TrainConfig:
    """How to train.

    Attributes:
        steps: optimiser steps.
        lr: peak learning rate of AdamW (Loshchilov & Hutter 2019).
        warmup: steps of linear warmup from ``lr / warmup`` to ``lr``.
        final_lr_ratio: the cosine decay ends at ``lr · final_lr_ratio`` on the last step.
        weight_decay: AdamW's decoupled weight decay (on matrices and embeddings, not on biases or norms).
        betas: AdamW's betas.
        grad_clip: clip the global gradient norm to this (None: no clipping).
        seed: seeds the data generator (NumPy) and dropout (torch) of this run.
        eval_every: call ``evaluate`` every this many steps (and after the last step).
    """

    steps: int
    lr: float = 3e-3
    warmup: int = 100
    final_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float | None = 1.0
    seed: int = 0
    eval_every: int = 100

    def __post_init__(self):
        checks.positive_int("steps", self.steps)
        checks.positive_number("lr", self.lr)
        checks.non_negative_int("warmup", self.warmup)
        checks.non_negative_int("seed", self.seed)
        checks.positive_int("eval_every", self.eval_every)
        if not 0 <= self.final_lr_ratio <= 1:
            raise ValueError(f"final_lr_ratio: expected a number in [0, 1], got {self.final_lr_ratio!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay: expected a non-negative number, got {self.weight_decay!r}")
        if self.grad_clip is not None:
            checks.positive_number("grad_clip", self.grad_clip)

    def to_dict(self) -> dict:
        return asdict(self)


def lr_factor(step: int, config: TrainConfig) -> float:
    """The learning rate at optimiser step ``step`` (0-based) as a fraction of ``config.lr``."""
    if config.warmup and step < config.warmup:
        return (step + 1) / config.warmup
    span = max(1, config.steps - 1 - config.warmup)
    progress = min(1.0, (step - config.warmup) / span)
    return config.final_lr_ratio + (1 - config.final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class Progress:
    """What the trainer reports after each step.

    Attributes:
        step: steps done (1 … steps).
        steps: the budget.
        loss: this step's training loss (nats per scored token).
        tokens_per_s: input tokens per second so far.
        elapsed_s: seconds since training began.
        lr: the learning rate of this step.
        evaluation: ``evaluate``'s result when it ran at this step, else None.
    """

    step: int
    steps: int
    loss: float
    tokens_per_s: float
    elapsed_s: float
    lr: float
    evaluation: dict | None = None


@dataclass
class TrainResult:
    """The record of a run: ``history`` holds one dict per evaluation (``step``, ``train_loss`` — the mean
    training loss since the previous evaluation — ``elapsed_s`` and ``evaluate``'s keys)."""

    steps: int
    seconds: float
    tokens: int
    history: list[dict] = field(default_factory=list)

    @property
    def final(self) -> dict:
        return self.history[-1] if self.history else {}


@contextmanager
def threads(n: int | None):
    """Run with ``torch.set_num_threads(n)`` (None: leave it), restoring the previous count after."""
    if n is None:
        yield
        return
    checks.positive_int("threads", n)
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def masked_loss(logits: Tensor, targets: Tensor, scored: Tensor) -> Tensor:
    """Mean cross-entropy of ``logits (B, L, V)`` against ``targets (B, L)`` over the ``scored (B, L)`` positions."""
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")  # (B·L,)
    mask = scored.flatten()
    return per_token[mask].mean()


def lm_batches(make: Callable[[np.random.Generator], Tensor]) -> Callable[[np.random.Generator], Batch]:
    """A next-token task from a generator of sequences ``x (B, L)``: inputs ``x``, targets ``x`` shifted
    left by one, every position but the last scored."""

    def batch(rng: np.random.Generator) -> Batch:
        x = make(rng)  # (B, L)
        targets = torch.zeros_like(x)
        targets[:, :-1] = x[:, 1:]
        scored = torch.ones_like(x, dtype=torch.bool)
        scored[:, -1] = False
        return x, targets, scored

    return batch


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay on matrices and embeddings (2-D and up), none on biases and LayerNorm gains (GPT-2 / nanoGPT)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def train(
    model: nn.Module,
    batch: Callable[[np.random.Generator], Batch],
    config: TrainConfig,
    *,
    evaluate: Callable[[nn.Module], dict] | None = None,
    callback: Callable[[Progress], None] | None = None,
    num_threads: int | None = None,
) -> TrainResult:
    """Train ``model`` in place on ``batch`` for ``config.steps`` steps.

    Args:
        model: any module mapping inputs ``(B, L)`` to logits ``(B, L, V)``.
        batch: the task (see the module docstring), called with this run's NumPy generator.
        config: the :class:`TrainConfig`.
        evaluate: called with the model in eval mode (under ``torch.no_grad``) every ``eval_every``
            steps and after the last; returns a dict of JSON-serialisable numbers for the history.
        callback: called after every step with a :class:`Progress` (a progress bar, a logger, a stop test).
        num_threads: torch's intra-op threads during training (None: leave as set).
    Returns:
        A :class:`TrainResult`; the model is left in eval mode.
    Raises:
        ValueError: a non-finite loss (the message names the step).
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config: expected a TrainConfig, got {type(config).__name__}")
    rng = np.random.default_rng(config.seed)
    optimiser = torch.optim.AdamW(_param_groups(model, config.weight_decay), lr=config.lr, betas=config.betas)
    result = TrainResult(steps=config.steps, seconds=0.0, tokens=0)
    since_eval: list[float] = []
    with threads(num_threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        start = time.perf_counter()
        model.train()
        for step in range(config.steps):
            lr = config.lr * lr_factor(step, config)
            for group in optimiser.param_groups:
                group["lr"] = lr
            inputs, targets, scored = batch(rng)
            loss = masked_loss(model(inputs), targets, scored)
            if not torch.isfinite(loss):
                raise ValueError(f"training diverged: loss {float(loss)} at step {step + 1} (lower lr?)")
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimiser.step()
            result.tokens += inputs.numel()
            step_loss = loss.item()
            since_eval.append(step_loss)
            done = step + 1
            evaluation = None
            if evaluate is not None and (done % config.eval_every == 0 or done == config.steps):
                model.eval()
                with torch.no_grad():
                    evaluation = dict(evaluate(model))
                model.train()
            elapsed = time.perf_counter() - start
            if evaluation is not None:
                train_loss = sum(since_eval) / len(since_eval)
                result.history.append({"step": done, "train_loss": train_loss, "elapsed_s": elapsed, **evaluation})
                since_eval = []
            if callback is not None:
                callback(
                    Progress(done, config.steps, step_loss, result.tokens / max(elapsed, 1e-9), elapsed, lr, evaluation)
                )
        result.seconds = time.perf_counter() - start
    model.eval()
    return result
