"""What this machine is and has: the one reader of the CPU's name (for the lines that state where a measurement ran)
and the one reader of the memory free for new tensors (for the batched engine's batches and a model's default
memory budget)."""

from __future__ import annotations

import os
import platform

__all__ = ["cpu_name", "free_memory"]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name``, else the platform's, else ``"this CPU"``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "this CPU"


def free_memory(device=None) -> int:
    """Bytes free for new tensors on ``device``: a CUDA device's free memory, else the host's available memory
    (``MemAvailable`` of ``/proc/meminfo``: free memory plus the page cache the kernel can drop; else the free pages;
    4 GiB where neither can be read)."""
    if device is not None:
        import torch

        if torch.device(device).type == "cuda":
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 4 << 30
