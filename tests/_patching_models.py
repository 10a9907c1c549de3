"""Tiny models for the patching tests: Hugging Face families on headwise's backend (with an eager twin of the
same weights for the brute-force references), a stack of headwise's own decoder layers, and the brute-force
reference of patching: a forward pre-hook that edits the output projection's input."""

from __future__ import annotations

import functools

import torch
from torch import nn

import headwise.hf  # noqa: F401  (registers "headwise")
from _hf_models import VOCAB, build
from headwise.core.layers import DecoderLayer
from headwise.positional.rope import RotaryEmbedding


@functools.cache
def hf_model(case: str, attn: str = "headwise", dtype: torch.dtype = torch.float32):
    """A cached tiny random model; ``attn="eager"`` gives the same weights on transformers' own attention."""
    return build(case, attn=attn).to(dtype)


class Stack(nn.Module):
    """Embedding, headwise ``DecoderLayer`` s (RoPE), final norm, unembedding with a bias: ``ids -> logits``."""

    def __init__(
        self,
        *,
        layers=3,
        d_model=32,
        heads=4,
        d_ff=48,
        last_attention_only=False,
        final_norm=True,
        norm_first=True,
        seed=0,
    ):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, d_model)
        self.layers = nn.ModuleList(
            DecoderLayer(
                d_model,
                heads,
                None if (last_attention_only and i == layers - 1) else d_ff,
                activation="gelu",
                norm_first=norm_first,
                positional=RotaryEmbedding(d_model // heads),
            )
            for i in range(layers)
        )
        self.norm = nn.LayerNorm(d_model) if final_norm else nn.Identity()
        self.unembed = nn.Linear(d_model, VOCAB)
        with torch.no_grad():  # sharp attention, norms away from 1
            for name, p in self.named_parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.3)
                else:
                    p.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
        self.eval()

    def forward(self, ids):
        x = self.embed(ids)  # (B, L, D)
        for layer in self.layers:
            x = layer(x)  # (B, L, D)
        return self.unembed(self.norm(x))  # (B, L, V)


def pair(P: int = 2, L: int = 9, where: int = 3, seed: int = 1):
    """``(clean, corrupted)`` ids ``(P, L)`` that differ at position ``where`` only."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, VOCAB, (P, L), generator=g)
    corrupted = clean.clone()
    corrupted[:, where] = (clean[:, where] + 1 + torch.randint(0, VOCAB - 4, (P,), generator=g)) % (VOCAB - 3) + 3
    assert (corrupted[:, where] != clean[:, where]).all()
    return clean, corrupted


def out_proj(attention: nn.Module) -> nn.Module:
    for name in ("o_proj", "c_proj", "Wo"):
        if hasattr(attention, name):
            return getattr(attention, name)
    raise AssertionError(type(attention).__name__)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    if isinstance(model, Stack):
        return [layer.self_attn for layer in model.layers]
    return headwise.hf.attention_layers(model)


def logits_of(model: nn.Module, ids):
    out = model(ids) if isinstance(model, Stack) else model(input_ids=ids, use_cache=False).logits
    return out.detach()


def brute_force(model: nn.Module, base, source, patches):
    """Logits of ``base`` with ``patches`` = ``[(layer, head, positions or None)]`` taken from ``source``'s run,
    by editing each output projection's input ``(B, L, H·Dv)`` in a forward pre-hook (no hook point used)."""
    modules = attention_modules(model)
    projs = [out_proj(m) for m in modules]
    heads = [m.num_heads if isinstance(model, Stack) else headwise.hf.num_heads(m) for m in modules]
    seen = {}

    def keep(layer, _module, args):
        seen[layer] = args[0].detach().clone()

    handles = [p.register_forward_pre_hook(functools.partial(keep, i)) for i, p in enumerate(projs)]
    with torch.no_grad():
        logits_of(model, source)
    for h in handles:
        h.remove()

    def edit(layer, _module, args):
        x = args[0].clone()  # (B, L, H·Dv)
        Dv = x.shape[-1] // heads[layer]
        for lay, head, positions in patches:
            if lay != layer:
                continue
            cols = slice(head * Dv, (head + 1) * Dv)
            rows = slice(None) if positions is None else list(positions)
            x[:, rows, cols] = seen[layer][:, rows, cols]
        return (x, *args[1:])

    handles = [p.register_forward_pre_hook(functools.partial(edit, i)) for i, p in enumerate(projs)]
    try:
        with torch.no_grad():
            return logits_of(model, base)
    finally:
        for h in handles:
            h.remove()
