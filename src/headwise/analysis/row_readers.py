"""The readers of a streaming pass (:mod:`headwise.analysis.streaming`), one concern each, and the batch's
:class:`Layout` they share: :class:`HeadSums` (per-sentence sums of the HeadStats metrics and the sampled rows of
the Jensen–Shannon sums), :class:`DetectorSums` (the detectors and the causal entropy ratio), :class:`PooledMaps`
(the first sequence pooled for the overview) and :class:`KeptRows` (full rows of a query range). Each takes a
:class:`~headwise.analysis.block.RowBlock` of one layer's rows and adds to its sums; after the pass the sums go to
the accumulators.

Shape legend: B batch, L padded length, NL layers, H query heads per layer, N = NL · H, R rows of one block,
S' keys a block can see, n real tokens of a sentence, J sampled rows of the Jensen–Shannon sums.
"""

from __future__ import annotations

import math

import numpy as np

from headwise import checks
from headwise.analysis.block import RowBlock
from headwise.analysis.confidence import count_offsets, row_max_offsets
from headwise.analysis.corpus import js_row_budget, js_sample_rows
from headwise.analysis.detectors import duplicate_rows, first_keys, induction_rows, pattern_mass, previous_keys
from headwise.analysis.distance import distance_rows
from headwise.analysis.divergence import js_sums_torch
from headwise.analysis.entropy import CLARK_ENTROPY_SMOOTHING, causal_entropy_ratio_rows, entropy_rows
from headwise.analysis.targets import mass_at, mass_on
from headwise.analysis.tokens import TokenInfo

__all__ = ["Layout", "HeadSums", "DetectorSums", "PooledMaps", "KeptRows", "PATTERN_ROOM"]

#: int64 elements of the duplicate / induction patterns kept across layers (128 MB; a text of few distinct
#: tokens, whose patterns grow as L², has them recomputed per layer beyond this).
PATTERN_ROOM = 1 << 24
_HEAD_SUMS = ("cls", "sep", "punct", "self", "prev", "next", "entropy", "entropy_cls", "distance")
_DETECTOR_SUMS = ("prev", "first", "duplicate", "induction", "entropy_ratio_causal")


class Layout:
    """What each position of a batch is, as the tensors every reader of a pass shares (made once per batch).

    Attributes:
        B, L: batch and padded length; info: the batch's :class:`TokenInfo`.
        valid: ``(B, L)`` bool, real tokens; ids: ``(B, L)`` int64 token ids; n: ``(B,)`` real tokens.
        cpos: ``(B, L)`` int64 position of each slot among the real tokens (what distances and offsets count).
    """

    def __init__(self, ids, info: TokenInfo):
        import torch

        valid = np.asarray(info.valid, dtype=bool)
        self.info = info
        self.B, self.L = valid.shape
        self.valid = torch.as_tensor(valid)  # (B, L)
        self.ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))  # (B, L)
        self.n = self.valid.sum(1)  # (B,)
        self.cpos = self.valid.long().cumsum(1) - 1  # (B, L) position among the real tokens

    def block(self, w, start: int, *, causal: bool = False) -> RowBlock:
        """Rows ``start …`` of one layer, ``w`` ``(B, H, R, S')`` as the model formed them, as a :class:`RowBlock`."""
        stop, keys = start + w.shape[-2], w.shape[-1]
        v, c = self.valid, self.cpos
        rows, qpos = v[:, start:stop], c[:, start:stop]
        return RowBlock.of(w, start, rows, v[:, :keys], self.n, qpos, c[:, :keys], causal=causal)


def _sums(num_layers: int, B: int, *rest: int):
    import torch

    return torch.zeros(num_layers, B, *rest, dtype=torch.float64)


