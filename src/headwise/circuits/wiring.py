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

The structure is found by one recording pass, not from a list of families: the attention's input norm is the
block's norm whose output is the attention's input, the MLP's the norm whose output is the MLP's input; the
projections are ``q_proj / k_proj / v_proj`` (Llama, Gemma, Qwen, Mistral, …), ``Wq / Wk / Wv`` (headwise's
modules) or GPT-2's fused ``c_attn``; the output projection an ``nn.Linear`` or a GPT-2 ``Conv1D``. Blocks
without pre-norms and fused projections of other layouts are refused (named).

An RMS norm on the attention's write (Gemma 2/3, OLMo 2: ``r + norm(o_proj(z))``) makes the heads' writes
interact through its scale ``1/rms(o)``. Each head's write is then ``o_h · g / rms(o)`` with the scale of
the run it was recorded in (as :mod:`headwise.patching.logit_attribution` freezes norms): the heads' writes
still add up to the layer's write exactly, which edge attribution and faithfulness rest on; path patching
computes a head's change exactly instead, ``norm(o_base + o_h(source) − o_h(base)) − norm(o_base)``
(:mod:`headwise.circuits.paths`). A norm on the MLP's write is part of the MLP node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from headwise.models.head_model import HeadModel
from headwise.points import OUT_PROJ_NAMES

__all__ = ["LayerWiring", "Wiring", "wiring"]

_QKV_NAMES = (("q_proj", "k_proj", "v_proj"), ("Wq", "Wk", "Wv"))
_FUSED_NAMES = ("c_attn",)

#: ``deltas(group, writes) -> Δ (N, n, L, D) or None``: group is ``("q"|"k"|"v"|"mlp", layer)`` or
#: ``("logits", NL)``; ``writes`` the sender writes recorded so far in this pass (see :meth:`Wiring.run`).
Deltas = Callable[[tuple[str, int], dict], "Tensor | None"]
#: ``receive(group, grad (N, n, L, D))``: the metric's gradient with respect to the n inputs of a receiver group
#: (see :meth:`Wiring.receiver_gradients`), called once per group during the backward pass.
Receive = Callable[[tuple[str, int], Tensor], None]

#: elements of the transient ``(N, n', L, D)`` input copies one norm vector–Jacobian product is taken on
_VJP_ELEMENTS = 1 << 23


def _affine(module: nn.Module, what: str) -> tuple[Tensor, Tensor | None]:
    """``(W (out, in), b (out,) or None)`` of an ``nn.Linear`` or a GPT-2 ``Conv1D`` (weight ``(in, out)``)."""
    if isinstance(module, nn.Linear):
        return module.weight, module.bias
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:
        return module.weight.t(), module.bias
    raise ValueError(f"model: the {what} is a {type(module).__name__}, not a linear map this tracing reads")


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or "norm" in type(module).__name__.lower()


def _first_tensor(args, kwargs) -> Tensor | None:
    if args and isinstance(args[0], Tensor):
        return args[0]
    x = kwargs.get("hidden_states")
    return x if isinstance(x, Tensor) else None


def _out(output) -> Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


def _same(a: Tensor | None, b: Tensor | None) -> bool:
    if a is None or b is None or a.shape != b.shape:
        return False
    return bool((a - b).abs().max() <= 1e-5 * max(1.0, float(b.abs().max())))


_EPS_NAMES = ("variance_epsilon", "eps", "epsilon")


def _rms_gain(norm: nn.Module, width: int, like: Tensor) -> tuple[Tensor, float]:
    """``(g, ε)`` of an RMS norm ``x · g / sqrt(mean(x²) + ε)`` (its gain read by probing it with ones)."""
    eps = next((getattr(norm, n) for n in _EPS_NAMES if isinstance(getattr(norm, n, None), float)), None)
    if eps is None:
        raise ValueError(f"model: the norm on a write ({type(norm).__name__}) names no epsilon {_EPS_NAMES}")
    with torch.no_grad():
        gain = _out(norm(torch.ones(1, width, dtype=like.dtype, device=like.device)))[0] * (1.0 + eps) ** 0.5
    return gain, eps


def _rms_scale(gain: Tensor, eps: float, x: Tensor) -> Tensor:
    return gain.to(x.dtype) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@dataclass
class _Side:
    """One side (q, k or v) of a projection: n heads of Dh columns from ``offset``; ``W (n, Dh, D)``."""

    name: str
    module: nn.Module
    offset: int
    n: int
    width: int
    W: Tensor
    b: Tensor | None


