"""The q / k / v sides of one attention layer, read from the recording: which projections the names show (separate
:data:`SEPARATE` or fused :data:`FUSED`), the column layout of a fused one (:func:`_layouts`), the QK-norms
(:data:`QK_NORMS`), a factor the module puts on a side, and the rotation by position — each confirmed against the
queries, keys and head outputs the attention used (:func:`read_sides`). One entry per family the rules would miss
goes in the tables below.

Shape legend: L length, S key length, D model width, H query heads, Hkv key/value groups, Dh head width,
Dv value width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headwise.models.anatomy import AnatomyError, Rotation, Side, affine, apply_qk_norm, same
from headwise.models.anatomy_recording import ProbedView, Recording

__all__ = ["FUSED", "QK_NORMS", "SEPARATE", "projection_candidates", "read_sides"]

#: Separate query / key / value projections, by the attention module's child names.
SEPARATE = (("q_proj", "k_proj", "v_proj"), ("Wq", "Wk", "Wv"), ("query", "key", "value"))
#: Fused projections: the child names. Their layout is found by the recording (see :func:`_layouts`).
FUSED = ("c_attn", "qkv_proj", "query_key_value", "Wqkv", "qkv")
#: QK-norms, by the attention module's child names (query side, key side).
QK_NORMS = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"), ("query_layernorm", "key_layernorm"))


def projection_candidates(attention: nn.Module, H: int, width: int | None):
    """``[(kind, modules)]``: the projections the names show (``"separate"``: q, k, v; ``"fused"``: one), whose
    column layouts :func:`read_sides` tries."""
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


def read_sides(hm: ProbedView, layer: int, attention: nn.Module, rec: Recording, qk, pattern, heads) -> dict[str, Side]:
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
    found = projection_candidates(attention, H, None)
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


def _rotation_of(attention: nn.Module, sides: dict, rec: Recording, layer: int, qk) -> Rotation | None:
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
