"""QK attribution: why a head attends where it does, split over what wrote the query and the key.

Shape legend: L length, D model width, H query heads, Hkv key/value heads, Dh head width, A query-side parts,
B key-side parts, J the keys the query can see.

A head's pre-softmax score at query position i and key position j is bilinear in the residual stream at i and
at j (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"; over sparse features: Anthropic,
"Tracing Attention Computation Through Feature Interactions", 2025). Each stream is a sum of writes — the
embeddings, every earlier head (through its output projection, the other heads zeroed), each output
projection's bias, every MLP (:func:`headwise.patching.residual_parts`, the decomposition of the direct logit
attribution kept at every position). Each part goes through the same affine maps as the whole:

    part ─ input norm (scale frozen at its position; LayerNorm's centring is linear) ─ W_Q or W_K (the head's
    columns; the bias is its own part) ─ QK-norm (Qwen 3 per head, OLMo 2 over the whole projection: scale frozen
    per position and head, gain applied to each part) ─ RoPE at its position (linear) ─ q_a(i) or k_b(j)

and the score is ``s(i, j) = Σ_a Σ_b q_a(i) · k_b(j) · scale``. Query-side parts are the residual's parts plus
``norm_bias`` (the input norm's bias through W_Q) and ``q_bias`` (W_Q's bias, with a QK-norm's bias); the
key side the same with ``k_bias``. The parts are checked to add up to the post-rotary q and k the model used,
read at the named point ``layers.{l}.attn.qk`` (:class:`~headwise.core.rows.AttentionRows`), and the terms to
add up to the score ``q·k·scale`` (relative 1e-4; a ValueError names what failed).

Soft-capping (Gemma 2's ``attn_logit_softcapping``: ``c·tanh(s/c)``) acts after the sum, where nothing is
additive: the terms add up to the score before the cap; :class:`QKAttribution` carries both (``scores`` and
``logits``, what enters the softmax with a float mask or ALiBi's bias added after the cap, as the model does).

Over every key the query can see: ``query_terms[a, j] = q_a(i)·k(j)·scale`` and ``key_terms[b, j] =
q(i)·k_b(j)·scale`` (each adds up to the scores over its parts); their centred forms subtract the mean over
the visible keys, so they attribute ``s(i, j) − mean_j s(i, ·)``: which parts make key j win over the others.
A part's effect on the attention weights is exact, by removal: the row's weights with the part's terms
taken out of every key's score (the norms stay frozen; the soft-cap, masks and sinks applied as the model
applies them) subtracted from the model's weights — ``effect > 0``: the part raised that key's weight.

Memory: the parts projected to one head (``(A + B) · J · Dh``) and one layer's writes at a time, never ``L²``. A
model opened layer by layer runs its one forward pass streamed and then reads one layer's weights at a time: each
earlier layer's output projection (and norm on its write) while that layer's parts are formed, the head's own
layer while its sides are frozen and the parts projected (:meth:`~headwise.models.HeadModel.holding`), weighed
first against the budget (:func:`qk_activations`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from headwise.core.primitives import soft_cap, softmax
from headwise.models.anatomy import TOLERANCE as _SAME
from headwise.models.layer_walk import check_walk, layer_walk
from headwise.patching import as_target, residual_parts
from headwise.points import layer_point

__all__ = ["QKAttribution", "qk_activations", "qk_attribution"]

TOLERANCE = _SAME  # relative: the parts against the model's q, k and scores (the anatomy's one tolerance)


@dataclass
class QKAttribution:
    """One head's scores at one query, split into query-side × key-side parts.

    Attributes:
        layer, head, group: the layer, the query head and its key/value head (``head // (H / Hkv)``).
        query: the query position i.
        keys: ``(J,)`` the key positions the query can see (causality, window and masks as the model's).
        key: the key position of :attr:`terms` (the one asked for, else the one with the largest weight).
        query_labels: A names (``embed``, ``L{l}.H{h}``, ``L{l}.attn_bias``, ``L{l}.mlp``, ``norm_bias``,
            ``q_bias``); key_labels: B names (the same with ``k_bias``).
        tokens: the text of each position's token (empty without a tokenizer).
        terms: ``(A, B)`` float64, ``q_a(i) · k_b(key) · scale``: adds up to ``scores`` at :attr:`key`.
        query_terms: ``(A, J)`` each query-side part with the whole key; key_terms: ``(B, J)`` each key-side part
            with the whole query.
        query_centred, key_centred: the same minus their mean over the J keys (they add up to
            ``scores − scores.mean()``).
        query_effect, key_effect: ``(A, J)``, ``(B, J)`` the model's weight minus the weight with that part's
            terms removed from the score (exact, norms frozen).
        scores: ``(J,)`` ``q·k·scale`` of the model's q and k (before a soft-cap: what the terms add up to).
        logits: ``(J,)`` what enters the softmax: the capped scores plus a float mask / ALiBi bias.
        weights: ``(J,)`` the model's attention weights of the row.
        softcap: the cap c (None without one); scale: the score scale.
        error: the largest relative mismatch of the checks (parts against q, k; terms against the scores).
    """

    layer: int
    head: int
    group: int
    query: int
    keys: Tensor
    key: int
    query_labels: list[str]
    key_labels: list[str]
    tokens: list[str]
    terms: Tensor
    query_terms: Tensor
    key_terms: Tensor
    query_centred: Tensor
    key_centred: Tensor
    query_effect: Tensor
    key_effect: Tensor
    scores: Tensor
    logits: Tensor
    weights: Tensor
    softcap: float | None
    scale: float
    error: float

    def key_index(self, key: int | None = None) -> int:
        """The column of key position ``key`` (default :attr:`key`) in the ``(…, J)`` tensors."""
        key = self.key if key is None else key
        where = (self.keys == key).nonzero()
        if where.numel() == 0:
            raise ValueError(f"key: position {key} is not visible from query {self.query} (visible: 0 … {self.query})")
        return int(where[0, 0])

    def top_terms(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The ``k`` terms of :attr:`terms` largest in absolute value: ``(query_part, key_part, value)``."""
        flat = self.terms.flatten()
        order = flat.abs().argsort(descending=True)[: max(0, k)]
        B = self.terms.shape[1]
        return [(self.query_labels[int(n) // B], self.key_labels[int(n) % B], float(flat[n])) for n in order]

    def to_page(self, k: int = 20) -> dict:
        """What the circuit page shows for this head's node: ``{"query": i, "key": j, "terms": [{"query_part",
        "key_part", "value"}, …]}`` — the ``k`` largest terms at :attr:`key`, largest first (JSON-ready)."""
        return {
            "query": int(self.query),
            "key": int(self.key),
            "terms": [{"query_part": a, "key_part": b, "value": v} for a, b, v in self.top_terms(k)],
        }

    def to_json(self, k: int = 20) -> dict:
        """Everything but the full matrices: the row (keys, tokens, scores, weights) and per part its terms,
        centred terms and weight effects at :attr:`key`, plus :meth:`to_page`'s top terms."""
        c = self.key_index()
        return {
            "layer": self.layer,
            "head": self.head,
            "group": self.group,
            "query": self.query,
            "key": self.key,
            "scale": self.scale,
            "softcap": self.softcap,
            "error": self.error,
            "keys": [int(j) for j in self.keys],
            "tokens": self.tokens,
            "scores": self.scores.tolist(),
            "logits": self.logits.tolist(),
            "weights": self.weights.tolist(),
            "query_parts": [
                {
                    "part": name,
                    "term": float(self.query_terms[a, c]),
                    "centred": float(self.query_centred[a, c]),
                    "effect": float(self.query_effect[a, c]),
                }
                for a, name in enumerate(self.query_labels)
            ],
            "key_parts": [
                {
                    "part": name,
                    "term": float(self.key_terms[b, c]),
                    "centred": float(self.key_centred[b, c]),
                    "effect": float(self.key_effect[b, c]),
                }
                for b, name in enumerate(self.key_labels)
            ],
            "top_terms": self.to_page(k)["terms"],
        }


# -- the attribution -------------------------------------------------------------------------------------------


def _relative(a: Tensor, b: Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _row_weights(logits: Tensor, blocked: Tensor, sink: Tensor | None) -> Tensor:
    """``logits (N, S)`` -> weights ``(N, S)`` as the model's softmax forms them (blocked keys 0, a sink logit)."""
    w = softmax(logits[:, None, :], blocked[None, None, :], None if sink is None else sink.reshape(1))
    return w[:, 0]


def qk_attribution(model, ids, layer: int, head: int, query: int, key: int | None = None) -> QKAttribution:
    """Split head ``(layer, head)``'s scores at query position ``query`` into query-side × key-side parts.

    Args:
        model: a :class:`~headwise.models.HeadModel` or anything :func:`headwise.patching.as_target` takes
            (Hugging Face decoders on headwise's backend — Llama, GPT-2, Gemma 2, Qwen 3, OLMo 2, … —, headwise's
            pre-norm decoders).
        ids: one sequence of token ids ``(L,)`` or ``(1, L)``.
        layer, head: the layer and query head.
        query: the query position i, ``0 ≤ i < L``.
        key: the key position of the full ``(A, B)`` matrix (default: the key with the largest weight).
    Returns:
        :class:`QKAttribution`.
    Raises:
        ValueError / TypeError: a layer, head or position out of range or not an int, more than one sequence;
            a structure this attribution does not read, or parts that do not add up (the check named); a model
            opened layer by layer that does not fit its budget (one line naming the memory).

    A model opened layer by layer (``hm.stream``) streams the one forward pass, then reads one layer's weights at a
    time (see the module's notes); the result is the whole float32 route's.
    """
    target = as_target(model)
    layer, head = target.check_layer_head(layer, head)
    ids = torch.as_tensor(ids)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids: expected one sequence of integer token ids (L,) or (1, L), got {tuple(ids.shape)}")
    L = ids.shape[0]
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < L:
        raise ValueError(f"query: expected a position 0 … {L - 1}, got {query!r}")
    if key is not None and (isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= query):
        raise ValueError(f"key: expected a position 0 … {query} (a key the query can see), got {key!r}")
    if target.stream is not None:  # layer by layer: one layer's weights at a time, weighed first
        check_walk(target, "qk", activations=qk_activations(target, L))
    with layer_walk(target), target.holding(layer):
        return _attribution(target, ids, layer, head, query, key)


def qk_activations(hm, length: int) -> int:
    """Bytes :func:`qk_attribution` keeps on ``hm`` for ``length`` tokens besides one layer's weights, an upper
    bound: the recorded heads' outputs, attention outputs, block outputs and MLP writes of every layer ``(L, D)``
    float32 each, and one layer's parts ``(H + 2, L, D)`` float64 with their projections."""
    D = hm.width
    return 4 * length * D * 4 * hm.num_layers + 2 * 8 * length * D * (hm.num_heads + 2)


@dataclass
class _Row:
    """The query's row at one layer, as the model forms it: ``keys (J,)`` the visible key positions, ``blocked
    (S,)``, ``score_bias (S,)`` (a float mask / ALiBi), ``sink`` (a sink logit or None), the model's ``q (Dh,)`` and
    its group's ``k (S, Dh)``, ``scores (S,)`` ``q·k·scale``, ``logits (S,)`` (capped, biased), ``weights (S,)``,
    ``key`` (the key of the full matrix) and ``softcap``."""

    keys: Tensor
    blocked: Tensor
    score_bias: Tensor
    sink: Tensor | None
    q: Tensor
    k: Tensor
    scale: float
    scores: Tensor
    logits: Tensor
    weights: Tensor
    key: int
    softcap: float | None

    def weights_without(self, part_terms: Tensor) -> Tensor:
        """``(n, J)``: the row's weights minus the weights with each part's terms ``(n, J)`` removed from the score
        (the soft-cap, masks and sinks applied as the model applies them)."""
        S = self.scores.shape[0]
        removed = self.scores.expand(part_terms.shape[0], S).clone()
        removed[:, self.keys] -= part_terms
        w = _row_weights(soft_cap(removed, self.softcap) + self.score_bias, self.blocked, self.sink)
        return self.weights[self.keys][None] - w[:, self.keys]


def _record(target, ids: Tensor, layer: int):
    """One forward pass: the residual stream's parts entering ``layer`` and, at that layer, the attention's input,
    rows, projected q and k and the rotary tables -> ``(parts, captured)``."""
    captured: dict = {}

    def keep(key):
        def fn(x):
            captured[key] = x

        return fn

    hooks = [
        (layer_point(layer, "attn.in"), keep("input")),
        (layer_point(layer, "attn.qk"), keep("rows")),
        (layer_point(layer, "attn.q"), keep("q")),
        (layer_point(layer, "attn.k"), keep("k")),
    ]
    if layer_point(layer, "attn.rotary") in target.points:
        hooks.append((layer_point(layer, "attn.rotary"), keep("position_embeddings")))

    def forward(t, x):
        with t.hooks(hooks):
            t.run_with_cache(x, names=[])

    parts = residual_parts(target, ids[None], layer, forward=forward)
    return parts, captured


def _row(rows, layer: int, head: int, group: int, query: int, key: int | None) -> _Row:
    """The model's row of ``head`` at ``query`` (visible keys, scores, logits, weights), checked against the
    model's own weights; the key of the full matrix (the one asked for, else the one with the largest weight)."""
    q_all, k_all = rows.q[0].double(), rows.k[0].double()  # (H, L, Dh), (Hkv, S, Dh)
    H, L, Dh = q_all.shape
    S = k_all.shape[1]
    scale = 1.0 / math.sqrt(Dh) if rows.scale is None else float(rows.scale)
    q_i = q_all[head, query]  # (Dh,)
    k_g = k_all[group]  # (S, Dh)
    _, causal = rows.call.replace(q_offset=rows.q_offset + query).causality(1, S, device=q_i.device)
    blocked = torch.zeros(S, dtype=torch.bool, device=q_i.device) if causal is None else causal[0].clone()
    if rows.blocked is not None:
        blocked |= torch.broadcast_to(rows.blocked, (1, H, L, S))[0, head, query].to(blocked.device)
    keys = (~blocked).nonzero()[:, 0]  # (J,)
    if keys.numel() == 0:
        raise ValueError(f"query: position {query} sees no key at layer {layer} (every key is masked)")
    score_bias = torch.zeros(S, dtype=torch.float64, device=q_i.device)
    if rows.bias is not None:
        score_bias = torch.broadcast_to(rows.bias, (1, H, L, S))[0, head, query].detach().double()
    scores_all = (k_g @ q_i) * scale  # (S,)
    sink = None if rows.sinks is None else rows.sinks[head].detach().double()
    logits_all = soft_cap(scores_all, rows.softcap) + score_bias
    weights_all = _row_weights(logits_all[None], blocked, sink)[0]
    model_weights = rows.weights(query, query + 1, torch.tensor([head]), keys=S)[0, 0, 0].double()
    if (weights_all - model_weights.to(weights_all.device)).abs().max() > 1e-4:
        raise ValueError(f"model: layer {layer}'s weights are not the softmax of q·k·scale this attribution forms")
    if key is not None and bool(blocked[key]):
        raise ValueError(f"key: position {key} is masked for query {query} at layer {layer}")
    key = int(keys[weights_all[keys].argmax()]) if key is None else key
    return _Row(
        keys, blocked, score_bias, sink, q_i, k_g, scale, scores_all, logits_all, weights_all, key, rows.softcap
    )


def _project_parts(parts, sides: dict, row: _Row, query: int):
    """Every part projected: the query side at ``query``, the key side at the visible keys (kept before the
    rotation: ``q · R_j k = k · w_j`` with ``w_j[e] = q · R_j e_e``, the rotated unit vectors in one call for all
    keys). Returns ``q_parts (A, Dh)``, ``k_at_key (B, Dh)`` (rotated, at the row's key), ``key_terms (B, J)`` and
    ``k_sum (J, Dh)`` (every key-side part, rotated)."""
    keys, q_i = row.keys, row.q
    Dh = q_i.shape[0]
    qpos = torch.tensor([query], device=q_i.device)
    ci = int((keys == row.key).nonzero()[0, 0])
    basis = torch.eye(Dh, dtype=torch.float64, device=q_i.device)[:, None, :].expand(Dh, keys.numel(), Dh)
    w = torch.einsum("ejd,d->je", sides["k"].rotate(basis, keys), q_i) * row.scale  # (J, Dh)
    q_parts, k_at_key, key_terms = [], [], []
    k_sum = torch.zeros(keys.numel(), Dh, dtype=torch.float64, device=q_i.device)  # before the rotation
    both = torch.cat([sides["q"].G, sides["k"].G], 1)  # (D, 2·Dh): each part projected once to both sides
    for _labels, t in parts.parts(project=both):
        t = t[:, 0]  # (n, L, 2·Dh)
        q_parts.append(sides["q"].projected(t[:, query : query + 1, :Dh], qpos)[:, 0])  # (n, Dh)
        kp = sides["k"].projected(t[:, keys, Dh:], keys, rotate=False)  # (n, J, Dh)
        k_sum += kp.sum(0)
        k_at_key.append(sides["k"].rotate(kp[:, ci : ci + 1], keys[ci : ci + 1])[:, 0])  # (n, Dh)
        key_terms.append(torch.einsum("nje,je->nj", kp, w))  # (n, J)
    q_parts.append(sides["q"].constants(qpos)[:, 0])
    kc = sides["k"].constants(keys, rotate=False)  # (2, J, Dh)
    k_sum += kc.sum(0)
    k_at_key.append(sides["k"].rotate(kc[:, ci : ci + 1], keys[ci : ci + 1])[:, 0])
    key_terms.append(torch.einsum("nje,je->nj", kc, w))
    k_sum = sides["k"].rotate(k_sum[None], keys)[0]
    return torch.cat(q_parts), torch.cat(k_at_key), torch.cat(key_terms), k_sum


def _attribution(target, ids: Tensor, layer: int, head: int, query: int, key: int | None) -> QKAttribution:
    """:func:`qk_attribution` on checked arguments, ``ids (L,)``."""
    part = target.anatomy[layer]
    parts, captured = _record(target, ids, layer)
    rows = captured["rows"]
    residual = parts.residual[0]  # (L, D)
    x_in = captured["input"][0].double()  # (L, D): the attention's input
    in_norm = part.attn_norm_frozen(residual, x_in)  # frozen per position; None: the residual read as it is
    H, Hkv = rows.q.shape[1], rows.k.shape[1]
    group = head // (H // Hkv)
    pe = captured.get("position_embeddings")
    pe = None if pe is None else tuple(x.double() for x in pe)
    sides = {
        name: part.freeze_side(
            name, index, input_norm=in_norm, projected=captured[name][0].detach(), position_embeddings=pe
        )
        for name, index in (("q", head), ("k", group))
    }
    row = _row(rows, layer, head, group, query, key)
    keys, ci = row.keys, int((row.keys == row.key).nonzero()[0, 0])
    q_parts, k_at_key, key_terms, k_sum = _project_parts(parts, sides, row, query)

    k_visible = row.k[keys]  # (J, Dh)
    query_terms = (q_parts @ k_visible.T) * row.scale  # (A, J)
    terms = (q_parts @ k_at_key.T) * row.scale  # (A, B)
    scores = row.scores[keys]
    errors = {
        "query": _relative(q_parts.sum(0), row.q),
        "keys": _relative(k_sum, k_visible),
        "terms": float((terms.sum() - scores[ci]).abs() / scores.abs().max().clamp_min(1e-30)),
        "query_terms": _relative(query_terms.sum(0), scores),
        "key_terms": _relative(key_terms.sum(0), scores),
    }
    worst = max(errors, key=errors.get)
    if errors[worst] > TOLERANCE:
        raise ValueError(
            f"model: the {worst} parts of layer {layer} head {head} do not add up to the model's "
            f"(relative error {errors[worst]:.2e} > {TOLERANCE}): a path this attribution does not see"
        )
    labels = parts.labels
    tokens = target.token_texts(ids.tolist()) if target.tokenizer is not None else []
    return QKAttribution(
        layer=layer,
        head=head,
        group=group,
        query=query,
        keys=keys.cpu(),
        key=row.key,
        query_labels=labels + ["norm_bias", "q_bias"],
        key_labels=labels + ["norm_bias", "k_bias"],
        tokens=tokens,
        terms=terms.cpu(),
        query_terms=query_terms.cpu(),
        key_terms=key_terms.cpu(),
        query_centred=(query_terms - query_terms.mean(1, keepdim=True)).cpu(),
        key_centred=(key_terms - key_terms.mean(1, keepdim=True)).cpu(),
        query_effect=row.weights_without(query_terms).cpu(),
        key_effect=row.weights_without(key_terms).cpu(),
        scores=scores.cpu(),
        logits=row.logits[keys].cpu(),
        weights=row.weights[keys].cpu(),
        softcap=row.softcap,
        scale=row.scale,
        error=max(errors.values()),
    )
