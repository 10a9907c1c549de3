"""Streaming head statistics: every head's statistics reduced inside attention, a block of query rows at a time,
during one forward pass — never ``(H, L, L)`` for a layer.

Shape legend: B batch, L padded length (self-attention: S = L), NL layers, H query heads per layer,
N = NL · H, R rows of one block, S' keys a block can see (``stop`` for a causal block, else L), n real tokens of a
sentence, J sampled rows of the Jensen–Shannon sums.

Every statistic of :class:`~headwise.analysis.HeadStats` and :class:`~headwise.analysis.DetectorStats` is a sum
over query rows of something computed from one row of one head's attention, and that per-row maths is written
once, as the reducers of a :class:`~headwise.analysis.block.RowBlock` in the module of each metric's full-map
function (:func:`~headwise.analysis.targets.mass_on`, :func:`~headwise.analysis.targets.mass_at`,
:func:`~headwise.analysis.entropy.entropy_rows`, :func:`~headwise.analysis.distance.distance_rows`,
:func:`~headwise.analysis.confidence.row_max_offsets`, :func:`~headwise.analysis.detectors.pattern_mass`, …),
which the full maps call too.

A :class:`BlockPass` registers one hook per layer on the ``hook_qk`` points
(:class:`headwise.core.rows.AttentionRows`: post-rotary q and k with the model's scale, masks, causality, window,
sinks and soft-cap); each hook forms the rows a block at a time exactly as the model does (grouped-query heads per
query head), makes them a :class:`~headwise.analysis.block.RowBlock` (taken over the real keys, renormalised as
:func:`~headwise.analysis.tokens.as_attention` does) and hands it to the pass's readers, each one concern:
:class:`HeadSums` (per-sentence sums of the HeadStats metrics), :class:`DetectorSums` (the detectors and the
causal entropy ratio), :class:`PooledMaps` (the first sequence pooled for the overview) and :class:`KeptRows`
(full rows of a query range; alone, over that range only, it is the bounded pass of those rows). After the pass,
the sums go to the accumulators, which finish them as they finish full maps: the same numbers (tested to 1e-5
against the full-map computation over random layouts, masks, windows, sinks, padding and GQA).
:class:`RowReader` and :func:`read_rows` put the readers a call asks for into one pass, and the readers of other
concerns a caller adds (``extra=``: factories given the batch's :class:`Layout`, fed after the statistics' readers,
which they leave unchanged — the atlas's :class:`~headwise.analysis.evidence.HeadEvidence`). This module holds the
pass; the readers and the batch's :class:`Layout` they share live in :mod:`headwise.analysis.row_readers`.

What is exact, what is sampled. Every per-head metric (targets, self / previous / next, entropies, distance,
confidence, the argmax-offset histogram, the detectors, the causal entropy ratio) uses every real query row.
The Jensen–Shannon sums between heads compare every pair of the N heads row by row (N² · J · n work), so they
use J evenly spaced rows per sentence: :func:`read_rows` takes 32 (``js_max_rows``) up to 4,096 tokens, then
``131072 // n`` (16 at 8,192, 8 from 16,384), against the 128 of :class:`~headwise.analysis.HeadStats` on full maps.

Memory beyond the model's own forward (float32): one block's rows and their temporaries,
``≈ 6 · B · H · R · S' · 4`` bytes (R = ``block_size``, default :func:`default_block_size`: B · H · R · L ≤ 2²¹, or
R = 64 rows where that allows fewer, and never more than 2²³ elements unless that leaves fewer than 16 rows: about
50 MB up to B · H · L = 2¹⁵, at most 6 · 2²³ · 4 = 200 MB up to B · H · L = 2¹⁹, ``384 · B · H · L`` bytes beyond),
plus the sampled rows ``N · J · n · 4`` per sentence, the histogram ``N · (2L − 1) · 8`` and ``O(NL · B · H)`` sums.
Nothing grows as L².
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from headwise import checks
from headwise.analysis.block import RowBlock
from headwise.analysis.divergence import js_sums_torch
from headwise.analysis.entropy import CLARK_ENTROPY_SMOOTHING
from headwise.analysis.protocol import RowModel
from headwise.analysis.row_readers import DetectorSums, HeadSums, KeptRows, Layout, PooledMaps
from headwise.analysis.tokens import TokenInfo

__all__ = [
    "Layout",
    "BlockReader",
    "BlockPass",
    "HeadSums",
    "DetectorSums",
    "PooledMaps",
    "KeptRows",
    "RowReader",
    "read_rows",
    "default_block_size",
    "js_sums_torch",
    "BLOCK_ELEMENTS",
]

#: Elements of one block of rows, ``B · H · R · L``, when no block size is given (8 MB of float32: measured on
#: SmolLM2 at 1,024 tokens, blocks of 128–256 rows read 1.7 × faster than one block of 1,024, whose temporaries
#: are fresh pages on every call).
BLOCK_ELEMENTS = 1 << 21
#: Fewest rows of a default block (long inputs: per-block overhead against block memory; at 8,192 tokens and 9
#: heads, 64 rows read 1.3 × faster than 32 and 1.6 × faster than 128).
MIN_BLOCK_ROWS = 64
#: Most elements of a block of :data:`MIN_BLOCK_ROWS` rows (32 MB: past it every temporary is fresh pages; at
#: 32,768 tokens and 9 heads, 32 rows read 1.4 × faster than 64) ...
MAX_BLOCK_ELEMENTS = 1 << 23
#: ... and the fewest rows a default block has.
FEWEST_BLOCK_ROWS = 16


def default_block_size(batch: int, heads: int, length: int) -> int:
    """Query rows per block: as many as keep one block within :data:`BLOCK_ELEMENTS` weights; where that is fewer
    than :data:`MIN_BLOCK_ROWS`, that many unless a block would pass :data:`MAX_BLOCK_ELEMENTS` (then fewer, down to
    :data:`FEWEST_BLOCK_ROWS`); at most ``length``."""
    bhl = max(1, batch * heads * length)
    rows = BLOCK_ELEMENTS // bhl
    if rows < MIN_BLOCK_ROWS:
        rows = max(FEWEST_BLOCK_ROWS, min(MIN_BLOCK_ROWS, MAX_BLOCK_ELEMENTS // bhl))
    return max(1, min(length, rows))


class BlockReader(Protocol):
    """A reader of a :class:`BlockPass`: adds one block of one layer's rows to what it keeps."""

    def block(self, layer: int, block: RowBlock) -> None: ...


