"""``headwise heads --model DIR`` for any local checkpoint: decoders, the probe, importance and pruning.

The decoder flow (statistics over TEXT / a corpus / the probe, the detectors, the pictures) and the
importance outputs shared with encoders. Thin: the work is in :mod:`headwise.analysis`; this file
parses nothing and prints through rich.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from headwise.cli._app import CLIError

#: Decoder table columns: (metric, header, format).
DECODER_COLUMNS = (
    ("prev", "prev", "{:.2f}"),
    ("first", "first", "{:.2f}"),
    ("duplicate_probe", "dup·p", "{:.2f}"),
    ("induction_probe", "ind·p", "{:.2f}"),
    ("induction", "ind", "{:.2f}"),
    ("self", "self", "{:.2f}"),
    ("entropy", "H nats", "{:.2f}"),
    ("entropy_ratio_causal", "H/ln m", "{:.2f}"),
    ("distance", "dist", "{:.1f}"),
    ("confidence", "conf", "{:.2f}"),
)
#: Outputs of ``--importance``.
IMPORTANCE_OUTPUTS = ("pruning.png", "pruning.csv")


def load(source: str | Path | None, *, cache: bool = True):
    """The :class:`~headwise.models.HeadModel` of ``--model`` (a folder, a GGUF file, a bundled name; None: the
    bundled encoder), opened once through :func:`headwise.models.open_model`; errors as one line."""
    from headwise.models import open_model

    try:
        return open_model(source, cache=cache)
    except (OSError, ValueError) as e:  # FileNotFoundError included; OSError: the GGUF cache cannot be written
        raise CLIError(f"--model: {' '.join(str(e).split())}") from None


def make_probe(hm, *, length: int, repeats: int, seed: int):
    """The probe for ``hm``: the segment shortened to fit the model's positions (BOS included)."""
    from headwise.analysis import Probe

    bos = hm.bos_id if hm.tokenizer is not None else None
    room = (hm.max_length - (bos is not None)) // repeats
    if room < 2:
        raise CLIError(f"--probe-repeats: {repeats} copies do not fit the model's {hm.max_length} positions")
    usable = hm.vocab_size - len(hm.special_ids)
    n = min(length, room, usable)
    if n < 2:
        raise CLIError(f"--probe-length: the model has only {usable} usable token ids")
    return Probe(length=n, repeats=repeats, batch=8, seed=seed, bos=bos)


def probe_ids(hm, probe):
    import torch

    from headwise.analysis import repeated_random_tokens

    return torch.from_numpy(repeated_random_tokens(hm.vocab_size, probe, exclude=hm.special_ids))


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    batch: list = []
    for x in items:
        batch.append(x)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def check_length(hm, text: str) -> int:
    """The tokens of TEXT; CLIError (one line) when it is longer than the model's context."""
    n = len(hm.tokenizer.encode(text).ids)
    if n > hm.max_length:
        raise CLIError(f"TEXT: {n:,} tokens, longer than the model's context of {hm.max_length:,} tokens")
    return n


def parse_queries(value: str | None, n: int) -> tuple[int, int] | None:
    """``--queries A:B`` as ``(A, B)`` within the example's n tokens (at most :data:`MAX_QUERIES`)."""
    if value is None:
        return None
    try:
        a, b = (int(x) for x in value.split(":"))
    except ValueError:
        raise CLIError(f"--queries: expected A:B (two integers), got {value!r}") from None
    if not 0 <= a < b <= n:
        raise CLIError(f"--queries: expected 0 ≤ A < B ≤ {n} (the example's tokens), got {value}")
    if b - a > MAX_QUERIES:
        raise CLIError(f"--queries: at most {MAX_QUERIES} queries at full resolution, got {b - a} ({value})")
    return a, b


def text_batches(hm, texts: Iterable[str], batch_size: int, warn) -> Iterator[tuple]:
    """``(ids, mask)`` per batch of texts; truncation warnings go to ``warn`` (one summary)."""
    from headwise.models import TruncationWarning

    cut = 0
    for batch in _chunks(texts, batch_size):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TruncationWarning)
            enc = hm.encode(batch)
        cut += sum(issubclass(w.category, TruncationWarning) for w in caught)
        yield enc.ids, enc.mask
    if cut:
        warn(f"{cut} text(s) longer than {hm.max_length} tokens were truncated to {hm.max_length}")


def _info(mask):
    from headwise.analysis import TokenInfo

    m = np.asarray(mask, dtype=bool)
    return TokenInfo.plain(m.shape[0], m.shape[1], m.sum(axis=1))


#: Longest example drawn at full resolution in heads.png / headview.html; a longer one is drawn pooled.
VIEW_FULL_UP_TO = 256
#: Bins per side of the pooled overview of a long example (tokens per bin: n / 128).
VIEW_BINS = 128
#: Probe sequences per forward pass (the default probe's 8 in one: 15 % faster than two of 4 on SmolLM2).
PROBE_CHUNK = 8
#: Most queries ``--queries`` may keep at full resolution (the kept block is NL · H · (B − A)² floats).
MAX_QUERIES = 512


