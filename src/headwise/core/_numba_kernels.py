"""The Numba kernels behind :mod:`headwise.core.kernels` (imported only where Numba is installed).

Compiled for the CPU they run on (``cache=True``); fast-math flags that let the compiler reorder sums and
use FMA, but keep infinities and NaNs (a blocked key's score is ``-inf``).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba import types
from numba.extending import intrinsic, overload

# reassociation (vectorised sums), contraction (FMA), reciprocals; not "ninf"/"nnan": -inf marks blocked keys
_FAST = {"contract", "reassoc", "arcp", "nsz", "afn"}


@intrinsic
def _float_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits``."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return types.float32(types.int32), codegen


@nb.njit(inline="always", fastmath=_FAST)
def _exp(x):
    """``exp(x)`` for float32 ``x ≤ 0`` (scores less their maximum), 0 below -87 and at ``-inf``: Cephes'
    ``expf`` (2ⁿ · a degree-6 polynomial of the remainder, relative error ≈ 1e-7) — written out so that the
    compiler vectorises it, which it cannot do with a call to the C library's ``expf``."""
    c = max(x, np.float32(-87.0))
    n = np.floor(c * np.float32(1.4426950408889634) + np.float32(0.5))
    r = c - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    e = p * _float_from_bits((np.int32(n) + np.int32(127)) << 23)
    return e if x > np.float32(-87.0) else np.float32(0.0)


def _widen(x):
    """An entry of K or V as float32: itself, or a bf16 entry stored as its int16 bit pattern."""


@overload(_widen, inline="always")
def _widen_typed(x):
    if x == types.int16:  # bf16's bits are float32's top half
        return lambda x: _float_from_bits(np.int32(x) << 16)
    return lambda x: x


