"""The compiled decode step: one decoded token through a whole attention module in one compiled call.

A module says whether its kinds allow it (:meth:`headwise.MultiHeadAttention.decodes_compiled`); :func:`applies`
checks the call — the token, the cache, the weights, gradients and hooks — and :func:`step` runs it through
:func:`headwise.core.kernels.decode_step`: the stacked Q/K/V product, RoPE at the cache's length, the new key and
value written into the cache, attention over every cached token (or a ring as it lies), ``Wo``. The same
numbers as the module's forward, with the round-off of a different order of sums (``tests/core/test_kernels.py``).

Shape legend: B batch, D model width, H query heads, Hkv key/value heads, Dh head width, C the cache's slots.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from headwise.core import kernels, masks, projections
from headwise.core.cache import KVCache, SlidingWindowCache
from headwise.core.guards import derivatives_possible, differentiated, global_hooks
from headwise.core.one_query import DTYPES


def applies(query: Tensor, cache, linears: tuple[nn.Linear, ...], kv_heads: int, head_dim: int, window) -> bool:
    """Whether :func:`step` computes this call — asked by a module whose kinds allow the step: one new token
    ``query (B, 1, D)`` float32 on the CPU into a :class:`~headwise.core.cache.KVCache` with room or the ring of
    a :class:`~headwise.core.cache.SlidingWindowCache` (float32 or bf16 buffers ``(B, kv_heads, C, head_dim)``,
    contiguous; a ring float32 and at least as wide as the module's ``window``), ``linears`` (``Wq, Wk, Wv,
    Wo``) plain float32 ``nn.Linear``s without hooks whose stacked weight can be kept, no hook for every module,
    no gradient, autocast or compilation, the compiled kernels available. Calls the cache would refuse go the
    usual way, which raises."""
    kind = type(cache)
    if not kernels.enabled or kind not in (KVCache, SlidingWindowCache):
        return False
    if type(query) is not Tensor or query.dtype != torch.float32 or query.device.type != "cpu":
        return False
    ring = kind is SlidingWindowCache
    k, v = cache.k, cache.v
    if ring and ((window or 0) > cache.window or k.dtype != torch.float32):
        return False  # (a ring's update attends its new key unrounded; a bf16 ring goes the usual way)
    B, Hkv, C, Dh = k.shape
    if query.dim() != 3 or query.shape[1] != 1 or (B, Hkv, Dh) != (query.shape[0], kv_heads, head_dim):
        return False
    if (not ring and cache.length >= C) or k.dtype not in DTYPES or v.dtype != k.dtype or v.shape != k.shape:
        return False
    if k.device.type != "cpu" or not (k.is_contiguous() and v.is_contiguous()) or global_hooks():
        return False
    for lin in linears:  # projections.plain's checks, each parameter fetched once
        if type(lin) is not nn.Linear or lin._forward_pre_hooks or lin._forward_hooks:
            return False
        w, b = lin.weight, lin.bias
        if type(w) not in (nn.Parameter, Tensor) or w.dtype != torch.float32 or not w.is_contiguous():
            return False
        if b is not None and (type(b) not in (nn.Parameter, Tensor) or b.dtype != torch.float32):
            return False
    if torch.compiler.is_compiling() or torch.is_autocast_enabled("cpu") or not projections.keepable(linears[:3]):
        return False
    if derivatives_possible() and differentiated(query, *(p for lin in linears for p in lin.parameters())):
        return False
    return kernels.available()


def step(module: nn.Module, query: Tensor, cache) -> Tensor:
    """One decoded token ``query (B, 1, D)`` through ``module`` (a :class:`headwise.MultiHeadAttention` for which
    :meth:`~headwise.MultiHeadAttention.decodes_compiled` holds) in one compiled call, the new key and value
    appended to ``cache``. Returns ``(B, 1, D)``."""
    weight, bias = projections.stacked(module, (module.Wq, module.Wk, module.Wv))  # (H·Dh + 2·Hkv·Dh, D)
    rope = module.positional.rotation() if module.positional is not None else None
    scale = module.scale if module.scale is not None else 1.0 / math.sqrt(module.head_dim)
    t, window = cache.length, module.sliding_window  # the new token's stream index; the module's window
    if type(cache) is SlidingWindowCache:  # the ring as it lies: one query's attention needs no stream order
        slot, window = cache.next_slot(), masks.narrowest(window, cache.window)
        stream = cache.slots.clone()  # (C,): each slot's stream index, -1 empty
        stream[slot] = t
        blocked = masks.causal_slots(1, stream.shape[0], offset=t, window=window, key_slots=stream,
                                     sink_tokens=cache.sink_tokens)  # fmt: skip
        keys = (stream >= 0) & ~blocked[0]  # (C,)
    else:
        slot = t
        blocked = masks.causal_slots(1, t + 1, offset=t, window=window)  # (1, t + 1), None: every key seen
        keys = None if blocked is None else ~blocked[0]
    B = query.shape[0]
    out = kernels.decode_step(
        query.reshape(B, -1).contiguous(), weight, bias, module.Wo.weight, module.Wo.bias, cache.k, cache.v,
        slot, t, keys, module.num_heads, scale, rope,
    )  # fmt: skip
    cache.commit(1)
    return out.view(B, 1, -1)
