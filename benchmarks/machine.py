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


def instruction_set() -> dict:
    """What the kernels may use here, which can be less than the CPU has: ATen's capability
    (``ATEN_CPU_CAPABILITY`` lowers it), oneDNN's bf16 (``ONEDNN_MAX_CPU_ISA`` lowers it), and the lowering asked
    for in the environment — so a run held to AVX2 on an AVX-512 machine says so."""
    try:
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        bf16 = False
    held = {
        k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "NUMBA_CPU_NAME") if k in os.environ
    }
    return {"aten": torch.backends.cpu.get_cpu_capability(), "onednn_bf16": bf16, "held_by": held}


def kind() -> str:
    """The CPU kind a result belongs to: the model name and the instruction set the kernels used, e.g.
    ``AMD EPYC · AVX512, oneDNN bf16`` or ``AMD EPYC · AVX2 (held by ATEN_CPU_CAPABILITY=avx2, …; the CPU has
    AVX-512)``. Two machines of one model name but different vector units (Zen 4 without AVX-512 exposed, Zen 5)
    are different kinds."""
    isa = instruction_set()
    label = f"{cpu_model()} · {isa['aten']}" + (", oneDNN bf16" if isa["onednn_bf16"] else ", no oneDNN bf16")
    if isa["held_by"]:
        has = "AVX-512" if any(f.startswith("avx512") for f in cpu_flags()) else "no AVX-512"
        label += f" (held by {', '.join(f'{k}={v}' for k, v in isa['held_by'].items())}; the CPU has {has})"
    return label


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
        "instruction_set": instruction_set(),
        "kind": kind(),
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