@nb.njit(parallel=True, fastmath=_FAST, cache=True)
def attend(q, k, v, S, scale, bias, has_bias, block, dh_, dv_, g_):
    """``softmax(q kᵀ · scale + bias) v`` per query row, split-key: blocks of ``block`` keys (the threads' tasks)
    each form their scores, maximum, ``exp`` and output part in one pass, then every row combines its blocks.

    q ``(B, Hkv, G, Dh)`` float32; k ``(B, Hkv, C, Dh)``, v ``(B, Hkv, C, Dv)`` float32 or bf16 bits (int16),
    of which the first S slots are read; bias ``(B|1, Hkv|1, G|1, S)`` float32 when has_bias; dh_, dv_, g_:
    tuples whose lengths are Dh, Dv and G. Returns ``out (B, Hkv, G, Dv)`` float32; a row whose every key is
    at ``-inf`` gives zeros."""
    B, Hkv, _, _ = q.shape
    Dh, Dv, G = len(dh_), len(dv_), len(g_)  # head widths and group size as constants of the compiled code
    n = (S + block - 1) // block
    top = np.empty((B, Hkv, G, n), np.float32)  # each block's largest score
    total = np.empty((B, Hkv, G, n), np.float32)  # each block's Σ exp(score − its largest)
    part = np.empty((B, Hkv, G, n, Dv), np.float32)  # each block's Σ exp(score − its largest) · v
    out = np.empty((B, Hkv, G, Dv), np.float32)
    for task in nb.prange(B * Hkv * n):
        c = task % n
        h = (task // n) % Hkv
        b = task // (n * Hkv)
        s0 = c * block
        m = min(S, s0 + block) - s0
        score = np.empty((G, m), np.float32)  # (G, m): this block's scores
        for j in range(m):
            for g in range(G):
                acc = np.float32(0.0)
                for d in range(Dh):
                    acc += q[b, h, g, d] * _widen(k[b, h, s0 + j, d])
                score[g, j] = acc * scale
        if has_bias:
            bb = b if bias.shape[0] > 1 else 0
            hb = h if bias.shape[1] > 1 else 0
            for g in range(G):
                gb = g if bias.shape[2] > 1 else 0
                for j in range(m):
                    score[g, j] += bias[bb, hb, gb, s0 + j]
        acc_v = np.zeros((G, Dv), np.float32)  # (G, Dv): Σ exp(score − top) · v over the block
        for g in range(G):
            t = -np.inf
            for j in range(m):
                t = max(t, score[g, j])
            s = np.float32(0.0)
            if t > -np.inf:
                for j in range(m):
                    score[g, j] = _exp(score[g, j] - t)
                for j in range(m):
                    s += score[g, j]
            top[b, h, g, c] = t
            total[b, h, g, c] = s
        for j in range(m):
            for g in range(G):
                if top[b, h, g, c] > -np.inf:
                    p = score[g, j]
                    for d in range(Dv):
                        acc_v[g, d] += p * _widen(v[b, h, s0 + j, d])
        for g in range(G):
            for d in range(Dv):
                part[b, h, g, c, d] = acc_v[g, d]
    for row in nb.prange(B * Hkv * G):  # combine the blocks by their maxima
        g = row % G
        h = (row // G) % Hkv
        b = row // (G * Hkv)
        t = -np.inf
        for c in range(n):
            t = max(t, top[b, h, g, c])
        for d in range(Dv):
            out[b, h, g, d] = 0.0
        if t == -np.inf:  # every key blocked: zeros
            continue
        s = np.float32(0.0)
        for c in range(n):
            if top[b, h, g, c] > -np.inf:
                w = _exp(top[b, h, g, c] - t)
                s += w * total[b, h, g, c]
                for d in range(Dv):
                    out[b, h, g, d] += w * part[b, h, g, c, d]
        inv = np.float32(1.0) / s
        for d in range(Dv):
            out[b, h, g, d] *= inv
    return out


@nb.njit(parallel=True, fastmath=_FAST, cache=True)
def rows(w, x, bias, has_bias, per_task):
    """``y (N, Out) = x (N, In) wᵀ (+ bias (Out,))`` for ``w (Out, In)``, returned; the weight's rows are split
    among the threads ``per_task`` at a time, each read once for all N rows of ``x``."""
    Out, In = w.shape
    N = x.shape[0]
    y = np.empty((N, Out), np.float32)
    for task in nb.prange((Out + per_task - 1) // per_task):
        for i in range(task * per_task, min(Out, task * per_task + per_task)):
            for r in range(N):
                acc = np.float32(0.0)
                for j in range(In):
                    acc += w[i, j] * x[r, j]
                y[r, i] = acc + bias[i] if has_bias else acc
    return y


@intrinsic
def _bits_from_float(typingctx, x):
    """The int32 bit pattern of the float32 ``x``."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int32))

    return types.int32(types.float32), codegen


def _narrow(x, like):
    """A float32 as an entry of a buffer whose elements are ``like``'s type: itself, or bf16 bits (int16)."""


@overload(_narrow, inline="always")
def _narrow_typed(x, like):
    if like == types.int16:

        def to_bf16(x, like):  # round to nearest even, as torch's .to(torch.bfloat16); NaN stays NaN
            if x != x:
                return np.int16(0x7FC0)
            bits = np.uint32(_bits_from_float(x))
            return np.int16((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))

        return to_bf16
    return lambda x, like: x


@nb.njit(cache=True)
def _angles(position, inv_freq, factor):
    """float32 ``cos, sin`` of ``position · inv_freq`` (float64, exact library functions), times ``factor``."""
    cos = np.empty(inv_freq.shape[0], np.float32)
    sin = np.empty(inv_freq.shape[0], np.float32)
    for i in range(inv_freq.shape[0]):
        angle = np.float64(position) * inv_freq[i]
        cos[i] = np.float32(np.cos(angle) * factor)
        sin[i] = np.float32(np.sin(angle) * factor)
    return cos, sin


@nb.njit(fastmath=_FAST, cache=True)
def _rotate(x, start, heads, Dh, cos, sin, interleaved):
    """RoPE in place on ``heads`` consecutive heads of width Dh of the row ``x`` from ``start``."""
    half = Dh // 2
    for h in range(heads):
        o = start + h * Dh
        for i in range(half):
            if interleaved:
                a, b = x[o + 2 * i], x[o + 2 * i + 1]
                x[o + 2 * i] = a * cos[i] - b * sin[i]
                x[o + 2 * i + 1] = a * sin[i] + b * cos[i]
            else:
                a, b = x[o + i], x[o + half + i]
                x[o + i] = a * cos[i] - b * sin[i]
                x[o + half + i] = b * cos[i] + a * sin[i]


@nb.njit(fastmath=_FAST, cache=True)
def decode(
    x, w_qkv, b_qkv, has_b_qkv, w_o, b_o, has_b_o, k_buf, v_buf, slot, S, bias, has_bias, position, inv_freq,
    rope, factor, H, scale, block, per_task, dh_, g_,
):  # fmt: skip
    """One decoded token through a whole attention module: ``x (B, D)`` → Q/K/V (one product), RoPE at
    ``position`` (rope 0: none, 1: half, 2: interleaved; ``cos, sin`` of ``position · inv_freq`` computed in
    float64 and multiplied by ``factor``, as :class:`headwise.RotaryEmbedding`), the new key and value written
    to ``slot`` of ``k_buf, v_buf (B, Hkv, C, Dh)``, attention over slots ``0 … S − 1`` (plus ``bias (1, 1, 1,
    S)`` when has_bias: ``-inf`` on slots outside a window or empty), the output product.
    Returns ``(B, D)`` float32."""
    B = x.shape[0]
    Hkv = k_buf.shape[1]
    Dh = len(dh_)
    qkv = rows(w_qkv, x, b_qkv, has_b_qkv, per_task)  # (B, (H + 2·Hkv)·Dh)
    if rope > 0:
        cos, sin = _angles(position, inv_freq, factor)
        for b in range(B):
            _rotate(qkv[b], 0, H + Hkv, Dh, cos, sin, rope == 2)  # the queries' and the keys' heads
    like = k_buf[0, 0, 0, 0]
    for b in range(B):
        for h in range(Hkv):
            for d in range(Dh):
                k_buf[b, h, slot, d] = _narrow(qkv[b, (H + h) * Dh + d], like)
                v_buf[b, h, slot, d] = _narrow(qkv[b, (H + Hkv + h) * Dh + d], like)
    q = np.ascontiguousarray(qkv[:, : H * Dh]).reshape(B, Hkv, H // Hkv, Dh)
    heads = attend(q, k_buf, v_buf, S, scale, bias, has_bias, block, dh_, dh_, g_)
    return rows(w_o, heads.reshape(B, H * Dh), b_o, has_b_o, per_task)
