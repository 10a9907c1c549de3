"""Weights between ``torch.nn.MultiheadAttention`` and headwise's :class:`MultiHeadAttention`.

``nn.MultiheadAttention`` keeps the three input projections packed in ``in_proj_weight (3D, D)``
(or ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` when ``kdim``/``vdim`` differ from D), and
the output projection in ``out_proj``. headwise keeps four ``nn.Linear``: ``Wq, Wk, Wv, Wo``.
headwise is always batch-first; a module converted from ``batch_first=False`` takes ``(B, L, D)``.
"""

from __future__ import annotations

import torch
from torch import nn

from headwise.core.attention import MultiHeadAttention


def from_torch(m: nn.MultiheadAttention) -> MultiHeadAttention:
    """A headwise module with the same weights as ``m`` (any ``batch_first``, bias or not, kdim/vdim).

    Raises:
        TypeError: ``m`` is not an ``nn.MultiheadAttention``.
        ValueError: ``add_bias_kv`` or ``add_zero_attn``, which headwise does not model.
    """
    if not isinstance(m, nn.MultiheadAttention):
        raise TypeError(f"m: expected a torch.nn.MultiheadAttention, got {type(m).__name__}")
    if m.bias_k is not None or m.add_zero_attn:
        raise ValueError("m: add_bias_kv=True / add_zero_attn=True are not supported by headwise")
    d = m.embed_dim
    w = m.in_proj_weight
    p = m.out_proj.weight
    has_bias = m.in_proj_bias is not None
    out = MultiHeadAttention(
        d,
        m.num_heads,
        bias=has_bias,
        dropout=m.dropout,
        kdim=m.kdim,
        vdim=m.vdim,
        device=p.device,
        dtype=p.dtype,
    )
    with torch.no_grad():
        if m._qkv_same_embed_dim:
            wq, wk, wv = w.chunk(3, dim=0)  # (D, D) each
        else:
            wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
        out.Wq.weight.copy_(wq)
        out.Wk.weight.copy_(wk)
        out.Wv.weight.copy_(wv)
        out.Wo.weight.copy_(m.out_proj.weight)
        if has_bias:
            bq, bk, bv = m.in_proj_bias.chunk(3)
            out.Wq.bias.copy_(bq)
            out.Wk.bias.copy_(bk)
            out.Wv.bias.copy_(bv)
            out.Wo.bias.copy_(m.out_proj.bias)
    return out


def to_torch(m: MultiHeadAttention, *, batch_first: bool = True) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention`` with the same weights as ``m``.

    Raises:
        TypeError: ``m`` is not a headwise MultiHeadAttention.
        ValueError: ``m`` uses what ``nn.MultiheadAttention`` cannot express — grouped-query heads,
        ``num_heads · head_dim ≠ d_model``, a positional part, a custom scale, or mixed bias.
    """
    if not isinstance(m, MultiHeadAttention):
        raise TypeError(f"m: expected a headwise.MultiHeadAttention, got {type(m).__name__}")
    if m.num_kv_heads != m.num_heads:
        raise ValueError(f"m: num_kv_heads={m.num_kv_heads} (grouped-query) has no nn.MultiheadAttention equivalent")
    if m.num_heads * m.head_dim != m.d_model:
        raise ValueError(f"m: num_heads·head_dim={m.num_heads * m.head_dim} differs from d_model={m.d_model}")
    if m.positional is not None or m.scale is not None:
        raise ValueError("m: a positional part or a custom scale has no nn.MultiheadAttention equivalent")
    biases = [lin.bias is not None for lin in (m.Wq, m.Wk, m.Wv, m.Wo)]
    if len(set(biases)) != 1:
        raise ValueError(f"m: nn.MultiheadAttention needs biases on all four projections or none, got {biases}")
    w = m.Wo.weight
    out = nn.MultiheadAttention(
        m.d_model,
        m.num_heads,
        dropout=m.dropout,
        bias=biases[0],
        kdim=m.kdim,
        vdim=m.vdim,
        batch_first=batch_first,
        device=w.device,
        dtype=w.dtype,
    )
    with torch.no_grad():
        if out._qkv_same_embed_dim:
            out.in_proj_weight.copy_(torch.cat([m.Wq.weight, m.Wk.weight, m.Wv.weight], dim=0))
        else:
            out.q_proj_weight.copy_(m.Wq.weight)
            out.k_proj_weight.copy_(m.Wk.weight)
            out.v_proj_weight.copy_(m.Wv.weight)
        out.out_proj.weight.copy_(m.Wo.weight)
        if biases[0]:
            out.in_proj_bias.copy_(torch.cat([m.Wq.bias, m.Wk.bias, m.Wv.bias]))
            out.out_proj.bias.copy_(m.Wo.bias)
    return out
