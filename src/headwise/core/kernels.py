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
- :func:`decode_step`: one decoded token through a whole attention module in one call — the stacked Q/K/V
  product, RoPE, the cache write, the attention above, ``Wo`` — so that a token pays one call's overhead
  rather than some forty small operations'.

They run on Numba's thread pool with as many threads as torch uses (``torch.get_num_threads()``); the attention
called on its own runs on one thread when it reads little, and the linear is taken only for large weights
(``PARALLEL_BYTES``).
:func:`available` says whether Numba loaded; where it did not, the fast path keeps torch's products. Each
kernel is tested against the readable path (``tests/core/test_kernels.py``).

Shape legend: B batch, H query heads, Hkv key/value heads, G = H / Hkv, S keys, C the cache's slots
(C ≥ S), Dh / Dv head widths, N rows, In / Out a projection's widths.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

_NO_BIAS = np.zeros((1, 1, 1, 1), np.float32)
_NO_FREQ = torch.zeros(1, dtype=torch.float64)
# Whether the fast path uses these kernels where they apply (False: torch's products, for comparisons).
enabled = True
# The split-key attention's blocks of keys: as long as the threads allow (one long run over a head's keys and
# then its values reads faster than many short ones: measured 0.76 x the step time of 256-key blocks at a prefix
# of 4,096, 12 heads, 2 threads), at least TASKS_PER_THREAD blocks per thread in all (MQA's one key/value head
# is split), and a block's scores (G x keys floats) at most SCORE_BYTES, to stay in the second-level cache.
TASKS_PER_THREAD = 2
SCORE_BYTES = 1 << 18
MIN_BLOCK = 256


