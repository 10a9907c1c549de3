"""The weights' circuits (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"): how heads
compose, what a head's OV circuit copies, which token pairs its QK circuit scores highest — from the weights
alone, no forward pass but one short one that finds which norm feeds what.

Shape legend: NL layers, H query heads, Hkv key/value heads, G = H / Hkv, Dh head width, D model width,
V vocabulary. Row-vector convention (TransformerLens's): a head reads ``x (D,)`` as ``x W_Q``, ``x W_K``, ``x W_V``
(each ``(D, Dh)``) and writes ``z W_O`` (``(Dh, D)``); ``W_QK = W_Q W_Kᵀ`` and ``W_OV = W_V W_O`` are ``(D, D)``.

Composition scores (between a sender head s in an earlier layer and a receiver r)::

    Q: ‖W_OV^s W_QK^r‖_F / (‖W_OV^s‖_F ‖W_QK^r‖_F)      (s writes what r's queries read)
    K: ‖W_OV^s W_QK^rᵀ‖_F / (‖W_OV^s‖_F ‖W_QK^r‖_F)     (s writes what r's keys read)
    V: ‖W_OV^s W_OV^r‖_F / (‖W_OV^s‖_F ‖W_OV^r‖_F)       (s writes what r's values read)

computed without forming any ``(D, D)`` matrix: with ``V = U R`` (QR, ``R (Dh, Dh)``), ``‖V Y‖_F = ‖R Y‖_F``, so
every score is the Frobenius norm of a ``(Dh, Dh)`` block of one product ``(senders·Dh, D) @ (D, receivers·Dh)``.

What the architecture does to them, and what headwise does:

- **Norms.** A head reads the residual through its input norm ``x ↦ C(x)·g/σ(x)`` and the unembedding reads
  through the final norm. ``1/σ`` is a scalar per position, which no ratio above sees: it is set to 1; the
  learned gain ``g`` (Gemma's ``1 + w`` as it acts) is folded into ``W_Q``, ``W_K``, ``W_V`` (and into ``W_U``),
  LayerNorm's centring ``C = I − 11ᵀ/D`` too; a norm on the attention's write (Gemma 2/3, OLMo 2) has its gain
  folded into ``W_O``. QK-norm (Qwen 3, OLMo 2) has a per-position scale too: set to 1, its gain folded into
  ``W_Q`` / ``W_K``. Biases are left out (composition is of the linear maps).
- **GQA.** The G query heads of a key/value group share ``W_K`` and ``W_V``: each receiver's ``W_QK`` is its own
  ``W_Q`` with its group's ``W_K``, its ``W_OV`` its group's ``W_V`` with its own ``W_O``. The scores are given per
  query head, and per key/value group into the group's key and value projections alone
  (``‖W_OV^s W_K^g‖_F / (‖W_OV^s‖_F ‖W_K^g‖_F)``, the same for ``W_V^g``), which is what a group's shared
  matrices take from a sender.
- **RoPE.** The QK circuit at query i and key j is ``W_Q R_{j−i} W_Kᵀ``: it depends on the offset. The scores
  here take the content part, at offset 0 (``R_0 = I``): what the head would score between two tokens at the
  same position, before the rotation tilts it by their distance.

The OV circuit through the embedding and unembedding is ``W_E W_V W_O W_U`` ``(V, V)`` (token embeddings only:
learned positions left out; Gemma's √D embedding scale, a scalar, changes no score here). Its nonzero
eigenvalues are those of the ``(Dh, Dh)`` matrix ``W_O (W_U W_E) W_V`` (``eig(AB) = eig(BA)`` for the nonzero
ones), so ``(W_U W_E)`` ``(D, D)`` is formed once. The copying score is Elhage et al.'s ``Σ Re λ / Σ |λ|``
(1: the head copies each token it reads, −1: it suppresses it); ``positive`` is the fraction of the nonzero
eigenvalues with a positive real part.

A model opened layer by layer: :func:`headwise.circuits.composition_layers.weights_circuits` never holds every
layer's attention parts (a group of sender layers at a time). :func:`head_weights` (every layer's matrices at once)
pins every layer's attention parts for its call (:func:`headwise.models.pinned.attention_pinned`, weighed by
:func:`weights_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headwise.models.anatomy import affine
from headwise.models.anatomy_probe import input_embedding, probe_ids
from headwise.models.norms import FrozenNorm
from headwise.models.pinned import attention_bytes, attention_pinned
from headwise.models.streamed import SLICE_BYTES
from headwise.patching import as_target
from headwise.points import attention_point, layer_point, unembedding

__all__ = [
    "BLOCK_BYTES",
    "CompositionScores",
    "CopyingScores",
    "HeadWeights",
    "composition_scores",
    "copying_scores",
    "head_weights",
    "ov_top_tokens",
    "qk_top_pairs",
    "weights_bytes",
]


@dataclass
class HeadWeights:
    """Every layer's head matrices, the norms' gains folded in (see the module's notes), row-vector convention.

    Attributes:
        W_Q: NL tensors ``(H, D, Dh)``; W_K, W_V: ``(Hkv, D, Dh)``; W_O: ``(H, Dh, D)``.
        W_E: ``(V, D)`` token embeddings; W_U: ``(D, V)`` the unembedding with the final norm's gain folded in —
            None where read from a model opened layer by layer (``UE`` alone is kept).
        name: the model's name.
        UE: ``(D, D)`` ``W_U W_E``, formed a slice of the vocabulary at a time on a model opened layer by layer
            (None: formed from ``W_U`` and ``W_E`` when asked).
    """

    W_Q: list[Tensor]
    W_K: list[Tensor]
    W_V: list[Tensor]
    W_O: list[Tensor]
    W_E: Tensor | None
    W_U: Tensor | None
    name: str = ""
    UE: Tensor | None = None

    @property
    def heads_per_layer(self) -> list[int]:
        return [w.shape[0] for w in self.W_Q]

    def group(self, layer: int, head: int) -> int:
        """The key/value group of query head ``head`` at ``layer``."""
        return head // (self.W_Q[layer].shape[0] // self.W_K[layer].shape[0])

    def w_k(self, layer: int) -> Tensor:
        """``(H, D, Dh)``: each query head's key matrix (its group's)."""
        G = self.W_Q[layer].shape[0] // self.W_K[layer].shape[0]
        return self.W_K[layer].repeat_interleave(G, 0)

    def w_v(self, layer: int) -> Tensor:
        """``(H, D, Dh)``: each query head's value matrix (its group's)."""
        G = self.W_Q[layer].shape[0] // self.W_V[layer].shape[0]
        return self.W_V[layer].repeat_interleave(G, 0)


def _fold(W: Tensor, frozen: FrozenNorm | None) -> Tensor:
    """``W (D, n)`` read through a frozen norm's gain and centring (:meth:`FrozenNorm.fold`); ``W`` without one."""
    return W if frozen is None else frozen.fold(W)


