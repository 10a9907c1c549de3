"""Brute-force references for the circuit tests, written without headwise's tracing: each model's parts named by
hand (transformers' eager Llama, GPT-2 and Gemma 2, headwise's own decoder stack), a sender's change measured by Wang et
al.'s frozen run (every other head and MLP held at the base run's output), and a receiver's input edited by hand
(a forward hook on the projection that recomputes the chosen head's or group's columns from the edited residual,
or a pre-hook adding to a norm's input)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from _patching_models import Stack


@dataclass
class Anatomy:
    layers: list
    attn_norm: list  # per layer
    qkv: list  # per layer: {"q": (module, offset), "k": …, "v": …}
    head_dim: int
    o_proj: list
    mlp: list
    mlp_norm: list
    final_norm: nn.Module
    heads: int
    kv: int


def anatomy(model: nn.Module) -> Anatomy:
    if isinstance(model, Stack):
        layers = list(model.layers)
        a0 = layers[0].self_attn
        return Anatomy(
            layers,
            [b.norm1 for b in layers],
            [{"q": (b.self_attn.Wq, 0), "k": (b.self_attn.Wk, 0), "v": (b.self_attn.Wv, 0)} for b in layers],
            a0.head_dim,
            [b.self_attn.Wo for b in layers],
            [b.ff for b in layers],
            [b.norm3 for b in layers],
            model.norm,
            a0.num_heads,
            a0.num_kv_heads,
        )
    cfg = model.config
    if cfg.model_type == "gpt2":
        layers = list(model.transformer.h)
        D = cfg.n_embd
        return Anatomy(
            layers,
            [b.ln_1 for b in layers],
            [{"q": (b.attn.c_attn, 0), "k": (b.attn.c_attn, D), "v": (b.attn.c_attn, 2 * D)} for b in layers],
            D // cfg.n_head,
            [b.attn.c_proj for b in layers],
            [b.mlp for b in layers],
            [b.ln_2 for b in layers],
            model.transformer.ln_f,
            cfg.n_head,
            cfg.n_head,
        )
    layers = list(model.model.layers)
    Dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return Anatomy(
        layers,
        [b.input_layernorm for b in layers],
        [{"q": (b.self_attn.q_proj, 0), "k": (b.self_attn.k_proj, 0), "v": (b.self_attn.v_proj, 0)} for b in layers],
        Dh,
        [b.self_attn.o_proj for b in layers],
        [b.mlp for b in layers],
        [getattr(b, "pre_feedforward_layernorm", None) or b.post_attention_layernorm for b in layers],
        model.model.norm,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
    )


def logits(model, ids):
    return model(ids) if isinstance(model, Stack) else model(input_ids=ids, use_cache=False).logits


class _Hooks:
    def __init__(self):
        self.handles = []

    def pre(self, module, fn):
        self.handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))

    def post(self, module, fn):
        self.handles.append(module.register_forward_hook(fn))

    def close(self):
        for h in self.handles:
            h.remove()


def _first(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _replace_first(args, kwargs, x):
    if args:
        return (x, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": x}


def record(model, ids):
    """One run: each layer's o_proj input ``z``, MLP output, block-0 input, and the residual each norm reads."""
    an = anatomy(model)
    rec: dict = {}
    hk = _Hooks()

    def keep(key, _m, args, kwargs):
        rec[key] = _first(args, kwargs).detach().clone()

    def keep_out(key, _m, _args, out):
        rec[key] = (out[0] if isinstance(out, tuple) else out).detach().clone()

    for i in range(len(an.layers)):
        hk.pre(an.o_proj[i], functools.partial(keep, ("z", i)))
        hk.post(an.mlp[i], functools.partial(keep_out, ("mlp", i)))
        hk.pre(an.attn_norm[i], functools.partial(keep, ("attn_in", i)))
        hk.pre(an.mlp_norm[i], functools.partial(keep, ("mlp_in", i)))
    hk.pre(an.layers[0], functools.partial(keep, "embed"))
    hk.pre(an.final_norm, functools.partial(keep, "final_in"))
    try:
        with torch.no_grad():
            rec["logits"] = logits(model, ids).detach()
    finally:
        hk.close()
    return rec


def frozen_change(model, base_ids, source_ids, senders):
    """Wang et al.'s second run: the base input with every head and MLP frozen at the base run's output except the
    senders (taken from the source run); returns each norm's input minus the base run's: ``{key: Δ (P, L, D)}``."""
    an = anatomy(model)
    base, source = record(model, base_ids), record(model, source_ids)
    Dv = base[("z", 0)].shape[-1] // an.heads
    hk = _Hooks()
    got: dict = {}

    def fix_z(i, _m, args, kwargs):
        z = base[("z", i)].clone()
        for s in senders:
            if s.startswith(f"L{i}.H"):
                h = int(s.split(".H")[1])
                z[..., h * Dv : (h + 1) * Dv] = source[("z", i)][..., h * Dv : (h + 1) * Dv]
        return (z, *args[1:]), kwargs

    def fix_mlp(i, _m, _args, out):
        return (source if f"L{i}.MLP" in senders else base)[("mlp", i)]

    def fix_embed(_m, args, kwargs):
        return _replace_first(args, kwargs, source["embed"]) if "embed" in senders else None

    def keep(key, _m, args, kwargs):
        got[key] = _first(args, kwargs).detach().clone()

    for i in range(len(an.layers)):
        hk.pre(an.o_proj[i], functools.partial(fix_z, i))
        hk.post(an.mlp[i], functools.partial(fix_mlp, i))
        hk.pre(an.attn_norm[i], functools.partial(keep, ("attn_in", i)))
        hk.pre(an.mlp_norm[i], functools.partial(keep, ("mlp_in", i)))
    hk.pre(an.layers[0], fix_embed)
    hk.pre(an.final_norm, functools.partial(keep, "final_in"))
    try:
        with torch.no_grad():
            logits(model, base_ids)
    finally:
        hk.close()
    return {k: got[k] - base[k] for k in got}


