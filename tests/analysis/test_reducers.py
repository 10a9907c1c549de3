"""Each metric's reducer (the per-row maths, written once): on a block of rows it gives the rows of the whole map,
whatever the block's keys (a causal block sees only the keys up to its last row), and equals the formula written
out here independently."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwise import analysis as A
from headwise.analysis.block import RowBlock
from headwise.analysis.confidence import count_offsets, row_max_offsets
from headwise.analysis.detectors import duplicate_rows, first_keys, induction_rows, pattern_mass, previous_keys
from headwise.analysis.distance import distance_rows
from headwise.analysis.entropy import causal_entropy_ratio_rows, entropy_rows
from headwise.analysis.targets import mass_at, mass_on
from headwise.analysis.tokens import as_attention


def _maps(seed: int, B: int = 2, H: int = 3, L: int = 11, *, causal: bool = False):
    """Random softmax maps ``(B, H, L, L)`` (causal: lower triangle) and right padding of the second sentence."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, H, L, L)) * 2
    if causal:
        x = np.where(np.tri(L, dtype=bool), x, -np.inf)
    e = np.exp(x - x.max(-1, keepdims=True))
    lengths = np.array([L] + [L - 3] * (B - 1))
    info = A.TokenInfo.plain(B, L, lengths)
    ids = rng.integers(0, 4, (B, L))
    return e / e.sum(-1, keepdims=True), info, ids


def _blocks(a: np.ndarray, info, *, causal: bool, edges=(0, 3, 4, 8)):
    """``RowBlock.of`` over rows ``edges[k] … edges[k + 1] − 1`` (and the rest), keys up to the block's end when
    causal."""
    w = torch.as_tensor(a)
    valid = torch.as_tensor(info.valid)
    B, L = valid.shape
    pos = torch.arange(L).expand(B, L)
    cuts = list(edges) + [L]
    for start, stop in zip(cuts[:-1], cuts[1:]):
        keys = stop if causal else L
        yield RowBlock.of(
            w[:, :, start:stop, :keys], start, valid[:, start:stop], valid[:, :keys], valid.sum(1),
            pos[:, start:stop], pos[:, :keys], causal=causal,
        )  # fmt: skip


@pytest.mark.parametrize("causal", [False, True])
def test_every_reducer_of_a_block_gives_those_rows_of_the_whole_map(causal):
    raw, info, ids = _maps(0, causal=causal)
    a, info, _ = as_attention(raw, info)
    full = RowBlock.full(a, info)
    marks = torch.as_tensor(np.stack([info.valid, np.roll(info.valid, 1, -1) & info.valid], -1).astype(np.float64))
    key = torch.as_tensor(previous_keys(info.valid))
    valid, t = torch.as_tensor(info.valid), torch.as_tensor(ids)
    L = a.shape[-1]
    pattern = duplicate_rows(t, valid, 0, L, L).nonzero()
    reducers = {
        "mass_on": lambda b: mass_on(b, marks[:, : b.w.shape[-1]]),
        "mass_at": lambda b: mass_at(b, key[:, b.start : b.stop]),
        "entropy": lambda b: entropy_rows(b),
        "plain entropy": lambda b: entropy_rows(b, 0.0),
        "causal ratio": lambda b: causal_entropy_ratio_rows(b, valid.long().cumsum(1)[:, b.start : b.stop])[0],
        "distance": distance_rows,
        "row max": lambda b: row_max_offsets(b)[0],
        "offsets": lambda b: row_max_offsets(b)[1] * b.rows[:, None, :],
        "duplicate": lambda b: pattern_mass(b, duplicate_rows(t, valid, b.start, b.stop, b.w.shape[-1]).nonzero()),
    }
    for name, reduce in reducers.items():
        whole = reduce(full)
        parts = torch.cat([reduce(b) for b in _blocks(a, info, causal=causal)], dim=2)  # rows along axis 2
        torch.testing.assert_close(parts, whole, atol=1e-12, rtol=0, msg=name)
    assert pattern.shape[1] == 3