class BlockPass:
    """Every layer's rows, a block at a time, read at ``hook_qk`` and handed to each of ``parts``.

    Args:
        layout: the batch's :class:`Layout`; num_layers, num_heads: NL and H (query heads).
        parts: the :class:`BlockReader` s fed, in order.
        block_size: query rows per block (default :func:`default_block_size`).
        span: ``(A, B)``: form rows ``A … B − 1`` alone (None: every row).
        progress: called after every block with ``(layer, rows done in the layer, L)``.
    Raises:
        ValueError: a block size ≤ 0.
    """

    def __init__(
        self,
        layout: Layout,
        num_layers: int,
        num_heads: int,
        parts: Sequence[BlockReader],
        *,
        block_size: int | None = None,
        span: tuple[int, int] | None = None,
        progress: Callable[[int, int, int], None] | None = None,
    ):
        if block_size is not None:
            checks.positive_int("block_size", block_size)
        self.layout, self.num_layers, self.num_heads, self.parts = layout, num_layers, num_heads, list(parts)
        self.B, self.L = layout.B, layout.L
        self.block_size = block_size or default_block_size(layout.B, num_heads, layout.L)
        self.span, self.progress = span, progress
        self.layers_read = [False] * num_layers

    def readers(self) -> list[Callable]:
        """One hook per layer, for that layer's ``hook_qk`` point (what ``HeadModel.read_rows`` takes)."""
        return [functools.partial(self.read, layer) for layer in range(self.num_layers)]

    def read(self, layer: int, rows) -> None:
        """Hand one layer's :class:`~headwise.core.rows.AttentionRows` to the readers, block by block."""
        import torch

        B, H, L, S = rows.shape
        if (B, L, S) != (self.B, self.L, self.L) or self.num_heads != H:
            raise ValueError(
                f"rows: expected self-attention over (B, H, L) = ({self.B}, {self.num_heads}, {self.L}), "
                f"got (B, H, L, S) = {(B, H, L, S)}"
            )
        first, last = self.span or (0, L)
        causal = rows.is_causal and rows.key_slots is None
        with torch.no_grad():
            for start in range(first, last, self.block_size):
                stop = min(last, start + self.block_size)
                w = rows.weights(start, stop)  # (B, H, R, S')
                if w.dtype not in (torch.float32, torch.float64):
                    w = w.float()  # bf16 / fp16 rows: the sums in float32
                block = self.layout.block(w, start, causal=causal)
                for part in self.parts:
                    part.block(layer, block)
                if self.progress is not None:
                    self.progress(layer, stop, L)
        self.layers_read[layer] = True

    def check_read(self) -> None:
        """Raises RuntimeError when a layer was never read (its ``hook_qk`` point is off the forward path)."""
        if not all(self.layers_read):
            missing = [k for k, done in enumerate(self.layers_read) if not done]
            raise RuntimeError(f"rows: layers {missing} were never read; is every hook_qk point on the forward path?")


