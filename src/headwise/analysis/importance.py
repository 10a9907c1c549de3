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

import contextlib
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


def _decoder_importance(
    hm: GatedModel, batches, scored, progress, recompute: bool | None = None
) -> tuple[np.ndarray, int, float, int]:
    """``(importance (NL, H), sequences, loss, tokens)``: the gates' gradients and, from the same forward at ξ = 1
    (the gates multiply by 1: the intact model), the objective on ``batches``.

    The LM head runs on the scored positions alone and the loss by chunks (:func:`_scored_rows`,
    :func:`_token_losses`); columns where every row is padding are not run; past :data:`RECOMPUTE_TOKENS` tokens a
    batch (``recompute`` None) each block is recomputed in the backward pass (:func:`_recomputed`)."""
    import torch

    dtype = next(hm.model.parameters()).dtype
    grads = []
    total, count = 0.0, 0
    for k, batch in enumerate(batches):
        ids, mask, targets, chosen = _targets(batch, scored)
        if mask is not None:  # columns where every row is padding change nothing before them (right padding)
            L = max(1, int(_ends(mask > 0).max()))
            ids, mask, targets, chosen = ids[:, :L], mask[:, :L], targets[:, :L], chosen[:, :L]
        B, L = ids.shape
        index = chosen.reshape(-1).nonzero()[:, 0]  # (m,) flat scored positions
        n = chosen.sum(dim=1)  # (B,)
        gates = torch.ones((B, hm.num_layers, hm.num_heads), dtype=dtype, requires_grad=True)  # (B, NL, H)
        on = recompute if recompute is not None else B * L > RECOMPUTE_TOKENS
        with hm.gated(gates), _no_cache(hm), _recomputed(hm, on):
            logits = _scored_logits(hm, partial(hm.forward, ids, mask), index)  # (m, V)
            ce = _token_losses(logits, targets.reshape(-1)[index])  # (m,)
            per_row = torch.zeros(B, dtype=ce.dtype).index_add(0, index // L, ce)
            losses = per_row / n.clamp(min=1)
            losses.sum().backward()  # sequence b's loss depends only on its own gates: per-example gradients
        grads.append(gates.grad.abs()[n > 0].double())
        total += float((losses.detach() * n).sum())
        count += int(n.sum())
        progress("importance", k + 1, len(batches))
    g = torch.cat(grads)  # (sequences, NL, H)
    return g.mean(dim=0).numpy(), g.shape[0], total / max(count, 1), count


def _encoder_importance(hm: SweptModel, batches, references, progress) -> tuple[np.ndarray, int]:
    """Forward-mode ∂e/∂ξ_h of every head, per sentence: one pass per layer and part of the rows, the intact model
    run once (the primal) and the H directional derivatives of that layer's gates carried beside it as one batch of
    tangents (:func:`torch.func.jvp` under :func:`torch.func.vmap`: every product of the primal is formed once, not
    once per head).

    The rows are packed by length (:func:`_parts`: each sentence cut after its last real token, the rows longest
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
    parts, sequences = _parts(batches, "embedding", references, True, cap)
    total = np.zeros((nl, h))
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
                    return _pooled(hm.forward(ids, mask, math_path=True), mask)

            with torch.no_grad():
                de = vmap(lambda t, f=embedding, x=ones: jvp(f, (x,), (t,))[1])(tangents)  # (H, P, D): ∂e/∂ξ of head r
            turn = de - (de * unit).sum(-1, keepdim=True) * unit  # the part orthogonal to e
            rate = turn.norm(dim=-1) / e.norm(dim=-1)  # (H, P)
            total[layer] += rate.double().sum(dim=1).cpu().numpy()
            done += 1
            progress("importance", done, len(parts) * nl)
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
    """Bytes per token of one row of a forward without gradient: the output (``width`` floats: the logits of the
    scored positions alone, :func:`_scored_rows`) and the layers' activations (about 40 model widths, the residual
    width estimated from the parameters as √(parameters / (12 · NL)))."""
    params = [p for p in hm.model.parameters()]
    itemsize = params[0].element_size() if params else 4
    d = math.sqrt(sum(p.numel() for p in params) / (12 * max(hm.num_layers, 1))) if params else 64
    return int(4 * width + 40 * itemsize * d)


#: Positions whose log-softmax is formed at once: the loss runs by chunks of this many scored positions, so that
#: no float32 copy of all the logits is held besides the logits themselves.
LOSS_CHUNK = 1024
#: Tokens of one gradient batch past which each block is recomputed in the backward pass instead of keeping its
#: activations (:func:`_recomputed`): memory one block's activations, not NL blocks', at 8,192 tokens.
RECOMPUTE_TOKENS = 2048


def _output_module(hm):
    """The decoder's output embedding (the LM head: ``(…, D) -> (…, V)``), or None."""
    from torch import nn

    get = getattr(hm.model, "get_output_embeddings", None)
    module = get() if callable(get) else getattr(hm.model, "unembed", None)
    return module if isinstance(module, nn.Module) else None


