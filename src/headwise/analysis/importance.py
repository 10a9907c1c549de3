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

**The objective** — which tokens are scored — is the ``scored`` argument (default: by the model's kind):

- ``"next_token"`` (decoders): ``L(x)`` is the mean next-token cross-entropy (nats) over every real token of
  the sequence that has a next one; batches are ``(ids, mask)``;
- ``"answers"`` (decoders, the lab's tasks): the mean cross-entropy over chosen positions only — batches are
  ``(ids, targets, scored)``: position t is scored against ``targets[t]`` where ``scored[t]`` (the lab's
  answers, the second copy of an induction sequence);
- ``"embedding"`` (an encoder without an LM head (all-MiniLM-L6-v2 is a sentence embedder): the change of the
  mean-pooled sentence embedding e(x), ``L(x) = 1 − cos(e_ξ(x), e(x))`` against the intact model. At
  ξ = 1 this loss is at its minimum (0), so its gradient is 0 for every head; the importance is then
  the first-order rate at which the embedding *turns* when the gate moves,
  ``I_h = E_x ‖(I − ê êᵀ) ∂e/∂ξ_h‖ / ‖e‖`` (radians per unit of gate; for small changes
  ``1 − cos ≈ θ²/2``), computed exactly with forward-mode differentiation, one pass per layer.

**Measured ablation**: the objective with one head removed (ξ_h = 0, every other gate 1), minus the
intact model's. **Pruning curve**: the objective with the k least important heads removed, for k from 0
to N — heads ordered by ``importance_norm`` (Michel et al.'s order), by measured ablation, and at
random (several seeds: mean, min and max). Both can be measured on held-out ``eval_batches``. Every ablation and
curve point is a head set run through the batched engine (:mod:`headwise.analysis.batched`, shared with the
patching sweep): J sets as J copies of a batch in one forward, each pass starting at the lowest layer its sets
touch, zero or mean ablation — equal to one forward per set (tested to 1e-5).

Files, one concept each: the objective (:mod:`headwise.analysis.objective`), the gates' importance
(:mod:`headwise.analysis.gates`), the plan of an ablation sweep (:mod:`headwise.analysis.sweep_plan`), measured
ablation through the batched engine (:mod:`headwise.analysis.ablation`); this module puts them together with the
pruning curves.

The model is anything shaped as :class:`headwise.models.HeadModel` (``kind``, ``num_layers``, ``num_heads``,
``forward``, ``gated``): this module runs what it is handed and opens nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from headwise.analysis.ablation import ablation_objectives
from headwise.analysis.gates import decoder_importance, encoder_importance, gate_importance
from headwise.analysis.objective import OBJECTIVES, SCORED, mean_pooled, objective, scoring
from headwise.analysis.protocol import SweptModel
from headwise.checks import one_of, positive_int

__all__ = [
    "ImportanceResult",
    "head_importance",
    "ablation_objectives",
    "gate_importance",
    "objective",
    "order_curves",
    "prefix_sets",
    "pruning_steps",
    "removal_orders",
    "OBJECTIVES",
    "SCORED",
]

Progress = Callable[[str, int, int], None]


@dataclass
class ImportanceResult:
    """Importance, ablation and pruning curves of every head.

    Attributes:
        kind: ``"decoder"`` or ``"encoder"``; objective: what the loss is (:data:`OBJECTIVES`: which tokens
            were scored).
        importance: ``(NL, H)`` Michel et al.'s ``E_x |∂L/∂ξ_h|`` (encoders: the embedding's turning rate).
        importance_norm: ``(NL, H)`` the same, divided by its layer's ℓ2 norm.
        base_loss: the intact model's objective.
        ablation: ``(NL, H)`` objective with that head alone removed, minus ``base_loss``.
        removed: ``(K,)`` heads removed at each point of the curves.
        curves: name → ``(K,)`` objective: ``"importance"``, ``"ablation"``, ``"random_mean"``,
            ``"random_min"``, ``"random_max"``.
        random_seeds: the seeds of the random orders.
        num_sequences, num_tokens: what the importance was estimated on (sequences), the objective measured on
            (scored tokens; sentences for encoders).
        order: ``(N,)`` flat head numbers ``layer · H + head`` in Michel et al.'s removal order (least
            important first by ``importance_norm``).
        random_curves: ``(orders, K)`` the objective along each random order.
        sweep: what the ablations and curves ran (:class:`~headwise.analysis.batched.SweepCost` as a dict, with
            ``mode``, ``head_sets`` measured and ``seconds_total``).
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
    order: np.ndarray | None = None
    random_curves: np.ndarray | None = None
    sweep: dict = field(default_factory=dict)

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
            "sweep": dict(self.sweep),
        }


def pruning_steps(n: int, points: int = 33) -> np.ndarray:
    """Heads removed at each point of a curve: every k in 0 … n when n < points, else ``points`` evenly spaced."""
    if n + 1 <= points:
        return np.arange(n + 1)
    return np.unique(np.linspace(0, n, points).round().astype(np.int64))


def _spec(heads: Sequence[int], h: int) -> dict[int, list[int]]:
    """``{layer: [head, …]}`` of flat head numbers ``layer · H + head``."""
    spec: dict[int, list[int]] = {}
    for flat in heads:
        spec.setdefault(int(flat) // h, []).append(int(flat) % h)
    return spec


def head_importance(
    hm: SweptModel,
    batches: Sequence,
    *,
    scored: str | None = None,
    eval_batches: Sequence | None = None,
    random_orders: int = 3,
    seed: int = 0,
    points: int = 33,
    ablate: Callable | None = None,
    mode: str = "zero",
    copies: int | None = None,
    memory: int | None = None,
    progress: Progress | None = None,
    reduce: Callable[[np.ndarray], np.ndarray] | None = None,
    stages: Callable | None = None,
) -> ImportanceResult:
    """Importance, single-head ablation and pruning curves of every head of ``hm``.

    The ablations and every point of the curves run through the batched engine (:func:`ablation_objectives`): J
    head sets as J copies of each batch in one forward, each pass starting at the lowest layer its sets touch;
    distinct head sets only (the last point, every head removed, is one set for all orders; no removal is the
    intact objective). The intact objective comes from the gates' forward when ``eval_batches`` is ``batches``.

    Args:
        hm: a :class:`~headwise.models.HeadModel`.
        batches: what the importance is estimated on: ``(ids (B, L), mask (B, L))`` long tensors (right
            padding), or ``(ids, targets, scored)`` for ``scored="answers"``.
        scored: which tokens are scored — ``"next_token"``, ``"answers"`` or ``"embedding"`` (:data:`SCORED`;
            default: ``"next_token"`` for decoders, ``"embedding"`` for encoders).
        eval_batches: what the objective, the ablation and the pruning curves are measured on (held out;
            default: ``batches``).
        random_orders: random removal orders (seeds ``seed``, ``seed + 1``, …).
        seed: the first random order's seed.
        points: most points per pruning curve (see :func:`pruning_steps`).
        ablate: ``ablate(heads: dict[int, list[int]])`` → a context manager removing those heads: given, the
            ablations and curves run one forward per head set through it (the reference path) instead of the
            batched engine.
        mode: the batched engine's removal: ``"zero"`` (ξ_h = 0) or ``"mean"`` (the head's mean output over the
            batch's real positions).
        copies, memory: the batched engine's head sets per pass and its memory budget (see
            :func:`ablation_objectives`; default: from the free memory).
        progress: ``progress(stage, done, total)``, called as work advances: ``"importance"`` in batches,
            ``"ablation"`` and ``"pruning"`` in forward passes.
        reduce: a data-parallel run's reduction, ``reduce(sums (n,) float64) -> (n,)`` the sums over every process
            (e.g. an all-reduce; each process holds its own share of ``batches`` and ``eval_batches``): the
            importance's and the objective's sums and counts, then the single-head ablations' sums, then the pruning
            sets' sums (their orders depend on the reduced importance and ablation) go through it before they are
            divided (each sum this process's mean × its count, float64). Default: one process (no reduction).
        stages: a resumable run's hold on this process's three pieces of work, ``stages(name, work, sets)`` → what
            ``work()`` returns, computed or kept from an earlier run: ``"importance"`` (``sets`` None) →
            ``(importance (NL, H), sequences, base loss, tokens)`` — the gates' pass and the intact objective;
            ``"ablation"`` and ``"pruning"`` → ``(len(sets),)`` the objective with each head set of ``sets``
            removed (:func:`headwise.study.importance_across_ranks` keeps them by batch). Default: ``work()``.
    Returns:
        :class:`ImportanceResult`; ``sweep`` says what the engine ran (passes, copies per pass, memory budget,
        forward equivalents, seconds).
    Raises:
        ValueError: no batch, ``random_orders`` < 1, a ``scored`` that does not fit the model's kind, an unknown
            ``mode``.
    """
    import time

    scored, same, eval_batches = _checked(hm, batches, scored, eval_batches, random_orders, mode)
    t0 = time.perf_counter()
    sweep = _Sweep(hm, batches, eval_batches, scored=scored, ablate=ablate, mode=mode, copies=copies, memory=memory,
                   progress=progress or (lambda *_: None), reduce=reduce,
                   run=stages if stages is not None else (lambda name, work, sets: work()))  # fmt: skip
    importance, sequences, base, tokens = sweep.gates_and_intact(same)
    norms = np.linalg.norm(importance, axis=1, keepdims=True)  # (NL, 1)
    importance_norm = np.divide(importance, norms, out=np.zeros_like(importance), where=norms > 0)
    ablation = sweep.pooled(sweep.measure([(flat,) for flat in range(sweep.n)], "ablation")) - base
    steps = pruning_steps(sweep.n, points)
    by = {"importance": importance_norm.ravel(), "ablation": ablation}
    orders, seeds = removal_orders(by, sweep.n, seed, random_orders)
    sets = prefix_sets(orders, steps)
    curves, random = order_curves(sweep.pooled(sweep.measure(list(sets), "pruning")), sets, orders, steps, seeds, base)
    return ImportanceResult(
        kind=hm.kind,
        objective=OBJECTIVES[scored],
        importance=importance,
        importance_norm=importance_norm,
        base_loss=base,
        ablation=ablation.reshape(hm.num_layers, hm.num_heads),
        removed=steps,
        curves=curves,
        random_seeds=seeds,
        num_sequences=sequences,
        num_tokens=tokens,
        order=orders["importance"],
        random_curves=random,
        sweep=sweep.report(sweep.n + len(sets), time.perf_counter() - t0),
    )


def _checked(hm: SweptModel, batches, scored, eval_batches, random_orders, mode) -> tuple[str, bool, Sequence]:
    """:func:`head_importance`'s arguments checked (ValueError naming the argument): ``(scored, the objective measured
    on the importance's batches, eval_batches)``."""
    from headwise.analysis.batched import MODES

    if not batches:
        raise ValueError("batches: expected at least one batch, got none")
    positive_int("random_orders", random_orders)
    one_of("mode", mode, MODES)
    scored = scoring(hm, scored)
    same = eval_batches is None
    eval_batches = batches if eval_batches is None else eval_batches
    if not eval_batches:
        raise ValueError("eval_batches: expected at least one batch, got none")
    return scored, same, eval_batches


class _Sweep:
    """One :func:`head_importance` run's model, batches and engine: the gates' pass and the intact objective
    (:meth:`gates_and_intact`), the objective with head sets removed (:meth:`measure`), the means over every
    process's share (:meth:`pooled`) and what the engine ran (:meth:`report`)."""

    def __init__(
        self, hm: SweptModel, batches, eval_batches, *, scored, ablate, mode, copies, memory, progress, reduce, run
    ):
        import torch

        from headwise.analysis.batched import SweepCost

        self.hm, self.batches, self.eval_batches, self.scored = hm, batches, eval_batches, scored
        self.ablate, self.mode, self.copies, self.memory = ablate, mode, copies, memory
        self.progress, self.reduce, self.run = progress, reduce, run
        self.nl, self.h = hm.num_layers, hm.num_heads
        self.n = self.nl * self.h
        self.cost = SweepCost()
        self.references = None
        if scored == "embedding":
            with torch.no_grad():
                outs = [(hm.forward(ids, mask), mask) for ids, mask in eval_batches]
            self.references = [mean_pooled(out, mask) for out, mask in outs]
            cosines = [torch.nn.functional.cosine_similarity(e, e, dim=-1) for e in self.references]
            self.base = float(sum(float((1 - c).sum()) for c in cosines)) / max(sum(c.numel() for c in cosines), 1)
            self.tokens = sum(c.numel() for c in cosines)

    def gates_and_intact(self, same: bool) -> tuple:
        """``(importance (NL, H), sequences, base, tokens)`` over every process's share (stage ``"importance"``;
        ``same``: the objective is measured on the importance's batches)."""
        hm, batches, scored, progress = self.hm, self.batches, self.scored, self.progress

        def work() -> tuple:  # (importance (NL, H), sequences, base, tokens) of this process's share
            if scored == "embedding":
                if same:  # the intact embeddings just formed are the importance's references too
                    return (*encoder_importance(hm, batches, self.references, progress), self.base, self.tokens)
                return (*gate_importance(hm, batches, scored=scored, progress=progress), self.base, self.tokens)
            if same:
                return decoder_importance(hm, batches, scored, progress)
            intact = objective(hm, self.eval_batches, scored=scored)
            return (*gate_importance(hm, batches, scored=scored, progress=progress), *intact)

        importance, sequences, base, tokens = self.run("importance", work, None)
        self.local_tokens = self.tokens = tokens
        if self.reduce is not None:  # this process's sums and counts → every process's, then divided
            n = self.n
            r = self.reduce(np.concatenate([importance.ravel() * sequences, [sequences, base * tokens, tokens]]))
            sequences, self.tokens = int(round(r[n])), int(round(r[n + 2]))
            importance, base = r[:n].reshape(self.nl, self.h) / max(sequences, 1), float(r[n + 1]) / max(self.tokens, 1)
        if not math.isfinite(base):
            raise ValueError(f"the intact model's objective is not finite ({base})")
        return importance, sequences, base, self.tokens

    def pooled(self, values: np.ndarray) -> np.ndarray:
        """Token-weighted means over every process's share."""
        return values if self.reduce is None else self.reduce(values * self.local_tokens) / max(self.tokens, 1)

    def measure(self, sets: list[tuple[int, ...]], stage: str) -> np.ndarray:
        """The objective with each head set removed (``sets`` distinct, none empty), this process's share, through
        the run's hold on ``stage``."""
        return self.run(stage, lambda: self._measure_here(sets, stage), sets)

    def _measure_here(self, sets: list[tuple[int, ...]], stage: str) -> np.ndarray:
        hm, eval_batches, h, cost, progress = self.hm, self.eval_batches, self.h, self.cost, self.progress
        if self.ablate is None:
            return ablation_objectives(
                hm,
                eval_batches,
                [_spec(s, h) for s in sets],
                scored=self.scored,
                reference=self.references,
                mode=self.mode,
                copies=self.copies,
                memory=self.memory,
                cost=cost,
                progress=lambda done, total: progress(stage, done, total),
            )
        values = np.zeros(len(sets))
        for i, s in enumerate(sets):
            with self.ablate(_spec(s, h)):
                values[i] = objective(hm, eval_batches, reference=self.references, scored=self.scored)[0]
            cost.passes += len(eval_batches)
            cost.rows += sum(b[0].shape[0] for b in eval_batches)
            progress(stage, i + 1, len(sets))
        return values

    def report(self, head_sets: int, seconds: float) -> dict:
        """What the engine ran (:attr:`ImportanceResult.sweep`)."""
        cost = self.cost
        rows_in = sum(b[0].shape[0] for b in self.eval_batches)
        if self.ablate is not None:
            cost.layer_rows = cost.rows * self.nl
            cost.forward_equivalents = cost.layer_rows / max(self.nl * rows_in, 1)
        return cost.to_dict() | {
            "mode": self.mode if self.ablate is None else "given",
            "head_sets": head_sets,
            "seconds_total": seconds,
        }


def removal_orders(by: dict[str, np.ndarray], n: int, seed: int, random_orders: int) -> tuple[dict, tuple[int, ...]]:
    """The orders in which heads are removed: ``by[name]``'s heads ascending (stable), then ``random_orders`` random
    permutations of the ``n`` heads (seeds ``seed``, ``seed + 1``, …, named ``"random<seed>"``). Returns ``(orders,
    seeds)``."""
    orders = {name: np.argsort(values, kind="stable") for name, values in by.items()}
    seeds = tuple(seed + r for r in range(random_orders))
    for s in seeds:
        orders[f"random{s}"] = np.random.default_rng(s).permutation(n)
    return orders, seeds


def prefix_sets(orders: dict, steps: np.ndarray, sets: dict | None = None) -> dict[tuple[int, ...], int]:
    """Every order's first k heads for each k of ``steps`` (k > 0) as a sorted head set, numbered in the order first
    met after those already in ``sets``: each distinct set measured once."""
    sets = {} if sets is None else dict(sets)
    for order in orders.values():
        for k in steps:
            if k > 0:
                sets.setdefault(tuple(sorted(int(f) for f in order[:k])), len(sets))
    return sets


def order_curves(values: np.ndarray, sets: dict, orders: dict, steps: np.ndarray, seeds: tuple, base: float):
    """The objective as heads go in each order (``values[sets[s]]``: with head set s removed; ``base`` with none);
    the random orders' curves pooled into their mean, minimum and maximum. Returns ``(curves, random (orders, K))``."""
    curves = {
        name: np.array([base if k == 0 else values[sets[tuple(sorted(int(f) for f in order[:k]))]] for k in steps])
        for name, order in orders.items()
    }
    random = np.stack([curves.pop(f"random{s}") for s in seeds])  # (orders, K)
    curves |= {"random_mean": random.mean(axis=0), "random_min": random.min(axis=0), "random_max": random.max(axis=0)}
    return curves, random