class RowReader(BlockPass):
    """One pass with the readers a call asks for: per-sentence sums of every head's statistics
    (:class:`HeadSums`, :class:`DetectorSums`), the first sequence's pooled maps (:class:`PooledMaps`) and kept rows
    (:class:`KeptRows`), or the kept rows alone over their span (``rows_only``).

    Args:
        num_layers, num_heads: NL and H (query heads).
        ids: ``(B, L)`` token ids; info: the batch's :class:`TokenInfo` (padding, [CLS], [SEP], punctuation).
        block_size: query rows per block (default :func:`default_block_size`).
        js, js_max_rows, entropy_smoothing, max_length: see :class:`HeadSums`.
        progress: called after every block with ``(layer, rows done in the layer, L)``.
        pool: also pool the first sequence (:class:`PooledMaps`); keep: ``(A, B)``, also keep its rows A … B − 1.
        rows_only: the kept rows alone (no statistics, no pool).
        heads, detectors: keep the head statistics' sums / the detectors' (both by default; no effect with
            ``rows_only``).
        extra: factories of more readers of the same pass, each called with the batch's :class:`Layout` (e.g.
            :meth:`headwise.analysis.evidence.HeadEvidence.reader`); the readers, in order, in ``self.extra``, fed
            after the statistics' (which they never change).
    Raises:
        ValueError: a block size ≤ 0; ``rows_only`` without ``keep`` or with ``pool`` or with ``extra``.
    """

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        ids,
        info: TokenInfo,
        *,
        block_size: int | None = None,
        js: bool = True,
        js_max_rows: int = 128,
        entropy_smoothing: float = CLARK_ENTROPY_SMOOTHING,
        max_length: int | None = None,
        progress: Callable[[int, int, int], None] | None = None,
        pool: int | None = None,
        keep: tuple[int, int] | None = None,
        rows_only: bool = False,
        heads: bool = True,
        detectors: bool = True,
        extra: Sequence[Callable[[Layout], BlockReader]] = (),
    ):
        if rows_only and (keep is None or pool is not None or extra):
            raise ValueError(
                "rows_only: expected keep=(A, B) and no pool= or extra= (the pass reads the kept rows alone)"
            )
        layout = Layout(ids, info)
        self.head_sums = self.detector_sums = self.picture = None
        parts: list[BlockReader] = []
        if heads and not rows_only:
            self.head_sums = HeadSums(
                layout, num_layers, num_heads, js=js, js_max_rows=js_max_rows, entropy_smoothing=entropy_smoothing,
                max_length=max_length,
            )  # fmt: skip
            parts.append(self.head_sums)
        if detectors and not rows_only:
            self.detector_sums = DetectorSums(layout, num_layers, num_heads)
            parts.append(self.detector_sums)
        if pool is not None:
            self.picture = PooledMaps(layout, num_layers, num_heads, pool)
            parts.append(self.picture)
        self.keep, self.kept = keep, None
        if keep is not None:
            rows = KeptRows(num_layers, num_heads, keep)
            self.kept = rows.kept
            parts.append(rows)
        self.extra = [make(layout) for make in extra]
        parts.extend(self.extra)
        super().__init__(
            layout, num_layers, num_heads, parts, block_size=block_size, span=keep if rows_only else None,
            progress=progress,
        )  # fmt: skip

    @property
    def pooled(self):
        """The pooled sums ``(NL, H, P, P)`` (None without ``pool``)."""
        return None if self.picture is None else self.picture.pooled

    def pooled_maps(self) -> tuple[np.ndarray, np.ndarray]:
        """The first sequence's ``(NL, H, P, P)`` pooled maps and the bins' token bounds ``(P + 1,)``
        (:meth:`PooledMaps.maps`)."""
        if self.picture is None:
            raise ValueError("pool: the reader was made without pool=")
        return self.picture.maps()

    def sentence_values(self) -> tuple[list[dict], list[dict]]:
        """Per sentence: the HeadStats values and the detector scores (name → ``(N,)``; NaN where a sentence has
        no row for a metric); an empty list for the sums the reader was made without."""
        self.check_read()
        heads = [] if self.head_sums is None else self.head_sums.sentence_values()
        dets = [] if self.detector_sums is None else self.detector_sums.sentence_values()
        return heads, dets

    def add_to(self, head_stats=None, detector_stats=None) -> None:
        """Add every sentence of the batch to a :class:`~headwise.analysis.HeadStats` and / or a
        :class:`~headwise.analysis.DetectorStats` (sentences without a real token are skipped).

        Raises:
            ValueError: an accumulator for sums the reader was made without.
        """
        self.check_read()
        pairs = (("head_stats", head_stats, self.head_sums), ("detector_stats", detector_stats, self.detector_sums))
        for name, stats, sums in pairs:
            if stats is not None:
                if sums is None:
                    raise ValueError(f"{name}: the reader was made without its sums")
                sums.add_to(stats)


