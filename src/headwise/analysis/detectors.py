"""Decoder head detectors: previous-token, first-token, duplicate-token and induction scores.

Shape legend: B batch, H heads, L sequence length (queries and keys are the same sequence).

Each detector is a **pattern** — for every query i, the set of keys ``P_i`` that a perfect head of that
kind would attend to — and a head's score is the share of its attention that falls on the pattern,
as in TransformerLens's ``detect_head`` ("mul" mode: ``(attention · pattern).sum() / attention.sum()``):

    score = mean over the queries i with P_i ≠ ∅ of  Σ_{j ∈ P_i} α_ij,

in [0, 1]; a head that puts all of its attention on the pattern scores exactly 1. The patterns, with
``t`` the token ids (TransformerLens's definitions):

- ``prev``: ``P_i = {i − 1}`` (previous-token head);
- ``first``: ``P_i = {f}``, f the first real token, for queries i > f — the BOS "attention sink" of
  decoders (query f itself is left out: a causal model has nowhere else to look);
- ``duplicate``: ``P_i = {j < i : t_j = t_i}``, earlier copies of the current token;
- ``induction``: ``P_i = {j ≤ i : 1 ≤ j, t_{j−1} = t_i, j − 1 < i}``, the token *after* an earlier copy
  of the current token (Olsson et al. 2022: "[A][B] … [A] → attend to [B]").

One difference from TransformerLens, stated: TransformerLens divides by every query, so a perfect
previous-token head scores (L − 1)/L there and a perfect induction head on "BOS + n random tokens
repeated twice" about n/(2n + 1); here the queries that have no pattern at all (the first token, the
first copy of a repeated segment) are left out, which makes 1 reachable and scores comparable across
lengths. Multiply by the share of queries that have a target to get TransformerLens's number.

``prev`` here is :func:`headwise.analysis.targets.attention_to_previous` (the same quantity under the
same name in encoder and decoder reports). Duplicate and induction patterns are rare in ordinary text,
so they are also measured on a **probe** (:func:`repeated_random_tokens`): a segment of random tokens
repeated, where every query of a later copy has exactly one duplicate and one induction target.

Padded positions (``valid`` False) are excluded as queries and as keys, and each real row is renormalised
over the real keys (:func:`headwise.analysis.tokens.as_attention`).

Each pattern and the share on it are written once, for a block of query rows, and called by the full maps
here and by the streaming pass (:mod:`headwise.analysis.streaming`) alike: the patterns of one key per query
(:func:`previous_keys`, :func:`first_keys`, scored by :func:`headwise.analysis.targets.mass_at`), the patterns
of token ids (:func:`duplicate_rows`, :func:`induction_rows`), and the reducer :func:`pattern_mass` of a
:class:`~headwise.analysis.block.RowBlock`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from headwise.analysis.block import RowBlock
from headwise.analysis.targets import mass_at
from headwise.analysis.tokens import TokenInfo, as_attention, mean_over_rows, squeeze
from headwise.checks import non_negative_int, positive_int

__all__ = [
    "DETECTORS",
    "previous_keys",
    "first_keys",
    "duplicate_rows",
    "induction_rows",
    "pattern_mass",
    "previous_token_pattern",
    "first_token_pattern",
    "duplicate_token_pattern",
    "induction_pattern",
    "pattern_score",
    "detector_scores",
    "Probe",
    "repeated_random_tokens",
]

#: Every detector, with a one-line meaning (tables and docs).
DETECTORS = {
    "prev": "share of attention on the previous token",
    "first": "share of attention on the first token (the BOS sink), queries after it",
    "duplicate": "share of attention on earlier copies of the current token",
    "induction": "share of attention on the token after an earlier copy of the current token",
}


def _ids_valid(ids, valid) -> tuple[np.ndarray, np.ndarray, bool]:
    t = np.asarray(ids)
    unbatched = t.ndim == 1
    if unbatched:
        t = t[None]  # (1, L)
    if t.ndim != 2:
        raise ValueError(f"ids: expected shape (B, L) or (L,), got {tuple(np.shape(ids))}")
    if not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"ids: expected integer token ids, got dtype {t.dtype}")
    v = np.ones(t.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    if v.ndim == 1:
        v = v[None]  # (1, L)
    if v.shape != t.shape:
        raise ValueError(f"ids: expected shape {v.shape} to fit the attention, got {t.shape}")
    return t, v, unbatched


def previous_keys(valid) -> np.ndarray:
    """``(B, L)`` int64: the previous-token pattern's key of each query, i − 1 (both real), or −1 (none)."""
    v = np.asarray(valid, dtype=bool)
    key = np.full(v.shape, -1, dtype=np.int64)
    key[..., 1:] = np.where(v[..., 1:] & v[..., :-1], np.arange(v.shape[-1] - 1), -1)
    return key