@contextlib.contextmanager
def _scored_rows(hm, index):
    """Inside the block the decoder's LM head runs on the flat positions ``index`` ``(n,)`` of its input ``(N, L, D)``
    alone and the forward returns ``(n, V)`` logits (the model's own code after the head, soft-capping included,
    acts on them) — no logits of padding, of unscored positions or of the last token. Yields whether it could (a
    model without a recognised head: False, the forward returns all logits)."""
    module = _output_module(hm)
    if module is None:
        yield False
        return

    def pre(_module, args):
        x = args[0]
        return (x.reshape(-1, x.shape[-1])[index], *args[1:])

    handle = module.register_forward_pre_hook(pre)
    try:
        yield True
    finally:
        handle.remove()


def _scored_logits(hm, forward, index):
    """``(n, V)`` logits of the flat positions ``index`` of ``forward()``'s ``(N, L, V)`` output."""
    with _scored_rows(hm, index) as selected:
        out = forward()
    return out if selected else out.reshape(-1, out.shape[-1])[index]


def _token_losses(logits, targets):
    """Cross-entropy ``(n,)`` float32 of logits ``(n, V)`` against ``targets (n,)``, :data:`LOSS_CHUNK` positions at a
    time (``logsumexp − the target's logit``, as ``F.cross_entropy``)."""
    import torch

    # One formula with and without a gradient (the ablations are differences of these losses). logsumexp keeps only
    # its input (a view of the logits) and its result for the backward pass, where cross_entropy would keep a
    # (chunk, V) log-softmax per chunk; on 4 SmolLM2 lines it was also the closer to a float64 reference (1e-7
    # against 8e-6 nats), for about 1.3 × cross_entropy's time on a CPU (about 10 % of a sweep).
    parts = []
    for s in range(0, logits.shape[0], LOSS_CHUNK):
        x, t = logits[s : s + LOSS_CHUNK].float(), targets[s : s + LOSS_CHUNK]
        parts.append(torch.logsumexp(x, dim=-1) - x.gather(1, t[:, None])[:, 0])
    return torch.cat(parts) if parts else logits.new_zeros(0, dtype=torch.float32)


@contextlib.contextmanager
def _no_cache(hm):
    """Inside the block a Hugging Face model builds no key/value cache (``config.use_cache`` False): a pass reads its
    logits once, and a recomputed block must not append its keys a second time."""
    config = getattr(hm.model, "config", None)
    saved = getattr(config, "use_cache", None)
    if saved is None:
        yield
        return
    try:
        config.use_cache = False
        yield
    finally:
        config.use_cache = saved


@contextlib.contextmanager
def _recomputed(hm, on: bool):
    """Inside the block (``on``), every block at ``layers.{i}.resid_pre`` runs under activation checkpointing
    (``torch.utils.checkpoint``, non-reentrant): the backward recomputes each block from its input, so a gradient
    pass keeps one block's activations instead of NL. Gradients are the same (the recomputation is the same
    computation). Nothing where the model shows no blocks."""
    from torch.utils.checkpoint import checkpoint

    names = [f"layers.{i}.resid_pre" for i in range(hm.num_layers)]
    points = getattr(hm, "points", None)
    if not on or points is None or any(n not in points for n in names):
        yield
        return
    blocks = [points[n].module for n in names]
    try:
        for block in blocks:
            block.forward = partial(checkpoint, block.forward, use_reentrant=False)
        yield
    finally:
        for block in blocks:
            block.__dict__.pop("forward", None)


