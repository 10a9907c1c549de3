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

How it is found. From the module tree first: the block is the attention module's ancestor in a layer list
(:mod:`headwise.points`), norms are the block's children that normalise, the projections carry one of the names of
:data:`SEPARATE` or :data:`FUSED`, the output projection one of :data:`headwise.points.OUT_PROJ_NAMES`. Then one
recording pass confirms every part on inputs that cannot hide a structure: several tokens, none of them a special
token or a token whose embedding is zero, no padding. A norm is the one whose input and output are what the
structure says; a fused layout is the candidate whose columns give the queries and keys the attention used (at the
first position, where rotary positions rotate nothing) and the values whose weighted sum is each head's output;
the block's writes must add up to its change of the residual stream; the final logits must be the unembedding of
the final norm (scaled, soft-capped). Every comparison uses one tolerance, :data:`TOLERANCE`.

A structure the rules do not read is refused once, in one sentence (:class:`AnatomyError`, a ValueError:
``model: headwise cannot read the anatomy of this <family> model: <what>``), which every tool repeats. A family the
rules miss gets one entry in one table here (the names, the config attributes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor, nn

from headwise.points import OUT_PROJ_NAMES

__all__ = [
    "TOLERANCE",
    "Anatomy",
    "AnatomyError",
    "LayerAnatomy",
    "Side",
    "affine",
    "is_norm",
    "norm_epsilon",
    "probe_ids",
    "read_anatomy",
    "same",
]

#: Relative tolerance of "these two tensors are the same" (max |a − b| ≤ TOLERANCE · max(1, max |b|)), float32.
TOLERANCE = 1e-4
#: Separate query / key / value projections, by the attention module's child names.
SEPARATE = (("q_proj", "k_proj", "v_proj"), ("Wq", "Wk", "Wv"), ("query", "key", "value"))
#: Fused projections: the child names. Their layout is found by the recording (see :func:`_layouts`).
FUSED = ("c_attn", "qkv_proj", "query_key_value", "Wqkv", "qkv")
#: QK-norms, by the attention module's child names (query side, key side).
QK_NORMS = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"), ("query_layernorm", "key_layernorm"))
#: The config attribute that multiplies each block's writes (Granite).
RESIDUAL_MULTIPLIERS = ("residual_multiplier",)
#: Config attributes of a final soft-cap ``c·tanh(x/c)`` on the logits (Gemma 2).
LOGIT_SOFTCAPS = ("final_logit_softcapping",)
_EPS_NAMES = ("variance_epsilon", "eps", "epsilon", "variance_eps", "layer_norm_eps")
_PROBE_LENGTH = 7


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

    def contiguous(self) -> tuple[int, int] | None:
        """``(start, stop)`` when the columns are one run ``start … stop − 1`` in head order, else None."""
        flat = self.columns.reshape(-1)
        start = int(flat[0])
        if torch.equal(flat, torch.arange(start, start + flat.numel(), device=flat.device)):
            return start, start + flat.numel()
        return None


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

    def out_bias(self) -> Tensor | None:
        """``(D,)`` the output projection's bias, or None."""
        return affine(self.out_proj)[1]


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
    notes: dict = field(default_factory=dict)

    def __getitem__(self, layer: int) -> LayerAnatomy:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers)

    def refuse(self, what: str) -> AnatomyError:
        """The one error for a structure a tool cannot use (raise it)."""
        return AnatomyError(self.family, what)

    @cached_property
    def sequential(self) -> bool:
        return not any(lay.parallel for lay in self.layers)


# -- finding it --------------------------------------------------------------------------------------------------


def _first_tensor(args, kwargs) -> Tensor | None:
    if args and isinstance(args[0], Tensor):
        return args[0]
    x = kwargs.get("hidden_states")
    if isinstance(x, Tensor):
        return x
    return next((v for v in (*args, *kwargs.values()) if isinstance(v, Tensor) and v.is_floating_point()), None)


def _out(output) -> Tensor | None:
    y = output[0] if isinstance(output, (tuple, list)) else output
    return y if isinstance(y, Tensor) else None


def _child(module: nn.Module, names) -> nn.Module | None:
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module):
            return child
    return None


