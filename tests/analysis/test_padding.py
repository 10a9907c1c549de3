"""Padding must not change the metrics of the real tokens; the corpus aggregate must equal its parts."""

from __future__ import annotations

import numpy as np
import pytest

from headwise import analysis as A
from headwise.analysis.confidence import positional_from_histogram

TOKENS = [
    ["[CLS]", "in", "the", "beginning", ",", "god", "created", ".", "[SEP]"],
    ["[CLS]", "it", "was", "good", ".", "[SEP]"],
]


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _sentence_maps(rng, heads, n):
    return _softmax(rng.normal(size=(heads, n, n)) * 3)


def _pad(maps, length, rng, leak=0.0):
    """Embed (H, n, n) maps into (H, L, L): garbage rows at padded queries, `leak` of each real row moved
    onto padded keys (0 for a model that masks them, as BERT)."""
    heads, n, _ = maps.shape
    out = _softmax(rng.normal(size=(heads, length, length)) * 5)  # garbage everywhere
    out[:, :n, :n] = maps * (1 - leak)
    if leak:
        out[:, :n, n:] = leak * _softmax(rng.normal(size=(heads, n, length - n)))
    else:
        out[:, :n, n:] = 0.0
    return out


METRIC_FUNCS = {
    "cls": lambda a, i: A.attention_to_cls(a, i),
    "sep": lambda a, i: A.attention_to_sep(a, i),
    "punct": lambda a, i: A.attention_to_punctuation(a, i),
    "self": lambda a, i: A.attention_to_self(a, i),
    "prev": lambda a, i: A.attention_to_previous(a, i),
    "next": lambda a, i: A.attention_to_next(a, i),
    "entropy": lambda a, i: A.attention_entropy(a, i),
    "entropy_cls": lambda a, i: A.cls_entropy(a, i),
    "entropy_ratio": lambda a, i: A.entropy_ratio(a, i),
    "distance": lambda a, i: A.mean_attention_distance(a, i),
    "confidence": lambda a, i: A.confidence(a, i),
}


@pytest.mark.parametrize("leak", [0.0, 0.3])
def test_padding_does_not_change_any_metric(leak):
    rng = np.random.default_rng(0)
    heads, length = 4, 14
    singles = [_sentence_maps(rng, heads, len(t)) for t in TOKENS]
    batch = np.stack([_pad(m, length, rng, leak) for m in singles])  # (B, H, L, L)
    info = A.token_info(TOKENS, length=length)
    for name, f in METRIC_FUNCS.items():
        got = f(batch, info)  # (B, H)
        for b, (m, toks) in enumerate(zip(singles, TOKENS)):
            alone = f(m[None], A.token_info([toks]))[0]  # the unpadded sentence
            np.testing.assert_allclose(got[b], alone, rtol=1e-12, atol=1e-15, err_msg=name)
    # Voita's positional test pools tokens: padding must add none.
    share, offset, _ = A.positional_heads(batch, info)
    pooled = np.concatenate(
        [A.argmax_offsets(m[None], A.token_info([t]))[0][:, 1:-1] for m, t in zip(singles, TOKENS)], axis=1
    )  # (H, tokens) without [CLS]/[SEP] rows
    for h in range(heads):
        values, counts = np.unique(pooled[h], return_counts=True)
        assert share[h] == pytest.approx(counts.max() / pooled.shape[1])
        assert offset[h] == values[np.argmax(counts)]


def test_padding_test_has_teeth():
    """Averaging over every row, padded ones included, gives other numbers: the test above can fail."""
    rng = np.random.default_rng(0)
    m = _sentence_maps(rng, 4, 6)
    padded = _pad(m, 14, rng)
    naive = np.mean(np.diagonal(padded, axis1=-2, axis2=-1), axis=-1)
    assert not np.allclose(naive, A.attention_to_self(m))
    no_mask = A.attention_to_self(padded)  # treating padding as real tokens
    assert not np.allclose(no_mask, A.attention_to_self(m))


def test_js_between_heads_ignores_padding():
    rng = np.random.default_rng(1)
    singles = [_sentence_maps(rng, 5, len(t)) for t in TOKENS]
    batch = np.stack([_pad(m, 12, rng) for m in singles])
    info = A.token_info(TOKENS, length=12)
    got = A.js_divergence_between_heads(batch, info)
    both = sum(A.js_divergence_between_heads(m) * m.shape[-1] for m in singles) / sum(len(t) for t in TOKENS)
    np.testing.assert_allclose(got, both, rtol=1e-12, atol=1e-15)


