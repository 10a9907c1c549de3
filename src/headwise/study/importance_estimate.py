"""Every head's importance in minutes: the ablation of every head estimated at once, the exact ablation only where it
decides something (``headwise heads --importance``'s default; ``--exact`` runs :func:`~headwise.study.run_importance`).

Shape legend: NL layers, H heads, N = NL · H, P rows of a part, L its length, V vocabulary, K points of a curve.

Three steps, each in batched passes:

1. **The estimate**, all heads at once. Decoders: :func:`headwise.circuits.head_ablation_estimates` — one forward and
   one backward pass per part of the sample, with every later layer's attention patterns recomputed exactly for the
   head's write change (AtP*'s QK fix at the node level, Kramár et al. 2024) — of each row's summed next-token
   cross-entropy; the sums over the sample divided by its scored tokens are the estimated change of the objective
   (``ablation_delta``'s units). Michel et al.'s ``E_x |∂L(x)/∂ξ_h|`` comes from the same backward pass (each row's
   gate gradient). Encoders (no wiring: the circuits read decoders): the forward-mode turning rate of the pooled
   embedding (:func:`headwise.analysis.gates.encoder_importance`), the estimate ``E_x θ_h² / 2`` of ``1 − cos`` —
   a linearisation of the whole model, not attention-aware.
2. **The exact ablation** of the heads a search chooses (:class:`~headwise.study.importance_search.HeadSearch`):
   the top ``top_k`` by |estimate| and by Michel et al.'s importance and ``random_heads`` more drawn at random
   (seeded), then more in the order their bounds give (Michel's score times the largest ratio of exact to it seen)
   until no unmeasured head can enter the exact top k or ``max_exact`` heads are measured — through the batched
   engine (:func:`headwise.analysis.ablation_objectives`): measured, never read from the estimate. The estimate's
   agreement with them (Spearman, top-k overlap, the largest error) says how far it can be trusted; the answer — the
   heads that matter most — is the exact values', never the estimate's order.
3. **The pruning curve** at :data:`GRID` (fractions of the heads removed), least important first by the estimate,
   by Michel et al.'s importance and in random orders; each point one head set of the batched engine. Its orders need
   no exact number, so its sets run in the same call of the engine as the measured heads (one kept pass a part).

A data-parallel run hands ``reduce`` (an all-reduce of float64 sums): each process holds its own share of the
batches (:func:`~headwise.study.estimate_across_ranks`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from headwise.analysis.importance import ImportanceResult, order_curves, prefix_sets, removal_orders
from headwise.circuits.areas import spearman
from headwise.study.importance_search import HeadSearch

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "GRID", "RANDOM_HEADS", "EstimatedImportance", "default_top_k", "estimate_importance", "estimate_tokens",
    "agreement", "spearman_or_none",
]  # fmt: skip

#: The pruning curve's points: fractions of the heads removed (each point one head set of the batched engine; with
#: the 5 orders, 16 distinct sets whatever the model's size).
GRID = (0.0, 0.125, 0.25, 0.5, 1.0)
#: Heads measured exactly besides the top k, drawn at random from the rest (seeded): the estimate's error there.
RANDOM_HEADS = 6
#: Most tokens of one part of the estimate's forward and backward pass (its logits and their gradient are held).
ESTIMATE_TOKENS = 1024
#: Most logits (tokens × vocabulary) of one part: 256 MB of float32 each for the logits, their log-softmax and their
#: gradient (Gemma 3's 262,144-token vocabulary held 3.8 GB more than its statistics at 1,024 tokens a part).
ESTIMATE_LOGITS = 1 << 26


def estimate_tokens(vocab: int | None) -> int:
    """Most tokens of one part of the estimate's pass for a vocabulary of ``vocab``: :data:`ESTIMATE_TOKENS`, fewer
    where the logits would pass :data:`ESTIMATE_LOGITS` (SmolLM2's 49,152: 1,024; Llama 3's 128,256: 523; Gemma 3's
    262,144: 256), at least 64."""
    return int(max(64, min(ESTIMATE_TOKENS, ESTIMATE_LOGITS // max(vocab or 1, 1))))


def default_top_k(heads: int) -> int:
    """The heads measured exactly by default: 10, at most a quarter of ``heads`` (at least 1) — SmolLM2's and
    MiniLM's 10, for SmolLM2's default run's time: the heads its estimate puts on top sit in layers 0–2, about one
    forward-equivalent of the sample each (with the 6 random heads and the curve's 16 sets, about 30 in all)."""
    return max(1, min(10, heads // 4))


@dataclass
class EstimatedImportance(ImportanceResult):
    """An :class:`~headwise.analysis.importance.ImportanceResult` whose ``ablation`` is measured on the heads of
    ``measured`` alone (NaN elsewhere), beside the estimate for every head.

    Attributes:
        estimate: ``(NL, H)`` every head's estimated ablation effect (the objective's units).
        measured: ``(M,)`` flat heads ``layer · H + head`` measured exactly, in the order chosen: the top k by
            |estimate| first, then the random ones, the top k by Michel et al.'s importance, and those the search's
            bounds chose (:class:`~headwise.study.importance_search.HeadSearch`).
        top_k: the exact top heads sought; estimator: what estimated (one phrase).
        agreement: :func:`agreement` of the estimate with the measured heads.
        search: :meth:`HeadSearch.summary <headwise.study.importance_search.HeadSearch.summary>` — each measured
            head's reason, how the search ended (``"complete"`` or ``"budget"``), its threshold and factors.
    """

    estimate: np.ndarray | None = None
    measured: np.ndarray | None = None
    top_k: int = 0
    estimator: str = ""
    agreement: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)


def spearman_or_none(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rank correlation (:func:`headwise.circuits.areas.spearman`) over the pairs where both are finite;
    None under 3 such pairs or a constant side."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    if int(ok.sum()) < 3:
        return None
    rho = spearman(torch.as_tensor(a[ok]), torch.as_tensor(b[ok]))
    return None if math.isnan(rho) else rho


def agreement(
    estimate: np.ndarray, exact: np.ndarray, measured: np.ndarray, top_k: int, random: np.ndarray | None = None
) -> dict:
    """How the estimate agrees with the exact ablation on the measured heads.

    Args:
        estimate: ``(N,)`` flat estimates; exact: ``(N,)`` flat exact effects (read at ``measured`` only).
        measured: ``(M,)`` flat heads measured, the top ``top_k`` by |estimate| first.
        random: the flat heads of ``measured`` drawn at random (None: every one after the top ``top_k``).
    Returns:
        ``spearman`` over the measured heads; ``top_k_overlap``: the share of the ``top_k`` heads with the largest
        |exact| among the measured that are in the estimate's top ``top_k``; ``largest_error``: the head with the
        largest |estimate − exact| (``layer``, ``head``, ``estimate``, ``exact``, ``error``);
        ``random_largest_exact``: the largest |exact| among the random heads (what the estimate may have missed),
        ``random_mean_abs_error``.
    """
    m = np.asarray(measured, dtype=np.int64)
    est, ex = np.asarray(estimate, float)[m], np.asarray(exact, float)[m]
    err = est - ex
    out: dict = {"heads": int(len(m)), "spearman": spearman_or_none(est, ex)}
    k = min(top_k, len(m))
    if k:
        best = set(m[np.argsort(-np.abs(ex), kind="stable")[:k]].tolist())
        out["top_k_overlap"] = len(best & set(m[:k].tolist())) / k
    if len(m):
        i = int(np.argmax(np.abs(err)))
        out["largest_error"] = {"flat": int(m[i]), "estimate": float(est[i]), "exact": float(ex[i]),
                                "error": float(err[i])}  # fmt: skip
    rand = np.arange(k, len(m)) if random is None else np.nonzero(np.isin(m, np.asarray(random, dtype=np.int64)))[0]
    if rand.size:
        out["random_largest_exact"] = float(np.abs(ex[rand]).max())
        out["random_mean_abs_error"] = float(np.abs(err[rand]).mean())
    return out


def _decoder_estimates(hm: HeadModel, parts, mode: str, estimator, progress) -> tuple[np.ndarray, np.ndarray, float]:
    """``(estimate sums (NL, H), Michel's sums Σ_rows |∂L_row/∂ξ| (NL, H), [sequences, loss sum])`` over ``parts``
    (:class:`~headwise.analysis.sweep_plan.Part`): one forward and one backward pass each."""

    from headwise.analysis.objective import token_losses

    nl, h = hm.num_layers, hm.num_heads
    est, michel = np.zeros((nl, h)), np.zeros((nl, h))
    sequences, loss = 0, 0.0
    for k, part in enumerate(parts):
        P, L = part.ids.shape
        counts = torch.zeros(P, dtype=torch.long).index_add(0, part.index // L, torch.ones_like(part.index))
        kept: list = []

        def metric(logits, part=part, P=P, L=L, kept=kept):  # (P, L, V) -> (P,) each row's summed cross-entropy
            ce = token_losses(logits.reshape(-1, logits.shape[-1])[part.index.to(logits.device)], part.targets)
            rows = torch.zeros(P, dtype=ce.dtype, device=ce.device).index_add(0, part.index.to(ce.device) // L, ce)
            kept.append(rows.detach())
            return rows

        real = None if part.mask is None else part.mask > 0
        with torch.no_grad():  # the estimator runs its own pass with gradients; nothing after it keeps a graph
            e, g = estimator(hm, part.ids, metric, mode=mode, real=real, gate_gradients=True)  # (NL, H), (P, NL, H)
        est += e.double().numpy()
        on = counts > 0
        michel += (g[on].double().abs() / counts[on, None, None].double()).sum(0).numpy()
        sequences += int(on.sum())
        loss += float(kept[0].double().sum())
        progress("estimate", k + 1, len(parts))
    return est, michel, np.array([sequences, loss])


def estimate_importance(
    hm: HeadModel,
    batches: Sequence,
    *,
    seed: int = 0,
    mode: str = "zero",
    top_k: int | None = None,
    random_heads: int = RANDOM_HEADS,
    grid: Sequence[float] = GRID,
    random_orders: int = 3,
    copies: int | None = None,
    memory: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    reduce: Callable[[np.ndarray], np.ndarray] | None = None,
    max_exact: int | None = None,
) -> EstimatedImportance:
    """Every head's ablation estimated at once, the exact ablation of the heads the search chooses, and the pruning
    curve at ``grid`` (see the module's text).

    Args:
        hm: an opened :class:`~headwise.models.HeadModel`: a decoder the circuits' wiring reads
            (:func:`headwise.circuits.wiring`), or an encoder.
        batches: ``(ids (B, L), mask (B, L))`` (right padding), as :func:`~headwise.analysis.head_importance`.
        seed: the random heads' and the first random order's seed.
        mode: ``"zero"`` or ``"mean"`` (the head's mean over the batch's real positions): the estimate's and the
            exact ablation's.
        top_k: the exact top heads sought: the top ``top_k`` by |estimate| and by Michel's importance measured first
            (None: :func:`default_top_k`); random_heads: more drawn from the rest in that first round.
        grid: the pruning curve's fractions of the heads removed; random_orders: its random orders.
        copies, memory: the batched engine's (:func:`~headwise.analysis.ablation_objectives`).
        progress: ``(stage, done, total)``: ``"estimate"`` in parts (a forward and a backward pass each), ``"exact"``
            in passes (the first round's heads and the curve's sets together), ``"search"`` in passes (each later
            round's).
        reduce: a data-parallel run's all-reduce of float64 sums (this process's share of ``batches``).
        max_exact: most heads measured exactly (None: :func:`~headwise.study.importance_search.default_budget`).
    Returns:
        :class:`EstimatedImportance`.
    Raises:
        ValueError: no batch, a ``top_k``, ``random_heads`` or ``max_exact`` out of range, an unknown ``mode``, a
            decoder whose structure the wiring does not read (its one sentence).
    """

    from headwise.analysis import ablation_objectives
    from headwise.analysis.batched import MODES, SweepCost
    from headwise.analysis.objective import OBJECTIVES
    from headwise.checks import one_of
    from headwise.models.memory import return_freed

    if not batches:
        raise ValueError("batches: expected at least one batch, got none")
    one_of("mode", mode, MODES)
    nl, h = hm.num_layers, hm.num_heads
    n = nl * h
    top_k = default_top_k(n) if top_k is None else top_k
    if not 1 <= top_k <= n:
        raise ValueError(f"top_k: expected 1 … {n} (the model's heads), got {top_k}")
    if random_heads < 0:
        raise ValueError(f"random_heads: expected ≥ 0, got {random_heads}")
    if max_exact is not None and max_exact < top_k:
        raise ValueError(f"max_exact: expected at least top_k ({top_k}) heads, got {max_exact}")
    progress = progress or (lambda *_: None)
    t0 = time.perf_counter()
    got = _estimated(hm, batches, mode, progress, reduce)
    return_freed()  # the estimate's freed memory given back before the exact passes take what a budget leaves
    seconds_estimate = time.perf_counter() - t0
    # a decoder's bound: the gate gradient's magnitude (the loss's slope along the removal); an encoder's: θ²/2,
    # the second-order estimate of 1 − cos (its first-order rate is the turning rate θ, not the effect's size)
    bound = "michel" if got.scored == "next_token" else "estimate"
    search = HeadSearch({"estimate": got.estimate, "michel": got.importance.ravel()}, top_k, random_heads, seed,
                        budget=max_exact, bound=bound)  # fmt: skip
    first = search.first()
    norms = np.linalg.norm(got.importance, axis=1, keepdims=True)  # (NL, 1)
    importance_norm = np.divide(got.importance, norms, out=np.zeros_like(got.importance), where=norms > 0)
    steps = np.unique(np.round(np.asarray(grid, dtype=float) * n).astype(np.int64).clip(0, n))
    by = {"importance": importance_norm.ravel(), "estimate": got.estimate}
    orders, seeds = removal_orders(by, n, seed, random_orders)
    sets = prefix_sets(orders, steps, {(f,): i for i, f in enumerate(first)})  # the first round's heads first
    cost = SweepCost()
    engine = partial(ablation_objectives, hm, batches, scored=got.scored, reference=got.references, mode=mode,
                     copies=copies, memory=memory, cost=cost)  # fmt: skip
    values = got.pooled(engine([_job(s, h) for s in sets], progress=lambda done, total: progress("exact", done, total)))
    base = got.base
    heads = search.record(first, values[: len(first)] - base)
    while heads:  # more heads in the order their bounds give, until none can enter the exact top k or the budget ends
        more = got.pooled(engine([_job((f,), h) for f in heads], progress=lambda d, t: progress("search", d, t)))
        heads = search.record(heads, more - base)
    measured, exact = search.measured, search.exact
    curves, random = order_curves(values, sets, orders, steps, seeds, base)
    sweep = cost.to_dict() | {
        "mode": mode, "head_sets": len(sets) + len(measured) - len(first), "route": "estimate",
        "estimate_seconds": seconds_estimate,
        "seconds_total": time.perf_counter() - t0,
    }  # fmt: skip
    return EstimatedImportance(
        kind=hm.kind, objective=OBJECTIVES[got.scored], importance=got.importance, importance_norm=importance_norm,
        base_loss=base, ablation=exact.reshape(nl, h), removed=steps, curves=curves, random_seeds=seeds,
        num_sequences=got.sequences, num_tokens=int(round(got.tokens)), order=orders["importance"],
        random_curves=random, sweep=sweep, estimate=got.estimate.reshape(nl, h), measured=measured, top_k=top_k,
        estimator=got.what, search=search.summary(h),
        agreement=agreement(got.estimate, exact, measured, top_k, random=search.chosen("random")),
    )  # fmt: skip


@dataclass
class _Estimated:
    """The estimate stage of :func:`estimate_importance`, over every process's share.

    Attributes:
        estimate: ``(N,)`` every head's estimated ablation; importance: ``(NL, H)`` Michel et al.'s importance;
            base: the intact objective; sequences, tokens: what they were measured on.
        scored: ``"next_token"`` (decoders) or ``"embedding"`` (encoders); references: an encoder's intact
            embeddings (None for a decoder); what: the estimator, in words.
        local_tokens: this process's tokens; reduce: the run's all-reduce (None: one process).
    """

    estimate: np.ndarray
    importance: np.ndarray
    base: float
    sequences: int
    tokens: float
    scored: str
    references: list | None
    what: str
    local_tokens: float
    reduce: Callable[[np.ndarray], np.ndarray] | None

    def pooled(self, values: np.ndarray) -> np.ndarray:
        """Token-weighted means over every process's share."""
        return values if self.reduce is None else self.reduce(values * self.local_tokens) / max(self.tokens, 1)


def _estimated(hm: HeadModel, batches: Sequence, mode: str, progress, reduce) -> _Estimated:
    """Every head's ablation estimated at once, with Michel et al.'s importance and the intact objective: a decoder's
    by attention-aware attribution patching on the circuits' wiring, an encoder's by the embedding's turning rate;
    the float64 sums reduced once (``reduce``)."""
    from headwise.analysis.gates import encoder_importance
    from headwise.analysis.objective import mean_pooled
    from headwise.analysis.sweep_plan import row_parts

    nl, h = hm.num_layers, hm.num_heads
    n = nl * h
    decoder = hm.kind == "decoder"
    scored = "next_token" if decoder else "embedding"
    references = None
    if decoder:
        from headwise.circuits.head_estimates import head_ablation_estimates
        from headwise.circuits.wiring import wiring

        wired = wiring(hm)  # refuses a structure it does not read, before any pass
        parts, tokens = row_parts(batches, scored, None, mode == "zero", estimate_tokens(hm.vocab_size))
        estimator = partial(_attention_aware, head_ablation_estimates, wired)
        est, michel, counts = _decoder_estimates(hm, parts, mode, estimator, progress)
        sums = np.concatenate([est.ravel(), michel.ravel(), counts, [tokens]])
        what = "attention-aware attribution patching (AtP*'s QK fix at the node level), one forward and backward pass"
    else:
        with torch.no_grad():
            references = [mean_pooled(hm.forward(ids, mask), mask) for ids, mask in batches]
        turn, sentences, second = encoder_importance(hm, batches, references, progress, squares=True)
        sums = np.concatenate([second.ravel() * sentences, turn.ravel() * sentences, [sentences, 0.0, sentences]])
        what = "the embedding's first-order turning rate, θ²/2 (forward-mode; not attention-aware)"
    local_tokens = sums[-1]
    if reduce is not None:
        sums = reduce(sums)
    sequences, loss, tokens = int(round(sums[2 * n])), float(sums[2 * n + 1]), float(sums[2 * n + 2])
    base = loss / max(tokens, 1)
    if not np.isfinite(base):
        raise ValueError(f"the intact model's objective is not finite ({base})")
    estimate, importance = sums[:n] / max(tokens, 1), sums[n : 2 * n].reshape(nl, h) / max(sequences, 1)
    return _Estimated(estimate, importance, base, sequences, tokens, scored, references, what, local_tokens, reduce)


def _job(heads: Sequence[int], h: int) -> dict[int, list[int]]:
    """``{layer: [head, …]}`` of flat head numbers ``layer · H + head``."""
    job: dict[int, list[int]] = {}
    for flat in heads:
        job.setdefault(int(flat) // h, []).append(int(flat) % h)
    return job


def _attention_aware(estimates, wired, hm: HeadModel, ids, metric, **kwargs):
    """The estimator of the default route: ``estimates`` (:func:`~headwise.circuits.head_ablation_estimates`) on the
    model's wiring, attention-aware."""
    return estimates(wired, ids, metric, attention_aware=True, **kwargs)
