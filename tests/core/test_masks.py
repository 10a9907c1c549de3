"""The causality rule (``masks.causal``) and its one conversion (``masks.causality``).

Hand-checkable small cases, and every small case against a brute-force reference written as loops over
query and key slots (exact: boolean masks compared with ``torch.equal``).
"""

import itertools

import pytest
import torch

from headwise.core import masks


def brute_force(q_slots, k_slots, window=None, sink_tokens=0):
    """``(L, S)`` bool by the rule in words: a key after the query, or W or more behind it (unless a sink)."""
    rows = []
    for i in q_slots:
        row = []
        for j in k_slots:
            after = j > i
            behind = window is not None and j <= i - window and j >= sink_tokens
            row.append(after or behind)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool).reshape(len(q_slots), len(k_slots))


def test_causal_by_hand():
    t = torch.arange(4)
    assert torch.equal(masks.causal(t, t), torch.ones(4, 4, dtype=torch.bool).triu(1))
    want = torch.tensor(  # window 2, the first token a sink: row 3 sees 0 (sink), 2 and 3
        [
            [0, 1, 1, 1],
            [0, 0, 1, 1],
            [0, 0, 0, 1],
            [0, 1, 0, 0],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(masks.causal(t, t, 2, sink_tokens=1), want)
    # queries after a cache of 3, over a ring's keys (stream indices 0, 2, 3, then the new 4)
    got = masks.causal(torch.tensor([4]), torch.tensor([0, 2, 3, 4]), 2)
    assert got.tolist() == [[True, True, False, False]]


def test_causality_flag_and_mask_by_hand():
    assert masks.causality(False, 3, 3, as_flag=True) == (False, None)  # not causal: nothing at all
    assert masks.causality(True, 3, 3, as_flag=True) == (True, None)  # the kernel's top-left flag
    flag, blocked = masks.causality(True, 3, 3)  # a path that cannot take the flag gets the mask
    assert not flag and blocked.tolist() == [[False, True, True], [False, False, True], [False, False, False]]
    flag, blocked = masks.causality(True, 2, 5, q_offset=3, as_flag=True)  # after a cache: never the flag
    assert not flag and blocked.tolist() == [[False] * 4 + [True], [False] * 5]
    assert masks.causality(True, 1, 5, q_offset=4, as_flag=True) == (False, None)  # one new token: no mask
    flag, blocked = masks.causality(True, 1, 5, q_offset=4, window=2, as_flag=True)
    assert not flag and blocked.tolist() == [[True, True, True, False, False]]
    slots = torch.tensor([0, 5, 6])  # a ring's keys: the flag never applies, even from slot 0
    flag, blocked = masks.causality(True, 1, 3, q_offset=6, key_slots=slots, window=2, sink_tokens=1, as_flag=True)
    assert not flag and blocked.tolist() == [[False, False, False]]


CASES = [
    (L, S, offset, window, sinks)
    for L, S in ((1, 1), (1, 4), (3, 3), (2, 5), (4, 6))
    for offset in range(0, S - L + 1)
    for window, sinks in itertools.product((None, 1, 2, 3, 8), (0, 1, 2))
    if window is not None or sinks == 0
]


@pytest.mark.parametrize("L, S, offset, window, sinks", CASES)
def test_causality_equals_brute_force(L, S, offset, window, sinks):
    q = list(range(offset, offset + L))
    want = brute_force(q, list(range(S)), window, sinks)
    flag, got = masks.causality(
        True, L, S, q_offset=offset, window=window, sink_tokens=sinks, as_flag=sinks == 0 and window is None
    )
    if flag:  # the flag means the kernel's top-left causality: triu(1) on an L × S grid
        assert offset == 0 and window is None
        got = torch.ones(L, S, dtype=torch.bool).triu(1)
    if got is None:  # nothing blocked: the claim must be true
        got = torch.zeros(L, S, dtype=torch.bool)
    assert torch.equal(got, want)
    assert torch.equal(masks.causal(torch.tensor(q), torch.arange(S), window, sink_tokens=sinks), want)


@pytest.mark.parametrize("seed", range(20))
def test_causality_on_key_slots_equals_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    S = int(torch.randint(1, 9, (1,), generator=g))
    key_slots = torch.randperm(12, generator=g)[:S].sort().values  # a ring's held keys: sorted, with gaps
    L = int(torch.randint(1, 4, (1,), generator=g))
    offset = int(key_slots[-1]) + 1 - L if int(key_slots[-1]) + 1 >= L else 0
    window = [None, 1, 2, 4][seed % 4]
    sinks = seed % 3 if window is not None else 0
    q = list(range(offset, offset + L))
    _, got = masks.causality(True, L, S, q_offset=offset, window=window, key_slots=key_slots, sink_tokens=sinks)
    assert torch.equal(got, brute_force(q, key_slots.tolist(), window, sinks))


def test_the_ring_kernels_causal_block_is_the_rule():
    from headwise.distributed.kernels import MathKernel

    q = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    k = torch.randn(1, 1, 4, 3, dtype=torch.float64)
    s = MathKernel._scores(q, k, True, 0.5)  # (B, Hkv, g, Lq, Sk)
    assert torch.equal(torch.isneginf(s[0, 0, 0]), brute_force(range(4), range(4)))


def test_require_causal_and_narrowest():
    masks.require_causal(False, None)
    masks.require_causal(True, 3)
    with pytest.raises(ValueError, match=r"is_causal: a module with sliding_window=3 attends causally"):
        masks.require_causal(False, 3)
    assert masks.narrowest(None, None) is None
    assert masks.narrowest(4, None) == 4 and masks.narrowest(None, 5) == 5 and masks.narrowest(4, 2) == 2
