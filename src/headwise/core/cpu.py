"""What this CPU can do, as the libraries that compute on it see it: read once, asked by every fast path.

A fast path that assumes the developer's CPU crashes on a user's: oneDNN's bf16 linear on a CPU without
AVX-512 fails with "could not create a primitive descriptor". So, as PyTorch checks
``mkldnn_bf16_device_check()`` before its own oneDNN bf16 kernels, each fast path of the core asks
:func:`capabilities` before it is taken and otherwise takes the plain torch route (``F.linear``, ``torch.matmul``),
which computes the same numbers up to round-off on every CPU.

What is read, and what overrides it (each library's own environment variable, set before it first runs):

- oneDNN's bf16 (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``): AVX-512 core, AMX, or Arm's bf16 — the
  ISA oneDNN will use, so ``ONEDNN_MAX_CPU_ISA=AVX2`` turns it off on an AVX-512 machine (a laptop-class
  CPU emulated; ``make test-avx2``). oneDNN's fp16 is read for the record; no fast path computes fp16.
- ATen's vector capability (``torch.backends.cpu.get_cpu_capability()``: ``"AVX512"``, ``"AVX2"``, ``"DEFAULT"``
  …; ``ATEN_CPU_CAPABILITY``): the kernels ATen dispatches to. ATen picks a kernel the CPU has, so no fast
  path needs it to decide; it is read for the record.
- Numba's target (:func:`numba_target`, ``NUMBA_CPU_NAME``; ``generic`` compiles for any x86-64): the compiled
  kernels (:mod:`headwise.core.kernels`) are built for it, and Numba's on-disk cache keys each entry by the
  target's name and features, so a cache compiled for one CPU is never loaded for another.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

__all__ = ["CPU", "capabilities", "numba_target"]


@dataclass(frozen=True)
class CPU:
    """What the CPU computes, as torch and oneDNN see it in this process.

    Attributes:
        aten: ATen's vector capability, ``"AVX512"``, ``"AVX2"``, ``"DEFAULT"`` (``ATEN_CPU_CAPABILITY`` counts).
        onednn: oneDNN is built in, with the fused linear operator ``torch.ops.mkldnn._linear_pointwise``.
        onednn_bf16: oneDNN computes bf16 products here (its ISA at AVX-512 core or above, AMX, Arm's bf16);
            ``ONEDNN_MAX_CPU_ISA`` counts.
        onednn_fp16: oneDNN computes fp16 products here (for the record: no fast path takes fp16).
    """

    aten: str
    onednn: bool
    onednn_bf16: bool
    onednn_fp16: bool

    @property
    def linear_dtypes(self) -> tuple[torch.dtype, ...]:
        """The dtypes oneDNN's fused linear is taken for: float32 wherever oneDNN is built, bf16 where it
        computes bf16; none without oneDNN."""
        if not self.onednn:
            return ()
        return (torch.float32, torch.bfloat16) if self.onednn_bf16 else (torch.float32,)

    @property
    def bf16_products(self) -> bool:
        """Whether a bf16 matrix product reads its bf16 operands at about their bytes' cost: oneDNN computes bf16
        (``brg_matmul:avx512_core_bf16`` with bf16 dot-product instructions or AMX; ``gemm:jit:bf16`` widening in
        registers on any AVX-512 CPU, measured with ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``, docs/performance.md).
        Elsewhere ATen's reference bf16 product runs, far slower than widening to float32 first."""
        return self.onednn_bf16


def _ask(probe) -> bool:
    try:
        return bool(probe())
    except (AttributeError, RuntimeError):  # pragma: no cover - a build without the operator
        return False


@functools.cache
def capabilities() -> CPU:
    """This process's :class:`CPU`, read on first use and kept (the libraries read their environment once too)."""
    onednn = _ask(lambda: torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))
    return CPU(
        aten=torch.backends.cpu.get_cpu_capability(),
        onednn=onednn,
        onednn_bf16=onednn and _ask(torch.ops.mkldnn._is_mkldnn_bf16_supported),
        onednn_fp16=onednn and _ask(torch.ops.mkldnn._is_mkldnn_fp16_supported),
    )


@functools.cache
def numba_target() -> str | None:
    """The CPU Numba compiles the kernels for: ``NUMBA_CPU_NAME`` (``"generic"``: any x86-64) or the host's name
    (``"znver5"``); None where Numba does not import. Imports Numba, so it is asked only where the kernels run."""
    try:
        import llvmlite.binding as ll
        from numba.core import config
    except Exception:  # pragma: no cover - Numba missing or broken on this platform
        return None
    return config.CPU_NAME or ll.get_host_cpu_name()