def read_rows(
    hm: RowModel,
    ids,
    mask=None,
    info: TokenInfo | None = None,
    *,
    head_stats=None,
    detector_stats=None,
    block_size: int | None = None,
    js_max_rows: int = 32,
    progress: Callable[[int, int, int], None] | None = None,
    pool: int | None = None,
    keep: tuple[int, int] | None = None,
    rows_only: bool = False,
    extra: Sequence[Callable[[Layout], BlockReader]] = (),
) -> RowReader:
    """One forward pass of ``hm`` (a :class:`headwise.models.HeadModel`) on a batch, every layer's heads reduced
    at its ``hook_qk`` point into ``head_stats`` / ``detector_stats``.

    Args:
        hm: the model (its :meth:`~headwise.models.HeadModel.read_rows` runs the pass with the readers hooked).
        ids: ``(B, L)`` token ids (torch); mask: ``(B, L)``, 1 = real token (None: all real).
        info: token info (default: :meth:`TokenInfo.plain` from the mask).
        head_stats, detector_stats: the accumulators fed (the pass keeps only the sums of those given).
        block_size, progress: see :class:`BlockPass`.
        pool: also pool the first sequence's maps to at most ``pool`` × ``pool`` bins (:meth:`RowReader.pooled_maps`).
        keep: ``(A, B)``: also keep the first sequence's rows ``A … B − 1`` over keys ``A … B − 1`` in full
            (``reader.kept``, ``(NL, H, B − A, B − A)``; memory ``NL · H · (B − A)² · 4`` bytes).
        rows_only: form the kept rows alone — a bounded pass (the forward plus ``(B − A)`` rows of every head, no
            statistics; no ``head_stats``, ``detector_stats`` or ``pool``).
        js_max_rows: Jensen–Shannon rows per sentence (32; fewer beyond 4,096 tokens, :func:`js_row_budget`).
        extra: more readers of this pass, as factories given the batch's :class:`Layout` (:class:`RowReader`):
            e.g. ``extra=[evidence.reader(first_text=t)]`` gathers a
            :class:`~headwise.analysis.evidence.HeadEvidence` in the statistics' pass.
    Returns:
        the :class:`RowReader` (its sums).
    """
    m = np.ones(tuple(ids.shape), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    if info is None:
        info = TokenInfo.plain(m.shape[0], m.shape[1], m.sum(axis=1))
    reader = RowReader(
        hm.num_layers,
        hm.num_heads,
        np.asarray(ids),
        info,
        block_size=block_size,
        js=head_stats is not None and head_stats.js,
        js_max_rows=js_max_rows,
        max_length=getattr(head_stats, "max_length", None),
        progress=progress,
        pool=pool,
        keep=keep,
        rows_only=rows_only,
        heads=head_stats is not None,
        detectors=detector_stats is not None,
        extra=extra,
    )
    if rows_only and (head_stats is not None or detector_stats is not None):
        raise ValueError("rows_only: a pass of the kept rows alone feeds no head_stats or detector_stats")
    hm.read_rows(ids, mask, reader.readers())
    if not rows_only:
        reader.add_to(head_stats, detector_stats)
    return reader
