"""Per-head metrics on attention maps whose answers are known by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headwise import analysis as A

N = 12


def _shift(n: int, k: int) -> np.ndarray:
    """Row i attends to i + k (rows whose i + k falls outside attend to themselves)."""
    m = np.zeros((n, n))
    for i in range(n):
        j = i + k
        m[i, j if 0 <= j < n else i] = 1.0
    return m


def _random_maps(rng, heads: int, n: int, sharp: float = 3.0) -> np.ndarray:
    x = rng.normal(size=(heads, n, n)) * sharp
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_identity_attends_to_self():
    attn = np.eye(N)[None]  # (H=1, L, L)
    assert A.attention_to_self(attn)[0] == pytest.approx(1.0, abs=1e-15)
    assert A.attention_to_previous(attn)[0] == 0.0
    assert A.attention_to_next(attn)[0] == 0.0
    assert A.mean_attention_distance(attn)[0] == 0.0
    assert A.confidence(attn)[0] == pytest.approx(1.0)
    share, offset, positional = A.positional_heads(attn)
    assert (share[0], offset[0], positional[0]) == (1.0, 0, True)


def test_shifted_identity_attends_to_previous():
    attn = _shift(N, -1)[None]
    # Every row that has a previous token puts all its weight there; row 0 has none and is left out
    # (Clark et al.'s notebook would count it as 0 and give (N − 1) / N).
    assert A.attention_to_previous(attn)[0] == 1.0
    assert A.attention_to_self(attn)[0] == pytest.approx(1 / N, abs=1e-15)
    assert A.attention_to_next(attn)[0] == 0.0
    assert A.mean_attention_distance(attn)[0] == pytest.approx((N - 1) / N)
    share, offset, positional = A.positional_heads(attn)
    assert offset[0] == -1 and share[0] == pytest.approx((N - 1) / N) and positional[0]
    nxt = _shift(N, 1)[None]
    assert A.attention_to_next(nxt)[0] == 1.0
    # Half of the rows that have a previous token look there: 0.5, whatever row 0 does.
    half = _shift(N, -1)
    half[2::2] = np.eye(N)[2::2]
    assert A.attention_to_previous(half[None])[0] == pytest.approx(((N - 1) - (N - 1) // 2) / (N - 1), abs=1e-15)
    assert np.isnan(A.attention_to_previous(np.ones((1, 1, 1)))[0])
    assert A.positional_heads(nxt)[1][0] == 1


def test_previous_token_is_one_for_any_length():
    for n in (2, 3, 500):
        assert A.attention_to_previous(_shift(n, -1)[None])[0] == 1.0


def test_uniform_attention_has_entropy_ln_n():
    for n in (2, 7, 40):
        attn = np.full((3, n, n), 1.0 / n)
        np.testing.assert_allclose(A.attention_entropy(attn), math.log(n), rtol=1e-12)
        np.testing.assert_allclose(A.entropy_ratio(attn), 1.0, rtol=1e-12)
        info = A.TokenInfo.plain(1, n)
        np.testing.assert_allclose(A.uniform_entropy(info), [math.log(n)], rtol=1e-15)
        np.testing.assert_allclose(A.confidence(attn), 1.0 / n, rtol=1e-12)
        np.testing.assert_allclose(A.mean_attention_distance(attn), (n * n - 1) / (3 * n), rtol=1e-12)


def test_identity_entropy_is_that_of_the_smoothed_row():
    eps = A.CLARK_ENTROPY_SMOOTHING
    big, small = (1 - eps) + eps / N, eps / N
    expected = -(big * math.log(big) + (N - 1) * small * math.log(small))
    np.testing.assert_allclose(A.attention_entropy(np.eye(N)[None]), [expected], rtol=1e-12)
    assert A.attention_entropy(np.eye(N)[None], smoothing=0.0)[0] == 0.0


def test_entropy_matches_clark_notebook_formula():
    rng = np.random.default_rng(0)
    attns = _random_maps(rng, 4, 9)  # (H, n, n), one document, no padding
    smoothed = 0.9999 * attns + (0.0001 / attns.shape[-1])  # as in Clark et al.'s General_Analysis notebook
    expected = -(smoothed * np.log(smoothed)).sum(-1).mean(-1)
    np.testing.assert_allclose(A.attention_entropy(attns), expected, rtol=1e-12)
    tokens = ["[CLS]"] + ["w"] * 7 + ["[SEP]"]
    expected_cls = -(smoothed * np.log(smoothed))[:, 0].sum(-1)
    np.testing.assert_allclose(A.cls_entropy(attns, A.token_info([tokens])), expected_cls, rtol=1e-12)


def test_attention_to_token_kinds():
    tokens = ["[CLS]", "the", "cat", ",", "sat", ".", "[SEP]"]
    n = len(tokens)
    attn = np.zeros((2, n, n))
    attn[0, :, 0] = 0.6  # head 0: 0.6 to [CLS], 0.3 to [SEP], 0.1 split between the two punctuation marks
    attn[0, :, 6] = 0.3
    attn[0, :, 3] = attn[0, :, 5] = 0.05
    attn[1] = np.eye(n)  # head 1: self
    info = A.token_info([tokens])
    np.testing.assert_allclose(A.attention_to_cls(attn, info), [0.6, 1 / n])
    np.testing.assert_allclose(A.attention_to_sep(attn, info), [0.3, 1 / n])
    np.testing.assert_allclose(A.attention_to_punctuation(attn, info), [0.1, 2 / n])
    assert info.punct[0].tolist() == [False, False, False, True, False, True, False]
    other = A.token_info([tokens], punctuation={"."})
    np.testing.assert_allclose(A.attention_to_punctuation(attn, other), [0.05, 1 / n])


def _js_reference(p: np.ndarray, q: np.ndarray, eps: float) -> float:
    """Mean over rows of ½ KL(p‖m) + ½ KL(q‖m), written out independently."""
    n = p.shape[-1]
    total = 0.0
    for i in range(n):
        ps = (1 - eps) * p[i] + eps / n
        qs = (1 - eps) * q[i] + eps / n
        m = 0.5 * (ps + qs)
        total += 0.5 * sum(ps[j] * math.log(ps[j] / m[j]) for j in range(n))
        total += 0.5 * sum(qs[j] * math.log(qs[j] / m[j]) for j in range(n))
    return total / n


def test_identical_heads_have_zero_js_and_others_match_the_formula():
    rng = np.random.default_rng(1)
    heads = _random_maps(rng, 3, 8)
    heads = np.concatenate([heads, heads[:1]])  # head 3 is a copy of head 0
    div = A.js_divergence_between_heads(heads)
    assert div[0, 3] == 0.0 and div[3, 0] == 0.0
    assert np.all(np.diag(div) == 0.0)
    np.testing.assert_array_equal(div, div.T)
    for a, b in [(0, 1), (1, 2), (0, 2)]:
        assert div[a, b] == pytest.approx(_js_reference(heads[a], heads[b], 1e-3), rel=1e-10)
        assert 0.0 < div[a, b] <= math.log(2)
    np.testing.assert_allclose(A.js_distance_between_heads(heads), np.sqrt(div))


def test_js_distance_agrees_with_scipy():
    distance = pytest.importorskip("scipy.spatial.distance")
    rng = np.random.default_rng(2)
    rows = _random_maps(rng, 1, 6)[0, :2]  # two distributions over 6 keys
    heads = np.repeat(rows[:, None, :], 6, axis=1)  # (2, 6, 6): every query row of head k is rows[k]
    eps = 1e-3
    p, q = ((1 - eps) * r + eps / 6 for r in rows)
    ours = A.js_distance_between_heads(heads)
    assert ours[0, 1] == pytest.approx(distance.jensenshannon(p, q), rel=1e-9)


def test_classical_mds_recovers_planar_distances():
    rng = np.random.default_rng(3)
    pts = rng.normal(size=(10, 2))
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    coords = A.classical_mds(d, 2)
    d2 = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
    np.testing.assert_allclose(d2, d, atol=1e-10)
    np.testing.assert_allclose(coords.mean(0), 0.0, atol=1e-12)
    with pytest.raises(ValueError, match="distances"):
        A.classical_mds(np.ones((3, 4)))


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="attn"):
        A.attention_to_self(np.ones((4, 4)))
    with pytest.raises(ValueError, match="attn"):
        A.attention_to_self(np.ones((1, 3, 4)))
    with pytest.raises(ValueError, match="attn"):
        A.attention_to_self(np.full((1, 3, 3), np.nan))
    with pytest.raises(ValueError, match="info.valid"):
        A.attention_to_self(np.eye(3)[None], A.TokenInfo.plain(1, 4))
    with pytest.raises(TypeError, match="offset"):
        A.attention_to_offset(np.eye(3)[None], 1.5)
    with pytest.raises(ValueError, match="smoothing"):
        A.attention_entropy(np.eye(3)[None], smoothing=1.0)
