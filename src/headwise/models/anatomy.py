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

How it is found (:mod:`headwise.models.anatomy_probe`, with the probe and its recording in
:mod:`headwise.models.anatomy_recording` and the q / k / v sides in :mod:`headwise.models.anatomy_sides`). From the
module tree first: the block is the attention module's ancestor in a layer list (:mod:`headwise.points`), norms are
the block's children that normalise, the projections carry one of the names of the tables in
:mod:`headwise.models.anatomy_sides`, the output projection one of
:data:`headwise.points.OUT_PROJ_NAMES`. Then one
recording pass confirms every part on inputs that cannot hide a structure: several tokens, none of them a special
token or a token whose embedding is zero, no padding. A norm is the one whose input and output are what the
structure says; a fused layout is the candidate whose columns give the queries and keys the attention used (at the
first position, where rotary positions rotate nothing) and the values whose weighted sum is each head's output;
the block's writes must add up to its change of the residual stream; the final logits must be the unembedding of
the final norm (scaled, soft-capped). Every comparison uses one tolerance, :data:`TOLERANCE`.

A structure the rules do not read is refused once, in one sentence (:class:`AnatomyError`, a ValueError:
``model: headwise cannot read the anatomy of this <family> model: <what>``), which every tool repeats. A family the
rules miss gets one entry in one table: the names in :mod:`headwise.models.anatomy_sides`, the config attributes
in :mod:`headwise.models.anatomy_probe`.

The anatomy is also the one algebra of its parts, which tools call instead of copying fields: a side's weights in
one of :data:`LAYOUTS` (:meth:`Side.weights`), its QK-norm applied or frozen (:meth:`Side.apply_norm`,
:meth:`Side.norm_frozen`), a layer's input norm applied, frozen at a run or differentiated
(:meth:`LayerAnatomy.attn_input`, :meth:`LayerAnatomy.attn_norm_frozen`, :meth:`LayerAnatomy.attn_norm_vjp`), the
heads' writes and the norm and multiplier on them (:meth:`LayerAnatomy.head_writes`,
:meth:`LayerAnatomy.attn_post_scale`, :attr:`LayerAnatomy.scale`), one head's q or k side frozen at a run
(:meth:`LayerAnatomy.freeze_side`), the rotation (:mod:`headwise.models.rotation`), the final norm frozen
(:meth:`Anatomy.final_norm_frozen`); norms of any class through :mod:`headwise.models.norms`::

    frozen = hm.anatomy[3].attn_norm_frozen(r)    # layer 3's input norm at this run (r: the rows it read)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from headwise.models.frozen_side import FrozenSide
from headwise.models.norms import TOLERANCE, FrozenNorm, apply_qk_norm, freeze, norm_epsilon, norm_vjp, same
from headwise.models.rotation import Rotation
from headwise.points import (
    ArgumentPoint,
    ColumnsPoint,
    NormedInputPoint,
    Point,
    attention_point,
    layer_point,
    output_tensor,
)

#: The layouts a side's weights come in (:meth:`Side.weights`).
LAYOUTS = ("heads", "rows", "columns")

__all__ = [
    "LAYOUTS",
    "TOLERANCE",
    "Anatomy",
    "AnatomyError",
    "LayerAnatomy",
    "Rotation",
    "Side",
    "affine",
    "anatomy_points",
    "is_norm",
    "norm_epsilon",
    "apply_qk_norm",
    "same",
]


class AnatomyError(ValueError):
    """A model whose structure headwise cannot read; the one sentence every tool repeats."""

    def __init__(self, family: str, what: str):
        super().__init__(f"model: headwise cannot read the anatomy of this {family} model: {what}")
        self.family, self.what = family, what


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a normalisation layer (``nn.LayerNorm``, ``nn.RMSNorm``, or a class named ``*Norm*``)."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or "norm" in type(module).__name__.lower()


