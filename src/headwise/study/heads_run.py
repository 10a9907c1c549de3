"""The parts of ``headwise heads`` that are neither statistics nor terminal: the model opened for it, the route it
runs on, the command a pooled head view offers, what the pictures show, the one-line summaries, and the corpus run
and ``--importance`` together across the ranks of a ``torchrun`` launch (:func:`heads_across_ranks`).

Shape legend: NL layers, H heads, n tokens of the example, Q query bins of a pooled view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from headwise.distributed.ranks import ranks
from headwise.study.corpus_ranks import CorpusRun
from headwise.study.importance import estimated, importance_batches, importance_texts
from headwise.study.importance_ranks import estimate_across_ranks, importance_across_ranks
from headwise.study.options import HeadsOptions

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "COMMAND_TEXT_UP_TO",
    "RankedHeads",
    "drawn",
    "heads_across_ranks",
    "heads_backend",
    "importance_line",
    "open_heads_model",
    "sweep_note",
    "view_command",
    "view_note",
]


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
        ValueError: ``--model: …`` (one line): a missing or corrupt checkpoint, a cache that cannot be written;
            ``--max-memory: …``: a budget that is not a size or is too small, naming the smallest that works.
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
    except MemoryBudgetError as e:  # the user's budget named as given; the default's: the model does not fit
        said = " ".join(e.worded("--max-memory").split())  # the budget named as the command's option
        raise ValueError(("" if e.given else "--model: ") + said) from None
    except (OSError, ValueError) as e:  # FileNotFoundError included; OSError: the GGUF cache cannot be written
        raise ValueError(f"--model: {' '.join(str(e).split())}") from None
    for w in caught:  # a damaged cache entry rebuilt: one line each; other warnings as they were
        if issubclass(w.category, (CacheHealedWarning, CacheSkippedWarning)):
            warn(f"--model: {w.message}")
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return hm


#: Longest TEXT written out in the command a pooled head view shows (longer: the placeholder TEXT).
COMMAND_TEXT_UP_TO = 1000


def view_command(opts: HeadsOptions) -> tuple[str, str]:
    """The command line that draws the same example's chosen queries (``--queries-only``; a pooled head view appends
    ``--queries A:B``), and a line saying what a placeholder in it stands for. Only the options that choose the
    example appear."""
    import shlex

    text = opts.text
    args = ["headwise", "heads", "--model", shlex.quote(str(opts.model))]
    note = ""
    if not opts.cache:
        args.append("--no-cache")
    if text is not None and len(text) <= COMMAND_TEXT_UP_TO:
        args.append(shlex.quote(text))
    elif text is not None:
        args.append("TEXT")
        note = f"TEXT: the text this page was drawn from ({len(text):,} characters, not repeated here)."
    elif opts.corpus is not None:  # the example is the corpus's first line
        args += ["--corpus", shlex.quote(opts.corpus)]
    else:  # the example is the probe
        args += [
            "--probe-length", str(opts.probe_length), "--probe-repeats", str(opts.probe_repeats),
            "--seed", str(opts.seed),
        ]  # fmt: skip
    args += ["--queries-only", "--out", shlex.quote(str(opts.out))]  # the chosen rows alone: a bounded pass
    return " ".join(args), note


def heads_backend(opts: HeadsOptions) -> str:
    """``"headwise"`` for a plain statistics run (a Llama-family decoder then runs on headwise's own modules, without
    transformers' import time or the memory its modelling code holds — what lets a GGUF file opened without a cache
    run layer by layer in 0.5 GB), else ``"auto"``: ``--importance`` and ``--composition`` read Hugging Face
    internals. Under torchrun the ranks take the same route as one process does (their files equal its files, the
    recorded backend included)."""
    return "auto" if opts.importance or opts.composition else "headwise"


def drawn(view, tokens: list[str]) -> tuple[list[str], np.ndarray]:
    """The example's tokens and maps as drawn: every token, or one label per bin of the pooled overview."""
    if view.maps is not None:
        return list(tokens), view.maps
    bounds = view.bounds
    labels = [f"{a}–{b - 1}" for a, b in zip(bounds[:-1], bounds[1:])]
    return labels, view.pooled.astype(np.float32)


def view_note(view) -> dict:
    """What the pictures and the head view show, and what the statistics sampled, for heads.json and the terminal."""
    from headwise.analysis.corpus import js_row_budget

    n = view.n
    rows = js_row_budget(n, 32)
    note = (
        f"every metric uses every query row; the Jensen–Shannon map and MDS use {min(rows, n)} evenly spaced "
        f"query rows per sequence (of {n} in the example)"
    )
    data: dict = {"tokens": n, "js_rows_per_sequence": min(rows, n), "pooled": view.pooled is not None}
    if view.pooled is not None:
        bins = len(view.bounds) - 1
        data["bins"] = bins
        note += f"; heads.png and headview.html show the example pooled to {bins} × {bins} bins"
    if view.queries is not None:
        data["queries"] = list(view.queries)
        note += f"; headview_queries.html: queries {view.queries[0]}–{view.queries[1] - 1} at full resolution"
    data["note"] = note
    return data