@dataclass
class LayerWiring:
    """One layer's parts: the attention's input norm, the q/k/v sides, the per-head output map, the MLP.

    Attributes:
        attn_norm: the norm whose output is the attention's input.
        sides: ``{"q": …, "k": …, "v": …}`` each with ``n`` heads (H for q, Hkv for k and v).
        heads_out: ``(H, Dv, D)`` each head's rows of W_O (a head's write is ``z_h · heads_out[h]``).
        mlp, mlp_norm: the MLP and its input norm (None for an attention-only layer).
        attn_post, mlp_post: an RMS norm on the attention's / the MLP's write before the residual (Gemma 2/3,
            OLMo 2), or None.
    """

    attn_norm: nn.Module
    sides: dict[str, _Side]
    heads_out: Tensor
    mlp: nn.Module | None
    mlp_norm: nn.Module | None
    attn_post: nn.Module | None = None
    mlp_post: nn.Module | None = None
    post_gain: tuple | None = None

    def post_scale(self, o: Tensor) -> Tensor:
        """``(N, L, D)``: the attention's post-norm at ``o (N, L, D)`` as a per-element factor, its scale frozen
        (``post(o) = o · post_scale(o)``)."""
        return _rms_scale(*self.post_gain, o)

    @property
    def num_heads(self) -> int:
        return self.sides["q"].n

    @property
    def num_kv(self) -> int:
        return self.sides["k"].n


def _sides(attention: nn.Module, H: int) -> dict[str, _Side]:
    for names in _QKV_NAMES:
        mods = [getattr(attention, n, None) for n in names]
        if all(isinstance(m, nn.Module) for m in mods):
            Wq, bq = _affine(mods[0], "query projection")
            Dh = Wq.shape[0] // H
            out = {}
            for side, m in zip("qkv", mods):
                W, b = _affine(m, f"{side} projection")
                n = W.shape[0] // Dh
                out[side] = _Side(side, m, 0, n, Dh, W.reshape(n, Dh, -1), None if b is None else b.reshape(n, Dh))
            return out
    for name in _FUSED_NAMES:
        m = getattr(attention, name, None)
        if isinstance(m, nn.Module):
            W, b = _affine(m, "fused q/k/v projection")
            if W.shape[0] % 3:
                raise ValueError(f"model: the fused projection {name} has {W.shape[0]} outputs, not 3 equal parts")
            D3 = W.shape[0] // 3
            Dh = D3 // H
            out = {}
            for k, side in enumerate("qkv"):
                Ws = W[k * D3 : (k + 1) * D3].reshape(H, Dh, -1)
                bs = None if b is None else b[k * D3 : (k + 1) * D3].reshape(H, Dh)
                out[side] = _Side(side, m, k * D3, H, Dh, Ws, bs)
            return out
    raise ValueError(
        f"model: {type(attention).__name__} has neither separate q/k/v projections ({_QKV_NAMES}) nor a fused "
        f"{_FUSED_NAMES}: its receivers' inputs cannot be separated"
    )