class HeadSums:
    """Per-sentence, per-head sums of the :class:`~headwise.analysis.HeadStats` metrics, and the sampled rows of its
    Jensen–Shannon sums.

    Args:
        layout: the batch; num_layers, num_heads: NL and H.
        js: keep the sampled rows for the Jensen–Shannon sums; js_max_rows: at most that many rows per sentence
            (:func:`js_row_budget`).
        entropy_smoothing: Clark et al.'s ε.
        max_length: the accumulator's ``max_length`` (the histogram itself spans the batch's L positions).
    """

    def __init__(
        self,
        layout: Layout,
        num_layers: int,
        num_heads: int,
        *,
        js: bool = True,
        js_max_rows: int = 128,
        entropy_smoothing: float = CLARK_ENTROPY_SMOOTHING,
        max_length: int | None = None,
    ):
        import torch

        info, B, L = layout.info, layout.B, layout.L
        valid = np.asarray(info.valid, dtype=bool)
        self.layout, self.num_layers, self.num_heads = layout, num_layers, num_heads
        self.max_length = max(L, max_length or L)
        self.eps = float(entropy_smoothing)
        t = torch.as_tensor
        special = np.asarray(info.cls, dtype=bool) | np.asarray(info.sep, dtype=bool)
        self.voita = t(valid & ~special)  # (B, L) Voita's query tokens
        marks = np.stack([np.asarray(m, dtype=bool) & valid for m in (info.cls, info.sep, info.punct)], -1)
        self.marks = t(marks.astype(np.float32)) if marks.any() else None  # (B, L, 3)
        cls = np.asarray(info.cls, dtype=bool) & valid
        self.cls_pos = np.where(cls.any(1), np.argmax(cls, axis=1), -1)  # (B,) first [CLS] or −1
        # neighbours among the real tokens (HeadStats: offsets on the real tokens)
        prev_c, next_c = np.full((B, L), -1), np.full((B, L), -1)
        for b in range(B):
            idx = np.flatnonzero(valid[b])
            prev_c[b, idx[1:]] = idx[:-1]
            next_c[b, idx[:-1]] = idx[1:]
        self.key_self = t(np.where(valid, np.arange(L)[None], -1))
        self.key_prev, self.key_next = t(prev_c), t(next_c)
        self.sums = {k: _sums(num_layers, B, num_heads) for k in _HEAD_SUMS}  # name → (NL, B, H)
        self.conf_sum = _sums(num_layers, B, num_heads)
        # (N, 2L − 1): offsets −(L − 1) … L − 1 of the batch's L positions (not max_length's: a model of 8,192
        # positions would hold 35 MB of empty columns per head set)
        self.hist = torch.zeros(num_layers * num_heads, 2 * L - 1, dtype=torch.int64)
        self.js_rows = [
            np.flatnonzero(valid[b])[js_sample_rows(int(n), js_row_budget(int(n), js_max_rows))]
            for b, n in enumerate(valid.sum(1))
        ]
        self.js_buf = (
            [torch.zeros(num_layers * num_heads, len(r), int(valid[b].sum())) for b, r in enumerate(self.js_rows)]
            if js
            else None
        )

    def block(self, layer: int, block: RowBlock) -> None:
        import torch

        w, start, stop = block.w, block.start, block.stop
        B, H, R, Sv = w.shape
        hs = self.sums
        if self.marks is not None:
            t = mass_on(block, self.marks[:, :Sv].to(w.dtype)).sum(2)  # (B, H, 3)
            for k, name in enumerate(("cls", "sep", "punct")):
                hs[name][layer] += t[..., k]
        for name, key in (("self", self.key_self), ("prev", self.key_prev), ("next", self.key_next)):
            hs[name][layer] += mass_at(block, key[:, start:stop]).sum(-1)
        h = entropy_rows(block, self.eps)  # (B, H, R)
        hs["entropy"][layer] += h.sum(-1)
        for b, pos in enumerate(self.cls_pos):
            if start <= pos < stop:
                hs["entropy_cls"][layer, b] += h[b, :, pos - start]
        hs["distance"][layer] += distance_rows(block).sum(-1)
        mx, off = row_max_offsets(block)  # Voita: row maxima and argmax offsets over the real tokens
        vo = self.voita[:, start:stop]  # (B, R)
        self.conf_sum[layer] += (mx * vo[:, None, :]).sum(-1)  # the row's own maximum, as HeadStats reads it
        count_offsets(self.hist[layer * H : (layer + 1) * H], off, vo, self.layout.L)
        if self.js_buf is not None:
            valid = self.layout.valid
            for b, sampled in enumerate(self.js_rows):
                inside = np.flatnonzero((sampled >= start) & (sampled < stop))
                if inside.size:
                    real = torch.as_tensor(np.flatnonzero(valid[b, :Sv].numpy()))
                    rows = w[b][:, torch.as_tensor(sampled[inside] - start)][:, :, real]  # (H, J', keys), as read
                    self.js_buf[b][layer * H : (layer + 1) * H, inside, : real.numel()] = rows.float()

    def sentence_values(self) -> list[dict]:
        """Per sentence: the HeadStats values, name → ``(N,)`` (NaN where a sentence has no row for a metric)."""
        n = self.layout.n.numpy().astype(np.int64)
        counts = dict.fromkeys(("cls", "sep", "punct", "entropy", "self", "distance"), n)
        counts |= {"prev": (self.key_prev >= 0).sum(1).numpy(), "next": (self.key_next >= 0).sum(1).numpy()}
        heads = []
        with np.errstate(invalid="ignore", divide="ignore"):
            for b in range(self.layout.B):
                values = {}
                for name, s in self.sums.items():
                    v = s[:, b].reshape(-1).numpy()  # (N,)
                    if name == "entropy_cls":
                        values[name] = v if self.cls_pos[b] >= 0 else np.full(v.shape, np.nan)
                    else:
                        c = counts[name][b]
                        values[name] = v / c if c > 0 else np.full(v.shape, np.nan)
                ln_n = math.log(n[b]) if n[b] > 0 else 0.0
                values["entropy_ratio"] = values["entropy"] / ln_n if ln_n > 0 else np.full(v.shape, np.nan)
                heads.append(values)
        return heads

    def add_to(self, head_stats) -> None:
        """Add every sentence of the batch to a :class:`~headwise.analysis.HeadStats` (sentences without a real token
        are skipped)."""
        L = self.layout.L
        if head_stats.max_length < L:
            raise ValueError(f"max_length: the accumulator's {head_stats.max_length} is shorter than the batch's {L}")
        heads, n = self.sentence_values(), self.layout.n.numpy()
        hist = self.hist.numpy()  # (N, 2L − 1): offsets −(L − 1) … L − 1
        for b in range(self.layout.B):
            if n[b] == 0:
                continue
            js = None
            if self.js_buf is not None and head_stats.js:
                js = (js_sums_torch(self.js_buf[b], head_stats.js_smoothing), len(self.js_rows[b]))
            head_stats.add_sentence_sums(
                heads[b],
                length=int(n[b]),
                confidence=(self.conf_sum[:, b].reshape(-1).numpy(), int(self.voita[b].sum())),
                histogram=hist,
                js=js,
            )
            hist = None  # the batch's histogram is added once, with its first sentence


