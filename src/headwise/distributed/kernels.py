"""Block kernels for ring attention: attention of one query block against one key/value block that
also returns the log-sum-exp of its scores, and the matching backward.

Shape legend: B batch, H query heads, Hkv key/value heads (H % Hkv == 0, query head h reads key/value
head h // (H / Hkv), as Hugging Face Llama's ``repeat_kv``), Lq query block, Sk key block, Dh head width.

A kernel is any object with

- ``forward(q, k, v, *, causal, scale) -> (out, lse)``: ``out (B, H, Lq, Dh)`` in ``q``'s dtype,
  ``lse (B, H, Lq)`` (float32, or float64 for float64 inputs): ``lse_i = log Σ_j exp(scale · q_i·k_j)``.
- ``backward(dout, q, k, v, out, lse, *, causal, scale) -> (dq, dk, dv)`` in the inputs' shapes.

``causal`` is the top-left-aligned mask (query row i may attend key j ≤ i); ring attention only asks for
it on square diagonal blocks. The backward is the flash-attention one (Dao et al. 2022): it recomputes
``P = exp(scale · q kᵀ − lse)`` from the *global* ``lse`` and ``D = rowsum(dout ∘ out)`` from the *global*
``out``, so the block gradients it returns sum to the gradients of the whole attention — the property
ring attention relies on (as ring-flash-attention does).

Kernels here: :class:`MathKernel` (plain PyTorch, any device and dtype, the readable one),
:class:`CpuFlashKernel` (``aten._scaled_dot_product_flash_attention_for_cpu``),
:class:`CudaFlashKernel` (``aten._scaled_dot_product_flash_attention``, fp16/bf16) and
:class:`CudaEfficientKernel` (``aten._scaled_dot_product_efficient_attention``, fp32 too).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from headwise.core import masks
from headwise.core.primitives import repeat_kv

aten = torch.ops.aten

KERNEL_NAMES = ("auto", "math", "flash", "efficient")


class BlockKernel(Protocol):
    """What ring attention needs from a block kernel (see the module docstring)."""

    name: str

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float) -> tuple[Tensor, Tensor]: ...

    def backward(
        self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *, causal: bool, scale: float
    ) -> tuple[Tensor, Tensor, Tensor]: ...


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for everything else (the merges never run in half precision)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _sum_groups(dx: Tensor, groups: int) -> Tensor:
    """``(B, Hkv·groups, S, Dh)`` -> ``(B, Hkv, S, Dh)``: the gradient of
    :func:`~headwise.core.primitives.repeat_kv`."""
    if groups == 1:
        return dx
    b, h, s, d = dx.shape
    return dx.view(b, h // groups, groups, s, d).sum(2)  # (B, Hkv, S, Dh)


class MathKernel:
    """Plain PyTorch block attention (``softmax(scale · q kᵀ) v``), computed in float32 or float64.

    Grouped-query attention is a reshape, not a copy: ``q (B, H, Lq, Dh)`` is viewed as
    ``(B, Hkv, H/Hkv, Lq, Dh)`` against ``k (B, Hkv, 1, Sk, Dh)``.
    """

    name = "math"

    @staticmethod
    def _scores(q: Tensor, k: Tensor, causal: bool, scale: float) -> Tensor:
        b, h, lq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        acc = accumulation_dtype(q.dtype)
        qg = q.to(acc).view(b, hkv, h // hkv, lq, d)  # (B, Hkv, g, Lq, Dh)
        s = qg @ k.to(acc)[:, :, None].transpose(-1, -2) * scale  # (B, Hkv, g, Lq, Sk)
        if causal:
            _, above = masks.causality(True, lq, sk, device=q.device)  # (Lq, Sk) True = blocked, or None
            if above is not None:
                s = s.masked_fill(above, float("-inf"))
        return s

    def forward(self, q, k, v, *, causal, scale):
        b, h, lq, _ = q.shape
        s = self._scores(q, k, causal, scale)  # (B, Hkv, g, Lq, Sk)
        lse = s.logsumexp(-1)  # (B, Hkv, g, Lq)
        p = torch.exp(s - lse[..., None])
        out = p @ v.to(p.dtype)[:, :, None]  # (B, Hkv, g, Lq, Dv)
        return out.reshape(b, h, lq, -1).to(q.dtype), lse.reshape(b, h, lq)

    def backward(self, dout, q, k, v, out, lse, *, causal, scale):
        b, h, lq, d = q.shape
        hkv = k.shape[1]
        g = h // hkv
        s = self._scores(q, k, causal, scale)  # (B, Hkv, g, Lq, Sk)
        acc = s.dtype
        p = torch.exp(s - lse.to(acc).view(b, hkv, g, lq, 1))
        do = dout.to(acc).view(b, hkv, g, lq, -1)  # (B, Hkv, g, Lq, Dv)
        o = out.to(acc).view(b, hkv, g, lq, -1)
        vg = v.to(acc)[:, :, None]  # (B, Hkv, 1, Sk, Dv)
        dv = (p.transpose(-1, -2) @ do).sum(2)  # (B, Hkv, Sk, Dv)
        dp = do @ vg.transpose(-1, -2)  # (B, Hkv, g, Lq, Sk)
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        dq = (ds @ k.to(acc)[:, :, None]) * scale  # (B, Hkv, g, Lq, Dh)
        dk = (ds.transpose(-1, -2) @ q.to(acc).view(b, hkv, g, lq, d)).sum(2) * scale  # (B, Hkv, Sk, Dh)
        return dq.reshape(b, h, lq, d).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class CpuFlashKernel:
    """``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward (float32, float64, bf16, fp16).

    The CPU op handles grouped-query attention itself (``dk, dv`` come back with Hkv heads).
    """

    name = "flash"

    def forward(self, q, k, v, *, causal, scale):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, *, causal, scale):
        lse = lse.to(accumulation_dtype(q.dtype)).contiguous()
        dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, causal, scale=scale
        )
        return dq, dk, dv


class CudaFlashKernel:
    """``aten._scaled_dot_product_flash_attention`` (FlashAttention-2; fp16/bf16, Dh ≤ 256) and backward.

    Key/value heads are repeated for grouped-query attention and their gradients summed back.
    Not exercised by the CPU test-suite.
    """

    name = "flash"

    def forward(self, q, k, v, *, causal, scale):
        res = aten._scaled_dot_product_flash_attention(
            q, repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1]), 0.0, causal, False, scale=scale
        )
        return res[0], res[1]

    def backward(self, dout, q, k, v, out, lse, *, causal, scale):
        g = q.shape[1] // k.shape[1]
        ke, ve = repeat_kv(k, q.shape[1]).contiguous(), repeat_kv(v, q.shape[1]).contiguous()
        seed = torch.zeros(2, dtype=torch.uint64, device=q.device)  # unused without dropout
        offset = torch.zeros((), dtype=torch.uint64, device=q.device)
        dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
            dout,
            q,
            ke,
            ve,
            out,
            lse.float().contiguous(),
            None,
            None,
            q.shape[2],
            k.shape[2],
            0.0,
            causal,
            seed,
            offset,
            scale=scale,
        )
        return dq, _sum_groups(dk, g), _sum_groups(dv, g)


class CudaEfficientKernel:
    """``aten._scaled_dot_product_efficient_attention`` (memory-efficient, xFormers; fp32/fp16/bf16).

    Its log-sum-exp comes back padded to a multiple of 32 query rows; the padding is cut here and put
    back (as zeros, never read) for the backward. Not exercised by the CPU test-suite.
    """

    name = "efficient"

    def forward(self, q, k, v, *, causal, scale):
        res = aten._scaled_dot_product_efficient_attention(
            q, repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1]), None, True, 0.0, causal, scale=scale
        )
        return res[0], res[1][..., : q.shape[2]]

    def backward(self, dout, q, k, v, out, lse, *, causal, scale):
        g = q.shape[1] // k.shape[1]
        ke, ve = repeat_kv(k, q.shape[1]).contiguous(), repeat_kv(v, q.shape[1]).contiguous()
        lq = q.shape[2]
        padded = F.pad(lse.float(), (0, (-lq) % 32)).contiguous()  # (B, H, ⌈Lq/32⌉·32)
        zero = torch.zeros((), dtype=torch.int64, device=q.device)  # philox seed/offset, unused
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            dout, q, ke, ve, None, out, padded, zero, zero, 0.0, [True, True, True, False], causal, scale=scale
        )
        return dq, _sum_groups(dk, g), _sum_groups(dv, g)


def resolve_kernel(kernel: str | BlockKernel | None, device: torch.device, dtype: torch.dtype) -> BlockKernel:
    """Pick a block kernel.

    Args:
        kernel: None or ``"auto"`` (CPU: the CPU flash kernel; CUDA: flash for fp16/bf16, efficient for
            fp32, math for float64), ``"math"``, ``"flash"``, ``"efficient"`` (CUDA only), or an object
            with ``forward`` and ``backward`` (see the module docstring).
    Raises:
        ValueError: an unknown name, or ``"efficient"`` on a CPU tensor.
    """
    if kernel is not None and not isinstance(kernel, str):
        if not (callable(getattr(kernel, "forward", None)) and callable(getattr(kernel, "backward", None))):
            raise TypeError(
                f"kernel: expected a name in {KERNEL_NAMES} or an object with forward() and "
                f"backward(), got {type(kernel).__name__}"
            )
        return kernel
    name = kernel or "auto"
    if name not in KERNEL_NAMES:
        raise ValueError(f"kernel: expected one of {KERNEL_NAMES} or a kernel object, got {name!r}")
    cuda = device.type == "cuda"
    if name == "auto":
        if not cuda:
            name = "flash" if device.type == "cpu" else "math"
        elif dtype in (torch.float16, torch.bfloat16):
            name = "flash"
        else:
            name = "efficient" if dtype == torch.float32 else "math"
    if name == "math":
        return MathKernel()
    if name == "flash":
        return CudaFlashKernel() if cuda else CpuFlashKernel()
    if not cuda:
        raise ValueError(f"kernel: 'efficient' needs CUDA tensors, got tensors on {device}")
    return CudaEfficientKernel()
