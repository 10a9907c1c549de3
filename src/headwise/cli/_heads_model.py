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


def decoder_report(hm, batches: Iterable[tuple], probe, *, layer_check=None, progress=None):
    """Stream ``(ids, mask)`` batches and the probe into a :class:`DecoderReport`.

    Returns:
        ``(report, example)``: the report and the first sequence's ``(ids, (NL, H, n, n) maps)``.
    """
    from headwise.analysis import DecoderStats, DetectorStats

    stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
    example = None
    texts = 0
    for ids, mask in batches:
        maps = hm.attentions(ids, mask)
        stats.update(maps, ids.numpy(), _info(mask))
        if example is None:
            n = int(mask[0].sum())
            example = (ids[0, :n].tolist(), np.stack([m[0, :, :n, :n] for m in maps]).astype(np.float32))
        texts += ids.shape[0]
        if progress is not None:
            progress(texts, stats.num_tokens)
    detectors = DetectorStats(hm.num_layers, hm.num_heads)
    ids = probe_ids(hm, probe)
    for start in range(0, ids.shape[0], 4):
        chunk = ids[start : start + 4]
        mask = np.ones(chunk.shape, dtype=np.int64)
        detectors.update(hm.attentions(chunk, None), chunk.numpy(), _info(mask))
    return stats.result(detectors.result(), probe), example


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