def importance_line(result) -> str:
    """One line on an importance run: the intact objective, the costliest single head, half the heads removed (the
    estimate route: the costliest measured head and the estimate's agreement with the measured ones)."""
    if getattr(result, "estimate", None) is not None:
        return _estimate_line(result)
    top = np.unravel_index(np.argmax(result.ablation), result.ablation.shape)
    half = result.curves["importance"][len(result.removed) // 2]
    return (
        f"importance ({result.objective}, {result.num_sequences} sequences): intact {result.base_loss:.4f}; "
        f"removing L{top[0]} H{top[1]} alone costs most (+{result.ablation[top]:.4f}); "
        f"{int(result.removed[len(result.removed) // 2])} least important heads removed: {half:.4f}"
        + sweep_note(result.sweep)
    )


def _estimate_line(result) -> str:
    """:func:`importance_line` of the estimate route."""
    h = result.importance.shape[1]
    measured = np.where(np.isnan(result.ablation.ravel()), -np.inf, result.ablation.ravel())
    top = int(np.argmax(measured))
    a = result.agreement
    rho = "–" if a.get("spearman") is None else f"{a['spearman']:.2f}"
    worst = a.get("largest_error", {})
    k = len(result.removed) // 2
    return (
        f"importance ({result.objective}, {result.num_sequences} sequences): intact {result.base_loss:.4f}; every "
        f"head estimated, {len(result.measured)} measured exactly ({result.top_k} by |estimate|, "
        f"{len(result.measured) - result.top_k} at random): Spearman {rho}, top-{result.top_k} overlap "
        f"{a.get('top_k_overlap', 0):.0%}, largest error {abs(worst.get('error', 0.0)):.4f}; removing "
        f"L{top // h} H{top % h} alone costs most (+{measured[top]:.4f}); {int(result.removed[k])} heads removed "
        f"by the estimate: {result.curves['estimate'][k]:.4f}" + sweep_note(result.sweep)
    )


def sweep_note(sweep: dict) -> str:
    """What the batched sweep ran, for the summary line (nothing when it did not run)."""
    if not sweep.get("passes"):
        return ""
    budget = f", memory budget {sweep['memory_budget'] / 2**30:.1f} GiB" if sweep.get("memory_budget") else ""
    return (
        f"\n  sweep: {sweep['head_sets']} head sets in {sweep['passes']} passes of up to {sweep['copies']} copies"
        f"{budget}; work of {sweep['forward_equivalents']:.0f} plain forwards; {sweep['seconds']:.1f} s"
    )


@dataclass
class RankedHeads:
    """What :func:`heads_across_ranks` found on this rank.

    Attributes:
        heads: rank 0: the corpus run's :class:`~headwise.study.DecoderHeads` (an encoder: its
            :class:`~headwise.analysis.HeadReport`); other ranks: None.
        importance: rank 0, with ``--importance``: the :class:`~headwise.analysis.importance.ImportanceResult`
            measured across the ranks; else None.
        lines: rank 0: what the ranks did, one line each (for the terminal); other ranks: none.
    """

    heads: object
    importance: object
    lines: list[str]


def heads_across_ranks(
    hm: HeadModel,
    opts: HeadsOptions,
    corpus: Callable[[Callable[[int, int], None] | None], CorpusRun],
    probe,
    *,
    progress: Callable[[int, int], None] | None = None,
    importance_progress: Callable[[str, int, int], None] | None = None,
) -> RankedHeads:
    """Under torchrun: ``corpus(progress)`` (:func:`~headwise.study.corpus_heads` or
    :func:`~headwise.study.encoder_corpus`: the documents split, resumable from ``--out``'s shards), then
    ``--importance``'s batches split (:func:`~headwise.study.importance_across_ranks`, batches of the corpus run's
    batch size), in one gloo group (:func:`headwise.distributed.ranks.ranks`).

    Args:
        hm: the model; opts: the options; corpus: the corpus run, given its ``progress(done, total)``; probe: a
            decoder's probe (the importance's sequences without a tokenizer), None for an encoder.
        progress: ``(shards done, this rank's shards)``; importance_progress: the importance's ``(stage, done,
            total)`` (:func:`~headwise.study.importance_across_ranks`).
    Raises:
        ValueError: one line on every rank (see the runs); CollectiveTimeout: a stalled rank.
    """
    with ranks():
        run = corpus(progress)
        ranked = None
        if opts.importance:
            lines = importance_texts(opts)  # rank 0 reads them again, warning once
            batches = importance_batches(hm, lines, probe, run.batch_size, lambda m: None)
            if estimated(hm, opts, lambda m: None):
                ranked = estimate_across_ranks(
                    hm, batches, seed=opts.seed, mode=opts.ablation, top_k=opts.top_k, progress=importance_progress
                )
            else:
                ranked = importance_across_ranks(
                    hm, batches, seed=opts.seed, mode=opts.ablation, out=opts.out, progress=importance_progress
                )
    if run.heads is None:
        return RankedHeads(None, None, [])
    said = [
        f"{run.world_size} ranks, {run.documents} documents; rank 0: {len(run.computed)} shard(s) computed, "
        f"{len(run.resumed)} resumed from {opts.out / 'shards'}"
    ]
    if ranked is not None:
        said.append(
            f"importance across {ranked.world_size} ranks: rank 0 measured {len(ranked.batches)} of the batches; "
            f"{ranked.payload_bytes:,} bytes all-reduced"
        )
    return RankedHeads(run.heads, None if ranked is None else ranked.result, said)