def first_keys(valid) -> np.ndarray:
    """``(B, L)`` int64: the first-token pattern's key of each query, the first real token f for the real queries
    after it, or −1 (none)."""
    v = np.asarray(valid, dtype=bool)
    first = np.argmax(v, axis=-1)[..., None]  # (B, 1) first real position (0 for an all-padding row)
    rows = v & (np.arange(v.shape[-1]) > first) & v.any(axis=-1, keepdims=True)  # (B, L) queries after f
    return np.where(rows, first, -1)


def _key_pattern(key: np.ndarray) -> np.ndarray:
    """``(…, L, L)`` bool of a pattern of one key per query (``key`` ``(…, L)``, −1: none)."""
    return key[..., :, None] == np.arange(key.shape[-1])


def previous_token_pattern(valid) -> np.ndarray:
    """``(B, L, L)`` bool: query i → key i − 1 (both real). ``valid`` ``(B, L)`` bool."""
    return _key_pattern(previous_keys(valid))


def first_token_pattern(valid) -> np.ndarray:
    """``(B, L, L)`` bool: every real query after the first real token f → key f."""
    return _key_pattern(first_keys(valid))


def duplicate_rows(ids, valid, start: int, stop: int, keys: int):
    """The duplicate-token pattern of queries ``start … stop − 1`` over keys ``0 … keys − 1``: ``(B, R, S')`` bool,
    query i → every earlier real key j < i with the same token id.

    Args:
        ids: ``(B, L)`` int64 tensor; valid: ``(B, L)`` bool tensor (real tokens).
    """
    import torch

    i = torch.arange(start, stop)[:, None]  # (R, 1)
    j = torch.arange(keys)[None, :]  # (1, S')
    same = ids[:, start:stop, None] == ids[:, None, :keys]  # (B, R, S')
    return same & (j < i) & valid[:, start:stop, None] & valid[:, None, :keys]


def induction_rows(ids, valid, start: int, stop: int, keys: int):
    """The induction pattern of queries ``start … stop − 1`` over keys ``0 … keys − 1``: ``(B, R, S')`` bool, query
    i → key j ≤ i when token j − 1 is an earlier copy of token i (both real; TransformerLens's
    ``get_induction_head_detection_pattern``: the duplicate-token pattern shifted one key to the right).

    Args:
        ids: ``(B, L)`` int64 tensor; valid: ``(B, L)`` bool tensor (real tokens).
    """
    import torch

    ids_prev = torch.full_like(ids, -1)  # (B, L): the id before each key (−1: none, or padding)
    ids_prev[:, 1:] = torch.where(valid[:, 1:] & valid[:, :-1], ids[:, :-1], -1)
    i = torch.arange(start, stop)[:, None]  # (R, 1)
    j = torch.arange(keys)[None, :]  # (1, S')
    same = ids[:, start:stop, None] == ids_prev[:, None, :keys]  # (B, R, S')
    return same & (j <= i) & valid[:, start:stop, None] & valid[:, None, :keys]


def _full_pattern(rows_of, ids, valid) -> np.ndarray:
    import torch

    t, v, unbatched = _ids_valid(ids, valid)
    length = t.shape[-1]
    p = rows_of(torch.as_tensor(t, dtype=torch.int64), torch.as_tensor(v), 0, length, length).numpy()  # (B, L, L)
    return p[0] if unbatched else p


def duplicate_token_pattern(ids, valid=None) -> np.ndarray:
    """``(B, L, L)`` bool: query i → every earlier real key j < i with the same token id (:func:`duplicate_rows`).

    Args:
        ids: ``(B, L)`` (or ``(L,)``) integer token ids.
        valid: ``(B, L)`` bool, real tokens (default: all).
    """
    return _full_pattern(duplicate_rows, ids, valid)


def induction_pattern(ids, valid=None) -> np.ndarray:
    """``(B, L, L)`` bool: query i → key j when token j − 1 is an earlier copy of token i (j − 1 < i)
    (:func:`induction_rows`).

    The duplicate-token pattern shifted one key to the right (TransformerLens's
    ``get_induction_head_detection_pattern``); keys j ≤ i, all real.
    """
    return _full_pattern(induction_rows, ids, valid)


def pattern_mass(block: RowBlock, entries):
    """Each renormalised row's weight on its pattern, ``Σ_{j ∈ P_i} a_ij``: the reducer of :func:`pattern_score`.

    Args:
        block: the rows.
        entries: ``(K, 3)`` int64, the pattern's entries ``(b, r, j)`` (``nonzero()`` of a ``(B, R, S')`` pattern).
    Returns:
        ``(B, H, R)``; 0 at padded rows and rows without an entry.
    """
    import torch

    w = block.w
    B, H, R, _ = w.shape
    mass = torch.zeros(B, R, H, dtype=w.dtype)  # (B, R, H): the entries' weights, every head at once
    mass.index_put_((entries[:, 0], entries[:, 1]), w[entries[:, 0], :, entries[:, 1], entries[:, 2]], accumulate=True)
    return mass.transpose(1, 2) * block.scale