def _heads_out(attention: nn.Module, H: int) -> Tensor:
    proj = next(
        (getattr(attention, n) for n in OUT_PROJ_NAMES if isinstance(getattr(attention, n, None), nn.Module)), None
    )
    if proj is None:
        raise ValueError(f"model: {type(attention).__name__} has no output projection named one of {OUT_PROJ_NAMES}")
    W, _ = _affine(proj, "output projection")  # (D, H·Dv)
    D, width = W.shape
    return W.t().reshape(H, width // H, D)  # (H, Dv, D)


class Wiring:
    """The residual structure of one model (see the module docstring) and the pass that edits receivers.

    Build it with :func:`wiring`. Attributes: ``target`` (the :class:`HeadModel`), ``layers`` (NL
    :class:`LayerWiring`).
    """

    def __init__(self, target: HeadModel, layers: list[LayerWiring]):
        self.target = target
        self.layers = layers
        self._inside = False

    # -- the pass ------------------------------------------------------------------------------------------
    def run(
        self,
        ids: Tensor,
        *,
        deltas: Deltas | None = None,
        record: bool = False,
        embed: Callable[[Tensor], Tensor] | None = None,
        last_only: bool = False,
        _taps: tuple[Tensor, Receive] | None = None,
    ) -> tuple[Tensor, dict]:
        """One forward pass of ``ids (N, L)``.

        Args:
            deltas: ``fn(group, writes) -> Δ (N, n, L, D) or None`` asked for each receiver group as the pass
                reaches it (None: that group's inputs are left as they are).
            record: record the senders' writes: ``writes[("embed", -1)] (N, 1, L, D)``, ``writes[("heads", l)]
                (N, H, L, D)``, ``writes[("mlp", l)] (N, 1, L, D)`` (``deltas`` that read them need it).
            embed: ``fn(first block's input) -> replacement`` (EAP-IG's interpolated embeddings).
            last_only: a Hugging Face model's logits at the last position only.
        Returns:
            ``(logits (N, L or 1, V), writes)``.
        """
        tgt = self.target
        writes: dict = {}
        hooks: list = []
        handles: list = []
        if embed is not None:
            hooks.append(("layers.0.resid_pre", embed))
        if record:
            hooks.append(("layers.0.resid_pre", partial(self._keep, writes, ("embed", -1), None)))
        for layer, lw in enumerate(self.layers):
            if record:
                hooks.append((f"layers.{layer}.attn.heads", partial(self._keep, writes, ("heads", layer), lw)))
                if lw.attn_post is not None:
                    fn = partial(self._keep_post, writes, layer, lw)
                    handles.append(lw.attn_post.register_forward_pre_hook(fn))
                if lw.mlp_post is not None:
                    fn = partial(self._keep_module, writes, ("mlp", layer))
                    handles.append(lw.mlp_post.register_forward_hook(fn))
                elif lw.mlp is not None:
                    hooks.append((f"layers.{layer}.mlp.out", partial(self._keep, writes, ("mlp", layer), None)))
        if deltas is not None:
            residual: dict = {}
            for layer, lw in enumerate(self.layers):
                handles.append(lw.attn_norm.register_forward_pre_hook(partial(self._residual, residual, layer)))
                by_module: dict[int, list[_Side]] = {}
                for side in lw.sides.values():
                    by_module.setdefault(id(side.module), []).append(side)
                for sides in by_module.values():
                    fn = partial(self._project, residual, layer, lw, sides, deltas, writes)
                    handles.append(sides[0].module.register_forward_hook(fn))
                if lw.mlp is not None:
                    fn = partial(self._add, ("mlp", layer), deltas, writes)
                    handles.append(lw.mlp_norm.register_forward_pre_hook(fn))
            hooks.append(("resid_final", partial(self._add_final, ("logits", len(self.layers)), deltas, writes)))
        if _taps is not None:  # (zero, receive): see receiver_gradients
            zero, receive = _taps
            residual = {}
            for layer, lw in enumerate(self.layers):
                handles.append(lw.attn_norm.register_forward_pre_hook(partial(self._residual, residual, layer)))
                by_module = {}
                for side in lw.sides.values():
                    by_module.setdefault(id(side.module), []).append(side)
                for sides in by_module.values():
                    fn = partial(self._tap, residual, layer, lw, sides, zero, receive)
                    handles.append(sides[0].module.register_forward_hook(fn))
                if lw.mlp is not None:
                    fn = partial(self._tap_input, ("mlp", layer), zero, receive)
                    handles.append(lw.mlp_norm.register_forward_pre_hook(fn))
            hooks.append(("resid_final", partial(self._tap_final, ("logits", len(self.layers)), zero, receive)))
        try:
            with tgt.hooks(hooks):
                logits = tgt.logits(ids, last_only=last_only)
        finally:
            for h in handles:
                h.remove()
        return logits, writes

    def receiver_gradients(
        self,
        ids: Tensor,
        metric: Callable[[Tensor], Tensor],
        receive: Receive,
        *,
        embed: Callable[[Tensor], Tensor] | None = None,
        last_only: bool = False,
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
            embed, last_only: as :meth:`run`.
        Returns:
            ``(N,)`` the metric (detached).
        """
        zero = torch.zeros((), dtype=self.layers[0].heads_out.dtype, device=ids.device, requires_grad=True)
        with torch.enable_grad():
            logits, _ = self.run(ids, embed=embed, last_only=last_only, _taps=(zero, receive))
            value = metric(logits)  # (N,)
            torch.autograd.grad(value.sum(), [zero], allow_unused=True)
        return value.detach()

    # -- hooks ---------------------------------------------------------------------------------------------
    @staticmethod
    def _keep(writes: dict, key, lw: LayerWiring | None, x: Tensor) -> None:
        if lw is None:
            writes[key] = x[:, None]  # (N, 1, L, D)
            return
        heads = torch.einsum("nhlv,hvd->nhld", x, lw.heads_out.to(x.dtype))  # z (N, H, L, Dv) -> (N, H, L, D)
        if lw.attn_post is None:
            writes[key] = heads
        else:  # the post-norm's input comes later: keep the projections, scale them there
            writes[("o_heads", key[1])] = heads

    @staticmethod
    def _keep_post(writes: dict, layer: int, lw: LayerWiring, _module, args) -> None:
        o = args[0]  # (N, L, D): the attention's output, the post-norm's input
        writes[("o", layer)] = o
        writes[("heads", layer)] = writes[("o_heads", layer)] * lw.post_scale(o)[:, None]

    @staticmethod
    def _keep_module(writes: dict, key, _module, _args, output) -> None:
        writes[key] = _out(output)[:, None]  # (N, 1, L, D)

    def _residual(self, store: dict, layer: int, _module, args, kwargs=None) -> None:
        if not self._inside:
            store[layer] = args[0]  # (N, L, D): the residual the attention reads

    def _project(self, residual, layer, lw: LayerWiring, sides, deltas: Deltas, writes, _module, _args, output):
        y = _out(output)  # (N, L, out)
        parts, at = [], 0
        for side in sorted(sides, key=lambda s: s.offset):
            delta = deltas((side.name, layer), writes)
            if delta is None:
                continue
            r = residual[layer]  # (N, L, D)
            self._inside = True
            try:
                x = lw.attn_norm(r[:, None] + delta.to(r.dtype))  # (N, n, L, D)
            finally:
                self._inside = False
            new = torch.einsum("nild,iwd->nliw", x, side.W.to(x.dtype))  # (N, L, n, Dh)
            if side.b is not None:
                new = new + side.b.to(x.dtype)
            parts += [y[..., at : side.offset], new.reshape(*new.shape[:2], -1)]
            at = side.offset + side.n * side.width
        if not parts:
            return None
        y = torch.cat([*parts, y[..., at:]], -1)
        return (y, *output[1:]) if isinstance(output, tuple) else y

    def _tap(self, residual, layer, lw: LayerWiring, sides, zero: Tensor, receive: Receive, _module, _args, output):
        y = _out(output) + zero  # (N, L, out): the same values, a node whose gradient is ∂m/∂y
        y.register_hook(partial(self._side_gradients, residual[layer], layer, lw, sides, receive))
        return (y, *output[1:]) if isinstance(output, tuple) else y

    def _side_gradients(self, r: Tensor, layer: int, lw: LayerWiring, sides, receive: Receive, grad: Tensor) -> None:
        N, L = grad.shape[:2]
        r = r.detach()  # (N, L, D)
        for side in sides:
            g = grad[..., side.offset : side.offset + side.n * side.width].reshape(N, L, side.n, side.width)
            u = torch.einsum("nliw,iwd->nild", g, side.W.to(g.dtype))  # (N, n, L, D): cotangents on norm(r)
            receive((side.name, layer), self._norm_vjp(lw.attn_norm, r, u))

    def _norm_vjp(self, norm: nn.Module, r: Tensor, u: Tensor) -> Tensor:
        """``(N, n, L, D)``: the vector–Jacobian product of ``norm`` at ``r (N, L, D)`` with each ``u[:, i]``."""
        step = max(1, _VJP_ELEMENTS // max(1, r.numel()))
        parts = []
        for i in range(0, u.shape[1], step):
            c = u[:, i : i + step]
            with torch.enable_grad():
                x = r[:, None].expand(c.shape).to(c.dtype).clone().requires_grad_(True)
                self._inside = True
                try:
                    y = norm(x)
                finally:
                    self._inside = False
                parts.append(torch.autograd.grad(y, x, c)[0])
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    @staticmethod
    def _tapped(group, zero: Tensor, receive: Receive, x: Tensor) -> Tensor:
        """``x (N, L, D)`` plus a zero ``(N, 1, L, D)`` view of one scalar whose gradient goes to ``receive``."""
        d = zero.to(x.dtype).expand(x.shape[0], 1, *x.shape[1:])
        d.register_hook(partial(receive, group))
        return x + d[:, 0]

    def _tap_input(self, group, zero: Tensor, receive: Receive, _module, args, kwargs=None):
        return (self._tapped(group, zero, receive, args[0]), *args[1:])

    def _tap_final(self, group, zero: Tensor, receive: Receive, x: Tensor) -> Tensor:
        return self._tapped(group, zero, receive, x)

    @staticmethod
    def _add(group, deltas: Deltas, writes, _module, args, kwargs=None):
        delta = deltas(group, writes)
        if delta is None:
            return None
        x = args[0]
        return (x + delta[:, 0].to(x.dtype), *args[1:])

    @staticmethod
    def _add_final(group, deltas: Deltas, writes, x: Tensor):
        delta = deltas(group, writes)
        return None if delta is None else x + delta[:, 0].to(x.dtype)


def _find_layer(target: HeadModel, layer: int, seen: dict) -> LayerWiring:
    attention = target.attention_modules[layer]
    block = target.points[f"layers.{layer}.resid_pre"].module
    H = target.heads_per_layer[layer]
    norms = [c for c in block.children() if _is_norm(c) and c is not attention]
    attn_in = seen.get(("attn_in", layer))
    attn_norm = next((n for n in norms if _same(seen.get(("out", id(n))), attn_in)), None)
    if attn_norm is None or not _same(seen.get(("in", id(attn_norm))), seen.get(("block_in", layer))):
        raise ValueError(
            f"model: layer {layer}'s attention does not read the residual stream through a norm of its block "
            "(a pre-norm block is needed to trace paths)"
        )
    mlp = None
    mlp_norm = None
    name = f"layers.{layer}.mlp.in"
    if name in target.points:
        mlp = target.points[name].module
        mlp_in = seen.get(("mlp_in", layer))
        mlp_norm = next((n for n in norms if n is not attn_norm and _same(seen.get(("out", id(n))), mlp_in)), None)
        if mlp_norm is None:
            raise ValueError(f"model: layer {layer}'s MLP does not read the residual stream through a norm")
    attn_out = seen.get(("attn_out", layer))
    mlp_out = seen.get(("mlp_out", layer))
    attn_post = next((n for n in norms if _same(seen.get(("in", id(n))), attn_out)), None)
    mlp_post = None
    if mlp is not None:
        mlp_post = next((n for n in norms if n is not attn_post and _same(seen.get(("in", id(n))), mlp_out)), None)
    post_gain = None
    if attn_post is not None:
        x, y = seen[("in", id(attn_post))], seen[("out", id(attn_post))]
        try:
            post_gain = _rms_gain(attn_post, x.shape[-1], x)
            ok = _same(x * _rms_scale(*post_gain, x), y)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"model: layer {layer} normalises its attention's write with a {type(attn_post).__name__} that is "
                f"not an RMS norm x·g/rms(x) (the {target.family}); the heads' writes cannot be separated"
            )
    return LayerWiring(
        attn_norm, _sides(attention, H), _heads_out(attention, H), mlp, mlp_norm, attn_post, mlp_post, post_gain
    )


def wiring(model) -> Wiring:
    """Read ``model``'s residual structure (one recording pass of three tokens).

    Args:
        model: a :class:`HeadModel` or anything :func:`headwise.patching.as_target` accepts (a decoder with a
            language-model head).
    Raises:
        ValueError: a structure this tracing does not read (named: the layer and what is missing).
    """
    from headwise.patching import as_target

    target = as_target(model)
    if target.kind != "decoder":
        raise ValueError(f"model: circuits trace decoders; the {target.family} is an {target.kind}")
    seen: dict = {}
    handles = []

    def pre(key, _m, args, kwargs):
        seen[key] = _first_tensor(args, kwargs)

    def post(key, _m, _args, output):
        seen[key] = _out(output)

    try:
        for layer, attention in enumerate(target.attention_modules):
            if f"layers.{layer}.resid_pre" not in target.points:
                raise ValueError(f"model: attention layer {layer} is not in a residual block of its own")
            block = target.points[f"layers.{layer}.resid_pre"].module
            handles.append(block.register_forward_pre_hook(partial(pre, ("block_in", layer)), with_kwargs=True))
            handles.append(attention.register_forward_pre_hook(partial(pre, ("attn_in", layer)), with_kwargs=True))
            handles.append(attention.register_forward_hook(partial(post, ("attn_out", layer))))
            for child in block.children():
                handles.append(child.register_forward_pre_hook(partial(pre, ("in", id(child))), with_kwargs=True))
                handles.append(child.register_forward_hook(partial(post, ("out", id(child)))))
            name = f"layers.{layer}.mlp.in"
            if name in target.points:
                mlp = target.points[name].module
                handles.append(mlp.register_forward_pre_hook(partial(pre, ("mlp_in", layer)), with_kwargs=True))
                handles.append(mlp.register_forward_hook(partial(post, ("mlp_out", layer))))
        with torch.no_grad():
            target.logits(torch.zeros((1, 3), dtype=torch.long, device=target.device))
    finally:
        for h in handles:
            h.remove()
    return Wiring(target, [_find_layer(target, layer, seen) for layer in range(target.num_layers)])
