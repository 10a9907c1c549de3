"""Attribution patching: activation patching's first-order estimate from one forward and one backward pass
(Nanda 2023, "Attribution Patching"; Syed, Rager & Conmy 2023, "Attribution Patching Outperforms Automated
Circuit Discovery").

Shape legend: P prompt pairs, L length, NL attention layers, H query heads, Dh head width.

For the base run (the corrupted input when denoising, the clean one when noising) and the source run's
per-head outputs ``s_h`` (P, H, L, Dh), the metric after patching head h is estimated by its Taylor expansion
at the base run's outputs ``b_h``::

    metric(patched h) ≈ metric(base) + Σ_{t, d} (s_h − b_h)[t, d] · ∂metric/∂b_h[t, d]

with the gradient taken through everything downstream of the head (later layers included). The gradient
comes from a zero tensor added at each layer's ``hook_heads`` (``out + δ``, ∂metric/∂δ = ∂metric/∂out), so
the model's own parameters need no gradient and nothing upstream is cut. Cost: the source run, the base
run (with gradients) and one backward pass, whatever NL·H is. Exact when the metric is affine in the head's
output (a head that reaches the logits only through linear maps); elsewhere it is a linearisation, and
``docs/patching.md`` measures its agreement with exact patching.
"""

from __future__ import annotations

import time
from functools import partial

import torch
from torch import Tensor

from headwise.checks import one_of
from headwise.patching.exact import DIRECTIONS, Metric, Patching, check_pair, run_with_cache
from headwise.patching.metric import reads_last_position
from headwise.patching.target import as_target
from headwise.points import attention_point

__all__ = ["attribution_patch"]


def attribution_activations(hm, pairs: int, length: int) -> int:
    """Bytes of activations :func:`attribution_patch` keeps on ``hm`` for ``pairs`` prompts of ``length`` tokens,
    float32: the source run's heads' outputs and the base run's (about ``(P, L, D)`` a layer each), their gradients,
    and the residual stream at every layer boundary twice (a layer walk's checkpoints and the logits' input) —
    what a model opened layer by layer is weighed by (:func:`headwise.models.layer_walk.check_walk`)."""
    D = hm.width
    return 4 * pairs * length * D * 5 * hm.num_layers


def _add(delta: Tensor, out: Tensor) -> Tensor:
    return out + delta.to(out.dtype)  # (P, H, L, Dh)


def attribution_patch(model, clean, corrupted, metric: Metric, *, direction: str = "denoise") -> Patching:
    """The estimate of :func:`headwise.patching.patch_heads` for every head at once, and per position.

    Args:
        model, clean, corrupted, metric, direction: as :func:`headwise.patching.patch_heads`.
    Returns:
        :class:`~headwise.patching.Patching` with ``method="attribution"``, ``patched (P, NL, H)`` the estimated
        metric and ``per_position (P, NL, H, L)`` each position's share of ``patched − base``.
    """
    t0 = time.perf_counter()
    target = as_target(model)
    one_of("direction", direction, DIRECTIONS)
    if not callable(metric):
        raise TypeError(f"metric: expected a callable logits (N, L, V) -> (N,), got {type(metric).__name__}")
    c, x = check_pair(target, clean, corrupted)
    base, source_ids = (x, c) if direction == "denoise" else (c, x)
    source = run_with_cache(target, source_ids)
    m_source = metric(source.logits).detach().float().cpu()
    P, L = base.shape
    deltas = [
        torch.zeros_like(source.heads[layer], requires_grad=True)  # (P, H, L, Dh)
        for layer in range(target.num_layers)
    ]
    seen: list[Tensor | None] = [None] * target.num_layers

    def keep(layer: int, out: Tensor) -> None:
        seen[layer] = out.detach()

    hooks = []
    for layer in range(target.num_layers):
        hooks.append((attention_point(layer, "heads"), partial(keep, layer)))
        hooks.append((attention_point(layer, "heads"), partial(_add, deltas[layer])))
    with torch.enable_grad(), target.hooks(hooks):
        t1 = time.perf_counter()
        value = metric(target.logits(base, last_only=reads_last_position(metric)))  # (P,)
        forward = time.perf_counter() - t1
        grads = torch.autograd.grad(value.sum(), deltas)  # each (P, H, L, Dh); rows do not mix
    patched = torch.full((P, target.num_layers, target.max_heads), float("nan"))
    per_position = torch.full((P, target.num_layers, target.max_heads, L), float("nan"))
    base_value = value.detach().float().cpu()
    m_clean, m_corrupted = (m_source, base_value) if direction == "denoise" else (base_value, m_source)
    for layer, grad in enumerate(grads):
        H = target.heads_per_layer[layer]
        step = (source.heads[layer] - seen[layer]).to(grad.dtype)  # (P, H, L, Dh)
        share = (step * grad).sum(-1).float().cpu()  # (P, H, L)
        per_position[:, layer, :H] = share
        patched[:, layer, :H] = base_value[:, None] + share.sum(-1)
    return Patching(
        method="attribution",
        direction=direction,
        metric_clean=m_clean,
        metric_corrupted=m_corrupted,
        patched=patched,
        per_position=per_position,
        passes=2,
        rows=2 * P,
        seconds=time.perf_counter() - t0,
        forward_seconds=forward,
        extra={"backward_passes": 1},
    )
