"""Every head's ablation effect estimated at once, attention-aware (AtP* at the node level, Kramár et al. 2024).

Shape legend: N rows, L length, D model width, NL layers, H query heads, Hkv key/value groups, Dh head width.

Removing head h of layer l (its output ``z_h`` replaced by 0, or by its mean over the batch's real positions)
changes its write to the residual stream by ``Δw_h``; attribution patching estimates the metric's change to
first order, ``∂m/∂z_h · Δz_h`` — one forward and one backward pass for every head. Where a later head's
attention is saturated, that linearisation through its softmax misses what the write does to its queries and
keys. So, as :mod:`headwise.circuits.atp` does for edges, the change of every later layer's patterns is computed
exactly for ``Δw_h`` in its queries and keys at once and linearised only after the pattern::

    est(h) = ∂m/∂z_h · Δz_h                                              (attribution patching)
           − Σ_{l' > l} Δw_h^lin · ∂m/∂r_{l'}|_{q,k}                     (its linear part through later queries/keys)
           + Σ_{l' > l} Σ_{h'} ∂m/∂A_{h'} · (A_{h'}(q', k') − A_{h'})    (the same, the patterns recomputed exactly)

with ``∂m/∂r_{l'}|_{q,k}`` the gradient of the metric with respect to layer l''s input through its query and key
projections alone, and ``Δw_h^lin`` the write's change to first order (the exact one without a norm on the
attention's write). ``attention_aware=False`` keeps the first line (plain attribution patching). The sum is over
the rows: a metric summed over a sample's batches gives the sample's estimate.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from headwise.checks import one_of
from headwise.circuits.atp import AttentionTaps, LowRank
from headwise.circuits.wiring import Wiring, wiring
from headwise.models.anatomy import LayerAnatomy
from headwise.patching.metric import reads_last_position
from headwise.points import attention_point, layer_point

__all__ = ["HEAD_MODES", "head_ablation_estimates"]

HEAD_MODES = ("zero", "mean")


def head_ablation_estimates(
    model,
    ids: Tensor,
    metric,
    *,
    mode: str = "zero",
    real: Tensor | None = None,
    attention_aware: bool = True,
    gate_gradients: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """``(NL, H)``: for every head, the estimated change of ``metric(logits).sum()`` when that head alone is
    removed (see the module docstring).

    Args:
        model: a decoder :class:`~headwise.models.HeadModel` (anything :func:`~headwise.circuits.wiring` reads) or
            its :class:`~headwise.circuits.Wiring`.
        ids: token ids ``(N, L)`` (right padding, for a causal model: the padding changes no real position).
        metric: ``fn(logits (N, L or 1, V)) -> (N,)``, differentiable (e.g. each row's summed next-token loss).
        mode: ``"zero"`` (the head's output replaced by 0) or ``"mean"`` (by its mean over the real positions of
            every row, as :func:`headwise.replacement.replace_heads` does).
        real: bool ``(N, L)``, the real (non-padding) positions for ``"mean"`` (None: every position).
        attention_aware: recompute the later layers' patterns exactly (AtP*'s QK fix); False: attribution
            patching alone.
        gate_gradients: also return, from the same backward pass, each row's ``∂metric_n/∂ξ_h`` ``(N, NL, H)``
            for a gate ξ_h multiplying head h's output (Michel et al. 2019's per-example gradient: ``Σ ∂m/∂z_h · z_h``).
    Returns:
        ``(NL, H)`` float32 estimates of ``Σ_rows metric(head removed) − metric``; with ``gate_gradients``, the
        pair ``(estimates, gate gradients (N, NL, H))``.
    Raises:
        ValueError: an unknown mode; the anatomy's sentence for a structure headwise does not read.
    """
    one_of("mode", mode, HEAD_MODES)
    w = model if isinstance(model, Wiring) else wiring(model)
    tgt = w.target
    ids = ids.to(tgt.device)
    taps = AttentionTaps(w)
    NL = len(w.layers)
    grads: dict = {}
    outputs: dict = {}
    zero = torch.zeros((), dtype=w.weights(0, "q")[0].dtype, device=ids.device, requires_grad=True)
    # a zero added to every head's output first: its gradient reaches the taps whatever requires a gradient
    hooks = [(layer_point(layer, "attn.heads"), partial(_plus, zero)) for layer in range(NL)]
    hooks += taps.hooks()
    for layer, lw in enumerate(w.layers):
        if attention_aware:
            for side in ("q", "k"):
                hooks.append((attention_point(layer, side), partial(_tap, zero, grads, (layer, side))))
        if lw.attn_post is not None:
            hooks.append((layer_point(layer, "attn.out"), partial(_keep, outputs, layer)))
    with torch.enable_grad(), tgt.hooks(hooks):
        logits = tgt.logits(ids, last_only=reads_last_position(metric))
        value = metric(logits)
        torch.autograd.grad(value.sum(), [zero], allow_unused=True)
    out = torch.zeros(NL, max(lw.num_heads for lw in w.layers))
    gates = torch.zeros(ids.shape[0], *out.shape)  # (N, NL, H)
    changes = []  # per layer: Δw (N, H, L, D) exact and Δw_lin (N, H, L, D), or its factors (LowRank) alone
    for layer, lw in enumerate(w.layers):
        rec = taps.records[layer]
        z, gz = rec.z.float(), rec.gz
        dz = _head_change(z, mode, real)  # (N, H, L, Dv)
        if gz is not None:
            out[layer, : lw.num_heads] = (gz.float() * dz).sum((0, 2, 3))
            if gate_gradients:
                gates[:, layer, : lw.num_heads] = (gz.float() * z).sum((2, 3)).cpu()
        if attention_aware and layer < NL - 1:
            if lw.attn_post is None and tgt.stream is None:  # layer by layer: W_O not held for the factors
                # factors alone: every layer's dense (N, H, L, D) writes held to the part's end had added 0.16 GB to
                # SmolLM2's estimate peak (1.87 GB, now 1.71 GB)
                changes.append((None, None, LowRank(dz, lw.heads_out().float() * lw.scale)))
                continue
            with tgt.holding(layer):  # W_O and a norm on the write (a model opened layer by layer: this layer's)
                exact, lin = _write_change(lw, dz, outputs.get(layer))
            changes.append((exact, lin, None))
    if not attention_aware:
        return (out, gates) if gate_gradients else out
    with torch.no_grad():
        _correct(w, taps, grads, changes, out)
    return (out, gates) if gate_gradients else out


def _correct(w: Wiring, taps: AttentionTaps, grads: dict, changes: list, out: Tensor) -> None:
    """Add, for every later layer, each head's exact pattern terms minus its linear terms through that layer's
    queries and keys to ``out (NL, H)``. The heads of layers without a norm on their write go in as factors (their
    output change times their rows of ``W_O``, :class:`~headwise.circuits.atp.LowRank`), the others as writes."""
    for later in range(1, len(w.layers)):
        with w.target.holding(later):  # the layer's weights in (a model opened layer by layer)
            _correct_at(w, taps, grads, changes, out, later)


def _correct_at(w: Wiring, taps: AttentionTaps, grads: dict, changes: list, out: Tensor, later: int) -> None:
    """:func:`_correct` at layer ``later``."""
    lp = taps.layer(later)
    g_qk = _qk_gradient(w, later, lp.rec.r, grads)  # (N, L, D)
    factored = [layer for layer in range(later) if changes[layer][2] is not None]
    dense = [layer for layer in range(later) if changes[layer][2] is None]
    for layers, pieces in (
        (factored, [changes[layer][2] for layer in factored]),
        (dense, [changes[layer][0] for layer in dense]),
    ):
        if not layers:
            continue
        if pieces and isinstance(pieces[0], LowRank):
            given = LowRank(torch.cat([p.coef for p in pieces], 1), torch.cat([p.basis for p in pieces], 0))
        else:
            given = torch.cat(pieces, 1).to(lp.rec.r.dtype)
        pattern = lp.scores(given, queries=False, keys=False, both=True)["qk"].sum((0, 2))  # (Σ H,)
        start = 0
        for layer in layers:
            _, lin, factors = changes[layer]
            if factors is not None:  # Σ Δz_h (W_O[h] g)^T: the write's change is exact and linear alike here
                coef = factors.coef
                H = coef.shape[1]
                proj = torch.einsum("nld,hvd->nhlv", g_qk.to(coef.dtype), factors.basis.to(coef.dtype))
                linear = (coef * proj).sum((0, 2, 3))
            else:
                H = lin.shape[1]
                linear = torch.einsum("nhld,nld->h", lin, g_qk.to(lin.dtype))
            out[layer, :H] += (pattern[start : start + H] - linear).float().cpu()
            start += H


def _plus(zero: Tensor, t: Tensor) -> Tensor:
    return t + zero.to(t.dtype)


def _tap(zero: Tensor, grads: dict, key, t: Tensor) -> Tensor:
    y = t + zero.to(t.dtype)
    y.register_hook(partial(_keep_grad, grads, key))
    return y


def _keep_grad(grads: dict, key, g: Tensor) -> None:
    grads[key] = g.detach()


def _keep(outputs: dict, layer: int, o: Tensor) -> None:
    outputs[layer] = o.detach()


def _head_change(z: Tensor, mode: str, real: Tensor | None) -> Tensor:
    """``Δz (N, H, L, Dv)``: each head's output replaced (zero, or its mean over the real positions) minus it."""
    if mode == "zero":
        return -z
    N, H, L, _ = z.shape
    wt = torch.ones(N, L, dtype=z.dtype, device=z.device) if real is None else real.to(z.device, z.dtype)
    count = wt.sum()
    if float(count) == 0:
        raise ValueError("real: mean ablation found no real (non-padding) position in the batch")
    mean = (z * wt[:, None, :, None]).sum((0, 2), keepdim=True) / count  # (1, H, 1, Dv)
    return mean - z


