"""Multi-head latent attention (MLA) in NumPy: DeepSeek-V2 §2.1 (arXiv:2405.04434) and DeepSeek-V3.

Shape legend: B batch, L query length, S key length, D model width, H heads, Rq the query latent rank
(``q_lora_rank``), R the key/value latent rank (``kv_lora_rank``), Dn the per-head key/query width without
position (``qk_nope_head_dim``), Dr the rotary width shared by all heads (``qk_rope_head_dim``), Dv the value
head width (``v_head_dim``).

Weights follow the ``x @ w`` convention (``w = nn.Linear.weight.T``) and DeepSeek's names
(``inference/model.py``; Hugging Face ``DeepseekV3Attention`` in brackets)::

    wq (D, H·(Dn+Dr))          [q_proj]                      when there is no query latent, else
    wq_a (D, Rq), q_norm (Rq,), wq_b (Rq, H·(Dn+Dr))  [q_a_proj, q_a_layernorm, q_b_proj]
    wkv_a (D, R+Dr), kv_norm (R,)                     [kv_a_proj_with_mqa, kv_a_layernorm]
    wkv_b (R, H·(Dn+Dv))                              [kv_b_proj]
    wo (H·Dv, D)                                      [o_proj]
    optional biases bq_a, bkv_a, bo                   [attention_bias]

The plain path::

    q = split(rms(x wq_a) wq_b)                        (B, H, L, Dn+Dr) -> q_nope (Dn), q_pe (Dr) rotated
    c, k_pe = x wkv_a                                  c (B, S, R) normalised; k_pe (B, 1, S, Dr) rotated, one head
    k_nope, v = split(c wkv_b)                         (B, H, S, Dn), (B, H, S, Dv)
    out = softmax([q_nope, q_pe] [k_nope, k_pe]ᵀ · scale) v  ->  merge -> wo

The absorbed path (``inference/model.py``, ``attn_impl="absorb"``) multiplies ``W_UK`` (the key half of
``wkv_b``) into the query and ``W_UV`` (its value half) into the output, so that attention runs over the
latent itself — one key/value head of width ``R + Dr`` shared by all H heads — and only ``c`` and ``k_pe``
need caching::

    q_lat = q_nope W_UKᵀ                               (B, H, L, R)
    scores = (q_lat cᵀ + q_pe k_peᵀ) · scale           (B, H, L, S)
    out_h = (softmax(scores) c) W_UV,h                 (B, H, L, Dv)

Both give the same numbers up to round-off (the products are re-associated).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from headwise.reference._masks import split_mask as _split_mask
from headwise.reference.attention import merge_heads, rms_norm, scaled_dot_product_attention, split_heads
from headwise.reference.positional import apply_rope, causal_mask, window_mask


def latent_attention(
    x,
    params: Mapping[str, np.ndarray],
    num_heads: int,
    *,
    kv_lora_rank: int,
    qk_nope_head_dim: int,
    qk_rope_head_dim: int,
    v_head_dim: int,
    mask=None,
    causal: bool = False,
    positions=None,
    rope: Mapping | None = None,
    scale=None,
    sliding_window: int | None = None,
    norm_eps: float = 1e-6,
    absorbed: bool = False,
):
    """Multi-head latent attention of ``x`` over itself.

    Args:
        x: ``(L, D)`` or ``(B, L, D)``.
        params: see the module docstring (``wq`` or ``wq_a, q_norm, wq_b``; ``wkv_a, kv_norm, wkv_b, wo``).
        num_heads: H.
        kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim: R, Dn, Dr, Dv.
        mask: bool (True = may not attend) or float (added), broadcastable to ``(B, H, L, L)``.
        causal: block keys after the query's position.
        positions: ``(L,)`` token positions (default ``0 … L−1``) for RoPE, causality and the window.
        rope: ``apply_rope``'s keywords (DeepSeek: ``{"convention": "interleaved", "base": 10000,
            "scaling": {"rope_type": "yarn", ...}}``); only the ``Dr`` rotary features are rotated.
        scale: default ``1 / sqrt(Dn + Dr)``; DeepSeek-V3 multiplies it by ``mscale²`` under YaRN.
        sliding_window: W, as :func:`headwise.reference.multi_head_attention`.
        norm_eps: epsilon of the two latent RMSNorms (1e-6 in DeepSeek-V2/V3).
        absorbed: compute through the latent (see the module docstring) instead of expanding keys and values.
    Returns:
        ``(out like x, weights (..., H, L, L))``.
    """
    p = params
    x = np.asarray(x)
    R, Dn, Dr, Dv = kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    if "wq" in p:
        q = x @ p["wq"]  # (..., L, H·(Dn+Dr))
    else:
        q = rms_norm(x @ p["wq_a"] + p.get("bq_a", 0.0), p["q_norm"], norm_eps) @ p["wq_b"]
    q = split_heads(q, num_heads)  # (..., H, L, Dn+Dr)
    q_nope, q_pe = q[..., :Dn], q[..., Dn:]
    kv = x @ p["wkv_a"] + p.get("bkv_a", 0.0)  # (..., L, R+Dr)
    c = rms_norm(kv[..., :R], p["kv_norm"], norm_eps)  # (..., L, R): the cached latent
    k_pe = kv[..., None, :, R:]  # (..., 1, L, Dr): one rotary key shared by the heads
    L = x.shape[-2]
    pos = np.arange(L) if positions is None else np.asarray(positions)
    if rope is not None:
        q_pe, k_pe = apply_rope(q_pe, pos, **rope), apply_rope(k_pe, pos, **rope)
    scale = 1.0 / np.sqrt(Dn + Dr) if scale is None else scale
    blocked, bias = _split_mask(mask)
    if causal or sliding_window is not None:
        slots = causal_mask(pos, pos, sliding_window) if causal else window_mask(pos, pos, sliding_window)
        blocked = slots if blocked is None else (blocked | slots)
    if blocked is not None and bias is not None:
        total = np.where(blocked, -np.inf, bias)
    else:
        total = blocked if blocked is not None else bias
    w_b = p["wkv_b"].reshape(R, num_heads, Dn + Dv)  # (R, H, Dn+Dv)
    w_uk, w_uv = w_b[..., :Dn], w_b[..., Dn:]  # (R, H, Dn), (R, H, Dv)
    if absorbed:
        q_lat = np.einsum("...hld,rhd->...hlr", q_nope, w_uk)  # (..., H, L, R)
        q_all = np.concatenate([q_lat, q_pe], axis=-1)  # (..., H, L, R+Dr)
        k_all = np.concatenate([c[..., None, :, :], k_pe], axis=-1)  # (..., 1, L, R+Dr)
        o_lat, weights = scaled_dot_product_attention(q_all, k_all, c[..., None, :, :], mask=total, scale=scale)
        out = np.einsum("...hlr,rhv->...hlv", o_lat, w_uv)  # (..., H, L, Dv)
    else:
        kv_up = split_heads(c @ p["wkv_b"], num_heads)  # (..., H, L, Dn+Dv)
        k_nope, v = kv_up[..., :Dn], kv_up[..., Dn:]
        k = np.concatenate([k_nope, np.broadcast_to(k_pe, (*k_nope.shape[:-1], Dr))], axis=-1)  # (..., H, L, Dn+Dr)
        out, weights = scaled_dot_product_attention(
            np.concatenate([q_nope, q_pe], axis=-1), k, v, mask=total, scale=scale
        )
    out = merge_heads(out) @ p["wo"] + p.get("bo", 0.0)  # (..., L, D)
    return out, weights
