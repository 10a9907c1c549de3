"""A model's anatomy: its parts, found once, that every tool reads (the norms, the projections with their head
layouts, the output projection, the writes' norms and multipliers, the MLP, the embeddings and the unembedding).

Shape legend: B batch, L length, D model width, NL layers, H query heads, Hkv key/value groups, Dh head width
(Dv of the values), V vocabulary.

A decoder block reads the residual stream ``r`` and adds its writes back (Elhage et al. 2021's residual view)::

    sequential (Llama, GPT-2, Gemma …)   r_mid = r + s·post_a(attn(norm_a(r)))
                                         r_out = r_mid + s·post_m(mlp(norm_m(r_mid)))
    parallel (GPT-NeoX, Phi-2, GPT-J …)  r_out = r + s·attn(norm_a(r)) + s·mlp(norm_m(r))

with ``s`` the residual multiplier (Granite; 1 elsewhere), ``post_a`` / ``post_m`` a norm on a write (Gemma 2/3,
OLMo 2) or nothing, and ``norm_m`` possibly the same module as ``norm_a`` (Phi-2, GPT-J, Cohere). The attention
module projects its input ``x = norm_a(r)`` to queries, keys and values — separate projections or one fused
projection whose output columns belong to heads in a layout of its own (GPT-2's ``c_attn`` q | k | v; Phi-3's
``qkv_proj``; GPT-NeoX's ``query_key_value`` interleaved per head ``(H, 3, Dh)``; Falcon's grouped
``(Hkv, H/Hkv + 2, Dh)``) — then a QK-norm (Qwen 3, Gemma 3, OLMo 2), the rotary positions, and after the
attention the output projection ``W_O`` of the concatenated heads. :class:`Side` names, for q, k and v, the module
and the output columns of each head: ``columns (n, Dh)``.

How it is found (:mod:`headwise.models.anatomy_probe`). From the module tree first: the block is the attention
module's ancestor in a layer list (:mod:`headwise.points`), norms are the block's children that normalise, the
projections carry one of the names of the tables there, the output projection one of
:data:`headwise.points.OUT_PROJ_NAMES`. Then one
recording pass confirms every part on inputs that cannot hide a structure: several tokens, none of them a special
token or a token whose embedding is zero, no padding. A norm is the one whose input and output are what the
structure says; a fused layout is the candidate whose columns give the queries and keys the attention used (at the
first position, where rotary positions rotate nothing) and the values whose weighted sum is each head's output;
the block's writes must add up to its change of the residual stream; the final logits must be the unembedding of
the final norm (scaled, soft-capped). Every comparison uses one tolerance, :data:`TOLERANCE`.

A structure the rules do not read is refused once, in one sentence (:class:`AnatomyError`, a ValueError:
``model: headwise cannot read the anatomy of this <family> model: <what>``), which every tool repeats. A family the
rules miss gets one entry in one table of :mod:`headwise.models.anatomy_probe` (the names, the config attributes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from headwise.points import ArgumentPoint, ColumnsPoint, NormedInputPoint, Point

__all__ = [
    "TOLERANCE",
    "Anatomy",
    "AnatomyError",
    "LayerAnatomy",
    "Side",
    "affine",
    "anatomy_points",
    "is_norm",
    "norm_epsilon",
    "apply_qk_norm",
    "same",
]

#: Relative tolerance of "these two tensors are the same" (max |a − b| ≤ TOLERANCE · max(1, max |b|)), float32.
TOLERANCE = 1e-4
_EPS_NAMES = ("variance_epsilon", "eps", "epsilon", "variance_eps", "layer_norm_eps")


class AnatomyError(ValueError):
    """A model whose structure headwise cannot read; the one sentence every tool repeats."""

    def __init__(self, family: str, what: str):
        super().__init__(f"model: headwise cannot read the anatomy of this {family} model: {what}")
        self.family, self.what = family, what


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a normalisation layer (``nn.LayerNorm``, ``nn.RMSNorm``, or a class named ``*Norm*``)."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or "norm" in type(module).__name__.lower()


def same(a: Tensor | None, b: Tensor | None, tol: float = TOLERANCE) -> bool:
    """Whether ``a`` and ``b`` have one shape and ``max |a − b| ≤ tol · max(1, max |b|)`` (the one check)."""
    if a is None or b is None or a.shape != b.shape:
        return False
    if b.numel() == 0:
        return True
    a, b = a.detach().double(), b.detach().double()
    return bool((a - b).abs().max() <= tol * max(1.0, float(b.abs().max())))


def affine(module: nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """``(W (out, in), b (out,) or None)`` of an ``nn.Linear`` or GPT-2's ``Conv1D`` (stored ``(in, out)``) — the
    one weight reader, in ``nn.Linear``'s orientation; None for any other module."""
    if isinstance(module, nn.Linear):
        return module.weight, module.bias
    if type(module).__name__ == "Conv1D" and isinstance(getattr(module, "weight", None), Tensor):
        return module.weight.t(), module.bias
    return None


