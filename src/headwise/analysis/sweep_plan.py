"""The plan of an ablation sweep: the rows each pass runs and the passes' order (see
:func:`headwise.analysis.ablation.ablation_objectives`).

Shape legend: P rows of a part, L its length (its longest row), m scored positions, D model width.

Zero ablation leaves rows independent, so every row is cut after the last position that matters to it and the rows,
longest first, are packed into parts (:func:`row_parts`, :func:`packing`); mean ablation takes its mean over the
whole batch, so each batch is one part. The passes run each part with the jobs of each start-layer group in chunks
(:func:`pass_plan`), J from the bytes a token of one row takes (:func:`bytes_per_token`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from headwise.analysis.objective import decoder_targets
from headwise.analysis.protocol import GatedModel

__all__ = ["PART_TOKENS", "Part", "bytes_per_token", "marked_ends", "packing", "pass_plan", "row_parts"]


def bytes_per_token(hm: GatedModel, width: int) -> int:
    """Bytes per token of one row of a forward without gradient: the output (``width`` floats: the logits of the
    scored positions alone, :func:`scored_rows`) and the layers' activations (about 40 model widths, the residual
    width estimated from the parameters as √(parameters / (12 · NL)))."""
    params = [p for p in hm.model.parameters()]
    itemsize = params[0].element_size() if params else 4
    d = math.sqrt(sum(p.numel() for p in params) / (12 * max(hm.num_layers, 1))) if params else 64
    return int(4 * width + 40 * itemsize * d)


@dataclass
class Part:
    """Rows one pass runs (every copy): ``ids``, ``mask`` ``(P, L)`` (mask None: no padding), decoders' flat scored
    positions ``index (m,)`` and their ``targets (m,)``, encoders' reference embeddings ``reference (P, D)``."""

    ids: object
    mask: object
    index: object = None
    targets: object = None
    reference: object = None

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[0] * self.ids.shape[1])


def row_parts(batches, scored: str, reference, repack: bool, cap: int) -> tuple[list[Part], int]:
    """The rows of ``batches`` as the passes run them, and the count the objective is averaged over (scored tokens;
    sentences for encoders).

    ``repack`` (rows independent: zero ablation): every row cut after the last position that matters to it (a
    decoder's last scored position, causal attention; an encoder's last real token) and the rows, longest first,
    packed into parts of at most ``cap`` tokens (rows × their longest) — no pass computes padding beyond its part's
    longest row, and rows with no scored position are not run. Else (mean ablation: the mean is over the whole batch)
    each batch is one part, only the columns where every row is padding cut."""
    import torch

    rows = []  # (length, ids (l,), mask (l,) | None, targets (l,) | None, chosen (l,) | None, reference (D,) | None)
    parts: list[Part] = []
    count = 0
    for k, batch in enumerate(batches):
        if scored == "embedding":
            ids, mask = batch
            targets = chosen = None
            count += ids.shape[0]
            ends = marked_ends(mask > 0)
        else:
            ids, mask, targets, chosen = decoder_targets(batch, scored)
            count += int(chosen.sum())
            ends = marked_ends(chosen) if repack else marked_ends(mask > 0) if mask is not None else None
        ref = reference[k] if reference is not None else None
        if not repack:
            L = ids.shape[1] if ends is None else max(1, int(ends.max()))
            parts.append(_part(ids[:, :L], None if mask is None else mask[:, :L], targets, chosen, ref, L))
            continue
        for p in range(ids.shape[0]):
            length = int(ends[p])
            if length == 0:
                continue  # nothing scored (a decoder's one-token line): its loss terms are none
            rows.append(
                (
                    length,
                    ids[p, :length],
                    None if mask is None else mask[p, :length],
                    None if targets is None else targets[p, :length],
                    None if chosen is None else chosen[p, :length],
                    None if ref is None else ref[p],
                )
            )
    if not repack:
        return parts, count
    rows.sort(key=lambda r: -r[0])
    for a, b in packing([r[0] for r in rows], cap):
        group = rows[a:b]
        if group:
            L = group[0][0]
            ids = torch.zeros((len(group), L), dtype=group[0][1].dtype)
            has_mask = group[0][2] is not None
            mask = torch.zeros((len(group), L), dtype=group[0][2].dtype) if has_mask else None
            targets = torch.zeros((len(group), L), dtype=torch.long) if group[0][3] is not None else None
            chosen = torch.zeros((len(group), L), dtype=torch.bool) if group[0][4] is not None else None
            for p, (n, i, m, t, c, _) in enumerate(group):
                ids[p, :n] = i
                if has_mask:
                    mask[p, :n] = m
                if targets is not None:
                    targets[p, :n], chosen[p, :n] = t, c
            ref = torch.stack([r[5] for r in group]) if group[0][5] is not None else None
            parts.append(_part(ids, mask, targets, chosen, ref, L))
    return parts, count


#: What one more part costs the packing of :func:`packing`, in padded tokens: each part is run by every group of
#: passes, and a pass's fixed cost (hooks, small products) is about that of a few tokens' work.
PART_TOKENS = 16


def packing(lengths: Sequence[int], cap: int) -> list[tuple[int, int]]:
    """Contiguous parts ``[(start, stop), …]`` of ``lengths`` (sorted longest first) minimising the tokens run
    (each part: its rows × its longest) plus :data:`PART_TOKENS` a part, each part at most ``cap`` tokens (a row
    longer than ``cap`` alone). Exact (dynamic programming over the cut points)."""
    n = len(lengths)
    best = [0.0] + [math.inf] * n
    cut = [0] * (n + 1)
    for b in range(1, n + 1):
        for a in range(b - 1, -1, -1):
            if a < b - 1 and (b - a) * lengths[a] > cap:
                break
            cost = best[a] + (b - a) * lengths[a] + PART_TOKENS
            if cost < best[b]:
                best[b], cut[b] = cost, a
    parts = []
    b = n
    while b > 0:
        parts.append((cut[b], b))
        b = cut[b]
    return parts[::-1]


def marked_ends(marked):
    """``(B,)``: one past the last marked position of each row of ``marked (B, L)`` bool (0: none marked)."""
    import torch

    L = marked.shape[1]
    last = torch.where(marked, torch.arange(1, L + 1), torch.zeros((), dtype=torch.long)).max(dim=1).values
    return last


def _part(ids, mask, targets, chosen, reference, L: int) -> Part:
    if targets is None:
        return Part(ids, mask, reference=reference)
    chosen = chosen[:, :L]
    index = chosen.reshape(-1).nonzero()[:, 0]
    return Part(ids, mask, index=index, targets=targets[:, :L].reshape(-1)[index])


def pass_plan(groups, parts, J_of) -> list[tuple[int, list[int]]]:
    """``[(part, [job, …]), …]``: each part's passes, the jobs of each start-layer group in chunks of ``J_of(part,
    group)``."""
    plan = []
    for k, part in enumerate(parts):
        for _low, members in groups:
            J = J_of(part, members)
            plan.extend((k, members[i : i + J]) for i in range(0, len(members), J))
    return plan
