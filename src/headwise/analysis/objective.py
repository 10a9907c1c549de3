"""The objective of head importance: which tokens are scored, and the loss on them (Michel et al. 2019).

Shape legend: B batch, L padded length, D model width, V vocabulary; m scored positions of a batch.

- ``"next_token"`` (decoders): the mean next-token cross-entropy (nats) over every real token of the sequence that
  has a next one; batches are ``(ids, mask)``;
- ``"answers"`` (decoders, the lab's tasks): the mean cross-entropy over chosen positions only — batches are
  ``(ids, targets, scored)``: position t is scored against ``targets[t]`` where ``scored[t]``;
- ``"embedding"`` (encoders without an LM head): ``1 − cos(e_ξ(x), e(x))`` of the mean-pooled sentence embedding
  against the intact model's.

Beside the objective itself, the pieces every pass that measures it shares: the LM head run on the scored
positions alone (:func:`scored_rows`), the loss by chunks (:func:`token_losses`), a Hugging Face model kept from
building a key/value cache (:func:`no_cache`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from headwise.analysis.protocol import GatedModel, SweptModel
from headwise.checks import one_of

__all__ = [
    "LOSS_CHUNK",
    "OBJECTIVES",
    "SCORED",
    "decoder_losses",
    "decoder_targets",
    "mean_pooled",
    "no_cache",
    "objective",
    "scored_logits",
    "scored_rows",
    "scoring",
    "token_losses",
]

#: What the objective is, by which tokens are scored.
OBJECTIVES = {
    "next_token": "next-token cross-entropy (nats per token)",
    "answers": "cross-entropy on the scored answer tokens (nats per token)",
    "embedding": "1 − cos(mean-pooled sentence embedding, intact model's)",
}
#: The ``scored`` choices of :func:`head_importance`.
SCORED = tuple(OBJECTIVES)


def decoder_targets(batch, scored: str):
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


def decoder_losses(logits, targets, scored):
    """Per-sequence mean cross-entropy over the scored positions ``(B,)`` and the tokens counted ``(B,)``."""
    import torch

    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2).float(), targets, reduction="none")  # (B, L)
    count = scored.sum(dim=1)  # (B,)
    return (ce * scored).sum(dim=1) / count.clamp(min=1), count


def mean_pooled(hidden, mask):
    """Mean of the real tokens' vectors: ``(B, D)`` (sentence-transformers' mean pooling)."""
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)


def scoring(hm: GatedModel, scored: str | None) -> str:
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

    scored = scoring(hm, scored)
    total, count = 0.0, 0
    with torch.no_grad():
        for k, batch in enumerate(batches):
            if scored == "embedding":
                ids, mask = batch
                e = mean_pooled(hm.forward(ids, mask), mask)
                total += float((1 - torch.nn.functional.cosine_similarity(e, reference[k], dim=-1)).sum())
                count += ids.shape[0]
            else:
                ids, mask, targets, chosen = decoder_targets(batch, scored)
                losses, n = decoder_losses(hm.forward(ids, mask), targets, chosen)
                total += float((losses * n).sum())
                count += int(n.sum())
    return total / max(count, 1), count


#: Positions whose log-softmax is formed at once: the loss runs by chunks of this many scored positions, so that
#: no float32 copy of all the logits is held besides the logits themselves.
LOSS_CHUNK = 1024


@contextlib.contextmanager
def scored_rows(hm: SweptModel, index):
    """Inside the block the decoder's LM head runs on the flat positions ``index`` ``(n,)`` of its input ``(N, L, D)``
    alone (a replacement at the view's ``unembed.in`` point) and the forward returns ``(n, V)`` logits (the model's
    own code after the head, soft-capping included, acts on them) — no logits of padding, of unscored positions or
    of the last token. Yields whether it could (a model without a recognised head: False, the forward returns all
    logits)."""
    if "unembed.in" not in getattr(hm, "points", {}):
        yield False
        return
    with hm.hooks({"unembed.in": lambda x: x.reshape(-1, x.shape[-1])[index]}):
        yield True


def scored_logits(hm: SweptModel, forward, index):
    """``(n, V)`` logits of the flat positions ``index`` of ``forward()``'s ``(N, L, V)`` output."""
    with scored_rows(hm, index) as selected:
        out = forward()
    return out if selected else out.reshape(-1, out.shape[-1])[index]


def token_losses(logits, targets):
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
def no_cache(hm: GatedModel):
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