def decoder_report(
    hm, batches: Iterable[tuple], probe, *, progress=None, block_size=None, queries=None, row_progress=None
):
    """Stream ``(ids, mask)`` batches and the probe into a :class:`DecoderReport`, every head's statistics
    reduced inside attention a block of query rows at a time (:func:`headwise.analysis.streaming.read_rows`).

    Args:
        queries: ``(A, B)``: the first sequence's queries kept at full resolution (None: none).
        row_progress: ``(layer, rows done, L)`` after every block (long inputs).
    Returns:
        ``(report, example)``: the report and the first sequence's ``(ids, view)``: ``view`` holds ``maps``
        ``(NL, H, n, n)`` for n ≤ :data:`VIEW_FULL_UP_TO`, else ``pooled`` ``(NL, H, P, P)`` with its ``bounds``,
        and ``kept`` ``(NL, H, B − A, B − A)`` for ``queries``.
    """
    from headwise.analysis import DecoderStats, DetectorStats
    from headwise.analysis.streaming import read_rows

    stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
    example = None
    texts = 0
    for ids, mask in batches:
        first = example is None
        n = int(mask[0].sum())
        pool = VIEW_BINS if first and n > VIEW_FULL_UP_TO else None
        keep = queries if first else None
        reader = read_rows(
            hm, ids, mask, head_stats=stats.heads, detector_stats=stats.detectors, block_size=block_size,
            progress=row_progress, pool=pool, keep=keep,
        )  # fmt: skip
        if first:
            example = (ids[0, :n].tolist(), _view(hm, ids, mask, n, reader))
        texts += ids.shape[0]
        if progress is not None:
            progress(texts, stats.num_tokens)
    detectors = DetectorStats(hm.num_layers, hm.num_heads)
    ids = probe_ids(hm, probe)
    for start in range(0, ids.shape[0], PROBE_CHUNK):
        chunk = ids[start : start + PROBE_CHUNK]
        read_rows(hm, chunk, None, detector_stats=detectors, block_size=block_size)
    return stats.result(detectors.result(), probe), example


def _view(hm, ids, mask, n: int, reader) -> dict:
    view: dict = {"n": n}
    if reader.pooled is None:
        maps = hm.attentions(ids[:1, :n], mask[:1, :n])  # bounded: n ≤ VIEW_FULL_UP_TO
        view["maps"] = np.stack([m[0] for m in maps]).astype(np.float32)
    else:
        view["pooled"], view["bounds"] = reader.pooled_maps()
    if reader.kept is not None:
        view["kept"], view["queries"] = reader.kept.numpy(), reader.keep
    return view


def example_view(hm, ids, mask, *, queries=None, block_size=None, row_progress=None) -> tuple[list[int], dict]:
    """The first sequence's picture alone (one pass, no statistics): ``(ids, view)`` as :func:`decoder_report`."""
    from headwise.analysis.streaming import read_rows

    n = int(mask[0].sum())
    pool = VIEW_BINS if n > VIEW_FULL_UP_TO else None
    if pool is None and queries is None:
        return ids[0, :n].tolist(), _view(hm, ids, mask, n, type("NoRows", (), {"pooled": None, "kept": None}))
    reader = read_rows(
        hm, ids[:1], mask[:1], block_size=block_size, progress=row_progress, pool=pool, keep=queries
    )  # fmt: skip
    return ids[0, :n].tolist(), _view(hm, ids, mask, n, reader)


def importance_batches(hm, texts: list[str] | None, probe, batch_size: int, warn) -> list[tuple]:
    """``(ids, mask)`` pairs: the texts', or the probe's when there are none."""
    import torch

    if texts:
        return list(text_batches(hm, texts, batch_size, warn))
    ids = probe_ids(hm, probe)
    return [(ids[s : s + batch_size], torch.ones_like(ids[s : s + batch_size])) for s in range(0, len(ids), batch_size)]


def run_importance(
    hm,
    batches,
    *,
    seed: int,
    out: Path,
    title: str,
    scored: str | None = None,
    eval_batches=None,
    random_orders: int = 3,
    points: int = 33,
):
    """Importance, ablation and pruning curves (:func:`headwise.analysis.head_importance`); writes
    :data:`IMPORTANCE_OUTPUTS` into ``out``. The one path of ``headwise heads --importance`` and
    ``headwise lab prune``.

    Returns:
        ``(result, columns for heads.json / heads.csv, paths)``.
    """
    from headwise.analysis import head_importance
    from headwise.cli._progress import stage_progress
    from headwise.viz.pruning import plot_pruning, write_pruning_csv

    ablate = None
    if hm.backend == "hf+headwise":
        import headwise.hf

        def ablate(spec):
            return headwise.hf.ablate(hm.model, spec, mode="zero")

    with stage_progress() as progress:
        result = head_importance(
            hm,
            batches,
            scored=scored,
            eval_batches=eval_batches,
            random_orders=random_orders,
            seed=seed,
            points=points,
            ablate=ablate,
            progress=progress,
        )
    columns = {
        "importance": result.importance,
        "importance_norm": result.importance_norm,
        "ablation_delta": result.ablation,
    }
    paths = {
        "pruning.png": plot_pruning(result, out / "pruning.png", title=f"{title} — {result.objective}").path,
        "pruning.csv": write_pruning_csv(result, out / "pruning.csv"),
    }
    return result, columns, paths


def importance_summary(result) -> dict:
    """The importance run's settings and headline numbers for ``heads.json``."""
    n = result.importance.size
    half = int(np.searchsorted(result.removed, n // 2))
    return {
        "objective": result.objective,
        "base_loss": result.base_loss,
        "sequences": result.num_sequences,
        "tokens": result.num_tokens,
        "random_seeds": list(result.random_seeds),
        "importance_convention": (
            "Michel et al. 2019: E_x |dL/dxi_h| at xi = 1, gate on the head's output where it enters the output "
            "projection; importance_norm divides by the layer's l2 norm"
            if result.kind == "decoder"
            else "encoder without an LM head: E_x ||(I - e e^T/|e|^2) de/dxi_h|| / |e| for the mean-pooled "
            "embedding e (the first-order turning rate; the cosine loss itself has zero gradient at xi = 1)"
        ),
        "half_removed": {
            "removed": int(result.removed[half]),
            **{k: float(v[half]) for k, v in result.curves.items()},
        },
    }