def keys_per_block(S: int, heads: int, G: int, threads: int) -> int:
    """Keys per block for ``heads`` (B·Hkv) key/value heads of S keys, G queries each, on ``threads`` threads."""
    blocks = max(1, -(-TASKS_PER_THREAD * threads // heads))  # blocks per head
    most = max(MIN_BLOCK, SCORE_BYTES // (4 * G))
    return max(1, min(most, max(MIN_BLOCK, -(-S // blocks))))


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
    import headwise.core._numba_kernels as compiled

    return compiled


def available() -> bool:
    """Whether the compiled kernels can run here (Numba imports)."""
    return _compiled() is not None


@functools.cache
def _width(n: int) -> tuple:
    """A tuple of length ``n``: its type tells the compiler a head width or a group size, so that it unrolls the
    loops over them (one kernel is compiled per combination met, and cached)."""
    return (0,) * n


_set_threads = [0]  # the thread count last given to Numba (from this module)

# Entries (bytes) below which a kernel called on its own — between torch's operations, as in a Hugging Face
# model's layers — runs on one thread. Numba's thread pool is not torch's: at every switch between the two, the
# idle threads of one spin on the cores the other needs. Measured on SmolLM2-135M (6.3 MB of K and V per layer
# at a prompt of 4,096) with `generate`: on a quiet machine one thread and two took the same time per token
# within the rounds' noise; with one other busy process on the 2 cores, two threads took 1.24–1.38 × sdpa's
# time per token and one thread 0.64–0.89 ×. Larger reads gain more from a second thread than a switch costs.
# The compiled decode step (one call per layer for the whole module) always uses torch's thread count.
PARALLEL_BYTES = 16 << 20


def _threads(nbytes: int | None = None) -> None:
    """Numba's threads as many as torch's (``torch.get_num_threads()``, e.g. under ``torch.set_num_threads``);
    one for a kernel called on its own over fewer than ``PARALLEL_BYTES`` bytes."""
    n = 1 if nbytes is not None and nbytes < PARALLEL_BYTES else torch.get_num_threads()
    if n != _set_threads[0]:
        import numba

        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
        _set_threads[0] = n


def slot_view(t: Tensor, max_slots: int | None = None) -> Tensor | None:
    """``t (B, Hkv, S, D)``, a cache's view of its first S slots, as a C-contiguous view ``(B, Hkv, C, D)`` of
    the same storage with C ≥ S: every slot its heads' stride spans (one head of one item: its S slots alone).
    None when its strides allow no such view, or it would span more than ``max_slots`` slots.

    The compiled kernel reads such a view in place; torch's bf16 matmul, which hands oneDNN only
    batch-contiguous operands and copies any other (``mkldnn_matmul``), reads it for less than that copy costs
    while C ≤ 2·S (the one-query route; the slots past the keys get no weight)."""
    B, Hkv, S, D = t.shape
    sb, sh, ss, sd = t.stride()
    if sd != 1 or ss != D:
        return None
    if B == 1 and Hkv == 1:
        return t.as_strided((1, 1, S, D), (S * D, S * D, D, 1))
    if sh % D or sh < S * D or (B > 1 and sb != Hkv * sh):
        return None
    C = sh // D
    if max_slots is not None and max_slots < C:
        return None
    if (t.storage_offset() + B * Hkv * sh) * t.element_size() > t.untyped_storage().nbytes():
        return None
    return t.as_strided((B, Hkv, C, D), (Hkv * C * D, C * D, D, 1))


def _entries(t: Tensor):
    """A cache's keys or values ``(B, Hkv, S, D)`` as a NumPy array the kernel reads: float32 as they are,
    bf16 as their 16-bit patterns (int16), C-contiguous over the cache's slots (copied only when the view's
    strides allow no such array)."""
    t = t.detach()
    full = slot_view(t)
    if full is None:
        full = t.contiguous()
    return _buffer(full)


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
    qg = q.detach().reshape(B, Hkv, H // Hkv, Dh).float().contiguous()  # (B, Hkv, G, Dh): a group's queries
    b = _NO_BIAS if bias is None else bias.float().contiguous().numpy()
    _threads(k.numel() * k.element_size() + v.numel() * v.element_size())
    out = kern.attend(
        qg.numpy(), _entries(k), _entries(v), S, scale, b, bias is not None,
        keys_per_block(S, B * Hkv, H // Hkv, _set_threads[0]),
        _width(Dh), _width(Dv), _width(H // Hkv),
    )  # fmt: skip
    return torch.from_numpy(out).view(B, H, 1, Dv)


def linear_rows(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x Wᵀ + b`` for float32 ``x (..., In)`` of at most ``MAX_ROWS`` rows, ``weight (Out, In)``, ``bias (Out,)``
    (C-contiguous float32); each weight row is read once for every row of ``x``. Returns ``(..., Out)``."""
    kern = _compiled()
    Out, In = weight.shape
    rows = x.detach().reshape(-1, In).contiguous()  # (N, In)
    _threads()
    y = kern.rows(weight.detach().numpy(), rows.numpy(), _bias(bias), bias is not None, ROWS_PER_TASK)  # (N, Out)
    return torch.from_numpy(y).view(*x.shape[:-1], Out)


def decode_step(
    x: Tensor,
    w_qkv: Tensor,
    b_qkv: Tensor | None,
    w_o: Tensor,
    b_o: Tensor | None,
    k_buf: Tensor,
    v_buf: Tensor,
    slot: int,
    position: int,
    keys: Tensor | None,
    num_heads: int,
    scale: float,
    rope: tuple[Tensor, str, float] | None,
) -> Tensor:
    """One decoded token through an attention module in one compiled call: the Q/K/V product, RoPE, the new
    key and value written to ``slot`` of the cache's buffers, attention over the cached keys, the output
    product.

    Args:
        x: ``(B, D)`` float32. w_qkv: ``(H·Dh + 2·Hkv·Dh, D)``, the stacked ``Wq; Wk; Wv``; b_qkv its bias or
            None. w_o: ``(D, H·Dh)``; b_o: ``(D,)`` or None — float32, C-contiguous.
        k_buf, v_buf: the cache's buffers ``(B, Hkv, C, Dh)``, float32 or bf16, C-contiguous, written in place.
        slot: where the new token goes. position: its position (RoPE).
        keys: bool ``(S,)``, which of the slots ``0 … S − 1`` the token attends (a window, a ring's empty
            slots), or None: every slot ``0 … slot``.
        num_heads: H. scale: of the scores.
        rope: ``(inv_freq (Dh/2,) float64, convention, factor)`` to rotate q and k, or None.
    Returns:
        ``(B, D)`` float32.
    """
    kern = _compiled()
    Dh = k_buf.shape[-1]
    inv_freq, convention, factor = rope if rope is not None else (_NO_FREQ, "half", 1.0)
    kind = 0 if rope is None else (1 if convention == "half" else 2)
    B, Hkv = k_buf.shape[:2]
    S = slot + 1 if keys is None else keys.shape[0]
    bias = _NO_BIAS if keys is None else torch.zeros(1, 1, 1, S).masked_fill_(~keys, float("-inf")).numpy()
    block = keys_per_block(S, B * Hkv, num_heads // Hkv, torch.get_num_threads())
    _threads()
    out = kern.decode(
        x.detach().numpy(), w_qkv.detach().numpy(), _bias(b_qkv), b_qkv is not None, w_o.detach().numpy(),
        _bias(b_o), b_o is not None, _buffer(k_buf), _buffer(v_buf), slot, S, bias, keys is not None, position,
        inv_freq.numpy(), kind, float(factor), num_heads, scale, block, ROWS_PER_TASK, _width(Dh),
        _width(num_heads // Hkv),
    )  # fmt: skip
    return torch.from_numpy(out)


def _bias(b: Tensor | None):
    return _NO_BIAS.reshape(1) if b is None else b.detach().numpy()


def _buffer(t: Tensor):
    """A float32 tensor as a NumPy array of its values, a bf16 one as its bit patterns (int16), same memory."""
    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def linear_rows_applies(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether :func:`linear_rows` takes this product: float32 CPU, at most ``MAX_ROWS`` rows, a contiguous weight
    of at least ``PARALLEL_BYTES`` (a smaller one stays with oneDNN, on torch's own threads: on one thread the
    kernel is slower, on Numba's pool it would switch pools), contiguous bias, the kernels available. (The caller
    checks that no gradient is recorded.)"""
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or not weight.is_contiguous():
        return False
    if weight.numel() * 4 < PARALLEL_BYTES:
        return False
    if x.numel() > MAX_ROWS * x.shape[-1] or x.numel() == 0:
        return False
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        return False
    return available()
