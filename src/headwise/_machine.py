"""What this machine is, for the lines that state where a measurement ran: the one reader of the CPU's name."""

from __future__ import annotations

import platform

__all__ = ["cpu_name"]


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
