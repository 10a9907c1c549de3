"""Decoder detectors on attention maps whose scores are known by hand; the probe; decoder roles."""

from __future__ import annotations

import numpy as np
import pytest

from headwise import analysis as A
from headwise.analysis import detectors as D
from headwise.analysis.decoder import DECODER_METRICS, DecoderStats, DetectorStats


def _causal_uniform(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]


def _one_hot_rows(n: int, target) -> np.ndarray:
    """Row i puts all its weight on key target(i) (or on itself when target(i) is None)."""
    m = np.zeros((n, n))
    for i in range(n):
        j = target(i)
        m[i, i if j is None else j] = 1.0
    return m


SEG = 6
PROBE = D.Probe(length=SEG, repeats=3, batch=2, seed=5, bos=99)


def _probe_ids() -> np.ndarray:
    return D.repeated_random_tokens(50, PROBE)  # (2, 19): BOS + 3 copies of 6 distinct ids


def test_exact_heads_score_one_on_their_own_pattern():
    ids = _probe_ids()[0]
    n = ids.size
    prev = _one_hot_rows(n, lambda i: i - 1 if i else None)
    first = _one_hot_rows(n, lambda i: 0)
    # duplicate: a later copy looks at the same token one segment back; induction: at the token after it.
    dup = _one_hot_rows(n, lambda i: i - SEG if i > SEG else 0)
    ind = _one_hot_rows(n, lambda i: i - SEG + 1 if i > SEG else 0)
    scores = D.detector_scores(np.stack([prev, first, dup, ind]), ids)
    # Row 1's only earlier key is 0, its previous token: the heads that look at key 0 get 1 / (n − 1).
    np.testing.assert_array_equal(scores["prev"], [1.0, 1 / (n - 1), 1 / (n - 1), 1 / (n - 1)])
    assert scores["first"][1] == 1.0
    assert scores["duplicate"][2] == 1.0 and scores["induction"][2] == 0.0
    assert scores["induction"][3] == 1.0 and scores["duplicate"][3] == 0.0
    # The first copy has no duplicate / induction target: those rows are left out, not counted as 0.
    assert scores["duplicate"][1] == 0.0 and scores["induction"][0] == 0.0
    every = np.stack(list(scores.values()))
    assert np.all((every >= 0) & (every <= 1))


def test_uniform_causal_head_by_hand():
    ids = _probe_ids()[0]
    n = ids.size
    s = D.detector_scores(_causal_uniform(n)[None], ids)
    rows = np.arange(1, n)
    np.testing.assert_allclose(s["prev"], [np.mean(1 / (rows + 1))], rtol=1e-12)
    np.testing.assert_allclose(s["first"], [np.mean(1 / (rows + 1))], rtol=1e-12)
    # Query i in copy r ≥ 2 (0-based c = (i − 1) // SEG) has c duplicate and c induction targets.
    later = np.arange(1 + SEG, n)
    copies = (later - 1) // SEG
    np.testing.assert_allclose(s["duplicate"], [np.mean(copies / (later + 1))], rtol=1e-12)
    np.testing.assert_allclose(s["induction"], [np.mean(copies / (later + 1))], rtol=1e-12)