def probe_ids(hm, length: int = _PROBE_LENGTH) -> Tensor:
    """``(1, length)`` token ids that cannot hide a structure: distinct, none special (the model's special ids,
    its config's pad / bos / eos ids), none whose embedding row is zero; drawn with a fixed seed."""
    emb = _embedding(hm.model)
    out = _unembedding(hm.model)
    V = hm.vocab_size or (emb.weight.shape[0] if isinstance(getattr(emb, "weight", None), Tensor) else 0)
    if not V and isinstance(getattr(out, "weight", None), Tensor):
        V = out.weight.shape[0]
    avoid = set(hm.special_ids)
    config = getattr(hm.model, "config", None)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id"):
        value = getattr(config, name, None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int):
                avoid.add(v)
    if hm.bos_id is not None:
        avoid.add(int(hm.bos_id))
    order = torch.randperm(V, generator=torch.Generator().manual_seed(0)).tolist() if V else []
    chosen = []
    for i in order:
        if i in avoid:
            continue
        if emb is not None and i < emb.weight.shape[0] and not bool(emb.weight[i].detach().any()):
            continue
        chosen.append(i)
        if len(chosen) == length:
            break
    if len(chosen) < 2:
        raise AnatomyError(hm.family, f"fewer than 2 of its {V} token ids are neither special nor zero-embedded")
    return torch.tensor([chosen], dtype=torch.long, device=hm.device)


