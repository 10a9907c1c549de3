"""What a heads study feeds a model: texts in batches, the probe of repeated random tokens, the queries kept.

Each takes an opened model (:class:`headwise.models.HeadModel`: its tokenizer, ``max_length``, ``vocab_size``,
``special_ids``, ``encode``); errors are ValueErrors naming the option (:class:`headwise.study.HeadsOptions`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "MAX_QUERIES",
    "check_length",
    "first_lines",
    "make_probe",
    "parse_queries",
    "probe_batches",
    "probe_ids",
    "text_batches",
]

#: Most queries ``--queries`` may keep at full resolution (the kept block is NL · H · (B − A)² floats).
MAX_QUERIES = 512


def make_probe(hm: HeadModel, *, length: int, repeats: int, seed: int):
    """The :class:`~headwise.analysis.Probe` for ``hm``: the segment shortened to fit the model's positions (BOS
    included), 8 sequences.

    Raises:
        ValueError: ``repeats`` copies of two tokens do not fit ``hm.max_length`` (``--probe-repeats``), or the
            model has fewer than two usable token ids (``--probe-length``).
    """
    from headwise.analysis import Probe

    bos = hm.bos_id if hm.tokenizer is not None else None
    room = (hm.max_length - (bos is not None)) // repeats
    if room < 2:
        raise ValueError(f"--probe-repeats: {repeats} copies do not fit the model's {hm.max_length} positions")
    usable = hm.vocab_size - len(hm.special_ids)
    n = min(length, room, usable)
    if n < 2:
        raise ValueError(f"--probe-length: the model has only {usable} usable token ids")
    return Probe(length=n, repeats=repeats, batch=8, seed=seed, bos=bos)


def probe_ids(hm: HeadModel, probe):
    """The probe's token ids ``(probe.batch, probe.total_length)`` (int64), the model's special ids excluded."""
    import torch

    from headwise.analysis import repeated_random_tokens

    return torch.from_numpy(repeated_random_tokens(hm.vocab_size, probe, exclude=hm.special_ids))


def probe_batches(hm: HeadModel, probe, batch_size: int) -> list[tuple]:
    """The probe as ``(ids (b, T), mask (b, T))`` batches of at most ``batch_size`` sequences (every token real)."""
    import torch

    ids = probe_ids(hm, probe)
    return [(ids[s : s + batch_size], torch.ones_like(ids[s : s + batch_size])) for s in range(0, len(ids), batch_size)]


def first_lines(corpus, count: int) -> list[str]:
    """The first ``count`` sentences of the corpus file ``corpus`` (:class:`~headwise.analysis.CorpusFile`: blank and
    undecodable lines skipped); none when ``corpus`` is None."""
    from itertools import islice

    from headwise.analysis import CorpusFile

    return [] if corpus is None else list(islice(CorpusFile(corpus), count))


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    batch: list = []
    for x in items:
        batch.append(x)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def check_length(hm: HeadModel, text: str) -> int:
    """The tokens of ``text``; ValueError (naming ``TEXT``) when it is longer than the model's context."""
    n = len(hm.tokenizer.encode(text).ids)
    if n > hm.max_length:
        raise ValueError(f"TEXT: {n:,} tokens, longer than the model's context of {hm.max_length:,} tokens")
    return n


def parse_queries(value: str | None, n: int) -> tuple[int, int] | None:
    """``--queries A:B`` as ``(A, B)`` within the example's ``n`` tokens (at most :data:`MAX_QUERIES`); None: None.

    Raises:
        ValueError: naming ``--queries``: not two integers, outside ``0 ≤ A < B ≤ n``, or more than
            :data:`MAX_QUERIES` queries.
    """
    if value is None:
        return None
    try:
        a, b = (int(x) for x in value.split(":"))
    except ValueError:
        raise ValueError(f"--queries: expected A:B (two integers), got {value!r}") from None
    if not 0 <= a < b <= n:
        raise ValueError(f"--queries: expected 0 ≤ A < B ≤ {n} (the example's tokens), got {value}")
    if b - a > MAX_QUERIES:
        raise ValueError(f"--queries: at most {MAX_QUERIES} queries at full resolution, got {b - a} ({value})")
    return a, b


def text_batches(hm: HeadModel, texts: Iterable[str], batch_size: int, warn: Callable[[str], None]) -> Iterator[tuple]:
    """``(ids (b, T), mask (b, T))`` per batch of ``batch_size`` texts, encoded by ``hm``; the texts cut to the
    model's context are counted and reported to ``warn`` once, after the last batch."""
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