def norm_epsilon(norm: nn.Module) -> float | None:
    """A norm's epsilon, by the attribute names norms use (None when it names none)."""
    for name in _EPS_NAMES:
        value = getattr(norm, name, None)
        if isinstance(value, float):
            return value
    return None


@dataclass(eq=False)
class Side:
    """One side (``"q"``, ``"k"`` or ``"v"``) of an attention layer's input projection.

    Attributes:
        name: ``"q"``, ``"k"`` or ``"v"``.
        module: the projection (``nn.Linear`` or ``Conv1D``) whose output holds this side's columns.
        columns: ``(n, Dh)`` long: the columns of ``module``'s output that are head (or key/value group) ``i``'s.
        norm: the QK-norm applied to this side (``q_norm`` …), or None; ``norm_per_head``: it normalises each
            head's ``Dh`` (Qwen 3, Gemma 3) rather than the whole ``n·Dh`` (OLMo 2).
        scale: a factor the attention module puts on this side after the projection (and QK-norm) and before
            the scores (OPT scales its queries by ``Dh^-1/2`` there; 1.0 elsewhere). :meth:`weight` and
            :meth:`bias` are the projection's own; the side the attention uses is ``scale ×`` theirs.
    """

    name: str
    module: nn.Module
    columns: Tensor
    norm: nn.Module | None = None
    norm_per_head: bool = True
    scale: float = 1.0

    @property
    def n(self) -> int:
        """Heads (H for q) or key/value groups (Hkv)."""
        return self.columns.shape[0]

    @property
    def width(self) -> int:
        """Dh (Dv for v)."""
        return self.columns.shape[1]

    def weight(self) -> Tensor:
        """``(n, Dh, D)``: each head's rows of the projection (``y_i = W[i] x + b[i]``)."""
        W, _ = affine(self.module)
        return W[self.columns.to(W.device)]

    def bias(self) -> Tensor | None:
        """``(n, Dh)`` or None."""
        _, b = affine(self.module)
        return None if b is None else b[self.columns.to(b.device)]

    def take(self, y: Tensor) -> Tensor:
        """``y (…, out)`` the module's output -> ``(…, n, Dh)`` this side's heads."""
        return y[..., self.columns.to(y.device)]


def _rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def _rotate_pairs(x: Tensor) -> Tensor:
    return torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)


