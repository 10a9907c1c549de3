"""Compiled CPU kernels for decoding — one token's attention over its cache and its projections, at the
read bandwidth.

A decoded token reads every cached key and value and the four weight matrices once and does little
arithmetic with them; its time is bounded below by those bytes over the read bandwidth. torch's batched
matrix products run a one-row product as a GEMM (packing the cached keys first) and its one-row linear as
a GEMV that reads the weight well below the bandwidth on some CPUs (MKL's on AMD Zen), so the fast path
reads them through the two kernels here, compiled by Numba for the CPU it runs on (``cache=True``: compiled
once per machine, loaded in ~0.1 s afterwards):

- :func:`attention_one_query`: ``softmax(q kᵀ + bias) v`` for one query row per head, as split-key
  ("flash-decoding") blocks of keys: each block's scores, their maximum, ``exp`` and sum, and its part of
  the output are formed in one pass over its keys and values (read once, the grouped heads' queries
  against their key/value head's entries together); the blocks are then combined by their maxima. float32
  or bf16 entries (a bf16 cache's, widened in registers), float32 arithmetic.
- :func:`linear_rows`: ``x Wᵀ + b`` for a few rows (a decoded token's projections), each weight row read
  once for every input row.

Both run on Numba's thread pool with as many threads as torch uses (``torch.get_num_threads()``).
:func:`available` says whether Numba loaded; where it did not, the fast path keeps torch's products. Each
kernel is tested against the readable path (``tests/core/test_kernels.py``).

Shape legend: B batch, H query heads, Hkv key/value heads, G = H / Hkv, S keys, C the cache's slots
(C ≥ S), Dh / Dv head widths, N rows, In / Out a projection's widths.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

# Whether the fast path uses these kernels where they apply (False: torch's products, for comparisons).
enabled = True
# Keys per block of the split-key attention: at a prefix of 4,096 and 12 heads, 192 blocks for the threads to
# share, and a block's scores (G × 256 floats) stay in the first-level cache.
KEYS_PER_BLOCK = 256
# Keys ahead of the one read whose cache lines are asked for (non-temporal prefetch); 0: none.
PREFETCH_AHEAD = 32
# Weight rows per task of the row-parallel linear.
ROWS_PER_TASK = 64
# Most input rows :func:`linear_rows` takes (a batch of decoded tokens); beyond, a GEMM reuses the weight better.
MAX_ROWS = 8


@functools.cache
def _compiled():
    """The Numba kernels, compiled (or loaded from Numba's cache) on first use; None without Numba."""
    try:
        import numba  # noqa: F401
    except Exception:  # pragma: no cover - Numba missing or broken on this platform
        return None
    from headwise.core import _numba_kernels

    return _numba_kernels


def available() -> bool:
    """Whether the compiled kernels can run here (Numba imports)."""
    return _compiled() is not None


def _threads() -> None:
    import numba

    n = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)


def _slots(t: Tensor) -> Tensor | None:
    """``t (B, Hkv, S, D)`` as a C-contiguous view ``(B, Hkv, C, D)`` of the same storage with C ≥ S (a cache's
    view of its first S slots, widened to its capacity), or None when its strides allow no such view."""
    B, Hkv, S, D = t.shape
    sb, sh, ss, sd = t.stride()
    if sd != 1 or ss != D:
        return None
    if B == 1 and Hkv == 1:
        return t.as_strided((1, 1, S, D), (S * D, S * D, D, 1))
    if sh % D or sh < S * D or (B > 1 and sb != Hkv * sh):
        return None
    C = sh // D
    if (t.storage_offset() + B * Hkv * sh) * t.element_size() > t.untyped_storage().nbytes():
        return None
    return t.as_strided((B, Hkv, C, D), (Hkv * C * D, C * D, D, 1))


def _entries(t: Tensor):
    """A cache's keys or values ``(B, Hkv, S, D)`` as a NumPy array the kernel reads: float32 as they are,
    bf16 as their 16-bit patterns (int16), C-contiguous over the cache's slots (copied only when the view's
    strides allow no such array)."""
    t = t.detach()
    full = _slots(t)
    if full is None:
        full = t.contiguous()
    if full.dtype == torch.bfloat16:
        return full.view(torch.int16).numpy()
    return full.numpy()


def attention_one_query(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float) -> Tensor:
    """``softmax(q kᵀ · scale + bias) v`` for one query row per head, computed in float32.

    Args:
        q: ``(B, H, 1, Dh)`` float32 or bf16. k: ``(B, Hkv, S, Dh)``; v: ``(B, Hkv, S, Dv)`` — float32 or
            bf16, any strides whose last dimension is contiguous read in place (a cache's view).
        bias: float32 ``(B|1, Hkv, G, S)`` or ``(B|1, 1, 1, S)`` added to the scores (``-inf`` blocks a key),
            or None. A row whose every key is blocked gives zeros.
        scale: multiplies the scores (before the bias).
    Returns:
        ``out (B, H, 1, Dv)`` float32.
    """
    kern = _compiled()
    B, H, _, Dh = q.shape
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[-1]
    G = H // Hkv
    qg = (q.reshape(B, Hkv, G, Dh).float() * scale).contiguous()  # (B, Hkv, G, Dh): a group's queries together
    n_blocks = math.ceil(S / KEYS_PER_BLOCK)
    top = torch.empty(B, Hkv, G, n_blocks)  # each block's largest score
    total = torch.empty(B, Hkv, G, n_blocks)  # each block's Σ exp(score − its largest)
    part = torch.empty(B, Hkv, G, n_blocks, Dv)  # each block's Σ exp(score − its largest) · v
    out = torch.empty(B, Hkv, G, Dv)
    b = torch.zeros(1, 1, 1, 1) if bias is None else bias.float().contiguous()
    _threads()
    kern.attend(
        qg.numpy(),
        _entries(k),
        _entries(v),
        S,
        b.numpy(),
        bias is not None,
        KEYS_PER_BLOCK,
        PREFETCH_AHEAD,
        top.numpy(),
        total.numpy(),
        part.numpy(),
        out.numpy(),
    )
    return out.view(B, H, 1, Dv)


def linear_rows(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x Wᵀ + b`` for float32 ``x (..., In)`` of at most ``MAX_ROWS`` rows, ``weight (Out, In)``, ``bias (Out,)``
    (C-contiguous float32); each weight row is read once for every row of ``x``. Returns ``(..., Out)``."""
    kern = _compiled()
    Out, In = weight.shape
    rows = x.reshape(-1, In).contiguous()  # (N, In)
    y = torch.empty(rows.shape[0], Out)  # (N, Out)
    b = torch.zeros(1) if bias is None else bias
    _threads()
    kern.rows(weight.detach().numpy(), rows.numpy(), b.detach().numpy(), bias is not None, ROWS_PER_TASK, y.numpy())
    return y.view(*x.shape[:-1], Out)


def linear_rows_applies(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether :func:`linear_rows` takes this product: float32 CPU, at most ``MAX_ROWS`` rows, contiguous
    weight and bias, the kernels available. (The caller checks that no gradient is recorded.)"""
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or not weight.is_contiguous():
        return False
    if x.numel() > MAX_ROWS * x.shape[-1] or x.numel() == 0:
        return False
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        return False
    return available()
