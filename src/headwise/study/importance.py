"""Head importance on an opened model: Michel et al. 2019's importance, each head's ablation and the pruning curves
(:func:`headwise.analysis.head_importance`), with the ablation the model's backend needs — the one path of
``headwise heads --importance`` and ``headwise lab prune``. No pictures: :mod:`headwise.viz.pruning` draws them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from headwise.study.inputs import first_lines, probe_batches, text_batches
from headwise.study.options import HeadsOptions

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "check_top_k",
    "check_whole",
    "estimated",
    "importance_batches",
    "importance_activations",
    "importance_columns",
    "importance_room",
    "importance_summary",
    "importance_texts",
    "importance_whole",
    "run_importance",
]


def importance_texts(options: HeadsOptions) -> list[str]:
    """The corpus's first ``options.importance_sentences`` sentences (none without a corpus)."""
    return first_lines(options.corpus_path, options.importance_sentences)


def importance_batches(
    hm: HeadModel, texts: list[str] | None, probe, batch_size: int, warn: Callable[[str], None]
) -> list[tuple]:
    """``(ids (b, T), mask (b, T))`` batches of ``texts``, or of the probe's sequences when there are none; texts cut
    to the model's context are reported to ``warn`` once."""
    if texts:
        return list(text_batches(hm, texts, batch_size, warn))
    return probe_batches(hm, probe, batch_size)


def _largest(hm: HeadModel, batches: list[tuple], mode: str | None) -> tuple[int, int]:
    """``(rows, length)`` of the largest pass (by tokens) the gradient pass runs: the estimate's parts of a decoder
    (``mode`` given: its rows repacked as :func:`~headwise.study.estimate_importance` packs them), else the batches
    as given."""
    if mode is not None and hm.kind == "decoder" and batches:
        from headwise.analysis.sweep_plan import row_parts
        from headwise.study.importance_estimate import estimate_tokens

        parts, _ = row_parts(batches, "next_token", None, mode == "zero", estimate_tokens(hm.vocab_size))
        shapes = [tuple(part.ids.shape) for part in parts]
    else:
        shapes = [(int(b[0].shape[0]), int(b[0].shape[1])) for b in batches]
    return max(shapes, key=lambda s: s[0] * s[1], default=(0, 0))


def importance_activations(hm: HeadModel, batches: list[tuple], mode: str | None = None) -> int:
    """Bytes of activations ``--importance``'s gradient pass keeps on ``hm`` for its largest batch of ``batches``
    (``(ids (B, T), …)``), float32, an upper bound: each head's output change and its first-order write change
    ``(B, H, T, D)`` (the estimate's), the per-layer records of the attention-aware terms (the block's input, queries,
    keys, values, outputs and their gradients, about ``(B, T, D)`` each), the residual stream at every layer boundary,
    the logits ``(B, T, V)``, and the attention-aware terms' working set at a layer: one chunk of senders
    (:data:`~headwise.circuits.atp.CHUNK_BYTES`, or one sender where that is more) and every earlier head's output
    change concatenated ``(B, ΣH, T, Dh)``. ``mode`` (the estimate route's ablation): the largest of the estimate's
    parts, as it packs the rows, in place of the largest batch."""
    from headwise.circuits.atp import CHUNK_BYTES, sender_bytes

    D = hm.width
    B, T = _largest(hm, batches, mode)
    tokens = B * T  # B·T of the largest batch
    row = 4 * tokens * D
    H = max(hm.heads_per_layer or [hm.num_heads])
    dh = D // max(1, hm.num_heads)
    chunk = max(CHUNK_BYTES, sender_bytes(B, T, D, H, H, dh)) + 4 * tokens * sum(hm.heads_per_layer) * dh
    keeps = row * (2 * sum(hm.heads_per_layer) + 10 * hm.num_layers) + 4 * tokens * int(hm.vocab_size or 0)
    return keeps + chunk


