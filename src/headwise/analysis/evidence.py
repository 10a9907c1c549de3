"""Evidence of what each head does, gathered over a corpus in the same streaming pass as its statistics.

Shape legend: NL layers, H query heads per layer, B batch, L padded length, R rows of one block, S' keys a block
can see, K offsets (``offsets``), T kept contexts per head (``top``), C snippet tokens (``context``), M marks.

:class:`HeadEvidence` is the corpus-level accumulator; :meth:`HeadEvidence.reader` gives, for one batch, a factory
that :func:`~headwise.analysis.streaming.read_rows` (its ``extra=``) turns into a :class:`EvidenceReader` on the
batch's :class:`~headwise.analysis.row_readers.Layout`, so the evidence and ``heads``' statistics come from one
forward pass::

    stats, evidence = DecoderStats(hm.num_layers, hm.num_heads), HeadEvidence(hm.num_layers, hm.num_heads)
    texts = 0
    for ids, mask in batches:
        read_rows(hm, ids, mask, head_stats=stats.heads, detector_stats=stats.detectors,
                  extra=[evidence.reader(first_text=texts)])  # marks=, line_start= as the accumulator was made
        texts += ids.shape[0]
    result = evidence.result()

Conventions (the streaming pass's): positions count among the real tokens of a text (padding skipped); each row
is taken over the real keys and renormalised (:attr:`RowBlock.scale <headwise.analysis.block.RowBlock>`); every
real query row counts once, so every share is a token-weighted mean over the corpus's real query rows
(:attr:`Evidence.rows`). The first real token of a text (the usual sink) is reported apart, as ``first``, and left
out of the offsets, the marks and the contexts (with ``skip_self``, the contexts leave the query's own key out too).

Memory, independent of the corpus's length: the sums ``NL · H · (2K + 2 + M) · 8`` bytes and the kept contexts
``NL · H · T · (6 + C) · 8`` bytes (K = 32, T = 8, C = 24, one mark: about 2.4 kB a head in all); per batch, the
patterns every layer shares (the offsets' keys ``B · L · K' · 9`` bytes, K' = K causal, 2K otherwise; the
same-token pattern's entries, within :data:`PATTERN_ROOM` kept, beyond it made again per layer) and one block's
temporaries: the weights at the offsets' keys ``B · H · R · K'``, the ``(B, R, S')`` same-token pattern as bools,
``O(B · H · (R + S'))`` sums, and copies of the rows whose maximum may be a key left aside (the first token where
texts start at different slots, the query's own with ``skip_self``; at most the block, ``B · H · R · S'``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from headwise import checks
from headwise.analysis.block import RowBlock
from headwise.analysis.corpus import check_state
from headwise.analysis.detectors import pattern_mass
from headwise.analysis.evidence_top import EMPTY, FIELDS, GAP, NONE, merge_top, snippets
from headwise.analysis.row_readers import PATTERN_ROOM, Layout
from headwise.analysis.targets import mass_at

__all__ = ["Context", "Evidence", "EvidenceReader", "HeadEvidence", "SAME_TOKEN", "LINE_START", "GAP"]

#: The mark every run has: the share on keys with the query's own token id (the key not the query itself).
SAME_TOKEN = "same-token"
#: The mark of :meth:`HeadEvidence.reader`'s ``line_start``: the share on the first token of the query's line.
LINE_START = "line-start"


@dataclass(frozen=True)
class Context:
    """One row of a head: the query, its strongest key (the first real token aside) and a snippet around them.

    Attributes:
        text: the text's global index (``first_text + b``).
        query, key: positions among the text's real tokens.
        weight: the key's renormalised weight in the query's row.
        ids: the snippet's token ids (at most ``context``), :data:`GAP` (−1) where the span between key and query
            is cut.
        key_at, query_at: the key's and the query's index in ``ids``.
    """

    text: int
    query: int
    key: int
    weight: float
    ids: tuple[int, ...]
    key_at: int
    query_at: int

    @property
    def offset(self) -> int:
        """``query − key`` (negative: a key after the query, encoders)."""
        return self.query - self.key


@dataclass(frozen=True)
class Evidence:
    """What :class:`HeadEvidence` found over a corpus.

    Attributes:
        offsets: ``(NL, H, K')``: each head's mean share at offset ``d = start + i`` (``d`` = query position − key
            position, the first real token left out). Causal passes: ``start = 0``, K' = K (d = 0 … K − 1);
            a pass with a non-causal block (encoders): ``start = −K``, K' = 2K (d = −K … K − 1).
        start: the offset of column 0.
        first: ``(NL, H)`` the mean share on the first real token (every real row, its own included).
        beyond: ``(NL, H)`` the mean share at ``|d| ≥ K`` (outside the columns), the first token aside; per row
            ``first + Σ offsets + beyond = 1``.
        marks: name → ``(NL, H)`` mean share on keys carrying the mark (:data:`SAME_TOKEN`, the caller's marks,
            :data:`LINE_START`), the first real token left out.
        contexts: ``contexts[layer][head]``: up to ``top`` :class:`Context` s, strongest first (ties: text, then
            query).
        rows: the real query rows counted; min_keys: the fewest real keys a context's row saw; skip_self: the
            contexts leave the query's own key out (:class:`HeadEvidence`).
    """

    offsets: np.ndarray
    start: int
    first: np.ndarray
    beyond: np.ndarray
    marks: dict[str, np.ndarray]
    contexts: list[list[list[Context]]]
    rows: int
    min_keys: int
    skip_self: bool = False

    def at_offset(self, d: int) -> np.ndarray:
        """``(NL, H)`` the share at offset ``d`` (ValueError outside the columns)."""
        i = d - self.start
        if not 0 <= i < self.offsets.shape[-1]:
            raise ValueError(f"d: expected an offset in [{self.start}, {self.start + self.offsets.shape[-1]}), got {d}")
        return self.offsets[..., i]


class HeadEvidence:
    """Every head's evidence over a corpus, accumulated batch by batch (memory in the module docstring).

    The contexts: every real query row that sees at least ``min_keys`` real keys offers its strongest key but the
    first token (and, with ``skip_self``, its own), weighed renormalised; each head keeps the ``top`` strongest of
    the corpus, merged block by block (equal weights ordered by text, then query position: an order that does not
    depend on the blocks, the batches or the order runs are merged in).

    Args:
        num_layers, num_heads: NL and H (query heads).
        top: T, the contexts kept per head.
        offsets: K, the offsets with a column of their own (0 … K − 1; encoders also −K … −1).
        min_keys: a row is a context candidate only when it sees at least this many real keys (its own
            position included; causal: ``query + 1``, non-causal: the text's length) — the first rows of a causal
            text, trivially peaked, would otherwise fill every head's top.
        context: C, the most tokens of a context's snippet (≥ 5).
        marks: the names of the caller's marks every batch passes (:meth:`reader`).
        line_start: every batch passes each query's line start (the :data:`LINE_START` share).
        skip_self: also leave the query's own key out of the contexts (a row's strongest other key is shown):
            many heads fall back on the current token when their pattern finds nothing, as others do on the first
            token, and such rows of weight ≈ 1 can fill the top of a head whose pattern is elsewhere (the
            offsets still count them, at d = 0).
        causal: the model is a decoder: every row sees the keys up to its own (a pass may hand a decoder's blocks
            unflagged — a Hugging Face model's mask comes as an explicit mask — which would count the text's every
            key as seen and every offset after the query as a column).
    Raises:
        ValueError: naming the argument: a size that is not a positive integer, ``context`` < 5, a mark named as
            a built-in one or twice.
    """

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        *,
        top: int = 8,
        offsets: int = 32,
        min_keys: int = 8,
        context: int = 24,
        marks: tuple[str, ...] = (),
        line_start: bool = False,
        skip_self: bool = False,
        causal: bool = False,
    ):
        import torch

        for name, value in (("num_layers", num_layers), ("num_heads", num_heads), ("top", top)):
            checks.positive_int(name, value)
        self.K = checks.positive_int("offsets", offsets)
        self.min_keys = checks.positive_int("min_keys", min_keys)
        if checks.positive_int("context", context) < 5:
            raise ValueError(f"context: expected at least 5 tokens (key, query and a gap), got {context}")
        marks = tuple(marks)
        if len(set(marks)) != len(marks) or {SAME_TOKEN, LINE_START} & set(marks):
            raise ValueError(
                f"marks: expected distinct names other than {SAME_TOKEN!r} and {LINE_START!r}, got {marks}"
            )
        self.num_layers, self.num_heads, self.top, self.context = num_layers, num_heads, top, context
        self.mark_names, self.line_start, self.skip_self = marks, bool(line_start), bool(skip_self)
        self.causal = bool(causal)
        self.names = (SAME_TOKEN, *marks) + ((LINE_START,) if line_start else ())
        z = (num_layers, num_heads)
        self._off = torch.zeros(*z, 2 * self.K, dtype=torch.float64)  # column c: d = c − K
        self._first, self._beyond = torch.zeros(z, dtype=torch.float64), torch.zeros(z, dtype=torch.float64)
        self._marks = torch.zeros(*z, len(self.names), dtype=torch.float64)
        self._rows = 0
        self._bidirectional = False
        self._top_w = torch.full((*z, top), EMPTY, dtype=torch.float64)
        self._top_f = torch.zeros(*z, top, FIELDS + context, dtype=torch.int64)

    def reader(
        self,
        *,
        first_text: int,
        marks: Mapping[str, np.ndarray] | None = None,
        line_start: np.ndarray | None = None,
    ) -> Callable[[Layout], EvidenceReader]:
        """A factory of one batch's :class:`EvidenceReader` for ``read_rows(..., extra=[...])`` (arguments as
        :meth:`batch`)."""
        return lambda layout: self.batch(layout, first_text=first_text, marks=marks, line_start=line_start)

    def batch(
        self,
        layout: Layout,
        *,
        first_text: int,
        marks: Mapping[str, np.ndarray] | None = None,
        line_start: np.ndarray | None = None,
    ) -> EvidenceReader:
        """The :class:`~headwise.analysis.streaming.BlockReader` of one batch's pass.

        Args:
            layout: the batch's :class:`Layout` (token ids, real tokens).
            first_text: the global index of the batch's first text (contexts name ``first_text + b``).
            marks: name → ``(B, L)`` bool, keys carrying the mark (punctuation, newlines …): exactly the names the
                accumulator was made with.
            line_start: ``(B, L)`` int, for each query slot the position (among the text's real tokens) of the
                first token of its line, −1 for none — needed when the accumulator was made with ``line_start``.
        Raises:
            ValueError: naming the argument: other mark names, arrays not ``(B, L)``, a negative ``first_text``.
        """
        return EvidenceReader(self, layout, first_text, marks or {}, line_start)

    # -- accumulated ---------------------------------------------------------------------------------
    def add_rows(self, rows: int) -> None:
        self._rows += int(rows)

    def add_block(self, layer: int, offsets, first, beyond, marks, *, bidirectional: bool) -> None:
        """Add one block's sums: ``offsets`` ``(H, 2K)``, ``first`` / ``beyond`` ``(H,)``, ``marks`` ``(H, M)``."""
        self._off[layer] += offsets
        self._first[layer] += first
        self._beyond[layer] += beyond
        self._marks[layer] += marks
        self._bidirectional |= bidirectional

    def add_top(self, layer: int, weights, fields) -> None:
        """Merge candidates ``weights`` ``(H, M)`` (:data:`EMPTY`: none), ``fields`` ``(H, M, F)`` into the top."""
        self._top_w[layer], self._top_f[layer] = merge_top(
            self._top_w[layer], self._top_f[layer], weights, fields, self.top
        )

    def state(self) -> dict:
        """Everything accumulated as float64 tensors (integers exact below 2⁵³): ``offsets``, ``first``,
        ``beyond``, ``marks``, ``rows``, ``bidirectional`` add up across runs; ``top.weights`` / ``top.fields`` are
        merged by weight (:meth:`add_state`), so a run across ranks gathers these rather than summing them."""
        import torch

        return {
            "offsets": self._off.clone(),
            "first": self._first.clone(),
            "beyond": self._beyond.clone(),
            "marks": self._marks.clone(),
            "rows": torch.tensor(float(self._rows), dtype=torch.float64),
            "bidirectional": torch.tensor(float(self._bidirectional), dtype=torch.float64),
            "top.weights": self._top_w.clone(),
            "top.fields": self._top_f.double(),
        }

    def add_state(self, state) -> None:
        """Add another accumulator's :meth:`state` (same sizes and marks): sums added, contexts merged by weight.

        Raises:
            ValueError: other keys or shapes (naming ``state``).
        """
        import torch

        check_state("state", self.state(), state)
        self._off += torch.as_tensor(state["offsets"], dtype=torch.float64)
        self._first += torch.as_tensor(state["first"], dtype=torch.float64)
        self._beyond += torch.as_tensor(state["beyond"], dtype=torch.float64)
        self._marks += torch.as_tensor(state["marks"], dtype=torch.float64)
        self._rows += int(round(float(state["rows"])))
        self._bidirectional |= bool(float(state["bidirectional"]))
        w = torch.as_tensor(state["top.weights"], dtype=torch.float64)
        f = torch.as_tensor(state["top.fields"]).round().long()
        for layer in range(self.num_layers):
            self.add_top(layer, w[layer], f[layer])

    def result(self) -> Evidence:
        """The means over the real query rows counted (NaN before any) and the kept contexts."""
        rows = self._rows
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (lambda s: s.numpy() / rows) if rows else (lambda s: np.full(tuple(s.shape), np.nan))
            offsets = mean(self._off)
            start = -self.K
            if not self._bidirectional:
                offsets, start = offsets[..., self.K :], 0
            marks = mean(self._marks)
            return Evidence(
                offsets=offsets,
                start=start,
                first=mean(self._first),
                beyond=mean(self._beyond),
                marks={name: marks[..., k] for k, name in enumerate(self.names)},
                contexts=self._contexts(),
                rows=rows,
                min_keys=self.min_keys,
                skip_self=self.skip_self,
            )

    def _contexts(self) -> list[list[list[Context]]]:
        w, f = self._top_w.numpy(), self._top_f.numpy()
        out = []
        for layer in range(self.num_layers):
            heads = []
            for head in range(self.num_heads):
                kept = []
                for t in np.flatnonzero(w[layer, head] > EMPTY):
                    text, query, key, key_at, query_at = (int(v) for v in f[layer, head, t, :FIELDS])
                    ids = tuple(int(v) for v in f[layer, head, t, FIELDS:] if v != NONE)
                    kept.append(Context(text, query, key, float(w[layer, head, t]), ids, key_at, query_at))
                heads.append(kept)
            out.append(heads)
        return out


class EvidenceReader:
    """One batch's reader of a streaming pass (:meth:`HeadEvidence.batch`): adds each block of each layer's rows to
    the accumulator — offsets, first token, marks, and the block's strongest rows merged into the running top.

    The patterns every layer shares (the keys at each offset, the same-token pattern, the marks, the candidate
    rows) are made once per block and kept for the next layers.
    """

    def __init__(self, evidence: HeadEvidence, layout: Layout, first_text: int, marks: Mapping, line_start):
        import torch

        ev, B, L = evidence, layout.B, layout.L
        checks.non_negative_int("first_text", first_text)
        if set(marks) != set(ev.mark_names):
            raise ValueError(f"marks: expected the names {sorted(ev.mark_names)}, got {sorted(marks)}")
        if (line_start is not None) != ev.line_start:
            raise ValueError(
                f"line_start: the accumulator was made with line_start={ev.line_start}, got "
                f"{'an array' if line_start is not None else 'none'}"
            )
        self.ev, self.layout, self.first_text = ev, layout, first_text
        valid, cpos = layout.valid, layout.cpos
        self.fslot = valid.long().argmax(1)  # (B,) the first real token's slot
        self.first_all = bool((self.fslot == self.fslot[0]).all())
        slot_of = torch.full((B, L + 1), -1, dtype=torch.int64)  # real position → slot (column L: padding)
        slot_of.scatter_(1, torch.where(valid, cpos, L), torch.arange(L).expand(B, L).contiguous())
        self.slot_of = slot_of[:, :L]  # (B, L)
        not_first = valid.clone()
        not_first[torch.arange(B), self.fslot] = False
        self.not_first = not_first  # (B, L) real keys but the first
        mk = [_check_array(f"marks['{name}']", marks[name], (B, L), bool) for name in ev.mark_names]
        self.marks = torch.stack([torch.as_tensor(m) for m in mk], -1) & not_first[..., None] if mk else None
        self.line_key = None
        if line_start is not None:
            ls = torch.as_tensor(_check_array("line_start", line_start, (B, L), np.int64))
            ok = valid & (ls >= 1) & (ls < layout.n[:, None]) & (ls != cpos)  # not the first token, not itself
            self.line_key = torch.where(ok, self.slot_of.gather(1, ls.clamp(0, L - 1)), -1)  # (B, L) key slots
        self._patterns: dict[tuple[int, int, bool], tuple] = {}
        self._room = PATTERN_ROOM

    def block(self, layer: int, block: RowBlock) -> None:
        import torch

        ev, w = self.ev, block.w
        B, H, R, Sv = w.shape
        start, stop = block.start, block.stop
        causal = block.causal or ev.causal  # a decoder's blocks: its rows see the keys up to their own
        slots, ok, same, cand = self._pattern(start, stop, Sv, causal)
        if layer == 0:
            ev.add_rows(int(block.rows.sum()))
        # offsets: each row's weight at the keys of every offset
        K2 = slots.shape[-1]
        g = w.gather(-1, slots[:, None].expand(B, H, R, K2)) * ok[:, None]  # (B, H, R, K2)
        off = torch.einsum("bhrk,bhr->hk", g, block.scale)
        offsets = torch.zeros(H, 2 * ev.K, dtype=torch.float64)
        offsets[:, ev.K :] = off[:, : ev.K]
        if K2 > ev.K:
            offsets[:, : ev.K] = off[:, ev.K :].flip(-1)  # d = −1 … −K stored at columns K − 1 … 0
        # each key's renormalised weight summed over the block's rows (one contraction, then every key set's share)
        col = (block.scale[:, :, None, :] @ w)[:, :, 0, :]  # (B, H, S')
        f = self.fslot[:, None, None].clamp(max=Sv - 1).expand(B, H, 1)
        first = (col.gather(-1, f)[..., 0] * (self.fslot < Sv)[:, None]).sum(0)  # (H,) every real row, its own too
        beyond = (block.total * block.scale).sum((0, 2)) - first - off.sum(-1)
        marks = [pattern_mass(block, same).sum((0, 2))[:, None]]  # (H, 1)
        if self.marks is not None:
            marks.append((col @ self.marks[:, :Sv].to(w.dtype)).sum(0))  # (H, M)
        if self.line_key is not None:
            marks.append(mass_at(block, self.line_key[:, start:stop]).sum((0, 2))[:, None])
        ev.add_block(layer, offsets, first, beyond, torch.cat(marks, -1), bidirectional=not causal)
        self._top(layer, block, cand)

    def _top(self, layer: int, block: RowBlock, cand) -> None:
        """Each row's strongest key (the first token aside, and the query's own with ``skip_self``); the block's
        strongest rows of each head merged into the running top. The rows' maxima are read without their
        positions; a row whose maximum may be a key left aside is read again without it, and the key of a row is
        found only for the rows kept."""
        import torch

        ev, w = self.ev, block.w
        B, H, R, Sv = w.shape
        # the keys looked at: those after the first token's slot when every text starts there (a view), else all
        lo = int(self.fslot[0]) + 1 if self.first_all else 0
        if Sv <= lo:
            return
        best = w[..., lo:].amax(-1)  # (B, H, R)
        aside = [] if self.first_all else [self.fslot[:, None, None].expand(B, H, R)]
        if ev.skip_self:
            aside.append(torch.arange(block.start, block.stop)[None, None, :].expand(B, H, R))
        aside = torch.stack(aside, -1) if aside else None  # (B, H, R, E) key slots left aside
        if aside is not None:
            inside = (aside >= lo) & (aside < Sv)
            hit = ((w.gather(-1, aside.clamp(max=Sv - 1)) >= best[..., None]) & inside).any(-1)  # (B, H, R)
            if bool(hit.any()):
                b, h, r = hit.nonzero(as_tuple=True)
                best[b, h, r] = _without(w, b, h, r, lo, aside[b, h, r]).amax(-1)
        weight = (best * block.scale).double()
        weight = torch.where(cand[:, None] & (weight > 0), weight, EMPTY)  # (B, H, R)
        flat = weight.permute(1, 0, 2).reshape(H, B * R)  # (H, B·R): text, then query order
        k = min(ev.top, B * R)
        idx = torch.sort(flat, dim=1, descending=True, stable=True).indices[:, :k]  # (H, k)
        top_w = flat.gather(1, idx)
        b, r = idx // R, idx % R
        h = torch.arange(H)[:, None].expand(H, k)
        bf, hf, rf = b.reshape(-1), h.reshape(-1), r.reshape(-1)
        kslot = (_without(w, bf, hf, rf, lo, None if aside is None else aside[bf, hf, rf]).argmax(-1) + lo).view(H, k)
        query = block.qpos[b, r]
        key = self.layout.cpos[b, kslot]
        n = self.layout.n[b]
        pos, key_at, query_at = snippets(query.reshape(-1), key.reshape(-1), n.reshape(-1), ev.context)
        bb = b.reshape(-1, 1).expand_as(pos)
        ids = self.layout.ids[bb, self.slot_of[bb, pos.clamp(min=0)].clamp(min=0)]
        ids = torch.where(pos >= 0, ids, pos).reshape(H, k, -1)  # GAP / NONE kept
        fields = torch.stack([b + self.first_text, query, key, key_at.reshape(H, k), query_at.reshape(H, k)], -1)
        ev.add_top(layer, top_w, torch.cat([fields, ids], -1))

    def _pattern(self, start: int, stop: int, Sv: int, causal: bool):
        """What every layer's block ``start:stop`` shares: the key slot of each offset ``(B, R, K2)`` and whether
        it is a real key other than the first ``(B, R, K2)``; the same-token pattern's entries ``(E, 3)``; the
        context candidates ``(B, R)``."""
        import torch

        got = self._patterns.get((start, stop, causal))
        if got is not None:
            return got
        lay, K = self.layout, self.ev.K
        rows, qpos, n = lay.valid[:, start:stop], lay.cpos[:, start:stop], lay.n[:, None]
        d = torch.arange(K) if causal else torch.cat([torch.arange(K), -torch.arange(1, K + 1)])  # (K2,)
        kpos = qpos[..., None] - d  # (B, R, K2)
        ok = rows[..., None] & (kpos >= 1) & (kpos < n[..., None])
        slots = torch.where(ok, self.slot_of.gather(1, kpos.clamp(0, lay.L - 1).reshape(lay.B, -1)).view_as(kpos), 0)
        ok = ok & (slots < Sv)
        ids = lay.ids
        key_slots = torch.arange(Sv)[None, None, :]
        same = (ids[:, start:stop, None] == ids[:, None, :Sv]) & rows[..., None] & self.not_first[:, None, :Sv]
        same = (same & (key_slots != torch.arange(start, stop)[None, :, None])).nonzero()  # (E, 3)
        seen = qpos + 1 if causal else n.expand_as(qpos)
        cand = rows & (seen >= self.ev.min_keys)
        got = (slots, ok, same, cand)
        size = slots.numel() * 2 + same.numel()
        if size <= self._room:
            self._patterns[(start, stop, causal)] = got
            self._room -= size
        return got


def _without(w, b, h, r, lo: int, aside):
    """Rows ``w[b, h, r, lo:]`` ``(n, S' − lo)`` (a copy) with the keys ``aside`` ``(n, E)`` (slots; those outside
    ``lo … S' − 1`` ignored) set to −1, below every weight."""
    import torch

    rows = w[b, h, r, lo:]
    if aside is None:
        return rows
    width = rows.shape[-1]
    at = torch.where((aside >= lo) & (aside < lo + width), aside - lo, width)  # width: a spare column
    rows = torch.cat([rows, rows.new_zeros(rows.shape[0], 1)], -1)
    return rows.scatter_(-1, at, -1.0)[:, :width]


def _check_array(name: str, value, shape: tuple[int, int], dtype) -> np.ndarray:
    a = np.asarray(value)
    if a.shape != shape:
        raise ValueError(f"{name}: expected shape (B, L) = {shape}, got {a.shape}")
    return a.astype(dtype)