def _write_change(lw: LayerAnatomy, dz: Tensor, o: Tensor | None) -> tuple[Tensor, Tensor]:
    """Each head's write change alone ``(N, H, L, D)``: exact, and to first order (they differ only under a norm on
    the attention's write, with the layer's other heads at the clean run)."""
    heads = lw.head_writes(dz)  # (N, H, L, D): Δo_h
    if lw.attn_post is None:
        change = heads * lw.scale
        return change, change
    o = o.float()[:, None]  # (N, 1, L, D)
    post = lw.attn_post
    with torch.no_grad():
        exact = (_norm_out(post, o + heads) - _norm_out(post, o)) * lw.scale
    primal = o.expand_as(heads).contiguous()  # jvp's dual tensor needs memory of its own (not a broadcast view)
    _, lin = torch.func.jvp(lambda x: _norm_out(post, x), (primal,), (heads,))
    return exact, lin * lw.scale


def _norm_out(norm, x: Tensor) -> Tensor:
    y = norm(x)
    return (y[0] if isinstance(y, (tuple, list)) else y).float()


def _qk_gradient(w: Wiring, layer: int, r: Tensor, grads: dict) -> Tensor:
    """``(N, L, D)``: the metric's gradient with respect to ``layer``'s input through its query and key projections
    alone: ``Σ ∂m/∂y · W`` over both sides' columns, through the input norm's vector–Jacobian product at ``r``."""
    lw = w.layers[layer]
    u = None
    for side in ("q", "k"):
        g = grads.get((layer, side))
        if g is None:
            continue
        part = torch.einsum("nliw,iwd->nld", g.float(), w.weights(layer, side)[0].float())
        u = part if u is None else u + part
    if u is None:
        return torch.zeros_like(r, dtype=torch.float32)
    return lw.attn_norm_vjp(r, u[:, None].to(r.dtype))[:, 0].float()
