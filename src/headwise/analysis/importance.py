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

The model is anything shaped as :class:`headwise.models.HeadModel` (``kind``, ``num_layers``, ``num_heads``,
``forward``, ``gated``): this module runs what it is handed and opens nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from headwise.analysis.protocol import GatedModel, SweptModel
from headwise.checks import one_of, positive_int

__all__ = [
    "ImportanceResult",
    "head_importance",
    "ablation_objectives",
    "gate_importance",
    "objective",
    "pruning_steps",
    "OBJECTIVES",
    "SCORED",
]

#: What the objective is, by which tokens are scored.
OBJECTIVES = {
    "next_token": "next-token cross-entropy (nats per token)",
    "answers": "cross-entropy on the scored answer tokens (nats per token)",
    "embedding": "1 − cos(mean-pooled sentence embedding, intact model's)",
}
#: The ``scored`` choices of :func:`head_importance`.
SCORED = tuple(OBJECTIVES)

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


def _targets(batch, scored: str):
    """``(ids (B, L), mask (B, L) or None, targets (B, L), scored (B, L) bool)`` of one decoder batch."""
    if scored == "answers":
        ids, targets, chosen = batch
        return ids, None, targets, chosen.bool()
    ids, mask = batch
    targets = ids.roll(-1, dims=1)  # position t predicts token t + 1
    real = mask > 0
    chosen = real & real.roll(-1, dims=1)  # (B, L): a real token whose next one is real too
    chosen[:, -1] = False
    return ids, mask, targets, chosen


def _decoder_losses(logits, targets, scored):
    """Per-sequence mean cross-entropy over the scored positions ``(B,)`` and the tokens counted ``(B,)``."""
    import torch

    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2).float(), targets, reduction="none")  # (B, L)
    count = scored.sum(dim=1)  # (B,)
    return (ce * scored).sum(dim=1) / count.clamp(min=1), count


def _pooled(hidden, mask):
    """Mean of the real tokens' vectors: ``(B, D)`` (sentence-transformers' mean pooling)."""
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)


def _scoring(hm: GatedModel, scored: str | None) -> str:
    if scored is None:
        return "next_token" if hm.kind == "decoder" else "embedding"
    one_of("scored", scored, SCORED)
    if (scored == "embedding") != (hm.kind == "encoder"):
        raise ValueError(f"scored: {scored!r} does not fit a model of kind {hm.kind!r}")
    return scored


def objective(hm: GatedModel, batches: Sequence, *, reference=None, scored: str | None = None) -> tuple[float, int]:
    """The objective of :func:`head_importance` on ``batches`` under the gates / ablation now active.

    Args:
        hm: a :class:`~headwise.models.HeadModel`.
        batches: ``(ids, mask)`` pairs (``(ids, targets, scored)`` triples for ``scored="answers"``).
        reference: encoders: the intact model's pooled embeddings, one ``(B, D)`` per batch.
        scored: which tokens are scored (:data:`SCORED`; default by the model's kind).
    Returns:
        ``(loss, tokens)``: decoders, cross-entropy averaged over all scored tokens; encoders, the mean
        over sentences of ``1 − cos``.
    """
    import torch

    scored = _scoring(hm, scored)
    total, count = 0.0, 0
    with torch.no_grad():
        for k, batch in enumerate(batches):
            if scored == "embedding":
                ids, mask = batch
                e = _pooled(hm.forward(ids, mask), mask)
                total += float((1 - torch.nn.functional.cosine_similarity(e, reference[k], dim=-1)).sum())
                count += ids.shape[0]
            else:
                ids, mask, targets, chosen = _targets(batch, scored)
                losses, n = _decoder_losses(hm.forward(ids, mask), targets, chosen)
                total += float((losses * n).sum())
                count += int(n.sum())
    return total / max(count, 1), count