def _heads(W: Tensor, n: int) -> Tensor:
    """``(D, n·Dh)`` -> ``(n, D, Dh)``."""
    D = W.shape[0]
    return W.reshape(D, n, -1).permute(1, 0, 2)


def head_weights(model, ids=None, *, tokens: bool = True) -> HeadWeights:
    """Read every head's ``W_Q``, ``W_K``, ``W_V``, ``W_O`` and the embedding / unembedding, norms folded.

    The parts come from the model's anatomy (:attr:`HeadModel.anatomy`: fused projections' layouts undone, a
    side's own scale and each layer's multiplier on its writes applied, the logits' scale on the unembedding);
    one short forward pass freezes the norms whose gains are folded: the input norm, the QK-norms, a norm on the
    attention's write, the final norm.

    A model opened layer by layer (``hm.stream``) keeps every layer's attention parts in for the call
    (:func:`headwise.models.pinned.attention_pinned`), the rest streamed through the short pass; the embedding and
    the unembedding are never held whole: ``W_U W_E`` ``(D, D)`` is summed over slices of the vocabulary's rows
    (:meth:`~headwise.models.streamed.LayerStream.row_slices`) into :attr:`HeadWeights.UE`, and ``W_E`` / ``W_U``
    are None. The matrices are the whole float32 route's. ``tokens=False`` does the same on a model opened whole
    (what the composition and copying scores read, without float64 copies of two ``(V, D)`` matrices).

    Args:
        model: see :func:`headwise.patching.as_target`.
        ids: a few token ids for that pass (default: the anatomy's probe ids — any ids do: only gains are read).
        tokens: keep ``W_E`` and ``W_U`` (what :func:`ov_top_tokens` and :func:`qk_top_pairs` read); False: ``UE``
            alone, formed a slice of the vocabulary at a time.
    Returns:
        :class:`HeadWeights` (float64, on the model's device).
    Raises:
        ValueError: a structure headwise does not read (the anatomy's one sentence); a model opened layer by layer
            whose attention parts and these copies do not fit its budget (one line naming the memory,
            :func:`weights_bytes`).
    """
    target = as_target(model)
    with attention_pinned(target, "--composition", extra=weights_bytes(target)):
        return _head_weights(target, ids, tokens and target.stream is None)


