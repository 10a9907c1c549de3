"""The NumPy reference on cases whose answers can be written down by hand."""

import subprocess
import sys

import numpy as np
import pytest

import headwise.reference as ref


def test_importing_reference_does_not_import_torch():
    code = "import sys, headwise.reference; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_softmax_is_stable_and_masks():
    x = np.array([[1000.0, 1000.0, -np.inf], [1.0, 2.0, 3.0]])
    w = ref.softmax(x)
    np.testing.assert_allclose(w[0], [0.5, 0.5, 0.0], atol=1e-15)
    e = np.exp([1.0, 2.0, 3.0])
    np.testing.assert_allclose(w[1], e / e.sum(), rtol=1e-15)
    m = ref.softmax(np.zeros((2, 3)), mask=np.array([[True, False, False], [True, True, True]]))
    np.testing.assert_allclose(m, [[0, 0.5, 0.5], [0, 0, 0]], atol=1e-15)


def test_hand_checkable_attention():
    # Two keys; the query matches key 0 with score ln(3)·sqrt(2)/sqrt(2): weights (3/4, 1/4).
    dh = 2
    q = np.array([[np.log(3.0) * np.sqrt(dh), 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 0.0]])
    v = np.array([[4.0, 0.0], [0.0, 8.0]])
    out, w = ref.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(w, [[0.75, 0.25]], rtol=1e-14)
    np.testing.assert_allclose(out, [[3.0, 2.0]], rtol=1e-14)


def test_float_mask_minus_inf_equals_bool_mask():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 4, 5, 8))
    blocked = rng.random((5, 5)) < 0.4
    a = ref.scaled_dot_product_attention(q, k, v, mask=blocked)
    b = ref.scaled_dot_product_attention(q, k, v, mask=np.where(blocked, -np.inf, 0.0))
    np.testing.assert_allclose(a[0], b[0], atol=1e-15)
    np.testing.assert_allclose(a[1], b[1], atol=1e-15)


def test_split_merge_roundtrip_and_layout():
    x = np.arange(2 * 3 * 8).reshape(2, 3, 8).astype(float)
    h = ref.split_heads(x, 4)
    assert h.shape == (2, 4, 3, 2)
    np.testing.assert_array_equal(h[:, 1], x[:, :, 2:4])  # head 1 owns features 2..3
    np.testing.assert_array_equal(ref.merge_heads(h), x)


def test_sinusoidal_table_formula():
    pe = ref.sinusoidal_table(50, 64)
    pos, i = 7, 1
    assert pe[pos, 2 * i] == pytest.approx(np.sin(pos / 10000 ** (2 * i / 64)), abs=1e-15)
    assert pe[pos, 2 * i + 1] == pytest.approx(np.cos(pos / 10000 ** (2 * i / 64)), abs=1e-15)
    with pytest.raises(ValueError, match="d_model"):
        ref.sinusoidal_table(10, 7)


def test_rope_conventions_are_permutations_of_each_other():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 5, 8))
    pos = np.arange(5)
    half = ref.apply_rope(x, pos, convention="half")
    # interleaved layout of the same pairs: feature i <-> 2i, i + Dh/2 <-> 2i + 1
    perm = np.array([0, 4, 1, 5, 2, 6, 3, 7])
    inter = ref.apply_rope(x[..., perm], pos, convention="interleaved")
    np.testing.assert_allclose(inter, half[..., perm], atol=1e-14)


def test_rope_scores_depend_only_on_offset():
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(2, 1, 16))
    s1 = ref.apply_rope(q, np.array([5])) @ ref.apply_rope(k, np.array([2])).T
    s2 = ref.apply_rope(q, np.array([105])) @ ref.apply_rope(k, np.array([102])).T
    np.testing.assert_allclose(s1, s2, rtol=1e-10)


def test_alibi_slopes_match_paper():
    np.testing.assert_allclose(ref.alibi_slopes(8), 2.0 ** -np.arange(1, 9), rtol=1e-15)
    # 12 heads: the 8 slopes of 8, then every other slope of 16 (BLOOM / MPT / the paper's code)
    s16 = 2.0 ** (-0.5 * np.arange(1, 17))
    np.testing.assert_allclose(ref.alibi_slopes(12), np.concatenate([2.0 ** -np.arange(1, 9), s16[0::2][:4]]))


def test_gqa_equals_mha_with_repeated_kv_weights():
    rng = np.random.default_rng(3)
    d, h, hkv, dh = 16, 4, 2, 4
    p = {
        n: rng.normal(size=s)
        for n, s in (("wq", (d, h * dh)), ("wk", (d, hkv * dh)), ("wv", (d, hkv * dh)), ("wo", (h * dh, d)))
    }
    x = rng.normal(size=(2, 5, d))
    out_gqa, w_gqa = ref.multi_head_attention(x, p, h, num_kv_heads=hkv)
    rep = lambda w: np.repeat(w.reshape(d, hkv, dh), h // hkv, axis=1).reshape(d, h * dh)  # noqa: E731
    out_mha, w_mha = ref.multi_head_attention(x, {**p, "wk": rep(p["wk"]), "wv": rep(p["wv"])}, h)
    np.testing.assert_allclose(out_gqa, out_mha, atol=1e-12)
    np.testing.assert_allclose(w_gqa, w_mha, atol=1e-12)