def _layers(rng, tokens, num_layers, heads, length):
    """Per-layer (B, H, L, L) padded maps, and the per-sentence (NL, H, n, n) originals."""
    singles = [np.stack([_sentence_maps(rng, heads, len(t)) for _ in range(num_layers)]) for t in tokens]
    layers = [np.stack([_pad(s[layer], length, rng) for s in singles]) for layer in range(num_layers)]
    return layers, singles


def test_corpus_aggregate_equals_sentence_means_and_is_order_free():
    rng = np.random.default_rng(2)
    tokens = TOKENS + [["[CLS]", "amen", ",", "amen", ".", "[SEP]", "x"][:6]]
    layers, singles = _layers(rng, tokens, 2, 3, 11)
    info = A.token_info(tokens, length=11)
    stats = A.HeadStats(2, 3, max_length=16)
    stats.update(layers, info)
    report = stats.result()
    # Clark-style metrics: the mean over sentences of each sentence's value.
    for name in ("cls", "sep", "punct", "prev", "entropy", "distance"):
        per_sentence = [
            np.stack([METRIC_FUNCS[name](s[k], A.token_info([t])) for k in range(2)]) for s, t in zip(singles, tokens)
        ]
        np.testing.assert_allclose(report.metrics[name], np.mean(per_sentence, axis=0), rtol=1e-12, err_msg=name)
    # Voita's confidence: the mean over query tokens (not sentences) of the row maxima.
    maxima = [s.max(-1)[:, :, 1:-1] for s in singles]  # (NL, H, n - 2): without [CLS] and [SEP]
    np.testing.assert_allclose(report.metrics["confidence"], np.concatenate(maxima, -1).mean(-1), rtol=1e-12)
    assert report.num_sentences == 3 and report.num_tokens == sum(len(t) for t in tokens)
    assert report.js_divergence.shape == (6, 6) and report.mds.shape == (6, 2)
    # Streaming: the same sentences in two batches, in another order, give the same report.
    again = A.HeadStats(2, 3, max_length=16)
    again.update([a[[2]] for a in layers], A.token_info(tokens[2:], length=11))
    again.update([a[[1, 0]] for a in layers], A.token_info([tokens[1], tokens[0]], length=11))
    second = again.result()
    for name in A.METRICS:
        np.testing.assert_allclose(second.metrics[name], report.metrics[name], rtol=1e-12, err_msg=name)
    np.testing.assert_allclose(second.js_divergence, report.js_divergence, rtol=1e-10, atol=1e-15)
    np.testing.assert_array_equal(second.roles, report.roles)


def test_corpus_memory_does_not_grow():
    rng = np.random.default_rng(3)
    stats = A.HeadStats(1, 2, max_length=8)
    sizes = []
    for _ in range(12):
        layers, _ = _layers(rng, TOKENS[1:], 1, 2, 8)
        stats.update(layers, A.token_info(TOKENS[1:], length=8))
        sizes.append(sum(v.nbytes for v in vars(stats).values() if isinstance(v, np.ndarray)))
    # the offset histogram widens to the longest offset counted, never past max_length's 2·8 − 1 columns
    bound = sizes[0] + 2 * (2 * 8 - 1) * 8
    assert sizes == sorted(sizes) and sizes[-1] <= bound and stats.num_sentences == 12
    assert stats.state()["hist"].shape == (2, 2 * 8 - 1)


def test_analyze_texts_streams_batches():
    rng = np.random.default_rng(4)
    calls = []

    def attend(texts):
        calls.append(len(texts))
        toks = [["[CLS]"] + t.split() + ["[SEP]"] for t in texts]
        length = max(map(len, toks))
        maps = [np.stack([_pad(_sentence_maps(rng, 2, len(t)), length, rng) for t in toks])]
        return maps, A.token_info(toks, length=length)

    texts = (f"word {'x ' * (k % 4)}end" for k in range(7))  # a generator: read lazily
    seen = []
    report = A.analyze_texts(
        texts, attend, num_layers=1, num_heads=2, max_length=16, batch_size=3, progress=lambda *a: seen.append(a)
    )
    assert calls == [3, 3, 1] and report.num_sentences == 7
    # The progress callback: after every batch, the texts and real tokens aggregated so far.
    lengths = [len(f"word {'x ' * (k % 4)}end".split()) + 2 for k in range(7)]
    assert seen == [(3, sum(lengths[:3])), (6, sum(lengths[:6])), (7, sum(lengths))]
    assert seen[-1][1] == report.num_tokens
    with pytest.raises(ValueError, match="batch_size"):
        A.analyze_texts([], attend, num_layers=1, num_heads=2, batch_size=0)
    with pytest.raises(ValueError, match="at least one sentence"):
        A.analyze_texts([], attend, num_layers=1, num_heads=2)