def _decoder_importance(hm: GatedModel, batches, scored, progress) -> tuple[np.ndarray, int, float, int]:
    """``(importance (NL, H), sequences, loss, tokens)``: the gates' gradients and, from the same forward at ξ = 1
    (the gates multiply by 1: the intact model), the objective on ``batches``."""
    import torch

    dtype = next(hm.model.parameters()).dtype
    grads = []
    total, count = 0.0, 0
    for k, batch in enumerate(batches):
        ids, mask, targets, chosen = _targets(batch, scored)
        gates = torch.ones((ids.shape[0], hm.num_layers, hm.num_heads), dtype=dtype, requires_grad=True)  # (B, NL, H)
        with hm.gated(gates):
            losses, n = _decoder_losses(hm.forward(ids, mask), targets, chosen)
        losses.sum().backward()  # sequence b's loss depends only on its own gates: per-example gradients
        grads.append(gates.grad.abs()[n > 0].double())
        total += float((losses.detach() * n).sum())
        count += int(n.sum())
        progress("importance", k + 1, len(batches))
    g = torch.cat(grads)  # (sequences, NL, H)
    return g.mean(dim=0).numpy(), g.shape[0], total / max(count, 1), count


def _encoder_importance(hm: SweptModel, batches, references, progress) -> tuple[np.ndarray, int]:
    """Forward-mode ∂e/∂ξ_h: one pass per layer, the batch repeated once per head, each copy's
    tangent on a different head (per-sequence gates), so H directional derivatives share one pass.

    The gate of layer l alone carries a tangent (the others are 1 with none: they change nothing), so the layers
    below l run once on the batch and the copies start at ``layers.{l}.resid_pre``
    (:func:`headwise.analysis.batched.copies_from`) where the model has the point."""
    import torch
    import torch.autograd.forward_ad as fwad

    from headwise.analysis.batched import copies_from, start_layer
    from headwise.points import attention_point

    nl, h = hm.num_layers, hm.num_heads
    total = np.zeros((nl, h))
    sequences = 0
    done = 0
    dtype = next(hm.model.parameters()).dtype
    with torch.no_grad():
        for (ids, mask), e in zip(batches, references):
            b = ids.shape[0]
            mask_r = mask.repeat(h, 1)  # (H·B, L): copy r is for head r
            e_r = e.repeat(h, 1)  # (H·B, D)
            unit = e_r / e_r.norm(dim=-1, keepdim=True)
            tangent = torch.zeros((h * b, h), dtype=dtype)
            for r in range(h):
                tangent[r * b : (r + 1) * b, r] = 1.0
            for layer in range(nl):
                low = start_layer(hm, [{layer: [0]}])
                with fwad.dual_level():
                    gates = fwad.make_dual(torch.ones_like(tangent), tangent)  # (H·B, H)

                    def gate(out, gates=gates):  # (H·B, H, L, Dh)
                        return out * gates[:, :, None, None].to(out.dtype)

                    with hm.hooks({attention_point(layer, "heads"): gate}), copies_from(hm, low, h, b):
                        n = 1 if low > 0 else h
                        out = hm.forward(ids.repeat(n, 1), mask.repeat(n, 1), math_path=True)
                        pooled = _pooled(out, mask_r)
                    de = fwad.unpack_dual(pooled).tangent  # (H·B, D): ∂e/∂ξ of copy r's head
                turn = de - (de * unit).sum(-1, keepdim=True) * unit  # the part orthogonal to e
                rate = (turn.norm(dim=-1) / e_r.norm(dim=-1)).reshape(h, b)  # (H, B)
                total[layer] += rate.sum(dim=1).numpy()
                done += 1
                progress("importance", done, len(batches) * nl)
            sequences += b
    return total / max(sequences, 1), sequences


def gate_importance(hm: GatedModel, batches: Sequence, *, scored: str | None = None, progress: Progress | None = None):
    """Michel et al.'s importance alone: ``(importance (NL, H), sequences)``, ``E_x |∂L(x)/∂ξ_h|`` over the
    sequences of ``batches`` (encoders: the embedding's turning rate). See :func:`head_importance`."""
    import torch

    if not batches:
        raise ValueError("batches: expected at least one batch, got none")
    scored = _scoring(hm, scored)
    progress = progress or (lambda *_: None)
    if scored != "embedding":
        return _decoder_importance(hm, batches, scored, progress)[:2]
    with torch.no_grad():
        references = [_pooled(hm.forward(ids, mask), mask) for ids, mask in batches]
    return _encoder_importance(hm, batches, references, progress)


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


