"""One-query attention: one decoded token's attention over its cache — beside the maths, never inside it.

A decoded token reads every cached key and value once; this is memory-bound. :func:`attention_one_query`
reads them at close to the read bandwidth — the compiled split-key kernel (:mod:`headwise.core.kernels`), or
two batched matrix products per key/value head over the entries as they lie — where
``F.scaled_dot_product_attention``'s flash kernel, built for blocks of queries, does not (docs/performance.md).
Tested against the readable path (``tests/core/test_one_query.py``, ``tests/core/test_kernels.py``).

Shape legend: B batch, H query heads, Hkv key/value heads, G = H / Hkv, S key length, C the cache's slots,
Dh head width, Dv value head width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from headwise.core import cpu, kernels, masks
from headwise.core.blocked import rank4
from headwise.core.guards import differentiated
from headwise.core.primitives import softmax_


def bf16_products() -> bool:
    """Whether a bf16 matrix product reads its bf16 operands at about their bytes' cost on this CPU, so that a
    bf16 cache is read as bf16 rather than widened to float32 first (a copy twice its size): where oneDNN
    computes bf16 (AVX-512, AMX; :attr:`headwise.core.cpu.CPU.bf16_products`). False with AVX2 alone, where
    ATen's reference bf16 product would run — also under ``ONEDNN_MAX_CPU_ISA=AVX2`` on an AVX-512 machine,
    which the CPU's flags alone would not tell."""
    return cpu.capabilities().bf16_products


DTYPES = (torch.float32, torch.bfloat16)


def applies(q: Tensor, k: Tensor, v: Tensor, dropout_p: float) -> bool:
    """Whether :func:`attention_one_query` computes this call: one query row, CPU plain tensors in float32 /
    bfloat16 (the keys and values may be bf16 under float32 queries: a bf16 cache), no dropout, no
    gradient recorded, not inside ``torch.compile``."""
    if torch.compiler.is_compiling() or q.shape[-2] != 1 or dropout_p > 0.0:
        return False
    if any(type(t) is not Tensor or t.device.type != "cpu" or t.dtype not in DTYPES for t in (q, k, v)):
        return False
    if k.dtype != v.dtype or k.shape[-2] == 0:
        return False
    return not differentiated(q, k, v)


def _grouped(m: Tensor | None, H: int, Hkv: int) -> Tensor | None:
    """A mask or bias broadcastable to ``(B, H, 1, S)`` as ``(B|1, Hkv, G, S)`` (per head) or ``(B|1, 1, 1, S)``."""
    if m is None:
        return None
    m = rank4(m)  # (B|1, H|1, 1, S|1)
    return m.reshape(m.shape[0], Hkv, H // Hkv, m.shape[-1]) if m.shape[1] == H else m


def additive(blocked: Tensor | None, bias: Tensor | None, S: int) -> Tensor | None:
    """``bias`` with ``-inf`` where ``blocked``, float32 ``(B|1, H|1, 1, S)``; None when both are None."""
    if blocked is None and bias is None:
        return None
    add = torch.zeros((), dtype=torch.float32) if bias is None else bias.float()
    if blocked is not None:
        add = (
            add.masked_fill(blocked, float("-inf"))
            if add.shape == blocked.shape
            else torch.where(blocked, float("-inf"), add)
        )
    add = rank4(add)  # (B|1, H|1, 1, S|1)
    return add.expand(*add.shape[:-1], S)


def kernel_bias(blocked: Tensor | None, bias: Tensor | None, H: int, k: Tensor) -> Tensor | None:
    """The compiled kernel's additive bias for ``k (B, Hkv, S, Dh)``: ``(B|1, Hkv|1, G|1, S)`` float32, or None."""
    return _grouped(additive(blocked, bias, k.shape[-2]), H, k.shape[1])


def attention_one_query(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """One query row's attention, ``softmax(q kᵀ · scale) v``, as two matrix products per key/value head.

    The ``G = H / Hkv`` query heads of a group form one ``(G, Dh)`` block against their key/value head, so GQA
    and MQA read each entry once. The compiled kernel where Numba loaded (``kernels.enabled``); else bf16
    entries (a bf16 cache) are multiplied as bf16 with float32 scores and softmax where the CPU multiplies bf16
    at its bytes' cost (:func:`bf16_products`; the query and the weights are then rounded to bf16), and widened
    to float32 otherwise.

    Args:
        q: ``(B, H, 1, Dh)``; k: ``(B, Hkv, S, Dh)``; v: ``(B, Hkv, S, Dv)``.
        blocked: bool, True = may not attend, broadcastable to ``(B, H, 1, S)`` (causality of a window,
            padding); a row with every key blocked (or at ``-inf``) gives zeros.
        bias: float added to the scores (ALiBi, a float mask), broadcastable to ``(B, H, 1, S)``.
        scale: defaults to ``1 / sqrt(Dh)``.
    Returns:
        ``out (B, H, 1, Dv)`` in ``q``'s dtype.
    """
    B, H, _, Dh = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    G = H // Hkv
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    if kernels.enabled and kernels.available():
        return kernels.attention_one_query(q, k, v, kernel_bias(blocked, bias, H, k), scale).to(q.dtype)
    if k.dtype != q.dtype and not bf16_products():
        k, v = k.to(q.dtype), v.to(q.dtype)  # widen once, then the float32 route
    S = k.shape[-2]
    if k.dtype == torch.bfloat16:  # (B, Hkv, C, Dh): the cache's slots, S ≤ C ≤ 2·S
        k_slots, v_slots = kernels.slot_view(k, 2 * S), kernels.slot_view(v, 2 * S)
        if k_slots is not None and v_slots is not None:
            k, v = k_slots, v_slots
    qg = (q * scale).reshape(B, Hkv, G, Dh).to(k.dtype)  # (B, Hkv, G, Dh): a group's queries as one block
    s = torch.matmul(qg, k.mT)  # (B, Hkv, G, C)
    if s.shape[-1] != S:  # the slots past the cached keys get no weight
        s[..., S:] = float("-inf")
    if s.dtype != torch.float32:
        s = s.float()  # the softmax in float32
    blocked, bias = _grouped(blocked, H, Hkv), _grouped(bias, H, Hkv)  # (B|1, Hkv|1, G|1, S)
    scores = s[..., :S]  # (B, Hkv, G, S): a view
    if bias is not None:
        scores += bias
    if blocked is not None:
        scores.masked_fill_(blocked, float("-inf"))
    p = softmax_(s, dead=masks.dead_rows(blocked, bias))  # (B, Hkv, G, C); rows with no key left: zeros
    out = torch.matmul(p.to(v.dtype), v)  # (B, Hkv, G, Dv)
    return out.to(q.dtype).view(B, H, 1, Dv)