def test_head_stats_checks_shapes():
    stats = A.HeadStats(2, 3, max_length=8)
    info = A.token_info([["a", "b"]])
    with pytest.raises(ValueError, match="expected 2 layers"):
        stats.update([np.ones((1, 3, 2, 2)) / 2], info)
    with pytest.raises(ValueError, match=r"attentions\[0\]"):
        stats.update([np.ones((1, 4, 2, 2)) / 2] * 2, info)


def test_js_of_long_sentences_uses_evenly_spaced_rows():
    rng = np.random.default_rng(5)
    tokens = [TOKENS[0]]
    maps = np.stack([_sentence_maps(rng, 2, 9)])  # one layer, (H=2, 9, 9)
    stats = A.HeadStats(1, 2, max_length=16, js_max_rows=4)
    stats.update([maps[None, 0]], A.token_info(tokens))
    rows = [0, 3, 5, 8]  # round(linspace(0, 8, 4))
    eps, n = 1e-3, 9
    p, q = ((1 - eps) * maps[0, h][rows] + eps / n for h in range(2))
    m = 0.5 * (p + q)
    expected = np.mean(0.5 * (p * np.log(p / m)).sum(-1) + 0.5 * (q * np.log(q / m)).sum(-1))
    assert stats.result().js_divergence[0, 1] == pytest.approx(expected, rel=1e-10)


def test_a_tokenizer_batch_serves_as_token_info():
    """What the model adapters return (an encoded batch: tokens with padding, attention mask) reads as the
    token info built from the same tokens and mask."""
    from types import SimpleNamespace

    length = max(map(len, TOKENS))
    padded = [t + ["[PAD]"] * (length - len(t)) for t in TOKENS]
    mask = np.array([[1] * len(t) + [0] * (length - len(t)) for t in TOKENS])
    expected = A.token_info(padded, mask)
    got = A.as_token_info(SimpleNamespace(tokens=padded, attention_mask=mask))
    for field in ("valid", "cls", "sep", "punct"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), err_msg=field)
    assert got.tokens == expected.tokens and A.as_token_info(expected) is expected
    with pytest.raises(TypeError, match="info: expected a TokenInfo"):
        A.as_token_info(mask)


def test_analysis_draws_no_terminal_ui():
    """The metrics package is a library: importing and running it loads no rich (the CLI's)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np; from headwise import analysis as A; "
        "toks = [['[CLS]', 'a', '.', '[SEP]']]; maps = [np.full((1, 2, 4, 4), 0.25)]; "
        "A.analyze_texts(['a .'], lambda b: (maps, A.token_info(toks)), num_layers=1, num_heads=2, "
        "progress=lambda *a: None); "
        "assert not [m for m in sys.modules if m == 'rich' or m.startswith('rich.')], 'rich imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_offset_histogram_widens_as_offsets_come_and_equals_the_full_width_sum(seed):
    rng = np.random.default_rng(seed)
    NL, H, M = 2, 3, 9
    stats, total = A.HeadStats(NL, H, max_length=M, js=False), np.zeros((NL * H, 2 * M - 1), dtype=np.int64)
    values = {name: np.zeros(NL * H) for name in ("cls", "sep", "punct", "entropy", "entropy_cls", "self", "prev")}
    values |= {"next": np.zeros(NL * H), "distance": np.zeros(NL * H), "entropy_ratio": np.zeros(NL * H)}
    for _ in range(6):
        m = int(rng.integers(1, M + 1))
        h = rng.integers(0, 3, size=(NL * H, 2 * m - 1)) * (rng.random((NL * H, 2 * m - 1)) < 0.3)
        total[:, M - m : M + m - 1] += h
        stats.add_sentence_sums(values, length=m, confidence=(np.zeros(NL * H), 1), histogram=h, js=None)
    assert stats._hist.shape[-1] <= 2 * M - 1
    np.testing.assert_array_equal(stats.state()["hist"].numpy(), total)
    share, offset, positional = positional_from_histogram(total)
    report = stats.result()
    np.testing.assert_array_equal(report.metrics["positional_offset"].reshape(-1), offset)
    np.testing.assert_allclose(report.metrics["positional_share"].reshape(-1), share, equal_nan=True)
    twice = A.HeadStats(NL, H, max_length=M, js=False)
    twice.add_state(stats.state())
    twice.add_state(stats.state())
    np.testing.assert_array_equal(twice.state()["hist"].numpy(), 2 * total)
    with pytest.raises(ValueError, match=r"histogram: expected \(6, 2·m − 1\) offset counts with m ≤ max_length=9"):
        stats.add_sentence_sums(values, length=1, confidence=(np.zeros(6), 1), histogram=np.zeros((6, 19)), js=None)