class DetectorSums:
    """Per-sentence, per-head sums of the detector scores (:data:`~headwise.analysis.detectors.DETECTORS`, on padded
    slots as :class:`~headwise.analysis.DetectorStats`) and of the causal entropy ratio.

    Args:
        layout: the batch; num_layers, num_heads: NL and H.
    """

    def __init__(self, layout: Layout, num_layers: int, num_heads: int):
        import torch

        valid, B = np.asarray(layout.info.valid, dtype=bool), layout.B
        self.layout, self.num_layers, self.num_heads = layout, num_layers, num_heads
        self.keys = {"prev": torch.as_tensor(previous_keys(valid)), "first": torch.as_tensor(first_keys(valid))}
        self.seen = layout.valid.long().cumsum(1)  # (B, L) real keys at or before each slot
        self.sums = {k: _sums(num_layers, B, num_heads) for k in _DETECTOR_SUMS}  # name → (NL, B, H)
        self.counts = {k: _sums(num_layers, B) for k in _DETECTOR_SUMS}  # name → (NL, B)
        self._patterns: dict[tuple[int, int], tuple] = {}
        self._pattern_room = PATTERN_ROOM  # int64 elements the kept block patterns may still take

    def block(self, layer: int, block: RowBlock) -> None:
        start, stop, Sv = block.start, block.stop, block.w.shape[-1]
        ds, dc = self.sums, self.counts
        for name, key in self.keys.items():
            k = key[:, start:stop]  # (B, R)
            ds[name][layer] += mass_at(block, k).sum(-1)
            dc[name][layer] += (block.rows & (k >= 0)).sum(1)
        for name, (entries, has) in zip(("duplicate", "induction"), self._pattern(start, stop, Sv)):
            ds[name][layer] += (pattern_mass(block, entries) * has[:, None, :]).sum(-1)
            dc[name][layer] += has.sum(1)
        ratio, rows = causal_entropy_ratio_rows(block, self.seen[:, start:stop])
        ds["entropy_ratio_causal"][layer] += ratio.sum(-1)
        dc["entropy_ratio_causal"][layer] += rows.sum(1)

    def _pattern(self, start: int, stop: int, Sv: int):
        """The duplicate and induction patterns of rows ``start:stop`` as entries ``(b, r, j)`` and rows that have
        one ``(B, R)`` — the same for every layer, so kept per block."""
        got = self._patterns.get((start, stop))
        if got is not None:
            return got
        ids, valid = self.layout.ids, self.layout.valid
        got = tuple((m.nonzero(), m.any(-1)) for m in (f(ids, valid, start, stop, Sv) for f in _TOKEN_PATTERNS))
        size = sum(nz.numel() for nz, _ in got)
        if size <= self._pattern_room:  # every layer walks the same blocks: keep them while they are small
            self._patterns[(start, stop)] = got
            self._pattern_room -= size
        return got

    def sentence_values(self) -> list[dict]:
        """Per sentence: the detector scores, name → ``(N,)`` (NaN where a sentence has no row with a target)."""
        dets = []
        with np.errstate(invalid="ignore", divide="ignore"):
            for b in range(self.layout.B):
                scores = {}
                for name, s in self.sums.items():
                    c = self.counts[name][:, b].numpy()[:, None]  # (NL, 1)
                    scores[name] = np.where(c > 0, s[:, b].numpy() / np.maximum(c, 1), np.nan).reshape(-1)
                dets.append(scores)
        return dets

    def add_to(self, detector_stats) -> None:
        """Add every sentence of the batch to a :class:`~headwise.analysis.DetectorStats` (sentences without a real
        token are skipped)."""
        dets, n = self.sentence_values(), self.layout.n.numpy()
        kept = [b for b in range(self.layout.B) if n[b] > 0]
        if kept:
            detector_stats.add_scores({k: np.stack([dets[b][k] for b in kept]) for k in dets[0]})


