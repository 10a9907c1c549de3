"""How senders' writes reach receivers' inputs: the residual structure of a model read at run time, and one
forward pass that records every sender's write and edits chosen receivers' inputs.

Shape legend: N rows of a batch (J jobs × P pairs), L length, D model width, NL layers, H query heads,
Hkv key/value groups, Dh head width.

A pre-norm residual block reads the residual stream ``r`` through a norm and adds its writes back::

    r_mid = r + Σ_h o_h(z_h) + b_o          o_h(z_h) = z_h · W_O[h]    (the heads' writes; Elhage et al. 2021)
    r_out = r_mid + mlp(norm2(r_mid))

so the residual at any point is the sum of the writes before it (the embeddings, each head, each MLP) plus
constant biases. A receiver's input is the residual where it is read: a query head's query input is ``r`` at
its layer through the input norm and that head's rows of W_Q; a key/value group's key (value) input is ``r``
through the norm and the group's rows of W_K (W_V) — one input for every query head that reads the group
(GQA: Hkv groups of H/Hkv query heads); an MLP's input is ``r_mid`` (the MLP's norm's input); the logits'
input is the last block's output (the final norm's input).

:class:`Wiring` edits a receiver's input by adding ``Δ (N, n, L, D)`` (n receivers of one group: the H query
heads of a layer, its Hkv key groups, its Hkv value groups, one MLP, the logits) to the residual it reads, on
that side only: the query projection of head h is recomputed as ``W_Q[h] · norm(r + Δ_h)`` (the layer's
input norm called on the edited residual) and replaces head h's columns of the projection's output; keys and
values per group the same. Nothing else of the forward pass changes, so the edit can be exact (path
patching), a zero tensor whose gradient is ∂metric/∂input (edge attribution), or a function of the run's
own writes (faithfulness: every edge outside a circuit ablated).

Edge attribution needs only the gradient with respect to every receiver's input, not an edited forward pass:
:meth:`Wiring.receiver_gradients` leaves the model's projections as they are and taps their output gradient
``∂m/∂y (N, L, out)`` in the backward pass. A receiver i of a side reads ``x = norm(r)`` through its rows
``W_i``, so its cotangent on ``x`` is ``u_i = ∂m/∂y[..., cols of i] · W_i`` and the gradient with respect to
its own input is the norm's vector–Jacobian product at ``r`` with ``u_i`` — recomputed in the hook from the
norm alone (per position, transient), handed over and freed. The model's own backward carries the summed
gradient on through ``r`` unchanged, so nothing ``(N, n, L, D)`` is kept for the backward pass (the route of
the edited inputs keeps a normalised copy of the residual per receiver and layer).

The parts are the model's anatomy (:attr:`headwise.models.HeadModel.anatomy`): the attention's input norm (the
identity where the attention reads the residual stream), each side's heads' columns of whatever projection holds
them (separate, GPT-2's ``c_attn``, Phi-3's ``qkv_proj``, GPT-NeoX's interleaved ``query_key_value``, Falcon's
grouped one), the output projection, the MLP and its norm, the layer's multiplier on its writes (Granite: every
write recorded times it) and whether the block is parallel (GPT-NeoX, Phi-2, Falcon: the MLP reads the block's
input, so a layer's heads do not feed its own MLP — the graph states it). Every edit and recording acts at the
model view's named points: the residual at ``layers.{l}.resid_pre``, a receiver's projection at
``layers.{l}.attn.{q|k|v}`` (its columns replaced by ``W_i · norm(r + Δ_i)``), an MLP's input at
``layers.{l}.mlp.resid`` (the residual before its norm; ``norm(r + Δ)`` for the MLP alone where it shares the
attention's norm), the logits' input at ``resid_final``.

An RMS norm on the attention's write (Gemma 2/3, OLMo 2: ``r + norm(o_proj(z))``) makes the heads' writes
interact through its scale ``1/rms(o)``. Each head's write is then ``o_h · g / rms(o)`` with the scale of
the run it was recorded in (as :mod:`headwise.patching.logit_attribution` freezes norms): the heads' writes
still add up to the layer's write exactly, which edge attribution and faithfulness rest on; path patching
computes a head's change exactly instead, ``norm(o_base + o_h(source) − o_h(base)) − norm(o_base)``
(:mod:`headwise.circuits.paths`). A norm on the MLP's write is part of the MLP node.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from headwise.circuits.addresses import Receiver, Write
from headwise.models.anatomy import LayerAnatomy, Side
from headwise.models.head_model import HeadModel
from headwise.points import attention_point, layer_point

__all__ = ["Wiring", "wiring"]

#: ``deltas(group, writes) -> Δ (N, n, L, D) or None``: group a :class:`Receiver` (``Receiver("q"|"k"|"v"|"mlp",
#: layer)`` or ``Receiver("logits", NL)``); ``writes`` the :class:`Write` s recorded so far in this pass (see
#: :meth:`Wiring.run`).
Deltas = Callable[[Receiver, dict], "Tensor | None"]
#: ``receive(group, grad (N, n, L, D))``: the metric's gradient with respect to the n inputs of a receiver group
#: (see :meth:`Wiring.receiver_gradients`), called once per group during the backward pass.
Receive = Callable[[Receiver, Tensor], None]


class Wiring:
    """The residual structure of one model (see the module docstring) and the pass that edits receivers.

    Build it with :func:`wiring`. Attributes: ``target`` (the :class:`HeadModel`), ``layers`` (its anatomy's NL
    :class:`~headwise.models.anatomy.LayerAnatomy`, whose operations the pass calls).
    """

    def __init__(self, target: HeadModel, layers: list[LayerAnatomy]):
        self.target = target
        self.layers = layers
        self._weights: dict = {}

    def weights(self, layer: int, side: str) -> tuple[Tensor, Tensor | None]:
        """``(W (n, Dh, D), b (n, Dh) or None)``: the anatomy's side ``side`` of ``layer`` in the ``"heads"`` layout,
        read once per wiring (on a model opened layer by layer: each time, within the layer's forward or backward,
        when its weights are in)."""
        if self.target.stream is not None:  # layer by layer: read while the layer is in, never kept
            return self.layers[layer].sides[side].weights("heads")
        key = (layer, side)
        if key not in self._weights:
            self._weights[key] = self.layers[layer].sides[side].weights("heads")
        return self._weights[key]

    # -- the pass ------------------------------------------------------------------------------------------
    def run(
        self,
        ids: Tensor,
        *,
        deltas: Deltas | None = None,
        record: bool = False,
        embed: Callable[[Tensor], Tensor] | None = None,
        last_only: bool = False,
        extra: list | tuple = (),
    ) -> tuple[Tensor, dict]:
        """One forward pass of ``ids (N, L)``, every edit and recording at the model view's named points.

        Args:
            deltas: ``fn(group, writes) -> Δ (N, n, L, D) or None`` asked for each receiver group as the pass
                reaches it (None: that group's inputs are left as they are).
            record: record the senders' writes: ``writes[Write("embed", -1)] (N, 1, L, D)``,
                ``writes[Write("heads", l)] (N, H, L, D)``, ``writes[Write("mlp", l)] (N, 1, L, D)`` (``deltas``
                that read them need it), and the heads' outputs ``writes[Write("z", l)] (N, H, L, Dv)`` (see
                :mod:`headwise.circuits.addresses`).
            embed: ``fn(first block's input) -> replacement`` (EAP-IG's interpolated embeddings).
            last_only: a Hugging Face model's logits at the last position only.
            extra: more ``(point name, hook)`` pairs registered for the pass (after this pass's own).
        Returns:
            ``(logits (N, L or 1, V), writes)``.
        """
        writes: dict = {}
        hooks = self._record_hooks(writes) if record else []
        if deltas is not None:
            hooks += self._edit_hooks(deltas, writes)
        return self._forward(ids, hooks, embed, last_only, extra), writes

    def _forward(self, ids: Tensor, hooks: list, embed, last_only: bool, extra) -> Tensor:
        """The model's logits of ``ids`` with ``hooks`` (after ``embed``'s, before ``extra``)."""
        first = [(layer_point(0, "resid_pre"), embed)] if embed is not None else []
        with self.target.hooks([*first, *hooks, *extra]):
            return self.target.logits(ids, last_only=last_only)

    def _record_hooks(self, writes: dict) -> list:
        """The hooks that record every sender's write into ``writes``."""
        hooks = [(layer_point(0, "resid_pre"), partial(self._keep_embed, writes))]
        for layer, part in enumerate(self.layers):
            hooks.append((layer_point(layer, "attn.heads"), partial(self._keep, writes, layer, part)))
            if part.attn_post is not None:
                hooks.append((layer_point(layer, "attn.out"), partial(self._keep_post, writes, layer, part)))
            if part.mlp is not None:
                hooks.append((layer_point(layer, "mlp.out"), partial(self._keep_mlp, writes, layer, part)))
        return hooks

    def _receiver_hooks(self, side_hook, input_hook) -> list:
        """A hook at every receiver group's input: ``side_hook(residual, layer, side)`` at each projection's side,
        ``input_hook(group)`` at each MLP's input and the logits' (the residual each layer reads kept first)."""
        residual: dict = {}
        hooks = []
        for layer, part in enumerate(self.layers):
            hooks.append((layer_point(layer, "resid_pre"), partial(self._residual, residual, layer)))
            for side in part.sides.values():
                hooks.append((attention_point(layer, side.name), side_hook(residual, layer, side)))
            if part.mlp is not None:
                hooks.append((layer_point(layer, "mlp.resid"), input_hook(Receiver("mlp", layer))))
        hooks.append(("resid_final", input_hook(Receiver("logits", len(self.layers)))))
        return hooks

    def _edit_hooks(self, deltas: Deltas, writes: dict) -> list:
        """The hooks that add each receiver group's ``Δ`` to its input (:meth:`run`)."""
        return self._receiver_hooks(
            lambda residual, layer, side: partial(self._project, residual, layer, side, deltas, writes),
            lambda group: partial(self._add, group, deltas, writes),
        )

    def _tap_hooks(self, zero: Tensor, receive: Receive) -> list:
        """The hooks that hand each receiver group's input gradient to ``receive`` (:meth:`receiver_gradients`)."""
        return self._receiver_hooks(
            lambda residual, layer, side: partial(self._tap, residual, layer, side, zero, receive),
            lambda group: partial(self._tapped, group, zero, receive),
        )

    def receiver_gradients(
        self,
        ids: Tensor,
        metric: Callable[[Tensor], Tensor],
        receive: Receive,
        *,
        embed: Callable[[Tensor], Tensor] | None = None,
        last_only: bool = False,
        extra: list | tuple = (),
    ) -> Tensor:
        """One forward pass of ``ids (N, L)`` and one backward pass of ``metric(logits).sum()`` that hands the
        gradient with respect to every receiver group's inputs to ``receive(group, grad (N, n, L, D))`` as the
        backward pass reaches it (groups as ``deltas`` of :meth:`run`; n = H query heads, Hkv key or value
        groups, 1 for an MLP or the logits).

        The same gradients as a zero ``Δ`` added to every receiver's input by :meth:`run` (the gradient with
        respect to ``Δ``), without the forward pass's per-receiver copies: a query/key/value receiver's gradient
        is the input norm's vector–Jacobian product at the residual ``r`` with ``∂m/∂y_i · W_i`` (``y_i`` its
        columns of the projection's output), recomputed in the backward hook (see the module docstring); an
        MLP's and the logits' input get a zero added (a broadcast view of one scalar). The model's parameters
        get no ``.grad``.

        Args:
            metric: ``fn(logits (N, L or 1, V)) -> (N,)``, differentiable.
            embed, last_only, extra: as :meth:`run` (``extra``: hooks that also read the pass, e.g.
                :class:`~headwise.circuits.atp.AttentionTaps`; a gradient hook they register fires in the backward).
        Returns:
            ``(N,)`` the metric (detached).
        """
        dtype = self.weights(0, "q")[0].dtype
        zero = torch.zeros((), dtype=dtype, device=ids.device, requires_grad=True)
        first = [(layer_point(0, "resid_pre"), embed)] if embed is not None else []
        hooks = [*first, *self._tap_hooks(zero, receive), *extra]
        with torch.enable_grad(), self.target.hooks(hooks):  # through the backward: a layer walk recomputes
            logits = self.target.logits(ids, last_only=last_only)
            value = metric(logits)  # (N,)
            torch.autograd.grad(value.sum(), [zero], allow_unused=True)
        return value.detach()

    # -- hooks (each at a named point of the view) ------------------------------------------------------------
    @staticmethod
    def _keep_embed(writes: dict, x: Tensor) -> None:
        writes[Write("embed", -1)] = x[:, None]  # (N, 1, L, D)

    @staticmethod
    def _keep(writes: dict, layer: int, part: LayerAnatomy, z: Tensor) -> None:
        writes[Write("z", layer)] = z  # (N, H, L, Dv): the heads' outputs, whose change a head's write factors through
        heads = part.head_writes(z)  # (N, H, L, D)
        if part.attn_post is None:
            writes[Write("heads", layer)] = heads if part.scale == 1.0 else heads * part.scale
        else:  # the post-norm's input comes next (attn.out): keep the projections, scale them there
            writes[Write("o_heads", layer)] = heads

    @staticmethod
    def _keep_post(writes: dict, layer: int, part: LayerAnatomy, o: Tensor) -> None:
        """At ``attn.out``: ``o (N, L, D)``, the attention's output, is the post-norm's input."""
        writes[Write("o", layer)] = o
        factor = part.attn_post_scale(o) * part.scale  # (N, L, D): the post-norm's scale frozen at this run
        writes[Write("heads", layer)] = writes[Write("o_heads", layer)] * factor[:, None]

    @staticmethod
    def _keep_mlp(writes: dict, layer: int, part: LayerAnatomy, x: Tensor) -> None:
        """At ``mlp.out``: the MLP's write, through its post-norm and the layer's multiplier."""
        x = part.mlp_write(x)
        writes[Write("mlp", layer)] = (x * part.scale if part.scale != 1.0 else x)[:, None]  # (N, 1, L, D)

    @staticmethod
    def _residual(store: dict, layer: int, x: Tensor) -> None:
        store[layer] = x  # (N, L, D): the residual the attention reads (the block's input)

    def _project(self, residual, layer: int, side: Side, deltas: Deltas, writes, t: Tensor):
        """At ``attn.{q|k|v}`` (``t (N, L, n, Dh)``): each receiver's columns recomputed from ``norm(r + Δ_i)``."""
        delta = deltas(Receiver(side.name, layer), writes)
        if delta is None:
            return None
        r = residual[layer]  # (N, L, D)
        x = self.layers[layer].attn_input(r[:, None] + delta.to(r.dtype))  # (N, n, L, D)
        W, bias = self.weights(layer, side.name)  # (n, Dh, D), (n, Dh) or None
        new = torch.einsum("nild,iwd->nliw", x, W.to(x.dtype))  # (N, L, n, Dh)
        return new if bias is None else new + bias.to(x.dtype)

    def _tap(self, residual, layer: int, side: Side, zero: Tensor, receive: Receive, t: Tensor) -> Tensor:
        """At ``attn.{q|k|v}``: the same values, a node whose gradient ``∂m/∂y (N, L, n, Dh)`` goes back to each
        receiver's input through the input norm's vector–Jacobian product at ``r``."""
        y = t + zero.to(t.dtype)
        r = residual[layer].detach()
        y.register_hook(partial(self._side_gradients, r, layer, side, receive))
        return y

    def _side_gradients(self, r: Tensor, layer: int, side: Side, receive: Receive, g: Tensor) -> None:
        W = self.weights(layer, side.name)[0]  # (n, Dh, D)
        u = torch.einsum("nliw,iwd->nild", g, W.to(g.dtype))  # (N, n, L, D): cotangents on norm(r)
        receive(Receiver(side.name, layer), self.layers[layer].attn_norm_vjp(r, u))

    @staticmethod
    def _tapped(group, zero: Tensor, receive: Receive, x: Tensor) -> Tensor:
        """At ``mlp.resid`` / ``resid_final``: ``x (N, L, D)`` plus a zero ``(N, 1, L, D)`` view of one scalar whose
        gradient goes to ``receive``."""
        d = zero.to(x.dtype).expand(x.shape[0], 1, *x.shape[1:])
        d.register_hook(partial(receive, group))
        return x + d[:, 0]

    @staticmethod
    def _add(group, deltas: Deltas, writes, x: Tensor):
        """At ``mlp.resid`` / ``resid_final``: the receiver's input plus its ``Δ``."""
        delta = deltas(group, writes)
        return None if delta is None else x + delta[:, 0].to(x.dtype)


def wiring(model) -> Wiring:
    """Read ``model``'s residual structure from its anatomy (:attr:`HeadModel.anatomy`).

    Args:
        model: a :class:`HeadModel` or anything :func:`headwise.patching.as_target` accepts (a decoder with a
            language-model head).
    Raises:
        ValueError: a structure headwise does not read (the anatomy's one sentence), or an encoder.
    """
    from headwise.patching import as_target

    target = as_target(model)
    if target.kind != "decoder":
        raise ValueError(f"model: circuits trace decoders; the {target.family} is an {target.kind}")
    anatomy = target.anatomy
    for part in anatomy.layers:  # a norm on the attention's write: its scale frozen per run, so an RMS norm
        if part.attn_post is None:
            continue
        with target.holding(part.index):
            rms = part.attn_post_rms()
        if rms is None:
            raise anatomy.refuse(
                f"layer {part.index} normalises its attention's write with a {type(part.attn_post).__name__} that "
                "is not an RMS norm x·g/rms(x), so its heads' writes cannot be separated"
            )
    return Wiring(target, anatomy.layers)
