"""The weights' circuits (:mod:`headwise.circuits.composition`) of a model opened whole or layer by layer.

A model opened layer by layer: :func:`weights_circuits` never holds every layer's attention parts. It reads one
layer's at a time (:func:`headwise.models.pinned.attention_held`) and keeps the sender factors ``R(W_V^s) W_O^s``
``(H, Dh, D)`` of a group of layers, as many as the budget holds (:func:`composition_group`, weighed by
:func:`composition_need`); each group's layers are scored against one another as they are read, then every later
layer is read as a receiver of the group. A model opened whole: its matrices at once
(:func:`~headwise.circuits.composition.head_weights`) and the two scores.

Shape legend: NL layers, H query heads, Hkv key/value heads, Dh head width, D model width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headwise.circuits import composition
from headwise.models.anatomy_probe import input_embedding
from headwise.models.layer_walk import layer_walk
from headwise.patching import as_target
from headwise.points import unembedding

__all__ = ["READS", "check_composition", "composition_group", "composition_need", "weights_circuits"]

#: What :func:`weights_circuits` reads on a model opened layer by layer, as its refusal names it.
READS = "the attention weights of a receiver layer and a group of its senders' layers at a time"


def _need_parts(hm) -> tuple[int, int, int, int]:
    """``(first, fixed, sender, reads)`` of :func:`composition_need`: the bytes the probe pass and ``W_U W_E`` need,
    those a group needs besides its senders' factors, one sender layer's factors, and the model's layers."""
    from headwise.models.pinned import layer_attention_bytes

    stream = hm.stream
    D = hm.width
    embed, unembed = input_embedding(hm.model), unembedding(hm.model)
    pair = {id(m): m for m in (embed, unembed) if m is not None}
    slices = sum(3 * stream.slice_bytes(m) for m in pair.values())  # a slice in float32 and float64, and a product
    largest = max((f32 + st for f32, st in stream.sizes().values()), default=0)  # the probe pass streams every unit
    ue = 8 * D * D  # W_U W_E, float64
    layers = layer_attention_bytes(hm)
    read = max((f32 + st for f32, st in layers), default=0)  # one layer's attention parts as read
    # its float64 copies (twice its float32 bytes), the receiver's float32 factors and their temporaries
    copies = max((4 * f32 for f32, _ in layers), default=0)
    sender = max(  # L_s (H, Dh, D) float32 has W_O's entries: at most the layer's largest attention matrix's
        (4 * max((p.numel() for p in m.parameters() if p.dim() >= 2), default=0) for m in hm.attention_modules),
        default=0,
    )
    # a block of senders' products, a temporary as large, the block's stacked factors
    products = 3 * composition.BLOCK_BYTES
    return largest + ue + slices, ue + read + copies + products, sender, len(layers)


def composition_need(hm, group: int = 1) -> int:
    """Bytes of peak resident memory :func:`weights_circuits` needs on ``hm`` opened layer by layer holding the
    senders of ``group`` layers at a time, an upper bound: what the process holds now,
    :data:`~headwise.models.memory.MIN_WORKING`, and the larger of the probe pass (the largest unit's float32 and
    stored bytes) with ``W_U W_E`` ``(D, D)`` float64 and its slices of rows, and of a group's work — ``W_U W_E``,
    ``group`` layers' sender factors ``(H, Dh, D)`` float32, one layer's attention parts as read with their float64
    copies and the receiver's factors, a block of products (:data:`~headwise.circuits.composition.BLOCK_BYTES`).
    0 for a model opened whole."""
    if as_target(hm).stream is None:
        return 0
    from headwise.models import memory

    hm = as_target(hm)
    first, fixed, sender, _ = _need_parts(hm)
    return memory.current_rss() + memory.MIN_WORKING + max(first, fixed + group * sender)