def test_the_reducers_equal_the_formulas_written_out():
    raw, info, ids = _maps(1)
    a, info, _ = as_attention(raw, info)
    block = RowBlock.full(a, info)
    B, H, L, _ = a.shape
    v = info.valid
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    rows = v[:, None, :]  # (B, 1, L)
    np.testing.assert_allclose(distance_rows(block).numpy(), (a * np.abs(i - j)).sum(-1) * rows, atol=1e-12)
    n = v.sum(1)[:, None, None, None]
    p = np.where(v[:, None, None, :], 0.9999 * a + 1e-4 / n, 1.0)  # padded keys: 1 · ln 1 = 0
    np.testing.assert_allclose(entropy_rows(block).numpy(), -(p * np.log(p)).sum(-1) * rows, atol=1e-12)
    plain = -(a * np.log(np.where(a > 0, a, 1.0))).sum(-1)
    np.testing.assert_allclose(entropy_rows(block, 0.0).numpy(), plain * rows, atol=1e-12)
    mx, off = row_max_offsets(block)
    np.testing.assert_array_equal(mx.numpy(), a.max(-1))
    np.testing.assert_array_equal(np.where(rows, off.numpy(), 0), np.where(rows, a.argmax(-1) - i.T, 0))
    hist = torch.zeros(H, 2 * L - 1, dtype=torch.int64)
    count_offsets(hist, off, torch.as_tensor(v), L)
    want = np.zeros((H, 2 * L - 1), dtype=np.int64)
    for b, h, q in zip(*np.nonzero(np.broadcast_to(rows, (B, H, L)))):
        want[h, a[b, h, q].argmax() - q + L - 1] += 1
    np.testing.assert_array_equal(hist.numpy(), want)
    key = torch.as_tensor(first_keys(v))
    got = mass_at(block, key).numpy()
    k = key.numpy()
    at = np.take_along_axis(a, np.maximum(k, 0)[:, None, :, None], -1)[..., 0]  # (B, H, L): a[b, h, q, k[b, q]]
    np.testing.assert_allclose(got, np.where(k[:, None] >= 0, at, 0.0), atol=1e-15, rtol=0)


def test_the_patterns_of_one_key_and_of_token_ids_equal_their_definitions():
    rng = np.random.default_rng(2)
    valid = rng.random((3, 9)) < 0.75
    ids = rng.integers(0, 3, (3, 9))
    L = 9
    prev = np.zeros((3, L, L), dtype=bool)
    first = np.zeros((3, L, L), dtype=bool)
    dup = np.zeros((3, L, L), dtype=bool)
    ind = np.zeros((3, L, L), dtype=bool)
    for b in range(3):
        real = np.flatnonzero(valid[b])
        for q in range(L):
            if not valid[b, q]:
                continue
            prev[b, q, q - 1] = q >= 1 and valid[b, q - 1]
            first[b, q, real[0]] = q > real[0]
            for k in range(L):
                dup[b, q, k] = k < q and valid[b, k] and ids[b, k] == ids[b, q]
                ind[b, q, k] = 1 <= k <= q and valid[b, k] and valid[b, k - 1] and ids[b, k - 1] == ids[b, q]
    np.testing.assert_array_equal(A.previous_token_pattern(valid), prev)
    np.testing.assert_array_equal(A.first_token_pattern(valid), first)
    np.testing.assert_array_equal(A.duplicate_token_pattern(ids, valid), dup)
    np.testing.assert_array_equal(A.induction_pattern(ids, valid), ind)
    t, v = torch.as_tensor(ids), torch.as_tensor(valid)
    np.testing.assert_array_equal(duplicate_rows(t, v, 2, 6, 6).numpy(), dup[:, 2:6, :6])
    np.testing.assert_array_equal(induction_rows(t, v, 2, 6, 6).numpy(), ind[:, 2:6, :6])


def test_the_keys_of_an_offset_are_real_tokens_only():
    from headwise.analysis.targets import offset_keys

    valid = np.array([[True, True, False, True, True]])
    key, has = offset_keys(valid, -1)
    np.testing.assert_array_equal(key, [[-1, 0, 1, -1, 3]])  # query 2 (padding) is left out by its row mask
    np.testing.assert_array_equal(has, [[False, True, True, False, True]])
    key, has = offset_keys(valid, 7)
    assert np.all(key == -1) and not has.any()