def _row_bytes(hm: GatedModel, width: int) -> int:
    """Bytes per token of one row of a forward without gradient: the output (``width`` floats, with the loss's
    float32 copies: 3 ×) and the layers' activations (about 40 model widths, the residual width estimated from
    the parameters as √(parameters / (12 · NL)))."""
    params = [p for p in hm.model.parameters()]
    itemsize = params[0].element_size() if params else 4
    d = math.sqrt(sum(p.numel() for p in params) / (12 * max(hm.num_layers, 1))) if params else 64
    return int(3 * 4 * width + 40 * itemsize * d)


def _run_repeated(hm: GatedModel, ids, mask, repeat: int):
    """``hm.forward`` of ``ids`` (and ``mask``) copied ``repeat`` times along the batch."""
    return hm.forward(ids.repeat(repeat, 1), None if mask is None else mask.repeat(repeat, 1))


def ablation_objectives(
    hm: SweptModel,
    batches: Sequence,
    jobs: Sequence[dict],
    *,
    scored: str | None = None,
    reference=None,
    mode: str = "zero",
    copies: int | None = None,
    memory: int | None = None,
    prefix: bool = True,
    cost=None,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """The objective of :func:`objective` with each job's heads removed, ``(len(jobs),)``, through the batched
    engine (:mod:`headwise.analysis.batched`): J jobs as J copies of each batch in one forward.

    Args:
        hm: a :class:`~headwise.models.HeadModel` (its ``hooks`` and named points).
        batches: as :func:`objective`.
        jobs: head sets ``{layer: [head, …]}`` (an empty one: the intact model).
        scored, reference: as :func:`objective`.
        mode: ``"zero"`` (ξ_h = 0) or ``"mean"`` (the head's mean over the batch's real positions in the same
            forward, as :func:`headwise.hf.ablate`'s ``mode="mean"``).
        copies: J, jobs per pass (None: as many as ``memory`` allows, at most 64 and at most
            :data:`~headwise.analysis.batched.PASS_TOKENS` tokens a pass).
        memory: bytes a pass may use (None: half the memory free on the model's device).
        prefix: start each pass at the lowest layer its jobs touch (:func:`headwise.analysis.batched.copies_from`).
        cost: a :class:`~headwise.analysis.batched.SweepCost` the passes are added to.
        progress: ``progress(passes done, passes in all)``.
    Returns:
        ``(len(jobs),)`` float64: the objective (decoders: cross-entropy over every scored token; encoders: mean
        ``1 − cos`` against ``reference``) with that job's heads removed.
    """
    import time

    import torch

    from headwise.analysis.batched import MODES, PASS_TOKENS, SweepCost, choose_split, free_memory, run_copies

    one_of("mode", mode, MODES)
    scored = _scoring(hm, scored)
    cost = cost if cost is not None else SweepCost()
    if copies is not None:
        positive_int("copies", copies)
    t0 = time.perf_counter()
    order = sorted(range(len(jobs)), key=lambda j: -min((int(k) for k, v in jobs[j].items() if v), default=0))
    width = getattr(hm, "vocab_size", None) if scored != "embedding" else None
    row_bytes = _row_bytes(hm, int(width or 1024))
    device = next(hm.model.parameters()).device
    budget = int(memory if memory is not None else free_memory(device) // 2)
    tokens = PASS_TOKENS.get(device.type, PASS_TOKENS["cpu"])
    plan = []  # (J, P') per batch
    for batch in batches:
        ids = batch[0]
        if copies is not None:
            plan.append((copies, ids.shape[0]))
        else:
            plan.append(
                choose_split(
                    len(jobs),
                    ids.shape[0],
                    ids.shape[1],
                    row_bytes,
                    budget=budget,
                    pass_tokens=tokens,
                    split=mode == "zero",
                )
            )
    cost.copies = max(cost.copies, max((j for j, _ in plan), default=0))
    cost.memory_budget = 0 if copies is not None else budget
    total_passes = sum(math.ceil(len(jobs) / j) * math.ceil(b[0].shape[0] / p) for (j, p), b in zip(plan, batches))
    sums = np.zeros(len(jobs))
    count = 0
    done = 0
    nl = hm.num_layers
    with torch.no_grad():
        for k, (batch, (J, part)) in enumerate(zip(batches, plan)):
            if scored == "embedding":
                ids_all, mask_all = batch
                targets_all = chosen_all = None
            else:
                ids_all, mask_all, targets_all, chosen_all = _targets(batch, scored)
            for r0 in range(0, ids_all.shape[0], part):
                rows = slice(r0, r0 + part)
                ids = ids_all[rows]
                mask = None if mask_all is None else mask_all[rows]
                real = None if mask is None else mask > 0
                P = ids.shape[0]
                for start in range(0, len(order), J):
                    chunk = [order[i] for i in range(start, min(start + J, len(order)))]
                    c = len(chunk)
                    run = partial(_run_repeated, hm, ids, mask)
                    out, low = run_copies(
                        hm, run, ids, [jobs[i] for i in chunk], replacement=mode, real=real, prefix=prefix
                    )
                    if scored == "embedding":
                        e = _pooled(out, mask.repeat(c, 1))
                        ref = reference[k][rows].repeat(c, 1)
                        loss = 1 - torch.nn.functional.cosine_similarity(e, ref, dim=-1)
                        per_job = loss.double().reshape(c, P).sum(dim=1)
                    else:
                        targets, chosen = targets_all[rows], chosen_all[rows]
                        losses, n = _decoder_losses(out, targets.repeat(c, 1), chosen.repeat(c, 1))
                        per_job = (losses.double() * n).reshape(c, P).sum(dim=1)
                    sums[chunk] += per_job.cpu().numpy()
                    cost.passes += 1
                    cost.rows += P + c * P if low > 0 else c * P
                    cost.layer_rows += low * P + (nl - low) * c * P
                    done += 1
                    if progress is not None:
                        progress(done, total_passes)
            count += ids_all.shape[0] if scored == "embedding" else int(chosen_all.sum())
    rows_in = sum(b[0].shape[0] for b in batches)
    cost.forward_equivalents = cost.layer_rows / max(nl * rows_in, 1)
    cost.seconds += time.perf_counter() - t0
    return sums / max(count, 1)


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

    import torch

    from headwise.analysis.batched import MODES, SweepCost

    if not batches:
        raise ValueError("batches: expected at least one batch, got none")
    positive_int("random_orders", random_orders)
    one_of("mode", mode, MODES)
    scored = _scoring(hm, scored)
    same = eval_batches is None
    eval_batches = batches if eval_batches is None else eval_batches
    if not eval_batches:
        raise ValueError("eval_batches: expected at least one batch, got none")
    progress = progress or (lambda *_: None)
    nl, h = hm.num_layers, hm.num_heads
    n = nl * h
    t0 = time.perf_counter()

    references = None
    if scored == "embedding":
        with torch.no_grad():
            outs = [(hm.forward(ids, mask), mask) for ids, mask in eval_batches]
        references = [_pooled(out, mask) for out, mask in outs]
        cosines = [torch.nn.functional.cosine_similarity(e, e, dim=-1) for e in references]
        base = float(sum(float((1 - c).sum()) for c in cosines)) / max(sum(c.numel() for c in cosines), 1)
        tokens = sum(c.numel() for c in cosines)
    run = stages if stages is not None else (lambda name, work, sets: work())

    def gates_and_intact() -> tuple:  # (importance (NL, H), sequences, base, tokens) of this process's share
        if scored == "embedding":
            return (*gate_importance(hm, batches, scored=scored, progress=progress), base, tokens)
        if same:
            return _decoder_importance(hm, batches, scored, progress)
        intact = objective(hm, eval_batches, scored=scored)
        return (*gate_importance(hm, batches, scored=scored, progress=progress), *intact)

    importance, sequences, base, tokens = run("importance", gates_and_intact, None)
    local_tokens = tokens
    if reduce is not None:  # this process's sums and counts → every process's, then divided
        r = reduce(np.concatenate([importance.ravel() * sequences, [sequences, base * tokens, tokens]]))
        sequences, tokens = int(round(r[n])), int(round(r[n + 2]))
        importance, base = r[:n].reshape(nl, h) / max(sequences, 1), float(r[n + 1]) / max(tokens, 1)

    def pooled(values: np.ndarray) -> np.ndarray:  # token-weighted means over every process's share
        return values if reduce is None else reduce(values * local_tokens) / max(tokens, 1)

    if not math.isfinite(base):
        raise ValueError(f"the intact model's objective is not finite ({base})")
    norms = np.linalg.norm(importance, axis=1, keepdims=True)  # (NL, 1)
    importance_norm = np.divide(importance, norms, out=np.zeros_like(importance), where=norms > 0)
    cost = SweepCost()

    def measure_all(sets: list[tuple[int, ...]], stage: str) -> np.ndarray:
        return run(stage, lambda: measure_here(sets, stage), sets)

    def measure_here(sets: list[tuple[int, ...]], stage: str) -> np.ndarray:
        """The objective with each head set removed (``sets`` distinct, none empty)."""
        if ablate is None:
            return ablation_objectives(
                hm,
                eval_batches,
                [_spec(s, h) for s in sets],
                scored=scored,
                reference=references,
                mode=mode,
                copies=copies,
                memory=memory,
                cost=cost,
                progress=lambda done, total: progress(stage, done, total),
            )
        values = np.zeros(len(sets))
        for i, s in enumerate(sets):
            with ablate(_spec(s, h)):
                values[i] = objective(hm, eval_batches, reference=references, scored=scored)[0]
            cost.passes += len(eval_batches)
            cost.rows += sum(b[0].shape[0] for b in eval_batches)
            progress(stage, i + 1, len(sets))
        return values

    ablation = pooled(measure_all([(flat,) for flat in range(n)], "ablation")) - base

    steps = pruning_steps(n, points)
    orders = {
        "importance": np.argsort(importance_norm.ravel(), kind="stable"),
        "ablation": np.argsort(ablation, kind="stable"),
    }
    seeds = tuple(seed + r for r in range(random_orders))
    for s in seeds:
        orders[f"random{s}"] = np.random.default_rng(s).permutation(n)
    sets: dict[tuple[int, ...], int] = {}
    for order in orders.values():
        for k in steps:
            if k > 0:
                sets.setdefault(tuple(sorted(int(f) for f in order[:k])), len(sets))
    measured = pooled(measure_all(list(sets), "pruning"))
    curves: dict[str, np.ndarray] = {}
    for name, order in orders.items():
        curves[name] = np.array(
            [base if k == 0 else measured[sets[tuple(sorted(int(f) for f in order[:k]))]] for k in steps]
        )
    random = np.stack([curves.pop(f"random{s}") for s in seeds])  # (orders, K)
    curves["random_mean"] = random.mean(axis=0)
    curves["random_min"] = random.min(axis=0)
    curves["random_max"] = random.max(axis=0)
    rows_in = sum(b[0].shape[0] for b in eval_batches)
    if ablate is not None:
        cost.layer_rows = cost.rows * nl
        cost.forward_equivalents = cost.layer_rows / max(nl * rows_in, 1)
    sweep = cost.to_dict() | {
        "mode": mode if ablate is None else "given",
        "head_sets": n + len(sets),
        "seconds_total": time.perf_counter() - t0,
    }
    return ImportanceResult(
        kind=hm.kind,
        objective=OBJECTIVES[scored],
        importance=importance,
        importance_norm=importance_norm,
        base_loss=base,
        ablation=ablation.reshape(nl, h),
        removed=steps,
        curves=curves,
        random_seeds=seeds,
        num_sequences=sequences,
        num_tokens=tokens,
        order=orders["importance"],
        random_curves=random,
        sweep=sweep,
    )
