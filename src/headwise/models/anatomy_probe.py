"""How a model's anatomy is found (:mod:`headwise.models.anatomy` says what it is), the assembly: one recording pass
on probe tokens that cannot hide a structure (:func:`probe_ids`, :mod:`headwise.models.anatomy_recording`), then
each layer read from it — its input norm, its q / k / v sides (:mod:`headwise.models.anatomy_sides`: separate and
fused projections, QK-norms, the rotation), its output projection, the norms on its writes, its MLP and whether it
runs in parallel, its writes adding up to its change of the residual stream — and the model's end: the final norm
and the unembedding, scaled or soft-capped as the config says (the tables below). Every part is confirmed with one
tolerance (:func:`headwise.models.anatomy.same`).

Shape legend: L length, D model width, H query heads, Hkv key/value groups, Dh head width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from headwise.models.anatomy import TOLERANCE, Anatomy, AnatomyError, LayerAnatomy, affine, is_norm, same
from headwise.models.anatomy_recording import ProbedView, Recording, input_embedding, probe_ids
from headwise.models.anatomy_sides import FUSED, QK_NORMS, SEPARATE, projection_candidates, read_sides
from headwise.points import OUT_PROJ_NAMES, layer_point, unembedding
from headwise.structure import child as _child

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

#: The config attribute that multiplies each block's writes (Granite).
RESIDUAL_MULTIPLIERS = ("residual_multiplier",)
#: Config attributes of a final soft-cap ``c·tanh(x/c)`` on the logits (Gemma 2).
LOGIT_SOFTCAPS = ("final_logit_softcapping",)


def _config_value(hm: ProbedView, names) -> float | None:
    config = getattr(hm.model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def read_anatomy(hm: ProbedView) -> Anatomy:
    """Find ``hm``'s anatomy (:func:`_read`); an unexpected error of the structure's own code is refused as the
    anatomy's one sentence (never a KeyError or a shape error)."""
    try:
        return _read(hm)
    except AnatomyError:
        raise
    except (KeyError, IndexError, RuntimeError, TypeError, AttributeError, ValueError) as e:
        raise AnatomyError(hm.family, f"its forward pass did not run as read ({type(e).__name__}: {e})") from e


def _read(hm: ProbedView) -> Anatomy:
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
    rec = Recording()
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
            for _kind, mods in projection_candidates(attention, hm.heads_per_layer[layer], None):
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
        with hm.holding(layer):  # a QK-norm is called on the recorded projections: the layer's weights in
            layers.append(_layer(hm, layer, block, attention, rec, qk, pattern, heads, scale))
    final_norm, logit_scale, softcap = None, 1.0, None
    if hm.kind == "decoder":
        final_norm, logit_scale, softcap = _head(hm, rec, outside, unembed, logits, layers)
    return Anatomy(family, layers, embed, final_norm, unembed, logit_scale, softcap)


def _inside(module: nn.Module, blocks: list[nn.Module]) -> bool:
    return any(module is m for b in blocks for m in b.modules())


def _layer(hm: ProbedView, layer, block, attention, rec: Recording, qk, pattern, heads, scale: float) -> LayerAnatomy:
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
    sides = read_sides(hm, layer, attention, rec, qk[layer], pattern[layer], heads[layer])
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


def _head(hm: ProbedView, rec: Recording, outside, unembed, logits: Tensor, layers) -> tuple:
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