def affine(module: nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """``(W (out, in), b (out,) or None)`` of an ``nn.Linear`` or GPT-2's ``Conv1D`` (stored ``(in, out)``) — the
    one weight reader, in ``nn.Linear``'s orientation; None for any other module."""
    if isinstance(module, nn.Linear):
        return module.weight, module.bias
    if type(module).__name__ == "Conv1D" and isinstance(getattr(module, "weight", None), Tensor):
        return module.weight.t(), module.bias
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
            the scores (OPT scales its queries by ``Dh^-1/2`` there; 1.0 elsewhere). :meth:`weights` are the
            projection's own; the side the attention uses is ``scale ×`` theirs.
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

    def weights(self, layout: str = "heads") -> tuple[Tensor, Tensor | None]:
        """``(W, b)``: this side's weights and bias (None without one) in ``layout``, one of :data:`LAYOUTS` —
        ``"heads"`` ``W (n, Dh, D)``, ``b (n, Dh)`` (``y_i = W[i] x + b[i]``); ``"rows"`` ``W (n·Dh, D)``, ``b
        (n·Dh,)`` (``nn.Linear``'s orientation, heads side by side); ``"columns"`` ``W (D, n·Dh)``, ``b (n·Dh,)`` (the
        row-vector convention ``x W + b``). A fused projection's layout undone; the projection's own (not times
        :attr:`scale`), as stored (dtype, autograd)."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        W, b = affine(self.module)
        cols = self.columns.to(W.device)
        W = W[cols]  # (n, Dh, D)
        b = None if b is None else b[cols]  # (n, Dh)
        if layout == "heads":
            return W, b
        W, b = W.reshape(-1, W.shape[-1]), None if b is None else b.reshape(-1)  # (n·Dh, D), (n·Dh,)
        return (W, b) if layout == "rows" else (W.T, b)

    def apply_norm(self, t: Tensor) -> Tensor:
        """``t (…, n, Dh)`` as projected -> through this side's QK-norm as the module applies it (per head, or over
        the whole ``n·Dh``); ``t`` itself without one."""
        if self.norm is None:
            return t
        if self.norm_per_head:
            return output_tensor(self.norm(t))
        return output_tensor(self.norm(t.flatten(-2))).reshape(t.shape)

    def norm_frozen(self, t: Tensor, index: int) -> tuple[FrozenNorm, slice] | None:
        """The QK-norm frozen at this run for head (group) ``index``: ``t (L, n, Dh)`` the side's heads as projected
        (``layers.{l}.attn.{q|k}``) -> ``(frozen, cols)``, its rows the L positions and ``cols`` the head's entries
        of its gain (``0 … Dh`` per head, ``index·Dh …`` over the whole projection); None without a QK-norm."""
        if self.norm is None:
            return None
        with torch.no_grad():
            y = self.apply_norm(t)
        x, y, Dh = t.double(), y.double(), t.shape[-1]
        what = f"{self.name}_norm"
        if self.norm_per_head:  # each head's Dh (Qwen 3, Gemma 3, headwise's modules)
            return freeze(self.norm, x[:, index], y[:, index], what=what), slice(0, Dh)
        L = x.shape[0]  # over the whole projection (OLMo 2): (L, n·Dh)
        frozen = freeze(self.norm, x.reshape(L, -1), y.reshape(L, -1), what=what)
        return frozen, slice(index * Dh, (index + 1) * Dh)

    def norm_gain(self, t: Tensor) -> Tensor | None:
        """``(n·Dh,)`` float64: the QK-norm's gain as it acts, frozen at ``t (…, n, Dh)`` (every head's entries, a
        per-head gain repeated); None without a QK-norm."""
        if self.norm is None:
            return None
        with torch.no_grad():
            y = self.apply_norm(t)
        x, y = (t, y) if self.norm_per_head else (t.flatten(-2), y.flatten(-2))
        rows = x.reshape(-1, x.shape[-1]).double(), y.reshape(-1, y.shape[-1]).double()
        g = freeze(self.norm, *rows, what=f"{self.name}_norm").gain.reshape(-1)
        return g.repeat(self.n) if self.norm_per_head else g

    def take(self, y: Tensor) -> Tensor:
        """``y (…, out)`` the module's output -> ``(…, n, Dh)`` this side's heads."""
        return y[..., self.columns.to(y.device)]


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
    _memo: dict = field(default_factory=dict, repr=False)

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

    def head_writes(self, z: Tensor) -> Tensor:
        """``z (N, H, L, Dv)`` the heads' outputs -> ``(N, H, L, D)`` each head's projected write ``z_h · W_O[h]``
        (no bias, before a norm on the write and the multiplier :attr:`scale`)."""
        return torch.einsum("nhlv,hvd->nhld", z, self.heads_out().to(z.dtype))

    # -- the input norm ----------------------------------------------------------------------------------------
    def attn_input(self, r: Tensor) -> Tensor:
        """``r (…, D)`` the residual stream -> the attention's input ``(…, D)``: the input norm applied (``r``
        itself where the attention reads the residual stream)."""
        return r if self.attn_norm is None else output_tensor(self.attn_norm(r))

    def attn_norm_frozen(self, r: Tensor, y: Tensor | None = None) -> FrozenNorm | None:
        """The input norm frozen at this run: ``r (N, D)`` the residual rows it read, ``y (N, D)`` its outputs
        (None: computed) -> :class:`~headwise.models.norms.FrozenNorm` (``y = frozen(r) + frozen.bias``, linear in
        parts of ``r``); None where the attention reads the residual stream itself. Raises a ValueError where the
        norm is neither a LayerNorm nor an RMS norm at this run."""
        if self.attn_norm is None:
            return None
        return freeze(self.attn_norm, r, y, what=f"layer {self.index}'s input norm")

    def attn_norm_vjp(self, r: Tensor, u: Tensor) -> Tensor:
        """``(N, n, L, D)``: the input norm's vector–Jacobian product at ``r (N, L, D)`` with each ``u[:, i]``."""
        return norm_vjp(self.attn_norm, r, u)

    def freeze_side(
        self, name: str, index: int, *, input_norm: FrozenNorm | None, projected: Tensor, position_embeddings=None
    ) -> FrozenSide:
        """Head (group) ``index``'s side ``name`` (``"q"`` or ``"k"``) frozen at a run, as a
        :class:`~headwise.models.frozen_side.FrozenSide` on the residual's device: ``input_norm`` this layer's input
        norm frozen there (:meth:`attn_norm_frozen`), ``projected (L, n, Dh)`` the side's heads as projected
        (``layers.{l}.attn.{q|k}``: the QK-norm frozen on them), ``position_embeddings`` the ``(cos, sin)`` of the
        run (``layers.{l}.attn.rotary``) for the rotation."""
        side = self.sides[name]
        W, b = side.weights("columns")  # (D, n·Dh), (n·Dh,)
        W = W.detach().double()
        b = torch.zeros(W.shape[1], dtype=torch.float64, device=W.device) if b is None else b.detach().double()
        Dh = side.width
        cols = slice(index * Dh, (index + 1) * Dh)
        device = projected.device if input_norm is None else input_norm.inv.device
        rotation = self.rotation

        def rotate(t: Tensor, pos: Tensor) -> Tensor:
            return rotation(t, pos, position_embeddings)

        qk_norm = side.norm_frozen(projected, index)
        return FrozenSide(W[:, cols].to(device), b[cols].to(device), input_norm, qk_norm, rotate, side.scale)

    # -- the write ---------------------------------------------------------------------------------------------
    def attn_post_frozen(self, o: Tensor, y: Tensor | None = None) -> FrozenNorm | None:
        """The norm on the attention's write frozen at this run (``o (N, D)`` the output projection's output, ``y``
        the norm's); None without one."""
        if self.attn_post is None:
            return None
        return freeze(self.attn_post, o, y, what=f"layer {self.index}'s attention norm")

    def attn_post_rms(self) -> tuple[Tensor, float] | None:
        """``(g (D,), ε)`` of a norm on the attention's write that is an RMS norm ``x·g/sqrt(ms(x) + ε)`` without
        bias (read once, on a seeded draw); None without one, or where it is not of that form."""
        if "post_rms" not in self._memo:
            self._memo["post_rms"] = None
            if self.attn_post is not None:
                W, _ = affine(self.out_proj)
                x = torch.randn(3, W.shape[0], generator=torch.Generator().manual_seed(0)).to(W)
                try:
                    frozen = freeze(self.attn_post, x, what="")
                except ValueError:
                    frozen = None
                if frozen is not None and not frozen.centred and not frozen.bias.any():
                    eps = frozen.epsilon(x)
                    self._memo["post_rms"] = None if eps is None else (frozen.gain, eps)
        return self._memo["post_rms"]

    def attn_post_scale(self, o: Tensor) -> Tensor:
        """``(…, D)``: the RMS norm on the attention's write at ``o (…, D)`` as a per-element factor, its scale
        frozen (``post(o) = o · attn_post_scale(o)``); see :meth:`attn_post_rms`."""
        gain, eps = self.attn_post_rms()
        return gain.to(o.dtype) * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)

    def mlp_write(self, out: Tensor) -> Tensor:
        """``out (…, D)`` the MLP's output -> its write before the multiplier: through a norm on it (or a copy: a
        family may add to the MLP's output in place, Falcon's ``mlp_output += attention_output``)."""
        return out.clone() if self.mlp_post is None else output_tensor(self.mlp_post(out))


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

    def final_norm_frozen(self, x: Tensor, y: Tensor | None = None) -> FrozenNorm | None:
        """The final norm frozen at this run (``x (N, D)`` its input rows, ``y`` its outputs or None: computed);
        None where the unembedding reads the last block's output."""
        if self.final_norm is None:
            return None
        return freeze(self.final_norm, x, y, what="final norm")


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
            name = attention_point(i, side.name)
            points[name] = ColumnsPoint(name, side.module, side.columns)
        if part.rotation.kind == "tables":
            name = layer_point(i, "attn.rotary")
            points[name] = ArgumentPoint(name, part.attention, "position_embeddings")
        if part.mlp is not None:
            name = layer_point(i, "mlp.resid")
            if part.shared_norm:
                points[name] = NormedInputPoint(name, part.mlp, part.mlp_norm, part.block)
            else:
                points[name] = Point(name, part.mlp_norm if part.mlp_norm is not None else part.mlp, "input")
    return points
