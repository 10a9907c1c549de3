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
    "estimated",
    "importance_batches",
    "importance_activations",
    "importance_columns",
    "importance_room",
    "importance_summary",
    "importance_texts",
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


def importance_activations(hm: HeadModel, batches: list[tuple]) -> int:
    """Bytes of activations ``--importance``'s gradient pass keeps on ``hm`` for its largest batch of ``batches``
    (``(ids (B, T), …)``), float32, an upper bound: each head's output change and its first-order write change
    ``(B, H, T, D)`` (the estimate's), the per-layer records of the attention-aware terms (the block's input, queries,
    keys, values, outputs and their gradients, about ``(B, T, D)`` each), the residual stream at every layer boundary,
    and the logits ``(B, T, V)``."""
    D = hm.width
    tokens = max((int(b[0].numel()) for b in batches), default=0)  # B·T of the largest batch
    row = 4 * tokens * D
    return row * (2 * sum(hm.heads_per_layer) + 10 * hm.num_layers) + 4 * tokens * int(hm.vocab_size or 0)


def importance_room(hm: HeadModel, batches: list[tuple]) -> int | None:
    """On a model opened layer by layer, the bytes its budget leaves the batched ablations after the gradient pass's
    (:func:`importance_activations`, weighed first: over the budget, the one-line refusal of
    :func:`headwise.models.layer_walk.check_walk`); None on a model opened whole (the engine's own default)."""
    if hm.stream is None:
        return None
    from headwise.models.layer_walk import check_walk, walk_need

    keeps = importance_activations(hm, batches)
    check_walk(hm, "--importance", activations=keeps)
    return hm.memory.budget - walk_need(hm, activations=keeps) + keeps  # the gradient pass's keeps freed by then


def check_top_k(hm: HeadModel, opts: HeadsOptions) -> None:
    """``--top-k`` against the opened model's heads (ValueError naming it, before anything is written)."""
    n = hm.num_layers * hm.num_heads
    if opts.top_k is not None and opts.top_k > n:
        raise ValueError(f"--top-k: expected at most the model's {n} heads, got {opts.top_k}")


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
            "exact_heads": {
                "top_k": result.top_k,
                "random": int(len(result.measured) - result.top_k),
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