def importance_whole(hm: HeadModel, batches: list[tuple], mode: str | None = None) -> int:
    """Bytes ``--importance``'s gradient pass takes beyond what the process holds on a model opened whole: its
    activations (:func:`importance_activations`) and what autograd saves of every layer for the backward pass (no
    layer walk recomputes them) — per token and layer about the largest block's float32 parameters per model width
    (its products' inputs and outputs) and its attention scores, for the largest batch of ``batches`` (``mode``: the
    estimate's largest part, as :func:`importance_activations`)."""
    from headwise.structure import layer_list

    try:
        _, blocks = layer_list(hm.model)
    except ValueError:  # no layer list: its parameters all count as one block's
        blocks = [hm.model]
    largest = max((sum(p.numel() for p in block.parameters()) for block in blocks), default=0)
    B, T = _largest(hm, batches, mode)
    H = max(hm.heads_per_layer or [hm.num_heads])
    saved = 4 * B * T * hm.num_layers * (largest // max(1, hm.width) + H * T)
    return importance_activations(hm, batches, mode) + saved


def check_whole(
    hm: HeadModel, batches: list[tuple], *, mode: str | None = None, kept: int = 0, held: int | None = None
) -> None:
    """``--importance`` on a model opened whole, weighed against a budget given (``--max-memory``) before anything is
    written: what the process holds (``held``, default :func:`~headwise.models.memory.current_rss`), ``kept`` bytes
    the command keeps through the run (a decoder's example maps), the gradient pass's need
    (:func:`importance_whole`; ``mode``: the estimate route's ablation, its parts weighed) and
    :data:`~headwise.models.memory.MIN_WORKING` (the exact ablations' passes take what the budget leaves beside what
    the process holds then: :func:`importance_room`). Nothing on a model opened layer by layer
    (:func:`importance_room` weighs it) or without a budget given.

    Raises:
        MemoryBudgetError: over the budget, naming the budget, the largest batch and the memory the run needs (the
            smallest budget that works, with :data:`~headwise.models.memory.HELD_SLACK`).
    """
    from headwise.models.memory import (
        HELD_SLACK,
        MIN_WORKING,
        MemoryBudgetError,
        current_rss,
        format_size,
        named_size,
    )

    plan = hm.memory
    if hm.stream is not None or plan is None or not plan.given or not batches:
        return
    held = current_rss() if held is None else held
    need = held + kept + importance_whole(hm, batches, mode) + MIN_WORKING
    if need <= plan.budget:
        return
    need += HELD_SLACK  # named: a run given it is not refused again by what the process holds moving
    need = named_size(need)  # rounded up to the figure named
    B, T = _largest(hm, batches, mode)
    message = (
        f"{{option}}: {format_size(plan.budget)} is too small for {hm.name} (opened whole): --importance on passes "
        f"of up to {B} × {T} tokens needs about {format_size(need)} (what the process holds, the gradient pass's "
        "activations and what autograd saves of every layer, the attention-aware estimate's chunks, the exact "
        "ablations' smallest pass); give a {option} at least that"
    )
    raise MemoryBudgetError(message, given=True, budget=plan.budget, need=need, route=plan.route)


def importance_room(hm: HeadModel, batches: list[tuple], mode: str | None = None, *, kept: int = 0) -> int | None:
    """The bytes a budget leaves ``--importance``'s batched ablations. On a model opened layer by layer: what its
    budget leaves after the gradient pass's (:func:`importance_activations`, weighed first: over the budget, the
    one-line refusal of :func:`headwise.models.layer_walk.check_walk`, its need named with
    :data:`~headwise.models.memory.HELD_SLACK` and rounded up, so that the figure named as a budget runs). On a
    model opened whole under a budget given: what it leaves beside what the process holds now and
    :data:`~headwise.models.memory.MIN_WORKING` (weighed before by :func:`check_whole`; the estimate's memory is
    given back before the ablations run). None on a model opened whole without a budget given (the engine's own
    default: half the memory free). ``mode``: the estimate route's ablation (its parts weighed,
    :func:`importance_activations`), None for the exact route; ``kept``: bytes the command will hold by then beyond
    what the process holds now (weighed before the study: what the study keeps)."""
    if hm.stream is None:
        plan = hm.memory
        if plan is None or not plan.given:
            return None
        from headwise.models.memory import MIN_WORKING

        return max(MIN_WORKING, plan.left())
    from headwise.models.layer_walk import READS, walk_need
    from headwise.models.memory import HELD_SLACK, named_size, whole_refused

    keeps = importance_activations(hm, batches, mode)
    need = walk_need(hm, activations=keeps) + kept  # kept: what the command holds by then beyond the process now
    if need > hm.memory.budget:  # named: what the process holds may move by a MB, and the figure is rounded up
        raise whole_refused(hm.name, hm.memory, "--importance", reads=READS, need=named_size(need + HELD_SLACK))
    return hm.memory.budget - walk_need(hm, activations=keeps) + keeps  # the gradient pass's keeps freed by then


def check_top_k(hm: HeadModel, opts: HeadsOptions) -> None:
    """``--top-k`` against the opened model's heads, ``--max-exact`` against the top k (ValueError naming the
    option, before anything is written)."""
    from headwise.study.importance_estimate import default_top_k

    n = hm.num_layers * hm.num_heads
    if opts.top_k is not None and opts.top_k > n:
        raise ValueError(f"--top-k: expected at most the model's {n} heads, got {opts.top_k}")
    k = default_top_k(n) if opts.top_k is None else opts.top_k
    if opts.max_exact is not None and opts.max_exact < k:
        raise ValueError(f"--max-exact: expected at least the {k} heads --top-k seeks, got {opts.max_exact}")


def estimated(hm: HeadModel, opts: HeadsOptions, warn: Callable[[str], None]) -> bool:
    """Whether ``--importance`` takes the estimate route (:func:`~headwise.study.estimate_importance`): not with
    ``--exact``; an encoder always; a decoder when the circuits' wiring reads it (else its sentence said to ``warn``
    and the exact route taken)."""
    if opts.exact:
        return False
    if hm.kind != "decoder":
        return True
    from headwise.circuits.wiring import wiring

    try:
        wiring(hm)
    except ValueError as e:
        warn(f"--importance: every head measured exactly (the estimate reads no such structure: {e})")
        return False
    return True


def run_importance(
    hm: HeadModel,
    batches,
    *,
    seed: int,
    scored: str | None = None,
    eval_batches=None,
    random_orders: int = 3,
    points: int = 33,
    mode: str = "zero",
    copies: int | None = None,
    memory: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
):
    """Importance, ablation and pruning curves of ``hm``'s heads (:func:`headwise.analysis.head_importance`): the
    ablations and every curve point through the batched engine at ``layers.{i}.attn.heads`` — headwise's modules and
    Hugging Face models on headwise's backend alike (zeroed heads: equal to :func:`headwise.hf.ablate`'s
    ``mode="zero"``, tested).

    Args:
        hm: an opened :class:`~headwise.models.HeadModel`.
        batches, scored, eval_batches, random_orders, seed, points, mode, copies, memory: as
            :func:`headwise.analysis.head_importance`.
        progress: ``(stage, done, total)`` as the work goes.
    Returns:
        the :class:`~headwise.analysis.importance.ImportanceResult`.
    """
    from headwise.analysis import head_importance

    return head_importance(
        hm,
        batches,
        scored=scored,
        eval_batches=eval_batches,
        random_orders=random_orders,
        seed=seed,
        points=points,
        mode=mode,
        copies=copies,
        memory=memory,
        progress=progress,
    )


def importance_columns(result) -> dict[str, np.ndarray]:
    """The per-head ``(NL, H)`` columns an importance run adds to ``heads.json`` / ``heads.csv``: Michel et al.'s
    importance (encoders: the turning rate), its per-layer norm, and the exact ablation (``--importance``'s default
    route: null where not measured) — the default route first adds ``ablation_estimate``, every head's estimate."""
    estimate = getattr(result, "estimate", None)
    return {
        "importance": result.importance,
        "importance_norm": result.importance_norm,
        **({} if estimate is None else {"ablation_estimate": estimate}),
        "ablation_delta": result.ablation,
    }


def importance_summary(result) -> dict:
    """The importance run's settings and headline numbers for ``heads.json``."""
    n = result.importance.size
    half = int(np.searchsorted(result.removed, n // 2))
    half = min(half, len(result.removed) - 1)
    route = {}
    if getattr(result, "estimate", None) is not None:
        h = result.importance.shape[1]
        agreement = dict(result.agreement)
        if "largest_error" in agreement:
            worst = dict(agreement["largest_error"])
            flat = worst.pop("flat")
            agreement["largest_error"] = {"layer": flat // h, "head": flat % h, **worst}
        route = {
            "route": "estimate",
            "estimator": result.estimator,
            "exact_heads": result.search
            or {
                "top_k": result.top_k,
                "heads": [[int(f) // h, int(f) % h] for f in result.measured],
            },
            "agreement": agreement,
        }
    else:
        route = {"route": "exact"}
    return {
        **route,
        "objective": result.objective,
        "base_loss": result.base_loss,
        "sequences": result.num_sequences,
        "tokens": result.num_tokens,
        "random_seeds": list(result.random_seeds),
        "importance_convention": (
            "Michel et al. 2019: E_x |dL/dxi_h| at xi = 1, gate on the head's output where it enters the output "
            "projection; importance_norm divides by the layer's l2 norm"
            if result.kind == "decoder"
            else "encoder without an LM head: E_x ||(I - e e^T/|e|^2) de/dxi_h|| / |e| for the mean-pooled "
            "embedding e (the first-order turning rate; the cosine loss itself has zero gradient at xi = 1)"
        ),
        "sweep": dict(getattr(result, "sweep", {}) or {}),
        "half_removed": {
            "removed": int(result.removed[half]),
            **{k: float(v[half]) for k, v in result.curves.items()},
        },
    }
