"""The model ``headwise heads`` reads: opened once through the one door, and the route it runs on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from headwise.study.options import HeadsOptions

__all__ = ["heads_backend", "open_heads_model"]


def open_heads_model(
    source: str | Path | None,
    *,
    cache: bool = True,
    backend: str = "auto",
    warn: Callable[[str], None],
    max_memory: str | None = None,
):
    """The :class:`~headwise.models.HeadModel` of ``--model`` (a folder, a GGUF file, a bundled name; None: the
    bundled encoder), opened once through :func:`headwise.models.open_model`; a rebuilt GGUF cache entry said to
    ``warn``.

    ``backend="headwise"``: a Llama-family checkpoint on headwise's own decoder (no transformers imported), any
    other on the default route (checked once: :class:`~headwise.models.sources.UnsupportedBackend` carries it).
    ``max_memory``: ``--max-memory`` (:func:`headwise.models.open_model`'s ``max_memory``).

    Raises:
        ValueError: ``--model: …`` (one line): a missing or corrupt checkpoint, a cache that cannot be written.
        MemoryBudgetError: a budget that is not a size or is too small, naming the smallest that works (carrying
            the budget; the command words it with its option).
    """
    import warnings

    from headwise.models import open_model
    from headwise.models.gguf import CacheHealedWarning, CacheSkippedWarning
    from headwise.models.memory import MemoryBudgetError
    from headwise.models.sources import UnsupportedBackend

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CacheHealedWarning)
            warnings.simplefilter("always", CacheSkippedWarning)
            try:
                hm = open_model(source, cache=cache, backend=backend, max_memory=max_memory)
            except UnsupportedBackend as e:
                hm = open_model(e.info, cache=cache, max_memory=max_memory)
    except MemoryBudgetError:  # carries the budget; the command words it with its option
        raise
    except (OSError, ValueError) as e:  # FileNotFoundError included; OSError: the GGUF cache cannot be written
        raise ValueError(f"--model: {' '.join(str(e).split())}") from None
    for w in caught:  # a damaged cache entry rebuilt: one line each; other warnings as they were
        if issubclass(w.category, (CacheHealedWarning, CacheSkippedWarning)):
            warn(f"--model: {w.message}")
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return hm


def heads_backend(opts: HeadsOptions) -> str:
    """``"headwise"``: a Llama-family decoder runs on headwise's own modules, without transformers' import time or the
    memory its modelling code holds (what lets a GGUF file opened without a cache run layer by layer in 0.5 GB) —
    the statistics, ``--importance`` and ``--composition`` alike (every tool reads the model through its anatomy;
    they equal the Hugging Face route to float precision); any other family takes the default route. Under torchrun
    the ranks take the same route as one process does (their files equal its files, the recorded backend
    included)."""
    return "headwise"
