"""The lab's tasks: the designed repeats are where they are said to be; relation targets by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwise.lab.tasks import induction_probe, place_copies, relation_targets, relation_task, repeated_segments


def _longest_repeat(row: np.ndarray) -> int:
    """Length of the longest segment that occurs twice without overlapping (brute force)."""
    best, L = 0, len(row)
    for n in range(1, L // 2 + 1):
        seen = {}
        for s in range(L - n + 1):
            key = tuple(row[s : s + n])
            if key in seen and seen[key] + n <= s:
                best = n
                break
            seen.setdefault(key, s)
    return best


def test_place_copies_never_overlap_and_spread():
    rng = np.random.default_rng(0)
    starts = []
    for _ in range(2000):
        n, k = int(rng.integers(1, 20)), int(rng.integers(2, 4))
        s = place_copies(rng, 64, n, k)
        assert all(b - a >= n for a, b in zip(s, s[1:])) and s[0] >= 0 and s[-1] + n <= 64
        starts.append(s[0])
    assert min(starts) == 0 and max(starts) > 30  # first copies anywhere, not at a fixed place
    with pytest.raises(ValueError, match="copies"):
        place_copies(rng, 10, 6, 2)


def test_repeated_segments_hold_a_repeat_of_at_least_min_segment():
    x = repeated_segments(np.random.default_rng(1), 64, length=64, vocab_size=256, min_segment=4, max_segment=32)
    assert x.shape == (64, 64) and x.dtype == torch.int64 and int(x.min()) >= 0 and int(x.max()) < 256
    assert all(_longest_repeat(row) >= 4 for row in x.numpy())
    with pytest.raises(ValueError, match="max_segment"):
        repeated_segments(np.random.default_rng(1), 2, length=64, vocab_size=256, max_segment=40)


def test_induction_probe_masks_mark_the_second_copy():
    ids, copy, first = induction_probe(np.random.default_rng(2), 200, length=64, vocab_size=256)
    for row, c, f in zip(ids.numpy(), copy.numpy(), first.numpy()):
        (s2,) = np.flatnonzero(f)
        n = int(c.sum()) + 1
        assert 8 <= n <= 24 and c[s2 + 1 : s2 + n].all()
        segment = row[s2 : s2 + n]
        earlier = [s for s in range(0, s2 - n + 1) if (row[s : s + n] == segment).all()]
        assert earlier, "the second copy has a first copy before it"


def test_relation_targets_by_hand():
    x = torch.tensor([[3, 9, 1, 15, 4, 7, 2]])
    y, scored = relation_targets(x, "difference", 16)
    assert scored.tolist() == [[False] * 5 + [True] * 2]
    assert y[0, 5] == (4 - 3) % 16 and y[0, 6] == (7 - 9) % 16
    y, _ = relation_targets(x, "sum", 16)
    assert y[0, 5] == (4 + 3) % 16 and y[0, 6] == (7 + 9) % 16
    y, scored = relation_targets(x, "previous", 16)
    assert y[0, 1:].tolist() == x[0, :-1].tolist() and not scored[0, 0]
    with pytest.raises(ValueError, match="task"):
        relation_task(np.random.default_rng(0), 2, task="product", length=8, vocab_size=16)
