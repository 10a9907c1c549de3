"""Measured ablation: the objective with each head set removed, through the batched engine
(:func:`headwise.analysis.batched.run_copies`) — J sets as J copies of the rows in one forward, the passes planned
by :mod:`headwise.analysis.sweep_plan`.

Shape legend: c jobs in a pass, P rows of a part, L its length, m scored positions, D model width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from headwise.analysis.objective import (
    mean_pooled,
    no_cache,
    scored_logits,
    scored_rows,
    scoring,
    token_losses,
)
from headwise.analysis.protocol import GatedModel, SweptModel
from headwise.analysis.sweep_plan import Part, bytes_per_token, pass_plan, row_parts
from headwise.checks import one_of, positive_int

__all__ = ["ablation_objectives"]


def _pass_objective(hm: SweptModel, part: Part, jobs, mode: str, kept, prefix: bool, scored: str, layered=None):
    """One pass: ``(per job objective sums (c,) float64, the layer the copies started at)``; ``layered``: copies a
    block call of a layered pass (:func:`~headwise.analysis.batched.staggered`; the jobs in start-layer order)."""
    import torch

    from headwise.analysis.batched import run_copies

    c, P, L = len(jobs), part.ids.shape[0], part.ids.shape[1]
    real = None if part.mask is None else part.mask > 0

    def run(repeat):
        mask = None if part.mask is None else part.mask.repeat(repeat, 1)
        return hm.forward(part.ids.repeat(repeat, 1), mask)

    engine = dict(replacement=mode, real=real, prefix=prefix, kept=kept, layered=layered)
    if scored == "embedding":
        out, low = run_copies(hm, run, part.ids, jobs, **engine)
        e = mean_pooled(out, part.mask.repeat(c, 1))
        loss = 1 - torch.nn.functional.cosine_similarity(e, part.reference.repeat(c, 1), dim=-1)
        return loss.double().reshape(c, P).sum(dim=1), low
    m = part.index.shape[0]
    first = 0 if layered is None else 1  # a layered pass's copy 0 is the base's rows: nothing scored there
    index = ((torch.arange(c)[:, None] + first) * (P * L) + part.index[None, :]).reshape(-1)  # (c·m,) of the rows

    def scored_run(repeat):
        with scored_rows(hm, index) as selected:
            out = run(repeat)
        return out if selected else out.reshape(-1, out.shape[-1])[index]

    logits, low = run_copies(hm, scored_run, part.ids, jobs, **engine, whole_rows=layered is None)
    ce = token_losses(logits, part.targets.repeat(c))  # (c·m,)
    return ce.double().reshape(c, m).sum(dim=1), low


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
    engine (:mod:`headwise.analysis.batched`): J jobs as J copies of the input rows in one forward.

    The plan (``copies`` None): jobs grouped by the layer their copies start at (:func:`~headwise.analysis.batched.
    start_groups`; a pass never holds jobs of two start layers, so none runs layers below its own); each group of
    rows runs once intact with every block's output kept (:func:`~headwise.analysis.batched.keep_blocks`), and each
    pass starts from the kept residual stream at its layer's input (:func:`~headwise.analysis.batched.replayed`) —
    no layer below a job's lowest runs again. Zero ablation packs the rows by length (no pass computes padding past
    its longest row, nor a decoder's last token, which has no target); decoders form the LM head's logits at the
    scored positions alone and the loss by chunks of :data:`LOSS_CHUNK` positions.

    Args:
        hm: a :class:`~headwise.models.HeadModel` (its ``hooks`` and named points).
        batches: as :func:`objective`.
        jobs: head sets ``{layer: [head, …]}`` (an empty one: the intact model).
        scored, reference: as :func:`objective`.
        mode: ``"zero"`` (ξ_h = 0) or ``"mean"`` (the head's mean over the batch's real positions in the same
            forward, as :func:`headwise.hf.ablate`'s ``mode="mean"``).
        copies: J, exactly this many jobs per pass, in the order of their start layers, each batch as given (None:
            the plan above, J as many as ``memory`` allows, at most 64 and at most
            :data:`~headwise.analysis.batched.PASS_TOKENS` tokens a pass).
        memory: bytes a pass may use (None: half the memory free on the model's device).
        prefix: start each pass at the lowest layer its jobs touch (False: every pass runs every layer).
        cost: a :class:`~headwise.analysis.batched.SweepCost` the passes are added to.
        progress: ``progress(passes done, passes in all)``.
    Returns:
        ``(len(jobs),)`` float64: the objective (decoders: cross-entropy over every scored token; encoders: mean
        ``1 − cos`` against ``reference``) with that job's heads removed.
    """
    import time

    from headwise.analysis.batched import MODES, SweepCost

    one_of("mode", mode, MODES)
    scored = scoring(hm, scored)
    cost = cost if cost is not None else SweepCost()
    if copies is not None:
        positive_int("copies", copies)
    t0 = time.perf_counter()
    parts, count, plan, budget, calls = _plan(
        hm, batches, jobs, scored=scored, reference=reference, mode=mode, copies=copies, memory=memory, prefix=prefix
    )
    cost.copies = max(cost.copies, max((len(chunk) for _, chunk in plan), default=0))
    cost.memory_budget = 0 if copies is not None else budget
    sums = _run_passes(
        hm, parts, plan, jobs, mode=mode, prefix=prefix, scored=scored, cost=cost, progress=progress, calls=calls
    )
    nl = hm.num_layers
    cost.tokens = sum(part.tokens for part in parts)
    cost.forward_equivalents = cost.layer_tokens / max(nl * cost.tokens, 1)
    cost.seconds += time.perf_counter() - t0
    return sums / max(count, 1)


