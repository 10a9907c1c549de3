"""``headwise heads --no-cache``: the bundled SmolLM2 GGUF file (Q4_1, 135 M parameters) without a float32 cache.

    .venv/bin/python benchmarks/memory_gguf.py

Three fresh processes (as ``benchmarks/memory_layers.py`` runs them: each reads its own ``VmHWM`` and
``/proc/self/io``) on the same text: the cached route (the float32 safetensors copy in the cache, written first if it
is missing, headwise's Llama decoder), ``--no-cache`` whole (every layer de-quantised at once by the same reader) and
``--no-cache --max-memory 400MB`` (layer by layer: each layer's blocks de-quantised when it runs). Each ``heads.csv``
is compared with the cached route's (relative to max(1, |x|)); the files of the cache directory are counted before and
after the runs without a cache. The CPU and the load average are recorded with every result.

Writes ``benchmarks/results/memory_gguf.json``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from memory_layers import RESULTS, cpu_model, max_difference, run

CASES = {"cached": [], "no-cache": ["--no-cache"], "no-cache 400MB": ["--no-cache", "--max-memory", "400MB"]}


def cache_files() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from headwise.models.gguf import cache_root

    return sum(1 for p in (cache_root() / "gguf").rglob("*") if p.is_file()) if (cache_root() / "gguf").exists() else 0


def main() -> int:
    results: dict = {"cpu": cpu_model(), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in CASES.items():
            before = cache_files()
            out = Path(tmp) / name.replace(" ", "-")
            result = run(Path("smollm2"), out, None, extra=extra)
            result["cache_files_before_after"] = [before, cache_files()]
            if name != "cached":
                result["max_difference"] = max_difference(Path(tmp) / "cached" / "heads.csv", out / "heads.csv")
            results["runs"][name] = result
            print(name, {k: result[k] for k in ("seconds", "peak_bytes", "loadavg_before", "route")}, flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "memory_gguf.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
