"""How a model's anatomy is found (:mod:`headwise.models.anatomy` says what it is): the rules read from the module
tree and config — the tables below, one entry per family the rules would miss — then one recording pass on probe
tokens that cannot hide a structure (:func:`probe_ids`) confirms every part with one tolerance
(:func:`headwise.models.anatomy.same`).

Shape legend: L length, D model width, H query heads, Hkv key/value groups, Dh head width.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from headwise.models.anatomy import (
    TOLERANCE,
    Anatomy,
    AnatomyError,
    LayerAnatomy,
    Rotation,
    Side,
    affine,
    apply_qk_norm,
    is_norm,
    same,
)
from headwise.points import OUT_PROJ_NAMES, hidden_argument, layer_point, output_tensor, unembedding
from headwise.structure import child as _child

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "FUSED",
    "LOGIT_SOFTCAPS",
    "QK_NORMS",
    "RESIDUAL_MULTIPLIERS",
    "SEPARATE",
    "input_embedding",
    "probe_ids",
    "read_anatomy",
]

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
_PROBE_LENGTH = 7


# -- finding it --------------------------------------------------------------------------------------------------


def _first_tensor(args, kwargs) -> Tensor | None:
    """The hidden state (:func:`headwise.points.hidden_argument`), else the first floating-point argument."""
    x = hidden_argument(args, kwargs)
    if x is not None:
        return x
    return next((v for v in (*args, *kwargs.values()) if isinstance(v, Tensor) and v.is_floating_point()), None)


_out = output_tensor


def probe_ids(hm: HeadModel, length: int = _PROBE_LENGTH) -> Tensor:
    """``(1, length)`` token ids that cannot hide a structure: distinct, none special (the model's special ids,
    its config's pad / bos / eos ids), none whose embedding row is zero; drawn with a fixed seed."""
    emb = input_embedding(hm.model)
    out = unembedding(hm.model)
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
    order = [i for i in order if i not in avoid]
    chosen = []
    for k in range(0, len(order), 4 * length):  # candidates' rows read a few at a time (opened layer by layer too)
        part = order[k : k + 4 * length]
        nonzero = _nonzero_rows(hm, emb, part) if emb is not None else [True] * len(part)
        chosen += [i for i, keep in zip(part, nonzero) if keep][: length - len(chosen)]
        if len(chosen) == length:
            break
    if len(chosen) < 2:
        raise AnatomyError(hm.family, f"fewer than 2 of its {V} token ids are neither special nor zero-embedded")
    return torch.tensor([chosen], dtype=torch.long, device=hm.device)


def _nonzero_rows(hm: HeadModel, emb: nn.Module, ids: list[int]) -> list[bool]:
    """Whether each of the embedding's rows ``ids`` has a nonzero entry; ids past its rows count as nonzero. A
    weight on the meta device (a model opened layer by layer) is read through ``hm.stream``, those rows alone."""
    inside = sorted(i for i in ids if i < emb.weight.shape[0])
    if emb.weight.device.type == "meta":
        rows = hm.stream.weight_rows(emb, torch.tensor(inside, dtype=torch.long))  # (n, D)
    else:
        rows = emb.weight.detach()[torch.tensor(inside, dtype=torch.long, device=emb.weight.device)]
    found = dict(zip(inside, rows.ne(0).any(-1).tolist()))
    return [found.get(i, True) for i in ids]


def input_embedding(model: nn.Module) -> nn.Module | None:
    """A model's token embedding (``get_input_embeddings()``, or a child named as embeddings are), or None."""
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


def _sides(hm: HeadModel, layer: int, attention: nn.Module, rec: _Recording, qk, pattern, heads) -> dict[str, Side]:
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
                    normed = apply_qk_norm(qk_norm, t)
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
                        "(neither headwise's part nor the half or interleaved convention on the (cos, sin) handed to "
                        "the attention)",
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
            t = apply_qk_norm(side.norm, t)[0]
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
        candidates += Rotation.candidates()
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


def _config_value(hm: HeadModel, names) -> float | None:
    config = getattr(hm.model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def read_anatomy(hm: HeadModel) -> Anatomy:
    """Find ``hm``'s anatomy (:func:`_read`); an unexpected error of the structure's own code is refused as the
    anatomy's one sentence (never a KeyError or a shape error)."""
    try:
        return _read(hm)
    except AnatomyError:
        raise
    except (KeyError, IndexError, RuntimeError, TypeError, AttributeError, ValueError) as e:
        raise AnatomyError(hm.family, f"its forward pass did not run as read ({type(e).__name__}: {e})") from e


def _read(hm: HeadModel) -> Anatomy:
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
        name = layer_point(layer, "resid_pre")
        if points.found(name) is None:
            raise AnatomyError(family, f"attention layer {layer} is not in a residual block of its own")
        blocks.append(points.found(name).module)
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
        hooks.append((layer_point(layer, "attn.qk"), lambda rows, layer=layer: qk.__setitem__(layer, rows)))
        hooks.append(
            (layer_point(layer, "attn.pattern"), lambda t, layer=layer: pattern.__setitem__(layer, t.detach()))
        )
        hooks.append((layer_point(layer, "attn.heads"), lambda t, layer=layer: heads.__setitem__(layer, t.detach())))
    embed = input_embedding(hm.model)
    unembed = unembedding(hm.model) if hm.kind == "decoder" else None
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
            mlp = points.found(layer_point(layer, "mlp.in"))
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


def _layer(hm: HeadModel, layer, block, attention, rec: _Recording, qk, pattern, heads, scale: float) -> LayerAnatomy:
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
    mlp_point = hm.points.found(layer_point(layer, "mlp.in"))
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


def _head(hm: HeadModel, rec: _Recording, outside, unembed, logits: Tensor, layers) -> tuple:
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