def _plan(hm: SweptModel, batches, jobs, *, scored: str, reference, mode: str, copies, memory, prefix: bool):
    """The passes of :func:`ablation_objectives`: ``(parts, the scored count, [(part index, job indices)], the
    memory budget in bytes, {part index: copies a block call} of layered passes or None)``. ``copies`` given: that
    many jobs a pass, in the order of their start layers, each batch as given; a model opened layer by layer
    (:func:`_layered_plan`): every job in one group in start-layer order, passes as many jobs as its budget holds;
    else jobs grouped by start layer, rows packed by length for zero ablation, J as many as the budget and
    :data:`~headwise.analysis.batched.PASS_TOKENS` allow (at most 64; a decoder's budget less one chunk of its loss's
    exponentials, :data:`~headwise.analysis.objective.LOSS_CHUNK` positions × the vocabulary)."""
    from headwise.analysis.batched import PASS_TOKENS, free_memory, shows_blocks, start_groups
    from headwise.analysis.objective import LOSS_CHUNK

    if copies is None and prefix and getattr(hm, "stream", None) is not None and shows_blocks(hm):
        device = next(hm.model.parameters()).device
        room = int(memory if memory is not None else free_memory(device) // 2)
        return _layered_plan(hm, batches, jobs, scored=scored, reference=reference, mode=mode, room=room)

    width = getattr(hm, "vocab_size", None) if scored != "embedding" else None
    row_bytes = bytes_per_token(hm, int(width or 1024))
    device = next(hm.model.parameters()).device
    budget = int(memory if memory is not None else free_memory(device) // 2)
    most = 64
    # a decoder's loss takes one chunk's exponentials (LOSS_CHUNK positions × the vocabulary) beside the pass's rows
    loss = 4 * LOSS_CHUNK * int(width) if width is not None else 0
    tokens = min(PASS_TOKENS.get(device.type, PASS_TOKENS["cpu"]), max(1, (budget - loss) // max(1, row_bytes)))
    if copies is not None:
        lowest = [min((int(k) for k, v in job.items() if v), default=0) for job in jobs]
        groups = [(0, sorted(range(len(jobs)), key=lambda j: -lowest[j]))]
        parts, count = row_parts(batches, scored, reference, False, 0)
        plan = pass_plan(groups, parts, lambda part, members: copies)
    else:
        groups = start_groups(hm, jobs, prefix)
        size = min(most, max((len(m) for _, m in groups), default=1), max(hm.heads_per_layer or [hm.num_heads]))
        parts, count = row_parts(batches, scored, reference, mode == "zero", max(1, tokens // max(1, size)))
        plan = pass_plan(
            groups, parts, lambda part, members: max(1, min(len(members), most, tokens // max(1, part.tokens)))
        )
    return parts, count, plan, budget, None


def _layered_plan(hm: SweptModel, batches, jobs, *, scored: str, reference, mode: str, room: int):
    """:func:`_plan` on a model opened layer by layer, where every pass reads the layers it runs: the rows of each
    batch in one part (packed for zero ablation, no cap), every job in one group in start-layer order, and passes of
    as many jobs as the budget holds beside a layer walk's (:func:`~headwise.analysis.batched.layered_plan`; a job
    holds its copy's residual stream at a block's input and output and its output — the scored positions' logits
    and their losses, or an encoder's last hidden states), each job joining at its own start layer."""
    from headwise.analysis.batched import layered_plan, start_layer

    starts = [start_layer(hm, [job]) for job in jobs]
    groups = [(0, sorted(range(len(jobs)), key=lambda j: starts[j]))]
    parts, count = row_parts(batches, scored, reference, mode == "zero", 1 << 62)
    D, V = hm.width, int(getattr(hm, "vocab_size", 0) or 0)
    calls, sizes = {}, {}
    for k, part in enumerate(parts):
        P, L = part.ids.shape
        out = 2 * len(part.index) * V if scored != "embedding" else 2 * P * L * D
        sizes[id(part)], calls[k] = layered_plan(hm, P, L, 4 * (2 * P * L * D + out), len(jobs), room=room)
    plan = pass_plan(groups, parts, lambda part, members: sizes[id(part)])
    return parts, count, plan, hm.memory.budget, calls


def _run_passes(hm: SweptModel, parts, plan, jobs, *, mode: str, prefix: bool, scored: str, cost, progress, calls=None):
    """Run ``plan``'s passes: each group of rows once intact with every block's output kept (where a job starts
    above layer 0), then each pass from there; ``calls`` (layered passes: copies a block call per part) — each pass
    carries the base's rows itself, nothing kept. Returns the objective's sums per job ``(len(jobs),)``; the passes,
    rows and layers run are added to ``cost``."""
    import torch

    from headwise.analysis.batched import keep_blocks, start_layer

    nl = hm.num_layers
    deep = calls is None and prefix and any(start_layer(hm, [job]) > 0 for job in jobs)
    sums = np.zeros(len(jobs))
    kept: list = []
    current = -1
    none = torch.zeros(0, dtype=torch.long)  # the intact forward scores nothing: its LM head runs on no position
    with torch.no_grad(), no_cache(hm):
        for done, (k, chunk) in enumerate(plan, start=1):
            part = parts[k]
            P = part.ids.shape[0]
            if k != current:  # a new group of rows: run it once intact, every block's output kept
                current, kept = k, []
                if deep:
                    _, kept = keep_blocks(hm, partial(scored_logits, hm, partial(_forward, hm, part), none))
                    if kept:
                        cost.kept_passes += 1
                        cost.rows += P
                        cost.layer_rows += nl * P
                        cost.layer_tokens += nl * part.tokens
            layered = None if calls is None else calls[k]
            per_job, low = _pass_objective(hm, part, [jobs[i] for i in chunk], mode, kept, prefix, scored, layered)
            sums[chunk] += per_job.cpu().numpy()
            c = len(chunk)
            cost.passes += 1
            cost.rows += c * P
            if layered is None:
                run = (nl - low) * c
            else:  # each job from its own start layer, the base's rows from the lowest
                run = sum(nl - start_layer(hm, [jobs[i]]) for i in chunk) + nl - low
            cost.layer_rows += run * P
            cost.layer_tokens += run * part.tokens
            if progress is not None:
                progress(done, len(plan))
    return sums


def _forward(hm: GatedModel, part: Part):
    return hm.forward(part.ids, part.mask)