def test_prev_is_the_shared_previous_token_metric_and_transformerlens_ratio():
    rng = np.random.default_rng(0)
    n = 11
    x = np.where(np.tril(np.ones((n, n))) > 0, rng.normal(size=(3, n, n)) * 3, -np.inf)
    a = np.exp(x - x.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    ids = rng.integers(0, 4, size=n)  # few ids: many duplicates
    s = D.detector_scores(a, ids)
    np.testing.assert_allclose(s["prev"], A.attention_to_previous(a), rtol=1e-12)
    # TransformerLens divides the pattern's mass by every row: ours × (rows with a target) / n.
    dup = D.duplicate_token_pattern(ids)
    tl = (a * dup[None]).sum(axis=(-1, -2)) / a.sum(axis=(-1, -2))
    np.testing.assert_allclose(s["duplicate"] * dup.any(-1).sum() / n, tl, rtol=1e-12)


def test_padding_changes_nothing():
    rng = np.random.default_rng(1)
    ids = _probe_ids()
    n = ids.shape[1]
    x = np.where(np.tril(np.ones((n, n))) > 0, rng.normal(size=(2, 3, n, n)) * 3, -np.inf)
    a = np.exp(x - x.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    alone = D.detector_scores(a, ids)
    pad = 4  # left padding: garbage rows and keys, real rows leak 0.2 onto padded keys
    big = rng.random((2, 3, n + pad, n + pad))
    big /= big.sum(-1, keepdims=True)
    big[:, :, pad:, pad:] = 0.8 * a
    valid = np.zeros((2, n + pad), dtype=bool)
    valid[:, pad:] = True
    info = A.TokenInfo(valid, ~valid & valid, ~valid & valid, ~valid & valid)
    padded_ids = np.concatenate([np.full((2, pad), 7), ids], axis=1)
    padded = D.detector_scores(big, padded_ids, info)
    for name in D.DETECTORS:
        np.testing.assert_allclose(padded[name], alone[name], rtol=1e-12, err_msg=name)


def test_no_target_gives_nan():
    s = D.detector_scores(np.eye(3)[None], np.array([1, 2, 3]))
    assert np.isnan(s["duplicate"][0]) and np.isnan(s["induction"][0]) and s["prev"][0] == 0.0


def test_probe_tokens():
    ids = _probe_ids()
    assert ids.shape == (2, PROBE.total_length) == (2, 1 + 3 * SEG) and ids.dtype == np.int64
    assert np.all(ids[:, 0] == 99)
    for row in ids:
        seg = row[1 : 1 + SEG]
        assert len(set(seg.tolist())) == SEG  # distinct: the only repeats are the designed ones
        np.testing.assert_array_equal(row[1:], np.tile(seg, 3))
    np.testing.assert_array_equal(ids, D.repeated_random_tokens(50, PROBE))
    other = D.repeated_random_tokens(50, D.Probe(length=SEG, repeats=3, batch=2, seed=6, bos=99))
    assert not np.array_equal(ids, other)
    banned = D.repeated_random_tokens(10, D.Probe(length=8, batch=20, seed=0), exclude=[0, 1])
    assert banned.min() >= 2 and banned.max() < 10
    with pytest.raises(ValueError, match="probe.length"):
        D.repeated_random_tokens(9, D.Probe(length=8), exclude=[0, 1])
    with pytest.raises(ValueError, match="repeats"):
        D.Probe(repeats=1)


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="pattern"):
        D.pattern_score(np.eye(3)[None], np.ones((4, 4), dtype=bool))
    with pytest.raises(ValueError, match="ids"):
        D.detector_scores(np.eye(3)[None], np.array([0.5, 1.0, 2.0]))
    with pytest.raises(ValueError, match="ids"):
        D.detector_scores(np.eye(3)[None], np.arange(4))


@pytest.mark.parametrize(
    ("values", "role"),
    [
        ({}, "other"),
        ({"entropy_ratio_causal": 0.9}, "broad"),
        ({"first": 0.6, "entropy_ratio_causal": 0.9}, "first-token sink"),
        ({"prev": 0.5, "first": 0.9}, "previous-token"),  # a pattern role comes before the sink
        ({"induction_probe": 0.45, "prev": 0.6}, "previous-token"),  # the larger share wins
        ({"induction_probe": 0.7, "duplicate_probe": 0.7}, "induction"),  # ties: the order
        ({"duplicate_probe": 0.41}, "duplicate-token"),
        ({"induction_probe": 0.39, "duplicate_probe": np.nan}, "other"),
    ],
)
def test_decoder_roles(values, role):
    names = ("induction_probe", "duplicate_probe", "prev", "first", "entropy_ratio_causal")
    base = {k: np.zeros((1, 1)) for k in names}
    base.update({k: np.full((1, 1), v) for k, v in values.items()})
    assert A.decoder_roles(base)[0, 0] == role
    assert role in A.ROLES


def test_decoder_stats_report():
    ids = _probe_ids()
    n = ids.shape[1]
    prev = _one_hot_rows(n, lambda i: i - 1 if i else None)
    ind = _one_hot_rows(n, lambda i: i - SEG + 1 if i > SEG else 0)
    layer0 = np.broadcast_to(np.stack([prev, _causal_uniform(n)]), (2, 2, n, n))
    layer1 = np.broadcast_to(np.stack([ind, _one_hot_rows(n, lambda i: 0)]), (2, 2, n, n))
    info = A.TokenInfo.plain(2, n)
    probe = DetectorStats(2, 2)
    probe.update([layer0, layer1], ids, info)
    stats = DecoderStats(2, 2, max_length=n)
    stats.update([layer0, layer1], ids, info)
    report = stats.result(probe.result(), PROBE)
    assert report.roles.tolist() == [["previous-token", "broad"], ["induction", "first-token sink"]]
    assert report.metrics["induction_probe"][1, 0] == 1.0 and report.metrics["prev"][0, 0] == 1.0
    # Uniform over the visible prefix: causal entropy ratio 1; one-hot rows: 0.
    np.testing.assert_allclose(report.metrics["entropy_ratio_causal"], [[0.0, 1.0], [0.0, 0.0]], atol=1e-12)
    np.testing.assert_array_equal(report.metrics["induction"], report.metrics["induction_probe"])
    rows = report.rows()
    assert list(rows[0])[2 : 2 + len(DECODER_METRICS)] == list(DECODER_METRICS)
    data = report.to_dict()
    assert data["kind"] == "decoder" and data["probe"]["total_length"] == n and data["role_thresholds"]["induction"]
    assert "cls" not in rows[0] and rows[0]["entropy"] is not None