def weights_bytes(model) -> int:
    """About the bytes the weights' circuits (:func:`head_weights`, then :func:`composition_scores` and
    :func:`copying_scores`) hold beyond the parameters pinned on a model opened layer by layer: float64 copies of
    every head's matrices (twice their float32 bytes), ``W_U W_E`` ``(D, D)`` in float64, one slice of the
    embedding's and the unembedding's rows in float32 and float64, and the composition's float32 products (every
    sender's ``(Dh, D)`` factor, a block of senders' products, :data:`BLOCK_BYTES`, and a temporary as large); 0 for a
    model opened whole."""
    hm = as_target(model)
    if hm.stream is None:
        return 0
    embed, unembed = input_embedding(hm.model), unembedding(hm.model)
    if embed is None or unembed is None:
        return 0  # head_weights refuses it by the anatomy's sentence
    D = embed.weight.shape[1]
    senders, H = hm.num_layers * hm.num_heads, hm.num_heads
    Dh = max(1, D // H)
    slices = sum(3 * hm.stream.slice_bytes(m) for m in {id(embed): embed, id(unembed): unembed}.values())
    products = 4 * senders * Dh * D + 2 * BLOCK_BYTES  # every sender's factor; a block of products and a temporary
    return 2 * attention_bytes(hm) + 8 * D * D + slices + products


def _refuse_tokens(anatomy) -> None:
    """The anatomy's sentence where the model has no linear unembedding and token embedding to read."""
    if anatomy.unembed is None or affine(anatomy.unembed) is None or anatomy.embed is None:
        raise anatomy.refuse("it has no linear unembedding and token embedding to read")


def _rows(x: Tensor) -> Tensor:
    """``(1, L, …, D')`` -> ``(L·…, D')``."""
    return x.reshape(-1, x.shape[-1])


def _probe(target, anatomy, ids) -> dict:
    """The short forward pass whose records freeze the folded norms: ``{point: tensor}`` (every layer's residual
    entering it, the attention's input, q, k and, with a norm on the attention's write, its output; the final
    norm's input)."""
    ids = probe_ids(target) if ids is None else torch.as_tensor(ids).reshape(1, -1)
    names = ["resid_final"]
    for i in range(len(anatomy)):
        names += [
            layer_point(i, "resid_pre"),
            layer_point(i, "attn.in"),
            layer_point(i, "attn.q"),
            layer_point(i, "attn.k"),
        ]
        names += [layer_point(i, "attn.out")] if anatomy[i].attn_post is not None else []
    return target.run_with_cache(ids, names=names)


def _layer_weights(anatomy, cache: dict, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Layer ``layer``'s head matrices, norms folded (its attention parts in): ``W_Q (H, D, Dh)``, ``W_K`` and
    ``W_V (Hkv, D, Dh)``, ``W_O (H, Dv, D)``, float64."""
    part = anatomy.layers[layer]
    H, Hkv = part.num_heads, part.num_kv
    r, x_in = cache[layer_point(layer, "resid_pre")], cache[layer_point(layer, "attn.in")]
    frozen = part.attn_norm_frozen(_rows(r).double(), _rows(x_in).double())
    Wq, Wk, Wv = (_fold(s.weights("columns")[0].detach().double(), frozen) for s in (part.q, part.k, part.v))
    for side in (part.q, part.k):  # a QK-norm's gain as it acts (per head or over n·Dh), and the side's factor
        g = side.norm_gain(cache[attention_point(layer, side.name)])  # (n·Dh,) or None
        g = (torch.ones((), dtype=torch.float64) if g is None else g) * side.scale
        if side.name == "q":
            Wq = Wq * g.to(Wq)
        else:
            Wk = Wk * g.to(Wk)
    Wo = part.heads_out().detach().double()  # (H, Dv, D)
    Dv = Wo.shape[1]
    Wo = Wo.reshape(H * Dv, -1)
    if part.attn_post is not None:  # a norm on the attention's write (Gemma 2/3, OLMo 2): its gain folded into W_O
        o = cache[layer_point(layer, "attn.out")]
        Wo = _fold(Wo.T, part.attn_post_frozen(_rows(o))).T
    Wo = Wo * part.scale
    return _heads(Wq, H), _heads(Wk, Hkv), _heads(Wv, Hkv), Wo.reshape(H, Dv, -1)


def _head_weights(target, ids, tokens: bool) -> HeadWeights:
    """:func:`head_weights` of a view (its attention parts in)."""
    anatomy = target.anatomy
    _refuse_tokens(anatomy)
    cache = _probe(target, anatomy, ids)
    W_Q, W_K, W_V, W_O = [], [], [], []
    for layer in range(len(anatomy.layers)):
        for out, W in zip((W_Q, W_K, W_V, W_O), _layer_weights(anatomy, cache, layer)):
            out.append(W)
    final = None
    if anatomy.final_norm is not None:
        final = anatomy.final_norm_frozen(_rows(cache["resid_final"]))
    if not tokens:
        UE = _ue_by_slices(target.stream, anatomy, final)
        return HeadWeights(W_Q, W_K, W_V, W_O, None, None, target.name or "", UE)
    U = affine(anatomy.unembed)[0].detach().double().T * anatomy.logit_scale  # (D, V)
    E = anatomy.embed.weight.detach().double()
    return HeadWeights(W_Q, W_K, W_V, W_O, E, _fold(U, final), target.name or "")


def _ue_by_slices(stream, anatomy, final: FrozenNorm | None) -> Tensor:
    """``W_U W_E`` ``(D, D)`` float64: ``Σ_s W_U[:, s] W_E[s]`` over slices ``s`` of the vocabulary's rows — on a
    model opened layer by layer (``stream``) each read from the checkpoint and dropped, else taken from the weights
    in memory (the final norm's gain and centring act on each column of ``W_U`` alone, so each slice is folded as
    the whole matrix is)."""
    if not isinstance(anatomy.unembed, nn.Linear) or not hasattr(anatomy.embed, "weight"):
        raise anatomy.refuse("its unembedding is not a linear map whose rows can be read a slice at a time")
    modules = [anatomy.unembed, anatomy.embed]
    slices = stream.row_slices(modules) if stream is not None else _rows_in_memory(modules)
    UE = None
    for _, (u, e) in slices:  # (n, D) each
        part = _fold(u.double().T * anatomy.logit_scale, final) @ e.double()  # (D, n) @ (n, D)
        UE = part if UE is None else UE + part
    return UE


def _rows_in_memory(modules: list[nn.Module]):
    """``(r0, [rows r0 … r0 + n − 1 of each module's weight (V, D)])``, :data:`SLICE_BYTES` of rows at a time."""
    V, D = modules[0].weight.shape
    step = max(1, SLICE_BYTES // (4 * D))
    for r0 in range(0, V, step):
        yield r0, [m.weight.detach()[r0 : r0 + step] for m in modules]


# -- composition -----------------------------------------------------------------------------------------------


@dataclass
class CompositionScores:
    """Q-, K- and V-composition between every sender head (earlier layer) and receiver head.

    Attributes:
        q, k, v: ``(NL, H, NL, H)`` float32: ``[ls, hs, lr, hr]``, sender (ls, hs) into receiver (lr, hr); NaN
            where ``ls ≥ lr`` (no composition within or backwards) or a layer has fewer heads.
        k_group, v_group: ``(NL, H, NL, Hkv)``: sender into receiver group g's key / value projection alone.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    k_group: Tensor
    v_group: Tensor

    def top(self, kind: str = "k", n: int = 10) -> list[tuple[int, int, int, int, float]]:
        """The ``n`` largest scores of ``kind`` (``q``, ``k``, ``v``): ``(ls, hs, lr, hr, score)``, largest first
        (only pairs that compose: fewer than ``n`` when there are fewer)."""
        if kind not in ("q", "k", "v"):
            raise ValueError(f"kind: expected 'q', 'k' or 'v', got {kind!r}")
        s = getattr(self, kind)
        flat = s.flatten()
        finite = torch.isfinite(flat).nonzero()[:, 0]
        order = finite[flat[finite].argsort(descending=True)][: max(0, n)]
        idx = [torch.unravel_index(o, s.shape) for o in order]
        return [(*(int(i) for i in ix), float(s[ix])) for ix in idx]


#: Bytes of one block of senders' products in :func:`composition_scores` (the senders are taken a block at a time).
BLOCK_BYTES = 32 * 2**20


def _r_factor(X: Tensor) -> Tensor:
    """``(n, D, Dh)`` -> ``(n, Dh, Dh)`` upper-triangular R of ``X = U R``: ``‖X Y‖_F = ‖R Y‖_F``."""
    return torch.linalg.qr(X, mode="r")[1]


def _through(A: Tensor, W: Tensor, Ns: int, Dh: int) -> Tensor:
    """``A (Ns·Dh, D)`` times each head's ``W (n, D, Dh)`` -> ``(Ns, n, Dh, Dh)``."""
    return (A @ W.permute(1, 0, 2).reshape(W.shape[1], -1)).reshape(Ns, Dh, W.shape[0], -1).transpose(1, 2)


def _per_head(W: Tensor, H: int) -> Tensor:
    """A key/value group's matrices ``(Hkv, …)`` repeated for each of its query heads: ``(H, …)``."""
    return W.repeat_interleave(H // W.shape[0], 0)


def _sender(W_V: Tensor, W_O: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """A layer's senders: ``L_s = R(W_V^s) W_O^s`` ``(H, Dh, D)`` and ``‖W_OV^s‖_F = ‖L_s‖_F`` ``(H,)``, from its
    ``W_V (Hkv, D, Dh)`` and ``W_O (H, Dh, D)``."""
    Ls = _r_factor(_per_head(W_V, W_O.shape[0]).to(dtype)) @ W_O.to(dtype)  # (H, Dh, D)
    return Ls, Ls.flatten(1).norm(dim=1)


@dataclass
class _Receiver:
    """A receiver layer's factors: ``Q (H, D, Dh)``, ``Kg``, ``Vg (Hkv, D, Dh)``, ``g (H,)`` each query head's
    group, the ``(H, Dh, Dh)`` R factors of its keys, queries and ``W_Oᵀ``, and ``r_norm`` kind → ``(H,)`` the
    receiver's ``‖W_QK‖_F`` / ``‖W_OV‖_F``."""

    Q: Tensor
    Kg: Tensor
    Vg: Tensor
    g: Tensor
    RK: Tensor
    RQ: Tensor
    RO: Tensor
    r_norm: dict


def _receiver(W_Q: Tensor, W_K: Tensor, W_V: Tensor, W_O: Tensor, dtype: torch.dtype) -> _Receiver:
    """:class:`_Receiver` of a layer's ``W_Q (H, D, Dh)``, ``W_K``, ``W_V (Hkv, D, Dh)``, ``W_O (H, Dh, D)``."""
    Q, O = W_Q.to(dtype), W_O.to(dtype)  # (H, D, Dh), (H, Dh, D)
    Kg, Vg = W_K.to(dtype), W_V.to(dtype)  # (Hkv, D, Dh): shared by a group's heads
    H, Hkv = Q.shape[0], Kg.shape[0]
    g = torch.arange(H) // (H // Hkv)  # each query head's group
    RK, RQ, RO = _r_factor(Kg)[g], _r_factor(Q), _r_factor(O.transpose(1, 2))  # (H, Dh, Dh) each
    # ‖Y W_QK‖ = ‖Y Q R_Kᵀ‖, ‖Y W_QKᵀ‖ = ‖Y K R_Qᵀ‖, ‖Y W_OV‖ = ‖Y V R_Oᵀ‖ (W_Oᵀ = U R_O)
    r_norm = {
        "q": (Q @ RK.transpose(1, 2)).flatten(1).norm(dim=1),
        "v": (Vg[g] @ RO.transpose(1, 2)).flatten(1).norm(dim=1),
    }
    r_norm["k"] = r_norm["q"]
    return _Receiver(Q, Kg, Vg, g, RK, RQ, RO, r_norm)


def _compose(out: dict, groups: dict, rec: _Receiver, lr: int, senders: list, left, left_norm, dtype) -> None:
    """Write the scores of ``senders`` (``(ls, hs)`` pairs) into receiver layer ``lr`` (:class:`_Receiver`
    ``rec``) into ``out`` kind → ``(NL, H, NL, H)`` and ``groups`` kind → ``(NL, H, NL, Hkv)``; ``left[ls]``,
    ``left_norm[ls]``: :func:`_sender` of layer ls."""
    Q, Kg, Vg, g = rec.Q, rec.Kg, rec.Vg, rec.g
    H, Hkv = Q.shape[0], Kg.shape[0]
    Dh = left[senders[0][0]].shape[1]
    # the senders a block at a time: one block's products and their (Dh, Dh) factors, at most (n, 6·H + 2·Hkv,
    # Dh, Dh) at once, stay within BLOCK_BYTES
    per_sender = (6 * H + 2 * Hkv) * Dh * Dh * torch.finfo(dtype).bits // 8
    step = max(1, BLOCK_BYTES // per_sender)
    for s0 in range(0, len(senders), step):
        chunk = senders[s0 : s0 + step]
        Ls = torch.stack([left[ls][hs] for ls, hs in chunk])  # (n, Dh, D)
        ns = torch.stack([left_norm[ls][hs] for ls, hs in chunk])  # (n,)
        idx_l = torch.tensor([s[0] for s in chunk])
        idx_h = torch.tensor([s[1] for s in chunk])
        Ns = Ls.shape[0]
        A = Ls.reshape(-1, Ls.shape[-1])  # (n·Dh, D)

        # one product per receiver's query heads and one per key/value group (a group's heads share W_K, W_V),
        # then each head's (Dh, Dh) factor
        PQ, PK, PV = (_through(A, W, Ns, Dh) for W in (Q, Kg, Vg))  # (n, H|Hkv, Dh, Dh)
        fro = {
            "q": (PQ @ rec.RK.transpose(1, 2)).pow(2).sum((2, 3)).sqrt(),  # (n, H)
            "k": (PK[:, g] @ rec.RQ.transpose(1, 2)).pow(2).sum((2, 3)).sqrt(),
            "v": (PV[:, g] @ rec.RO.transpose(1, 2)).pow(2).sum((2, 3)).sqrt(),
        }
        for kind in "qkv":
            scores = fro[kind] / (ns[:, None] * rec.r_norm[kind][None]).clamp_min(1e-30)
            out[kind][idx_l, idx_h, lr, :H] = scores.float().cpu()
        for kind, P, W in (("k", PK, Kg), ("v", PV, Vg)):
            norm = (ns[:, None] * W.flatten(1).norm(dim=1)[None]).clamp_min(1e-30)
            groups[kind][idx_l, idx_h, lr, :Hkv] = (P.pow(2).sum((2, 3)).sqrt() / norm).float().cpu()
        del PQ, PK, PV, fro


def _empty_scores(NL: int, Hmax: int, Hkv_max: int) -> tuple[dict, dict]:
    nan = float("nan")
    return {k: torch.full((NL, Hmax, NL, Hmax), nan) for k in "qkv"}, {
        k: torch.full((NL, Hmax, NL, Hkv_max), nan) for k in "kv"
    }


def composition_scores(weights: HeadWeights, *, dtype: torch.dtype = torch.float32) -> CompositionScores:
    """Q-, K-, V-composition scores between every pair of heads (Elhage et al. 2021), GQA per query head and per
    key/value group, RoPE at offset 0, norms folded (see the module's notes).

    Args:
        weights: from :func:`head_weights`.
        dtype: of the products (float32: the ratios to ~1e-6; float64 for references).
    Returns:
        :class:`CompositionScores`.
    """
    NL = len(weights.W_Q)
    Hmax = max(weights.heads_per_layer)
    Hkv_max = max(w.shape[0] for w in weights.W_K)
    out, groups = _empty_scores(NL, Hmax, Hkv_max)
    # senders: L_s = R(W_V^s) W_O^s (Dh, D), ‖W_OV^s‖ = ‖L_s‖
    left, left_norm = [], []
    for layer in range(NL):
        Ls, norm = _sender(weights.W_V[layer], weights.W_O[layer], dtype)  # (H, Dh, D), (H,)
        left.append(Ls)
        left_norm.append(norm)
    for lr in range(1, NL):
        rec = _receiver(weights.W_Q[lr], weights.W_K[lr], weights.W_V[lr], weights.W_O[lr], dtype)
        senders = [(ls, hs) for ls in range(lr) for hs in range(weights.heads_per_layer[ls])]
        _compose(out, groups, rec, lr, senders, left, left_norm, dtype)
    return CompositionScores(out["q"], out["k"], out["v"], groups["k"], groups["v"])


# -- the OV and QK circuits through the embedding --------------------------------------------------------------


@dataclass
class CopyingScores:
    """Each head's OV circuit ``W_E W_V W_O W_U`` summarised by its eigenvalues.

    Attributes:
        copying: ``(NL, H)`` ``Σ Re λ / Σ |λ|`` over the nonzero eigenvalues (NaN where a layer has fewer heads).
        positive: ``(NL, H)`` the fraction of those eigenvalues with a positive real part.
        eigenvalues: NL complex tensors ``(H, Dh)``: the nonzero eigenvalues (those of ``W_O W_U W_E W_V``).
    """

    copying: Tensor
    positive: Tensor
    eigenvalues: list[Tensor]


def _ue(weights: HeadWeights) -> Tensor:
    return weights.UE if weights.UE is not None else weights.W_U @ weights.W_E  # (D, D)


def _whole_matrices(weights: HeadWeights) -> None:
    if weights.W_E is None or weights.W_U is None:
        raise ValueError("weights: they hold W_U W_E alone (read from a model opened layer by layer, or with "
                         "tokens=False), not the (V, D) embedding and unembedding a token's circuit reads; expected "
                         "head_weights(model) of a model opened whole")  # fmt: skip


def _copying(W_V: Tensor, W_O: Tensor, UE: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One layer's copying scores ``(H,)``, fractions of positive eigenvalues ``(H,)`` and eigenvalues ``(H, Dh)``
    from its ``W_V (Hkv, D, Dh)``, ``W_O (H, Dh, D)`` and ``W_U W_E`` ``(D, D)``."""
    small = W_O @ UE @ _per_head(W_V, W_O.shape[0])  # (H, Dh, Dh)
    lam = torch.linalg.eigvals(small)  # (H, Dh)
    copying = (lam.real.sum(-1) / lam.abs().sum(-1).clamp_min(1e-300)).float()
    nonzero = lam.abs() > 1e-9 * lam.abs().amax(-1, keepdim=True)
    positive = ((lam.real > 0) & nonzero).sum(-1).float() / nonzero.sum(-1).clamp_min(1).float()
    return copying, positive, lam


def copying_scores(weights: HeadWeights) -> CopyingScores:
    """The copying score of every head (Elhage et al. 2021) from the ``(Dh, Dh)`` matrices
    ``W_O (W_U W_E) W_V`` — the nonzero eigenvalues of the ``(V, V)`` OV circuit, never formed."""
    UE = _ue(weights)
    NL, Hmax = len(weights.W_Q), max(weights.heads_per_layer)
    copying = torch.full((NL, Hmax), float("nan"))
    positive = torch.full((NL, Hmax), float("nan"))
    eigs = []
    for layer in range(NL):
        c, p, lam = _copying(weights.W_V[layer], weights.W_O[layer], UE)
        H = lam.shape[0]
        copying[layer, :H], positive[layer, :H] = c, p
        eigs.append(lam)
    return CopyingScores(copying, positive, eigs)


def _check_head(weights: HeadWeights, layer: int, head: int) -> None:
    _whole_matrices(weights)
    if not (isinstance(layer, int) and 0 <= layer < len(weights.W_Q)):
        raise ValueError(f"layer: expected 0 … {len(weights.W_Q) - 1}, got {layer!r}")
    if not (isinstance(head, int) and 0 <= head < weights.W_Q[layer].shape[0]):
        raise ValueError(f"head: expected 0 … {weights.W_Q[layer].shape[0] - 1} at layer {layer}, got {head!r}")


def ov_top_tokens(weights: HeadWeights, layer: int, head: int, token: int, k: int = 10) -> list[tuple[int, float]]:
    """The ``k`` tokens head ``(layer, head)``'s OV circuit writes most for input ``token``: row ``token`` of
    ``W_E W_V W_O W_U``, as ``(token id, logit)`` largest first."""
    _check_head(weights, layer, head)
    V = weights.W_E.shape[0]
    if not (isinstance(token, int) and 0 <= token < V):
        raise ValueError(f"token: expected an id 0 … {V - 1}, got {token!r}")
    g = weights.group(layer, head)
    row = weights.W_E[token] @ weights.W_V[layer][g] @ weights.W_O[layer][head] @ weights.W_U  # (V,)
    values, ids = row.topk(min(k, V))
    return [(int(i), float(v)) for i, v in zip(ids, values)]


def qk_top_pairs(
    weights: HeadWeights, layer: int, head: int, k: int = 10, *, block: int = 1024
) -> list[tuple[int, int, float]]:
    """The ``k`` (query token, key token) pairs head ``(layer, head)``'s QK circuit ``W_E W_Q W_Kᵀ W_Eᵀ`` scores
    highest (content part: RoPE at offset 0; the norms' position scales set to 1 — they would rescale rows
    and columns), as ``(query id, key id, score)``; formed ``block`` query tokens at a time, never ``(V, V)``."""
    _check_head(weights, layer, head)
    g = weights.group(layer, head)
    Eq = weights.W_E @ weights.W_Q[layer][head]  # (V, Dh)
    Ek = weights.W_E @ weights.W_K[layer][g]  # (V, Dh)
    best_v = torch.empty(0, dtype=Eq.dtype)
    best_i = torch.empty(0, dtype=torch.long)
    V = Eq.shape[0]
    for start in range(0, V, block):
        s = Eq[start : start + block] @ Ek.T  # (b, V)
        v, i = s.flatten().topk(min(k, s.numel()))
        best_v = torch.cat([best_v, v])
        best_i = torch.cat([best_i, i + start * V])
        keep = best_v.topk(min(k, best_v.numel())).indices
        best_v, best_i = best_v[keep], best_i[keep]
    order = best_v.argsort(descending=True)
    return [(int(best_i[o]) // V, int(best_i[o]) % V, float(best_v[o])) for o in order]
