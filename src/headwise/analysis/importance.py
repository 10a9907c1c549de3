"""Head importance (Michel et al. 2019), the measured effect of removing each head, and pruning curves.

Shape legend: B batch, L padded length, NL layers, H heads per layer, N = NL · H, D model width, V vocabulary.

Michel et al. ("Are Sixteen Heads Really Better than One?", 2019) put a gate ξ_h on every head — the
head's output is multiplied by ξ_h where the heads enter the output projection — and define a head's
importance as the expected sensitivity of the loss to its gate at ξ = 1,

    I_h = E_x | ∂L(x) / ∂ξ_h |,

a first-order estimate of what removing the head (ξ_h: 1 → 0) costs. Here x is one sequence of the
corpus, and one backward pass gives every sequence's gradient (one gate per sequence and head). As
Michel et al. do before pruning, the importances of each layer are also normalised by their ℓ2 norm
(``importance_norm``).

**The objective** depends on the model:

- a causal LM: ``L(x)`` is the mean next-token cross-entropy (nats) over the sequence's tokens;
- an encoder without an LM head (all-MiniLM-L6-v2 is a sentence embedder): the change of the
  mean-pooled sentence embedding e(x), ``L(x) = 1 − cos(e_ξ(x), e(x))`` against the intact model. At
  ξ = 1 this loss is at its minimum (0), so its gradient is 0 for every head; the importance is then
  the first-order rate at which the embedding *turns* when the gate moves,
  ``I_h = E_x ‖(I − ê êᵀ) ∂e/∂ξ_h‖ / ‖e‖`` (radians per unit of gate; for small changes
  ``1 − cos ≈ θ²/2``), computed exactly with forward-mode differentiation, one pass per head.

**Measured ablation**: the objective with one head removed (ξ_h = 0, every other gate 1), minus the
intact model's. **Pruning curve**: the objective with the k least important heads removed, for k from 0
to N — heads ordered by ``importance_norm`` (Michel et al.'s order), by measured ablation, and at
random (several seeds: mean, min and max).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from headwise.checks import positive_int

__all__ = ["ImportanceResult", "head_importance", "objective", "pruning_steps", "OBJECTIVES"]

#: What the objective is, by model kind.
OBJECTIVES = {
    "decoder": "next-token cross-entropy (nats per token)",
    "encoder": "1 − cos(mean-pooled sentence embedding, intact model's)",
}

Progress = Callable[[str, int, int], None]


@dataclass
class ImportanceResult:
    """Importance, ablation and pruning curves of every head.

    Attributes:
        kind: ``"decoder"`` or ``"encoder"``; objective: what the loss is (:data:`OBJECTIVES`).
        importance: ``(NL, H)`` Michel et al.'s ``E_x |∂L/∂ξ_h|`` (encoders: the embedding's turning rate).
        importance_norm: ``(NL, H)`` the same, divided by its layer's ℓ2 norm.
        base_loss: the intact model's objective.
        ablation: ``(NL, H)`` objective with that head alone removed, minus ``base_loss``.
        removed: ``(K,)`` heads removed at each point of the curves.
        curves: name → ``(K,)`` objective: ``"importance"``, ``"ablation"``, ``"random_mean"``,
            ``"random_min"``, ``"random_max"``.
        random_seeds: the seeds of the random orders.
        num_sequences, num_tokens: what was measured on.
    """

    kind: str
    objective: str
    importance: np.ndarray
    importance_norm: np.ndarray
    base_loss: float
    ablation: np.ndarray
    removed: np.ndarray
    curves: dict[str, np.ndarray]
    random_seeds: tuple[int, ...]
    num_sequences: int
    num_tokens: int

    def csv_rows(self) -> list[dict]:
        """One dict per point of the pruning curves."""
        return [
            {"removed": int(k)} | {name: float(v[i]) for name, v in self.curves.items()}
            for i, k in enumerate(self.removed)
        ]

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "objective": self.objective,
            "base_loss": self.base_loss,
            "num_sequences": self.num_sequences,
            "num_tokens": self.num_tokens,
            "random_seeds": list(self.random_seeds),
            "importance": self.importance.tolist(),
            "importance_norm": self.importance_norm.tolist(),
            "ablation": self.ablation.tolist(),
            "pruning": self.csv_rows(),
        }


def _decoder_losses(logits, ids, mask):
    """Per-sequence mean next-token cross-entropy ``(B,)`` and the tokens counted ``(B,)``."""
    import torch

    targets = ids[:, 1:]  # (B, L − 1)
    keep = (mask[:, 1:] > 0) & (mask[:, :-1] > 0)  # (B, L − 1)
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2).float(), targets, reduction="none")
    count = keep.sum(dim=1)  # (B,)
    return (ce * keep).sum(dim=1) / count.clamp(min=1), count


def _pooled(hidden, mask):
    """Mean of the real tokens' vectors: ``(B, D)`` (sentence-transformers' mean pooling)."""
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)


def objective(hm, batches: Sequence, *, reference=None) -> tuple[float, int]:
    """The objective of :func:`head_importance` on ``batches`` under the gates / ablation now active.

    Args:
        hm: a :class:`~headwise.models.HeadModel`.
        batches: ``(ids, mask)`` pairs.
        reference: encoders: the intact model's pooled embeddings, one ``(B, D)`` per batch.
    Returns:
        ``(loss, tokens)``: decoders, cross-entropy averaged over all predicted tokens; encoders, the mean
        over sentences of ``1 − cos``.
    """
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for k, (ids, mask) in enumerate(batches):
            out = hm.forward(ids, mask)
            if hm.kind == "decoder":
                losses, n = _decoder_losses(out, ids, mask)
                total += float((losses * n).sum())
                count += int(n.sum())
            else:
                e = _pooled(out, mask)
                total += float((1 - torch.nn.functional.cosine_similarity(e, reference[k], dim=-1)).sum())
                count += ids.shape[0]
    return total / max(count, 1), count


def _decoder_importance(hm, batches, progress) -> tuple[np.ndarray, int]:
    import torch

    grads = []
    for k, (ids, mask) in enumerate(batches):
        gates = torch.ones((ids.shape[0], hm.num_layers, hm.num_heads), requires_grad=True)  # (B, NL, H)
        with hm.gated(gates):
            losses, n = _decoder_losses(hm.forward(ids, mask), ids, mask)
        losses.sum().backward()  # sequence b's loss depends only on its own gates: per-example gradients
        grads.append(gates.grad.abs()[n > 0])
        progress("importance", k + 1, len(batches))
    g = torch.cat(grads)  # (sequences, NL, H)
    return g.mean(dim=0).numpy(), g.shape[0]


def _encoder_importance(hm, batches, references, progress) -> tuple[np.ndarray, int]:
    """Forward-mode ∂e/∂ξ_h: one pass per layer, the batch repeated once per head, each copy's
    tangent on a different head (per-sequence gates), so H directional derivatives share one pass."""
    import torch
    import torch.autograd.forward_ad as fwad

    nl, h = hm.num_layers, hm.num_heads
    total = np.zeros((nl, h))
    sequences = 0
    done = 0
    with torch.no_grad():
        for (ids, mask), e in zip(batches, references):
            b = ids.shape[0]
            ids_r, mask_r = ids.repeat(h, 1), mask.repeat(h, 1)  # (H·B, L): copy r is for head r
            e_r = e.repeat(h, 1)  # (H·B, D)
            unit = e_r / e_r.norm(dim=-1, keepdim=True)
            for layer in range(nl):
                tangent = torch.zeros((h * b, nl, h))
                for r in range(h):
                    tangent[r * b : (r + 1) * b, layer, r] = 1.0
                with fwad.dual_level():
                    gates = fwad.make_dual(torch.ones_like(tangent), tangent)
                    with hm.gated(gates):
                        pooled = _pooled(hm.forward(ids_r, mask_r, math_path=True), mask_r)
                    de = fwad.unpack_dual(pooled).tangent  # (H·B, D): ∂e/∂ξ of copy r's head
                turn = de - (de * unit).sum(-1, keepdim=True) * unit  # the part orthogonal to e
                rate = (turn.norm(dim=-1) / e_r.norm(dim=-1)).reshape(h, b)  # (H, B)
                total[layer] += rate.sum(dim=1).numpy()
                done += 1
                progress("importance", done, len(batches) * nl)
            sequences += b
    return total / max(sequences, 1), sequences


def pruning_steps(n: int, points: int = 33) -> np.ndarray:
    """Heads removed at each point of a curve: every k in 0 … n when n < points, else ``points`` evenly spaced."""
    if n + 1 <= points:
        return np.arange(n + 1)
    return np.unique(np.linspace(0, n, points).round().astype(np.int64))


def head_importance(
    hm,
    batches: Sequence,
    *,
    random_orders: int = 3,
    seed: int = 0,
    points: int = 33,
    ablate: Callable | None = None,
    progress: Progress | None = None,
) -> ImportanceResult:
    """Importance, single-head ablation and pruning curves of every head of ``hm``.

    Args:
        hm: a :class:`~headwise.models.HeadModel`.
        batches: ``(ids (B, L), mask (B, L))`` long tensors (right padding).
        random_orders: random removal orders (seeds ``seed``, ``seed + 1``, …).
        seed: the first random order's seed.
        points: most points per pruning curve (see :func:`pruning_steps`).
        ablate: ``ablate(heads: dict[int, list[int]])`` → a context manager removing those heads (default:
            the model's gates at 0; Hugging Face models pass ``headwise.hf.ablate`` with ``mode="zero"``).
        progress: ``progress(stage, done, total)``, called as work advances.
    Returns:
        :class:`ImportanceResult`.
    Raises:
        ValueError: no batch, ``random_orders`` < 1.
    """
    import torch

    if not batches:
        raise ValueError("batches: expected at least one batch, got none")
    positive_int("random_orders", random_orders)
    progress = progress or (lambda *_: None)
    nl, h = hm.num_layers, hm.num_heads
    n = nl * h

    def remove(heads: Sequence[int]):
        spec: dict[int, list[int]] = {}
        for flat in heads:
            spec.setdefault(int(flat) // h, []).append(int(flat) % h)
        if ablate is not None:
            return ablate(spec)
        gates = torch.ones((nl, h))
        for layer, hs in spec.items():
            gates[layer, hs] = 0.0
        return hm.gated(gates)

    references = None
    if hm.kind == "encoder":
        with torch.no_grad():
            references = [_pooled(hm.forward(ids, mask), mask) for ids, mask in batches]
    base, tokens = objective(hm, batches, reference=references)
    if hm.kind == "decoder":
        importance, sequences = _decoder_importance(hm, batches, progress)
    else:
        importance, sequences = _encoder_importance(hm, batches, references, progress)
    norms = np.linalg.norm(importance, axis=1, keepdims=True)  # (NL, 1)
    importance_norm = np.divide(importance, norms, out=np.zeros_like(importance), where=norms > 0)

    ablation = np.zeros(n)
    for flat in range(n):
        with remove([flat]):
            ablation[flat] = objective(hm, batches, reference=references)[0] - base
        progress("ablation", flat + 1, n)

    steps = pruning_steps(n, points)
    orders = {
        "importance": np.argsort(importance_norm.ravel(), kind="stable"),
        "ablation": np.argsort(ablation, kind="stable"),
    }
    seeds = tuple(seed + r for r in range(random_orders))
    for s in seeds:
        orders[f"random{s}"] = np.random.default_rng(s).permutation(n)
    total = len(orders) * len(steps)
    curves: dict[str, np.ndarray] = {}
    done = 0
    for name, order in orders.items():
        values = np.zeros(len(steps))
        for i, k in enumerate(steps):
            if k == 0:
                values[i] = base
            else:
                with remove(order[:k]):
                    values[i] = objective(hm, batches, reference=references)[0]
            done += 1
            progress("pruning", done, total)
        curves[name] = values
    random = np.stack([curves.pop(f"random{s}") for s in seeds])  # (orders, K)
    curves["random_mean"] = random.mean(axis=0)
    curves["random_min"] = random.min(axis=0)
    curves["random_max"] = random.max(axis=0)
    if not math.isfinite(base):
        raise ValueError(f"the intact model's objective is not finite ({base})")
    return ImportanceResult(
        kind=hm.kind,
        objective=OBJECTIVES[hm.kind],
        importance=importance,
        importance_norm=importance_norm,
        base_loss=base,
        ablation=ablation.reshape(nl, h),
        removed=steps,
        curves=curves,
        random_seeds=seeds,
        num_sequences=sequences,
        num_tokens=tokens,
    )
