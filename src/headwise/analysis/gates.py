"""Michel et al.'s head importance from the gates: ``I_h = E_x |∂L(x)/∂ξ_h|`` (decoders: one backward pass per
batch, one gate per sequence and head) and, for encoders, the embedding's turning rate under forward-mode
differentiation (see :mod:`headwise.analysis.importance`).

Shape legend: B batch, L padded length, NL layers, H heads per layer, P rows of a part, D model width.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from headwise.analysis.objective import (
    decoder_targets,
    mean_pooled,
    no_cache,
    scored_logits,
    scoring,
    token_losses,
)
from headwise.analysis.protocol import GatedModel, SweptModel
from headwise.analysis.sweep_plan import marked_ends, row_parts
from headwise.points import layer_point

__all__ = ["RECOMPUTE_TOKENS", "decoder_importance", "encoder_importance", "gate_importance", "recomputed"]

Progress = Callable[[str, int, int], None]

#: Tokens of one gradient batch past which each block is recomputed in the backward pass instead of keeping its
#: activations (:func:`recomputed`): memory one block's activations, not NL blocks', at 8,192 tokens.
RECOMPUTE_TOKENS = 2048


def decoder_importance(
    hm: GatedModel, batches, scored, progress, recompute: bool | None = None
) -> tuple[np.ndarray, int, float, int]:
    """``(importance (NL, H), sequences, loss, tokens)``: the gates' gradients and, from the same forward at ξ = 1
    (the gates multiply by 1: the intact model), the objective on ``batches``.

    The LM head runs on the scored positions alone and the loss by chunks (:func:`scored_rows`,
    :func:`token_losses`); columns where every row is padding are not run; past :data:`RECOMPUTE_TOKENS` tokens a
    batch (``recompute`` None) each block is recomputed in the backward pass (:func:`recomputed`)."""
    import torch

    dtype = next(hm.model.parameters()).dtype
    grads = []
    total, count = 0.0, 0
    for k, batch in enumerate(batches):
        ids, mask, targets, chosen = decoder_targets(batch, scored)
        if mask is not None:  # columns where every row is padding change nothing before them (right padding)
            L = max(1, int(marked_ends(mask > 0).max()))
            ids, mask, targets, chosen = ids[:, :L], mask[:, :L], targets[:, :L], chosen[:, :L]
        B, L = ids.shape
        index = chosen.reshape(-1).nonzero()[:, 0]  # (m,) flat scored positions
        n = chosen.sum(dim=1)  # (B,)
        gates = torch.ones((B, hm.num_layers, hm.num_heads), dtype=dtype, requires_grad=True)  # (B, NL, H)
        on = recompute if recompute is not None else B * L > RECOMPUTE_TOKENS
        with hm.gated(gates), no_cache(hm), recomputed(hm, on):
            logits = scored_logits(hm, partial(hm.forward, ids, mask), index)  # (m, V)
            ce = token_losses(logits, targets.reshape(-1)[index])  # (m,)
            per_row = torch.zeros(B, dtype=ce.dtype).index_add(0, index // L, ce)
            losses = per_row / n.clamp(min=1)
            losses.sum().backward()  # sequence b's loss depends only on its own gates: per-example gradients
        grads.append(gates.grad.abs()[n > 0].double())
        total += float((losses.detach() * n).sum())
        count += int(n.sum())
        progress("importance", k + 1, len(batches))
    g = torch.cat(grads)  # (sequences, NL, H)
    return g.mean(dim=0).numpy(), g.shape[0], total / max(count, 1), count


def encoder_importance(hm: SweptModel, batches, references, progress, *, squares: bool = False) -> tuple:
    """``(importance (NL, H), sentences)`` — with ``squares``, ``(importance, sentences, second order (NL, H))``, the
    second order ``E_x θ_h(x)² / 2`` the first-order estimate of the ablation's ``1 − cos`` (``1 − cos θ ≈ θ²/2``,
    the gate moved by 1; not attention-aware: a linearisation of the whole model). Forward-mode ∂e/∂ξ_h of every
    head, per sentence: one pass per layer and part of the rows, the intact model
    run once (the primal) and the H directional derivatives of that layer's gates carried beside it as one batch of
    tangents (:func:`torch.func.jvp` under :func:`torch.func.vmap`: every product of the primal is formed once, not
    once per head).

    The rows are packed by length (:func:`row_parts`: each sentence cut after its last real token, the rows longest
    first in parts of at most :data:`~headwise.analysis.batched.PASS_TOKENS` ÷ H tokens), so no pass carries
    tangents of padding beyond its part's longest row. Below layer l no tangent exists (only layer l's gates move),
    so the layers below it run on the primal alone."""
    import torch
    from torch.func import jvp, vmap

    from headwise.analysis.batched import PASS_TOKENS
    from headwise.points import attention_point

    nl, h = hm.num_layers, hm.num_heads
    parameter = next(hm.model.parameters())
    dtype, device = parameter.dtype, parameter.device
    cap = max(1, PASS_TOKENS.get(device.type, PASS_TOKENS["cpu"]) // h)
    parts, sequences = row_parts(batches, "embedding", references, True, cap)
    total = np.zeros((nl, h))
    second = np.zeros((nl, h))
    done = 0
    for part in parts:
        ids, mask, e = part.ids, part.mask, part.reference  # (P, L), (P, L), (P, D)
        P = ids.shape[0]
        unit = e / e.norm(dim=-1, keepdim=True)
        ones = torch.ones((P, h), dtype=dtype, device=device)  # (P, H): one gate per sentence and head
        tangents = torch.eye(h, dtype=dtype, device=device)[:, None, :].expand(h, P, h).contiguous()  # (H, P, H)
        for layer in range(nl):

            def embedding(gates, layer=layer, ids=ids, mask=mask):  # (P, H) -> (P, D)
                def gate(out):  # (P, H, L, Dh)
                    return out * gates[:, :, None, None].to(out.dtype)

                with hm.hooks({attention_point(layer, "heads"): gate}):
                    return mean_pooled(hm.forward(ids, mask, math_path=True), mask)

            with torch.no_grad():
                de = vmap(lambda t, f=embedding, x=ones: jvp(f, (x,), (t,))[1])(tangents)  # (H, P, D): ∂e/∂ξ of head r
            turn = de - (de * unit).sum(-1, keepdim=True) * unit  # the part orthogonal to e
            rate = turn.norm(dim=-1) / e.norm(dim=-1)  # (H, P)
            total[layer] += rate.double().sum(dim=1).cpu().numpy()
            second[layer] += (rate.double() ** 2 / 2).sum(dim=1).cpu().numpy()
            done += 1
            progress("importance", done, len(parts) * nl)
    if squares:
        return total / max(sequences, 1), sequences, second / max(sequences, 1)
    return total / max(sequences, 1), sequences


def gate_importance(hm: GatedModel, batches: Sequence, *, scored: str | None = None, progress: Progress | None = None):
    """Michel et al.'s importance alone: ``(importance (NL, H), sequences)``, ``E_x |∂L(x)/∂ξ_h|`` over the
    sequences of ``batches`` (encoders: the embedding's turning rate). See :func:`head_importance`."""
    import torch

    if not batches:
        raise ValueError("batches: expected at least one batch, got none")
    scored = scoring(hm, scored)
    progress = progress or (lambda *_: None)
    if scored != "embedding":
        return decoder_importance(hm, batches, scored, progress)[:2]
    with torch.no_grad():
        references = [mean_pooled(hm.forward(ids, mask), mask) for ids, mask in batches]
    return encoder_importance(hm, batches, references, progress)


@contextlib.contextmanager
def recomputed(hm: GatedModel, on: bool):
    """Inside the block (``on``), every block at ``layers.{i}.resid_pre`` runs under activation checkpointing
    (``torch.utils.checkpoint``, non-reentrant): the backward recomputes each block from its input, so a gradient
    pass keeps one block's activations instead of NL. Gradients are the same (the recomputation is the same
    computation; :func:`headwise.points.replaced_calls`). Nothing where the model shows no blocks, or inside a
    :func:`~headwise.models.layer_walk.layer_walk` (which checkpoints every block itself)."""
    from headwise.points import replaced_calls

    names = [layer_point(i, "resid_pre") for i in range(hm.num_layers)]
    points = getattr(hm, "points", None)
    stream = getattr(hm, "stream", None)
    walking = stream is not None and stream.walk_depth  # a layer walk checkpoints every block already
    if not on or walking or points is None or any(n not in points for n in names):
        yield
        return
    with replaced_calls(points, names, _checkpointed):
        yield


def _checkpointed(_k, forward, *args, **kwargs):
    from torch.utils.checkpoint import checkpoint

    return checkpoint(forward, *args, use_reentrant=False, **kwargs)