@dataclass
class _Part:
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


def _parts(batches, scored: str, reference, repack: bool, cap: int) -> tuple[list[_Part], int]:
    """The rows of ``batches`` as the passes run them, and the count the objective is averaged over (scored tokens;
    sentences for encoders).

    ``repack`` (rows independent: zero ablation): every row cut after the last position that matters to it (a
    decoder's last scored position, causal attention; an encoder's last real token) and the rows, longest first,
    packed into parts of at most ``cap`` tokens (rows × their longest) — no pass computes padding beyond its part's
    longest row, and rows with no scored position are not run. Else (mean ablation: the mean is over the whole batch)
    each batch is one part, only the columns where every row is padding cut."""
    import torch

    rows = []  # (length, ids (l,), mask (l,) | None, targets (l,) | None, chosen (l,) | None, reference (D,) | None)
    parts: list[_Part] = []
    count = 0
    for k, batch in enumerate(batches):
        if scored == "embedding":
            ids, mask = batch
            targets = chosen = None
            count += ids.shape[0]
            ends = _ends(mask > 0)
        else:
            ids, mask, targets, chosen = _targets(batch, scored)
            count += int(chosen.sum())
            ends = _ends(chosen) if repack else _ends(mask > 0) if mask is not None else None
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
    for a, b in _packing([r[0] for r in rows], cap):
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


#: What one more part costs the packing of :func:`_packing`, in padded tokens: each part is run by every group of
#: passes, and a pass's fixed cost (hooks, small products) is about that of a few tokens' work.
PART_TOKENS = 16


def _packing(lengths: Sequence[int], cap: int) -> list[tuple[int, int]]:
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


def _ends(marked):
    """``(B,)``: one past the last marked position of each row of ``marked (B, L)`` bool (0: none marked)."""
    import torch

    L = marked.shape[1]
    last = torch.where(marked, torch.arange(1, L + 1), torch.zeros((), dtype=torch.long)).max(dim=1).values
    return last


def _part(ids, mask, targets, chosen, reference, L: int) -> _Part:
    if targets is None:
        return _Part(ids, mask, reference=reference)
    chosen = chosen[:, :L]
    index = chosen.reshape(-1).nonzero()[:, 0]
    return _Part(ids, mask, index=index, targets=targets[:, :L].reshape(-1)[index])


def _plan(groups, parts, J_of) -> list[tuple[int, list[int]]]:
    """``[(part, [job, …]), …]``: each part's passes, the jobs of each start-layer group in chunks of ``J_of(part,
    group)``."""
    plan = []
    for k, part in enumerate(parts):
        for _low, members in groups:
            J = J_of(part, members)
            plan.extend((k, members[i : i + J]) for i in range(0, len(members), J))
    return plan