_TOKEN_PATTERNS = (duplicate_rows, induction_rows)


class PooledMaps:
    """The first sequence's every head pooled to at most ``pool`` × ``pool`` bins (as
    :func:`headwise.viz.headview.thumbnails` pools a full map): cell (p, q) is the mean over query bin p of the
    renormalised weight summed over key bin q.

    Args:
        layout: the batch; num_layers, num_heads: NL and H; pool: bins per side.
    """

    def __init__(self, layout: Layout, num_layers: int, num_heads: int, pool: int):
        import torch

        checks.positive_int("pool", pool)
        valid, L = np.asarray(layout.info.valid, dtype=bool), layout.L
        n0 = int(valid[0].sum())
        P = min(n0, pool)
        self.bounds = np.linspace(0, n0, P + 1).round().astype(np.int64)  # (P + 1,) over the real tokens
        of = np.searchsorted(self.bounds, np.arange(n0), side="right") - 1  # (n,) bin of each real token
        bins = np.full(L, -1)
        bins[np.flatnonzero(valid[0])] = of
        self.bin_of = torch.as_tensor(bins)  # (L,) −1 for padding
        onehot = np.zeros((L, P), dtype=np.float32)
        onehot[np.flatnonzero(valid[0]), of] = 1.0
        self.onehot = torch.as_tensor(onehot)  # (L, P)
        self.pooled = torch.zeros(num_layers, num_heads, P, P, dtype=torch.float64)

    def block(self, layer: int, block: RowBlock) -> None:
        import torch

        w, Sv = block.w, block.w.shape[-1]
        qb = self.bin_of[block.start : block.stop]  # (R,) −1 for padding
        ok = qb >= 0
        if bool(ok.any()):
            lo, hi = int(qb[ok].min()), int(qb[ok].max())
            qbins = (qb[None, :] == torch.arange(lo, hi + 1)[:, None]).to(w.dtype)  # (P', R) the block's bins
            sums = (qbins[None] * block.inv[0][:, None, :]) @ w[0]  # (H, P', S'): each bin's renormalised rows summed
            self.pooled[layer, :, lo : hi + 1] += (sums @ self.onehot[:Sv].to(w.dtype)).double()  # (H, P', P)

    def maps(self) -> tuple[np.ndarray, np.ndarray]:
        """The ``(NL, H, P, P)`` pooled maps and the bins' token bounds ``(P + 1,)``."""
        counts = np.diff(self.bounds).astype(np.float64)  # (P,) tokens per query bin
        return self.pooled.numpy() / counts[None, None, :, None], self.bounds


class KeptRows:
    """The first sequence's rows ``A … B − 1`` over keys ``A … B − 1`` in full (each renormalised over the real keys):
    ``kept`` ``(NL, H, B − A, B − A)``. Alone in a :class:`BlockPass` over ``span=keep``, the bounded pass of those
    rows.

    Args:
        num_layers, num_heads: NL and H; keep: ``(A, B)``.
    """

    def __init__(self, num_layers: int, num_heads: int, keep: tuple[int, int]):
        import torch

        self.keep = a0, b0 = keep
        self.kept = torch.zeros(num_layers, num_heads, b0 - a0, b0 - a0)

    def block(self, layer: int, block: RowBlock) -> None:
        start, Sv = block.start, block.w.shape[-1]
        a0, b0 = self.keep
        lo, hi = max(a0, start), min(b0, block.stop)
        cols = min(b0, Sv) - a0
        if lo < hi and cols > 0:
            r0, r1 = lo - start, hi - start
            rows = block.w[0, :, r0:r1, a0 : a0 + cols] * block.inv[0, :, r0:r1, None]  # (H, R', cols)
            self.kept[layer, :, lo - a0 : hi - a0, :cols] = rows.float()
