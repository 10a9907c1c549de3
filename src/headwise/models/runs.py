"""Runs of models opened layer by layer, recorded on this machine: what ``headwise size --memory`` states beside the
rows it extrapolates from measured rates.

A command that ran a model layer by layer (``heads``, ``patch``, ``circuit``, from the command line) appends one JSON
line to ``runs.jsonl`` in headwise's state directory (:func:`state_root`: a history, not a cache — ``--no-cache``
writes nothing to the cache directory, and a cleared cache keeps it): the model's name and
parameter count, the command, the budget, the process's peak resident memory (``ru_maxrss``: the whole process, at the
end of the run), the run's seconds after the model opened, the stored bytes a pass reads and the CPU. A machine whose
state directory cannot be written records nothing (the run itself is not affected).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

__all__ = ["RUNS", "record_run", "recorded_runs", "runs_path", "state_root"]

#: The file's name in the cache directory.
RUNS = "runs.jsonl"


def state_root() -> Path:
    """headwise's state directory: ``$HEADWISE_STATE_DIR``, ``$XDG_STATE_HOME/headwise`` or
    ``~/.local/state/headwise`` (the XDG base directories' place for a history that outlives a cache)."""
    import os

    if os.environ.get("HEADWISE_STATE_DIR"):
        return Path(os.environ["HEADWISE_STATE_DIR"]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base).expanduser() / "headwise"


def runs_path() -> Path:
    """Where the runs are recorded: ``<state directory>/runs.jsonl``."""
    return state_root() / RUNS


def record_run(hm, command: str, seconds: float, *, path: Path | None = None) -> dict | None:
    """Append the run of ``command`` on ``hm`` (opened layer by layer) to the runs file; returns the record (None: not
    recorded — a model opened whole, or a file that cannot be written)."""
    stream = getattr(hm, "stream", None)
    if stream is None:
        return None
    from headwise._machine import cpu_name
    from headwise.models.memory import peak_rss

    parameters = sum(p.numel() for metas in stream._meta.values() for p in metas.values())
    record = {
        "model": hm.name, "parameters": int(parameters), "command": command, "budget": int(hm.memory.budget),
        "peak": int(peak_rss()), "seconds": round(float(seconds), 1),
        "stored_bytes": int(sum(stream.stored_bytes.values())), "cpu": cpu_name(),
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip
    from headwise._io import append_line

    target = path or runs_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        append_line(target, json.dumps(record))
    except OSError:
        return None
    return record


def recorded_runs(parameters: int, *, path: Path | None = None, tolerance: float = 0.002) -> list[dict]:
    """The runs recorded of a model of ``parameters`` parameters (within ``tolerance`` relative), newest last; lines
    that are not a run's record are skipped."""
    target = path or runs_path()
    try:
        lines = target.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    runs = []
    for line in lines:
        try:
            run = json.loads(line)
            n = int(run["parameters"])
        except (ValueError, KeyError, TypeError):
            continue
        if abs(n - parameters) <= tolerance * max(parameters, 1):
            runs.append(run)
    return runs