def _pass_objective(hm: SweptModel, part: _Part, jobs, mode: str, kept, prefix: bool, scored: str):
    """One pass: ``(per job objective sums (c,) float64, the layer the copies started at)``."""
    import torch

    from headwise.analysis.batched import run_copies

    c, P, L = len(jobs), part.ids.shape[0], part.ids.shape[1]
    real = None if part.mask is None else part.mask > 0

    def run(repeat):
        mask = None if part.mask is None else part.mask.repeat(repeat, 1)
        return hm.forward(part.ids.repeat(repeat, 1), mask)

    if scored == "embedding":
        out, low = run_copies(hm, run, part.ids, jobs, replacement=mode, real=real, prefix=prefix, kept=kept)
        e = _pooled(out, part.mask.repeat(c, 1))
        loss = 1 - torch.nn.functional.cosine_similarity(e, part.reference.repeat(c, 1), dim=-1)
        return loss.double().reshape(c, P).sum(dim=1), low
    m = part.index.shape[0]
    index = (torch.arange(c)[:, None] * (P * L) + part.index[None, :]).reshape(-1)  # (c·m,) in the c·P rows

    def scored_run(repeat):
        with _scored_rows(hm, index) as selected:
            out = run(repeat)
        return out if selected else out.reshape(-1, out.shape[-1])[index]

    logits, low = run_copies(hm, scored_run, part.ids, jobs, replacement=mode, real=real, prefix=prefix, kept=kept)
    ce = _token_losses(logits, part.targets.repeat(c))  # (c·m,)
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

    import torch

    from headwise.analysis.batched import (
        MODES,
        PASS_TOKENS,
        SweepCost,
        free_memory,
        keep_blocks,
        start_groups,
        start_layer,
    )

    one_of("mode", mode, MODES)
    scored = _scoring(hm, scored)
    cost = cost if cost is not None else SweepCost()
    if copies is not None:
        positive_int("copies", copies)
    t0 = time.perf_counter()
    nl = hm.num_layers
    width = getattr(hm, "vocab_size", None) if scored != "embedding" else None
    row_bytes = _row_bytes(hm, int(width or 1024))
    device = next(hm.model.parameters()).device
    budget = int(memory if memory is not None else free_memory(device) // 2)
    most = 64
    tokens = min(PASS_TOKENS.get(device.type, PASS_TOKENS["cpu"]), max(1, budget // max(1, row_bytes)))
    if copies is not None:
        lowest = [min((int(k) for k, v in job.items() if v), default=0) for job in jobs]
        groups = [(0, sorted(range(len(jobs)), key=lambda j: -lowest[j]))]
        parts, count = _parts(batches, scored, reference, False, 0)
        plan = _plan(groups, parts, lambda part, members: copies)
    else:
        groups = start_groups(hm, jobs, prefix)
        size = min(most, max((len(m) for _, m in groups), default=1), max(hm.heads_per_layer or [hm.num_heads]))
        parts, count = _parts(batches, scored, reference, mode == "zero", max(1, tokens // max(1, size)))
        plan = _plan(
            groups, parts, lambda part, members: max(1, min(len(members), most, tokens // max(1, part.tokens)))
        )
    cost.copies = max(cost.copies, max((len(chunk) for _, chunk in plan), default=0))
    cost.memory_budget = 0 if copies is not None else budget
    deep = prefix and any(start_layer(hm, [job]) > 0 for job in jobs)
    sums = np.zeros(len(jobs))
    kept: list = []
    current = -1
    none = torch.zeros(0, dtype=torch.long)  # the intact forward scores nothing: its LM head runs on no position
    with torch.no_grad(), _no_cache(hm):
        for done, (k, chunk) in enumerate(plan, start=1):
            part = parts[k]
            P = part.ids.shape[0]
            if k != current:  # a new group of rows: run it once intact, every block's output kept
                current, kept = k, []
                if deep:
                    _, kept = keep_blocks(hm, partial(_scored_logits, hm, partial(_forward, hm, part), none))
                    if kept:
                        cost.kept_passes += 1
                        cost.rows += P
                        cost.layer_rows += nl * P
                        cost.layer_tokens += nl * part.tokens
            per_job, low = _pass_objective(hm, part, [jobs[i] for i in chunk], mode, kept, prefix, scored)
            sums[chunk] += per_job.cpu().numpy()
            c = len(chunk)
            cost.passes += 1
            cost.rows += c * P
            cost.layer_rows += (nl - low) * c * P
            cost.layer_tokens += (nl - low) * c * part.tokens
            if progress is not None:
                progress(done, len(plan))
    cost.tokens = sum(part.tokens for part in parts)
    cost.forward_equivalents = cost.layer_tokens / max(nl * cost.tokens, 1)
    cost.seconds += time.perf_counter() - t0
    return sums / max(count, 1)


def _forward(hm, part: _Part):
    return hm.forward(part.ids, part.mask)


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
            if same:  # the intact embeddings just formed are the importance's references too
                return (*_encoder_importance(hm, batches, references, progress), base, tokens)
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
