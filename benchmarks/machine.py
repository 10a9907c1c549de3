"""Facts about the machine and the software, and where results go."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def cpuinfo(key: str) -> str | None:
    """The first ``key : value`` of ``/proc/cpuinfo`` (None off Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == key:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The vector-unit flags of the CPU (AVX2, FMA, AVX-512 kinds, AMX)."""
    flags = (cpuinfo("flags") or "").split()
    return sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma")))


def machine() -> dict:
    """Facts about this machine and the software, recorded in every result file."""
    import numpy

    try:
        import transformers

        tv = transformers.__version__
    except ImportError:  # pragma: no cover
        tv = None
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):  # pragma: no cover
        mem_gb = None
    return {
        "cpu": cpu_model(),
        "cpu_family": cpuinfo("cpu family"),
        "cpu_flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": mem_gb,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "transformers": tv,
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def command() -> str:
    """The command line that produced a result, as typed from the repository root."""
    argv = [os.path.relpath(sys.argv[0], ROOT) if sys.argv[0].endswith(".py") else sys.argv[0], *sys.argv[1:]]
    return " ".join([".venv/bin/python", *argv])


def write_json(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically (temporary name in the same folder, then ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def log(msg: str) -> None:
    print(msg, flush=True)