def composition_group(hm) -> int:
    """How many layers' senders :func:`weights_circuits` holds at a time on ``hm`` opened layer by layer: the most
    its budget holds (:func:`composition_need`), at most every layer; NL for a model opened whole.

    Raises:
        MemoryBudgetError: not even one layer's senders beside a receiver fit the budget (one line naming the
            memory needed, as every tool words it).
    """
    from headwise.models import memory

    hm = as_target(hm)
    if hm.stream is None:
        return hm.num_layers
    first, fixed, sender, NL = _need_parts(hm)
    base = memory.current_rss() + memory.MIN_WORKING
    need = base + max(first, fixed + sender)
    if need > hm.memory.budget:
        raise memory.whole_refused(hm.name, hm.memory, "--composition", reads=READS, need=need)
    return max(1, min(NL, (hm.memory.budget - base - fixed) // max(1, sender)))


def check_composition(hm) -> None:
    """ValueError (one line naming the memory, :func:`composition_group`) when ``hm`` was opened layer by layer and
    not even one group of layers fits its budget; nothing for a model opened whole."""
    composition_group(hm)


def weights_circuits(
    model, *, dtype: torch.dtype = torch.float32, group: int | None = None, progress=None
) -> tuple[composition.CompositionScores, composition.CopyingScores]:
    """The composition scores (:func:`~headwise.circuits.composition.composition_scores`) and copying scores
    (:func:`~headwise.circuits.composition.copying_scores`) of every head, on a model opened whole or layer by layer.

    A model opened whole: :func:`~headwise.circuits.composition.head_weights` (``tokens=False``) and the two scores, as
    before. A model opened layer by layer (``hm.stream``) never holds every layer's attention parts: after the probe
    pass (streamed) and ``W_U W_E`` summed over slices of rows, the layers are taken in groups of ``group`` sender
    layers; each layer of a group is read alone (its attention parts as stored,
    :func:`headwise.models.pinned.attention_held`), its folded matrices formed, its copying scores and sender factors
    ``L_s (H, Dh, D)`` kept, and it is scored as a receiver of the group's earlier layers; then every later layer is
    read as a receiver of the group. So the process holds one group's sender factors, one layer's attention parts and
    their float64 copies, and ``W_U W_E``; the layers after a group are read again for each group (one group: every
    layer read once). The numbers are the whole route's (the same float32 weights and operations; the senders are
    blocked otherwise).

    Args:
        model: see :func:`headwise.patching.as_target`.
        dtype: of the composition's products (see :func:`~headwise.circuits.composition.composition_scores`).
        group: sender layers held at a time (default: the most the budget holds, :func:`composition_group`);
            ignored on a model opened whole.
        progress: ``progress(done, total)`` as each layer is read on a model opened layer by layer, or None.
    Returns:
        ``(CompositionScores, CopyingScores)``.
    Raises:
        ValueError: a structure headwise does not read (the anatomy's one sentence); on a model opened layer by
            layer, a budget too small for one group (:func:`composition_group`), or ``group`` not a positive int.
    """
    target = as_target(model)
    if target.stream is None:
        weights = composition.head_weights(target, tokens=False)
        return composition.composition_scores(weights, dtype=dtype), composition.copying_scores(weights)
    if group is None:
        group = composition_group(target)
    elif isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group: expected a positive number of layers, got {group!r}")
    from headwise.models.memory import return_freed

    with layer_walk(target):  # the anatomy read on the streamed model; no gradient is recorded
        found = _by_groups(target, group, dtype, progress)
    return_freed()  # the groups' factors and copies, freed, given back before what the caller runs next
    return found


def _by_groups(target, group: int, dtype, progress) -> tuple[composition.CompositionScores, composition.CopyingScores]:
    """:func:`weights_circuits` on a model opened layer by layer (see there)."""
    from headwise.models.pinned import attention_held

    anatomy = target.anatomy
    composition._refuse_tokens(anatomy)
    cache = composition._probe(target, anatomy, None)
    final = None
    if anatomy.final_norm is not None:
        with target.holding(anatomy.final_norm):
            final = anatomy.final_norm_frozen(composition._rows(cache["resid_final"]))
    UE = composition._ue_by_slices(target.stream, anatomy, final)
    parts = anatomy.layers
    NL = len(parts)
    Hmax, Hkv_max = max(p.num_heads for p in parts), max(p.num_kv for p in parts)
    out, groups = composition._empty_scores(NL, Hmax, Hkv_max)
    copying = torch.full((NL, Hmax), float("nan"))
    positive = torch.full((NL, Hmax), float("nan"))
    eigs: list = [None] * NL
    starts = range(0, NL, group)
    total, done = NL + sum(NL - min(NL, a + group) for a in starts), 0

    def read(layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        nonlocal done
        with attention_held(target, layer):
            W = composition._layer_weights(anatomy, cache, layer)
        done += 1
        if progress is not None:
            progress(done, total)
        return W

    for a in starts:
        b = min(NL, a + group)
        left: dict[int, Tensor] = {}
        left_norm: dict[int, Tensor] = {}
        for layer in range(a, b):  # the group's layers: senders, and receivers of the group's earlier ones
            Wq, Wk, Wv, Wo = read(layer)
            c, p, lam = composition._copying(Wv, Wo, UE)
            copying[layer, : lam.shape[0]], positive[layer, : lam.shape[0]], eigs[layer] = c, p, lam
            left[layer], left_norm[layer] = composition._sender(Wv, Wo, dtype)
            if layer > a:
                senders = [(ls, hs) for ls in range(a, layer) for hs in range(parts[ls].num_heads)]
                composition._compose(
                    out, groups, composition._receiver(Wq, Wk, Wv, Wo, dtype), layer, senders, left, left_norm, dtype
                )
            del Wq, Wk, Wv, Wo
        senders = [(ls, hs) for ls in range(a, b) for hs in range(parts[ls].num_heads)]
        for lr in range(b, NL):  # every later layer: a receiver of the group
            rec = composition._receiver(*read(lr), dtype)
            composition._compose(out, groups, rec, lr, senders, left, left_norm, dtype)
            del rec
        del left, left_norm
    scores = composition.CompositionScores(out["q"], out["k"], out["v"], groups["k"], groups["v"])
    return scores, composition.CopyingScores(copying, positive, eigs)