@dataclass(frozen=True)
class Rotation:
    """How a layer rotates its queries and keys by position (linear at each position).

    ``kind``: ``"none"``; ``"headwise"`` (the module's own part, ``part.rotate_qk``); with the ``(cos, sin)``
    the model hands its attention (``position_embeddings``): ``"half"`` (the first ``cos.shape[-1]`` dims rotated
    as halves, Hugging Face's ``rotate_half``: Llama, GPT-NeoX, Phi's partial rotary), ``"half-compact"`` (the
    same with one angle per pair of halves: GPT-OSS), ``"pairs"`` (adjacent pairs, the frequencies from the first
    half of ``cos``: GLM) or ``"pairs-interleaved"`` (adjacent pairs, ``cos`` already in that layout: Cohere).
    """

    kind: str
    part: object | None = None

    def __call__(self, t: Tensor, pos: Tensor, position_embeddings=None) -> Tensor:
        """``t (n, L', Dh)`` at positions ``pos (L',)`` rotated; ``position_embeddings``: the ``(cos (1, L, r),
        sin)`` of the run (for ``"half"`` / ``"pairs"``), indexed at ``pos``."""
        if self.kind == "none":
            return t
        if self.kind == "headwise":
            t4 = t[:, None]
            return self.part.rotate_qk(t4, t4, pos, pos)[0][:, 0]
        cos, sin = (x[0][pos].to(t.dtype) for x in position_embeddings)  # (L', r)
        if self.kind == "half-compact":  # one angle per pair of halves (GPT-OSS): (L', r/2) -> (L', r)
            cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
        r = cos.shape[-1]
        rot, rest = t[..., :r], t[..., r:]
        if self.kind in ("half", "half-compact") and not (torch.is_grad_enabled() and t.requires_grad):
            h = r // 2  # x·cos + rotate_half(x)·sin, written half by half in place
            x1, x2 = rot[..., :h], rot[..., h:]
            out = torch.empty_like(t)
            torch.mul(x1, cos[..., :h], out=out[..., :h]).addcmul_(x2, sin[..., :h], value=-1.0)
            torch.mul(x2, cos[..., h:], out=out[..., h:r]).addcmul_(x1, sin[..., h:])
            if r < t.shape[-1]:
                out[..., r:] = rest
            return out
        if self.kind in ("half", "half-compact"):
            out = rot * cos + _rotate_half(rot) * sin
        elif self.kind == "pairs":
            c = cos[..., : r // 2].repeat_interleave(2, -1)
            s_ = sin[..., : r // 2].repeat_interleave(2, -1)
            out = rot * c + _rotate_pairs(rot) * s_
        else:  # "pairs-interleaved": (cos, sin) already in the pairs' layout (Cohere)
            out = rot * cos + _rotate_pairs(rot) * sin
        return torch.cat([out, rest], -1)


@dataclass(eq=False)
class LayerAnatomy:
    """One layer's parts (see the module docstring).

    Attributes:
        index: the attention layer's number.
        block: the residual block.
        attention: the attention module.
        attn_norm: the norm whose output the attention reads (None: it reads the residual stream itself).
        q, k, v: the input projection's sides.
        out_proj: the output projection ``W_O`` (its input: the heads side by side, ``(…, H·Dv)``).
        attn_post: a norm on the attention's write (Gemma 2/3, OLMo 2), or None.
        mlp: the MLP (None: an attention-only layer); ``mlp_norm`` its input norm (None: it reads the residual
            stream, or the layer has no MLP); ``mlp_post`` a norm on its write.
        parallel: the MLP reads the block's input, not the attention's result (GPT-NeoX, Phi-2, GPT-J, Falcon,
            Cohere): this layer's heads do not feed its own MLP.
        shared_norm: the MLP's norm is the attention's (Phi-2, GPT-J, Cohere).
        scale: the multiplier on each write before it joins the residual stream (Granite; else 1.0).
        rotation: how the attention rotates q and k by position (:class:`Rotation`), confirmed at every position.
    """

    index: int
    block: nn.Module
    attention: nn.Module
    attn_norm: nn.Module | None
    q: Side
    k: Side
    v: Side
    out_proj: nn.Module
    attn_post: nn.Module | None
    mlp: nn.Module | None
    mlp_norm: nn.Module | None
    mlp_post: nn.Module | None
    parallel: bool
    scale: float
    rotation: Rotation = field(default_factory=lambda: Rotation("none"))

    @property
    def shared_norm(self) -> bool:
        return self.mlp is not None and self.mlp_norm is not None and self.mlp_norm is self.attn_norm

    @property
    def sides(self) -> dict[str, Side]:
        """``{"q": …, "k": …, "v": …}``."""
        return {"q": self.q, "k": self.k, "v": self.v}

    @property
    def num_heads(self) -> int:
        return self.q.n

    @property
    def num_kv(self) -> int:
        return self.k.n

    def heads_out(self) -> Tensor:
        """``(H, Dv, D)``: each head's rows of ``W_O`` (head h writes ``z_h · heads_out[h]``, before any post-norm
        or multiplier)."""
        W, _ = affine(self.out_proj)  # (D, H·Dv)
        D, width = W.shape
        return W.t().reshape(self.num_heads, width // self.num_heads, D)


@dataclass(eq=False)
class Anatomy:
    """A model's parts: ``layers`` (NL :class:`LayerAnatomy`), then ``embed`` (the token embedding),
    ``final_norm`` (None: the logits read the last block's output), ``unembed`` (the language-model head; None for
    an encoder), ``logit_scale`` (the logits are ``logit_scale ×`` the unembedding's output — Granite divides,
    Cohere multiplies; else 1.0) and ``softcap`` (Gemma 2's ``c·tanh(x/c)`` on the logits, or None)."""

    family: str
    layers: list[LayerAnatomy]
    embed: nn.Module | None
    final_norm: nn.Module | None
    unembed: nn.Module | None
    logit_scale: float = 1.0
    softcap: float | None = None

    def __getitem__(self, layer: int) -> LayerAnatomy:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers)

    def refuse(self, what: str) -> AnatomyError:
        """The one error for a structure a tool cannot use (raise it)."""
        return AnatomyError(self.family, what)


def apply_qk_norm(norm: nn.Module, t: Tensor) -> tuple[Tensor, bool] | None:
    """``t (…, n, Dh)`` through a QK-norm module, per head or over ``n·Dh`` (whichever its gain's size allows and
    runs): ``(result, per_head)``; None when neither layout runs."""
    weight = getattr(norm, "weight", None)
    wide = weight is not None and weight.numel() == t.shape[-2] * t.shape[-1] and t.shape[-2] > 1 and weight.dim() == 1
    tries = [(False, lambda: norm(t.flatten(-2)).reshape(t.shape))] if wide else []
    tries.append((True, lambda: norm(t)))
    for per_head, run in tries:
        try:
            with torch.no_grad():
                y = run()
        except (RuntimeError, ValueError):
            continue
        if isinstance(y, Tensor) and y.shape == t.shape:
            return y, per_head
    return None


def anatomy_points(anatomy: Anatomy) -> dict[str, Point]:
    """The named points the anatomy adds to the model view, per layer ``i``:

    - ``layers.{i}.attn.q`` / ``attn.k`` / ``attn.v`` — each side's heads as projected ``(B, L, n, Dh)``, before a
      QK-norm, the side's scale and the rotation (TransformerLens's ``hook_q`` / ``hook_k`` / ``hook_v``);
      replaceable (a fused projection's other columns unchanged);
    - ``layers.{i}.attn.rotary`` — the ``(cos, sin)`` the family hands its attention (read-only; where it rotates
      by them);
    - ``layers.{i}.mlp.resid`` — the residual stream the MLP reads, before its norm ``(B, L, D)``
      (TransformerLens's ``hook_mlp_in`` with ``use_hook_mlp_in``); replaceable, changing the MLP's input alone
      (also where the MLP shares the attention's norm, or reads the block's input beside the attention).
    """
    points: dict[str, Point] = {}
    for part in anatomy.layers:
        i = part.index
        for side in (part.q, part.k, part.v):
            name = f"layers.{i}.attn.{side.name}"
            points[name] = ColumnsPoint(name, side.module, side.columns)
        if part.rotation.kind not in ("none", "headwise"):
            name = f"layers.{i}.attn.rotary"
            points[name] = ArgumentPoint(name, part.attention, "position_embeddings")
        if part.mlp is not None:
            name = f"layers.{i}.mlp.resid"
            if part.shared_norm:
                points[name] = NormedInputPoint(name, part.mlp, part.mlp_norm, part.block)
            else:
                points[name] = Point(name, part.mlp_norm if part.mlp_norm is not None else part.mlp, "input")
    return points