def pattern_score(attn, pattern, info: TokenInfo | None = None) -> np.ndarray:
    """The share of each head's attention on a pattern, over the queries that have a target.

    Args:
        attn: ``(B, H, L, L)`` or ``(H, L, L)`` weights (rows sum to 1 over the real keys).
        pattern: ``(B, L, L)`` (or ``(L, L)``) bool, True where query i's key j is on the pattern.
        info: token info (None: every position real).
    Returns:
        ``(B, H)`` (or ``(H,)``): ``mean_{i : P_i ≠ ∅} Σ_{j ∈ P_i} α_ij``; NaN for a sentence where no
        real query has a target.
    Raises:
        ValueError: as :func:`headwise.analysis.tokens.as_attention`; a pattern of the wrong shape.
    """
    a, info, unbatched = as_attention(attn, info)
    p = np.asarray(pattern, dtype=bool)
    if p.ndim == 2:
        p = p[None]  # (1, L, L)
    if p.shape != (a.shape[0],) + a.shape[2:]:
        raise ValueError(f"pattern: expected shape {(a.shape[0],) + a.shape[2:]} to fit attn, got {p.shape}")
    import torch

    p = p & info.valid[:, :, None] & info.valid[:, None, :]
    mass = pattern_mass(RowBlock.full(a, info), torch.as_tensor(p).nonzero()).numpy()  # (B, H, L)
    return squeeze(mean_over_rows(mass, p.any(axis=-1)), unbatched)  # over the queries with a target


def detector_scores(attn, ids, info: TokenInfo | None = None) -> dict[str, np.ndarray]:
    """Every detector of :data:`DETECTORS` for a batch: name → ``(B, H)`` (or ``(H,)``) scores.

    Args:
        attn: ``(B, H, L, L)`` or ``(H, L, L)``.
        ids: ``(B, L)`` (or ``(L,)``) token ids of the same positions.
        info: token info (None: every position real).
    """
    import torch

    a, info, unbatched = as_attention(attn, info)
    t, _, _ = _ids_valid(ids, info.valid)
    block = RowBlock.full(a, info)
    scores = {}
    for name, key in (("prev", previous_keys(info.valid)), ("first", first_keys(info.valid))):
        scores[name] = mean_over_rows(mass_at(block, torch.as_tensor(key)).numpy(), key >= 0)
    for name, pattern in (("duplicate", duplicate_token_pattern), ("induction", induction_pattern)):
        p = pattern(t, info.valid)  # (B, L, L)
        scores[name] = mean_over_rows(pattern_mass(block, torch.as_tensor(p).nonzero()).numpy(), p.any(axis=-1))
    return {name: squeeze(v, unbatched) for name, v in scores.items()}


@dataclass(frozen=True)
class Probe:
    """A probe of repeated random tokens: ``[bos] s s … s`` (``repeats`` copies of one segment s).

    Attributes:
        length: tokens in the segment s.
        repeats: copies of s (≥ 2 for duplicate and induction targets).
        batch: sequences (each with its own s).
        seed: seed of NumPy's ``default_rng`` drawing the segments.
        bos: the id put first, or None (no prefix).
    """

    length: int = 32
    repeats: int = 2
    batch: int = 8
    seed: int = 0
    bos: int | None = None

    def __post_init__(self):
        positive_int("length", self.length)
        positive_int("batch", self.batch)
        non_negative_int("seed", self.seed)
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 2:
            raise ValueError(f"repeats: expected an integer ≥ 2, got {self.repeats!r}")

    @property
    def total_length(self) -> int:
        """Tokens per sequence: ``length · repeats`` (+ 1 with a BOS)."""
        return self.length * self.repeats + (self.bos is not None)

    def to_dict(self) -> dict:
        return dict(asdict(self), total_length=self.total_length)


def repeated_random_tokens(vocab_size: int, probe: Probe = Probe(), *, exclude: Iterable[int] = ()) -> np.ndarray:
    """The probe's token ids: ``(probe.batch, probe.total_length)`` int64.

    Each sequence draws its segment of ``probe.length`` distinct ids uniformly from ``[0, vocab_size)``
    minus ``exclude`` (special tokens), so the only repeats are the designed ones: every query in copy
    r ≥ 2 has exactly one duplicate target and one induction target per earlier copy. (TransformerLens
    draws with replacement; distinct ids keep the patterns exact.)

    Raises:
        ValueError: a vocabulary with fewer usable ids than ``probe.length``.
    """
    positive_int("vocab_size", vocab_size)
    banned = {int(x) for x in exclude}
    pool = np.array([i for i in range(vocab_size) if i not in banned], dtype=np.int64)
    if pool.size < probe.length:
        raise ValueError(
            f"probe.length: expected at most the {pool.size} usable token ids of the vocabulary, got {probe.length}"
        )
    rng = np.random.default_rng(probe.seed)
    segments = np.stack([rng.choice(pool, size=probe.length, replace=False) for _ in range(probe.batch)])  # (B, n)
    ids = np.tile(segments, (1, probe.repeats))  # (B, n · repeats)
    if probe.bos is not None:
        ids = np.concatenate([np.full((probe.batch, 1), probe.bos, dtype=np.int64), ids], axis=1)
    return ids.astype(np.int64)