def edited_logits(model, ids, edits, *, grad=False):
    """Logits of ``ids`` with receivers' inputs edited by hand: ``edits`` = ``[(receiver, Δ (P, L, D))]`` with
    receiver ``("q"|"k"|"v", layer, index)``, ``("mlp", layer)`` or ``("logits",)``."""
    an = anatomy(model)
    hk = _Hooks()
    resid: dict = {}
    inside = [False]

    def keep(i, _m, args, kwargs):
        if not inside[0]:
            resid[i] = _first(args, kwargs)

    def add(delta, _m, args, kwargs):
        x = _first(args, kwargs)
        return _replace_first(args, kwargs, x + delta)

    def recompute(i, side, index, delta, module, args, out):
        proj, offset = an.qkv[i][side]
        inside[0] = True
        try:
            x_new = an.attn_norm[i](resid[i] + delta)  # (P, L, D)
        finally:
            inside[0] = False
        hook_free = proj.forward(x_new)  # the projection itself, its hooks not run
        cols = slice(offset + index * an.head_dim, offset + (index + 1) * an.head_dim)
        y = out.clone()
        y[..., cols] = hook_free[..., cols]
        return y

    for i in range(len(an.layers)):
        hk.pre(an.attn_norm[i], functools.partial(keep, i))
    for receiver, delta in edits:
        if receiver[0] in ("q", "k", "v"):
            side, i, index = receiver
            hk.post(an.qkv[i][side][0], functools.partial(recompute, i, side, index, delta))
        elif receiver[0] == "mlp":
            hk.pre(an.mlp_norm[receiver[1]], functools.partial(add, delta))
        else:
            hk.pre(an.final_norm, functools.partial(add, delta))
    try:
        with torch.set_grad_enabled(grad):
            return logits(model, ids)
    finally:
        hk.close()


def reading_point(receiver) -> object:
    """The key of :func:`frozen_change` where ``receiver`` reads."""
    if receiver[0] in ("q", "k", "v"):
        return ("attn_in", receiver[1])
    if receiver[0] == "mlp":
        return ("mlp_in", receiver[1])
    return "final_in"


def receiver_tuple(spec: str):
    """``"L1.H2.q"`` -> ``("q", 1, 2)``; ``"L1.KV0.k"`` -> ``("k", 1, 0)``; ``"L1.MLP"`` -> ``("mlp", 1)``."""
    if spec == "logits":
        return ("logits",)
    if spec.endswith(".MLP"):
        return ("mlp", int(spec[1:].split(".")[0]))
    node, side = spec.rsplit(".", 1)
    layer, unit = node[1:].split(".")
    return (side, int(layer), int(unit.lstrip("HKV")))


class EagerParts:
    """Hand-written pieces of a tiny eager Llama or GPT-2 (transformers' modules, no headwise code)."""

    def __init__(self, model):
        self.model = model
        cfg = model.config
        self.gpt2 = cfg.model_type == "gpt2"
        if self.gpt2:
            self.blocks = list(model.transformer.h)
            self.H = self.Hkv = cfg.n_head
            self.D = cfg.n_embd
        else:
            self.blocks = list(model.model.layers)
            self.H, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
            self.D = cfg.hidden_size
        self.Dh = self.D // self.H

    def sides(self, layer: int, r):
        """``r (P, L, D)`` the block's input -> post-rotary ``q (P, H, L, Dh)``, ``k, v (P, Hkv, L, Dh)``."""
        P, L, _ = r.shape
        b = self.blocks[layer]
        if self.gpt2:
            q, k, v = b.attn.c_attn(b.ln_1(r)).split(self.D, -1)
        else:
            x = b.input_layernorm(r)
            q, k, v = b.self_attn.q_proj(x), b.self_attn.k_proj(x), b.self_attn.v_proj(x)
        q = q.view(P, L, self.H, self.Dh).transpose(1, 2)
        k = k.view(P, L, self.Hkv, self.Dh).transpose(1, 2)
        v = v.view(P, L, self.Hkv, self.Dh).transpose(1, 2)
        if not self.gpt2:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            cos, sin = self.model.model.rotary_emb(r, torch.arange(L)[None])
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def pattern(self, q, k):
        """``softmax(q k^T / sqrt(Dh))`` under the causal mask: ``(P, H, L, L)``."""
        k = k.repeat_interleave(self.H // self.Hkv, 1)
        s = q @ k.transpose(-1, -2) / self.Dh**0.5
        L = s.shape[-1]
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        return s.softmax(-1)

    def o_proj(self, layer: int):
        b = self.blocks[layer]
        return b.attn.c_proj if self.gpt2 else b.self_attn.o_proj

    def derivative(self, ids, layer: int, dz, metric):
        """``d/dε metric`` with ``ε · dz (P, H, L, Dh)`` added to layer's heads' outputs (the o_proj input)."""
        eps = torch.zeros(ids.shape[0], 1, 1, requires_grad=True)
        P, H, L, Dh = dz.shape

        def add(_m, args):
            return (args[0] + eps * dz.transpose(1, 2).reshape(P, L, H * Dh),)

        handle = self.o_proj(layer).register_forward_pre_hook(add)
        try:
            with torch.enable_grad():
                out = self.model(input_ids=ids, use_cache=False).logits
                (g,) = torch.autograd.grad(metric(out).sum(), eps)
        finally:
            handle.remove()
        return g.reshape(-1)  # (P,)
