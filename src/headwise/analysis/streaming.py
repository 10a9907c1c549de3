"""Streaming head statistics: every head's statistics reduced inside attention, a block of query rows at a time,
during one forward pass — never ``(H, L, L)`` for a layer.

Shape legend: B batch, L padded length (self-attention: S = L), NL layers, H query heads per layer,
N = NL · H, R rows of one block, S' keys a block can see (``stop`` for a causal block, else L), n real tokens of a
sentence, J sampled rows of the Jensen–Shannon sums.

Every statistic of :class:`~headwise.analysis.HeadStats` and :class:`~headwise.analysis.DetectorStats` is a sum
over query rows of something computed from one row of one head's attention. A :class:`RowReader` registers one
reader per layer on the ``hook_qk`` points (:class:`headwise.core.rows.AttentionRows`: post-rotary q and k with
the model's scale, masks, causality, window, sinks and soft-cap); each reader forms the rows a block at a time
exactly as the model does (grouped-query heads per query head), renormalises them over the real keys as
:func:`~headwise.analysis.tokens.as_attention` does, and adds per-sentence, per-head sums. After the pass,
:meth:`RowReader.add_to` hands each sentence's values to the accumulators, which finish them as they finish
full maps: the same numbers (tested to 1e-5 against the full-map computation over random layouts, masks,
windows, sinks, padding and GQA).

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
import math
from collections.abc import Callable

import numpy as np

from headwise import checks
from headwise.analysis.corpus import js_row_budget, js_sample_rows
from headwise.analysis.divergence import CLARK_JS_SMOOTHING
from headwise.analysis.entropy import CLARK_ENTROPY_SMOOTHING
from headwise.analysis.tokens import TokenInfo

__all__ = ["RowReader", "read_rows", "default_block_size", "js_sums_torch", "BLOCK_ELEMENTS"]

#: Elements of one block of rows, ``B · H · R · L``, when no block size is given (8 MB of float32: measured on
#: SmolLM2 at 1,024 tokens, blocks of 128–256 rows read 1.7 × faster than one block of 1,024, whose temporaries
#: are fresh pages on every call).
BLOCK_ELEMENTS = 1 << 21
#: int64 elements of the duplicate / induction patterns kept across layers (128 MB; a text of few distinct
#: tokens, whose patterns grow as L², has them recomputed per layer beyond this).
PATTERN_ROOM = 1 << 24
#: Fewest rows of a default block (long inputs: per-block overhead against block memory; at 8,192 tokens and 9
#: heads, 64 rows read 1.3 × faster than 32 and 1.6 × faster than 128).
MIN_BLOCK_ROWS = 64
#: Most elements of a block of :data:`MIN_BLOCK_ROWS` rows (32 MB: past it every temporary is fresh pages; at
#: 32,768 tokens and 9 heads, 32 rows read 1.4 × faster than 64) ...
MAX_BLOCK_ELEMENTS = 1 << 23
#: ... and the fewest rows a default block has.
FEWEST_BLOCK_ROWS = 16
_HEAD_SUMS = ("cls", "sep", "punct", "self", "prev", "next", "entropy", "entropy_cls", "distance")
_DETECTOR_SUMS = ("prev", "first", "duplicate", "induction", "entropy_ratio_causal")


def default_block_size(batch: int, heads: int, length: int) -> int:
    """Query rows per block: as many as keep one block within :data:`BLOCK_ELEMENTS` weights; where that is fewer
    than :data:`MIN_BLOCK_ROWS`, that many unless a block would pass :data:`MAX_BLOCK_ELEMENTS` (then fewer, down to
    :data:`FEWEST_BLOCK_ROWS`); at most ``length``."""
    bhl = max(1, batch * heads * length)
    rows = BLOCK_ELEMENTS // bhl
    if rows < MIN_BLOCK_ROWS:
        rows = max(FEWEST_BLOCK_ROWS, min(MIN_BLOCK_ROWS, MAX_BLOCK_ELEMENTS // bhl))
    return max(1, min(length, rows))


def js_sums_torch(p, smoothing: float = CLARK_JS_SMOOTHING, *, budget: int = 1 << 22):
    """:func:`headwise.analysis.divergence.sentence_js_sums` in torch: ``p`` ``(N, J, n)`` rows (a float32
    tensor), returns ``(N, N)`` float64 NumPy sums (symmetric, zero diagonal).

    Each pair once, and per row only the keys some head weighs (a causal row's first ``i + 1``): beyond them
    both smoothed rows hold ε/n and their divergence term is exactly 0. Per-key terms are summed in float32 (torch's
    cascade sum), the sums over rows in float64. ``budget``: elements of one chunk of pairs (at least N · n are
    used).
    """
    import torch

    heads, rows, n = p.shape
    sums = torch.zeros(heads, heads, dtype=torch.float64)
    # two reused buffers of one chunk of pairs: `budget` elements (16 MB), or one head's pairs when that is more
    size = max(budget, heads * n)
    buf_s, buf_l = torch.empty(size), torch.empty(size)
    half_ln2 = 0.5 * math.log(2.0)
    for r in range(rows):
        row = p[:, r]  # (N, n)
        used = torch.nonzero(row.gt(0).any(0))
        k = int(used.max()) + 1 if used.numel() else 1
        q = (1.0 - smoothing) * row[:, :k].float() + smoothing / n  # (N, k), > 0
        qlq = (q * q.log()).sum(-1)  # (N,): −H(q)
        tot = q.sum(-1)  # (N,)
        chunk = max(1, budget // max(1, heads * k))
        for s0 in range(0, heads, chunk):
            s1 = min(heads, s0 + chunk)
            shape = (s1 - s0, heads - s0, k)
            size = shape[0] * shape[1] * shape[2]
            a_b = torch.add(q[s0:s1, None], q[None, s0:], out=buf_s[:size].view(shape))  # 2m, (c, N − s0, k)
            x = torch.log(a_b, out=buf_l[:size].view(shape)).mul_(a_b).sum(-1)  # Σ 2m ln 2m, (c, N − s0)
            # JS = H(m) − (H(a) + H(b)) / 2, H(m) = −Σ m ln m = −x / 2 + ln 2 · Σ (a + b) / 2
            js = (tot[s0:s1, None] + tot[None, s0:]) * half_ln2 - 0.5 * x
            js += 0.5 * (qlq[s0:s1, None] + qlq[None, s0:])
            sums[s0:s1, s0:] += js.double().clamp_min(0.0)
    sums = torch.triu(sums, diagonal=1)
    return (sums + sums.T).numpy()


def _inverse(total):
    """``1 / total`` where a row has weight, 0 where it has none (a fully blocked or padded row): ``(B, H, R)``."""
    import torch

    return torch.where(total > 0, 1.0 / torch.where(total > 0, total, torch.ones_like(total)), 0.0)


def _entropy_sum(p, *, positive: bool = False):
    """``Σ_j −p_j ln p_j`` over the last axis (``0 ln 0 = 0``), as ``torch.special.entr(p).sum(-1)`` but through the
    vectorised ``log`` (entr is a scalar loop on CPU, ~4 × slower). ``positive``: every p > 0 (no clamp needed)."""
    import torch

    t = torch.log(p) if positive else torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))  # p = 0: 0 · ln(tiny) = 0
    return t.mul_(p).sum(-1).neg_()


class RowReader:
    """Per-sentence sums of every head's row statistics, read from ``hook_qk`` during one forward pass.

    Args:
        num_layers, num_heads: NL and H (query heads).
        ids: ``(B, L)`` token ids; info: the batch's :class:`TokenInfo` (padding, [CLS], [SEP], punctuation).
        block_size: query rows per block (default :func:`default_block_size`).
        js: keep the sampled rows for the Jensen–Shannon sums; js_max_rows: at most that many rows per sentence
            (:func:`js_row_budget`).
        entropy_smoothing: Clark et al.'s ε.
        max_length: bounds of the argmax-offset histogram (the accumulator's ``max_length``).
        progress: called after every block with ``(layer, rows done in the layer, L)``.
    Raises:
        ValueError: a block size ≤ 0.
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
    ):
        import torch

        valid = np.asarray(info.valid, dtype=bool)
        B, L = valid.shape
        if block_size is not None:
            checks.positive_int("block_size", block_size)
        self.num_layers, self.num_heads, self.B, self.L = num_layers, num_heads, B, L
        self.block_size = block_size or default_block_size(B, num_heads, L)
        self.max_length = max(L, max_length or L)
        self.eps = float(entropy_smoothing)
        self.progress = progress
        t = torch.as_tensor
        self.valid = t(valid)  # (B, L)
        self.ids = t(np.asarray(ids, dtype=np.int64))  # (B, L)
        self.n = self.valid.sum(1)  # (B,)
        self.cpos = self.valid.long().cumsum(1) - 1  # (B, L) position among the real tokens
        special = np.asarray(info.cls, dtype=bool) | np.asarray(info.sep, dtype=bool)
        self.voita = t(valid & ~special)  # (B, L) Voita's query tokens
        marks = np.stack([np.asarray(m, dtype=bool) & valid for m in (info.cls, info.sep, info.punct)], -1)
        self.marks = t(marks.astype(np.float32)) if marks.any() else None  # (B, L, 3)
        cls = np.asarray(info.cls, dtype=bool) & valid
        cls_pos = np.where(cls.any(1), np.argmax(cls, axis=1), -1)
        self.cls_pos = cls_pos  # (B,) first [CLS] or −1
        # neighbours among the real tokens (HeadStats: offsets on the real tokens), and in padded slots (detectors)
        real = [np.flatnonzero(valid[b]) for b in range(B)]
        prev_c, next_c = np.full((B, L), -1), np.full((B, L), -1)
        for b, idx in enumerate(real):
            prev_c[b, idx[1:]] = idx[:-1]
            next_c[b, idx[:-1]] = idx[1:]
        self.key_self = t(np.where(valid, np.arange(L)[None], -1))
        self.key_prev, self.key_next = t(prev_c), t(next_c)
        slot_prev = np.full((B, L), -1)
        slot_prev[:, 1:] = np.where(valid[:, 1:] & valid[:, :-1], np.arange(L - 1)[None], -1)
        self.slot_prev = t(slot_prev)
        first = np.where(valid.any(1), np.argmax(valid, axis=1), L)
        self.first = t(first)  # (B,)
        self.seen = self.valid.long().cumsum(1)  # (B, L) real keys at or before each slot
        ids_prev = np.full((B, L), -1, dtype=np.int64)
        ids_prev[:, 1:] = np.where(valid[:, 1:] & valid[:, :-1], np.asarray(ids)[:, :-1], -1)
        self.ids_prev = t(ids_prev)  # (B, L): the id before each key (−1: none, or padding)
        # sums: name → (NL, B, H) float64; counts: name → (B,)
        z = functools.partial(torch.zeros, dtype=torch.float64)
        self.head_sums = {k: z(num_layers, B, num_heads) for k in _HEAD_SUMS}
        self.det_sums = {k: z(num_layers, B, num_heads) for k in _DETECTOR_SUMS}
        self.det_counts = {k: z(num_layers, B) for k in _DETECTOR_SUMS}
        self.conf_sum = z(num_layers, B, num_heads)
        self.hist = torch.zeros(num_layers * num_heads * (2 * self.max_length - 1), dtype=torch.int64)
        self.js = js
        self.js_rows = [
            np.flatnonzero(valid[b])[js_sample_rows(int(n), js_row_budget(int(n), js_max_rows))]
            for b, n in enumerate(valid.sum(1))
        ]
        self.js_buf = (
            [torch.zeros(num_layers * num_heads, len(r), int(valid[b].sum())) for b, r in enumerate(self.js_rows)]
            if js
            else None
        )
        self._patterns: dict[tuple[int, int], tuple] = {}
        self._pattern_room = PATTERN_ROOM  # int64 elements the kept block patterns may still take
        # the first sequence's picture: every head pooled to P × P bins, and full rows of the kept queries
        self.pooled = self.bounds = self.kept = None
        if pool is not None:
            checks.positive_int("pool", pool)
            n0 = int(valid[0].sum())
            P = min(n0, pool)
            self.bounds = np.linspace(0, n0, P + 1).round().astype(np.int64)  # (P + 1,) over the real tokens
            of = np.searchsorted(self.bounds, np.arange(n0), side="right") - 1  # (n,) bin of each real token
            bins = np.full(L, -1)
            bins[np.flatnonzero(valid[0])] = of
            self.bin_of = t(bins)  # (L,) −1 for padding
            onehot = np.zeros((L, P), dtype=np.float32)
            onehot[np.flatnonzero(valid[0]), of] = 1.0
            self.onehot = t(onehot)  # (L, P)
            self.pooled = torch.zeros(num_layers, num_heads, P, P, dtype=torch.float64)
        if keep is not None:
            a0, b0 = keep
            self.keep = (a0, b0)
            self.kept = torch.zeros(num_layers, num_heads, b0 - a0, b0 - a0)
        if rows_only and (keep is None or pool is not None):
            raise ValueError("rows_only: expected keep=(A, B) and no pool= (the pass reads the kept rows alone)")
        self.rows_only = rows_only
        self.layers_read = [False] * num_layers

    # -- the readers ---------------------------------------------------------------------------------
    def readers(self) -> list[Callable]:
        """One hook per layer, for that layer's ``hook_qk`` point."""
        return [functools.partial(self.read, layer) for layer in range(self.num_layers)]

    def read(self, layer: int, rows) -> None:
        """Reduce one layer's :class:`~headwise.core.rows.AttentionRows`, block by block."""
        import torch

        B, H, L, S = rows.shape
        if (B, L, S) != (self.B, self.L, self.L) or self.num_heads != H:
            raise ValueError(
                f"rows: expected self-attention over (B, H, L) = ({self.B}, {self.num_heads}, {self.L}), "
                f"got (B, H, L, S) = {(B, H, L, S)}"
            )
        first, last = self.keep if self.rows_only else (0, L)
        with torch.no_grad():
            for start in range(first, last, self.block_size):
                stop = min(last, start + self.block_size)
                w = rows.weights(start, stop)  # (B, H, R, S')
                if w.dtype not in (torch.float32, torch.float64):
                    w = w.float()  # bf16 / fp16 rows: the sums in float32
                if self.rows_only:
                    self._keep_rows(layer, w, start, stop)
                else:
                    self._block(layer, w, start, stop, causal=rows.is_causal and rows.key_slots is None)
                if self.progress is not None:
                    self.progress(layer, stop, L)
        self.layers_read[layer] = True

    def _block(self, layer: int, w, start: int, stop: int, *, causal: bool = False) -> None:
        """Add rows ``start:stop`` of one layer: ``w`` ``(B, H, R, S')`` as the model formed them. Each row is
        taken over the real keys and renormalised (:func:`~headwise.analysis.tokens.as_attention`) through its
        total ``T``, applied to the per-row results rather than to every weight."""
        import torch

        B, H, R, Sv = w.shape
        vq, vk = self.valid[:, start:stop], self.valid[:, :Sv]  # (B, R), (B, S')
        if not bool(vk.all()):
            w = w * vk[:, None, None, :]  # padded keys out
        qpos = self.cpos[:, start:stop]  # (B, R)
        kpos = self.cpos[:, :Sv].to(w.dtype)  # (B, S')
        # one pass over the rows for their totals and Σ_j a_ij c_j
        tk = w @ torch.stack([torch.ones_like(kpos), kpos], -1)[:, None]  # (B, H, R, 2)
        total, wk = tk[..., 0], tk[..., 1]  # (B, H, R)
        inv = _inverse(total)  # (B, H, R)
        rowmask = vq[:, None, :].to(w.dtype)  # (B, 1, R)
        scale = inv * rowmask  # (B, H, R): renormalisation, padded rows out
        hs = self.head_sums
        if self.marks is not None:
            t = (w @ self.marks[:, None, :Sv].to(w.dtype)) * scale[..., None]  # (B, H, R, 3)
            t = t.sum(2)  # (B, H, 3)
            for k, name in enumerate(("cls", "sep", "punct")):
                hs[name][layer] += t[..., k]
        for name, key in (("self", self.key_self), ("prev", self.key_prev), ("next", self.key_next)):
            hs[name][layer] += self._at(w, key[:, start:stop], vq, inv)
        # entropy with Clark et al.'s smoothing over the n real keys: padded keys inside the block and real keys
        # beyond it (a causal block's future) hold exactly ε/n, added in closed form
        c = (self.eps / self.n.clamp_min(1)).to(w.dtype)  # (B,)
        p = torch.addcmul(c[:, None, None, None], w, ((1.0 - self.eps) * inv)[..., None])  # (B, H, R, S')
        h = _entropy_sum(p, positive=self.eps > 0)  # (B, H, R); p ≥ ε/n
        del p
        const = torch.special.entr(c)  # (B,)
        correction = (self.n - vk.sum(1)) - (~vk).sum(1)  # real keys beyond S' minus padded keys within
        h = (h + (correction * const)[:, None, None]) * rowmask
        hs["entropy"][layer] += h.sum(-1)
        for b, pos in enumerate(self.cls_pos):
            if start <= pos < stop:
                hs["entropy_cls"][layer, b] += h[b, :, pos - start]
        # Σ_j a_ij |c_i − c_j| = Σ_j a_ij (c_i − c_j) + 2 Σ_{j > i} a_ij (c_j − c_i); the second sum is 0 when causal
        dist = qpos[:, None, :].to(w.dtype) * total - wk  # (B, H, R)
        if not causal:
            ahead = (kpos[:, None, :] - qpos[:, :, None].to(w.dtype)).clamp_min(0)  # (B, R, S')
            dist = dist + 2.0 * (w * ahead[:, None]).sum(-1)
        hs["distance"][layer] += (dist * scale).sum(-1)
        # Voita: row maxima and argmax offsets over the real tokens
        mx, am = w.max(-1)  # (B, H, R)
        q3 = qpos[:, None, :]  # (B, 1, R)
        off = torch.where(mx > 0, self.cpos.gather(1, am.reshape(B, -1)).reshape(B, H, R) - q3, -q3)
        vo = self.voita[:, start:stop][:, None, :].expand(B, H, R)  # (B, H, R)
        self.conf_sum[layer] += (mx * vo).sum(-1)  # the row's own maximum, as HeadStats reads it
        width = 2 * self.max_length - 1
        head = torch.arange(H)[None, :, None].expand(B, H, R) + layer * H
        where = (head * width + off + self.max_length - 1)[vo]  # (rows kept,) flat histogram cells
        self.hist.index_put_((where,), torch.ones_like(where), accumulate=True)  # no histogram-sized temporary
        # detectors (padded slots, as DetectorStats)
        ds, dc = self.det_sums, self.det_counts
        for name, key in (("prev", self.slot_prev[:, start:stop]), ("first", self._first_keys(start, stop))):
            ok = vq & (key >= 0)
            ds[name][layer] += self._at(w, key, vq, inv)
            dc[name][layer] += ok.sum(1)
        for name, (nz, has) in zip(("duplicate", "induction"), self._pattern(start, stop, Sv)):
            mass = torch.zeros(B, R, H, dtype=w.dtype)
            mass.index_put_((nz[:, 0], nz[:, 1]), w[nz[:, 0], :, nz[:, 1], nz[:, 2]], accumulate=True)
            ds[name][layer] += (mass * inv.transpose(1, 2) * has[..., None]).sum(1)
            dc[name][layer] += has.sum(1)
        if self.pooled is not None:  # cell (p, q): mean over query bin p of the weight summed over key bin q
            qb = self.bin_of[start:stop]  # (R,) −1 for padding
            ok = qb >= 0
            if bool(ok.any()):
                lo, hi = int(qb[ok].min()), int(qb[ok].max())
                qbins = (qb[None, :] == torch.arange(lo, hi + 1)[:, None]).to(w.dtype)  # (P', R) the block's bins
                sums = (qbins[None] * inv[0][:, None, :]) @ w[0]  # (H, P', S'): each bin's renormalised rows summed
                self.pooled[layer, :, lo : hi + 1] += (sums @ self.onehot[:Sv].to(w.dtype)).double()  # (H, P', P)
        if self.kept is not None:
            self._keep(layer, w, inv, start, stop)
        seen = self.seen[:, start:stop]  # (B, R)
        rows = vq & (seen >= 2)
        # entropy of a = w / T: Σ entr(w) / T + ln T
        plain = _entropy_sum(w) * inv + torch.where(total > 0, total, torch.ones_like(total)).log()
        ratio = plain / torch.log(seen.clamp_min(2)).to(w.dtype)[:, None, :]
        ds["entropy_ratio_causal"][layer] += (ratio * rows[:, None, :]).sum(-1)
        dc["entropy_ratio_causal"][layer] += rows.sum(1)
        if self.js_buf is not None:
            for b, sampled in enumerate(self.js_rows):
                inside = np.flatnonzero((sampled >= start) & (sampled < stop))
                if inside.size:
                    real = torch.as_tensor(np.flatnonzero(self.valid[b, :Sv].numpy()))
                    block = w[b][:, torch.as_tensor(sampled[inside] - start)][:, :, real]  # (H, J', keys), as read
                    self.js_buf[b][layer * H : (layer + 1) * H, inside, : real.numel()] = block.float()

    def _keep(self, layer: int, w, inv, start: int, stop: int) -> None:
        """Rows ``start:stop`` of the kept queries A … B − 1 over keys A … B − 1, renormalised by ``inv``."""
        Sv = w.shape[-1]
        a0, b0 = self.keep
        lo, hi = max(a0, start), min(b0, stop)
        if lo < hi:
            cols = min(b0, Sv) - a0
            if cols > 0:
                sub = w[0, :, lo - start : hi - start, a0 : a0 + cols] * inv[0, :, lo - start : hi - start, None]
                self.kept[layer, :, lo - a0 : hi - a0, :cols] = sub.float()

    def _keep_rows(self, layer: int, w, start: int, stop: int) -> None:
        """``rows_only``: the kept rows of one block and nothing else (each row renormalised over the real keys)."""

        w = w * self.valid[:, None, None, : w.shape[-1]]  # padded keys out
        self._keep(layer, w, _inverse(w.sum(-1)), start, stop)

    @staticmethod
    def _at(w, key, vq, inv):
        """``Σ_rows a[b, h, r, key[b, r]]`` (a = w / T) over the real rows that have a key (≥ 0): ``(B, H)``."""
        B, H, R, Sv = w.shape
        ok = vq & (key >= 0) & (key < Sv)
        g = w.gather(-1, key.clamp(0, Sv - 1)[:, None, :, None].expand(B, H, R, 1))[..., 0]  # (B, H, R)
        return (g * inv * ok[:, None, :]).sum(-1)

    def _first_keys(self, start: int, stop: int):
        import torch

        i = torch.arange(start, stop)[None, :]  # (1, R)
        return torch.where(i > self.first[:, None], self.first[:, None].expand(-1, stop - start), -1)

    def _pattern(self, start: int, stop: int, Sv: int):
        """The duplicate and induction patterns of rows ``start:stop`` as nonzero ``(b, r, j)`` and rows that have
        one ``(B, R)`` — the same for every layer, so kept per block."""
        got = self._patterns.get((start, stop))
        if got is not None:
            return got
        import torch

        i = torch.arange(start, stop)[:, None]  # (R, 1)
        j = torch.arange(Sv)[None, :]  # (1, S')
        vq, vk = self.valid[:, start:stop, None], self.valid[:, None, :Sv]
        idq = self.ids[:, start:stop, None]  # (B, R, 1)
        dup = (idq == self.ids[:, None, :Sv]) & (j < i) & vq & vk  # (B, R, S')
        ind = (idq == self.ids_prev[:, None, :Sv]) & (j <= i) & vq & vk  # key j − 1 an earlier copy of query i
        got = tuple((m.nonzero(), m.any(-1)) for m in (dup, ind))
        size = sum(nz.numel() for nz, _ in got)
        if size <= self._pattern_room:  # every layer walks the same blocks: keep them while they are small
            self._patterns[(start, stop)] = got
            self._pattern_room -= size
        return got

    def pooled_maps(self) -> tuple[np.ndarray, np.ndarray]:
        """The first sequence's ``(NL, H, P, P)`` pooled maps (as :func:`headwise.viz.headview.thumbnails` pools
        a full map) and the bins' token bounds ``(P + 1,)``."""
        if self.pooled is None:
            raise ValueError("pool: the reader was made without pool=")
        counts = np.diff(self.bounds).astype(np.float64)  # (P,) tokens per query bin
        return self.pooled.numpy() / counts[None, None, :, None], self.bounds

    # -- after the pass ------------------------------------------------------------------------------
    def sentence_values(self) -> tuple[list[dict], list[dict]]:
        """Per sentence: the HeadStats values (name → ``(N,)``, plus the length, confidence, histogram-free parts)
        and the detector scores (name → ``(N,)``). NaN where a sentence has no row for a metric."""
        if not all(self.layers_read):
            missing = [k for k, done in enumerate(self.layers_read) if not done]
            raise RuntimeError(f"rows: layers {missing} were never read; is every hook_qk point on the forward path?")
        n = self.n.numpy().astype(np.int64)
        counts = {
            "cls": n,
            "sep": n,
            "punct": n,
            "entropy": n,
            "self": n,
            "distance": n,
            "prev": (self.key_prev >= 0).sum(1).numpy(),
            "next": (self.key_next >= 0).sum(1).numpy(),
        }
        heads, dets = [], []
        with np.errstate(invalid="ignore", divide="ignore"):
            for b in range(self.B):
                values = {}
                for name, s in self.head_sums.items():
                    v = s[:, b].reshape(-1).numpy()  # (N,)
                    if name == "entropy_cls":
                        values[name] = v if self.cls_pos[b] >= 0 else np.full(v.shape, np.nan)
                    else:
                        c = counts[name][b]
                        values[name] = v / c if c > 0 else np.full(v.shape, np.nan)
                ln_n = math.log(n[b]) if n[b] > 0 else 0.0
                values["entropy_ratio"] = values["entropy"] / ln_n if ln_n > 0 else np.full(v.shape, np.nan)
                heads.append(values)
                scores = {}
                for name, s in self.det_sums.items():
                    c = self.det_counts[name][:, b].numpy()[:, None]  # (NL, 1)
                    v = np.where(c > 0, s[:, b].numpy() / np.maximum(c, 1), np.nan)  # (NL, H)
                    scores[name] = v.reshape(-1)
                dets.append(scores)
        return heads, dets

    def add_to(self, head_stats=None, detector_stats=None) -> None:
        """Add every sentence of the batch to a :class:`~headwise.analysis.HeadStats` and / or a
        :class:`~headwise.analysis.DetectorStats` (sentences without a real token are skipped)."""
        heads, dets = self.sentence_values()
        n = self.n.numpy()
        N = self.num_layers * self.num_heads
        if head_stats is not None:
            if head_stats.max_length < self.L:
                raise ValueError(
                    f"max_length: the accumulator's {head_stats.max_length} is shorter than the batch's {self.L}"
                )
            hist = self.hist.reshape(N, 2 * self.max_length - 1).numpy()
            m, M = head_stats.max_length, self.max_length
            hist = hist[:, M - m : M + m - 1]  # offsets −(m − 1) … m − 1
            for b in range(self.B):
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
                hist = np.zeros_like(hist)  # the batch's histogram is added once
        if detector_stats is not None:
            kept = [b for b in range(self.B) if n[b] > 0]
            if kept:
                detector_stats.add_scores({k: np.stack([dets[b][k] for b in kept]) for k in dets[0]})


def read_rows(
    hm,
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
) -> RowReader:
    """One forward pass of ``hm`` (a :class:`headwise.models.HeadModel`) on a batch, every layer's heads reduced
    at its ``hook_qk`` point into ``head_stats`` / ``detector_stats``.

    Args:
        hm: the model (its :meth:`~headwise.models.HeadModel.read_rows` runs the pass with the readers hooked).
        ids: ``(B, L)`` token ids (torch); mask: ``(B, L)``, 1 = real token (None: all real).
        info: token info (default: :meth:`TokenInfo.plain` from the mask).
        head_stats, detector_stats: the accumulators fed.
        block_size, progress: see :class:`RowReader`.
        pool: also pool the first sequence's maps to at most ``pool`` × ``pool`` bins (:meth:`RowReader.pooled_maps`).
        keep: ``(A, B)``: also keep the first sequence's rows ``A … B − 1`` over keys ``A … B − 1`` in full
            (``reader.kept``, ``(NL, H, B − A, B − A)``; memory ``NL · H · (B − A)² · 4`` bytes).
        rows_only: form the kept rows alone — a bounded pass (the forward plus ``(B − A)`` rows of every head, no
            statistics; no ``head_stats``, ``detector_stats`` or ``pool``).
        js_max_rows: Jensen–Shannon rows per sentence (32; fewer beyond 4,096 tokens, :func:`js_row_budget`).
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
    )
    if rows_only and (head_stats is not None or detector_stats is not None):
        raise ValueError("rows_only: a pass of the kept rows alone feeds no head_stats or detector_stats")
    hm.read_rows(ids, mask, reader.readers())
    if not rows_only:
        reader.add_to(head_stats, detector_stats)
    return reader
