"""Blocked scaled dot-product attention in NumPy: the online-softmax recurrence of FlashAttention.

Shape legend: L query length, S key length, Dh head width, Dv value width, N the block size; leading
batch/head dimensions are optional (``...``).

The keys are visited ``N`` at a time. For every query row the recurrence keeps a running maximum
``m``, a running normaliser ``l`` and an unnormalised output ``acc`` (Milakov & Gimelshein 2018,
"Online normalizer calculation for softmax"; Dao et al. 2022, "FlashAttention", Algorithm 1)::

    s     = q kⱼᵀ · scale (+ bias, blocked -> -inf)        # (L, N) scores of key block j
    m'    = max(m, rowmax(s))
    p     = exp(s - m')
    l     = l · exp(m - m') + rowsum(p)
    acc   = acc · exp(m - m') + p vⱼ
    m     = m'
    out   = acc / l                                        # after the last block

so no ``(L, S)`` array ever exists. Query rows are taken ``N`` at a time as well, and leading indices one
at a time, so the work arrays are ``(N, N)`` scores plus the ``(L, Dv)`` output: memory ``O(L · N)`` at
most. The result equals :func:`headwise.reference.scaled_dot_product_attention` up to float64 round-off.
A query row with every key blocked yields a zero output (``l = 0``), as in the plain mode.

Speed: each tile costs two (N × Dh)·(Dh × N)-sized products and a few element-wise passes. On small
machines NumPy's OpenBLAS is faster here with one thread (``OPENBLAS_NUM_THREADS=1``, set before NumPy is
imported): on the 2-vCPU benchmark machine its two-thread pool took about three times longer.
"""

from __future__ import annotations

import numpy as np

from headwise import checks
from headwise.reference._masks import split_mask as _split_mask


def blocked_attention(q, k, v, mask=None, scale=None, *, block_size: int):
    """``softmax(q kᵀ · scale + mask) v`` computed ``block_size`` keys at a time (online softmax).

    Args:
        q: ``(..., L, Dh)``; k: ``(..., S, Dh)``; v: ``(..., S, Dv)``.
        mask: bool (True = may not attend) or float (added), broadcastable to ``(..., L, S)``.
        scale: defaults to ``1 / sqrt(Dh)``.
        block_size: N, keys per block (a positive integer; ``N ≥ S`` is a single block).
    Returns:
        ``out (..., L, Dv)`` in the inputs' floating dtype (float64 for float64 inputs).
    Raises:
        ValueError: a ``block_size`` that is not a positive integer; shapes that do not fit.
        TypeError: a mask that is neither bool nor float.
    """
    checks.positive_int("block_size", block_size)
    q, k, v = (np.asarray(a) for a in (q, k, v))
    if q.dtype.kind != "f":
        q = q.astype(np.float64)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"q, k, v: expected (..., L, Dh), (..., S, Dh), (..., S, Dv), got {q.shape}, {k.shape}, {v.shape}"
        )
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    L, S, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    blocked, bias = _split_mask(mask)
    full = (*lead, L, S)
    # broadcast views: no memory
    blocked = None if blocked is None else np.broadcast_to(blocked, np.broadcast_shapes(blocked.shape, full))
    bias = None if bias is None else np.broadcast_to(bias, np.broadcast_shapes(bias.shape, full))
    lead = np.broadcast_shapes(lead, *(() if a is None else a.shape[:-2] for a in (blocked, bias)))
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, *(() if bias is None else (bias.dtype,)))
    out = np.empty((*lead, L, Dv), dtype=dtype)
    for idx in np.ndindex(*lead):
        qi = _at(q, idx, lead) * scale  # (L, Dh); scaling q is cheaper than scaling each block of scores
        ki, vi = _at(k, idx, lead), _at(v, idx, lead)  # (S, Dh), (S, Dv)
        bl, bi = _at(blocked, idx, lead), _at(bias, idx, lead)  # (L, S) views or None
        for i0 in range(0, L, block_size):  # a block of query rows at a time: (N, N) scores stay in cache
            i1 = min(L, i0 + block_size)
            out[idx][i0:i1] = _query_block(
                qi[i0:i1],
                ki,
                vi,
                None if bl is None else bl[i0:i1],
                None if bi is None else bi[i0:i1],
                block_size,
                dtype,
            )
    return out


def _query_block(q, k, v, blocked, bias, block_size, dtype):
    """The recurrence for one block of query rows: ``q (n, Dh)`` against every key, ``block_size`` at a time."""
    n, S = q.shape[0], k.shape[0]
    m = np.full((n, 1), -np.inf, dtype=dtype)  # running row maximum
    lsum = np.zeros((n, 1), dtype=dtype)  # running normaliser
    acc = np.zeros((n, v.shape[-1]), dtype=dtype)  # running unnormalised output
    for j0 in range(0, S, block_size):
        j1 = min(S, j0 + block_size)
        s = q @ k[j0:j1].T  # (n, N)
        if bias is not None:
            s += bias[:, j0:j1]
        if blocked is not None:
            s[blocked[:, j0:j1]] = -np.inf
        m_new = np.maximum(m, s.max(axis=1, keepdims=True))  # (n, 1)
        m_safe = np.where(np.isfinite(m_new), m_new, 0.0)  # a row with no key yet: shift by 0
        np.subtract(s, m_safe, out=s)
        p = np.exp(s, out=s)  # (n, N); blocked entries give exp(-inf) = 0
        correction = np.exp(m - m_safe)  # (n, 1); 0 while m = -inf
        lsum = lsum * correction + p.sum(axis=1, keepdims=True)
        acc *= correction
        acc += p @ v[j0:j1]  # (n, Dv)
        m = m_new
    return acc / np.where(lsum == 0, 1.0, lsum)  # rows with every key blocked stay 0


def _at(a, idx, lead):
    """``a[idx]`` for ``a`` broadcastable to ``lead + a.shape[-2:]`` (size-1 leading axes repeat)."""
    if a is None:
        return None
    extra = len(lead) - (a.ndim - 2)
    sub = tuple(0 if a.shape[d] == 1 else i for d, i in enumerate(idx[extra:]))
    return a[sub]