def _embedding(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
        except (NotImplementedError, AttributeError):
            emb = None
        if isinstance(emb, nn.Module):
            return emb
    for name in ("embed", "tok_emb", "token_embedding", "embeddings"):
        emb = getattr(model, name, None)
        if isinstance(emb, nn.Embedding):
            return emb
        inner = getattr(emb, "token", None) or getattr(emb, "word_embeddings", None)
        if isinstance(inner, nn.Embedding):
            return inner
    return None


def _unembedding(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    if callable(get):
        try:
            out = get()
        except (NotImplementedError, AttributeError):
            out = None
        if isinstance(out, nn.Module):
            return out
    return _child(model, ("unembed", "lm_head"))


class _Recording:
    """Inputs and outputs of chosen modules in one pass: ``inp[key]``, ``out[key]`` (detached)."""

    def __init__(self):
        self.inp: dict = {}
        self.out: dict = {}
        self.handles: list = []

    def watch(self, key, module: nn.Module) -> None:
        def pre(_m, args, kwargs):  # the first call's (a module called twice keeps its first); copies, since a
            if key not in self.inp:  # family may add to an output in place (Falcon: mlp_output += attention_output)
                x = _first_tensor(args, kwargs)
                self.inp[key] = None if x is None else x.detach().clone()

        def post(_m, _args, output):
            if key not in self.out:
                y = _out(output)
                self.out[key] = None if y is None else y.detach().clone()

        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(module.register_forward_hook(post))

    def keep_kwarg(self, key, module: nn.Module, name: str) -> None:
        """Keep ``module``'s keyword argument ``name`` of its first call in ``inp[key]`` (a tuple of copies)."""

        def pre(_m, _args, kwargs):
            value = kwargs.get(name)
            if key not in self.inp and value is not None:
                self.inp[key] = tuple(v.detach().clone() for v in value) if isinstance(value, tuple) else value

        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _candidates(attention: nn.Module, H: int, width: int | None):
    """``[(kind, modules, layouts)]``: the projections the names show, each with the column layouts to try."""
    out = []
    for names in SEPARATE:
        mods = [getattr(attention, n, None) for n in names]
        if all(isinstance(m, nn.Module) and affine(m) is not None for m in mods):
            out.append(("separate", mods))
    for name in FUSED:
        m = getattr(attention, name, None)
        if isinstance(m, nn.Module) and affine(m) is not None:
            out.append(("fused", [m]))
    return out


def _layouts(total: int, H: int, Dh: int) -> list[tuple[str, list[Tensor]]]:
    """Column layouts of a fused q/k/v projection with ``total`` outputs and H query heads of Dh: each
    ``(name, [q (H, Dh), k (Hkv, Dh), v (Hkv, Dh)])``."""
    layouts = []
    kv = total - H * Dh
    if kv <= 0 or kv % (2 * Dh):
        return layouts
    Hkv = kv // (2 * Dh)
    if H % Hkv:
        return layouts
    G = H // Hkv
    ar = torch.arange(total)
    # q | k | v side by side (GPT-2's c_attn, Phi-3's qkv_proj, GPT-BigCode, Falcon multi-query)
    q = ar[: H * Dh].reshape(H, Dh)
    k = ar[H * Dh : H * Dh + Hkv * Dh].reshape(Hkv, Dh)
    v = ar[H * Dh + Hkv * Dh :].reshape(Hkv, Dh)
    layouts.append(("q|k|v", [q, k, v]))
    if Hkv == H:  # interleaved per head: (H, 3, Dh) (GPT-NeoX, Persimmon, Falcon without new layout)
        grid = ar.reshape(H, 3, Dh)
        layouts.append(("(H, 3, Dh)", [grid[:, 0], grid[:, 1], grid[:, 2]]))
    # grouped: (Hkv, G + 2, Dh) (Falcon's new decoder architecture)
    grid = ar.reshape(Hkv, G + 2, Dh)
    layouts.append(("(Hkv, G + 2, Dh)", [grid[:, :G].reshape(H, Dh), grid[:, G], grid[:, G + 1]]))
    return layouts


def _apply_norm(norm: nn.Module, t: Tensor) -> tuple[Tensor, bool] | None:
    """``t (L, n, Dh)`` through a QK-norm, per head or over ``n·Dh``: ``(result, per_head)``; None when neither
    layout runs."""
    weight = getattr(norm, "weight", None)
    wide = weight is not None and weight.numel() == t.shape[1] * t.shape[2] and t.shape[1] > 1 and weight.dim() == 1
    tries = [(False, lambda: norm(t.reshape(t.shape[0], -1)).reshape(t.shape))] if wide else []
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


def _sides(hm, layer: int, attention: nn.Module, rec: _Recording, qk, pattern, heads) -> dict[str, Side]:
    """The q / k / v sides of one layer, the layout confirmed against the queries and keys the attention used (at
    position 0) and each head's output (the weighted values)."""
    family = hm.family
    q_used = qk.q[0, :, 0].double()  # (H, Dh) at position 0
    k_used = qk.k[0, :, 0].double()  # (Hkv, Dh)
    H, Dh = q_used.shape
    Hkv = k_used.shape[0]
    z = heads[0].double()  # (H, L, Dv)
    w = pattern[0].double()  # (H, L, S)
    norms = (None, None)
    for names in QK_NORMS:
        pair = [getattr(attention, n, None) for n in names]
        if all(isinstance(m, nn.Module) for m in pair):
            norms = tuple(pair)
            break
    found = _candidates(attention, H, None)
    if not found:
        raise AnatomyError(
            family,
            f"layer {layer}'s {type(attention).__name__} has no query/key/value projections this reads "
            f"(separate {[n[0] for n in SEPARATE]} …, or fused {list(FUSED)})",
        )
    tried = []
    for kind, mods in found:
        ys = [rec.out.get(("proj", layer, id(m))) for m in mods]
        if any(y is None for y in ys):
            continue
        if kind == "separate":
            widths = [y.shape[-1] for y in ys]
            if widths[0] != H * Dh or widths[1] % Dh or widths[1] // Dh != Hkv or widths[2] % Hkv:
                tried.append(f"{kind} widths {widths}")
                continue
            Dv = widths[2] // Hkv
            options = [
                (
                    "separate",
                    [mods[0], mods[1], mods[2]],
                    [
                        torch.arange(H * Dh).reshape(H, Dh),
                        torch.arange(Hkv * Dh).reshape(Hkv, Dh),
                        torch.arange(Hkv * Dv).reshape(Hkv, Dv),
                    ],
                )
            ]
        else:
            options = [(name, mods * 3, cols) for name, cols in _layouts(ys[0].shape[-1], H, Dh)]
        for name, ms, cols in options:
            got = {}
            ok = True
            for side, m, c, used, qk_norm in zip("qkv", ms, cols, (q_used, k_used, None), (*norms, None)):
                y = rec.out[("proj", layer, id(m))][0]  # (L, out)
                t = y[..., c]  # (L, n, Dh)
                per_head = True
                if qk_norm is not None:
                    normed = _apply_norm(qk_norm, t)
                    if normed is None:
                        ok = False
                        break
                    t, per_head = normed
                scale = 1.0
                if used is not None and not same(t[0].double(), used):
                    t0 = t[0].double()  # a side scaled in the module (OPT: q · Dh^-1/2 before the attention)
                    scale = float((t0 * used).sum() / (t0 * t0).sum().clamp_min(1e-30))
                    if not same(scale * t0, used):
                        ok = False
                        break
                if side == "v":
                    n = t.shape[1]
                    if n == 0 or H % n:
                        ok = False
                        break
                    vv = t.double().permute(1, 0, 2).repeat_interleave(H // n, 0)  # (H, S, Dv)
                    if vv.shape[-1] != z.shape[-1] or not same(w @ vv, z):
                        ok = False
                        break
                got[side] = Side(side, m, c, qk_norm, per_head, scale)
            if ok:
                rotation = _rotation_of(attention, got, rec, layer, qk)
                if rotation is None:
                    raise AnatomyError(
                        family,
                        f"layer {layer} rotates its queries and keys by position in a way this does not read "
                        "(neither headwise's part nor rotate_half / pairs on the (cos, sin) handed to the attention)",
                    )
                got["rotation"] = rotation
                return got
            tried.append(name)
    raise AnatomyError(
        family,
        f"layer {layer}'s query/key/value projections do not give the queries, keys and values its attention used "
        f"in any layout this reads (tried {', '.join(tried) or 'none'})",
    )


def _rotation_of(attention: nn.Module, sides: dict, rec: _Recording, layer: int, qk) -> Rotation | None:
    """The :class:`Rotation` that takes the projected (QK-normed, scaled) queries and keys to those the attention
    used, at every position of the probe; None when no candidate does. A factor seen at position 0 may be the
    rotation's own (YaRN's attention factor on ``cos`` and ``sin``): then the sides' scales are reset to 1."""
    projected = {}
    for name in ("q", "k"):
        side = sides[name]
        t = side.take(rec.out[("proj", layer, id(side.module))][0])  # (L, n, Dh)
        if side.norm is not None:
            t = _apply_norm(side.norm, t)[0]
        projected[name] = t.double().transpose(0, 1)  # (n, L, Dh)
    used = {"q": qk.q[0].double(), "k": qk.k[0].double()}  # (H, L, Dh), (Hkv, S, Dh)
    L = projected["q"].shape[1]
    pos = torch.arange(L, device=projected["q"].device)
    pe = rec.inp.get(("position_embeddings", layer))
    candidates = [Rotation("none")]
    positional = getattr(attention, "positional", None)
    if positional is not None and hasattr(positional, "rotate_qk"):
        candidates.append(Rotation("headwise", positional))
    if pe is not None:
        kinds = ("half", "half-compact", "pairs", "pairs-interleaved")
        candidates += [Rotation(kind) for kind in kinds]
    scalings = [{n: sides[n].scale for n in ("q", "k")}]
    if any(v != 1.0 for v in scalings[0].values()):
        scalings.append({"q": 1.0, "k": 1.0})
    for scales in scalings:
        for rotation in candidates:
            try:
                ok = all(same(rotation(projected[n] * scales[n], pos, pe), used[n][:, :L]) for n in ("q", "k"))
            except (RuntimeError, ValueError, IndexError, TypeError):
                ok = False
            if ok:
                for n in ("q", "k"):
                    sides[n].scale = scales[n]
                return rotation
    return None


def _config_value(hm, names) -> float | None:
    config = getattr(hm.model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def read_anatomy(hm) -> Anatomy:
    """Find ``hm``'s anatomy (see the module docstring): one recording pass of :func:`probe_ids`.

    Args:
        hm: a :class:`~headwise.models.HeadModel` (use ``hm.anatomy``, which keeps the result).
    Raises:
        AnatomyError: a structure the rules do not read, named in one sentence.
    """
    family = hm.family
    points = hm.points
    NL = hm.num_layers
    blocks = []
    for layer in range(NL):
        name = f"layers.{layer}.resid_pre"
        if name not in points:
            raise AnatomyError(family, f"attention layer {layer} is not in a residual block of its own")
        blocks.append(points[name].module)
    from headwise.core.latent import LatentAttention

    for layer, attention in enumerate(hm.attention_modules):
        if isinstance(attention, LatentAttention) or _child(attention, ("kv_a_proj_with_mqa", "Wkv_a")) is not None:
            raise AnatomyError(family, f"layer {layer}'s latent attention has no per-head key/value projections")
    rec = _Recording()
    qk: dict = {}
    pattern: dict = {}
    heads: dict = {}
    hooks = []
    for layer in range(NL):
        hooks.append((f"layers.{layer}.attn.qk", lambda rows, layer=layer: qk.__setitem__(layer, rows)))
        hooks.append((f"layers.{layer}.attn.pattern", lambda t, layer=layer: pattern.__setitem__(layer, t.detach())))
        hooks.append((f"layers.{layer}.attn.heads", lambda t, layer=layer: heads.__setitem__(layer, t.detach())))
    embed = _embedding(hm.model)
    unembed = _unembedding(hm.model) if hm.kind == "decoder" else None
    outside = [m for m in hm.model.modules() if is_norm(m) and not _inside(m, blocks)]
    ids = probe_ids(hm)
    try:
        for layer, (block, attention) in enumerate(zip(blocks, hm.attention_modules)):
            rec.watch(("block", layer), block)
            rec.watch(("attn", layer), attention)
            rec.keep_kwarg(("position_embeddings", layer), attention, "position_embeddings")
            for child in block.children():
                rec.watch(("child", id(child)), child)
            out_proj = _child(attention, OUT_PROJ_NAMES)
            if out_proj is not None:
                rec.watch(("out_proj", layer), out_proj)
            for _kind, mods in _candidates(attention, hm.heads_per_layer[layer], None):
                for m in mods:
                    rec.watch(("proj", layer, id(m)), m)
            mlp = points.get(f"layers.{layer}.mlp.in")
            if mlp is not None:
                rec.watch(("mlp", layer), mlp.module)
        for norm in outside:
            rec.watch(("final", id(norm)), norm)
        if embed is not None:
            rec.watch("embed", embed)
        if unembed is not None:
            rec.watch("unembed", unembed)
        with torch.no_grad(), hm.hooks(hooks):
            logits = hm.logits(ids) if hm.kind == "decoder" else hm.forward(ids)
    finally:
        rec.close()
    layers = []
    scale = _config_value(hm, RESIDUAL_MULTIPLIERS) or 1.0
    for layer, (block, attention) in enumerate(zip(blocks, hm.attention_modules)):
        layers.append(_layer(hm, layer, block, attention, rec, qk, pattern, heads, scale))
    final_norm, logit_scale, softcap = None, 1.0, None
    if hm.kind == "decoder":
        final_norm, logit_scale, softcap = _head(hm, rec, outside, unembed, logits, layers)
    return Anatomy(family, layers, embed, final_norm, unembed, logit_scale, softcap)


def _inside(module: nn.Module, blocks: list[nn.Module]) -> bool:
    return any(module is m for b in blocks for m in b.modules())


def _layer(hm, layer, block, attention, rec: _Recording, qk, pattern, heads, scale: float) -> LayerAnatomy:
    family = hm.family
    if layer not in qk or layer not in heads or layer not in pattern:
        raise AnatomyError(family, f"layer {layer}'s attention did not run its hook points in the forward pass")
    r_in = rec.inp.get(("block", layer))
    r_out = rec.out.get(("block", layer))
    attn_in = rec.inp.get(("attn", layer))
    attn_out = rec.out.get(("attn", layer))
    norms = [c for c in block.children() if is_norm(c) and c is not attention]

    def child_in(m):
        return rec.inp.get(("child", id(m)))

    def child_out(m):
        return rec.out.get(("child", id(m)))

    # the attention's input norm
    if same(attn_in, r_in):
        attn_norm = None
    else:
        attn_norm = next((n for n in norms if same(child_out(n), attn_in) and same(child_in(n), r_in)), None)
        if attn_norm is None:
            raise AnatomyError(
                family, f"layer {layer}'s attention reads neither the residual stream nor a norm of it (pre-norm)"
            )
    sides = _sides(hm, layer, attention, rec, qk[layer], pattern[layer], heads[layer])
    out_proj = _child(attention, OUT_PROJ_NAMES)
    if out_proj is None or affine(out_proj) is None:
        raise AnatomyError(family, f"layer {layer}'s {type(attention).__name__} has no linear output projection")
    z = heads[layer]  # (B, H, L, Dv)
    merged = z.transpose(1, 2).reshape(*z.shape[:1], z.shape[2], -1)  # (B, L, H·Dv)
    if not same(rec.inp.get(("out_proj", layer)), merged):
        raise AnatomyError(family, f"layer {layer}'s output projection does not read the heads side by side")
    if not same(rec.out.get(("out_proj", layer)), attn_out):
        raise AnatomyError(family, f"layer {layer}'s attention output is not its output projection's")
    attn_post = next((n for n in norms if n is not attn_norm and same(child_in(n), attn_out)), None)
    attn_write = child_out(attn_post) if attn_post is not None else attn_out
    mlp_point = hm.points.get(f"layers.{layer}.mlp.in")
    mlp = mlp_point.module if mlp_point is not None else None
    mlp_norm = mlp_post = None
    parallel = False
    total = r_in + scale * attn_write
    if mlp is not None:
        mlp_in, mlp_out = rec.inp.get(("mlp", layer)), rec.out.get(("mlp", layer))
        r_mid = r_in + scale * attn_write
        if same(mlp_in, r_mid):
            pass
        elif same(mlp_in, r_in):
            parallel = True
        else:
            mlp_norm = next(
                (n for n in norms if same(child_out(n), mlp_in) and same(child_in(n), r_mid) and n is not attn_post),
                None,
            )
            if mlp_norm is None:
                mlp_norm = next((n for n in norms if same(child_out(n), mlp_in) and same(child_in(n), r_in)), None)
                parallel = mlp_norm is not None
            if mlp_norm is None:
                raise AnatomyError(family, f"layer {layer}'s MLP reads neither the residual stream nor a norm of it")
        mlp_post = next(
            (n for n in norms if n not in (attn_norm, attn_post, mlp_norm) and same(child_in(n), mlp_out)), None
        )
        mlp_write = child_out(mlp_post) if mlp_post is not None else mlp_out
        total = total + scale * mlp_write
    if not same(total, r_out):
        if any(same(child_out(n), r_out) for n in norms):
            raise AnatomyError(
                family,
                f"layer {layer} normalises the residual stream itself after adding its writes (a post-norm "
                "block); a pre-norm block is needed for its writes to add up",
            )
        raise AnatomyError(
            family,
            f"layer {layer}'s attention and MLP writes do not add up to its change of the residual stream "
            f"({type(block).__name__})",
        )
    return LayerAnatomy(
        layer,
        block,
        attention,
        attn_norm,
        sides["q"],
        sides["k"],
        sides["v"],
        out_proj,
        attn_post,
        mlp,
        mlp_norm,
        mlp_post,
        parallel,
        scale,
        sides["rotation"],
    )


def _head(hm, rec: _Recording, outside, unembed, logits: Tensor, layers) -> tuple:
    family = hm.family
    last = rec.out.get(("block", len(layers) - 1))
    if unembed is None or affine(unembed) is None and getattr(unembed, "weight", None) is None:
        raise AnatomyError(family, "it has no unembedding (a language-model head) this reads")
    u_in, u_out = rec.inp.get("unembed"), rec.out.get("unembed")
    if same(u_in, last):
        final_norm = None
    else:
        final_norm = next(
            (
                n
                for n in outside
                if same(rec.inp.get(("final", id(n))), last) and same(rec.out.get(("final", id(n))), u_in)
            ),
            None,
        )
        if final_norm is None:
            raise AnatomyError(family, "its unembedding reads neither the last block's output nor a norm of it")
    softcap = _config_value(hm, LOGIT_SOFTCAPS)
    logits = logits.detach().double()
    u = u_out.detach().double()
    if u.shape != logits.shape:
        raise AnatomyError(family, "its logits are not the unembedding's output at every position")
    capped = (lambda x: softcap * torch.tanh(x / softcap)) if softcap else (lambda x: x)
    scale = float((logits * u).sum() / (u * u).sum().clamp_min(1e-30)) if not softcap else 1.0
    if not math.isfinite(scale) or not same(capped(scale * u), logits):
        raise AnatomyError(family, "its logits are not a scaled (or soft-capped) unembedding of the final norm")
    scale = 1.0 if abs(scale - 1.0) < TOLERANCE else scale
    return final_norm, scale, softcap
